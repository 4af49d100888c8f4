"""One owner for a data dir, hence for its embedded store: `<data_dir>/owner.lock`.

The daemon takes the lock before it opens anything and holds it for its lifetime; a CLI command
that has to open the embedded store itself (no daemon runs) takes it for the duration of the
command. Whoever holds it writes who they are into the file (pid, role, command), so that the
other side can say what it waits for:

- the CLI, finding it held by a daemon, goes through the daemon's HTTP API once it is ready
  (saying `daemon starting` while it waits), never opening the store itself;
- a daemon, finding it held by a CLI command, waits for it with one `store_held` log line;
  held by another daemon, it exits with `EXIT_DATA_DIR_OWNED` and a one-line reason.

flock(2): released by the kernel when the holder dies, so a crash never leaves a stale lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from veritas_watch.safepath import make_dirs

LOCK_FILE = "owner.lock"
TOKEN_FILE = "http.token"  # the local token (0600, kept across restarts): whoever reads it reads the data dir

EXIT_PORT_TAKEN = 3  # the HTTP port is taken (nothing was left open)
EXIT_DATA_DIR_OWNED = 4  # another daemon owns this data dir, or the store stayed held

Role = Literal["daemon", "cli"]


class StartupError(Exception):
    """A start-up failure with a one-line reason and its own exit code; everything opened was closed."""

    exit_code = 1


class PortTaken(StartupError):
    exit_code = EXIT_PORT_TAKEN


class DataDirOwned(StartupError):
    exit_code = EXIT_DATA_DIR_OWNED

    @classmethod
    def by_daemon(cls, pid: int, data_dir: Path) -> DataDirOwned:
        """The refusal of a second daemon (the CLI says it before loading the daemon, the daemon after)."""
        return cls(f"another veritas-watch daemon (pid {pid}) owns {data_dir}; stop it first, or give this one its "
                   "own data dir (VERITAS_WATCH_DATA_DIR)")


@dataclass(frozen=True, slots=True)
class Holder:
    pid: int
    role: str
    command: str

    def describe(self) -> str:
        what = "the daemon" if self.role == "daemon" else f"`veritas-watch {self.command}`"
        return f"{what} (pid {self.pid})"


Lost = Literal["data_dir_vanished", "data_dir_replaced"]


def _running_since(pid: int, since: float) -> bool:
    """Whether process `pid` runs and already ran at `since` (epoch seconds): a pid reused by a process started
    later is not it. Another user's process counts as running; without /proc, any live pid does."""
    if pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        started = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in clock ticks
    except (OSError, ValueError, IndexError, StopIteration):
        return True
    return started <= since + 1.0  # btime has a second's precision


class OwnerLock:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None
        self._identity: tuple[tuple[int, int], tuple[int, int]] | None = None  # (data dir, lock file) when taken

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self, role: Role, command: str) -> bool:
        """Take the lock if it is free (never blocks); True when this process holds it now.

        A daemon does not take a lock file whose record names another daemon still running: a data dir copied
        (or moved back) under a running daemon carries its lock file, not its lock, and two daemons on one
        store is how a store gets unreadable. `holder()` then names that daemon."""
        if self._fd is not None:
            return True
        make_dirs(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            previous = self._record()
            if role == "daemon" and previous is not None and previous[0].role == "daemon" \
                    and _running_since(previous[0].pid, previous[1]):
                os.close(fd)
                return False
            self._identity = ((st := os.stat(self.path.parent)).st_dev, st.st_ino), \
                ((lock := os.fstat(fd)).st_dev, lock.st_ino)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        info = json.dumps({"pid": os.getpid(), "role": role, "command": command, "since": time.time()})
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode(), 0)
        self._fd = fd
        return True

    def _record(self) -> tuple[Holder, float] | None:
        """Who wrote the lock file last, and since when (None: empty, unreadable)."""
        try:
            raw: Any = json.loads(self.path.read_text())
            return Holder(int(raw["pid"]), str(raw["role"]), str(raw.get("command", ""))), float(raw.get("since", 0))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def holder(self) -> Holder | None:
        """Who holds the lock now, as they wrote it (None: free, or not written yet); also a daemon still running
        whose lock file this is a copy of (`try_acquire`)."""
        record = self._record()
        if record is None:
            return None
        holder, since = record
        copied_from_live = holder.role == "daemon" and _running_since(holder.pid, since)
        return holder if self.is_held_by_someone() or copied_from_live else None

    def lost(self) -> Lost | None:
        """Whether the data dir this lock guards is still the one locked: gone (`data_dir_vanished`), or another
        directory or lock file at its path (`data_dir_replaced`: moved away and copied back, restored from a
        backup), where a second daemon could take a lock of its own. Two stats; None while it is the same."""
        if self._identity is None:
            return None
        try:
            data_dir = os.stat(self.path.parent)
        except FileNotFoundError:
            return "data_dir_vanished"
        try:
            lock = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return "data_dir_replaced"
        if ((data_dir.st_dev, data_dir.st_ino), (lock.st_dev, lock.st_ino)) != self._identity:
            return "data_dir_replaced"
        return None

    def is_held_by_someone(self) -> bool:
        if self._fd is not None:
            return True
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing releases a shared lock we may have got
        return False

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None
            self._identity = None


def read_local_token(data_dir: Path) -> str | None:
    """The daemon's local token, if this process may read the data dir."""
    try:
        token = (data_dir / TOKEN_FILE).read_text().strip()
    except OSError:
        return None
    return token or None


def local_token(data_dir: Path) -> str:
    """The daemon's local token: the one in `<data_dir>/http.token` (mode 0600), made at the first start and
    kept across restarts, so that the CLI and the OpenClaw plugin find it by themselves. A file that is not
    this user's regular 0600 file is replaced (never trusted, never followed)."""
    path = data_dir / TOKEN_FILE
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd) as handle:
            st = os.fstat(handle.fileno())
            token = handle.read().strip()
        if st.st_uid == os.geteuid() and stat.S_ISREG(st.st_mode) and not st.st_mode & 0o077 and len(token) >= 32:
            return token
    token = secrets.token_urlsafe(32)
    tmp = path.with_name(f".{TOKEN_FILE}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)  # whatever the umask
        handle.write(token)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)
    return token
