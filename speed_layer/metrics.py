"""Per-micro-batch health of the speed layer: one log line, and Prometheus metrics (HTTP and textfile).

Spark reports each micro-batch's progress to a ``StreamingQueryListener``; we reduce it to the figures an
operator watches — input rows and rate, batch duration, state rows, rows dropped as too late, unparseable rows,
events skipped below the batch watermark a checkpoint started from, the watermark, the consumer lag and the newest
event time written (freshness) — and expose them with ``prometheus_client``: on ``/metrics`` (``metrics.host``,
``metrics.speed_port``) and as a textfile for node-exporter's textfile collector. Names follow Prometheus's
conventions: counters end in ``_total``, times are ``_timestamp_seconds`` (Unix time, so freshness is ``time() - …``
in a rule) or ``_seconds`` (durations).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest, start_http_server, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from infra.settings import RESTARTS_ENV

logger = logging.getLogger(__name__)

PARSE_METRICS = "parse"


@dataclass(frozen=True)
class BatchMetrics:
    """The figures of one micro-batch."""

    batch_id: int
    input_rows: int
    input_rows_per_s: float
    processed_rows_per_s: float
    batch_duration_ms: int
    state_rows: int | None  # None: not counted (speed.track_state_rows off)
    dropped_late_rows: int
    unparseable_rows: int
    watermark: datetime | None
    kafka_lag_max: int | None
    future_rows: int = 0  # events beyond now + the ingest skew: not aggregated (they would stall the watermark)
    # Spark's durationMs: where the batch's time went (latestOffset, queryPlanning, walCommit, addBatch — our
    # foreachBatch sink, the Spark job included —, commitOffsets, triggerExecution: the whole batch).
    phases_ms: dict[str, int] = field(default_factory=dict)
    skipped_below_watermark_rows: int = 0  # events below the boundary a checkpoint started from: the batch has them
    started_at: datetime | None = None  # the trigger's start, before Spark asked Kafka for its latest offsets
    read_to_end: bool = False  # it read up to the latest offsets Spark saw when planning it (every partition)
    # Each stateful operator's time in the batch (updates, removals — the watermark's eviction —, commit), by name:
    # the dedupe's eviction scans its whole state each batch, so its cost grows with rate x lateness.
    state_ms: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    # Spark's memoryUsedBytes over the stateful operators: with RocksDB, its memtables, block cache and table
    # readers (native memory, outside the JVM heap). None: no stateful operator reported it.
    state_memory_bytes: int | None = None

    @classmethod
    def from_progress(cls, progress: dict[str, Any], *, state_rows_tracked: bool = True) -> BatchMetrics:
        """Read the figures out of Spark's progress JSON.

        :arg state_rows_tracked: whether the state store counts its rows; Spark reports 0 when it does not.
        """
        ops = progress.get("stateOperators") or []
        lag: int | None = None
        sources = progress.get("sources") or []
        for source in sources:
            metrics = source.get("metrics") or {}
            if "maxOffsetsBehindLatest" in metrics:
                value = int(float(metrics["maxOffsetsBehindLatest"]))
                lag = value if lag is None else max(lag, value)
        watermark = (progress.get("eventTime") or {}).get("watermark")
        parse = (progress.get("observedMetrics") or {}).get(PARSE_METRICS) or {}
        return cls(
            batch_id=int(progress.get("batchId", -1)),
            input_rows=int(progress.get("numInputRows", 0)),
            input_rows_per_s=float(progress.get("inputRowsPerSecond") or 0.0),
            processed_rows_per_s=float(progress.get("processedRowsPerSecond") or 0.0),
            batch_duration_ms=int(progress.get("batchDuration", 0)),
            state_rows=sum(int(op.get("numRowsTotal", 0)) for op in ops) if state_rows_tracked else None,
            dropped_late_rows=sum(int(op.get("numRowsDroppedByWatermark", 0)) for op in ops),
            unparseable_rows=int(parse.get("unparseable") or 0),
            watermark=_parse_ts(watermark),
            kafka_lag_max=lag,
            future_rows=int(parse.get("future") or 0),
            phases_ms={k: int(v) for k, v in (progress.get("durationMs") or {}).items()},
            skipped_below_watermark_rows=int(parse.get("below_watermark") or 0),
            started_at=_parse_ts(progress.get("timestamp")),
            state_ms=_state_ms(ops),
            state_memory_bytes=sum(int(op["memoryUsedBytes"]) for op in ops if "memoryUsedBytes" in op)
            if any("memoryUsedBytes" in op for op in ops)
            else None,
            read_to_end=bool(sources)
            and lag == 0
            and all("maxOffsetsBehindLatest" in (s.get("metrics") or {}) for s in sources),
        )

    def log_line(self) -> str:
        """Return the one-line summary logged per batch."""
        wm = self.watermark.isoformat() if self.watermark else "-"
        state = "-" if self.state_rows is None else self.state_rows
        return (
            f"batch {self.batch_id}: {self.input_rows} rows in {self.batch_duration_ms} ms "
            f"({self.processed_rows_per_s:.0f} rows/s), state {state} rows, "
            f"dropped late {self.dropped_late_rows}, unparseable {self.unparseable_rows}, "
            f"future {self.future_rows}, below the batch watermark {self.skipped_below_watermark_rows}, "
            f"watermark {wm}, kafka lag {self.kafka_lag_max if self.kafka_lag_max is not None else '-'}"
            + (f"; ms: {', '.join(f'{k} {v}' for k, v in self.phases_ms.items())}" if self.phases_ms else "")
            + (
                "; state ms (updates/removals/commit): "
                + ", ".join(f"{name} {u}/{r}/{c}" for name, (u, r, c) in self.state_ms.items())
                if self.state_ms
                else ""
            )
        )


def _state_ms(ops: list[dict[str, Any]]) -> dict[str, tuple[int, int, int]]:
    """Each stateful operator's (updates, removals, commit) ms by name; a repeated name gets its position appended."""
    out: dict[str, tuple[int, int, int]] = {}
    for i, op in enumerate(ops):
        name = str(op.get("operatorName") or "op")
        key = name if name not in out else f"{name}#{i}"
        out[key] = (
            int(op.get("allUpdatesTimeMs", 0)),
            int(op.get("allRemovalsTimeMs", 0)),
            int(op.get("commitTimeMs", 0)),
        )
    return out


