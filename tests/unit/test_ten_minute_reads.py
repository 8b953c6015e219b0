"""Which rows a span is read from (ten-minute rows or minutes), and when a speed rollup may answer (no Cassandra)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from serving.lru import RowCache
from serving.plan import Span, SpeedCoverage
from serving.read_schedule import ReadSchedule
from serving.served_row import ServedRow
from views import sketches
from views.buckets import HOUR, MINUTE, SPEED_ROLLUP
from views.store.rollups import edges, todo_interval, todo_key
from views.store.rows import ViewRow
from views.store.speed import Epoch

T0 = datetime(2026, 5, 1, 10, tzinfo=UTC)


class Bound:
    def __init__(self, name: str, params: tuple[Any, ...]) -> None:
        self.name, self.params, self.fetch_size = name, params, 0


class Statement:
    def __init__(self, name: str) -> None:
        self.name = name

    def bind(self, params: tuple[Any, ...]) -> Bound:
        return Bound(self.name, params)


def reads(span: Span, rollups_until: datetime | None, cov: SpeedCoverage | None = None) -> list[tuple[str, Any, Any]]:
    """Return the reads a speed span is scheduled as: (statement, first, last)."""
    stmts = {n: Statement(n) for n in ("speed", "rollups")}
    cov = cov if cov is not None else SpeedCoverage(())
    sched = ReadSchedule(None, stmts, None, "*", frozenset(), {}, "q", cov, rollups_until)  # type: ignore[arg-type]
    sched.speed(span)
    return [(u.request.name, u.request.params[3], u.request.params[4]) for u in sched.units]


def test_a_span_reads_rollups_of_its_whole_closed_intervals_and_minutes_at_its_edges() -> None:
    span = Span(T0 + 7 * MINUTE, T0 + 57 * MINUTE, "speed", "minute")
    assert reads(span, T0 + 45 * MINUTE) == [
        ("speed", T0 + 7 * MINUTE, T0 + 10 * MINUTE),
        ("rollups", T0 + 10 * MINUTE, T0 + 40 * MINUTE),  # 40-50 is not closed by 45
        ("speed", T0 + 40 * MINUTE, T0 + 57 * MINUTE),
    ]
    aligned = Span(T0, T0 + 30 * MINUTE, "speed", "minute")
    assert reads(aligned, T0 + 30 * MINUTE) == [("rollups", T0, T0 + 30 * MINUTE)]


@pytest.mark.parametrize(
    ("start", "end", "until"),
    [(5, 15, 60), (0, 9, 60), (0, 60, None), (0, 60, 9)],
    ids=["no whole interval", "shorter than one", "rollups off", "none closed"],
)
def test_a_span_without_a_whole_closed_interval_reads_minutes(start: int, end: int, until: int | None) -> None:
    span = Span(T0 + start * MINUTE, T0 + end * MINUTE, "speed", "minute")
    closed = T0 + until * MINUTE if until is not None else None
    assert reads(span, closed) == [("speed", span.start, span.end)]


def test_a_span_across_midnight_is_read_a_day_at_a_time() -> None:
    midnight = datetime(2026, 5, 2, tzinfo=UTC)
    span = Span(midnight - 25 * MINUTE, midnight + 25 * MINUTE, "speed", "minute")
    assert reads(span, midnight + HOUR) == [
        ("speed", midnight - 25 * MINUTE, midnight - 20 * MINUTE),
        ("rollups", midnight - 20 * MINUTE, midnight),
        ("rollups", midnight, midnight + 20 * MINUTE),
        ("speed", midnight + 20 * MINUTE, midnight + 25 * MINUTE),
    ]


def coverage(counts: dict[datetime, int], epochs: Iterable[Epoch] | None = None) -> SpeedCoverage:
    epochs = tuple(epochs) if epochs is not None else (Epoch("a", T0 - HOUR, None, T0 + HOUR, first_hour=T0),)
    return SpeedCoverage(epochs, counted={("a", m): n for m, n in counts.items()})


def test_a_rollup_answers_only_for_the_epoch_owning_it_with_exactly_what_it_counted() -> None:
    counts = {T0 + i * MINUTE: 3 for i in range(10)}
    cov = coverage(counts)
    assert cov.rollup_matches(T0, T0 + SPEED_ROLLUP, "a", 30)
    assert not cov.rollup_matches(T0, T0 + SPEED_ROLLUP, "a", 27)  # merged while a minute was missing
    assert not cov.rollup_matches(T0, T0 + SPEED_ROLLUP, "a", 33)  # more than was counted
    assert not cov.rollup_matches(T0, T0 + SPEED_ROLLUP, "b", 30)  # another epoch's rows
    newer = Epoch("b", T0, T0 + 5 * MINUTE, T0 + HOUR)  # a new epoch counting from inside the interval
    split = coverage(counts, (Epoch("a", T0 - HOUR, None, T0 + HOUR, first_hour=T0), newer))
    assert not split.rollup_matches(T0, T0 + SPEED_ROLLUP, "a", 30)


def test_a_rollup_not_matching_is_read_as_its_minutes() -> None:
    """The rollup unit's rows: a matching rollup as one bucket, the other intervals' minutes read at once."""
    counts = {T0 + i * MINUTE: 2 for i in range(20)}
    stmts = {n: Statement(n) for n in ("speed", "rollups")}

    class Row:
        def __init__(self, start: datetime, events: int, width: int = 10, epoch: str = "a") -> None:
            self.bucket_start, self.events, self.width_min, self.epoch = start, events, width, epoch

    class Session:
        def execute(self, bound: Bound, execution_profile: object = None) -> list[Row]:
            first, last = bound.params[3], bound.params[4]
            return [Row(first + i * MINUTE, 2) for i in range(int((last - first) / MINUTE))]

    sched = ReadSchedule(Session(), stmts, None, "*", frozenset(), {}, "q", coverage(counts), T0 + HOUR)  # type: ignore[arg-type]
    sched.speed(Span(T0, T0 + 20 * MINUTE, "speed", "minute"))
    (unit,) = sched.units
    got: list[ServedRow] = list(unit.emit([Row(T0, 20), Row(T0 + SPEED_ROLLUP, 19)]))
    assert [(b.start, b.resolution, b.events) for b in got[:2]] == [(T0, "10min", 20), (T0 + SPEED_ROLLUP, "minute", 2)]
    assert len(got) == 11 and list(got[0].minutes()) == [T0 + i * MINUTE for i in range(10)]


def test_an_interval_to_merge_is_kept_as_text_and_read_back() -> None:
    interval = ("origin=a b", T0 + SPEED_ROLLUP)
    assert todo_interval(todo_key(interval)) == interval


def batch_reads(span: Span, tens: frozenset[datetime], cached: bool = False) -> list[tuple[str, Any, Any]]:
    stmts = {n: Statement(n) for n in ("minutes", "tens")}
    runs = {T0.date(): {T0: "run"}}
    cache = RowCache(1 << 20) if cached else None
    sched = ReadSchedule(None, stmts, cache, "*", frozenset(), runs, "q", None, None, tens)  # type: ignore[arg-type]
    sched.minutes(span)
    return [(u.request.name, u.request.params[3], u.request.params[4]) for u in sched.units]


def test_a_batch_span_reads_the_ten_minute_rows_of_runs_that_wrote_them() -> None:
    span = Span(T0 + 7 * MINUTE, T0 + 43 * MINUTE, "batch", "minute")
    assert batch_reads(span, frozenset({T0})) == [
        ("minutes", T0 + 7 * MINUTE, T0 + 10 * MINUTE),
        ("tens", T0 + 10 * MINUTE, T0 + 40 * MINUTE),
        ("minutes", T0 + 40 * MINUTE, T0 + 43 * MINUTE),
    ]
    assert batch_reads(span, frozenset()) == [("minutes", span.start, span.end)]  # a run from before: minutes
    short = Span(T0 + 12 * MINUTE, T0 + 19 * MINUTE, "batch", "minute")
    assert batch_reads(short, frozenset({T0})) == [("minutes", short.start, short.end)]
    # with the row cache, the hour's tens are read whole and kept under the run; the edges alone, not kept
    assert batch_reads(span, frozenset({T0}), cached=True) == [
        ("minutes", T0 + 7 * MINUTE, T0 + 10 * MINUTE),
        ("tens", T0, T0 + HOUR),
        ("minutes", T0 + 40 * MINUTE, T0 + 43 * MINUTE),
    ]


@pytest.mark.parametrize("fresh_min", [40, 41, 49, 50])
def test_rollups_are_read_only_where_the_job_has_surely_merged_them(fresh_min: int) -> None:
    """The job's watermark is the lateness behind its newest event, which may be the first instant of the minute
    before ``fresh_until``: only the intervals ending by then are surely merged. The interval ending exactly at
    ``fresh_until`` less the lateness may not be (its rollup looked up would miss: a second read), and the minutes
    the answer cache keeps as settled end at the same time, so both read the same rows.
    """
    fresh = T0 + fresh_min * MINUTE
    cov = SpeedCoverage((Epoch("a", T0 - HOUR, None, fresh, first_hour=T0),))
    final = cov.final_until(600)
    assert final == fresh - MINUTE - 10 * MINUTE  # the worst watermark: the newest event at fresh - 1 min
    rolled = [(a, b) for name, a, b in reads(Span(T0, fresh, "speed", "minute"), final) if name == "rollups"]
    assert rolled == [(T0, T0 + ((fresh_min - 11) // 10) * SPEED_ROLLUP)]
    assert SpeedCoverage(()).final_until(600) is None


def live_reads(span: Span, counts: dict[datetime, int]) -> list[tuple[str, Any, Any]]:
    """Return the reads of a speed span with the rollups of open intervals (speed.live_rollups) on."""
    stmts = {n: Statement(n) for n in ("speed", "rollups")}
    sched = ReadSchedule(None, stmts, None, "*", frozenset(), {}, "q", coverage(counts), None, live=True)  # type: ignore[arg-type]
    sched.speed(span)
    return [(u.request.name, u.request.params[3], u.request.params[4]) for u in sched.units]


def test_live_rollups_serve_open_intervals_and_the_newest_one_a_window_ends_inside() -> None:
    """Every interval has a rollup, open ones too; the one a span ends inside serves only if nothing came after."""
    span = Span(T0 + 7 * MINUTE, T0 + 57 * MINUTE, "speed", "minute")
    upto = {T0 + i * MINUTE: 1 for i in range(57)}  # the newest minute counted is the span's last: a window ending now
    assert live_reads(span, upto) == [
        ("speed", T0 + 7 * MINUTE, T0 + 10 * MINUTE),
        ("rollups", T0 + 10 * MINUTE, T0 + HOUR),
    ]
    later = {**upto, T0 + 58 * MINUTE: 1}  # a minute after the span's end in its interval: that one is read as minutes
    assert live_reads(span, later) == [
        ("speed", T0 + 7 * MINUTE, T0 + 10 * MINUTE),
        ("rollups", T0 + 10 * MINUTE, T0 + 50 * MINUTE),
        ("speed", T0 + 50 * MINUTE, T0 + 57 * MINUTE),
    ]
    assert live_reads(Span(T0 + 3 * MINUTE, T0 + 9 * MINUTE, "speed", "minute"), upto) == [
        ("speed", T0 + 3 * MINUTE, T0 + 9 * MINUTE)  # inside one interval: minutes
    ]


def test_a_newest_rollup_not_matching_reads_only_the_minutes_of_the_span() -> None:
    """The rollup of the interval a span ends inside, stale (a batch wrote minutes since): the span's minutes alone."""
    counts = {T0 + i * MINUTE: 2 for i in range(15)}
    stmts = {n: Statement(n) for n in ("speed", "rollups")}
    asked: list[tuple[datetime, datetime]] = []

    class Row:
        def __init__(self, start: datetime, events: int) -> None:
            self.bucket_start, self.events, self.width_min, self.epoch = start, events, 10, "a"

    class Session:
        def execute(self, bound: Bound, execution_profile: object = None) -> list[Row]:
            first, last = bound.params[3], bound.params[4]
            asked.append((first, last))
            return [Row(first + i * MINUTE, 2) for i in range(int((last - first) / MINUTE))]

    cov = coverage(counts)
    sched = ReadSchedule(Session(), stmts, None, "*", frozenset(), {}, "q", cov, None, live=True)  # type: ignore[arg-type]
    sched.speed(Span(T0, T0 + 15 * MINUTE, "speed", "minute"))
    (unit,) = sched.units
    assert (unit.request.params[3], unit.request.params[4]) == (T0, T0 + 20 * MINUTE)
    got = list(unit.emit([Row(T0, 20), Row(T0 + SPEED_ROLLUP, 8)]))  # 8: merged before the newest minutes' batch
    assert asked == [(T0 + SPEED_ROLLUP, T0 + 15 * MINUTE)]
    assert [(b.start, b.resolution) for b in got] == [(T0, "10min")] + [
        (T0 + i * MINUTE, "minute") for i in range(10, 15)
    ]
    fresh = list(unit.emit([Row(T0, 20), Row(T0 + SPEED_ROLLUP, 10)]))  # rewritten after that batch: one row
    assert [(b.start, b.resolution) for b in fresh] == [(T0, "10min"), (T0 + SPEED_ROLLUP, "10min")]


