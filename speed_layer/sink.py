"""The speed layer's Cassandra sink: ``foreachBatch`` upserts of the full state of every changed bucket.

In update mode Spark emits, for each bucket a micro-batch touched, its *cumulative* state (count and sketches of
everything seen so far). Writing that row whole is idempotent: when a crash makes Spark replay a batch (same batch
id, same data — its offsets are logged before and committed after), the replay writes the very same rows again.
Nothing here increments, appends or writes a wall-clock value into a view row, which is what makes the
at-least-once ``foreachBatch`` exactly-once in effect. A failed write raises, which fails the batch (and the
query): it is replayed from the checkpoint on restart, never skipped.

The sink also records what it has processed (``views.store.speed``: coverage), so that serving answers a minute
only where this layer counted it: per batch, in this order, the hours it is about to write (before any row, so a
row can never outlive its hour's record), the rows, the events counted per minute and slice, and how far the
*epoch* (the checkpoint's lifetime: Spark's query id) has read. A new epoch started at ``latest`` (or on offsets
of its own) counts minutes completely only from the minute after its start (one started from the batch watermark,
:mod:`speed_layer.start`, from the watermark's hour); its rows of earlier minutes would
overwrite a previous epoch's complete rows with partial ones, so they are not written (the batch layer has them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import islice
from typing import TYPE_CHECKING, Any

from infra.cassandra import make_cluster
from infra.settings import Settings
from views.buckets import HOUR, MINUTE, SPEED_ROLLUP, floor, utc
from views.store.rollups import Interval, SpeedRollups
from views.store.speed import Epoch, SpeedRows

if TYPE_CHECKING:
    from cassandra.cluster import Cluster
    from pyspark.sql import DataFrame

    from speed_layer.start import StreamStart

logger = logging.getLogger(__name__)

CHUNK_ROWS = 2000
QUERY_ID_PROPERTY = "sql.streaming.queryId"  # set by Spark on the thread that runs foreachBatch
MAX_QUIET_HOURS = 24 * 31  # quiet hours one batch marks as read through, at most (and at most the TTL's)


@dataclass
class BatchResult:
    """What one micro-batch wrote."""

    batch_id: int
    rows: int
    newest_event_ts: datetime | None
    dropped_before_epoch: int = 0
    collect_ms: int = 0  # the Spark job that computes the batch's rows (read, aggregate, state store), on the driver
    write_ms: int = 0  # the Cassandra writes: hours, view rows, counts, the epoch's progress, freshness
    rollups: int = 0  # closed intervals merged into rollups after the batch
    rollup_ms: int = 0

    def describe(self) -> str:
        """Return where the sink's time went, for the batch's log line."""
        return (
            f"sink: collect {self.collect_ms} ms, cassandra {self.write_ms} ms ({self.rows} rows), "
            f"rollups {self.rollup_ms} ms ({self.rollups})"
        )


@dataclass
class SpeedViewSink:
    """Callable for ``writeStream.foreachBatch``; holds one lazily opened Cassandra session.

    :arg query: the streaming query's name, the key of its freshness row.
    :arg ttl_seconds: TTL of view rows; longer than the batch layer's lag so no bucket goes unserved.
    """

    settings: Settings
    query: str
    ttl_seconds: int
    epoch_id: str | None = None  # Spark's query id; read from the batch's thread when not given
    checkpoint: str | None = None  # the query's checkpoint: when its initial offsets were resolved is the start
    begin: StreamStart | None = None  # a start from the batch watermark: the epoch counts from its hour
    definition: str | None = None  # the view definition's fingerprint, recorded on a new epoch
    rollups: bool = True  # merge closed intervals into rollups (speed.write_rollups)
    live: bool = True  # and rewrite open intervals' rollups after each batch that changed them (speed.live_rollups)
    _cluster: Cluster | None = field(default=None, init=False, repr=False)
    _rows: SpeedRows | None = field(default=None, init=False, repr=False)
    _rollups: SpeedRollups | None = field(default=None, init=False, repr=False)
    _open: set[Interval] = field(default_factory=set, init=False, repr=False)  # written, not yet rolled up
    _open_of: str | None = field(default=None, init=False, repr=False)  # the epoch whose to-do _open holds
    _touched: set[Interval] = field(default_factory=set, init=False, repr=False)  # changed since their last merge
    _epoch: Epoch | None = field(default=None, init=False, repr=False)
    _marked: set[datetime] = field(default_factory=set, init=False, repr=False)
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC), init=False)
    newest_event_ts: datetime | None = field(default=None, init=False)
    watermark: datetime | None = field(default=None, init=False)
    last: BatchResult | None = field(default=None, init=False)  # the last batch written (the progress log reads it)
    read_all_at: datetime | None = field(default=None, init=False)  # the last time recorded by :meth:`read_all`

    def _connect(self) -> SpeedRows:
        if self._rows is None:
            self._cluster = make_cluster(self.settings)
            rows = SpeedRows(self.settings, self._cluster.connect())
            self.newest_event_ts = rows.newest_event(self.query)
            self._rows = rows
        return self._rows

    def session(self) -> Any:
        """Return the sink's Cassandra session once its first batch opened it (None before)."""
        return self._rows.sess if self._rows is not None else None

    def read_all(self, at: datetime) -> bool:
        """Record that this epoch had read, and written the rows of, every record the topic held at ``at``.

        Serving answers a minute ending after it only while it is the minute under way (``speed_epochs.read_all_at``,
        infra/cql/0008). Only forward, and only for an epoch its first batch registered; tell if written.
        """
        if not self.epoch_id or (self.read_all_at is not None and at <= self.read_all_at):
            return False
        rows = self._connect()
        if self._epoch is None or self._epoch.id != self.epoch_id:  # a restart on its checkpoint, before a batch
            known = {e.id: e for e in rows.epochs(self.query)}
            if self.epoch_id not in known:
                return False
            self._epoch, self._marked = known[self.epoch_id], set()
        rows.read_all(self.query, self._epoch.id, at)
        self.read_all_at = at
        return True

    def close(self) -> None:
        """Shut the driver's connections down."""
        if self._cluster is not None:
            self._cluster.shutdown()
        self._cluster, self._rows, self._epoch, self._rollups = None, None, None, None
        self._marked, self._open, self._open_of, self._touched = set(), set(), None, set()

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        """Write one micro-batch (Spark calls this on the driver)."""
        if self.epoch_id is None:
            self.epoch_id = batch.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        if batch_id == 0 and self.checkpoint:
            resolved = initial_offsets_written_at(batch.sparkSession, self.checkpoint)
            if resolved is not None:
                self.started_at = resolved
        # One job for the whole batch (toLocalIterator runs one per partition, which costs more per batch). The
        # rows are the changed buckets, at most (distinct minutes x slices) of one micro-batch's events, and
        # toLocalIterator would hold a whole partition in the driver too; maxOffsetsPerTrigger bounds both.
        t0 = time.perf_counter()
        rows = batch.collect()
        collect_ms = int((time.perf_counter() - t0) * 1000)
        result = self.write_rows(rows, batch_id)
        result.collect_ms = collect_ms
        t1 = time.perf_counter()
        if self.watermark is not None:  # the watermark of the batches before: their late events are dropped
            result.rollups = self.roll_up(self.watermark)
        result.rollups += self.roll_up_live()
        result.rollup_ms = int((time.perf_counter() - t1) * 1000)
        self.last = result
        logger.debug("batch %s wrote %d bucket rows", batch_id, result.rows)

    def epoch(self, batch_id: int) -> Epoch:
        """Return this checkpoint's epoch, recording it on its first batch.

        A first batch (id 0) starts a new checkpoint: from the topic's beginning when the query starts at
        ``earliest``, else complete only from the minute after its starting offsets were resolved (when Spark
        wrote them into the checkpoint; without a checkpoint to ask, when the sink was made). An epoch found
        without a row at a later batch (its row lost, or written by a version without coverage) is complete only
        from now on.
        """
        store = self._connect()
        if self._epoch is not None and self._epoch.id == self.epoch_id:
            return self._epoch
        if not self.epoch_id:
            msg = "the speed sink needs the streaming query's id (Spark's sql.streaming.queryId) to record coverage"
            raise RuntimeError(msg)
        known = {e.id: e for e in store.epochs(self.query)}
        epoch = known.get(self.epoch_id)
        if epoch is None:
            starting = self.settings.speed.starting_offsets
            if batch_id == 0 and self.begin is not None:  # every record at or above its hour is read
                covered_from, starting = self.begin.since, self.begin.describe()
            elif batch_id == 0 and starting == "earliest":
                covered_from = None
            elif batch_id == 0:
                covered_from = floor(self.started_at, MINUTE) + MINUTE
            else:
                covered_from, starting = floor(datetime.now(UTC), MINUTE) + MINUTE, "adopted"
            epoch = Epoch(self.epoch_id, self.started_at, covered_from, None, starting, definition=self.definition)
            store.register_epoch(self.query, epoch)
            logger.info(
                "speed epoch %s (query %s) starts; it counts minutes completely from %s",
                epoch.id, self.query, covered_from or "the topic's beginning",
            )  # fmt: skip
        self._epoch, self._marked = epoch, set()
        return epoch

    def write_rows(self, rows: Iterable[Any], batch_id: int) -> BatchResult:
        """Write one batch: its hours, the view rows in chunks, the minutes counted, the epoch's progress.

        Raise on the first failed write (the batch is replayed whole).
        """
        t0 = time.perf_counter()
        store = self._connect()
        epoch = self.epoch(batch_id)
        kept, dropped = _from_epoch(rows, epoch.covered_from)
        if dropped:
            logger.info("batch %s: %d rows of minutes before epoch %s began not written", batch_id, dropped, epoch.id)
        hours = self._hours_to_mark(epoch, kept)
        store.mark_hours(self.query, epoch.id, hours, self.ttl_seconds, read_until=epoch.seen_until)
        self._marked.update(hours)
        if self.rollups:  # before the rows: a job killed after them still merges their intervals when restarted
            self._note_intervals(epoch, kept)
        written = 0
        newest = None
        for chunk in _chunks(kept, CHUNK_ROWS):
            count, chunk_newest = store.write(self.query, chunk, batch_id, self.ttl_seconds)
            written += count
            if chunk_newest is not None and (newest is None or chunk_newest > newest):
                newest = chunk_newest
        store.write_counts(self.query, epoch.id, _counts(kept), self.ttl_seconds)
        seen_until = epoch.seen_until
        if newest is not None:
            newest_end = floor(newest, MINUTE) + MINUTE
            seen_until = newest_end if seen_until is None else max(seen_until, newest_end)
        first_hour = min((h for h in (epoch.first_hour, *hours) if h is not None), default=None)
        store.advance_epoch(self.query, epoch.id, seen_until, first_hour, batch_id)
        self._epoch = Epoch(
            epoch.id, epoch.started_at, epoch.covered_from, seen_until, epoch.starting_offsets, batch_id,
            first_hour=first_hour, definition=epoch.definition,
        )  # fmt: skip
        if newest is not None and (self.newest_event_ts is None or newest > self.newest_event_ts):
            self.newest_event_ts = newest
        store.write_progress(self.query, self.newest_event_ts, self.watermark, batch_id, written)
        return BatchResult(batch_id, written, newest, dropped, write_ms=int((time.perf_counter() - t0) * 1000))

    def roll_up(self, closed_until: datetime) -> int:
        """Merge every interval this sink wrote rows in that ended by ``closed_until`` into its rollup; return how many.

        ``closed_until`` is a time no row before it changes any more (the Spark watermark of the batches before: an
        event behind it is dropped as late). Best effort: a rollup is only a faster read of rows already written, so
        a failure is logged and the intervals stay to be merged after the next batch; the batch does not fail.
        Intervals an epoch does not count completely (before its start) are not merged.
        """
        epoch = self._epoch
        if not self._open or epoch is None or self._open_of != epoch.id:
            return 0
        closed = {iv for iv in self._open if iv[1] + SPEED_ROLLUP <= closed_until}
        if not closed:
            return 0
        partial = {iv for iv in closed if epoch.covered_from is not None and iv[1] < epoch.covered_from}
        store = self._rollup_store()
        try:
            edge_ttl = self.settings.speed.edge_ttl_s
            written = store.write(self.query, epoch.id, closed - partial, self.ttl_seconds, edge_ttl)
            store.done(self.query, epoch.id, closed)
        except Exception:  # the minutes serve until the next try
            logger.warning("could not write %d speed rollups; retried after the next batch", len(closed), exc_info=True)
            return 0
        self._open -= closed
        return written

    def roll_up_live(self) -> int:
        """Rewrite the rollups of the open intervals changed since they were last merged; return how many.

        An open interval's minutes may still change (late events within the lateness), so its rollup holds what they
        hold now and is rewritten after every batch that changes them: serving uses it only while its events equal
        what the coverage counted there, and reads the minutes otherwise. Closed intervals are left to
        :meth:`roll_up` (call it first). Best effort like it: a failed write is retried after the next batch.
        """
        epoch = self._epoch
        touched, self._touched = self._touched, set()
        if not (self.rollups and self.live) or epoch is None or self._open_of != epoch.id:
            return 0
        live = {iv for iv in touched & self._open if epoch.covered_from is None or iv[1] >= epoch.covered_from}
        if not live:
            return 0
        try:
            return self._rollup_store().write(self.query, epoch.id, live, self.ttl_seconds)
        except Exception:  # the minutes serve until the next try
            logger.warning(
                "could not rewrite %d open speed rollups; retried after the next batch", len(live), exc_info=True
            )
            self._touched |= live
            return 0

    def _rollup_store(self) -> SpeedRollups:
        if self._rollups is None:
            self._rollups = SpeedRollups(self.settings, self._connect().sess)
        return self._rollups

    def _note_intervals(self, epoch: Epoch, rows: list[Any]) -> None:
        """Add the intervals of the rows to the epoch's to-do of merges (read back on the epoch's first batch here)."""
        store = self._rollup_store()
        if self._open_of != epoch.id:  # this run's first batch of the epoch: a killed run's to-do is ours now
            self._open, self._open_of = store.todo(self.query, epoch.id), epoch.id
        intervals = {(r.slice, floor(utc(r.bucket_start), SPEED_ROLLUP)) for r in rows}  # type: ignore[arg-type]
        new = intervals - self._open
        store.add_todo(self.query, epoch.id, new)
        self._open |= new
        self._touched |= intervals

    def _hours_to_mark(self, epoch: Epoch, rows: list[Any]) -> list[datetime]:
        """Return the hours this batch writes rows in or reads through (quiet hours too), not yet marked here.

        The hours passed between the epoch's last newest event and this batch's are marked even without a row, so a
        quiet hour the speed layer read through is answered as zero, not as a gap; at most the rows' TTL of them.
        """
        hours = {floor(utc(r.bucket_start), HOUR) for r in rows}  # type: ignore[arg-type]
        newest = max((t for r in rows if (t := utc(r.max_ts)) is not None), default=None)
        if newest is not None:
            lo = epoch.seen_until or epoch.covered_from or min(hours)
            ttl_hours = self.ttl_seconds // 3600 if self.ttl_seconds > 0 else MAX_QUIET_HOURS
            h = max(floor(lo, HOUR), floor(newest, HOUR) - min(ttl_hours, MAX_QUIET_HOURS) * HOUR)
            while h <= newest:
                hours.add(h)
                h += HOUR
        return sorted(hours - self._marked)


