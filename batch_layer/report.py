"""What a batch run reports: each hour's counts (its lineage), the hour's result line, the progress of a run."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from batch_layer.compute import Computed
    from batch_layer.offsets import HourPlan


@dataclass
class RunResult:
    """What one hour's run did (also written to the lineage table)."""

    hour: datetime
    run_id: str
    offsets: str
    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    watermark: datetime | None = None

    def line(self) -> str:
        """Return a one-line summary."""
        c = self.counts
        return (
            f"{self.hour:%Y-%m-%dT%H:%MZ} run {self.run_id[:8]}: read {c.get('read', 0)}, kept {c.get('kept', 0)} "
            f"(deduped {c.get('deduped', 0)}, late {c.get('late', 0)}, outside {c.get('outside', 0)}, "
            f"unparseable {c.get('unparseable', 0)}), {c.get('slices', 0)} slices in {self.seconds:.1f} s"
        )


@dataclass
class RunProgress:
    """Where a multi-hour recompute is, after each chunk."""

    chunk: int
    chunks: int
    hours_done: int
    hours: int
    events: int
    seconds: float

    def line(self) -> str:
        """Return the progress line: hours done of total, events, rate, ETA."""
        rate = self.events / self.seconds if self.seconds > 0 else 0.0
        left = self.hours - self.hours_done
        eta = self.seconds / self.hours_done * left if self.hours_done else 0.0
        return (
            f"chunk {self.chunk}/{self.chunks}: {self.hours_done}/{self.hours} hours, {self.events:,} events "
            f"in {self.seconds:.1f} s ({rate:,.0f} events/s), ETA {eta:.0f} s"
        )


def counts_of(hp: HourPlan, done: Computed | None) -> dict[str, int]:
    """Return the hour's lineage counts: read, unparseable, outside, in the interval, deduplicated, kept, late."""
    from views.aggregation import GLOBAL_SLICE  # noqa: PLC0415

    hour_rows = done.hours.get(hp.hour, []) if done else []
    c = {
        "read": hp.records,
        "indexed": hp.records,
        "unparseable": done.unparseable[hp.hour] if done else 0,
        "outside": done.outside[hp.hour] if done else 0,
        "kept": sum(r.events for r in hour_rows if r.slice == GLOBAL_SLICE),
        "late": hp.late,
        "slices": len({r.slice for r in hour_rows}),
    }
    c["in_interval"] = c["read"] - c["unparseable"] - c["outside"]
    c["deduped"] = c["in_interval"] - c["kept"]
    return c
