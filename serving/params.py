"""Validation of what a query asks for — window, slice, ranks, limits — shared by ``trends query`` and the API.

Every refusal is a :class:`BadQueryError` with a message that names the parameter and what would be accepted; the CLI
turns it into a usage error and the API into a 400.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from infra.settings import Settings
from infra.user_time import parse_utc
from views.buckets import MINUTE, floor
from views.definition import GLOBAL_SLICE

_DIM = r"[A-Za-z_][A-Za-z0-9_]{0,63}"
_SLICE_VALUE = r"[^\x00-\x1f]{1,256}"
_SLICE = re.compile(rf"^(?P<dim>{_DIM})=(?P<value>{_SLICE_VALUE})$")

# The times a window may start or end: ISO-8601 with minutes, optional seconds and fraction, and an offset, in the
# years 1970-2999 (dates checked to the day, leap years included), so a window and its baseline stay far from the
# limits of Python's datetime. The API documents this very pattern.
_YEAR = r"(?:19[7-9][0-9]|2[0-9]{3})"
_LEAP = r"(?:19(?:7[26]|8[048]|9[26])|2[0-9](?:0[48]|[2468][048]|[13579][26])|2[048]00)"
_MONTH_DAY = r"(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)"
TIME_PATTERN = (
    rf"^(?:{_YEAR}-{_MONTH_DAY}|{_LEAP}-02-29)T(?:[01][0-9]|2[0-3]):[0-5][0-9](?::[0-5][0-9](?:\.[0-9]{{1,6}})?)?"
    r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])$"
)
_TIME = re.compile(TIME_PATTERN)
# The same layout without the calendar's limits: a time that matches it once given a "Z" only lacks its zone.
_TIME_FIELDS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d(?::\d\d(?:\.\d{1,6})?)?(?:Z|[+-]\d\d:\d\d)$")

_DURATION = re.compile(r"^([1-9][0-9]{0,9})([mhd])$")
_UNIT_S = {"m": 60, "h": 3600, "d": 86400}
_LONGEST_S = 1000 * 366 * 86400  # beyond any window a setting allows; keeps timedelta far from overflowing
DEFAULT_LAST = "1h"  # the API's window when neither last nor start/end is given


class BadQueryError(ValueError):
    """A query parameter that cannot be answered, with the parameter's name."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


def parse_last(text: str) -> timedelta:
    """Parse ``15m``, ``1h``, ``24h``, ``7d`` (a positive whole number without leading zeros, then m, h or d).

    :raises ValueError: on anything else, or a duration of more than a thousand years.
    """
    match = _DURATION.fullmatch(text)
    if match is None:
        msg = f"{text!r} is not a duration like 15m, 1h, 24h or 7d"
        raise ValueError(msg)
    seconds = int(match[1]) * _UNIT_S[match[2]]
    if seconds > _LONGEST_S:
        msg = f"{text!r} is longer than any window"
        raise ValueError(msg)
    return timedelta(seconds=seconds)


def parse_time(param: str, text: str) -> datetime:
    """Parse an ISO-8601 time that carries an offset (``Z`` or ``+hh:mm``), years 1970-2999 (:data:`TIME_PATTERN`).

    The API documents this pattern and refuses what it does not match; what matches is read by the one parser of
    user times, :func:`infra.user_time.parse_utc`.
    """
    if _TIME.fullmatch(text) is None:
        if _TIME_FIELDS.fullmatch(text + "Z") is not None:
            raise BadQueryError(param, f"{text!r} has no time zone: add Z or +hh:mm")
        raise BadQueryError(
            param, f"{text!r} is not an ISO-8601 time with an offset in the years 1970-2999 (e.g. 2026-05-01T10:00Z)"
        )
    return parse_utc(text)  # the CLI's parser: the pattern above is a narrower form of what it reads


