"""The speed layer: Kafka -> parse -> watermark + dedupe -> the shared views aggregation -> Cassandra.

``extract`` (Kafka source) and ``load`` (the ``foreachBatch`` sink) are the I/O edges; ``transform`` is pure and is
the same :func:`views.aggregation.aggregate` the batch layer runs. State lives in the RocksDB state store under the
checkpoint, so a restart — clean or after SIGKILL — resumes exactly where the last committed batch ended.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from infra.cassandra import session
from infra.errors import CheckpointLostError
from infra.privacy.exclusions import excluded_users
from infra.settings import DedupeBy, Settings
from infra.spark import get_spark, kafka_options
from infra.speed_checkpoint import speed_checkpoint
from speed_layer.checkpoint_definition import DEDUPE_ID, check_view_definition, dedupe_of
from speed_layer.exclusions import ExclusionWatch
from speed_layer.guard import CheckpointGuard
from speed_layer.metrics import PARSE_METRICS, BatchMetrics, MetricsRegistry, serve_metrics
from speed_layer.promote import ServingWatch, replaced
from speed_layer.sink import SpeedViewSink
from speed_layer.start import StreamStart, resolve_start
from views.definition import view_definition
from views.event_avro import writer_schemas
from views.store.definitions import DefinitionStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

logger = logging.getLogger(__name__)

# A query demoted, or whose checkpoint was lost, lets its running micro-batch finish this long at most, then stops:
# its rows serve nobody now, or its state cannot be committed where it belongs. The graceful stop's wait would run
# its whole timeout while micro-batches run back to back (after a lost checkpoint Spark recreates the folders it
# writes into and carries on).
ABANDON_STOP_S = 5.0


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


def transform(
    records: DataFrame,
    settings: Settings,
    since: datetime | None = None,
    dedupe_by: DedupeBy | None = None,
    excluded: Collection[str] = (),
    avro: Mapping[int, str] | None = None,
) -> DataFrame:
    """Parse, count unparseable and future rows, watermark, dedupe events within the watermark, aggregate.

    :arg since: skip events before it (a start from the batch watermark: the batch view holds them), before they
        reach the watermark, the dedupe state or the aggregation.
    :arg dedupe_by: the checkpoint's dedupe (:func:`dedupe`).
    :arg excluded: the erased subjects' pseudonyms (:mod:`infra.privacy.exclusions`), left out before the dedupe.
    :arg avro: the events topic's Avro writer schemas by id (:func:`views.event_avro.writer_schemas`), read at start.
    """
    from pyspark.sql import functions as F  # noqa: PLC0415

    from views.aggregation import aggregate  # noqa: PLC0415
    from views.event_frames import parse_events, valid_events, without_users  # noqa: PLC0415

    # The event-time guard: an event beyond now + the ingest skew (written around ingestion, or by a broken clock)
    # would move the watermark into the future and drop every real event as late. It is counted, not aggregated.
    # current_timestamp() is the micro-batch's time, kept in the offset log: a replayed batch decides the same.
    horizon = F.current_timestamp() + F.make_dt_interval(secs=F.lit(settings.ingest.max_future_skew_s))
    future = F.col("parsed_ok") & (F.col("ts") > horizon)
    # The events the `since` filter below drops, counted in the same pass as the others (one more sum, no job).
    below = F.col("parsed_ok") & ~future & (F.col("ts") < F.lit(since)) if since is not None else F.lit(False)
    parsed = parse_events(records, avro=avro).observe(
        PARSE_METRICS,
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.when(F.col("parsed_ok"), 0).otherwise(1)).alias("unparseable"),
        F.sum(F.when(future, 1).otherwise(0)).alias("future"),
        F.sum(F.when(below, 1).otherwise(0)).alias("below_watermark"),
    )
    events = without_users(valid_events(parsed.where(~future)), excluded)
    if since is not None:
        events = events.where(F.col("ts") >= F.lit(since))
    return aggregate(dedupe(events, settings, dedupe_by), settings.views.slice_dims, settings.views.top_k_items)


def dedupe(events: DataFrame, settings: Settings, by: DedupeBy | None = None) -> DataFrame:
    """Watermark the events by the allowed lateness and drop the copies of an event within it (RocksDB state).

    By id and event time (a re-sent event has both), an id is kept until the watermark passes its event time, after
    which any copy is dropped as late anyway. Spark's ``dropDuplicatesWithinWatermark`` (``by`` ``id``, the dedupe
    of checkpoints started before ``speed.dedupe_by``) keeps it for twice the lateness. Either scans its whole state
    every batch for expired ids: the speed job's largest cost per batch at a steady rate (docs/history.md, "The soak").
    The batch layer dedupes by id alone, exactly.

    :arg by: the checkpoint's dedupe (:func:`speed_layer.checkpoint_definition.dedupe_of`): Spark resumes state only
        under the operator that wrote it. None: ``speed.dedupe_by`` (a new checkpoint).
    """
    watermarked = events.withWatermark("ts", f"{settings.speed.allowed_lateness_s} seconds")
    if (by or settings.speed.dedupe_by) == DEDUPE_ID:
        return watermarked.dropDuplicatesWithinWatermark(["id"])
    return watermarked.dropDuplicates(["id", "ts"])


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
    demoted_by: str | None = None  # the query a promote made serving instead of this one (it stopped for that)
    skipped_below_watermark_rows: int = 0  # events before ``begin.since`` met by this run, skipped


POLL_S = 0.25  # how often the driver's loop reads the query's progress
IDLE_EVERY_S = 10.0  # how often a query waiting for data is reported alive (Spark's idle event interval)
STATUS_SLACK_S = 1.0  # how much older than a trigger interval the trigger behind a "waiting for data" status may be


class _ProgressListener:
    """Adapter from the query's progress reports to the metrics registry, the log and the sink's watermark.

    It also records how far the epoch has read the whole topic (:meth:`SpeedViewSink.read_all`): a batch that read
    up to the latest offsets Spark saw when planning it read everything the topic held at its trigger's start.

    :arg read_all_cap: a time no record written after was read for sure (an ``availableNow`` run reads up to the
        offsets of its start).
    """

    def __init__(
        self,
        registry: MetricsRegistry,
        sink: SpeedViewSink,
        textfile: Path | None,
        *,
        state_rows_tracked: bool,
        read_all_cap: datetime | None = None,
    ) -> None:
        self.registry = registry
        self.sink = sink
        self.textfile = textfile
        self.state_rows_tracked = state_rows_tracked
        self.read_all_cap = read_all_cap

    def read_all(self, at: datetime) -> None:
        """Record that the epoch had read every record the topic held at ``at`` (a failed write: the next one)."""
        if self.read_all_cap is not None:
            at = min(at, self.read_all_cap)
        try:
            self.sink.read_all(at)
        except Exception:
            logger.warning("could not record how far speed epoch %s has read", self.sink.epoch_id, exc_info=True)

    def on_progress(self, progress: dict[str, Any]) -> None:
        metrics = BatchMetrics.from_progress(progress, state_rows_tracked=self.state_rows_tracked)
        self.registry.newest_event_ts = self.sink.newest_event_ts
        self.registry.record(metrics)
        if metrics.watermark is not None:
            self.sink.watermark = metrics.watermark
        line = metrics.log_line()
        written = self.sink.last
        if written is not None and written.batch_id == metrics.batch_id:
            line += f"; {written.describe()}"
        logger.info("%s", line)
        if metrics.read_to_end and metrics.started_at is not None:
            self.read_all(metrics.started_at)
        if self.textfile is not None:
            try:
                self.registry.write_textfile(self.textfile)
            except OSError:
                logger.warning("could not write metrics textfile %s", self.textfile, exc_info=True)


class _ProgressPoller:
    """Read the query's progress from the driver's own loop and hand each new batch's report to the adapter.

    Not a Python ``StreamingQueryListener``: pyspark converts every event it passes to one field by field over
    py4j (about a hundred calls a batch, and a class lookup through every jar of the classpath for the observed
    metrics), which cost the speed job's JVM ~10 % of a core at a 1 s trigger (docs/history.md, "The soak"). Here a
    batch costs two calls (``lastProgress`` and its JSON); batches missed between two polls are read back from
    ``recentProgress``. A query waiting for data is reported alive every :data:`IDLE_EVERY_S`, as Spark's idle event
    did; a batch that hangs is not.
    """

    def __init__(self, query: StreamingQuery, adapter: _ProgressListener, trigger_s: float) -> None:
        self.query = query
        self.adapter = adapter
        self.trigger_s = trigger_s
        self.last_batch: int | None = None
        self._idle_checked = self._alive_reported = time.monotonic()

    def poll(self, *, final: bool = False) -> None:
        """Report the batches completed since the last poll (all that Spark still holds when ``final``)."""
        last = self.query.lastProgress
        if last is None or (self.last_batch is not None and last.batchId <= self.last_batch):
            if not final:
                self._idle()
            return
        newest = last.batchId
        if final or (self.last_batch is not None and newest > self.last_batch + 1):
            done = self.last_batch if self.last_batch is not None else -1
            reports = [p for p in self.query.recentProgress if p.batchId > done]
        else:
            reports = [last]
        for report in reports:
            self.adapter.on_progress(json.loads(report.json))
        self.last_batch = newest

    def _idle(self) -> None:
        """Between batches, once a trigger interval: a trigger that found no new data read the whole topic."""
        now = time.monotonic()
        if now - self._idle_checked < self.trigger_s:
            return
        self._idle_checked = now
        try:
            status = self.query.status
        except Exception:  # noqa: BLE001 - a stopped query has no status
            return
        if status.get("isTriggerActive", True):
            return
        if not status.get("isDataAvailable", True):  # its last trigger, at most an interval ago, found nothing new
            self.adapter.read_all(datetime.now(UTC) - timedelta(seconds=self.trigger_s + STATUS_SLACK_S))
        if now - self._alive_reported >= IDLE_EVERY_S:
            self._alive_reported = now
            self.adapter.registry.idle()


def start(
    spark: SparkSession,
    settings: Settings,
    sink: SpeedViewSink,
    *,
    available_now: bool = False,
    begin: StreamStart | None = None,
    dedupe_by: DedupeBy | None = None,
    excluded: Collection[str] = (),
    avro: Mapping[int, str] | None = None,
) -> StreamingQuery:
    """Start the streaming query (processing-time trigger, or ``availableNow`` to drain what is there and stop).

    :arg begin: the checkpoint's start from the batch watermark (:mod:`speed_layer.start`), if it has one.
    :arg dedupe_by: the checkpoint's dedupe (:func:`speed_layer.checkpoint_definition.dedupe_of`).
    :arg excluded: the erased subjects' pseudonyms, left out of every micro-batch.
    :arg avro: the events topic's Avro writer schemas by id (none: JSON records only).
    """
    since = begin.since if begin else None
    view = transform(extract(spark, settings, begin), settings, since, dedupe_by, excluded, avro)
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

    :raises speed_layer.checkpoint_definition.ViewDefinitionChangedError: when the checkpoint was started with another
        view definition (:mod:`speed_layer.checkpoint_definition`).
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
    watch = ServingWatch(settings, settings.speed.serving_check_s)
    guard = CheckpointGuard(spark, checkpoint_location(settings))
    try:  # a checkpoint whose state was built by another view definition is refused before anything starts
        guard.clear_remnant()  # what is left of a checkpoint lost under a running query is never resumed
        definition = _register_version(spark, settings, watch)
        begin = resolve_start(spark, settings, checkpoint_location(settings))
        dedupe_by = dedupe_of(spark, settings, checkpoint_location(settings))
        with session(settings) as sess:
            exclusions = ExclusionWatch(settings, settings.speed.serving_check_s, excluded_users(settings, sess))
        avro = writer_schemas(settings)  # versions registered later are unknown until the next start
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
        definition=definition,
        rollups=settings.speed.write_rollups,
        live=settings.speed.live_rollups,
    )
    adapter = _ProgressListener(
        registry,
        sink,
        settings.data_dir / "metrics" / "speed_layer.prom",
        state_rows_tracked=settings.speed.track_state_rows,
        read_all_cap=datetime.now(UTC) if available_now else None,  # it reads up to the offsets of its start
    )
    port = settings.metrics.speed_port
    server = serve_metrics(registry, settings.metrics.host, port) if port else None
    started = time.monotonic()
    demoted: str | None = None
    try:
        deadline = None if max_seconds is None else started + max_seconds
        while True:  # once, unless new exclusions restart the query (from its checkpoint)
            query = start(
                spark, settings, sink, available_now=available_now, begin=begin, dedupe_by=dedupe_by,
                excluded=exclusions.current, avro=avro,
            )  # fmt: skip
            logger.info(
                "speed query started (id %s, run %s, %d erased subjects left out)",
                query.id, query.runId, len(exclusions.current),
            )  # fmt: skip
            guard.watch(query.id)
            sink.epoch_id = sink.epoch_id or str(query.id)  # the epoch is the checkpoint's query id (Spark's queryId)
            ended = _drive(
                query,
                _ProgressPoller(query, adapter, settings.speed.trigger_seconds),
                stop,
                deadline,
                (watch, guard, exclusions),
                sink,
                settings,
            )
            demoted = ended.demoted_by
            if not ended.restart:
                break
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if server is not None:
            server.shutdown()
        sink.close()
        spark.stop()
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
        demoted_by=demoted,
    )


def _drive(
    query: StreamingQuery,
    poller: _ProgressPoller,
    stop: threading.Event,
    deadline: float | None,
    watchers: tuple[ServingWatch, CheckpointGuard, ExclusionWatch],
    sink: SpeedViewSink,
    settings: Settings,
) -> _Ended:
    """Read the query's progress until it ends, is stopped (signal, deadline), demoted or must restart (exclusions).

    :raises pyspark.errors.StreamingQueryException: when the query failed.
    :raises infra.errors.CheckpointLostError: when its checkpoint vanished under it (:mod:`speed_layer.guard`).
    """
    watch, guard, exclusions = watchers
    try:
        while query.isActive:
            if guard.check() is not None:  # the checkpoint vanished under the query: stop, fail loudly
                stop_gracefully(query, ABANDON_STOP_S)
                break
            if stop.is_set() or (deadline is not None and time.monotonic() > deadline):
                stop_gracefully(query, settings.speed.stop_timeout_s)
                break
            demoted = _demoted_by(watch, sink)
            if demoted is not None:  # its rows serve nobody now: an unfinished micro-batch need not finish
                stop_gracefully(query, ABANDON_STOP_S)
                return _Ended(demoted_by=demoted)
            if exclusions.changed(sink.session()) is not None:  # the running micro-batch commits, then a restart
                stop_gracefully(query, settings.speed.stop_timeout_s)
                return _Ended(restart=True)
            # raises the query's error when it failed; floats are taken (ms), the stub says int
            query.awaitTermination(POLL_S)  # type: ignore[arg-type]
            poller.poll()
        query.awaitTermination(5)
        error = query.exception()
        if error is not None:
            raise error
        if guard.check(force=True) is not None:  # the guard stopped it (or a stop came after the loss)
            raise guard.error()
    except Exception as exc:  # Spark fails on its next write into a lost folder, often before the guard looks
        if not isinstance(exc, CheckpointLostError) and guard.check(force=True) is not None:
            raise guard.error() from exc
        logger.error("speed query terminated with an error: %s", exc)
        raise
    finally:
        with contextlib.suppress(Exception):  # the batches completed before the end, for the log and summary
            poller.poll(final=True)
    return _Ended()


@dataclass(frozen=True)
class _Ended:
    """How a query's drive ended: demoted by another query, or to restart with new exclusions, or neither."""

    demoted_by: str | None = None
    restart: bool = False


