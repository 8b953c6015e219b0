"""One row of a view as a query sees it: what the reader yields, the caches keep and the merge consumes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from serving.plan import Layer
from views.buckets import DAY, HOUR, MINUTE, SPEED_ROLLUP

# "10min": a speed rollup (views.store.rollups); "minutes": an edge of one (views.store.rollups.edges); "hours": a
# part of a day (views.buckets.is_day_part). The last two carry their width.
RowResolution = Literal["day", "hours", "hour", "10min", "minutes", "minute"]
WIDTHS: dict[str, timedelta] = {"minute": MINUTE, "10min": SPEED_ROLLUP, "hour": HOUR, "day": DAY}


@dataclass(frozen=True)
class ServedRow:
    """One row of a view as a query sees it (sketches not read are empty)."""

    start: datetime
    resolution: RowResolution
    layer: Layer
    events: int
    users_hll: bytes
    values_kll: bytes
    items_fi: bytes
    width: timedelta | None = None  # of an edge or a part of a day (the others' is their resolution's)

    @property
    def sketch_bytes(self) -> int:
        """Return the bytes of its sketches (what a read budget counts)."""
        return len(self.users_hll) + len(self.values_kll) + len(self.items_fi)

    @property
    def end(self) -> datetime:
        """Return the end of the time the row covers."""
        return self.start + (self.width if self.width is not None else WIDTHS[self.resolution])

    def minutes(self) -> Iterator[datetime]:
        """Yield the minutes the row covers."""
        m = self.start
        while m < self.end:
            yield m
            m += MINUTE

    @classmethod
    def of_row(cls, start: datetime | None, resolution: RowResolution, layer: Layer, r: Any) -> ServedRow:
        """Turn a row read from Cassandra into a served row (sketches not selected are empty)."""
        if start is None:
            msg = "a view row without a bucket start"
            raise ValueError(msg)
        return cls(
            start.astimezone(UTC),
            resolution,
            layer,
            int(r.events),
            bytes(getattr(r, "users_hll", b"")),
            bytes(getattr(r, "values_kll", b"")),
            bytes(getattr(r, "items_fi", b"")),
        )
