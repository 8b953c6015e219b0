"""Parts of a day of the batch view: which runs of hours are kept merged, how they are merged, how they are read."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime
from typing import Any

import pytest

from batch_layer.publish import day_parts
from serving.plan import Span
from serving.read_schedule import ReadSchedule
from views import sketches
from views.buckets import DAY, HOUR, is_day_part
from views.store.pointers import fingerprint_of
from views.store.rows import ViewRow

D = date(2026, 5, 1)
T0 = datetime(2026, 5, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("start", "end", "kept"),
    [
        (0, 2, True),  # two hours from midnight
        (0, 23, True),
        (22, 24, True),  # two hours to midnight
        (1, 24, True),
        (0, 1, False),  # one hour: the hour's own row
        (0, 24, False),  # the whole day: the daily rollup
        (3, 7, False),  # inside the day
        (23, 25, False),  # across midnight
    ],
)
def test_a_part_is_a_run_of_two_hours_or_more_from_or_to_midnight(start: int, end: int, kept: bool) -> None:
    assert is_day_part(T0 + start * HOUR, T0 + end * HOUR) is kept


def test_a_part_at_a_minute_inside_an_hour_is_none() -> None:
    assert not is_day_part(T0 + HOUR / 2, T0 + 3 * HOUR)


def hour_row(h: int, events: int) -> ViewRow:
    hll, kll, fi = sketches.merge_all([])
    return ViewRow("*", T0 + h * HOUR, events, hll, kll, fi, T0 + h * HOUR, T0 + (h + 1) * HOUR - HOUR / 60)


def test_every_prefix_and_suffix_is_merged_from_the_current_hours() -> None:
    runs = {T0 + h * HOUR: uuid.uuid1() for h in range(24)}
    rows = [hour_row(h, h + 1) for h in range(24) if h != 5]  # hour 5 counted nothing for the slice
    parts = {(r.bucket_start, end): (fp, n, r) for _sl, _d, fp, n, r, end in day_parts("*", D, runs, rows)}
    assert len(parts) == 22 + 22
    for (first, end), (fp, n, r) in parts.items():
        hours = [h for h in range(24) if first <= T0 + h * HOUR < end]
        assert r.events == sum(h + 1 for h in hours if h != 5)
        assert n == sum(1 for h in hours if h != 5)
        assert fp == fingerprint_of({T0 + h * HOUR: runs[T0 + h * HOUR] for h in hours})
        assert r.min_ts == T0 + hours[0] * HOUR or hours[0] == 5
    assert (T0, T0 + DAY) not in parts and (T0, T0 + HOUR) not in parts


def test_no_part_spans_an_hour_without_a_current_run() -> None:
    runs = {T0 + h * HOUR: uuid.uuid1() for h in range(24) if h != 10}  # hour 10 not computed yet
    got = {(r.bucket_start, end) for *_x, r, end in day_parts("*", D, runs, [hour_row(h, 1) for h in range(24)])}
    assert got == {(T0, T0 + k * HOUR) for k in range(2, 11)} | {(T0 + k * HOUR, T0 + DAY) for k in range(11, 23)}
    today = {T0 + h * HOUR: uuid.uuid1() for h in range(6)}  # a day under way: its prefixes only
    got = {(r.bucket_start, end) for *_x, r, end in day_parts("*", D, today, [hour_row(h, 1) for h in range(6)])}
    assert got == {(T0, T0 + k * HOUR) for k in range(2, 7)}


class Statement:
    def __init__(self, name: str) -> None:
        self.name = name

    def bind(self, params: tuple[Any, ...]) -> Any:
        return type("Bound", (), {"name": self.name, "params": params, "fetch_size": 0})()


def test_runs_of_hours_at_a_day_edge_are_read_from_parts_and_the_rest_as_hours() -> None:
    runs = {D: {T0 + h * HOUR: uuid.uuid1() for h in range(24)}}
    stmts = {n: Statement(n) for n in ("hours", "part")}
    spans = [Span(T0 + h * HOUR, T0 + (h + 1) * HOUR, "batch", "hour") for h in (*range(0, 5), 8, 9, *range(15, 24))]
    for parts, want in (
        (True, [("part", 0, 5), ("hours", 8, 10), ("part", 15, 24)]),
        (False, [("hours", 0, 24)]),  # a series by the hour: one range read of its hours
    ):
        sched = ReadSchedule(None, stmts, None, "*", frozenset(), runs, parts=parts)  # type: ignore[arg-type]
        sched.hours(D, spans)
        got = sorted((u.request.name, u.request.params[2], u.request.params[3]) for u in sched.units)
        assert got == sorted((n, T0 + a * HOUR, T0 + b * HOUR) for n, a, b in want)


def test_a_part_of_other_runs_is_read_as_its_hours() -> None:
    """A part merged before an hour of it was recomputed names the old runs: the hours are read instead."""
    runs = {D: {T0 + h * HOUR: uuid.uuid1() for h in range(24)}}
    stmts = {n: Statement(n) for n in ("hours", "part")}
    current = runs[D]

    class Row:
        def __init__(self, **kw: Any) -> None:
            self.__dict__.update(kw)

    class Session:
        def execute(self, bound: Any, execution_profile: object = None) -> list[Row]:
            _sl, _day, first, end = bound.params
            return [
                Row(hour=first + i * HOUR, run_id=current[first + i * HOUR], events=1)
                for i in range(int((end - first) / HOUR))
            ]

    sched = ReadSchedule(Session(), stmts, None, "*", frozenset(), runs, parts=True)  # type: ignore[arg-type]
    sched.hours(D, [Span(T0 + h * HOUR, T0 + (h + 1) * HOUR, "batch", "hour") for h in range(3)])
    (unit,) = sched.units
    fp = fingerprint_of({T0 + h * HOUR: current[T0 + h * HOUR] for h in range(3)})
    got = unit.emit([Row(hour_runs=fp, events=30)])
    assert [(b.start, b.resolution, b.end, b.events) for b in got] == [(T0, "hours", T0 + 3 * HOUR, 30)]
    stale = unit.emit([Row(hour_runs="another", events=30)])
    assert [(b.start, b.resolution, b.events) for b in stale] == [(T0 + h * HOUR, "hour", 1) for h in range(3)]
