"""The console's pure parts: the range rules, the horizon (the same rule as the indexer's), the backfill summary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving import params
from serving.console import MAX_HOURS, SpeedMinute, hour_range, segments_of
from serving.console_sources import backfill_progress
from views.buckets import HOUR, MINUTE
from views.store.index import IndexedPartition, PartitionState, dt_to_ms, index_horizon

NOW = datetime(2026, 5, 1, 10, 17, tzinfo=UTC)


def test_the_range_is_whole_hours_and_bounded() -> None:
    assert hour_range(None, None, NOW) == (datetime(2026, 5, 1, 5, tzinfo=UTC), datetime(2026, 5, 1, 11, tzinfo=UTC))
    assert hour_range("2026-05-01T08:30Z", "2026-05-01T09:10Z", NOW) == (
        datetime(2026, 5, 1, 8, tzinfo=UTC),
        datetime(2026, 5, 1, 10, tzinfo=UTC),
    )
    assert hour_range("2026-05-01T08:00Z", "2026-05-03T08:00Z", NOW)[1] == datetime(2026, 5, 3, 8, tzinfo=UTC)
    h = datetime(2026, 5, 1, 8, tzinfo=UTC)
    for start, end, hours in [
        ("2026-05-01T08:00Z", None, (h, h + 6 * HOUR)),  # start alone: the default hours from it
        (None, "2026-05-01T08:00Z", (h - 6 * HOUR, h)),  # end alone: the default hours up to it
        ("2026-05-01T08:00Z", "2026-05-01T08:00Z", (h, h + HOUR)),  # within one hour: that hour
        ("2026-05-01T09:30Z", "2026-05-01T08:10Z", (h, h + 2 * HOUR)),  # backwards: the same range
        ("2026-05-01T08:00Z", "2026-05-03T08:01Z", (h + 49 * HOUR - MAX_HOURS * HOUR, h + 49 * HOUR)),  # its last
    ]:
        assert hour_range(start, end, NOW) == hours, (start, end)
    with pytest.raises(params.BadQueryError, match="no time zone"):
        hour_range("2026-05-01T08:00", "2026-05-01T09:00Z", NOW)


IDLE = timedelta(minutes=10)


def at(hour: int, minute: int, second: int = 0) -> datetime:
    return datetime(2026, 5, 1, hour, minute, second, tzinfo=UTC)


Part = tuple[int, datetime | None, datetime | None]  # partition, newest record time, when the index last saw one


def both_horizons(parts: list[Part], idle: timedelta) -> list[tuple[datetime | None, int | None, tuple[int, ...]]]:
    """Return the horizon of ``parts`` as the console reads them (index rows) and as the indexer holds them (states)."""
    ours = index_horizon([IndexedPartition(p, 0, max_ts, seen, None) for p, max_ts, seen in parts], NOW, idle)
    states = [PartitionState(p, 0, None if max_ts is None else dt_to_ms(max_ts), seen) for p, max_ts, seen in parts]
    theirs = index_horizon(states, NOW, idle)
    assert ours.newest == theirs.newest == {p: max_ts for p, max_ts, _ in parts}
    return [(h.closed_at, h.held_by, h.idle) for h in (ours, theirs)]


@pytest.mark.parametrize(
    ("parts", "want"),
    [
        ([], (None, None, ())),
        ([(0, None, None), (1, None, at(10, 16))], (None, None, ())),  # nothing indexed yet
        ([(0, at(10, 0), at(10, 15)), (1, at(10, 5), at(10, 16))], (at(10, 0), 0, ())),  # the oldest active one
        ([(0, at(10, 5), at(10, 16)), (1, at(10, 0), at(10, 15))], (at(10, 0), 1, ())),
        ([(3, at(10, 0), at(10, 16)), (1, at(10, 0), at(10, 16))], (at(10, 0), 1, ())),  # a tie: the lower partition
        ([(0, at(10, 0), at(9, 50)), (1, at(10, 5), at(10, 16))], (at(10, 5), 1, (0,))),  # idle: not holding back
        ([(0, at(10, 0), at(10, 7)), (1, at(10, 5), at(10, 16))], (at(10, 0), 0, ())),  # idle_after ago: active
        ([(0, at(10, 0), at(10, 6, 59)), (1, at(10, 5), at(10, 16))], (at(10, 5), 1, (0,))),  # a second more: idle
        ([(0, at(10, 0), None), (1, at(10, 5), at(10, 16))], (at(10, 5), 1, (0,))),  # never seen growing: idle
        ([(0, at(9, 0), at(9, 30)), (1, at(9, 10), at(9, 40))], (at(10, 7), None, (0, 1))),  # all idle: now - idle
        ([(0, at(10, 12), at(10, 0)), (1, at(9, 0), at(9, 0))], (at(10, 12), None, (0, 1))),  # or the newest record
        ([(0, at(10, 30), at(10, 16))], (NOW, 0, ())),  # a record from the future: never ahead of now
        ([(0, at(10, 30), at(9, 0))], (NOW, None, (0,))),
    ],
)
def test_the_horizon_follows_the_active_partitions(
    parts: list[Part], want: tuple[datetime | None, int | None, tuple[int, ...]]
) -> None:
    """serving may not import the batch layer: views.store.index holds the rule, batch_layer.horizon uses it."""
    assert both_horizons(parts, IDLE) == [want, want]


times = st.none() | st.integers(0, 4 * 3600).map(lambda s: NOW - timedelta(seconds=s))


@given(st.lists(st.tuples(times, times), max_size=6), st.integers(1, 3600))
def test_the_horizon_keeps_its_rule(parts: list[tuple[datetime | None, datetime | None]], idle_s: int) -> None:
    """The rule, restated from the docstring, on any partitions: both homes give what it says."""
    idle = timedelta(seconds=idle_s)
    indexed = {p: (max_ts, seen) for p, (max_ts, seen) in enumerate(parts) if max_ts is not None}
    idle_parts = tuple(p for p, (_, seen) in indexed.items() if seen is None or NOW - seen > idle)
    active = {p: max_ts for p, (max_ts, _) in indexed.items() if p not in idle_parts}
    if active:
        held = sorted(active, key=lambda p: (active[p], p))[0]
        want = (min(active[held], NOW), held, idle_parts)
    elif indexed:
        want = (min(max([t for t, _ in indexed.values()] + [NOW - idle]), NOW), None, idle_parts)
    else:
        want = (None, None, ())
    assert both_horizons([(p, max_ts, seen) for p, (max_ts, seen) in enumerate(parts)], idle) == [want, want]


def test_a_backfill_run_counts_its_chunks() -> None:
    run = {
        "dag_run_id": "manual__1",
        "state": "running",
        "conf": {"start": "2025-01-01T00:00:00+00:00", "end": "2025-02-01T00:00:00+00:00"},
    }
    tis = [
        {"task_id": "chunks", "map_index": -1, "state": "success"},
        *(
            {"task_id": "recompute", "map_index": i, "state": s}
            for i, s in enumerate(["success"] * 3 + ["running", None])
        ),
        {"task_id": "advance_watermark", "map_index": -1, "state": None},
    ]
    got = backfill_progress(run, tis)
    assert (got.chunks_done, got.chunks_total, got.chunks_failed) == (3, 5, 0)
    assert got.progress == "3 of 5 chunks done" and got.start == "2025-01-01T00:00:00+00:00"
    assert backfill_progress(run, tis[:1]).progress == "planning chunks (success)"
    failed = backfill_progress(run, [*tis, {"task_id": "recompute", "map_index": 5, "state": "failed"}])
    assert failed.progress == "3 of 6 chunks done, 1 failed"


def test_speed_minutes_group_by_state_and_epoch() -> None:
    m = [NOW.replace(minute=0) + i * MINUTE for i in range(6)]
    minutes = [
        SpeedMinute(m[0], "covered", "e1", 5),
        SpeedMinute(m[1], "covered", "e1", 7),
        SpeedMinute(m[2], "expired", "e1", 9),
        SpeedMinute(m[3], "started_after", None, 0),
        SpeedMinute(m[4], "covered", "e2", 1),
        SpeedMinute(m[5], "covered", "e2", 1),
    ]
    got = [(s.start.minute, s.end.minute, s.state, s.epoch, s.events) for s in segments_of(minutes)]
    assert got == [
        (0, 2, "covered", "e1", 12),
        (2, 3, "expired", "e1", 9),
        (3, 4, "started_after", None, 0),
        (4, 6, "covered", "e2", 2),
    ]
