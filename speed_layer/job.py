"""The speed layer: Kafka -> parse -> watermark + dedupe -> the shared views aggregation -> Cassandra.

``extract`` (Kafka source) and ``load`` (the ``foreachBatch`` sink) are the I/O edges; ``transform`` is pure and is
the same :func:`views.aggregation.aggregate` the batch layer runs. State lives in the RocksDB state store under the
checkpoint, so a restart — clean or after SIGKILL — resumes exactly where the last committed batch ended.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from infra.checkpoints import speed_checkpoint
from infra.errors import CheckpointLostError
from infra.settings import Settings
from infra.spark import get_spark, kafka_options
from speed_layer.checkpoint import check_view_definition
from speed_layer.guard import CheckpointGuard
from speed_layer.metrics import PARSE_METRICS, BatchMetrics, MetricsRegistry, serve_metrics
from speed_layer.sink import SpeedViewSink
from speed_layer.start import StreamStart, resolve_start

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

logger = logging.getLogger(__name__)


def extract(spark: SparkSession, settings: Settings, start: StreamStart | None = None) -> DataFrame:
    """Return the streaming frame of raw records of the events topic (from ``start``'s offsets when given)."""
    speed = settings.speed
    return (
        spark.readStream.format("kafka")
        .options(**kafka_options(settings.kafka))
        .option("subscribe", settings.kafka.events_topic)
        .option("startingOffsets", start.spark_offsets() if start else speed.starting_offsets)
        .option("maxOffsetsPerTrigger", str(speed.max_offsets_per_trigger))
        # Offsets deleted by retention before we read them are data loss: fail loudly, never skip silently.
        .option("failOnDataLoss", "true")
        .load()
    )


def transform(records: DataFrame, settings: Settings, since: datetime | None = None) -> DataFrame:
    """Parse, count unparseable and future rows, watermark, dedupe ids within the watermark, aggregate.

    :arg since: skip events before it (a start from the batch watermark: the batch view holds them), before they
        reach the watermark, the dedupe state or the aggregation.
    """
    from pyspark.sql import functions as F  # noqa: PLC0415

    from views.aggregation import aggregate  # noqa: PLC0415
    from views.events import parse_events, valid_events  # noqa: PLC0415

    # The event-time guard: an event beyond now + the ingest skew (written around ingestion, or by a broken clock)
    # would move the watermark into the future and drop every real event as late. It is counted, not aggregated.
    # current_timestamp() is the micro-batch's time, kept in the offset log: a replayed batch decides the same.
    horizon = F.current_timestamp() + F.make_dt_interval(secs=F.lit(settings.ingest.max_future_skew_s))
    future = F.col("parsed_ok") & (F.col("ts") > horizon)
    # The events the `since` filter below drops, counted in the same pass as the others (one more sum, no job).
    below = F.col("parsed_ok") & ~future & (F.col("ts") < F.lit(since)) if since is not None else F.lit(False)
    parsed = parse_events(records).observe(
        PARSE_METRICS,
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.when(F.col("parsed_ok"), 0).otherwise(1)).alias("unparseable"),
        F.sum(F.when(future, 1).otherwise(0)).alias("future"),
        F.sum(F.when(below, 1).otherwise(0)).alias("below_watermark"),
    )
    events = valid_events(parsed.where(~future))
    if since is not None:
        events = events.where(F.col("ts") >= F.lit(since))
    return aggregate(dedupe(events, settings), settings.views.slice_dims, settings.views.top_k_items)


def dedupe(events: DataFrame, settings: Settings) -> DataFrame:
    """Watermark the events by the allowed lateness and drop repeated ids within it (RocksDB state)."""
    lateness = f"{settings.speed.allowed_lateness_s} seconds"
    return events.withWatermark("ts", lateness).dropDuplicatesWithinWatermark(["id"])


def checkpoint_location(settings: Settings) -> str:
    """Return the durable checkpoint folder (offsets, commits, state) of the speed query."""
    return speed_checkpoint(settings)


@dataclass
class RunSummary:
    """What a run of the speed job did."""

    batches: int
    input_rows: int
    dropped_late_rows: int
    unparseable_rows: int
    seconds: float
    stopped_by_signal: bool
    future_rows: int = 0
    begin: StreamStart | None = None  # the checkpoint's start from the batch watermark, if it has one
    skipped_below_watermark_rows: int = 0  # events before ``begin.since`` met by this run, skipped


class _ProgressListener:
    """Adapter from Spark's listener callbacks to the metrics registry, the log and the sink's watermark."""

    def __init__(
        self, registry: MetricsRegistry, sink: SpeedViewSink, textfile: Path | None, *, state_rows_tracked: bool
    ) -> None:
        self.registry = registry
        self.sink = sink
        self.textfile = textfile
        self.state_rows_tracked = state_rows_tracked

    def on_progress(self, progress: dict[str, Any]) -> None:
        metrics = BatchMetrics.from_progress(progress, state_rows_tracked=self.state_rows_tracked)
        self.registry.newest_event_ts = self.sink.newest_event_ts
        self.registry.record(metrics)
        if metrics.watermark is not None:
            self.sink.watermark = metrics.watermark
        logger.info("%s", metrics.log_line())
        if self.textfile is not None:
            try:
                self.registry.write_textfile(self.textfile)
            except OSError:
                logger.warning("could not write metrics textfile %s", self.textfile, exc_info=True)


