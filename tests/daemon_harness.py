"""Run the real daemon against a temporary state dir, and talk to it like a user.

Two ways to run it:
- `DaemonProcess`: the real `veritas-watch run` as a subprocess (kill it, pause it, run it inside
  a user namespace with lowered inotify limits through `wrapper`);
- `InProcessDaemon`: the real `Daemon` on an event loop in a background thread of the test
  process, for fault injection through `Daemon(config, wrap_store=...)` and for cheap restarts.

Both share the client side (`DaemonClient`): HTTP status/search/export, the cursors in
`cursors.sqlite`, and `wait_idle`, a deterministic "everything on disk is stored" barrier:
1. two probe lines, one after the other, each appended to a transcript of a probe agent and
   waited for until its cursor commits. The sweep that reads the second probe started after the
   first probe was committed, hence after everything the test did before calling `wait_idle`;
2. then `status` must show no backlog and an empty queue (sizes are fresh after that sweep), and
   every complete line of every transcript on disk must be covered by a committed cursor.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVarTuple

from veritas_watch.model import point_id
from veritas_watch.openclaw import classify_transcript, iter_agents
from veritas_watch.sources.cursors import FileCursor, SqliteCursor

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
FIXTURE_SESSIONS = SHARED / "fixtures" / "openclaw" / "zapabob-main" / "sessions"
PROBE_AGENT = "zzprobe"  # sorts last; its transcript only ever holds lines that are not memory

ConfigTree = Mapping[str, Mapping[str, object]]


def time_scale() -> float:
    """How much slower than a quiet machine this one is now: $VERITAS_TEST_TIME_SCALE, else the load average
    per core (1 on a quiet box, 5 at load 10 on 2 cores). A budget that is still a wall-clock one grows by it."""
    configured = os.environ.get("VERITAS_TEST_TIME_SCALE")
    if configured:
        return max(1.0, float(configured))
    return min(20.0, max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))


# The daemons this test process runs: while any of them makes progress, a wait is not stalled.
_LIVE: list[DaemonClient] = []


def daemons_progress() -> tuple[object, ...]:
    """What changes whenever a live daemon gets on with its work (its cursors commit)."""
    for client in [c for c in _LIVE if not c.alive()]:  # ended by itself (a backfill) or killed
        _LIVE.remove(client)
    return tuple(client.progress() for client in list(_LIVE))


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, interval: float = 0.1, what: str = "",
             progress: Callable[[], object] | None = None) -> Any:
    """Until `predicate()` is true. Fails only after `timeout` seconds (times `time_scale()`) in which nothing
    progressed: `progress()` (default: the cursors of the daemons this process runs) changing restarts the
    window, so a slow machine that is getting there is waited for, and a stuck daemon still fails."""
    window = timeout * time_scale()
    watch = progress if progress is not None else daemons_progress
    seen = watch()
    checked = last_progress = time.monotonic()
    while True:
        value = predicate()
        if value:
            return value
        now = time.monotonic()
        if now - checked >= 0.5:  # a few stats a second: cheap beside what is waited for
            checked = now
            current = watch()
            if current != seen:
                seen, last_progress = current, now
        if now - last_progress > window:
            raise AssertionError(f"timed out: no progress for {window:.0f}s (timeout {timeout}s x load scale "
                                 f"{window / timeout:.1f}) waiting for {what or predicate}")
        time.sleep(interval)


def line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode()


def header(session_id: str, ts: str = "2026-03-20T10:00:00.000Z") -> bytes:
    return line({"type": "session", "version": 3, "id": session_id, "timestamp": ts, "cwd": "/tmp"})


def message(entry_id: str, role: str, text: str, ts: str = "2026-03-20T10:00:01.000Z", **extra: Any) -> bytes:
    body: dict[str, Any] = {"role": role, "content": [{"type": "text", "text": text}], "timestamp": 1773900000000}
    body.update(extra)
    return line({"type": "message", "id": entry_id, "parentId": None, "timestamp": ts, "message": body})


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


def toml_text(config: ConfigTree) -> str:
    """A TOML document for a two-level config tree (sections of scalar keys)."""
    out = []
    for section, values in config.items():
        out.append(f"[{section}]")
        for key, value in values.items():
            if isinstance(value, bool):
                rendered = "true" if value else "false"
            elif isinstance(value, dict):  # an inline table of strings (http.agent_tokens)
                pairs = (f"{json.dumps(str(k))} = {json.dumps(str(v))}" for k, v in value.items())
                rendered = "{" + ", ".join(pairs) + "}"
            elif isinstance(value, list):
                rendered = "[" + ", ".join(json.dumps(str(v)) for v in value) + "]"
            elif isinstance(value, int | float):
                rendered = repr(value)
            else:
                rendered = json.dumps(str(value))  # a TOML basic string
            out.append(f"{key} = {rendered}")
        out.append("")
    return "\n".join(out)


# -- the truth on disk ------------------------------------------------------------------------------

def transcript_files(state_dir: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every transcript the daemon must follow, by the tailer's rules (names, symlinks inside only)."""
    root = state_dir.resolve()
    seen: set[tuple[int, int]] = set()
    for agent in iter_agents(state_dir):
        sessions = agent.sessions
        if not sessions.is_dir() or (sessions.is_symlink() and not sessions.resolve().is_relative_to(root)):
            continue
        for entry in os.scandir(sessions):
            if classify_transcript(entry.name) is None:
                continue
            path = Path(entry.path)
            if entry.is_symlink() and not path.resolve().is_relative_to(root):
                continue
            try:
                st = os.stat(path)
            except OSError:
                continue
            if entry.is_file() and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                yield path, st


