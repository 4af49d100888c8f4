"""Prometheus metrics for GET /metrics, read from the daemon's own state at scrape time.

Counters the pipeline already keeps (`PipelineStats`) are exported as they are, at scrape time, so
there is one bookkeeping and it cannot drift from `status`. Only what has no other home is recorded
here as it happens: the store latency histogram (`observe_store_latency`, the Sink's
`on_store_latency` callback) and detected gaps (`record_gap_detected`).

One registry per daemon (not prometheus-client's global one), with the standard process metrics
(`process_resident_memory_bytes`, CPU, open fds) added on Linux.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from veritas_watch.pipeline import PipelineStats
    from veritas_watch.snapshot import Snapshot

# Upsert of one batch (embedding included): milliseconds when idle, seconds under load or a slow server.
STORE_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class RateMeter:
    """Events per second over a sliding window, from a monotonically growing total."""

    def __init__(self, window: float = 30.0) -> None:
        self.window = window
        self._samples: deque[tuple[float, int]] = deque()

    def update(self, now: float, total: int) -> float:
        self._samples.append((now, total))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window:
            self._samples.popleft()
        first_t, first_total = self._samples[0]
        elapsed = now - first_t
        return (total - first_total) / elapsed if elapsed > 0 else 0.0


class _Starting:
    """Before start-up finished: no daemon families (only the process metrics and the histogram)."""

    def collect(self) -> Iterator[Metric]:
        return iter(())


class _DaemonCollector:
    """Turns the running daemon's live state into metric families on every scrape."""

    def __init__(self, stats: PipelineStats, snapshot: Callable[[], Snapshot], embedder: str, store: str) -> None:
        self._stats = stats
        self._snapshot = snapshot
        self._build = (embedder, store)

    def collect(self) -> Iterator[Metric]:
        stats = self._stats

        stored = CounterMetricFamily("veritas_entries_stored", "Points written to the store (one per entry chunk)",
                                     labels=["agent"])
        for agent, count in sorted(stats.per_agent.items()):
            stored.add_metric([agent], count)
        yield stored
        yield CounterMetricFamily("veritas_entries_unchanged",
                                  "Entries read again that the store already held unchanged (not re-embedded)",
                                  value=stats.unchanged)
        skipped = CounterMetricFamily("veritas_entries_skipped", "Transcript lines not stored, by reason",
                                      labels=["reason"])
        for reason, count in sorted(stats.skipped.items()):
            skipped.add_metric([reason], count)
        yield skipped
        yield CounterMetricFamily("veritas_lines_invalid", "Transcript lines that could not be parsed",
                                  value=stats.invalid)
        yield CounterMetricFamily("veritas_secrets_redacted", "Credentials found and redacted",
                                  value=stats.redactions)
        yield CounterMetricFamily("veritas_store_batches", "Batches acknowledged by the store", value=stats.batches)
        yield CounterMetricFamily("veritas_store_errors", "Store operations that failed (each retry counts)",
                                  value=stats.store_errors)
        snap = self._snapshot()
        yield GaugeMetricFamily("veritas_store_up", "1 while the store acknowledges writes, 0 while it is down",
                                value=1 if snap.store_up else 0)
        yield GaugeMetricFamily("veritas_last_store_timestamp_seconds",
                                "Unix time of the last batch the store acknowledged (0: none yet)",
                                value=stats.last_batch_at)
        lag_family = GaugeMetricFamily("veritas_ingest_lag_bytes",
                                       "Bytes written to transcripts but not yet stored and committed",
                                       labels=["agent"])
        for agent, backlog in sorted(snap.lag_bytes.items()):
            lag_family.add_metric([agent], backlog)
        yield lag_family
        yield GaugeMetricFamily("veritas_watched_files", "Transcript files tracked", value=snap.files)
        yield GaugeMetricFamily("veritas_agents", "Agents with at least one tracked transcript", value=snap.agents)
        yield GaugeMetricFamily("veritas_queue_depth", "Read units waiting for the sink", value=snap.queue)
        yield GaugeMetricFamily("veritas_queue_capacity", "Bound of the sink queue (backpressure beyond it)",
                                value=snap.queue_capacity)
        yield GaugeMetricFamily("veritas_pipeline_heartbeat_age_seconds",
                                "Seconds since the sink loop last advanced its heartbeat (the watchdog's signal)",
                                value=snap.heartbeat_age_s)
        yield GaugeMetricFamily("veritas_watcher_polling", "1 when the watcher fell back to (or was set to) polling",
                                value=1 if snap.watcher_mode == "polling" else 0)
        open_gaps = GaugeMetricFamily("veritas_gaps_open", "Ended sessions not yet covered by the agent's STATE.md",
                                      labels=["agent"])
        for agent, count in sorted(Counter(g.agent_id for g in snap.open_gaps).items()):
            open_gaps.add_metric([agent], count)
        yield open_gaps
        info = GaugeMetricFamily("veritas_build_info", "Embedder and store in use", labels=["embedder", "store"])
        info.add_metric(list(self._build), 1)
        yield info


class _Attached:
    """The registry's place for the daemon's families, filled by `DaemonMetrics.attach`."""

    def __init__(self) -> None:
        self.state: _Starting | _DaemonCollector = _Starting()

    def collect(self) -> Iterator[Metric]:
        return self.state.collect()


class DaemonMetrics:
    """The daemon's registry. Create one per Daemon; pass `observe_store_latency` to the Sink, and `attach`
    the running daemon's state once start-up finished (until then: the process metrics and the histogram)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.store_latency = Histogram(
            "veritas_store_latency_seconds", "Time to embed and upsert one batch until the store acknowledged it",
            buckets=STORE_LATENCY_BUCKETS, registry=self.registry,
        )
        self.gaps_detected = PromCounter("veritas_gaps_detected", "Gaps detected since start", ["agent"],
                                         registry=self.registry)
        self._daemon = _Attached()
        self.registry.register(self._daemon)
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes & co; empty off Linux
        self.rate = RateMeter()

    def attach(self, stats: PipelineStats, snapshot: Callable[[], Snapshot], *, embedder: str, store: str) -> None:
        """The running daemon's counters (`PipelineStats`, exported as they are) and its snapshot, read at
        every scrape; `embedder` and `store` (server | embedded) for `veritas_build_info`."""
        self._daemon.state = _DaemonCollector(stats, snapshot, embedder, store)

    def observe_store_latency(self, seconds: float) -> None:
        self.store_latency.observe(seconds)

    def record_gap_detected(self, agent_id: str) -> None:
        self.gaps_detected.labels(agent=agent_id).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
