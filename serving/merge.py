"""Which layer answers which part of a query window: the merge rule, as a pure function.

The boundary ``B`` is the batch watermark (or an operator's pin). Every minute of the window is served by exactly
one source:

* below ``B`` by the **batch view** — a whole UTC day from its daily rollup when that rollup is current, a whole
  hour from its hourly rollup, the minutes of a partial hour from the minute rows — and by nothing else: an hour
  below ``B`` without a completed batch run is a **gap**;
* at or above ``B`` by the **speed view**, up to the speed layer's freshness; minutes past it are a **gap**
  (nothing has been seen there yet).

So no minute is counted twice (the two ranges do not overlap, and a coarser rollup replaces its finer rows) and
none is silently skipped (every minute not served is reported as a gap). Cost grows with the number of rollup
rows read, not with events: a week below the watermark is at most 7 daily rows plus the edge hours and minutes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Literal

from views.buckets import DAY, HOUR, MINUTE, floor

Layer = Literal["batch", "speed", "gap"]
Resolution = Literal["day", "hour", "minute"]


@dataclass(frozen=True)
class Span:
    """A contiguous part of the window and who serves it."""

    start: datetime
    end: datetime
    layer: Layer
    resolution: Resolution
    reason: str = ""

    def minutes(self) -> Iterator[datetime]:
        """Yield the minute buckets the span covers."""
        m = self.start
        while m < self.end:
            yield m
            m += MINUTE


def plan(
    start: datetime,
    end: datetime,
    boundary: datetime | None,
    batch_hours: set[datetime],
    current_days: set[date],
    speed_fresh_until: datetime | None,
    coarsest: Resolution = "day",
) -> list[Span]:
    """Split ``[start, end)`` (whole minutes) into spans served by the batch view, the speed view, or gaps.

    :arg boundary: the batch watermark or pin; None when the batch layer has completed nothing yet.
    :arg batch_hours: hours (below the boundary) with a completed batch run.
    :arg current_days: days whose daily rollup matches the current hour runs.
    :arg speed_fresh_until: end of the minute of the newest event the speed layer has written (None: nothing).
    :arg coarsest: the coarsest rollup allowed (a time series at hourly resolution must not use daily rows).
    """
    if start.tzinfo is None or end.tzinfo is None:
        msg = "window bounds must be timezone-aware"
        raise ValueError(msg)
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    if floor(start, MINUTE) != start or floor(end, MINUTE) != end or end <= start:
        msg = f"window [{start}, {end}) must be non-empty and on whole minutes"
        raise ValueError(msg)
    split = start if boundary is None else min(max(boundary.astimezone(UTC), start), end)
    spans = _batch_spans(start, split, batch_hours, current_days, coarsest) + _speed_spans(
        split, end, speed_fresh_until
    )
    return _coalesce(spans)


def _batch_spans(
    start: datetime, end: datetime, hours: set[datetime], days: set[date], coarsest: Resolution
) -> list[Span]:
    spans: list[Span] = []
    t = start
    while t < end:
        day_start = floor(t, DAY)
        if (
            coarsest == "day"
            and t == day_start
            and t + DAY <= end
            and day_start.date() in days
            and all(day_start + i * HOUR in hours for i in range(24))
        ):
            spans.append(Span(t, t + DAY, "batch", "day"))
            t += DAY
            continue
        hour = floor(t, HOUR)
        stop = min(hour + HOUR, end)
        if hour not in hours:
            spans.append(Span(t, stop, "gap", "minute", "no completed batch run for this hour"))
        elif coarsest != "minute" and t == hour and stop == hour + HOUR:
            spans.append(Span(t, stop, "batch", "hour"))
        else:
            spans.append(Span(t, stop, "batch", "minute"))
        t = stop
    return spans


def _speed_spans(start: datetime, end: datetime, fresh_until: datetime | None) -> list[Span]:
    if start >= end:
        return []
    seen = start if fresh_until is None else min(max(fresh_until.astimezone(UTC), start), end)
    spans = []
    if seen > start:
        spans.append(Span(start, seen, "speed", "minute"))
    if seen < end:
        spans.append(Span(seen, end, "gap", "minute", "not yet seen by the speed layer"))
    return spans


def _coalesce(spans: list[Span]) -> list[Span]:
    """Merge adjacent gaps with the same reason, so answers list few gap ranges."""
    out: list[Span] = []
    for s in spans:
        prev = out[-1] if out else None
        if prev and prev.layer == "gap" == s.layer and prev.reason == s.reason and prev.end == s.start:
            out[-1] = Span(prev.start, s.end, "gap", "minute", s.reason)
        else:
            out.append(s)
    return out
