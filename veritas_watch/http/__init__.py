"""The daemon's HTTP API (aiohttp), one module per concern:

- `app.py`: the application, its middlewares, the daemon-wide routes (`/health` with its token proof,
  `/status`, `/export`, `/metrics`), binding the Unix socket (and TCP when configured) and publishing where
  the daemon is (`daemon.json`);
- `access.py`: who may ask what (the socket's peer, Host and Origin checks, JSON only, tokens, the agents a
  caller may read);
- `memory.py`: the memory routes (`/memory/search`, `/memory/context`, `/memory/get`, `/memory/add`, `/search`);
- `selftest.py`: `/selftest/cleanup`, the daemon's half of `veritas-watch selftest`;
- `requests.py`: what routes share (the gate to the running daemon, checked JSON bodies, UTF-8 JSON answers).
  A leaf;
- `port.py`: what the routes ask of the daemon, as typed protocols (`Served`, `Memory`, `Capture`), which
  `daemon.Running` implements: the package imports nothing of the daemon. A leaf.

The client side (finding the daemon, calling it) is `veritas_watch/client.py`; what both sides share (the
socket's path, the proof) is `veritas_watch/transport.py`.
"""
