"""How a client reaches the daemon, and knows it is the daemon it reaches (a leaf: the server in `http/` and
the client in `client.py` both use it; the OpenClaw plugin restates it in `integrations/openclaw/src/`).

- The Unix socket `<data_dir>/api.sock`, in the data dir only the daemon's user may enter (0700): whoever
  connects is that user (or root), which the server checks again on every request (SO_PEERCRED).
- TCP, when configured: anyone on the host may listen on a port first. Before a client sends its bearer
  token it asks `/health` to prove the server holds that token: an HMAC of a fresh challenge. A process
  squatting the port holds no token, so it gets neither the token nor the question.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import os
import secrets
import socket
import stat
import struct
from collections.abc import Iterator
from pathlib import Path

SOCKET_FILE = "api.sock"
SUN_PATH_MAX = 107  # bytes of a socket path (sockaddr_un.sun_path, its NUL excluded)

CHALLENGE_HEADER = "X-Veritas-Challenge"
KEY_ID_HEADER = "X-Veritas-Key-Id"
PROOF_HEADER = "X-Veritas-Proof"
_KEY_ID_MESSAGE = b"veritas-watch key id"
_PROOF_MESSAGE = b"veritas-watch server proof\n"
CHALLENGE_MIN_HEX = 32
CHALLENGE_MAX_HEX = 128
# `POST /memory/count`: session ids in one request (a cron job's key names a session per run: `forget` batches)
MAX_COUNT_SESSIONS = 1000
# A TCP token this short (or this repetitive) is refused: a squatter that is sent its key id (before any proof)
# can search for it offline, and the proof itself is an HMAC anyone may ask the daemon for. At 32 characters
# and 8 distinct ones, a random token holds 128 bits or more (32 hex digits; the local token is 43 of base64).
MIN_TOKEN_CHARS = 32
MIN_TOKEN_DISTINCT = 8


def weak_token(token: str) -> bool:
    """Whether a bearer token is too weak to be used over TCP (its key id would let it be guessed offline)."""
    return len(token) < MIN_TOKEN_CHARS or len(set(token)) < MIN_TOKEN_DISTINCT


WEAK_TOKEN_RULE = f"at least {MIN_TOKEN_CHARS} characters, {MIN_TOKEN_DISTINCT} of them different"


def key_id(token: str) -> str:
    """Names a token without revealing it: which one the server must prove it holds. Derived from the token
    (the client knows no other name for it); an oracle for a guess, so only a strong token is ever named."""
    return hmac.new(token.encode(), _KEY_ID_MESSAGE, hashlib.sha256).hexdigest()[:16]


def proof(token: str, challenge: str) -> str:
    return hmac.new(token.encode(), _PROOF_MESSAGE + challenge.encode(), hashlib.sha256).hexdigest()


def new_challenge() -> str:
    return secrets.token_hex(32)


def valid_challenge(challenge: str) -> bool:
    return (CHALLENGE_MIN_HEX <= len(challenge) <= CHALLENGE_MAX_HEX
            and all(c in "0123456789abcdef" for c in challenge))


def proven(token: str, challenge: str, answer: str | None) -> bool:
    return answer is not None and hmac.compare_digest(answer.strip().lower(), proof(token, challenge))


class NotPrivate(Exception):
    """A directory others may enter or write: no socket is served or trusted in it."""


def check_private_dir(directory: Path, *, client: bool = False) -> os.stat_result:
    """The directory's stat, if it is this user's and no one else may write it. The server's own check is
    this (and `mode & 0o077`: others may not even enter). A client also trusts root's directory, and root
    trusts any user's (the system service's data dir is its user's): what it needs is that no one but that
    owner could have put the socket or the token there."""
    st = os.stat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise NotPrivate(f"{directory} is not a directory")
    owners = {os.geteuid(), 0} if client else {os.geteuid()}
    if st.st_uid not in owners and not (client and os.geteuid() == 0):
        raise NotPrivate(f"{directory} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})")
    if st.st_mode & 0o022:
        raise NotPrivate(f"{directory} is writable by other users (mode {oct(st.st_mode & 0o777)})")
    return st


@contextlib.contextmanager
def socket_address(directory: Path, name: str = SOCKET_FILE) -> Iterator[str]:
    """A path to bind or connect `directory/name` by: the path itself, or when it is longer than a socket
    path may be (107 bytes), the same file through `/proc/self/fd/<fd of directory>` (valid while open)."""
    path = str(directory / name)
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        yield path
        return
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED), None if it is no Unix socket."""
    if sock.family != socket.AF_UNIX:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    return int(uid)


def peer_allowed(uid: int) -> bool:
    """The daemon's own user, or root: nobody else may ask the daemon anything over its socket."""
    return uid in (os.geteuid(), 0)


# -- loopback: also what the config check asks of a TCP bind without a token (here, not in http/, so that
# reading a config never loads aiohttp)

def is_loopback_ip(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).is_loopback  # a zone only on IPv6 (`::1%lo`), never `127.0.0.1%x`
    except ValueError:
        return False


def resolves_to_loopback(host: str) -> bool:
    """True only if every address `host` resolves to is a loopback address (a text prefix proves nothing:
    `127.example.com` is any host on the internet)."""
    bare = host.strip("[]")
    try:
        ipaddress.ip_address(bare.split("%", 1)[0])
        return is_loopback_ip(bare)
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(bare, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    addresses = {str(info[4][0]) for info in infos}
    return bool(addresses) and all(is_loopback_ip(a) for a in addresses)
