"""The merge rule against a brute-force reference, over random watermarks, coverage and windows (hypothesis)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.merge import plan
from views.buckets import DAY, HOUR, MINUTE, floor

T0 = datetime(2026, 5, 1, tzinfo=UTC)
HOURS = 24 * 4  # four days of possible coverage


def reference(start, end, boundary, batch_hours, fresh):  # type: ignore[no-untyped-def]
    """Minute by minute: who must serve it."""
    out = {}
    m = start
    while m < end:
        if boundary is not None and m < boundary:
            out[m] = "batch" if floor(m, HOUR) in batch_hours else "gap"
        else:
            out[m] = "speed" if fresh is not None and m < fresh else "gap"
        m += MINUTE
    return out


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
    fresh = draw(st.one_of(st.none(), st.integers(0, HOURS * 60 + 120).map(lambda m: T0 + m * MINUTE)))
    return start, end, boundary, batch_hours, current_days, fresh


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_every_minute_is_served_exactly_once_by_the_right_layer(scenario) -> None:  # type: ignore[no-untyped-def]
    start, end, boundary, batch_hours, current_days, fresh = scenario
    spans = plan(start, end, boundary, batch_hours, current_days, fresh)
    # contiguous, non-overlapping, covering exactly the window
    assert spans[0].start == start and spans[-1].end == end
    for a, b in itertools.pairwise(spans):
        assert a.end == b.start
    got = {m: s.layer for s in spans for m in s.minutes()}
    assert sum(1 for s in spans for _ in s.minutes()) == len(got)  # no minute twice
    assert got == reference(start, end, boundary, batch_hours, fresh)
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
    spans = plan(start, start + 7 * DAY, T0 + 8 * DAY, hours, days, None)
    kinds = [(s.layer, s.resolution) for s in spans]
    assert kinds.count(("batch", "day")) == 6
    assert len(spans) <= 6 + 24 + 2  # days, the edge hours, two partial hours of minutes


def test_rejects_bad_windows() -> None:
    with pytest.raises(ValueError, match="whole minutes"):
        plan(T0, T0, None, set(), set(), None)
    with pytest.raises(ValueError, match="whole minutes"):
        plan(T0 + timedelta(seconds=5), T0 + HOUR, None, set(), set(), None)
    with pytest.raises(ValueError, match="timezone"):
        plan(T0.replace(tzinfo=None), T0 + HOUR, None, set(), set(), None)


def test_series_resolution_limits_rollups() -> None:
    hours = {T0 + h * HOUR for h in range(48)}
    days = {T0.date(), (T0 + DAY).date()}
    spans = plan(T0, T0 + 2 * DAY, T0 + 2 * DAY, hours, days, None, coarsest="hour")
    assert {s.resolution for s in spans} == {"hour"}
    spans = plan(T0, T0 + 2 * HOUR, T0 + 2 * DAY, hours, days, None, coarsest="minute")
    assert {s.resolution for s in spans} == {"minute"}