def initial_offsets_written_at(spark: Any, checkpoint: str) -> datetime | None:
    """Return when Spark wrote the query's initial offsets (``sources/0/0``) into the checkpoint, on any file system.

    With ``latest`` those offsets are the topic's end at that moment: a record produced earlier is never read, so
    the epoch counts completely only from the next minute.
    """
    try:
        jvm = spark.sparkContext._jvm
        path = jvm.org.apache.hadoop.fs.Path(f"{checkpoint.rstrip('/')}/sources/0/0")
        status = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).getFileStatus(path)
        return datetime.fromtimestamp(status.getModificationTime() / 1000, UTC)
    except Exception:  # no such file (another source layout): the sink's own start time stands
        logger.warning("could not read when the initial offsets were written under %s", checkpoint, exc_info=True)
        return None


def _from_epoch(rows: Iterable[Any], covered_from: datetime | None) -> tuple[list[Any], int]:
    """Split off the rows of minutes before the epoch began (partial: they would overwrite complete rows)."""
    rows = list(rows)
    if covered_from is None:
        return rows, 0
    kept = [r for r in rows if utc(r.bucket_start) >= covered_from]  # type: ignore[operator]
    return kept, len(rows) - len(kept)


def _counts(rows: Iterable[Any]) -> dict[tuple[str, datetime], dict[datetime, int]]:
    """Return the events of each row by (slice, hour) and minute: what coverage records beside the rows."""
    out: dict[tuple[str, datetime], dict[datetime, int]] = {}
    for r in rows:
        minute = utc(r.bucket_start)
        assert minute is not None  # noqa: S101 - the window start is never null
        out.setdefault((r.slice, floor(minute, HOUR)), {})[minute] = int(r.events)
    return out


def _chunks(rows: Iterable[Any], size: int) -> Iterator[list[Any]]:
    it = iter(rows)
    while chunk := list(islice(it, size)):
        yield chunk
