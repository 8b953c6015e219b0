"""The merge rule against a brute-force reference, over random watermarks, coverage and windows (hypothesis).

The speed side is drawn as the speed layer records it: epochs (checkpoint lifetimes) that count from a minute on
(or from the beginning) and have read up to another, hours whose rows are kept until some time or no longer known,
and events counted per minute; the reference decides each minute from those facts alone.
"""

from __future__ import annotations

import dataclasses
import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.plan import (
    NO_BATCH_RUN,
    NOT_YET_SEEN,
    SPEED_ROWS_GONE,
    STARTED_AFTER,
    STOPPED_INSIDE,
    Span,
    SpeedCoverage,
    plan,
    punch,
)
from views.buckets import DAY, HOUR, MINUTE, floor
from views.store.speed import Epoch

T0 = datetime(2026, 5, 1, tzinfo=UTC)
HOURS = 24 * 4  # four days of possible coverage
NOW = T0 + 5 * DAY
SEC = timedelta(seconds=1)


def live(fresh: datetime | None) -> SpeedCoverage:
    """One epoch from the beginning that has read up to ``fresh``, every hour's rows kept."""
    if fresh is None:
        return SpeedCoverage((), now=NOW)
    kept = {(T0 + h * HOUR, "e"): NOW + DAY for h in range(-24, HOURS + 48)}
    return SpeedCoverage((Epoch("e", T0 - DAY, None, fresh, first_hour=T0 - DAY),), kept, now=NOW)


def reference(start, end, boundary, batch_hours, speed):  # type: ignore[no-untyped-def]
    """Minute by minute: who must serve it, and why not when nobody does."""
    out = {}
    m = start
    newest = max(speed.epochs, key=lambda e: e.started_at, default=None)
    while m < end:
        if boundary is not None and m < boundary:
            out[m] = ("batch", "") if floor(m, HOUR) in batch_hours else ("gap", NO_BATCH_RUN)
        else:
            owners = [
                e for e in speed.epochs if (e.covered_from or e.first_hour) and (e.covered_from or e.first_hour) <= m
            ]
            owner = max(owners, key=lambda e: e.started_at) if owners else None
            fresh = speed.fresh_until
            if fresh is None or m >= fresh:
                out[m] = ("gap", NOT_YET_SEEN)
            elif owner is None:
                out[m] = ("gap", STARTED_AFTER)
            elif owner.seen_until is None or m >= owner.seen_until:
                out[m] = ("gap", NOT_YET_SEEN if owner is newest else STARTED_AFTER)
            elif unread_reason(speed, owner, m):
                out[m] = ("gap", unread_reason(speed, owner, m))
            else:
                kept = speed.kept.get((floor(m, HOUR), owner.id))
                out[m] = ("speed", "") if kept is not None and kept > speed.now else ("gap", SPEED_ROWS_GONE)
        m += MINUTE
    return out


def unread_reason(speed: SpeedCoverage, owner: Epoch, m: datetime) -> str:
    """Whether the owner has read the minute to its end, stated as the docs state it (not as the code computes it)."""
    if speed.live_within is None or speed.now is None:
        return ""
    read_all = owner.read_all_at
    if read_all is not None and read_all >= m + MINUTE:
        return ""  # everything the topic held at the minute's end was read
    if read_all is None:
        return NOT_YET_SEEN
    if speed.now - read_all > speed.live_within:
        return STOPPED_INSIDE
    return "" if m <= speed.now < m + MINUTE or m > speed.now else NOT_YET_SEEN  # under way (or ahead): live