def edge_reads(span: Span, until: datetime, now: datetime, ttl: timedelta = HOUR) -> list[tuple[str, Any, Any]]:
    """Return the reads of a speed span with the edges of closed intervals kept ``ttl`` (speed.edge_ttl_s)."""
    stmts = {n: Statement(n) for n in ("speed", "rollups", "edge")}
    cov = SpeedCoverage((Epoch("a", T0 - HOUR, None, T0 + HOUR, first_hour=T0),), now=now)
    sched = ReadSchedule(None, stmts, None, "*", frozenset(), {}, "q", cov, until, edge_ttl=ttl)  # type: ignore[arg-type]
    sched.speed(span)
    return [(u.request.name, u.request.params[3], u.request.params[4]) for u in sched.units]


def test_the_edges_of_closed_intervals_are_one_row_each() -> None:
    span = Span(T0 + 7 * MINUTE, T0 + 43 * MINUTE, "speed", "minute")
    assert edge_reads(span, T0 + HOUR, T0 + HOUR) == [
        ("edge", T0 + 7 * MINUTE, 3),  # the suffix of 0:00-0:10 from 0:07 (first minute, minutes)
        ("rollups", T0 + 10 * MINUTE, T0 + 40 * MINUTE),
        ("edge", T0 + 40 * MINUTE, 3),  # the prefix of 0:40-0:50 to 0:43
    ]
    # the right edge's interval not surely merged yet: its minutes
    assert edge_reads(span, T0 + 45 * MINUTE, T0 + HOUR)[-1] == ("speed", T0 + 40 * MINUTE, T0 + 43 * MINUTE)
    # the left edge's interval merged longer ago than its edges are kept: its minutes
    late = T0 + HOUR + 10 * MINUTE
    assert edge_reads(span, T0 + HOUR, late)[0] == ("speed", T0 + 7 * MINUTE, T0 + 10 * MINUTE)
    # one minute is its own row
    one = Span(T0 + 9 * MINUTE, T0 + 41 * MINUTE, "speed", "minute")
    assert [r[0] for r in edge_reads(one, T0 + HOUR, T0 + HOUR)] == ["speed", "rollups", "speed"]


