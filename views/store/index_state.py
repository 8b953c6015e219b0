"""A read of the event-time index's checkpoint (``batch_index_state``) and the horizon it gives, for serving.

The indexer (``batch_layer/index.py``) owns the table and writes it; serving may not import the batch layer, so
the console reads the per-partition rows here and computes the horizon with the same rule as
``batch_layer.index.horizon_of`` (``tests/unit/test_console.py`` checks that the two agree).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from infra.cassandra import READ_PROFILE, table
from infra.settings import Settings
from views.buckets import utc

if TYPE_CHECKING:
    from cassandra.cluster import Session

SELECT_INDEX_STATE = (
    "SELECT partition, next_offset, max_ts, last_record_at, updated_at FROM {batch_index_state} WHERE topic = %s"
)


class PartitionProgress(Protocol):
    """What the horizon rule needs of a partition (the indexer's state, or its row read back)."""

    @property
    def partition(self) -> int: ...  # noqa: D102
    @property
    def max_ts(self) -> datetime | None: ...  # noqa: D102
    @property
    def last_record_at(self) -> datetime | None: ...  # noqa: D102


@dataclass(frozen=True)
class IndexedPartition:
    """How far the index has read one partition: its next offset, newest record time, and when it last grew."""

    partition: int
    next_offset: int
    max_ts: datetime | None
    last_record_at: datetime | None
    updated_at: datetime | None


@dataclass(frozen=True)
class IndexHorizon:
    """The time every partition still receiving records has passed, and the partition holding it back."""

    closed_at: datetime | None
    held_by: int | None  # None: no active partition (all idle, or nothing indexed)
    idle: tuple[int, ...]


def decode_index_state(rows: Iterable[Any]) -> list[IndexedPartition]:
    """Turn ``batch_index_state`` rows into partitions, in partition order."""
    out = [
        IndexedPartition(int(r.partition), int(r.next_offset or 0), utc(r.max_ts), utc(r.last_record_at),
                         utc(r.updated_at))
        for r in rows
    ]  # fmt: skip
    return sorted(out, key=lambda p: p.partition)


def read_index_state(settings: Settings, sess: Session, topic: str) -> list[IndexedPartition]:
    """Return the index's checkpoint of every partition of ``topic`` (empty: never indexed)."""
    stmt = SELECT_INDEX_STATE.format(batch_index_state=table(settings, "batch_index_state"))
    return decode_index_state(sess.execute(stmt, (topic,), execution_profile=READ_PROFILE))


def index_horizon(parts: Iterable[PartitionProgress], now: datetime, idle_after: timedelta) -> IndexHorizon:
    """Return the horizon: the oldest newest-record time of the partitions that got a record within ``idle_after``.

    The one home of the rule (``batch_layer.index.horizon_of`` calls it): an idle partition does not hold the
    horizon back; when every partition is idle the horizon is the newest record time or ``now - idle_after``,
    whichever is later; it never runs ahead of ``now``.
    """
    with_data = [p for p in parts if p.max_ts is not None]
    active = [p for p in with_data if p.last_record_at is not None and now - p.last_record_at <= idle_after]
    idle = tuple(sorted(p.partition for p in with_data if p not in active))
    held_by, closed = None, None
    if active:
        oldest = min(active, key=lambda p: (p.max_ts, p.partition))
        held_by, closed = oldest.partition, oldest.max_ts
    elif with_data:
        closed = max(*(p.max_ts for p in with_data if p.max_ts), now - idle_after)
    if closed is not None:
        closed = min(closed, now)
    return IndexHorizon(closed, held_by, idle)
