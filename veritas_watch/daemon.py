"""The imperative shell: lifecycle, the sweep loop, signals, systemd notification, HTTP.

Start-up order matters for `READY=1`: store open, model loaded, cursors read, watches set.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import sdnotify
import structlog

from veritas_watch import log as logsetup
from veritas_watch.api import start_http
from veritas_watch.config import Config, load_config
from veritas_watch.features.capture import CredentialCapture
from veritas_watch.features.gap_service import GapService
from veritas_watch.metrics import DaemonMetrics
from veritas_watch.model import RawRecord, SessionState, SourceRef, restore_turn
from veritas_watch.openclaw import AgentDirs, iter_agents, session_stem
from veritas_watch.pipeline import CommitBatch, Sink, Transformed, Work, make_points, store_meta, transform_records
from veritas_watch.sinks.embed import Embedder, load_embedder
from veritas_watch.sinks.factory import open_store
from veritas_watch.sinks.store import Store, StoredPoint, StoreError
from veritas_watch.sources.cursors import CursorStore
from veritas_watch.sources.jsonl import JsonlTailer, ReadUnit, TrackedFile
from veritas_watch.sources.sqlite import SqlitePoll
from veritas_watch.sources.sqlite_feed import SqliteFeed, SqliteUnit, stale_point_cleanup
from veritas_watch.sources.watch import ChangeWatcher

log = structlog.get_logger()
CREDENTIAL_FLUSH_INTERVAL = 30.0  # seconds between attempts to write index rows that wait for a workspace


def load_redact_key(data_dir: Path) -> bytes:
    """The key behind credential fingerprints: random per install, so a fingerprint cannot be brute-forced."""
    path = data_dir / "fingerprint.key"
    try:
        return bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError):
        key = secrets.token_bytes(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(key.hex())
        return key


@dataclass
class Runtime:
    """Everything opened at start-up, closed at shutdown."""

    config: Config
    embedder: Embedder
    cursors: CursorStore
    sink: Sink
    tailer: JsonlTailer
    sqlite: SqliteFeed
    redact_key: bytes


StoreWrapper = Callable[[Store], Store]


def open_runtime(config: Config, commit: CommitBatch, wrap_store: StoreWrapper | None = None,
                 on_store_latency: Callable[[float], None] | None = None) -> Runtime:
    data_dir = config.data_dir
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    emb = config.embedding
    embedder = load_embedder(
        emb.backend, model=emb.model or None, path=Path(emb.path).expanduser() if emb.path else None,
        cache_dir=data_dir / "models", threads=emb.threads or None,
    )
    meta = store_meta(embedder)

    def reembed(rows: Sequence[tuple[str, dict[str, object]]]) -> list[StoredPoint]:
        # Migration re-embeds the stored text alone: the previous turn is not kept in the payload.
        return make_points(embedder, [(pid, str(p.get("data") or ""), str(p.get("data") or ""), p) for pid, p in rows])

    store = open_store(config.store.url, config.store.api_key, config.store.collection, config.store.timeout,
                       data_dir, meta, reembed)
    if wrap_store is not None:
        store = wrap_store(store)  # tests inject faults here (store down, disk full)
    pipe = config.pipeline
    sink = Sink(store, embedder, commit, batch_size=pipe.batch_size, linger_ms=pipe.linger_ms,
                queue_size=pipe.queue_size,
                retry_initial=pipe.retry_initial, retry_max=pipe.retry_max, on_store_latency=on_store_latency)
    cursors = CursorStore(data_dir / "cursors.sqlite")
    tailer = JsonlTailer(config.state_dir, cursors.load_files(), max_line_bytes=config.watch.max_line_bytes,
                         read_chunk_bytes=config.watch.read_chunk_bytes)
    return Runtime(config, embedder, cursors, sink, tailer, SqliteFeed(cursors), load_redact_key(data_dir))


class Daemon:
    def __init__(self, config: Config, *, once: bool = False, wrap_store: StoreWrapper | None = None):
        self.config = config
        self.wrap_store = wrap_store
        self.once = once  # backfill: one pass over everything, then exit
        self.stop_event = asyncio.Event()
        self.hint = asyncio.Event()
        self.notifier = sdnotify.SystemdNotifier()
        self.started = time.time()
        self.rt: Runtime | None = None
        self.watcher: ChangeWatcher | None = None
        self.gaps: GapService | None = None
        self.capture: CredentialCapture | None = None
        self.metrics = DaemonMetrics(self)
        self._signals = 0

    # -- lifecycle -------------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        state_dir = self.config.state_dir
        if not state_dir.is_dir():
            log.warning("state_dir_missing", path=str(state_dir), hint="waiting for OpenClaw to create it")
        # Signals first: a SIGTERM during a long start-up (model load, store migration) stops cleanly after it.
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_stop_signal)
        loop.add_signal_handler(signal.SIGHUP, self._on_reload)
        self.rt = await self._open_with_retry()
        rt = self.rt
        self.gaps = GapService.open(self.config, on_detected=self.metrics.record_gap_detected)
        self.capture = (CredentialCapture(self.config, redact_key=rt.redact_key)
                        if self.config.credentials.enabled else None)
        self.watcher = ChangeWatcher(state_dir, self.hint, force_polling=self.config.watch.force_polling,
                                     poll_interval=self.config.watch.poll_interval)
        if not self.once:
            self.watcher.start(loop)
        http = None if self.once or not self.config.http.enabled else await start_http(self)
        sink_task = asyncio.create_task(rt.sink.run(), name="sink")
        self.notifier.notify("READY=1")
        log.info("daemon_ready", state_dir=str(state_dir), data_dir=str(self.config.data_dir),
                 embedder=rt.embedder.name, store=self.config.store.url or "embedded",
                 watcher=self.watcher.mode, once=self.once,
                 http=f"{self.config.http.host}:{self.config.http.port}" if http else None)
        tasks = [asyncio.create_task(self._sweep_loop(), name="sweep")]
        if not self.once:
            tasks.append(asyncio.create_task(self._housekeeping(), name="housekeeping"))
        elif sys.stderr.isatty():
            tasks.append(asyncio.create_task(self._progress_bar(), name="progress"))
        try:
            await self.stop_event.wait()
        finally:
            self.notifier.notify("STOPPING=1")
            log.info("daemon_stopping")
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self.watcher.stop()
            drained = await rt.sink.drain(timeout=20)
            rt.sink.stopping = True
            sink_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sink_task
            if self.gaps is not None:
                await self.gaps.close()
            if http is not None:
                await http.cleanup()
                with contextlib.suppress(OSError):
                    (self.config.data_dir / "daemon.json").unlink()
            await rt.sink.in_store_thread(rt.sink.store.close)
            rt.sink.close()
            rt.tailer.close()
            rt.sqlite.close()
            rt.cursors.close()
            log.info("daemon_stopped", drained=drained, stored=rt.sink.stats.stored)
        return 0

    async def _open_with_retry(self) -> Runtime:
        """A Qdrant server that is down at start-up is waited for; an embedded store error is final."""
        delay = self.config.pipeline.retry_initial
        attempt = 0
        while True:
            try:
                return await asyncio.to_thread(open_runtime, self.config, self.commit_batch, self.wrap_store,
                                               self.metrics.observe_store_latency)
            except StoreError as exc:
                if not self.config.store.url or self.stop_event.is_set():
                    raise
                attempt += 1
                log.error("store_retry", attempt=attempt, backoff_s=round(delay, 2), error=str(exc)[:300],
                          phase="open")
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.config.pipeline.retry_max)

    def _on_stop_signal(self) -> None:
        self._signals += 1
        if self._signals > 1:
            # Second signal: leave now. Cursors only move after acks, so nothing is lost.
            log.warning("daemon_exit_now")
            os._exit(0)
        self.stop_event.set()

    def _on_reload(self) -> None:
        # systemd wants the reload's start time with RELOADING=1 (sd_notify(3)).
        self.notifier.notify(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}")
        try:
            fresh = load_config(self.config.source_file or None)
            logsetup.set_level(fresh.log.level)
            log.info("config_reloaded", log_level=fresh.log.level)
        except Exception as exc:
            log.error("config_reload_failed", error=str(exc))
        self.notifier.notify("READY=1")

    # -- the sweep: the source of truth ------------------------------------------------------------

    async def _sweep_loop(self) -> None:
        assert self.rt is not None
        interval = self.config.watch.sweep_interval
        last_flush = -CREDENTIAL_FLUSH_INTERVAL
        while True:
            try:
                busy = await self.sweep_once()
                if self.gaps is not None:
                    await self.gaps.after_sweep(self.rt.tailer, self.rt.cursors, idle=not busy and self.rt.sink.idle)
                if self.capture is not None and time.monotonic() - last_flush >= CREDENTIAL_FLUSH_INTERVAL:
                    # Index rows that waited for their workspace (OpenClaw creates it at the agent's first run).
                    last_flush = time.monotonic()
                    await asyncio.to_thread(self.capture.flush_pending)
            except Exception as exc:  # never let one bad sweep end the daemon
                log.error("sweep_failed", error=f"{type(exc).__name__}: {exc}")
                busy = False
            if self.once and not busy:
                await self.rt.sink.drain(timeout=3600)
                if not await self.sweep_once():
                    self.stop_event.set()
                    return
            if not busy:
                # [tailer helper, issue 3] asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a
                # cancel that lands as the hint fires, and shutdown then waits on this task forever.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(interval):
                        await self.hint.wait()
                self.hint.clear()
                await asyncio.sleep(0.005)  # let a burst of events settle into one sweep

    async def sweep_once(self) -> bool:
        """Stat everything, read every file with new bytes to its last newline. True if anything was read."""
        rt = self.rt
        assert rt is not None
        agents = list(iter_agents(self.config.state_dir))
        result = await asyncio.to_thread(rt.tailer.sweep, agents)
        if result.dropped:
            await asyncio.to_thread(rt.cursors.commit_files, [], result.dropped)
        pending = list(result.changed)
        busy = False
        while pending:
            still = []
            for tracked in pending:
                unit_and_work = await asyncio.to_thread(self._read_and_transform, tracked)
                if unit_and_work is None:
                    continue
                busy = True
                await rt.sink.queue.put(unit_and_work)
                if not unit_and_work.at_eof:
                    still.append(tracked)
            pending = still
        busy = await self._poll_sqlite_sources(agents) or busy
        if self.watcher is not None:
            self.watcher.refresh()
        return busy

    async def _poll_sqlite_sources(self, agents: Sequence[AgentDirs]) -> bool:
        """Poll each agent's SQLite store; wait for each poll's work to be committed before the next."""
        rt = self.rt
        assert rt is not None
        busy = False
        loop = asyncio.get_running_loop()
        for agent in agents:
            if not agent.sqlite.is_file():
                continue
            while True:
                poll = await asyncio.to_thread(rt.sqlite.poll, agent.sqlite, agent.agent_id)
                if poll is None or not poll.batches:
                    break
                busy = True
                works = await asyncio.to_thread(self._transform_sqlite, poll)
                for work in works:
                    work.done = loop.create_future()
                    await rt.sink.queue.put(work)
                results = await asyncio.gather(*(w.done for w in works if w.done), return_exceptions=True)
                if any(isinstance(r, BaseException) for r in results) or not poll.has_more:
                    break
            for end in await asyncio.to_thread(rt.sqlite.ended_sessions, str(agent.sqlite)):
                log.info("conversation_ended", agent=agent.agent_id, session=end.session_id, reason=end.reason,
                         transcript=end.transcript, ended_at=end.ended_at)
                if self.gaps is not None:
                    await self.gaps.session_ended(agent.agent_id, end.session_id, end.transcript, end.ended_at,
                                                  end.session_kind)
        return busy

    def _transform_sqlite(self, poll: SqlitePoll) -> list[Work]:
        rt = self.rt
        assert rt is not None
        works = []
        for batch in poll.batches:
            state = rt.sqlite.session_state(poll.db_path, batch)
            out = self._transform(batch.records, state, batch.point_session_id)
            self._log_transformed((), out, f"{poll.db_path}#{batch.session_id}")
            works.append(Work(out.chunks, rt.sqlite.unit_for(poll.db_path, batch, state, out.ends),
                              cleanup=stale_point_cleanup(poll.db_path, poll.agent_id, batch)))
        return works

    def _transform(self, records: Sequence[RawRecord], state: SessionState, fallback_session: str) -> Transformed:
        assert self.rt is not None
        emb = self.config.embedding
        out = transform_records(records, state, fallback_session=fallback_session, redact_key=self.rt.redact_key,
                                max_line_bytes=self.config.watch.max_line_bytes, chunk_chars=emb.chunk_chars,
                                chunk_overlap=emb.chunk_overlap,
                                keep_values=self.capture is not None and self.capture.keeps_values)
        if out.found and self.capture is not None:
            self.capture.capture(out.found)  # indexed before the store ever sees the message
        return out

    def _read_and_transform(self, tracked: TrackedFile) -> Work | None:
        rt = self.rt
        assert rt is not None
        unit = rt.tailer.read(tracked)
        if unit is None:
            return None
        cursor = unit.cursor_after  # also the tailer's read-ahead state: the session facts carry on
        state = SessionState(cursor.session_id, cursor.session_kind, cursor.last_entry_ts,
                             restore_turn(cursor.turn), cursor.previous_text)
        out = self._transform(unit.records, state, session_stem(cursor.path))
        cursor.session_id, cursor.session_kind, cursor.last_entry_ts, cursor.turn, cursor.previous_text = (
            state.session_id, state.session_kind, state.last_entry_ts, state.turn, state.previous_text)
        self._log_transformed(unit.too_long, out, cursor.path)
        return Work(out.chunks, unit, unit.at_eof)

    def _log_transformed(self, too_long: Sequence[SourceRef], out: Transformed, source: str) -> None:
        assert self.rt is not None
        stats = self.rt.sink.stats
        for ref in too_long:
            log.warning("line_invalid", file=ref.path, line=ref.line, offset=ref.offset, reason="line_too_long")
        for ref, reason in out.invalid:
            log.warning("line_invalid", file=ref.path, line=ref.line, offset=ref.offset, seq=ref.seq, reason=reason)
        stats.invalid += len(out.invalid) + len(too_long)
        stats.skipped.update(out.skipped)
        for reason, count in out.skipped.items():
            log.debug("entry_skipped", file=source, reason=reason, count=count)
        for found in out.found:
            stats.redactions += 1
            log.info("secret_redacted", agent=found.agent_id, session=found.session_id, rule=found.finding.rule,
                     fingerprint=found.finding.fingerprint, location=found.location.render())

    def commit_batch(self, batch: Sequence[Work]) -> None:
        """Runs (in a thread) after the store acked every chunk of `batch`: persist the cursors."""
        rt = self.rt
        assert rt is not None
        cursors = []
        sqlite_units = []
        for work in batch:
            if isinstance(work.unit, ReadUnit) and (cursor := rt.tailer.mark_committed(work.unit)) is not None:
                cursors.append(cursor)
            elif isinstance(work.unit, SqliteUnit):
                sqlite_units.append(work.unit)
        if cursors:
            rt.cursors.commit_files(cursors)
        if sqlite_units:
            rt.sqlite.commit(sqlite_units)

    async def _housekeeping(self) -> None:
        """Watchdog pings from the pipeline's own heartbeat, STATUS lines, periodic summaries."""
        assert self.rt is not None and self.watcher is not None
        sink = self.rt.sink
        last_summary = time.monotonic()
        last_stored = 0
        stall_after = watchdog_stall_after(os.environ)
        while True:
            await asyncio.sleep(min(1.0, stall_after / 2))
            self.watcher.restart_if_dead()
            if time.monotonic() - sink.heartbeat < stall_after:  # a stalled sink stops the pings: systemd restarts
                self.notifier.notify("WATCHDOG=1")
            self.notifier.notify(f"STATUS={self.status_line()}")
            if time.monotonic() - last_summary >= self.config.log.summary_interval:
                elapsed = time.monotonic() - last_summary
                log.info("throughput_summary", stored=sink.stats.stored - last_stored,
                         per_s=round((sink.stats.stored - last_stored) / elapsed, 2),
                         skipped=sum(sink.stats.skipped.values()), backlog_bytes=self.backlog_bytes())
                last_summary, last_stored = time.monotonic(), sink.stats.stored

    async def _progress_bar(self) -> None:
        """Backfill on a terminal: bytes read and committed out of all transcript bytes seen."""
        assert self.rt is not None
        try:
            while True:
                await asyncio.sleep(0.5)
                files = self.rt.tailer.files.values()
                total = sum(t.size for t in files) or 1
                done = sum(min(t.committed.offset, t.size) for t in files)
                width = 30
                filled = int(width * done / total)
                sys.stderr.write(f"\rbackfill [{'#' * filled}{'.' * (width - filled)}] {100 * done / total:5.1f}% "
                                 f"{len(files)} files, {self.rt.sink.stats.stored} entries stored")
                sys.stderr.flush()
        finally:
            sys.stderr.write("\n")

    # -- status ------------------------------------------------------------------------------------

    def backlog_bytes(self) -> int:
        assert self.rt is not None
        return sum(t.backlog for t in list(self.rt.tailer.files.values()))  # list(): the sweep thread adds files

    def status_line(self) -> str:
        assert self.rt is not None
        files = list(self.rt.tailer.files.values())  # a copy: the sweep thread may add files meanwhile
        agents = {t.committed.agent_id for t in files}
        stats = self.rt.sink.stats
        rate = self.metrics.rate.update(time.monotonic(), stats.stored)  # over the last 30 s, not since start
        store = "down" if stats.store_down_since is not None else "ok"
        gaps = len(self.gaps.open_gaps()) if self.gaps is not None else 0
        sqlite_lag = sum(h.lag_rows for h in list(self.rt.sqlite.health.values()))
        return (f"agents={len(agents)} files={len(files)} entries/s={rate:.1f} backlog={self.backlog_bytes()}B "
                f"sqlite_lag={sqlite_lag} gaps={gaps} stored={stats.stored} queue={self.rt.sink.queue.qsize()} "
                f"store={store}")


def watchdog_stall_after(environ: Mapping[str, str]) -> float:
    """Seconds without a sink heartbeat before the pings stop: half of systemd's WatchdogSec=, else 30."""
    try:
        usec = int(environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return 30.0
    pid = environ.get("WATCHDOG_PID", "")
    if usec <= 0 or (pid and pid != str(os.getpid())):
        return 30.0
    return usec / 2_000_000
