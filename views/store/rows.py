"""The row types of the views, shared by the layers that write them and the reader that merges them."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from infra.cassandra import READ_PROFILE
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
