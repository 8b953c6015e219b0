"""``trends batch exporter``: the batch layer's state as Prometheus metrics, read from Cassandra and Airflow on scrape.

The batch layer is a sequence of short jobs; what an operator alerts on is the state they leave in Cassandra — the
watermark, the index's event-time horizon, stale and missing hours — and Airflow's record of its runs. This
long-running process is what Prometheus scrapes for the batch layer: a custom collector reads that state on each
scrape (never a cached copy that could hide a stalled read), bounded by ``metrics.batch_read_timeout_s``. A read
that fails or takes longer reports ``trends_batch_up 0`` (``trends_airflow_up 0`` for Airflow) and no state
samples, so a blind exporter is itself an alert rather than a silence.

Metric names follow Prometheus's conventions: ``_seconds`` for durations, ``_timestamp_seconds`` for points in
time (Unix time; a rule computes ages with ``time()``), ``_total`` for counters, base units throughout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import click

from infra.airflow.client import AirflowAPIError, AirflowClient, runs_path, task_instances_path
from infra.settings import Settings

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from infra.privacy.ledger import Summary
    from views.store.index import Horizon
    from views.store.pointers import Watermark

logger = logging.getLogger(__name__)

T = TypeVar("T")

# name -> help of every metric the exporter can export (the alert rules' unit test checks each rule's metrics).
METRICS = {
    "trends_batch_up": "1 if the last scrape read the batch layer's state from Cassandra within the timeout, else 0.",
    "trends_batch_read_duration_seconds": "How long the last read of the batch layer's state took.",
    "trends_batch_watermark_timestamp_seconds": "The batch watermark: end of the contiguous completed hours.",
    "trends_batch_watermark_low_timestamp_seconds": "Start of the contiguous completed hours.",
    "trends_batch_pinned_timestamp_seconds": "The operator's pin of the serving boundary (absent when unpinned).",
    "trends_batch_closed_until_timestamp_seconds": "End of the newest closed hour (index horizon minus the grace).",
    "trends_batch_watermark_lag_seconds": "How far the watermark is behind the end of the newest closed hour.",
    "trends_batch_index_horizon_timestamp_seconds": "Event time every active partition has passed (the index).",
    "trends_batch_index_horizon_lag_seconds": "Wall clock minus the index horizon; `partition` holds it back.",
    "trends_batch_index_partition_newest_timestamp_seconds": "Newest record time the index saw, per partition.",
    "trends_batch_index_idle_partitions": "Partitions without new records for batch.idle_partition_s (ignored).",
    "trends_batch_index_skipped_records_total": "Records the indexer skipped: they carry no usable timestamp.",
    "trends_batch_index_lost_records_total": "Records removed from Kafka (retention, DeleteRecords) before the "
    "indexer read them (each loss recorded with its offsets and time bound: trends batch status).",
    "trends_batch_stale_hours": "Completed hours whose indexed records grew after their current run read them.",
    "trends_batch_missing_hours": "Hours below the watermark without a current run (within metrics.batch_scan_days).",
    "trends_batch_pending_hours": "Closed hours above the watermark without a current run (within the scan).",
    "trends_batch_incomplete_hours": "Hours that may hold records removed before they were indexed.",
    "trends_batch_old_definition_hours": "Hours below the watermark whose current run computed with another view "
    "definition than the serving one (within the scan): served only for the slices it defines alike; a backfill "
    "recomputes them.",
    "trends_batch_reconciliation_beyond_bound_events": "The last reconciliation's largest difference beyond the "
    "sketches' bounds, in events (0: the batch and speed views agree within them).",
    "trends_batch_reconciliation_timestamp_seconds": "When the last reconciliation ran.",
    "trends_privacy_erasure_requests": "Erasure requests in the ledger by state: pending (not done yet: waiting for "
    "the unlink or a recompute), done, failed.",
    "trends_privacy_erasure_oldest_pending_age_seconds": "How long the oldest pending erasure request has waited "
    "(absent when none is pending).",
    "trends_privacy_erasure_deadline_seconds": "privacy.erasure_deadline_days in seconds: a request pending longer is "
    "overdue.",
    "trends_airflow_up": "1 if the last scrape read Airflow's REST API within the timeout, else 0.",
    "trends_airflow_dag_last_success_timestamp_seconds": "End of the DAG's newest successful run.",
    "trends_airflow_failed_task_instances": "Task instances of the DAG in state failed that ended within "
    "metrics.airflow_failed_window_s.",
}


def _ts(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


@dataclass
class BatchState:
    """What one read of Cassandra found (None: not known, exported as no sample)."""

    now: datetime
    watermark: Watermark
    horizon: Horizon
    closed_until: datetime | None
    stale_hours: int
    missing_hours: int | None
    pending_hours: int | None
    skipped: dict[int, int] = field(default_factory=dict)
    # Read by the loss and reconciliation work (new views/store reads); None until wired: never a made-up 0.
    incomplete_hours: int | None = None
    reconciliation_beyond_bound: int | None = None
    reconciliation_at: datetime | None = None
    lost: dict[int, int] = field(default_factory=dict)
    old_definition_hours: int | None = None
    # The erasure ledger's requests (infra.privacy.ledger.Summary); None when the ledger could not be read.
    erasures: Summary | None = None
    erasure_deadline_s: float | None = None


@dataclass
class AirflowState:
    """What one read of Airflow's REST API found, per DAG."""

    last_success: dict[str, datetime | None]
    failed_task_instances: dict[str, int]