def complete_length(path: Path) -> int:
    """Bytes up to and including the last newline: what a tailer can have read."""
    with open(path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        pos = size
        while pos > 0:
            step = min(1 << 16, pos)
            handle.seek(pos - step)
            block = handle.read(step)
            nl = block.rfind(b"\n")
            if nl >= 0:
                return pos - step + nl + 1
            pos -= step
    return 0


def _cursor_rows(data_dir: Path, sql: str) -> list[tuple[Any, ...]]:
    """Rows of the daemon's `cursors.sqlite`, read-only; none before it exists."""
    path = data_dir / "cursors.sqlite"
    if not path.exists():
        return []
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        return db.execute(sql).fetchall()
    except sqlite3.OperationalError:  # created but no table yet
        return []
    finally:
        db.close()


def read_db_cursors(data_dir: Path) -> dict[tuple[str, str], int]:
    """The committed SQLite session cursors: {(db, session id): next seq}."""
    return {(db, sid): SqliteCursor.from_json(state).next_seq
            for db, sid, state in _cursor_rows(data_dir, "SELECT db, session_id, state FROM db_cursors")}


def read_cursors(data_dir: Path) -> dict[str, FileCursor]:
    """The committed JSONL cursors, read straight from `cursors.sqlite` (read-only)."""
    rows = _cursor_rows(data_dir, "SELECT key, state FROM file_cursors")
    cursors = {}
    for key, state in rows:
        with contextlib.suppress(ValueError):
            cursors[key] = FileCursor.from_json(state)
    return cursors


def file_key(path: Path) -> str:
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}"


def expected_id(agent: str, session: str, entry: str, chunk: int = 0) -> str:
    return point_id(agent, session, entry, chunk)


def run_cli(env: Mapping[str, str], *args: str, timeout: float = 180,
            text: bool = False) -> subprocess.CompletedProcess[Any]:
    """`veritas-watch ARGS` as an operator runs it, from the checkout, with `env`; its exit code is the caller's
    to check."""
    return subprocess.run([sys.executable, "-m", "veritas_watch.cli", *args], env=dict(env), cwd=REPO,
                          capture_output=True, text=text, timeout=timeout, check=False)


# -- the client side -----------------------------------------------------------------------------

