"""An idle daemon's safety sweep: its CPU cost with N agent databases and M JSONL transcripts, nothing new.

    .venv/bin/python bench/sweep.py [--dbs 10,50,200] [--jsonl 0,200] [--sweeps 100]

Each world is built in a temp dir: N agents with one SQLite store each (the real schema-23 DDL,
tests/sqlite_fixture.py), registered in OpenClaw's registry (state/openclaw.sqlite), a memory-core admission
policy in openclaw.json, one `veritas-watch forget` request; and M JSONL transcripts spread over the agents'
sessions directories. The sweep runs the steps of Running.sweep_once in its order, on the daemon's own
classes, without asyncio and the sink (an idle sweep queues nothing): agent discovery, the JSONL-era store
directories, the tailer's stat of every transcript, the compressed archives, the registry, the consent (policy
and forget requests, read once a sweep) and a poll of every database. After three warm-up sweeps everything is
read and committed: what follows is the idle daemon. Prints CPU ms per sweep, split into discovery+consent and
the polls, and the cost per database and per transcript.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import structlog

from tests.daemon_harness import append, header, message
from tests.sqlite_fixture import OpenClawWriter, create_database, message_event
from veritas_watch.admission import AdmissionPolicy
from veritas_watch.config import Config, PathsConfig
from veritas_watch.forget import Consent, ForgetRequests
from veritas_watch.openclaw import (
    AgentDirs,
    JsonlSessionStores,
    Registry,
    TranscriptDb,
    iter_agents,
    session_stem,
    transcript_dbs,
)
from veritas_watch.problems import ProblemLog, check_sqlite
from veritas_watch.sources.archives import CompressedArchives
from veritas_watch.sources.cursors import CursorStore
from veritas_watch.sources.jsonl import JsonlTailer
from veritas_watch.sources.sqlite_feed import SqliteFeed

REGISTRY_DDL = ("CREATE TABLE agent_databases (agent_id TEXT NOT NULL, path TEXT NOT NULL, schema_version INTEGER "
                "NOT NULL, last_seen_at INTEGER NOT NULL, size_bytes INTEGER, PRIMARY KEY (agent_id, path)) STRICT")


def build(root: Path, dbs: int, jsonl: int) -> Config:
    state, data = root / "state", root / "data"
    data.mkdir(parents=True)
    rows = []
    for i in range(dbs):
        agent = f"a{i:03d}"
        db = create_database(state / "agents" / agent / "agent" / "openclaw-agent.sqlite", agent_id=agent)
        with OpenClawWriter(db, compress=False) as writer:
            sid = writer.create_session(f"agent:{agent}:main")
            writer.append(sid, message_event(f"{agent}: hello", event_id=f"{agent}-1"))
        rows.append((agent, f"agents/{agent}/agent/openclaw-agent.sqlite"))
    for j in range(jsonl):  # OpenClaw before 2026.9: <agent>/sessions/<session>.jsonl, a few messages each
        path = state / "agents" / f"a{j % max(dbs, 1):03d}" / "sessions" / f"s{j:04d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        append(path, header(f"s{j:04d}") + b"".join(message(f"s{j}-{k}", "user", f"message {k}") for k in range(4)))
    registry = state / "state" / "openclaw.sqlite"
    registry.parent.mkdir(parents=True)
    conn = sqlite3.connect(registry, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(REGISTRY_DDL)
    conn.executemany("INSERT INTO agent_databases VALUES (?, ?, 23, 0, 4096)", rows)
    conn.close()
    (state / "openclaw.json").write_text(json.dumps({"plugins": {"entries": {"memory-core": {"config": {
        "memoryPolicy": {"excludeSessions": {"chatTypes": ["group"]}}}}}}}))
    past = time.time() - 3600  # old files: the stat checks' racy-window rereads are not what is measured
    for p in state.rglob("*"):
        os.utime(p, (past, past))
    ForgetRequests(data).add("a000", ["nothing-here"])
    time.sleep(2.2)  # utime set every ctime to now: wait past the racy window of those stamps
    return Config(paths=PathsConfig(state_dir=str(state), data_dir=str(data)))


@dataclass
class Sweeper:
    """The sweep's parts, as open_runtime and Running hold them."""

    config: Config
    cursors: CursorStore
    tailer: JsonlTailer
    feed: SqliteFeed
    archives: CompressedArchives
    consent: Consent
    registry: Registry
    stores: JsonlSessionStores
    problems: ProblemLog
    dbs: list[TranscriptDb] = field(default_factory=list)  # what the last discovery found
    policy: AdmissionPolicy | None = None
    forgotten: dict[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def open(cls, config: Config) -> Sweeper:
        cursors = CursorStore(config.data_dir / "cursors.sqlite")
        problems = ProblemLog(config.state_dir)
        tailer = JsonlTailer(config.state_dir, cursors.load_files(), max_line_bytes=config.watch.max_line_bytes,
                             read_chunk_bytes=config.watch.read_chunk_bytes, problems=problems, checkpoints=cursors)
        return cls(config, cursors, tailer,
                   SqliteFeed(cursors), CompressedArchives(cursors), Consent(config), Registry(config.state_dir),
                   JsonlSessionStores(config.state_dir), problems)

    def discover(self) -> tuple[list[AgentDirs], int]:
        """Discovery and consent: everything the sweep does before a database's poll. Returns the agents
        and how many JSONL reads it took (0 when idle)."""
        self.problems.begin_sweep()
        agents = list(iter_agents(self.config.state_dir, self.problems))
        stores = self.stores.dirs(agents)
        read = 0
        for tracked in self.tailer.sweep([*agents, *stores]).changed:
            while (unit := self.tailer.read(tracked)) is not None:
                read += 1
                self.tailer.commit([unit])
                if unit.at_eof:
                    break
        found = self.archives.sweep([*agents, *self.feed.archive_dirs()])
        self.feed.let_go({(a.agent_id, session_stem(p)) for a, p, _, _ in found
                          if session_stem(p) in self.feed.kept_out(a.agent_id)})
        self.dbs = transcript_dbs(self.config.state_dir, agents, self.registry)
        self.consent.due()
        self.policy = self.consent.policy.current()
        self.forgotten = self.consent.requests.sessions()
        return agents, read

    def poll(self) -> int:
        """A poll of every database (what is new committed at once). Returns the batches read."""
        batches = 0
        for db in self.feed.sources_to_poll(self.dbs):
            if not check_sqlite(db.path, self.problems, db.agent_id):
                continue
            got = self.feed.poll(db, policy=self.policy, forgotten=self.forgotten.get(db.agent_id, frozenset()))
            if got is not None and got.batches:
                batches += len(got.batches)
                self.feed.commit([self.feed.unit_for(got.key, b, self.feed.session_state(got.key, b))
                                  for b in got.batches])
            self.feed.ended_sessions(db.key)
        self.tailer.ended_sessions()
        self.problems.end_sweep()
        self.feed.directories_elsewhere()
        return batches

    def close(self) -> None:
        self.tailer.close()
        self.feed.close()
        self.consent.close()
        self.cursors.close()


def measure(dbs: int, jsonl: int, sweeps: int) -> str:
    with tempfile.TemporaryDirectory(prefix="vw-sweep-") as tmp:
        sweeper = Sweeper.open(build(Path(tmp), dbs, jsonl))
        for _ in range(3):  # the first reads: readers opened, every row and line committed
            sweeper.discover()
            sweeper.poll()
        assert not sweeper.problems.snapshot(), sweeper.problems.snapshot()
        cpu_discover = cpu_poll = 0.0
        started = time.perf_counter()
        for _ in range(sweeps):
            t0 = time.process_time()
            _, read = sweeper.discover()
            t1 = time.process_time()
            batches = sweeper.poll()
            cpu_discover += t1 - t0
            cpu_poll += time.process_time() - t1
            assert not read and not batches, "an idle sweep read something"
        wall = time.perf_counter() - started
        sweeper.close()
    per = 1000 / sweeps
    total = (cpu_discover + cpu_poll) * per
    unit = total * 1000 / max(dbs + jsonl, 1)
    return (f"| {dbs} | {jsonl} | {cpu_discover * per:.2f} | {cpu_poll * per:.2f} | {total:.2f} | {unit:.0f} | "
            f"{sweeps / wall:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dbs", default="10,50,200", help="agent databases per world (comma list)")
    parser.add_argument("--jsonl", default="0,200", help="JSONL transcripts per world (comma list)")
    parser.add_argument("--sweeps", type=int, default=100, help="idle sweeps measured per world")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| databases | JSONL files | discovery+consent ms CPU | polls ms CPU | sweep ms CPU | µs per source "
          "| sweeps/s |")
    print("|---|---|---|---|---|---|---|")
    for dbs in (int(x) for x in args.dbs.split(",")):
        for jsonl in (int(x) for x in args.jsonl.split(",")):
            print(measure(dbs, jsonl, args.sweeps), flush=True)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