def hours_without_run(start: datetime, end: datetime, completed: set[datetime]) -> int:
    """Return how many whole hours of ``[start, end)`` have no current run."""
    from views.buckets import HOUR  # noqa: PLC0415

    n, hour = 0, start
    while hour < end:
        n += hour not in completed
        hour += HOUR
    return n


def batch_families(state: BatchState) -> Iterator[Metric]:
    """Yield the metric families of a batch state (pure: the unit tests feed it states)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily  # noqa: PLC0415

    def gauge(name: str, value: float | None) -> Iterator[Metric]:
        if value is not None:
            yield GaugeMetricFamily(name, METRICS[name], value=value)

    wm, hz = state.watermark, state.horizon
    yield from gauge("trends_batch_watermark_timestamp_seconds", _ts(wm.mark))
    yield from gauge("trends_batch_watermark_low_timestamp_seconds", _ts(wm.low))
    yield from gauge("trends_batch_pinned_timestamp_seconds", _ts(wm.pinned))
    yield from gauge("trends_batch_closed_until_timestamp_seconds", _ts(state.closed_until))
    if wm.mark is not None and state.closed_until is not None:
        lag = max(0.0, (state.closed_until - wm.mark).total_seconds())
        yield from gauge("trends_batch_watermark_lag_seconds", lag)
    yield from gauge("trends_batch_index_horizon_timestamp_seconds", _ts(hz.closed_at))
    if hz.closed_at is not None:
        held = GaugeMetricFamily(
            "trends_batch_index_horizon_lag_seconds",
            METRICS["trends_batch_index_horizon_lag_seconds"],
            labels=["partition"],
        )
        held_by = "none" if hz.held_by is None else str(hz.held_by)
        held.add_metric([held_by], max(0.0, (state.now - hz.closed_at).total_seconds()))
        yield held
    newest = GaugeMetricFamily(
        "trends_batch_index_partition_newest_timestamp_seconds",
        METRICS["trends_batch_index_partition_newest_timestamp_seconds"],
        labels=["partition"],
    )
    for partition, ts in sorted(hz.newest.items()):
        if ts is not None:
            newest.add_metric([str(partition)], ts.timestamp())
    yield newest
    yield from gauge("trends_batch_index_idle_partitions", len(hz.idle))
    skipped = CounterMetricFamily(
        "trends_batch_index_skipped_records",
        METRICS["trends_batch_index_skipped_records_total"],
        labels=["partition"],
    )
    for partition, count in sorted(state.skipped.items()):
        skipped.add_metric([str(partition)], count)
    yield skipped
    lost = CounterMetricFamily(
        "trends_batch_index_lost_records",
        METRICS["trends_batch_index_lost_records_total"],
        labels=["partition"],
    )
    for partition, count in sorted(state.lost.items()):
        lost.add_metric([str(partition)], count)
    yield lost
    yield from gauge("trends_batch_stale_hours", state.stale_hours)
    yield from gauge("trends_batch_missing_hours", state.missing_hours)
    yield from gauge("trends_batch_pending_hours", state.pending_hours)
    yield from gauge("trends_batch_old_definition_hours", state.old_definition_hours)
    yield from gauge("trends_batch_incomplete_hours", state.incomplete_hours)
    yield from gauge("trends_batch_reconciliation_beyond_bound_events", state.reconciliation_beyond_bound)
    yield from gauge("trends_batch_reconciliation_timestamp_seconds", _ts(state.reconciliation_at))
    yield from erasure_families(state)


def erasure_families(state: BatchState) -> Iterator[Metric]:
    """Yield the erasure ledger's families: requests by state, the oldest pending one's age, the deadline."""
    from prometheus_client.core import GaugeMetricFamily  # noqa: PLC0415

    summary = state.erasures
    if summary is None:
        return
    name = "trends_privacy_erasure_requests"
    requests = GaugeMetricFamily(name, METRICS[name], labels=["state"])
    for label, count in (("pending", summary.pending), ("done", summary.done), ("failed", summary.failed)):
        requests.add_metric([label], count)
    yield requests
    age = summary.oldest_pending_age_s(state.now)
    if age is not None:
        name = "trends_privacy_erasure_oldest_pending_age_seconds"
        yield GaugeMetricFamily(name, METRICS[name], value=age)
    if state.erasure_deadline_s is not None:
        name = "trends_privacy_erasure_deadline_seconds"
        yield GaugeMetricFamily(name, METRICS[name], value=state.erasure_deadline_s)


def airflow_families(state: AirflowState) -> Iterator[Metric]:
    """Yield the metric families of Airflow's state."""
    from prometheus_client.core import GaugeMetricFamily  # noqa: PLC0415

    name = "trends_airflow_dag_last_success_timestamp_seconds"
    last = GaugeMetricFamily(name, METRICS[name], labels=["dag_id"])
    for dag_id, ts in sorted(state.last_success.items()):
        if ts is not None:  # never succeeded: no sample (the age rule then sees nothing, the failures rule does)
            last.add_metric([dag_id], ts.timestamp())
    yield last
    name = "trends_airflow_failed_task_instances"
    failed = GaugeMetricFamily(name, METRICS[name], labels=["dag_id"])
    for dag_id, count in sorted(state.failed_task_instances.items()):
        failed.add_metric([dag_id], count)
    yield failed


