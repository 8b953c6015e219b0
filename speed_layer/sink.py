"""The speed layer's Cassandra sink: ``foreachBatch`` upserts of the full state of every changed bucket.

In update mode Spark emits, for each bucket a micro-batch touched, its *cumulative* state (count and sketches of
everything seen so far). Writing that row whole is idempotent: when a crash makes Spark replay a batch (same batch
id, same data — its offsets are logged before and committed after), the replay writes the very same rows again.
Nothing here increments, appends or writes a wall-clock value into a view row, which is what makes the
at-least-once ``foreachBatch`` exactly-once in effect. A failed write raises, which fails the batch (and the
query): it is replayed from the checkpoint on restart, never skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import islice
from typing import TYPE_CHECKING, Any

from infra.cassandra import WRITE_PROFILE, make_cluster, table
from infra.settings import Settings

if TYPE_CHECKING:
    from cassandra.cluster import Cluster, Session
    from cassandra.query import PreparedStatement
    from pyspark.sql import DataFrame

logger = logging.getLogger(__name__)

UPSERT_VIEW = (
    "INSERT INTO {table} (slice, day, bucket_start, events, users_hll, values_kll, items_fi, min_ts, max_ts, batch_id)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?"
)
UPSERT_PROGRESS = (
    "INSERT INTO {table} (query, newest_event_ts, watermark, last_batch_id, last_batch_rows, updated_at)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)
SELECT_PROGRESS = "SELECT newest_event_ts FROM {table} WHERE query = ?"
CHUNK_ROWS = 2000


def _utc(ts: datetime | None) -> datetime | None:
    if ts is None:
        return None
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


@dataclass
class BatchResult:
    """What one micro-batch wrote."""

    batch_id: int
    rows: int
    newest_event_ts: datetime | None


@dataclass
class SpeedViewSink:
    """Callable for ``writeStream.foreachBatch``; holds one lazily opened Cassandra session.

    :arg query: the streaming query's name, the key of its freshness row.
    :arg ttl_seconds: TTL of view rows; longer than the batch layer's lag so no bucket goes unserved.
    """

    settings: Settings
    query: str
    ttl_seconds: int
    _cluster: Cluster | None = field(default=None, init=False, repr=False)
    _session: Session | None = field(default=None, init=False, repr=False)
    _upsert: PreparedStatement | None = field(default=None, init=False, repr=False)
    _progress: PreparedStatement | None = field(default=None, init=False, repr=False)
    newest_event_ts: datetime | None = field(default=None, init=False)
    watermark: datetime | None = field(default=None, init=False)

    def _connect(self) -> Session:
        if self._session is None:
            self._cluster = make_cluster(self.settings)
            sess = self._cluster.connect()
            self._upsert = sess.prepare(UPSERT_VIEW.format(table=table(self.settings, "speed_view")))
            self._upsert.is_idempotent = True
            self._progress = sess.prepare(UPSERT_PROGRESS.format(table=table(self.settings, "speed_progress")))
            self._progress.is_idempotent = True
            row = sess.execute(
                sess.prepare(SELECT_PROGRESS.format(table=table(self.settings, "speed_progress"))), (self.query,)
            ).one()
            self.newest_event_ts = _utc(row.newest_event_ts) if row else None
            self._session = sess
        return self._session

    def close(self) -> None:
        """Shut the driver's connections down."""
        if self._cluster is not None:
            self._cluster.shutdown()
        self._cluster = self._session = None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        """Write one micro-batch (Spark calls this on the driver)."""
        # One job for the whole batch (toLocalIterator runs one per partition and costs ~20% more per batch). The
        # rows are the changed buckets, at most (distinct minutes x slices) of one micro-batch's events, and
        # toLocalIterator would hold a whole partition in the driver too; maxOffsetsPerTrigger bounds both.
        result = self.write_rows(batch.collect(), batch_id)
        logger.debug("batch %s wrote %d bucket rows", batch_id, result.rows)

    def write_rows(self, rows: Iterable[Any], batch_id: int) -> BatchResult:
        """Upsert view rows in chunks with bounded concurrency; raise on the first failed write."""
        from cassandra.concurrent import execute_concurrent_with_args  # noqa: PLC0415

        sess = self._connect()
        written = 0
        newest = None
        for chunk in _chunks(rows, CHUNK_ROWS):
            params = []
            for r in chunk:
                bucket = _utc(r.bucket_start)
                assert bucket is not None  # noqa: S101 - the window start is never null
                params.append(
                    (
                        r.slice,
                        bucket.date(),
                        bucket,
                        r.events,
                        bytes(r.users_hll),
                        bytes(r.values_kll),
                        bytes(r.items_fi),
                        _utc(r.min_ts),
                        _utc(r.max_ts),
                        batch_id,
                        self.ttl_seconds,
                    )
                )
                max_ts = _utc(r.max_ts)
                if max_ts is not None and (newest is None or max_ts > newest):
                    newest = max_ts
            execute_concurrent_with_args(
                sess,
                self._upsert,
                params,
                concurrency=self.settings.cassandra.write_concurrency,
                raise_on_first_error=True,
                execution_profile=WRITE_PROFILE,
            )
            written += len(params)
        if newest is not None and (self.newest_event_ts is None or newest > self.newest_event_ts):
            self.newest_event_ts = newest
        sess.execute(
            self._progress,
            (self.query, self.newest_event_ts, self.watermark, batch_id, written, datetime.now(UTC)),
            execution_profile=WRITE_PROFILE,
        )
        return BatchResult(batch_id, written, newest)


def _chunks(rows: Iterable[Any], size: int) -> Iterator[list[Any]]:
    it = iter(rows)
    while chunk := list(islice(it, size)):
        yield chunk
