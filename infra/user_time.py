"""Parameter types of the ``trends`` command line, and the one parser of the times a user types.

Every CLI group takes its times through :data:`UTC_TIME`, so ``trends ingest``, ``trends batch`` and ``trends query``
accept the same words: ISO-8601 (a date alone is UTC midnight, a time without offset is UTC), ``now``, or an offset
from now like ``-365d``. The HTTP API first checks its stricter, documented pattern, then parses with
:func:`parse_utc` as well.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import click

TIME_HELP: Final = (
    "ISO-8601 (e.g. 2026-05-01T10:00Z; a date alone is UTC midnight, a time without offset is UTC), `now`, "
    "or relative like -365d, -2h"
)
# Kafka record timestamps are non-negative: no event, hour or window of this pipeline is older than the epoch.
EARLIEST: Final = datetime(1970, 1, 1, tzinfo=UTC)

_RELATIVE_RE = re.compile(r"^(?P<sign>[-+])(?P<n>\d+(\.\d+)?)(?P<unit>[smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_NOW_KEY = "infra.user_time.now"


def parse_utc(text: str, now: datetime | None = None) -> datetime:
    """Parse a time a user typed into an aware UTC datetime: ISO-8601, ``now``, or relative like ``-2h``.

    :arg now: the instant ``now`` and relative times refer to (default: the clock).
    :raises ValueError: when it is none of these, with a message saying what is accepted.
    """
    text = text.strip()
    try:
        if text == "now" or _RELATIVE_RE.match(text):
            now = now or datetime.now(UTC)
            match = _RELATIVE_RE.match(text)
            if match is None:
                return now
            seconds = float(match["n"]) * _UNIT_S[match["unit"]]
            return now + timedelta(seconds=seconds if match["sign"] == "+" else -seconds)
        parsed = datetime.fromisoformat(text)
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        msg = f"{text!r} is not a time ({TIME_HELP})"
        raise ValueError(msg) from exc


class UtcTime(click.ParamType[datetime, Any]):
    """A time option of any CLI group (:func:`parse_utc`), from the epoch on, as an aware UTC datetime.

    ``now`` and relative times of one command refer to the same instant, so ``--start -2h --end now`` is two hours.
    """

    name = "time"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        """Parse the value or fail with a usage error."""
        if isinstance(value, datetime):
            return value
        now = ctx.find_root().meta.setdefault(_NOW_KEY, datetime.now(UTC)) if ctx is not None else None
        try:
            ts = parse_utc(str(value), now)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if ts < EARLIEST:
            self.fail(f"{value!r} is before {EARLIEST:%Y-%m-%d}: no event is that old", param, ctx)
        return ts


UTC_TIME: Final = UtcTime()
