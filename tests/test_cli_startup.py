"""What a short CLI command loads: `veritas-watch --help` and `status` (no daemon) start without the HTTP server's
library (aiohttp: ~0.2 s of imports, the daemon's), the systemd installer or the embedding and store libraries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.daemon_harness import REPO

HEAVY = ("aiohttp", "qdrant_edge", "qdrant_client", "fastembed", "onnxruntime", "veritas_watch.service")

PROBE = """
import contextlib, json, sys
from veritas_watch.cli import main
with contextlib.redirect_stdout(sys.stderr), contextlib.suppress(SystemExit):
    main(sys.argv[2:])
heavy = sys.argv[1].split(",")
print(json.dumps(sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy))))
"""


def _loaded(tmp_path: Path, *args: str) -> list[str]:
    state, data = tmp_path / "state", tmp_path / "data"
    state.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERITAS_", "OPENCLAW_"))}
    env.update(OPENCLAW_STATE_DIR=str(state), VERITAS_WATCH_DATA_DIR=str(data))
    result = subprocess.run([sys.executable, "-c", PROBE, ",".join(HEAVY), *args], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=120, check=True)
    loaded: list[str] = json.loads(result.stdout)
    return loaded


def test_help_loads_no_daemon_library_nor_the_installer(tmp_path: Path) -> None:
    assert _loaded(tmp_path, "--help") == []
    assert _loaded(tmp_path, "service", "--help") == []  # its arguments are the parser's; its code runs when asked


def test_status_without_a_daemon_loads_no_daemon_library(tmp_path: Path) -> None:
    """The config is checked on every command; its HTTP check needs the server's library only for a TCP bind
    without a token (whether the host resolves to loopback)."""
    assert _loaded(tmp_path, "status") == []
    assert _loaded(tmp_path, "status", "--json") == []


def test_status_with_a_loopback_tcp_bind_and_no_token_loads_no_daemon_library(tmp_path: Path) -> None:
    """The one config whose check asks whether a host resolves to loopback (TCP, no token) answers that from
    transport.py, a leaf: `status` reading it loads no aiohttp either."""
    config = tmp_path / "veritas-watch.toml"
    config.write_text('[http]\nhost = "localhost"\nport = 17999\n')
    assert _loaded(tmp_path, "--config", str(config), "status") == []