class BatchReader:
    """Reads the batch layer's state over one long-lived Cassandra session (rebuilt after a failure)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._cluster: Any = None
        self._stores: tuple[Any, Any, Any, Any] | None = None

    def _open(self) -> tuple[Any, Any, Any, Any]:
        if self._stores is None:
            from infra.cassandra import make_cluster  # noqa: PLC0415
            from views.store.checks import Checks  # noqa: PLC0415
            from views.store.index import IndexStore  # noqa: PLC0415
            from views.store.losses import LossStore  # noqa: PLC0415
            from views.store.pointers import PointerStore  # noqa: PLC0415

            self._cluster = make_cluster(self.settings, connect_timeout=self.settings.metrics.batch_read_timeout_s)
            sess = self._cluster.connect()
            self._stores = (
                PointerStore(self.settings, sess), IndexStore(self.settings, sess), LossStore(self.settings, sess),
                Checks(self.settings, sess),
            )  # fmt: skip
        return self._stores

    def close(self) -> None:
        """Shut the driver down (the next read connects again)."""
        if self._cluster is not None:
            self._cluster.shutdown()
        self._cluster, self._stores = None, None

    def read(self) -> BatchState:
        """Read the watermark, the index horizon, stale and missing hours.

        :raises Exception: whatever the driver raises; the collector reports it as ``trends_batch_up 0``.
        """
        from views.buckets import DAY, HOUR, closed_until, days_between, floor  # noqa: PLC0415
        from views.store.definitions import DefinitionStore, other_definition_hours  # noqa: PLC0415
        from views.store.index import index_horizon  # noqa: PLC0415

        try:
            pointers, index, losses, checks = self._open()
            cfg = self.settings
            topic = cfg.kafka.events_topic
            now = datetime.now(UTC)
            wm = pointers.watermark()
            states = index.states(topic)
            hz = index_horizon(states.values(), now, timedelta(seconds=cfg.batch.idle_partition_s))
            closed = closed_until(hz.closed_at, cfg)
            stale = len(index.stale(topic))
            missing = pending = old = None
            if wm.mark is not None and wm.low is not None:
                end = max(closed or wm.mark, wm.mark)
                start = max(wm.low, floor(end - cfg.metrics.batch_scan_days * DAY, HOUR))
                current = pointers.pointers_indexed(days_between(start, end))
                completed = set(current)
                missing = hours_without_run(start, wm.mark, completed)
                pending = hours_without_run(max(start, wm.mark), end, completed)
                serving = DefinitionStore(cfg, pointers.sess).serving()
                in_scan = {h: p for h, p in current.items() if h >= start}
                old = len(other_definition_hours(in_scan, serving.fingerprint, wm.mark))
            # incomplete hours have no lower bound (a loss may touch any hour before its bound): count those from
            # the batch view's first hour (or the scanned days) to now
            scan_end = floor(now, HOUR) + HOUR
            scan_start = wm.low or floor(scan_end - cfg.metrics.batch_scan_days * DAY, HOUR)
            incomplete = len(losses.incomplete(topic, scan_start, scan_end))
            last = checks.last()
            erasures = self._erasures(pointers.sess)
            return BatchState(
                now=now,
                watermark=wm,
                horizon=hz,
                closed_until=closed,
                stale_hours=stale,
                missing_hours=missing,
                pending_hours=pending,
                skipped={p: s.untimed for p, s in states.items()},
                incomplete_hours=incomplete,
                reconciliation_beyond_bound=None if last is None else last.beyond_bound,
                reconciliation_at=None if last is None else last.checked_at,
                lost={p: s.lost for p, s in states.items()},
                old_definition_hours=old,
                erasures=erasures,
                erasure_deadline_s=cfg.privacy.erasure_deadline_days * 86400.0,
            )
        except Exception:
            self.close()
            raise

    def _erasures(self, sess: Any) -> Summary | None:
        """Read the erasure ledger's summary; a failure (no ledger table yet) leaves the batch state readable."""
        from infra.privacy.ledger import read_summary  # noqa: PLC0415

        try:
            return read_summary(self.settings, sess)
        except Exception as exc:  # noqa: BLE001 - the erasure samples are absent, the batch ones still exported
            logger.warning("the erasure ledger could not be read: %s", exc)
            return None


