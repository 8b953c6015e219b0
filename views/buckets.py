"""Time buckets, the one definition every layer uses: units, flooring, day and month keys, and when an hour closes.

A view row covers a UTC minute (speed and batch), ten minutes (speed rollups), hour or day (batch rollups). Rows are
partitioned by their UTC day (``day_key``), daily rollups by their month (``month_key``). An hour may be computed once
it is *closed*: every active partition's newest event time (the index's horizon) has passed its end plus the closing
grace. The batch job, the hourly DAG's sensor and the demo all ask :func:`is_closed` / :func:`closed_until`, so they
agree.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infra.settings import Settings

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
# The speed view's rollup: closed intervals of this many minutes merged once (infra/cql/0012), aligned in the hour.
SPEED_ROLLUP = timedelta(minutes=10)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The shortest part of a day the batch view keeps merged (infra/cql/0016): shorter runs of hours are read as hours.
MIN_DAY_PART = timedelta(hours=2)


def utc(ts: datetime | None) -> datetime | None:
    """Return a driver timestamp (naive UTC) or an aware one as an aware UTC datetime; None stays None."""
    if ts is None:
        return None
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def floor(ts: datetime, unit: timedelta) -> datetime:
    """Return ``ts`` truncated to a multiple of ``unit`` (minute, hour or day) in UTC."""
    return EPOCH + ((ts.astimezone(UTC) - EPOCH) // unit) * unit


def is_day_part(start: datetime, end: datetime) -> bool:
    """Tell whether ``[start, end)`` is a part of a day the batch view keeps merged (``batch_day_parts``).

    A run of whole hours of one UTC day from its midnight or to the next, of :data:`MIN_DAY_PART` or more and short
    of the whole day (that is the daily rollup): the inner side of a window's edge inside a day is one row.
    """
    day = floor(start, DAY)
    if floor(start, HOUR) != start or floor(end, HOUR) != end or not MIN_DAY_PART <= end - start < DAY:
        return False
    return end <= day + DAY and (start == day or end == day + DAY)


def day_key(ts: datetime) -> date:
    """Return the UTC day of a bucket start: the partition key of speed rows and hour rows."""
    return ts.astimezone(UTC).date()


def month_key(day: date) -> str:
    """Return the partition key of a day's rollups (``YYYY-MM``)."""
    return day.strftime("%Y-%m")


def as_date(value: Any) -> date:
    """Return a CQL ``date`` read back as a ``datetime.date`` (the driver's ``cassandra.util.Date`` equals none)."""
    return value if isinstance(value, date) else value.date()


def days_between(start: datetime, end: datetime) -> list[date]:
    """Return the UTC days ``[start, end)`` touches."""
    d, out = floor(start, DAY), []
    while d < end:
        out.append(d.date())
        d += DAY
    return out


def closing_grace(settings: Settings) -> timedelta:
    """Return how far past an hour's end the horizon must be for the hour to be closed (grace, at least lateness)."""
    return max(timedelta(seconds=settings.batch.grace_s), timedelta(seconds=settings.batch.lateness_s))


def is_closed(horizon: datetime | None, end: datetime, settings: Settings) -> bool:
    """Tell whether an interval ending at ``end`` is closed, given the horizon (None: nothing is closed yet)."""
    return horizon is not None and horizon >= end + closing_grace(settings)


def closed_until(horizon: datetime | None, settings: Settings) -> datetime | None:
    """Return the end of the last closed hour (every hour ending at or before it is closed), or None."""
    return None if horizon is None else floor(horizon - closing_grace(settings), HOUR)
