"""One agent's searches never make another agent's wait (issue 37): an agent sending the largest query, over and
over, holds one query worker and one read worker at most; another agent's search is answered while it runs.

The store is the real one, wrapped to hold alpha's searches (the fault: a search that takes as long as the test
says, which the real store cannot produce on demand); the HTTP API, the query threads and the model are real."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.daemon_harness import InProcessDaemon, header, message, wait_for
from veritas_watch.config import SearchConfig
from veritas_watch.sinks.store import SearchQuery, Store


class HeldSearches:
    """The real store; alpha's searches wait in it until released, each counted as it enters."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self.release = threading.Event()
        self.entered = 0
        self._lock = threading.Lock()

    def search_batch(self, queries: Sequence[SearchQuery]) -> Any:
        if any(q.agent_id == "alpha" for q in queries):
            with self._lock:
                self.entered += 1
            self.release.wait(120)
        return self._inner.search_batch(queries)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_an_agent_s_search_is_answered_while_another_agent_s_largest_queries_run(tmp_path: Path) -> None:
    state = tmp_path / "state"
    for agent, text in (("alpha", "The backup disks rotate on Fridays"), ("beta", "The nginx cert renews monthly")):
        sessions = state / "agents" / agent / "sessions"
        sessions.mkdir(parents=True)
        (sessions / "s-1.jsonl").write_bytes(header("s-1") + message("u1", "user", text))
    holder: dict[str, HeldSearches] = {}

    def wrap(store: Store) -> HeldSearches:
        holder["store"] = HeldSearches(store)
        return holder["store"]

    daemon = InProcessDaemon(state, tmp_path / "data", wrap_store=wrap)
    daemon.start()
    held = holder["store"]
    pool = ThreadPoolExecutor(4)
    try:
        daemon.wait_idle()
        started = time.monotonic()
        assert daemon.search("beta", "when does the cert renew")  # beta alone, in this run
        alone = time.monotonic() - started
        huge = "when do the backup disks rotate " * (3_900_000 // 32)  # ~3.9 MB: under the 4 MB body limit
        assert len(huge) > SearchConfig().max_query_chars
        flood = [pool.submit(daemon.search, "alpha", huge) for _ in range(3)]
        wait_for(lambda: held.entered >= 1, what="alpha's first search in the store")
        started = time.monotonic()
        answer = daemon.search("beta", "when does the cert renew")  # answered while alpha's are held
        beside = time.monotonic() - started
        assert answer and answer[0]["agent_id"] == "beta"
        assert not any(f.done() for f in flood)  # alpha's searches were still running
        assert held.entered == 1  # one at a time for alpha: its others wait their turn, not a worker
        print(f"beta alone {alone * 1000:.0f} ms, beside alpha's held searches {beside * 1000:.0f} ms")
        held.release.set()
        for future in flood:  # the largest query is answered (cut to what the model reads), not refused
            assert [hit["agent_id"] for hit in future.result(timeout=120)][:1] == ["alpha"]
        assert held.entered >= 3  # each search asks the store in a few batches
    finally:
        held.release.set()
        pool.shutdown(wait=True)
        daemon.stop()
