"""One row of a view as a query sees it: what the reader yields, the caches keep and the merge consumes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from serving.plan import Layer, Resolution


@dataclass(frozen=True)
class Bucket:
    """One row of a view as a query sees it (sketches not read are empty)."""

    start: datetime
    resolution: Resolution
    layer: Layer
    events: int
    users_hll: bytes
    values_kll: bytes
    items_fi: bytes

    @property
    def sketch_bytes(self) -> int:
        """Return the bytes of its sketches (what a read budget counts)."""
        return len(self.users_hll) + len(self.values_kll) + len(self.items_fi)

    @classmethod
    def of_row(cls, start: datetime | None, resolution: Resolution, layer: Layer, r: Any) -> Bucket:
        """Turn a row read from Cassandra into a bucket (sketches not selected are empty)."""
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