@st.composite
def speed_coverages(draw):  # type: ignore[no-untyped-def]
    """Zero to three epochs, started in turn, each counting from its start (or the beginning), with kept hours."""
    epochs = []
    t = -24 * 60
    for i in range(draw(st.integers(0, 3))):
        t += draw(st.integers(0, HOURS * 60 // 2))
        covered = None if i == 0 and draw(st.booleans()) else T0 + t * MINUTE
        seen = draw(st.one_of(st.none(), st.integers(0, HOURS * 60 // 2).map(lambda d, t=t: T0 + (t + d) * MINUTE)))
        first = None if seen is None else floor(T0 + (t + draw(st.integers(-120, 120))) * MINUTE, HOUR)
        read_all = draw(st.one_of(st.none(), st.integers(0, HOURS * 3600).map(lambda d: T0 + timedelta(seconds=d))))
        epochs.append(
            Epoch(f"e{i}", T0 + t * MINUTE + i * timedelta(seconds=1), covered, seen, first_hour=first,
                  read_all_at=read_all)
        )  # fmt: skip
    kept = {}
    for e in epochs:
        for h in draw(st.sets(st.integers(-24, HOURS + 24), max_size=HOURS + 48)):
            kept[(T0 + h * HOUR, e.id)] = draw(st.sampled_from([None, NOW - HOUR, NOW + DAY]))
    live_within = draw(st.sampled_from([None, timedelta(seconds=30), timedelta(minutes=90)]))
    now = draw(st.one_of(st.just(NOW), st.integers(0, HOURS * 3600).map(lambda d: T0 + timedelta(seconds=d))))
    return SpeedCoverage(tuple(epochs), kept, now=now, live_within=live_within)


@st.composite
def scenarios(draw):  # type: ignore[no-untyped-def]
    boundary_h = draw(st.one_of(st.none(), st.integers(0, HOURS)))
    boundary = None if boundary_h is None else T0 + boundary_h * HOUR
    covered = draw(st.sets(st.integers(0, HOURS - 1), max_size=HOURS))
    if draw(st.booleans()) and boundary_h:  # often: a contiguous range below the boundary, as the watermark gives
        low = draw(st.integers(0, boundary_h))
        covered |= set(range(low, boundary_h))
    batch_hours = {T0 + h * HOUR for h in covered if boundary is None or T0 + h * HOUR < boundary}
    current_days = {(T0 + d * DAY).date() for d in range(4) if draw(st.booleans())}
    start = T0 + draw(st.integers(0, HOURS * 60 - 1)) * MINUTE
    end = start + draw(st.integers(1, HOURS * 60)) * MINUTE
    if draw(st.booleans()):
        speed = live(draw(st.one_of(st.none(), st.integers(0, HOURS * 60 + 120).map(lambda m: T0 + m * MINUTE))))
    else:
        speed = draw(speed_coverages())
    return start, end, boundary, batch_hours, current_days, speed


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_every_minute_is_served_exactly_once_by_the_right_layer(scenario) -> None:  # type: ignore[no-untyped-def]
    start, end, boundary, batch_hours, current_days, speed = scenario
    spans = plan(start, end, boundary, batch_hours, current_days, speed)
    # contiguous, non-overlapping, covering exactly the window
    assert spans[0].start == start and spans[-1].end == end
    for a, b in itertools.pairwise(spans):
        assert a.end == b.start
    got = {m: (s.layer, s.reason) for s in spans for m in s.minutes()}
    assert sum(1 for s in spans for _ in s.minutes()) == len(got)  # no minute twice
    assert got == reference(start, end, boundary, batch_hours, speed)
    for s in spans:
        if s.layer == "batch" and s.resolution == "day":
            assert s.start.date() in current_days and s.end - s.start == DAY
        if s.layer == "batch" and s.resolution == "hour":
            assert s.start == floor(s.start, HOUR) and s.end - s.start == HOUR
        if boundary is not None and s.layer == "batch":
            assert s.end <= boundary
        if boundary is not None and s.layer == "speed":
            assert s.start >= boundary


def test_long_windows_use_rollups() -> None:
    hours = {T0 + h * HOUR for h in range(24 * 8)}
    days = {(T0 + d * DAY).date() for d in range(8)}
    start = T0 + 30 * MINUTE
    spans = plan(start, start + 7 * DAY, T0 + 8 * DAY, hours, days, live(None))
    kinds = [(s.layer, s.resolution) for s in spans]
    assert kinds.count(("batch", "day")) == 6
    assert len(spans) <= 6 + 24 + 2  # days, the edge hours, two partial hours of minutes


def test_rejects_bad_windows() -> None:
    with pytest.raises(ValueError, match="whole minutes"):
        plan(T0, T0, None, set(), set(), live(None))
    with pytest.raises(ValueError, match="whole minutes"):
        plan(T0 + timedelta(seconds=5), T0 + HOUR, None, set(), set(), live(None))
    with pytest.raises(ValueError, match="timezone"):
        plan(T0.replace(tzinfo=None), T0 + HOUR, None, set(), set(), live(None))


def test_series_resolution_limits_rollups() -> None:
    hours = {T0 + h * HOUR for h in range(48)}
    days = {T0.date(), (T0 + DAY).date()}
    spans = plan(T0, T0 + 2 * DAY, T0 + 2 * DAY, hours, days, live(None), coarsest="hour")
    assert {s.resolution for s in spans} == {"hour"}
    spans = plan(T0, T0 + 2 * HOUR, T0 + 2 * DAY, hours, days, live(None), coarsest="minute")
    assert {s.resolution for s in spans} == {"minute"}


def test_each_missing_speed_minute_is_a_gap_with_its_reason() -> None:
    """The four faults the speed side can have, in one window, each a gap with its own reason."""
    old = Epoch("old", T0 - DAY, None, T0 + 40 * MINUTE, first_hour=T0)  # its checkpoint was lost at T0+40
    new = Epoch("new", T0 + 50 * MINUTE, T0 + 61 * MINUTE, T0 + 150 * MINUTE)  # started at `latest` at T0+50
    kept = {(T0, "old"): NOW + DAY, (T0 + HOUR, "new"): NOW + DAY, (T0 + 2 * HOUR, "new"): NOW - HOUR}
    speed = SpeedCoverage((old, new), kept, {("new", T0 + 70 * MINUTE): 5}, NOW)
    spans = plan(T0 - HOUR, T0 + 3 * HOUR, T0 - HOUR, set(), set(), speed)
    got = [(s.layer, s.reason, s.start, s.end) for s in spans]
    assert got.pop(0) == ("gap", STARTED_AFTER, T0 - HOUR, T0)  # before anything the oldest epoch wrote
    spans = spans[1:]
    assert got == [
        ("speed", "", T0, T0 + 40 * MINUTE),
        ("gap", STARTED_AFTER, T0 + 40 * MINUTE, T0 + 61 * MINUTE),
        ("speed", "", T0 + 61 * MINUTE, T0 + 2 * HOUR),
        ("gap", SPEED_ROWS_GONE, T0 + 2 * HOUR, T0 + 150 * MINUTE),  # rows written over a TTL ago
        ("gap", NOT_YET_SEEN, T0 + 150 * MINUTE, T0 + 3 * HOUR),
    ]
    assert speed.expected(T0 + 70 * MINUTE) == 5 and speed.expected(T0 + 71 * MINUTE) == 0
    # the row the speed layer counted 5 events in is not in the view: that minute becomes a gap, nothing else moves
    punched = punch(spans, [T0 + 70 * MINUTE])
    assert [(s.layer, s.start, s.end) for s in punched[2:5]] == [
        ("speed", T0 + 61 * MINUTE, T0 + 70 * MINUTE),
        ("gap", T0 + 70 * MINUTE, T0 + 71 * MINUTE),
        ("speed", T0 + 71 * MINUTE, T0 + 2 * HOUR),
    ]
    assert punched[3].reason == SPEED_ROWS_GONE
    assert sum(1 for s in punched for _ in s.minutes()) == 180


def test_punch_leaves_batch_spans_and_uncounted_minutes_alone() -> None:
    spans = [Span(T0, T0 + HOUR, "batch", "hour"), Span(T0 + HOUR, T0 + 2 * HOUR, "speed", "minute")]
    assert punch(spans, []) == spans
    assert punch(spans, [T0 + 5 * MINUTE]) == spans  # a batch minute is never punched


def test_a_minute_the_epoch_has_not_read_to_its_end_is_live_while_under_way_else_a_gap() -> None:
    """The job dies 40 s into 10:05 (its checkpoint lost, a kill): what it read of 10:05 is never a whole minute."""
    t = T0 + 10 * HOUR
    kept = {(t, "e"): t + DAY}
    died = Epoch("e", t - HOUR, t - HOUR, t + 6 * MINUTE, first_hour=t - HOUR, read_all_at=t + 5 * MINUTE + 38 * SEC)

    def reasons(now: datetime) -> list[tuple[str, str, datetime, datetime]]:
        speed = SpeedCoverage((died,), kept, now=now, live_within=30 * SEC)
        return [(s.layer, s.reason, s.start, s.end) for s in plan(t, t + 6 * MINUTE, t - HOUR, set(), set(), speed)]

    # the job reads on (a trigger 2 s ago found nothing new): 10:05 is the live minute, answered as read so far
    assert reasons(t + 5 * MINUTE + 40 * SEC) == [("speed", "", t, t + 6 * MINUTE)]
    # 10:05 is over and the job has not read everything since: what it holds of 10:05 is not the whole minute
    assert reasons(t + 6 * MINUTE + 1 * SEC) == [
        ("speed", "", t, t + 5 * MINUTE), ("gap", NOT_YET_SEEN, t + 5 * MINUTE, t + 6 * MINUTE)
    ]  # fmt: skip
    # still under way, but nothing read for longer than live_within: the job stopped (or fell behind) inside it
    early = dataclasses.replace(died, read_all_at=t + 5 * MINUTE + 10 * SEC)
    speed = SpeedCoverage((early,), kept, now=t + 5 * MINUTE + 50 * SEC, live_within=30 * SEC)
    assert [(s.layer, s.reason, s.start) for s in plan(t, t + 6 * MINUTE, t - HOUR, set(), set(), speed)][-1] == (
        "gap", STOPPED_INSIDE, t + 5 * MINUTE
    )  # fmt: skip
    # read to its end (a trigger after 10:06 found nothing new, or a batch read up to the latest offsets)
    read = dataclasses.replace(died, read_all_at=t + 6 * MINUTE + 2 * SEC)
    speed = SpeedCoverage((read,), kept, now=t + HOUR, live_within=30 * SEC)
    assert [(s.layer, s.start, s.end) for s in plan(t, t + 6 * MINUTE, t - HOUR, set(), set(), speed)] == [
        ("speed", t, t + 6 * MINUTE)
    ]
    # an epoch that never read the whole topic (catching up from the watermark): nothing is a whole minute yet
    catching = dataclasses.replace(died, read_all_at=None)
    speed = SpeedCoverage((catching,), kept, now=t + 5 * MINUTE, live_within=30 * SEC)
    assert [(s.layer, s.reason) for s in plan(t, t + 6 * MINUTE, t - HOUR, set(), set(), speed)] == [
        ("gap", NOT_YET_SEEN)
    ]
