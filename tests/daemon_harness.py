"""Run the real daemon as a subprocess against a temporary state dir, and talk to it like a user."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
FIXTURE_SESSIONS = SHARED / "fixtures" / "openclaw" / "zapabob-main" / "sessions"


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, interval: float = 0.1, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode()


def header(session_id: str, ts: str = "2026-03-20T10:00:00.000Z") -> bytes:
    return line({"type": "session", "version": 3, "id": session_id, "timestamp": ts, "cwd": "/tmp"})


def message(entry_id: str, role: str, text: str, ts: str = "2026-03-20T10:00:01.000Z", **extra: Any) -> bytes:
    body: dict[str, Any] = {"role": role, "content": [{"type": "text", "text": text}], "timestamp": 1773900000000}
    body.update(extra)
    return line({"type": "message", "id": entry_id, "parentId": None, "timestamp": ts, "message": body})


class DaemonProcess:
    def __init__(self, state_dir: Path, data_dir: Path, extra_env: dict[str, str] | None = None) -> None:
        self.state_dir = state_dir
        self.data_dir = data_dir
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}-daemon.log"
        self._log_handle: Any = None

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VERITAS_", "OPENCLAW_", "NOTIFY_SOCKET"))}
        env.update({
            "OPENCLAW_STATE_DIR": str(self.state_dir),
            "VERITAS_WATCH_DATA_DIR": str(self.data_dir),
            "VERITAS_WATCH_HTTP_PORT": "0",
            "PYTHONUNBUFFERED": "1",
        })
        env.update(self.extra_env)
        return env

    def start(self, *args: str) -> DaemonProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with __import__("contextlib").suppress(FileNotFoundError):
            (self.data_dir / "daemon.json").unlink()
        self._log_handle = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen([sys.executable, "-m", "veritas_watch.cli", *(args or ("run",))],
                                     env=self.env, stdout=self._log_handle, stderr=subprocess.STDOUT)
        if not args or args[0] == "run":
            wait_for(self._ready, timeout=120, what="daemon ready")
        return self

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
        return (self.data_dir / "daemon.json").exists()

    @property
    def base(self) -> str:
        info = json.loads((self.data_dir / "daemon.json").read_text())
        return f"http://{info['host']}:{info['port']}"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.base + path, timeout=30) as response:
            return json.loads(response.read())

    def post(self, path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def search(self, agent: str, query: str, limit: int = 10) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.post("/search", {"agent_id": agent, "query": query, "limit": limit})
        return result

    def export(self, agent: str | None = None) -> list[dict[str, Any]]:
        args = ["--agent", agent] if agent else []
        out = subprocess.run([sys.executable, "-m", "veritas_watch.cli", "export", *args],
                             env=self.env, capture_output=True, check=True, timeout=120)
        return [json.loads(raw) for raw in out.stdout.decode().splitlines() if raw.strip()]

    def idle(self) -> bool:
        status = self.get("/status")
        return status["backlog_bytes"] == 0 and status["queue"] == 0

    def wait_idle(self, timeout: float = 120.0) -> None:
        # Two idle readings a sweep apart: a sweep that has not run yet cannot look idle.
        wait_for(lambda: self.idle() and (time.sleep(0.5) or self.idle()), timeout=timeout, what="daemon idle")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout)
        self._log_handle.close()
        return code

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=30)
        self._log_handle.close()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_events(self) -> list[dict[str, Any]]:
        events = []
        for raw in self.log_text().splitlines():
            try:
                events.append(json.loads(raw))
            except ValueError:
                continue
        return events


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
