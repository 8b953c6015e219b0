"""Per-micro-batch health of the speed layer: one log line, Prometheus text (file and HTTP), freshness.

Spark reports each micro-batch's progress to a ``StreamingQueryListener``; we reduce it to the figures an
operator watches — input rows and rate, batch duration, state rows, rows dropped as too late, unparseable rows,
the watermark and the Kafka lag — and expose them in the Prometheus text format, both as a textfile (for
node-exporter's textfile collector) and on a small loopback HTTP endpoint.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from infra.supervisor import RESTARTS_ENV

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
    state_rows: int
    dropped_late_rows: int
    unparseable_rows: int
    watermark: datetime | None
    kafka_lag_max: int | None
    future_rows: int = 0  # events beyond now + the ingest skew: not aggregated (they would stall the watermark)

    @classmethod
    def from_progress(cls, progress: dict[str, Any]) -> BatchMetrics:
        """Read the figures out of Spark's progress JSON."""
        ops = progress.get("stateOperators") or []
        lag: int | None = None
        for source in progress.get("sources") or []:
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
            state_rows=sum(int(op.get("numRowsTotal", 0)) for op in ops),
            dropped_late_rows=sum(int(op.get("numRowsDroppedByWatermark", 0)) for op in ops),
            unparseable_rows=int(parse.get("unparseable") or 0),
            watermark=_parse_ts(watermark),
            kafka_lag_max=lag,
            future_rows=int(parse.get("future") or 0),
        )

    def log_line(self) -> str:
        """Return the one-line summary logged per batch."""
        wm = self.watermark.isoformat() if self.watermark else "-"
        return (
            f"batch {self.batch_id}: {self.input_rows} rows in {self.batch_duration_ms} ms "
            f"({self.processed_rows_per_s:.0f} rows/s), state {self.state_rows} rows, "
            f"dropped late {self.dropped_late_rows}, unparseable {self.unparseable_rows}, "
            f"future {self.future_rows}, "
            f"watermark {wm}, kafka lag {self.kafka_lag_max if self.kafka_lag_max is not None else '-'}"
        )


def _parse_ts(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def _restarts_from_env() -> int:
    try:
        return max(0, int(os.environ.get(RESTARTS_ENV, "0")))
    except ValueError:
        return 0


class MetricsRegistry:
    """Totals and last values across batches, rendered in the Prometheus text format."""

    def __init__(self, query: str) -> None:
        self.query = query
        self._lock = threading.Lock()
        self.batches = 0
        self.input_rows_total = 0
        self.dropped_late_total = 0
        self.unparseable_total = 0
        self.future_total = 0
        self.last: BatchMetrics | None = None
        self.newest_event_ts: datetime | None = None
        # How often the stack's supervisor restarted this job after a failure (it tells each run the count so far).
        self.restarts = _restarts_from_env()

    def record(self, metrics: BatchMetrics) -> None:
        """Add one batch's figures."""
        with self._lock:
            self.batches += 1
            self.input_rows_total += metrics.input_rows
            self.dropped_late_total += metrics.dropped_late_rows
            self.unparseable_total += metrics.unparseable_rows
            self.future_total += metrics.future_rows
            self.last = metrics

    def render(self) -> str:
        """Return the Prometheus exposition text."""
        label = f'{{query="{self.query}"}}'
        with self._lock:
            last = self.last
            lines = [
                "# TYPE trends_speed_batches_total counter",
                f"trends_speed_batches_total{label} {self.batches}",
                "# TYPE trends_speed_input_rows_total counter",
                f"trends_speed_input_rows_total{label} {self.input_rows_total}",
                "# TYPE trends_speed_dropped_late_rows_total counter",
                f"trends_speed_dropped_late_rows_total{label} {self.dropped_late_total}",
                "# TYPE trends_speed_unparseable_rows_total counter",
                f"trends_speed_unparseable_rows_total{label} {self.unparseable_total}",
                "# TYPE trends_speed_future_rows_total counter",
                f"trends_speed_future_rows_total{label} {self.future_total}",
                "# TYPE trends_speed_restarts_total counter",
                f"trends_speed_restarts_total{label} {self.restarts}",
            ]
            if last is not None:
                gauges = {
                    "trends_speed_last_batch_id": last.batch_id,
                    "trends_speed_input_rows_per_second": last.input_rows_per_s,
                    "trends_speed_processed_rows_per_second": last.processed_rows_per_s,
                    "trends_speed_batch_duration_seconds": last.batch_duration_ms / 1000,
                    "trends_speed_state_rows": last.state_rows,
                }
                if last.kafka_lag_max is not None:
                    gauges["trends_speed_kafka_lag_records"] = last.kafka_lag_max
                if last.watermark is not None:
                    gauges["trends_speed_watermark_seconds"] = last.watermark.timestamp()
                if self.newest_event_ts is not None:
                    gauges["trends_speed_newest_event_time_seconds"] = self.newest_event_ts.timestamp()
                for name, value in gauges.items():
                    lines += [f"# TYPE {name} gauge", f"{name}{label} {value}"]
        return "\n".join(lines) + "\n"

    def write_textfile(self, path: Path) -> None:
        """Write the metrics atomically (rename) for a textfile collector."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.render())
        os.replace(tmp, path)

    def snapshot(self) -> dict[str, Any]:
        """Return the last batch's figures as JSON-able values."""
        with self._lock:
            return {} if self.last is None else json.loads(json.dumps(asdict(self.last), default=str))


def serve_metrics(registry: MetricsRegistry, host: str, port: int) -> ThreadingHTTPServer:
    """Serve ``/metrics`` on a daemon thread; return the server (``shutdown()`` stops it)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics here")
                return
            body = registry.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("metrics %s", format % args)

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="speed-metrics", daemon=True).start()
    logger.info("speed layer metrics on http://%s:%s/metrics", host, server.server_address[1])
    return server
