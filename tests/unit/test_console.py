"""The console's pure parts: the range rules, the horizon (the same rule as the indexer's), the backfill summary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batch_layer.horizon import horizon_of
from serving import params
from serving.console import MAX_HOURS, SpeedMinute, backfill_progress, hour_range, segments_of
from views.buckets import MINUTE
from views.store.index import IndexedPartition, PartitionState, dt_to_ms, index_horizon

NOW = datetime(2026, 5, 1, 10, 17, tzinfo=UTC)


def test_the_range_is_whole_hours_and_bounded() -> None:
    assert hour_range(None, None, NOW) == (datetime(2026, 5, 1, 5, tzinfo=UTC), datetime(2026, 5, 1, 11, tzinfo=UTC))
    assert hour_range("2026-05-01T08:30Z", "2026-05-01T09:10Z", NOW) == (
        datetime(2026, 5, 1, 8, tzinfo=UTC),
        datetime(2026, 5, 1, 10, tzinfo=UTC),
    )
    assert hour_range("2026-05-01T08:00Z", "2026-05-03T08:00Z", NOW)[1] == datetime(2026, 5, 3, 8, tzinfo=UTC)
    for start, end, fragment in [
        ("2026-05-01T08:00Z", None, "end: give start and end together"),
        (None, "2026-05-01T08:00Z", "start: give start and end together"),
        ("2026-05-01T08:00Z", "2026-05-01T08:00Z", "holds no hour"),
        ("2026-05-01T09:00Z", "2026-05-01T08:00Z", "holds no hour"),
        ("2026-05-01T08:00Z", "2026-05-03T08:01Z", f"the console shows at most {MAX_HOURS}"),
        ("2026-05-01T08:00", "2026-05-01T09:00Z", "no time zone"),
    ]:
        with pytest.raises(params.BadQueryError, match=fragment):
            hour_range(start, end, NOW)


times = st.none() | st.integers(0, 4 * 3600).map(lambda s: NOW - timedelta(seconds=s))


@given(st.lists(st.tuples(times, times), max_size=6), st.integers(1, 3600))
def test_the_console_horizon_is_the_indexers(parts: list[tuple[datetime | None, datetime | None]], idle: int) -> None:
    """serving may not import the batch layer: views.store.index holds its rule, and must agree with it."""
    ours = [IndexedPartition(p, 0, max_ts, seen, None) for p, (max_ts, seen) in enumerate(parts)]
    theirs = [
        PartitionState(p, 0, None if max_ts is None else dt_to_ms(max_ts), seen)
        for p, (max_ts, seen) in enumerate(parts)
    ]
    got, want = index_horizon(ours, NOW, timedelta(seconds=idle)), horizon_of(theirs, NOW, timedelta(seconds=idle))
    assert (got.closed_at, got.held_by, got.idle) == (want.closed_at, want.held_by, want.idle)


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
    assert (got["chunks_done"], got["chunks_total"], got["chunks_failed"]) == (3, 5, 0)
    assert got["progress"] == "3 of 5 chunks done" and got["start"] == "2025-01-01T00:00:00+00:00"
    assert backfill_progress(run, tis[:1])["progress"] == "planning chunks (success)"
    failed = backfill_progress(run, [*tis, {"task_id": "recompute", "map_index": 5, "state": "failed"}])
    assert failed["progress"] == "3 of 6 chunks done, 1 failed"


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