class DaemonClient:
    """What a user (or the CLI) sees of a running daemon: HTTP, the data dir, the state dir."""

    state_dir: Path
    data_dir: Path

    def __init__(self, state_dir: Path, data_dir: Path) -> None:
        self.state_dir = state_dir
        self.data_dir = data_dir
        self._probes = 0

    @property
    def base(self) -> str:
        info = json.loads((self.data_dir / "daemon.json").read_text())
        return f"http://{info['host']}:{info['port']}"

    @property
    def auth(self) -> dict[str, str]:
        """The running daemon's local token (what the CLI sends): the operator's view of every agent."""
        token_file = self.data_dir / "http.token"
        return {"Authorization": f"Bearer {token_file.read_text().strip()}"} if token_file.exists() else {}

    def get(self, path: str) -> Any:
        request = urllib.request.Request(self.base + path, headers=self.auth)
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def post(self, path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json", **self.auth}, method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def search(self, agent: str, query: str, limit: int = 10) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.post("/search", {"agent_id": agent, "query": query, "limit": limit})
        return result

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = self.get("/status")
        return result

    def export_http(self, agent: str | None = None) -> list[dict[str, Any]]:
        """`/export` of the running daemon (what `veritas-watch export` streams), parsed."""
        query = f"?agent={urllib.parse.quote(agent)}" if agent else ""
        request = urllib.request.Request(self.base + "/export" + query, headers=self.auth)
        with urllib.request.urlopen(request, timeout=120) as response:
            return [json.loads(raw) for raw in response.read().decode().splitlines() if raw.strip()]

    def cursors(self) -> dict[str, FileCursor]:
        return read_cursors(self.data_dir)

    # -- the idle barrier ---------------------------------------------------------------------------

    @property
    def probe_path(self) -> Path:
        return self.state_dir / "agents" / PROBE_AGENT / "sessions" / "probe.jsonl"

    def progress(self) -> object:
        """Changes whenever the daemon commits (each cursor write lands in `cursors.sqlite` or its WAL)."""
        marks: list[object] = [self.alive()]
        for name in ("cursors.sqlite", "cursors.sqlite-wal"):
            try:
                st = os.stat(self.data_dir / name)
                marks.append((st.st_size, st.st_mtime_ns))
            except OSError:
                marks.append(None)
        return tuple(marks)

    def alive(self) -> bool:
        """Whether the daemon still runs (a dead one makes no progress: its waits fail at once)."""
        return True

    def _daemon_progress(self) -> object:
        if not self.alive():
            raise AssertionError(f"the daemon died while waited for: {self.describe_death()}")
        return self.progress()

    def describe_death(self) -> str:
        return "stopped"

    def _probe(self, timeout: float) -> None:
        """Append one probe line and wait until a sweep read it and its cursor committed."""
        self._probes += 1
        path = self.probe_path
        path.parent.mkdir(parents=True, exist_ok=True)
        append(path, line({"type": "custom", "customType": "veritas-test-probe", "id": f"probe-{self._probes}",
                           "pid": os.getpid(), "n": self._probes}))
        size = path.stat().st_size
        key = file_key(path)
        wait_for(lambda: (c := self.cursors().get(key)) is not None and c.offset >= size,
                 timeout=timeout, interval=0.02, what="probe line committed", progress=self._daemon_progress)

    def unread_on_disk(self) -> list[str]:
        """Transcripts on disk with complete lines no committed cursor covers."""
        cursors = self.cursors()
        behind = []
        for path, st in transcript_files(self.state_dir):
            done = complete_length(path)
            cursor = cursors.get(f"{st.st_dev}:{st.st_ino}")
            if done and (cursor is None or cursor.offset != done):
                behind.append(f"{path.name}: {cursor.offset if cursor else None}/{done}")
        return behind

    def idle(self) -> bool:
        status = self.status()
        return (status["backlog_bytes"] == 0 and status["queue"] == 0 and not status["gap_scan_pending"]
                and not self.unread_on_disk())

    def wait_idle(self, timeout: float | None = None) -> None:
        """Until everything on disk is stored. `timeout`: how long the daemon may make no progress at all (its
        cursors still) before this fails, times `time_scale()`; a backlog that is being stored is waited for.
        $VERITAS_TEST_IDLE_TIMEOUT shortens it when a broken build is expected to fail fast."""
        timeout = timeout if timeout is not None else float(os.environ.get("VERITAS_TEST_IDLE_TIMEOUT", "120"))
        window = timeout * time_scale()
        seen, last_progress = self._daemon_progress(), time.monotonic()
        while True:
            self._probe(timeout)
            self._probe(timeout)
            # Gap detection's start-up scan waits for a sweep that reads nothing: no probe while it is due.
            wait_for(lambda: not self.status()["gap_scan_pending"], timeout=timeout, interval=0.05,
                     what="gap detection's start-up scan", progress=self._daemon_progress)
            if self.idle():
                return
            if (current := self._daemon_progress()) != seen:
                seen, last_progress = current, time.monotonic()
            if time.monotonic() - last_progress > window:
                raise AssertionError(f"daemon not idle, no progress for {window:.0f}s: status={self.status()} "
                                     f"unread={self.unread_on_disk()[:10]}")
            time.sleep(0.1)


class DaemonProcess(DaemonClient):
    """`veritas-watch run` (or any CLI command) as a subprocess."""

    def __init__(self, state_dir: Path, data_dir: Path, extra_env: dict[str, str] | None = None, *,
                 config: ConfigTree | None = None, wrapper: Sequence[str] = ()) -> None:
        super().__init__(state_dir, data_dir)
        self.extra_env = dict(extra_env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}-daemon.log"
        self.wrapper = tuple(wrapper)  # e.g. a user namespace with lowered inotify limits
        self._log_handle: Any = None
        self.config_path: Path | None = None
        if config:
            self.config_path = data_dir.parent / f"{data_dir.name}-config.toml"
            self.config_path.write_text(toml_text(config))

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VERITAS_", "OPENCLAW_", "NOTIFY_SOCKET"))}
        env.update({
            "OPENCLAW_STATE_DIR": str(self.state_dir),
            "VERITAS_WATCH_DATA_DIR": str(self.data_dir),
            "VERITAS_WATCH_HTTP_PORT": "0",
            "PYTHONUNBUFFERED": "1",
            # The default agent's workspace is home-based, as in OpenClaw: keep it inside the test's dir.
            "OPENCLAW_HOME": str(self.state_dir.parent / "home"),
        })
        if self.config_path is not None:
            env["VERITAS_WATCH_CONFIG"] = str(self.config_path)
        env.update(self.extra_env)
        return env

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
        """Run another CLI command against the same state and data dirs."""
        return subprocess.run([sys.executable, "-m", "veritas_watch.cli", *args], env=self.env,
                              capture_output=True, check=True, timeout=timeout * time_scale())

    def start(self, *args: str, wait: bool = True) -> DaemonProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / "daemon.json").unlink()
        self._log_handle = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen([*self.wrapper, sys.executable, "-m", "veritas_watch.cli", *(args or ("run",))],
                                     env=self.env, stdout=self._log_handle, stderr=subprocess.STDOUT)
        _LIVE.append(self)
        if wait and (not args or args[0] == "run"):
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 120) -> None:
        """Until the HTTP port is published (the daemon is up); fails if the process exits first, or when its
        start-up logged nothing new for `timeout` seconds (times `time_scale()`)."""
        wait_for(self._ready, timeout=timeout, what="daemon ready", progress=self._log_size)

    def _log_size(self) -> object:
        with contextlib.suppress(OSError):
            return self.log_path.stat().st_size
        return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def describe_death(self) -> str:
        code = self.proc.returncode if self.proc is not None else None
        return f"exited with {code}:\n{self.log_text()[-3000:]}"

    def _gone(self) -> None:
        with contextlib.suppress(ValueError):
            _LIVE.remove(self)

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
        return (self.data_dir / "daemon.json").exists()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def export(self, agent: str | None = None) -> list[dict[str, Any]]:
        """`veritas-watch export` as a user runs it (through the daemon if one runs, else offline)."""
        out = self.cli("export", *(["--agent", agent] if agent else []))
        return [json.loads(raw) for raw in out.stdout.decode().splitlines() if raw.strip()]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        assert self.proc is not None
        self.resume()
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout * time_scale())
        self._gone()
        self._log_handle.close()
        return code

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=30)
        self._gone()
        self._log_handle.close()

    def pause(self) -> None:
        """SIGSTOP: the daemon is frozen mid-flight (its handles stay open, the kernel queues events)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_events(self) -> list[dict[str, Any]]:
        events = []
        for raw in self.log_text().splitlines():
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
        return events

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.log_events() if e.get("event") == name]


_Ts = TypeVarTuple("_Ts")


class _ThreadLoop(asyncio.SelectorEventLoop):
    """An event loop for a background thread: signal handlers belong to the main thread."""

    def add_signal_handler(self, sig: int, callback: Callable[[*_Ts], object], *args: *_Ts) -> None:
        return None


class InProcessDaemon(DaemonClient):
    """The real `Daemon` on its own event loop in a background thread of the test process."""

    def __init__(self, state_dir: Path, data_dir: Path, config: ConfigTree | None = None,
                 wrap_store: Callable[[Any], Any] | None = None) -> None:
        super().__init__(state_dir, data_dir)
        tree: dict[str, dict[str, object]] = {k: dict(v) for k, v in (config or {}).items()}
        tree.setdefault("paths", {}).update({"state_dir": str(state_dir), "data_dir": str(data_dir)})
        tree.setdefault("http", {}).setdefault("port", 0)
        tree.setdefault("log", {}).setdefault("format", "json")
        self.config_path = data_dir.parent / f"{data_dir.name}-config.toml"
        self.log_path = data_dir.parent / f"{data_dir.name}-daemon.log"
        self.wrap_store = wrap_store
        self.tree = tree
        self.daemon: Any = None
        self._thread: threading.Thread | None = None
        self._loop: _ThreadLoop | None = None
        self._error: BaseException | None = None

    def start(self) -> InProcessDaemon:
        from veritas_watch import log as logsetup
        from veritas_watch.config import load_config
        from veritas_watch.daemon import Daemon

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(toml_text(self.tree))
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / "daemon.json").unlink()
        config = load_config(self.config_path, environ={})
        self._log_handle = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        logsetup.configure_logging(config.log.level, "json", stream=self._log_handle)
        self.daemon = Daemon(config, wrap_store=self.wrap_store)
        self._loop = _ThreadLoop()
        self._error = None

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self.daemon.run())
            except BaseException as exc:
                self._error = exc
            finally:
                self._loop.close()

        self._thread = threading.Thread(target=run, name="daemon", daemon=True)
        self._thread.start()
        _LIVE.append(self)
        wait_for(self._ready, timeout=120, what="in-process daemon ready")
        return self

    def alive(self) -> bool:
        return self._error is None and self._thread is not None and self._thread.is_alive()

    def describe_death(self) -> str:
        return f"daemon thread ended: {self._error!r}"

    def _ready(self) -> bool:
        if self._error is not None:
            raise AssertionError(f"daemon failed: {self._error!r}")
        if self._thread is not None and not self._thread.is_alive():
            raise AssertionError("daemon thread ended")
        return (self.data_dir / "daemon.json").exists()

    def call(self, fn: Callable[[], Any], timeout: float = 30) -> Any:
        """Run `fn` on the daemon's loop (to read its state without racing it)."""
        assert self._loop is not None

        async def wrapped() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapped(), self._loop).result(timeout)

    def stop(self, timeout: float = 60) -> None:
        if self._thread is None or self._loop is None:
            return
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self.daemon.stop_event.set)
        with contextlib.suppress(ValueError):
            _LIVE.remove(self)
        self._thread.join(timeout * time_scale())
        if self._thread.is_alive():
            faulthandler.dump_traceback(all_threads=True)  # where it hangs, for the test log

            async def tasks() -> str:
                return "\n".join(f"{t.get_name()}: {t.get_stack(limit=8)}" for t in asyncio.all_tasks())

            with contextlib.suppress(Exception):
                print(asyncio.run_coroutine_threadsafe(tasks(), self._loop).result(5), file=sys.stderr)
            raise AssertionError("daemon did not stop")
        self._thread = None
        from veritas_watch import log as logsetup

        logsetup.configure_logging("warning", "json", stream=sys.stderr)  # the log file closes now
        self._log_handle.flush()
        self._log_handle.close()
        if self._error is not None:
            raise AssertionError(f"daemon failed: {self._error!r}")

    def log_events(self) -> list[dict[str, Any]]:
        events = []
        if self.log_path.exists():
            for raw in self.log_path.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    event = json.loads(raw)
                    if isinstance(event, dict):
                        events.append(event)
        return events

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.log_events() if e.get("event") == name]


