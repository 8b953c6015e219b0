"""Schemathesis hooks: the API's rules that span parameters, which OpenAPI cannot express, applied to the
positive cases Schemathesis generates (OAI/OpenAPI-Specification#256: inter-parameter dependencies).

They mirror what each operation's description states (serving.api.WINDOW_RULES): ``last`` or ``start`` and ``end``
together, a non-empty window of whole minutes no longer than ``serving.max_window_days``, at most
``serving.api.MAX_POINTS`` series points; the console's range of whole hours (serving.console.RANGE_RULES). Only
positive cases are touched: a negative case keeps the value that breaks its schema, and must be refused. Loaded by
``st run`` through ``SCHEMATHESIS_HOOKS``.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

import schemathesis

MAX_DAYS = int(os.environ.get("TRENDS_SERVING__MAX_WINDOW_DAYS", "31"))
MAX_POINTS = 10_000
LAST_UNITS = {"m": timedelta(minutes=1), "h": timedelta(hours=1), "d": timedelta(days=1)}


def _iso(t: datetime) -> str:
    """Format a time in its own offset, as the schema's pattern wants it (never crossing the years it allows)."""
    offset = t.strftime("%z")
    return t.strftime("%Y-%m-%dT%H:%M") + offset[:3] + ":" + offset[3:]


def _floor(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)  # offsets are whole minutes: this is the UTC floor too


def _window(query: dict[str, Any]) -> timedelta:
    """Make the window rules hold; return the window's length."""
    if "last" in query:
        query.pop("start", None)
        query.pop("end", None)
        text = str(query["last"])
        return int(text[:-1]) * LAST_UNITS[text[-1]]
    if ("start" in query) != ("end" in query):
        query.pop("start", None)
        query.pop("end", None)
    if "start" not in query:
        return timedelta(hours=1)  # the default window
    start = datetime.fromisoformat(str(query["start"]).replace("Z", "+00:00"))
    end = datetime.fromisoformat(str(query["end"]).replace("Z", "+00:00"))
    length = _floor(end) - _floor(start)
    if timedelta(0) < length <= timedelta(days=MAX_DAYS):
        return length
    later = start + timedelta(hours=1)
    if later.year <= 2999:
        query["end"] = _iso(later)
    else:
        query["start"], query["end"] = _iso(start - timedelta(hours=1)), query["start"]
    return timedelta(hours=1)


def _console_range(query: dict[str, Any]) -> None:
    """Make the console's range rules hold: start and end together, at most serving.console.MAX_HOURS whole hours."""
    from serving.console import MAX_HOURS  # the one home of the bound

    if ("start" in query) != ("end" in query):
        query.pop("start", None)
        query.pop("end", None)
    if "start" not in query:
        return  # the default range
    start = datetime.fromisoformat(str(query["start"]).replace("Z", "+00:00"))
    end = datetime.fromisoformat(str(query["end"]).replace("Z", "+00:00"))
    hours = -((start.timestamp() // 3600 * 3600 - end.timestamp()) // 3600)  # end rounded up, start floored
    if 0 < hours <= MAX_HOURS:
        return
    later = start + timedelta(hours=1)
    if later.year <= 2999:
        query["end"] = _iso(later)
    else:
        query["start"], query["end"] = _iso(start - timedelta(hours=1)), query["start"]


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    """Apply the rules spanning parameters to a positive case."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or not case.path.startswith("/api/v1/"):
        return case
    if case.path == "/api/v1/status":
        return case
    query = dict(case.query or {})
    if case.path == "/api/v1/console":
        _console_range(query)
        case.query = query
        return case
    length = _window(query)
    if case.path.endswith("/series") and query.get("resolution") == "minute":
        if length / timedelta(minutes=1) > MAX_POINTS:
            query["resolution"] = "hour"
    elif case.path.endswith("/series") and length / timedelta(hours=1) > MAX_POINTS:
        query["resolution"] = "day"
    case.query = query
    return case