def _register_version(spark: SparkSession, settings: Settings, watch: ServingWatch) -> str:
    """Check the checkpoint's view definition and register it; return its fingerprint.

    The query is a version of the views: its definition is recorded in ``view_definitions``. A query a promote
    replaced runs as a standby (to roll back, promote it again once it has caught up).
    """
    definition = check_view_definition(spark, settings, checkpoint_location(settings))
    with session(settings) as sess:
        DefinitionStore(settings, sess).register(view_definition(settings), settings.speed.query_name)
        serving = watch.start(sess)
    if replaced(settings.speed.query_name, serving):
        logger.warning(
            "speed query %s was replaced by %s (trends speed promote at %s): it runs as a standby, serving nothing; "
            "promote it again once caught up to roll back, or stop it",
            settings.speed.query_name, serving.describe(), serving.promoted_at,
        )  # fmt: skip
    return definition


def _demoted_by(watch: ServingWatch, sink: SpeedViewSink) -> str | None:
    """Return the query that replaced this one, when a promote demoted it (looked at every few seconds)."""
    try:
        sess = sink.session()
        serving = watch.demoted_by(sess) if sess is not None else None
    except Exception:  # Cassandra unreachable: the sink's own writes fail the batch; look again later
        logger.warning("could not read the serving view version", exc_info=True)
        return None
    if serving is None:
        return None
    logger.info(
        "speed query %s no longer serves answers: %s was promoted at %s; stopping (its rows expire by their TTL)",
        watch.query, serving.describe(), serving.promoted_at,
    )  # fmt: skip
    return serving.query