WORDS = ("heron", "mill", "river", "ferry", "lantern", "orchard", "granite", "violet", "harbor", "meadow",
         "copper", "willow", "summit", "pepper", "canyon", "maple", "glacier", "saffron", "thistle", "quartz")


class Ledger:
    """The truth for one agent: every entry fully written, as {(session_id, entry_id): text}.

    Sessions are files whose header id equals their file stem, so the session an entry lands in
    does not depend on whether the daemon saw the header (after a truncation, say).
    """

    def __init__(self, state_dir: Path, agent: str) -> None:
        self.agent = agent
        self.sessions = state_dir / "agents" / agent / "sessions"
        self.sessions.mkdir(parents=True, exist_ok=True)
        self.expected: dict[tuple[str, str], str] = {}
        self.held: dict[tuple[str, str], str] = {}  # written (or to be written) but not expected yet
        self.notes: dict[str, Any] = {}  # whatever a scenario needs to remember between its steps
        self._count = 0

    def path(self, session: str) -> Path:
        return self.sessions / f"{session}.jsonl"

    def header(self, session: str, ts: str = "2026-03-20T10:00:00.000Z") -> bytes:
        return header(session, ts)

    def entry(self, session: str, *, role: str = "user", expect: bool = True, text: str | None = None,
              pad: int = 0) -> bytes:
        """A new message line with a unique id and text; expected in the store once written whole."""
        self._count += 1
        n = self._count
        entry_id = f"{session}-m{n}"
        if text is None:
            words = " ".join(WORDS[(n * 7 + i) % len(WORDS)] for i in range(3 + n % 4))
            text = f"{self.agent} note {n} in {session}: {words}" + (" filler" * pad)
        (self.expected if expect else self.held)[(session, entry_id)] = text
        return message(entry_id, role, text)

    def release(self, session: str, entry_id: str) -> None:
        """A held entry is now written whole (or visible): expect it."""
        self.expected[(session, entry_id)] = self.held.pop((session, entry_id))

    def ids(self) -> set[str]:
        return {expected_id(self.agent, s, e) for s, e in self.expected}


