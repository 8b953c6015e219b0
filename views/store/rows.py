"""The row types of the views, shared by the layers that write them and the reader that merges them."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from infra.cassandra import READ_PROFILE
from views import sketches
from views.buckets import utc

if TYPE_CHECKING:
    from cassandra.cluster import Session

Request = tuple[Any, tuple[Any, ...]]  # a prepared statement and its values, for reads issued together


def read_many(sess: Session, requests: list[Request]) -> list[list[Any]]:
    """Run reads concurrently (one round trip of latency instead of one per read); results in order."""
    futures = [sess.execute_async(stmt, params, execution_profile=READ_PROFILE) for stmt, params in requests]
    return [list(f.result()) for f in futures]


class ViewRow(NamedTuple):
    """One bucket of one slice, as computed by Spark (a named tuple: a year's pass makes ~160k of them)."""

    slice: str
    bucket_start: datetime
    events: int
    users_hll: bytes
    values_kll: bytes
    items_fi: bytes
    min_ts: datetime | None
    max_ts: datetime | None

    @classmethod
    def from_spark(cls, row: Any) -> ViewRow:
        """Convert a collected Spark row of :data:`views.aggregation.VIEW_COLUMNS`, in that order.

        Positional access: a year of sparse history is hundreds of thousands of rows, and ``Row.__getattr__``
        searches the field names on every access.
        """
        bucket_start, slice_, events, users_hll, values_kll, items_fi, min_ts, max_ts = row
        bucket = utc(bucket_start)
        assert bucket is not None  # noqa: S101 - grouping key, never null
        return cls(
            slice_, bucket, int(events), bytes(users_hll), bytes(values_kll), bytes(items_fi), utc(min_ts), utc(max_ts)
        )


class RunningMerge:
    """Rows merged one at a time, the merge readable after each: the prefixes of a run of buckets, merged once.

    What a row merged from others holds: the events summed, the sketches' union, the earliest and latest event.
    """

    def __init__(self) -> None:
        self.rows = 0
        self.events = 0
        self._union = sketches.SketchUnion()
        self._lows: list[datetime] = []
        self._highs: list[datetime] = []

    def add(self, row: Any) -> None:
        """Merge one row (``events``, the three sketches, ``min_ts``, ``max_ts``)."""
        self.rows += 1
        self.events += int(row.events)
        self._union.add(row.users_hll, row.values_kll, row.items_fi)
        if (low := utc(row.min_ts)) is not None:
            self._lows.append(low)
        if (high := utc(row.max_ts)) is not None:
            self._highs.append(high)

    def merged(self) -> tuple[int, bytes, bytes, bytes, datetime | None, datetime | None]:
        """Return the rows merged so far: ``(events, users_hll, values_kll, items_fi, min_ts, max_ts)``."""
        return (self.events, *self._union.serialized(), min(self._lows, default=None), max(self._highs, default=None))