class AirflowReader:
    """Reads the DAGs' last successes and recent task failures through :class:`AirflowClient` (GETs only)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.client = AirflowClient(settings)

    def _get(self, path: str) -> Any:
        """GET as the client's bearer: ``airflow.api_token`` as is, else a login renewed once when it expires."""
        return self.client.api("GET", path)

    def read(self) -> AirflowState:
        """Ask the REST API about each DAG of ``metrics.airflow_dags`` (a DAG Airflow does not know is skipped)."""
        cfg = self.settings.metrics
        since = datetime.now(UTC) - timedelta(seconds=cfg.airflow_failed_window_s)
        state = AirflowState({}, {})
        for dag_id in cfg.airflow_dags:
            try:
                runs = self._get(runs_path(dag_id, state="success", order_by="-end_date", limit=1))
            except AirflowAPIError as exc:
                if exc.status == 404:
                    logger.debug("Airflow does not know DAG %s (not parsed yet?)", dag_id)
                    continue
                raise
            ends = [r.get("end_date") for r in runs.get("dag_runs", [])]
            state.last_success[dag_id] = datetime.fromisoformat(ends[0]) if ends and ends[0] else None
            failed = self._get(
                task_instances_path(dag_id, "~", state="failed", end_date_gte=since.isoformat(), limit=1)
            )
            state.failed_task_instances[dag_id] = int(failed.get("total_entries", 0))
        return state