def test_an_edge_answers_only_with_what_its_minutes_counted() -> None:
    counts = {T0 + i * MINUTE: 2 for i in range(20)}
    stmts = {n: Statement(n) for n in ("speed", "rollups", "edge")}

    class Row:
        def __init__(self, start: datetime, events: int, epoch: str = "a") -> None:
            self.bucket_start, self.events, self.width_min, self.epoch = start, events, 10, epoch

    class Session:
        def execute(self, bound: Bound, execution_profile: object = None) -> list[Row]:
            first, last = bound.params[3], bound.params[4]
            return [Row(first + i * MINUTE, 2) for i in range(int((last - first) / MINUTE))]

    cov = dataclasses.replace(coverage(counts), now=T0 + HOUR)
    sched = ReadSchedule(Session(), stmts, None, "*", frozenset(), {}, "q", cov, T0 + HOUR, edge_ttl=HOUR)  # type: ignore[arg-type]
    sched.speed(Span(T0 + 6 * MINUTE, T0 + 20 * MINUTE, "speed", "minute"))
    edge = next(u for u in sched.units if u.request.name == "edge")
    (got,) = edge.emit([Row(T0 + 6 * MINUTE, 8)])
    assert (got.start, got.resolution, got.end, got.events) == (T0 + 6 * MINUTE, "minutes", T0 + 10 * MINUTE, 8)
    short = list(edge.emit([Row(T0 + 6 * MINUTE, 6)]))  # merged while a minute was missing: the minutes
    assert [(b.start, b.resolution) for b in short] == [(T0 + i * MINUTE, "minute") for i in range(6, 10)]
    assert [b.resolution for b in edge.emit([Row(T0 + 6 * MINUTE, 8, "b")])] == ["minute"] * 4  # another epoch's


def test_an_intervals_edges_are_its_prefixes_and_suffixes_of_two_minutes_or_more() -> None:
    hll, kll, fi = sketches.merge_all([])
    rows = [ViewRow("*", T0 + i * MINUTE, i + 1, hll, kll, fi, T0 + i * MINUTE, T0 + i * MINUTE) for i in range(10)]
    got = {
        (first, k): merged[0] for first, k, merged in edges(T0, [r for r in rows if r.bucket_start != T0 + 4 * MINUTE])
    }
    assert len(got) == 8 + 8
    for (first, k), events in got.items():
        assert events == sum(i + 1 for i in range(10) if first <= T0 + i * MINUTE < first + k * MINUTE and i != 4)
    assert (T0, 2) in got and (T0 + 8 * MINUTE, 2) in got and (T0 + MINUTE, 9) in got and (T0, 9) in got