def _parse_ts(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def _restarts_from_env() -> int:
    try:
        return max(0, int(os.environ.get(RESTARTS_ENV, "0")))
    except ValueError:
        return 0


# name -> help of every metric the speed job exports (the alert rules' unit test checks they exist).
COUNTERS = {
    "trends_speed_batches_total": "Micro-batches completed by this run of the job.",
    "trends_speed_input_rows_total": "Kafka records read.",
    "trends_speed_dropped_late_rows_total": "Events later than speed.allowed_lateness_s, dropped.",
    "trends_speed_unparseable_rows_total": "Records that are not events (ingestion should have dead-lettered them).",
    "trends_speed_future_rows_total": "Events beyond now + ingest.max_future_skew_s: counted, not aggregated.",
    "trends_speed_skipped_below_batch_watermark_rows_total": (
        "Events before the batch boundary a checkpoint started from (speed.from_watermark): skipped, the batch view "
        "has them."
    ),
    "trends_speed_restarts_total": "Restarts of the job by the stack's supervisor after a failure (since it started).",
}
GAUGES = {
    "trends_speed_last_batch_id": "Id of the last completed micro-batch.",
    "trends_speed_input_rows_per_second": "Input rate of the last micro-batch.",
    "trends_speed_processed_rows_per_second": "Processing rate of the last micro-batch.",
    "trends_speed_batch_duration_seconds": "Duration of the last micro-batch.",
    "trends_speed_state_rows": "Rows in the streaming state (buckets within the watermark, ids for dedupe).",
    "trends_speed_state_memory_bytes": (
        "Memory of the streaming state (RocksDB: memtables, block cache, table readers; native, not heap)."
    ),
    "trends_speed_consumer_lag_records": "Records the last batch left unread of the offsets seen when it was planned "
    "(largest over partitions): above 0 only while maxOffsetsPerTrigger caps catch-up batches.",
    "trends_speed_watermark_timestamp_seconds": "The streaming watermark (event time), Unix time.",
    "trends_speed_newest_event_timestamp_seconds": "Newest event time written to the speed view, Unix time.",
    "trends_speed_last_progress_timestamp_seconds": "When the query last reported progress (wall clock), Unix time.",
}


class MetricsRegistry(Collector):
    """Totals and last values across batches; a Prometheus collector of its own registry (read on scrape)."""

    def __init__(self, query: str) -> None:
        self.query = query
        self._lock = threading.Lock()
        self.batches = 0
        self.input_rows_total = 0
        self.dropped_late_total = 0
        self.unparseable_total = 0
        self.future_total = 0
        self.skipped_below_watermark_total = 0
        self.last: BatchMetrics | None = None
        self.newest_event_ts: datetime | None = None
        self.last_progress: float | None = None
        # How often the stack's supervisor restarted this job after a failure (it tells each run the count so far).
        self.restarts = _restarts_from_env()
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def record(self, metrics: BatchMetrics) -> None:
        """Add one batch's figures."""
        with self._lock:
            self.batches += 1
            self.input_rows_total += metrics.input_rows
            self.dropped_late_total += metrics.dropped_late_rows
            self.unparseable_total += metrics.unparseable_rows
            self.future_total += metrics.future_rows
            self.skipped_below_watermark_total += metrics.skipped_below_watermark_rows
            self.last = metrics
            self.last_progress = time.time()

    def idle(self) -> None:
        """Note that the query is alive but had no new data (Spark's idle event)."""
        with self._lock:
            self.last_progress = time.time()

    def collect(self) -> Iterator[Metric]:
        """Yield the metric families (prometheus_client calls this on every scrape)."""
        with self._lock:
            totals = {
                "trends_speed_batches_total": self.batches,
                "trends_speed_input_rows_total": self.input_rows_total,
                "trends_speed_dropped_late_rows_total": self.dropped_late_total,
                "trends_speed_unparseable_rows_total": self.unparseable_total,
                "trends_speed_future_rows_total": self.future_total,
                "trends_speed_skipped_below_batch_watermark_rows_total": self.skipped_below_watermark_total,
                "trends_speed_restarts_total": self.restarts,
            }
            gauges: dict[str, float | None] = dict.fromkeys(GAUGES)
            last = self.last
            if last is not None:
                gauges.update(
                    {
                        "trends_speed_last_batch_id": last.batch_id,
                        "trends_speed_input_rows_per_second": last.input_rows_per_s,
                        "trends_speed_processed_rows_per_second": last.processed_rows_per_s,
                        "trends_speed_batch_duration_seconds": last.batch_duration_ms / 1000,
                        "trends_speed_state_rows": last.state_rows,
                        "trends_speed_state_memory_bytes": last.state_memory_bytes,
                        "trends_speed_consumer_lag_records": last.kafka_lag_max,
                        "trends_speed_watermark_timestamp_seconds": last.watermark.timestamp()
                        if last.watermark
                        else None,
                    }
                )
            if self.newest_event_ts is not None:
                gauges["trends_speed_newest_event_timestamp_seconds"] = self.newest_event_ts.timestamp()
            gauges["trends_speed_last_progress_timestamp_seconds"] = self.last_progress
        for name, value in totals.items():
            family = CounterMetricFamily(name, COUNTERS[name], labels=["query"])
            family.add_metric([self.query], value)
            yield family
        for name, gauge in gauges.items():
            if gauge is None:  # not known yet: no sample rather than a made-up zero
                continue
            gfamily = GaugeMetricFamily(name, GAUGES[name], labels=["query"])
            gfamily.add_metric([self.query], gauge)
            yield gfamily

    def render(self) -> str:
        """Return the Prometheus exposition text."""
        return generate_latest(self.registry).decode()

    def write_textfile(self, path: Path) -> None:
        """Write the metrics atomically (rename) for a textfile collector."""
        path.parent.mkdir(parents=True, exist_ok=True)
        write_to_textfile(str(path), self.registry)

    def snapshot(self) -> dict[str, Any]:
        """Return the last batch's figures as JSON-able values."""
        with self._lock:
            return {} if self.last is None else json.loads(json.dumps(asdict(self.last), default=str))


def serve_metrics(registry: MetricsRegistry, host: str, port: int) -> Any:
    """Serve ``/metrics`` of the registry on a daemon thread; return the server (``shutdown()`` stops it)."""
    server, _thread = start_http_server(port, addr=host, registry=registry.registry)
    logger.info("speed layer metrics on http://%s:%s/metrics", host, server.server_address[1])
    return server