class _Bounded:
    """Runs one read at a time on a worker thread and waits for it at most the timeout.

    A read still running when the next scrape comes is not doubled: that scrape reports a failure, so a hung
    Cassandra or Airflow shows as ``_up 0`` instead of piling up threads.
    """

    def __init__(self, name: str, timeout_s: float) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"exporter-{name}")
        self._pending: Future[Any] | None = None
        self._lock = threading.Lock()

    def run(self, read: Callable[[], T]) -> T | None:
        """Return the read's result, or None when it failed, timed out or the previous one still runs."""
        with self._lock:
            if self._pending is not None and not self._pending.done():
                logger.warning("%s: the previous read is still running; reporting it as failed", self.name)
                return None
            future: Future[T] = self._pool.submit(read)
            self._pending = future
        try:
            return future.result(timeout=self.timeout_s)
        except FutureTimeout:
            logger.warning("%s: no answer within %.1f s", self.name, self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - any failure of the read is a failed scrape, reported as _up 0
            logger.warning("%s: read failed: %s", self.name, exc)
        return None


class BatchCollector:
    """The Prometheus collector of the batch layer (and of Airflow's runs when ``metrics.airflow_enabled``)."""

    def __init__(
        self,
        settings: Settings,
        batch: Callable[[], BatchState] | None = None,
        airflow: Callable[[], AirflowState] | None = None,
    ) -> None:
        timeout = settings.metrics.batch_read_timeout_s
        self._reader = BatchReader(settings) if batch is None else None
        self._batch = batch or self._reader.read  # type: ignore[union-attr]
        self._airflow = airflow
        if airflow is None and settings.metrics.airflow_enabled:
            self._airflow = AirflowReader(settings).read
        self._batch_run = _Bounded("batch", timeout)
        self._airflow_run = _Bounded("airflow", timeout)

    def describe(self) -> Iterator[Metric]:
        """Describe nothing up front: reading the state at registration would hit Cassandra."""
        return iter(())

    def collect(self) -> Iterator[Metric]:
        """Read the state now and yield it, with the success gauges."""
        from prometheus_client.core import GaugeMetricFamily  # noqa: PLC0415

        began = time.monotonic()
        state = self._batch_run.run(self._batch)
        duration = time.monotonic() - began
        yield GaugeMetricFamily("trends_batch_up", METRICS["trends_batch_up"], value=int(state is not None))
        yield GaugeMetricFamily(
            "trends_batch_read_duration_seconds", METRICS["trends_batch_read_duration_seconds"], value=duration
        )
        if state is not None:
            yield from batch_families(state)
        if self._airflow is not None:
            flow = self._airflow_run.run(self._airflow)
            yield GaugeMetricFamily("trends_airflow_up", METRICS["trends_airflow_up"], value=int(flow is not None))
            if flow is not None:
                yield from airflow_families(flow)

    def close(self) -> None:
        """Release the Cassandra session."""
        if self._reader is not None:
            self._reader.close()


def serve(settings: Settings, stop: threading.Event | None = None) -> None:
    """Serve the batch layer's metrics on ``metrics.host:metrics.batch_exporter_port`` until SIGTERM/Ctrl-C."""
    import signal  # noqa: PLC0415

    from prometheus_client import CollectorRegistry, start_http_server  # noqa: PLC0415

    stop = stop or threading.Event()
    collector = BatchCollector(settings)
    registry = CollectorRegistry()
    registry.register(collector)
    host, port = settings.metrics.host, settings.metrics.batch_exporter_port
    server, thread = start_http_server(port, addr=host, registry=registry)
    logger.info("batch layer metrics on http://%s:%s/metrics", host, port)
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        stop.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.shutdown()
        server.server_close()
        thread.join(5)
        collector.close()


@click.command("exporter")
@click.pass_obj
def exporter(settings: Settings) -> None:
    """Serve the batch layer's state as Prometheus metrics (what Prometheus scrapes for the batch layer).

    Reads the watermark, the index horizon, stale and missing hours from Cassandra, and the DAGs' last successes
    and failed tasks from Airflow's REST API, on every scrape (metrics.host, metrics.batch_exporter_port).
    """
    click.echo(
        f"serving the batch layer's metrics on http://{settings.metrics.host}:{settings.metrics.batch_exporter_port}"
        "/metrics (Ctrl-C stops)",
        err=True,
    )
    serve(settings)
