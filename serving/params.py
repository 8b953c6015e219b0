"""Validation of what a query asks for — window, slice, ranks, limits — shared by ``trends query`` and the API.

Every refusal is a :class:`BadQueryError` with a message that names the parameter and what would be accepted; the CLI
turns it into a usage error and the API into a 400.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from infra.settings import Settings
from serving.merge import MINUTE, floor
from views.aggregation import GLOBAL_SLICE

_SLICE = re.compile(r"^(?P<dim>[A-Za-z_][A-Za-z0-9_]{0,63})=(?P<value>[^\x00-\x1f]{1,256})$")


class BadQueryError(ValueError):
    """A query parameter that cannot be answered, with the parameter's name."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


def parse_last(text: str) -> timedelta:
    """Parse ``15m``, ``1h``, ``24h``, ``7d`` into a duration.

    :raises ValueError: on anything else.
    """
    units = {"m": 60, "h": 3600, "d": 86400}
    if len(text) < 2 or text[-1] not in units or not text[:-1].isdigit() or int(text[:-1]) <= 0:
        msg = f"{text!r} is not a duration like 15m, 1h, 24h or 7d"
        raise ValueError(msg)
    return timedelta(seconds=int(text[:-1]) * units[text[-1]])


def parse_time(param: str, text: str) -> datetime:
    """Parse an ISO-8601 time that carries an offset (``Z`` or ``+hh:mm``)."""
    try:
        ts = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise BadQueryError(param, f"{text!r} is not an ISO-8601 time (e.g. 2026-05-01T10:00Z)") from None
    if ts.tzinfo is None:
        raise BadQueryError(param, f"{text!r} has no time zone: add Z or +hh:mm")
    return ts.astimezone(UTC)


def window(
    settings: Settings,
    last: str | None,
    start: datetime | None,
    end: datetime | None,
    now: datetime | None = None,
) -> tuple[datetime, datetime]:
    """Resolve ``last`` (ending at the end of the current minute) or ``start``/``end`` to whole minutes.

    :raises BadQueryError: both or neither given, a malformed duration, an empty, reversed or too long window.
    """
    if last and (start or end):
        raise BadQueryError("last", "give either last or start/end, not both")
    if last:
        try:
            length = parse_last(last)
        except ValueError as exc:
            raise BadQueryError("last", str(exc)) from None
        stop = floor(now or datetime.now(UTC), MINUTE) + MINUTE
        start, end = stop - length, stop
    if start is None or end is None:
        raise BadQueryError("start" if start is None else "end", "give last (e.g. 1h) or both start and end")
    start, end = floor(start, MINUTE), floor(end, MINUTE)
    if end <= start:
        raise BadQueryError("end", f"the window is empty or reversed: {start.isoformat()} .. {end.isoformat()}")
    longest = timedelta(days=settings.serving.max_window_days)
    if end - start > longest:
        raise BadQueryError("end", f"the window is longer than {longest.days} days (serving.max_window_days)")
    return start, end


def duration(settings: Settings, param: str, text: str) -> timedelta:
    """Parse a duration parameter (e.g. the trending baseline), capped like a window."""
    try:
        length = parse_last(text)
    except ValueError as exc:
        raise BadQueryError(param, str(exc)) from None
    if length > timedelta(days=settings.serving.max_window_days):
        raise BadQueryError(param, f"longer than {settings.serving.max_window_days} days (serving.max_window_days)")
    return length


def slice_name(settings: Settings, text: str) -> str:
    """Check a slice: ``*`` or ``dim=value`` for a dimension the views are sliced by (``views.slice_dims``)."""
    if text == GLOBAL_SLICE:
        return text
    match = _SLICE.match(text)
    if match is None:
        raise BadQueryError("slice", f"{text!r} is not `*` or a slice like origin=JFK")
    if match["dim"] not in settings.views.slice_dims:
        known = ", ".join(settings.views.slice_dims) or "none"
        raise BadQueryError("slice", f"unknown slice dimension {match['dim']!r} (sliced dimensions: {known})")
    return text


def limit(settings: Settings, param: str, value: int) -> int:
    """Check a limit against ``serving.max_limit``."""
    if not 1 <= value <= settings.serving.max_limit:
        raise BadQueryError(
            param, f"must be between 1 and {settings.serving.max_limit} (serving.max_limit), not {value}"
        )
    return value


def ranks(values: Sequence[float]) -> tuple[float, ...]:
    """Check quantile ranks (each in [0, 1]); the default is the median, p90 and p99."""
    for r in values:
        if not 0 <= r <= 1:
            raise BadQueryError("rank", f"a rank is between 0 and 1, not {r}")
    if len(values) > 100:
        raise BadQueryError("rank", "at most 100 ranks")
    return tuple(values) or (0.5, 0.9, 0.99)