def _make_spark_listener(adapter: _ProgressListener) -> Any:
    from pyspark.sql.streaming.listener import StreamingQueryListener  # noqa: PLC0415

    class Listener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's names
            logger.info("speed query started (id %s, run %s)", event.id, event.runId)

        def onQueryProgress(self, event: Any) -> None:  # noqa: N802
            adapter.on_progress(json.loads(event.progress.json))

        def onQueryIdle(self, event: Any) -> None:  # noqa: N802
            adapter.registry.idle()

        def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
            if event.exception:
                logger.error("speed query terminated with an error: %s", event.exception)

    return Listener()


def start(
    spark: SparkSession,
    settings: Settings,
    sink: SpeedViewSink,
    *,
    available_now: bool = False,
    begin: StreamStart | None = None,
) -> StreamingQuery:
    """Start the streaming query (processing-time trigger, or ``availableNow`` to drain what is there and stop).

    :arg begin: the checkpoint's start from the batch watermark (:mod:`speed_layer.start`), if it has one.
    """
    view = transform(extract(spark, settings, begin), settings, begin.since if begin else None)
    writer = (
        view.writeStream.queryName(settings.speed.query_name)
        .outputMode("update")
        .foreachBatch(sink)
        .option("checkpointLocation", checkpoint_location(settings))
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{settings.speed.trigger_seconds} seconds")
    return writer.start()


def _trigger_active(query: StreamingQuery) -> bool:
    try:
        return bool(query.status.get("isTriggerActive"))
    except Exception:  # noqa: BLE001 - a stopped query has no status
        return False


def stop_gracefully(query: StreamingQuery, timeout_s: float) -> None:
    """Let the running micro-batch finish (bounded), then stop; an unfinished batch is replayed on restart."""
    deadline = time.monotonic() + timeout_s
    while query.isActive and _trigger_active(query) and time.monotonic() < deadline:
        time.sleep(0.2)
    if query.isActive:
        query.stop()


def run(settings: Settings, *, available_now: bool = False, max_seconds: float | None = None) -> RunSummary:
    """Run the speed job until SIGTERM/Ctrl-C, ``max_seconds``, or (``available_now``) the topic is drained.

    :raises speed_layer.checkpoint.ViewDefinitionChangedError: when the checkpoint was started with another view
        definition (:mod:`speed_layer.checkpoint`).
    :raises infra.errors.CheckpointLostError: when the checkpoint vanished under the running query
        (:mod:`speed_layer.guard`; the next start moves what is left aside and begins a new epoch).
    :raises pyspark.errors.StreamingQueryException: when the query fails (e.g. Cassandra unreachable): the
        failed batch was not committed and is replayed on the next start.
    """
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logger.info("received signal %s: finishing the current micro-batch, then stopping", signum)
        stop.set()

    spark = get_spark(settings, "speed")
    guard = CheckpointGuard(spark, checkpoint_location(settings))
    try:  # a checkpoint whose state was built by another view definition is refused before anything starts
        guard.clear_remnant()  # what is left of a checkpoint lost under a running query is never resumed
        check_view_definition(spark, settings, checkpoint_location(settings))
        begin = resolve_start(spark, settings, checkpoint_location(settings))
    except Exception:
        spark.stop()
        raise
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    registry = MetricsRegistry(settings.speed.query_name)
    sink = SpeedViewSink(
        settings,
        settings.speed.query_name,
        settings.speed.view_ttl_s,
        checkpoint=checkpoint_location(settings),
        begin=begin,
    )
    adapter = _ProgressListener(
        registry,
        sink,
        settings.data_dir / "metrics" / "speed_layer.prom",
        state_rows_tracked=settings.speed.track_state_rows,
    )
    listener = _make_spark_listener(adapter)
    spark.streams.addListener(listener)
    port = settings.metrics.speed_port
    server = serve_metrics(registry, settings.metrics.host, port) if port else None
    started = time.monotonic()
    query = start(spark, settings, sink, available_now=available_now, begin=begin)
    guard.watch(query.id)
    try:
        while query.isActive:
            lost = guard.check() is not None  # the checkpoint vanished under the query: stop, fail loudly
            if lost or stop.is_set() or (max_seconds is not None and time.monotonic() - started > max_seconds):
                stop_gracefully(query, settings.speed.stop_timeout_s)
                break
            query.awaitTermination(1)
        query.awaitTermination(5)
        error = query.exception()
        if error is not None:
            raise error
        if guard.check(force=True) is not None:  # the guard stopped it (or a stop came after the loss)
            raise guard.error()
    except Exception as exc:  # Spark fails on its next write into a lost folder, often before the guard looks
        if not isinstance(exc, CheckpointLostError) and guard.check(force=True) is not None:
            raise guard.error() from exc
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if server is not None:
            server.shutdown()
        spark.streams.removeListener(listener)
        sink.close()
        spark.stop()  # also drains the listener bus before the Python callback server goes away
    return RunSummary(
        batches=registry.batches,
        input_rows=registry.input_rows_total,
        dropped_late_rows=registry.dropped_late_total,
        unparseable_rows=registry.unparseable_total,
        future_rows=registry.future_total,
        skipped_below_watermark_rows=registry.skipped_below_watermark_total,
        seconds=time.monotonic() - started,
        stopped_by_signal=stop.is_set(),
        begin=begin,
    )
