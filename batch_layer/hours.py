"""The hours a recompute covers, and how they are split into Spark passes (whole days where they fit)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime

from infra.errors import TrendsError
from views.buckets import HOUR


def hours_between(start: datetime, end: datetime) -> Iterator[datetime]:
    """Yield the UTC hours of ``[start, end)``.

    :raises TrendsError: when the bounds are not whole hours or are reversed.
    """
    for name, ts in (("start", start), ("end", end)):
        if ts.tzinfo is None:
            msg = f"--{name} needs a time zone (e.g. 2026-05-01T10:00Z)"
            raise TrendsError(msg)
        if ts.minute or ts.second or ts.microsecond:
            msg = f"--{name} {ts.isoformat()} is not a whole hour: intervals are UTC hours"
            raise TrendsError(msg)
    if end <= start:
        msg = f"the interval is empty or reversed: {start.isoformat()} .. {end.isoformat()}"
        raise TrendsError(msg)
    hour = start.astimezone(UTC)
    while hour < end:
        yield hour
        hour += HOUR


def hours_of(start: datetime | None, end: datetime | None, hours: Sequence[datetime] | None) -> list[datetime]:
    """Return the hours of ``[start, end)``, or the given ones, sorted and once each.

    :raises TrendsError: when neither the bounds nor the hours are given, or the bounds are not whole hours.
    """
    if hours is None:
        if start is None or end is None:
            msg = "give start and end, or hours"
            raise TrendsError(msg)
        hours = list(hours_between(start, end))
    return sorted(set(hours))


def chunks(
    hours: Sequence[datetime], records: dict[datetime, int], max_events: int, max_hours: int
) -> list[list[datetime]]:
    """Split hours (in order) into passes of at most ``max_hours`` hours and about ``max_events`` records.

    Whole days stay in one pass where they fit (a pass then writes their daily rollups itself, and passes running
    side by side never re-merge the same day); a day too big for one pass is split by hours. An hour is never
    split: an hour holding more than ``max_events`` records is a pass of its own.
    """
    days: dict[date, list[datetime]] = {}
    for hour in hours:
        days.setdefault(hour.date(), []).append(hour)
    out: list[list[datetime]] = []
    current: list[datetime] = []
    events = 0

    def fits(n_hours: int, n_events: int) -> bool:
        return not current or (len(current) + n_hours <= max_hours and events + n_events <= max_events)

    for day_hours in days.values():
        day_events = sum(records.get(h, 0) for h in day_hours)
        if len(day_hours) <= max_hours and day_events <= max_events:
            if not fits(len(day_hours), day_events):
                out.append(current)
                current, events = [], 0
            current += day_hours
            events += day_events
            continue
        for hour in day_hours:  # a day bigger than a pass: by hours
            n = records.get(hour, 0)
            if not fits(1, n):
                out.append(current)
                current, events = [], 0
            current.append(hour)
            events += n
    if current:
        out.append(current)
    return out


def taper(passes: list[list[datetime]], fraction: float = 0.25) -> list[list[datetime]]:
    """Split a short first pass off the first one and a short last pass off the last one (whole days).

    A pass's writes run beside the next pass's Spark, except for the first pass's Spark and the last pass's writes,
    which nothing overlaps: short ones there shorten the whole run. A pass of one day stays as it is.
    """

    def split(hours: list[datetime], head: bool) -> list[list[datetime]]:
        days = sorted({h.date() for h in hours})
        if len(days) < 2:
            return [hours]
        n = max(1, round(len(days) * fraction))
        cut = set(days[:n] if head else days[-n:])
        part, rest = [h for h in hours if h.date() in cut], [h for h in hours if h.date() not in cut]
        return [part, rest] if head else [rest, part]

    if not passes:
        return []
    out = [*split(passes[0], head=True), *passes[1:]]
    return [*out[:-1], *split(out[-1], head=False)]