def stored_entries(points: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """{(session_id, entry_id): text} of exported points; fails on any entry stored twice."""
    got: dict[tuple[str, str], str] = {}
    for point in points:
        payload = point["payload"]
        key = (payload["session_id"], payload["entry_id"])
        assert key not in got, f"entry stored twice: {key}"
        assert payload["chunk"] == 0, f"unexpected chunk: {payload}"
        got[key] = payload["data"]
    ids = [p["id"] for p in points]
    assert len(ids) == len(set(ids)), "duplicate point ids in export"
    return got


def assert_store_matches(client: DaemonClient, ledger: Ledger) -> list[dict[str, Any]]:
    """The agent's stored points are exactly the ledger's entries: no missing, no extra, same text."""
    points = client.export_http(ledger.agent)
    got = stored_entries(points)
    missing = sorted(set(ledger.expected) - set(got))
    extra = sorted(set(got) - set(ledger.expected))
    assert not missing and not extra, f"missing={missing[:10]} extra={extra[:10]}"
    changed = [k for k in ledger.expected if got[k] != ledger.expected[k]]
    assert not changed, f"text changed: {changed[:5]}"
    assert {p["id"] for p in points} == ledger.ids()
    return points


@contextmanager
def running_daemon(state_dir: Path, data_dir: Path, **kwargs: Any) -> Iterator[DaemonProcess]:
    daemon = DaemonProcess(state_dir, data_dir, **kwargs).start()
    try:
        yield daemon
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()


def copy_fixture_sessions(state_dir: Path, agent: str = "main") -> Path:
    sessions = state_dir / "agents" / agent / "sessions"
    sessions.mkdir(parents=True, exist_ok=True)
    for path in FIXTURE_SESSIONS.iterdir():
        shutil.copy(path, sessions / path.name)
    return sessions