def duration_pattern(max_days: int) -> str:
    """Return the pattern of the durations up to ``max_days`` days (``last``, ``baseline``), for the API's schema."""
    return "^(?:" + "|".join(f"(?:{_upto(max_days * n)}){u}" for u, n in (("m", 1440), ("h", 24), ("d", 1))) + ")$"


def _upto(n: int) -> str:
    """Return a regular expression of the whole numbers 1..n written without leading zeros."""
    digits = str(n)
    alts = [f"[1-9][0-9]{{{k - 1}}}" if k > 1 else "[1-9]" for k in range(1, len(digits))]
    alts.append(_at_most(digits, first=True))
    return "|".join(a for a in alts if a)


def _at_most(digits: str, *, first: bool) -> str:
    """Return a regular expression of the numbers with as many digits as ``digits`` and at most its value."""
    low, d, rest = (1 if first else 0), int(digits[0]), len(digits) - 1
    tail = f"[0-9]{{{rest}}}" if rest else ""
    alts = []
    if d > low:
        alts.append(f"[{low}-{d - 1}]{tail}")
    if d >= low:
        alts.append(digits[0] + (f"(?:{_at_most(digits[1:], first=False)})" if rest else ""))
    return "|".join(alts)


def slice_pattern(settings: Settings) -> str:
    """Return the pattern of the slices the views have (``*`` or ``dim=value`` of ``views.slice_dims``)."""
    dims = [d for d in settings.views.slice_dims if re.fullmatch(_DIM, d)]
    if not dims:
        return r"^\*$"
    return rf"^(?:\*|(?:{'|'.join(dims)})={_SLICE_VALUE})$"


def window(
    settings: Settings,
    last: str | None,
    start: datetime | None,
    end: datetime | None,
    now: datetime | None = None,
) -> tuple[datetime, datetime]:
    """Resolve ``last``, ``start`` and ``end`` to a window of whole minutes: every combination has one meaning.

    The window is ``last`` long (:data:`DEFAULT_LAST` when only ``start`` or only ``end`` is given) and ends at
    ``end``, or at the end of the current minute when neither ``start`` nor ``end`` is given — so ``last`` with
    ``end`` is the last N ending at ``end``, as Prometheus' range queries and Grafana read it. With ``start`` alone
    it is N from ``start``; with ``start`` and ``end`` it is ``[start, end)``, and ``last`` then keeps its last N.
    Times are floored to whole minutes; ``start`` and ``end`` given the wrong way round bound the same window; a
    window within one minute is that minute; one longer than ``serving.max_window_days`` keeps its last days.

    :raises BadQueryError: none of the three given, a malformed duration or one longer than the longest window.
    """
    if last is None and start is None and end is None:
        raise BadQueryError("last", "give last (e.g. 1h), start or end")
    longest = timedelta(days=settings.serving.max_window_days)
    length = None
    if last is not None:
        try:
            length = parse_last(last)
        except ValueError as exc:
            raise BadQueryError("last", str(exc)) from None
        if length > longest:
            raise BadQueryError("last", f"longer than {longest.days} days (serving.max_window_days)")
    t0 = floor(start, MINUTE) if start is not None else None
    t1 = floor(end, MINUTE) if end is not None else None
    if t0 is not None and t1 is not None:
        t0, t1 = min(t0, t1), max(t0, t1)
        t1 = max(t1, t0 + MINUTE)
        if length is not None:
            t0 = max(t0, t1 - length)
    elif t0 is not None:
        t1 = t0 + (length or parse_last(DEFAULT_LAST))
    else:
        t1 = t1 if t1 is not None else floor(now or datetime.now(UTC), MINUTE) + MINUTE
        t0 = t1 - (length or parse_last(DEFAULT_LAST))
    return max(t0, t1 - longest), t1


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
    match = _SLICE.fullmatch(text)
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
        if not 0 <= r <= 1:  # NaN too
            raise BadQueryError("rank", f"a rank is between 0 and 1, not {r}")
    if len(values) > 100:
        raise BadQueryError("rank", "at most 100 ranks")
    return tuple(values) or (0.5, 0.9, 0.99)
