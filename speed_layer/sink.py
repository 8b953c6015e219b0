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
from datetime import datetime
from itertools import islice
from typing import TYPE_CHECKING, Any

from infra.cassandra import make_cluster
from infra.settings import Settings
from views.store.speed import SpeedRows

if TYPE_CHECKING:
    from cassandra.cluster import Cluster
    from pyspark.sql import DataFrame

logger = logging.getLogger(__name__)

CHUNK_ROWS = 2000


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
    _rows: SpeedRows | None = field(default=None, init=False, repr=False)
    newest_event_ts: datetime | None = field(default=None, init=False)
    watermark: datetime | None = field(default=None, init=False)

    def _connect(self) -> SpeedRows:
        if self._rows is None:
            self._cluster = make_cluster(self.settings)
            rows = SpeedRows(self.settings, self._cluster.connect())
            self.newest_event_ts = rows.newest_event(self.query)
            self._rows = rows
        return self._rows

    def close(self) -> None:
        """Shut the driver's connections down."""
        if self._cluster is not None:
            self._cluster.shutdown()
        self._cluster, self._rows = None, None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        """Write one micro-batch (Spark calls this on the driver)."""
        # One job for the whole batch (toLocalIterator runs one per partition, which costs more per batch). The
        # rows are the changed buckets, at most (distinct minutes x slices) of one micro-batch's events, and
        # toLocalIterator would hold a whole partition in the driver too; maxOffsetsPerTrigger bounds both.
        result = self.write_rows(batch.collect(), batch_id)
        logger.debug("batch %s wrote %d bucket rows", batch_id, result.rows)

    def write_rows(self, rows: Iterable[Any], batch_id: int) -> BatchResult:
        """Upsert view rows in chunks with bounded concurrency; raise on the first failed write."""
        store = self._connect()
        written = 0
        newest = None
        for chunk in _chunks(rows, CHUNK_ROWS):
            count, chunk_newest = store.write(chunk, batch_id, self.ttl_seconds)
            written += count
            if chunk_newest is not None and (newest is None or chunk_newest > newest):
                newest = chunk_newest
        if newest is not None and (self.newest_event_ts is None or newest > self.newest_event_ts):
            self.newest_event_ts = newest
        store.write_progress(self.query, self.newest_event_ts, self.watermark, batch_id, written)
        return BatchResult(batch_id, written, newest)


def _chunks(rows: Iterable[Any], size: int) -> Iterator[list[Any]]:
    it = iter(rows)
    while chunk := list(islice(it, size)):
        yield chunk
