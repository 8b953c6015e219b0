"""The event-time index's pure parts: spans from records in offset order, horizons, ranges and chunks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from batch_layer.hours import chunks, taper
from batch_layer.offsets import HourPlan, Plan, Range, coalesce
from views.indexing.spans import HOUR_MS, PartitionIndexer
from views.store.index import OffsetSpan, PartitionState, dt_to_ms
from views.store.index import index_horizon as horizon_of

H = datetime(2025, 6, 1, 10, tzinfo=UTC)
H_MS = dt_to_ms(H)


def feed(records: list[tuple[int, int]], gap: int = 3, state: PartitionState | None = None) -> PartitionIndexer:
    ix = PartitionIndexer(state or PartitionState(0), gap)
    for offset, ts in records:
        ix.add(offset, ts)
    return ix


def spans_of(ix: PartitionIndexer) -> dict[tuple[int, int], OffsetSpan]:
    return {(h, s.first): s for h, s in ix.drain()}


def test_replayed_history_behind_newer_events_gets_its_own_spans() -> None:
    live = [(o, H_MS + 5 * HOUR_MS + o) for o in range(10)]  # this week's events first
    history = [(10 + i, H_MS + (i // 5) * HOUR_MS) for i in range(15)]  # then three old hours, in order
    spans = spans_of(feed(live + history))
    assert spans == {
        (H_MS + 5 * HOUR_MS, 0): OffsetSpan(0, 0, 9, 10, 0),
        (H_MS, 10): OffsetSpan(0, 10, 14, 5, 5),  # late: the partition had passed these hours' ends
        (H_MS + HOUR_MS, 15): OffsetSpan(0, 15, 19, 5, 5),
        (H_MS + 2 * HOUR_MS, 20): OffsetSpan(0, 20, 24, 5, 5),
    }


def test_interleaved_hours_share_spans_within_the_gap_and_split_beyond_it() -> None:
    # hour 0 and hour 1 interleave at the boundary: spans stay whole; a record of hour 0 far later starts a new one
    records = [(0, H_MS), (1, H_MS + HOUR_MS), (2, H_MS + 1), (3, H_MS + HOUR_MS + 1), (4, H_MS + 2)]
    records += [(o, H_MS + HOUR_MS + o) for o in range(5, 12)] + [(12, H_MS + 3)]
    spans = spans_of(feed(records, gap=3))
    assert spans[(H_MS, 0)] == OffsetSpan(0, 0, 4, 3, 2)  # 2 and 4 came after a record of the next hour: late
    assert spans[(H_MS + HOUR_MS, 1)] == OffsetSpan(0, 1, 11, 9, 0)
    assert spans[(H_MS, 12)] == OffsetSpan(
        0, 12, 12, 1, 1
    )  # 8 records after the last one of its hour: a new, late span
    assert sum(s.records for s in spans.values()) == len(records)


def test_resuming_from_a_checkpoint_builds_the_same_spans() -> None:
    records = [(o, H_MS + (o % 3) * HOUR_MS + o) for o in range(40)] + [(o, H_MS + o) for o in range(40, 60)]
    whole = spans_of(feed(records, gap=5))
    for cut in (1, 17, 39, 45):
        first = feed(records[:cut], gap=5)
        written = spans_of(first)
        # what the checkpoint keeps, as the store writes and reads it
        state = PartitionState(
            0, first.state.next_offset, first.state.max_ts_ms, None, PartitionState.parse_open(first.state.open_json())
        )
        written.update(spans_of(feed(records[cut:], gap=5, state=state)))
        assert written == whole, cut


def test_horizon_ignores_idle_partitions_and_never_passes_now() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    idle_after = timedelta(minutes=15)
    busy = PartitionState(0, 10, dt_to_ms(now - timedelta(minutes=5)), now - timedelta(minutes=1))
    quiet = PartitionState(1, 10, dt_to_ms(now - timedelta(days=3)), now - timedelta(hours=2))
    empty = PartitionState(2)
    h = horizon_of([busy, quiet, empty], now, idle_after)
    assert (h.closed_at, h.held_by, h.idle) == (now - timedelta(minutes=5), 0, (1,))
    lagging = PartitionState(3, 10, dt_to_ms(now - timedelta(hours=1)), now - timedelta(minutes=2))
    assert horizon_of([busy, quiet, lagging], now, idle_after).held_by == 3
    # all idle: the stream is quiet, hours close up to now - idle
    assert horizon_of([quiet], now, idle_after).closed_at == now - idle_after
    future = PartitionState(0, 10, dt_to_ms(now + timedelta(hours=1)), now)
    assert horizon_of([future], now, idle_after).closed_at == now
    assert horizon_of([empty], now, idle_after).closed_at is None


def test_spans_coalesce_into_few_ranges_and_reads_take_one_range_per_partition() -> None:
    spans = [
        OffsetSpan(0, 0, 9, 10),
        OffsetSpan(0, 5, 20, 3),
        OffsetSpan(0, 24, 30, 7),
        OffsetSpan(0, 100, 110, 11),
        OffsetSpan(1, 7, 7, 1),
    ]
    assert coalesce(spans, gap=5, max_ranges=10) == [Range(0, 0, 31), Range(0, 100, 111), Range(1, 7, 8)]
    assert coalesce(spans, gap=0, max_ranges=1) == [Range(0, 0, 111), Range(1, 7, 8)]
    plan = Plan("t", (HourPlan(H, tuple(spans)),), tuple(coalesce(spans, gap=5, max_ranges=10)))
    reads = plan.reads()
    assert len(reads) == 2
    assert reads[1] == ('{"t": [0]}', '{"t": {"0": 100}}', '{"t": {"0": 111}}')
    assert HourPlan(H, tuple(spans)).to_json() == '{"0": [[0, 10], [5, 21], [24, 31], [100, 111]], "1": [[7, 8]]}'


def test_chunks_bound_hours_and_events_keep_days_whole_and_never_split_an_hour() -> None:
    hours = [H + timedelta(hours=i) for i in range(10)]  # 10:00 .. 19:00 of one day
    records = {hours[1]: 50, hours[2]: 500, hours[5]: 40}
    assert [len(c) for c in chunks(hours, records, max_events=100, max_hours=4)] == [2, 1, 4, 3]
    assert [len(c) for c in chunks(hours, {}, max_events=1, max_hours=100)] == [10]
    days = [H.replace(hour=0) + timedelta(hours=i) for i in range(24 * 5)]
    assert [len(c) for c in chunks(days, {}, max_events=1, max_hours=50)] == [48, 48, 24]
    busy = {days[30]: 10, days[80]: 10}
    assert [len(c) for c in chunks(days, busy, max_events=15, max_hours=1000)] == [72, 48]


def test_taper_splits_short_whole_day_passes_off_both_ends() -> None:
    days = [H.replace(hour=0) + timedelta(hours=i) for i in range(24 * 12)]
    passes = chunks(days, {}, max_events=10**9, max_hours=24 * 4)  # 3 passes of 4 days
    tapered = taper(passes)
    assert [len(p) // 24 for p in tapered] == [1, 3, 4, 3, 1]
    assert [h for p in tapered for h in p] == days  # nothing lost, nothing twice, in order
    assert all(len({h.date() for h in p}) * 24 == len(p) for p in tapered)  # whole days
    one_day = [H.replace(hour=0) + timedelta(hours=i) for i in range(5)]
    assert taper([one_day]) == [one_day]
    assert [len(p) // 24 for p in taper([days[:48]])] == [1, 1]
    assert taper([]) == []
