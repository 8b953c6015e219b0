"""The pure parts of loss, incompleteness, verify's bounds and the pin rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import NamedTuple

import datasketches as ds
import pytest

from batch_layer.offsets import LossNotAcceptedError, refuse_loss
from batch_layer.reconcile import Reconciliation, beyond, compare
from views import sketches
from views.indexing.spans import PartitionIndexer
from views.store.index import PartitionState, dt_to_ms
from views.store.losses import Loss, incomplete_hours, loss_bound
from views.store.pointers import Watermark, pin_problem, pinned_hours

H = datetime(2026, 5, 1, 10, tzinfo=UTC)
HOUR = timedelta(hours=1)
NOW = datetime(2026, 11, 24, 12, 30, tzinfo=UTC)
WEEK_MS = 7 * 24 * 3600 * 1000


def loss(first: int, older_than: datetime, partition: int = 0) -> Loss:
    return Loss("events", partition, first, first + 9, 10, NOW, older_than)


def test_the_bound_is_the_later_of_what_each_possible_cause_gives() -> None:
    survivor = NOW - timedelta(days=30)
    # time retention could have deleted only records older than a week before now; DeleteRecords, older than the
    # first record kept (in a log in time order): the later bound is true under both
    assert loss_bound(NOW, WEEK_MS, survivor) == NOW - timedelta(days=7)
    assert loss_bound(NOW, WEEK_MS, NOW - timedelta(days=1)) == NOW - timedelta(days=1) + timedelta(milliseconds=1)
    assert loss_bound(NOW, -1, survivor) == survivor + timedelta(milliseconds=1)  # no time retention
    assert loss_bound(NOW, -1, None) == NOW  # everything after the gap was deleted too: only "before now"
    assert loss_bound(NOW, None, survivor) == NOW  # the topic's config unknown: nothing better than now


def test_hours_end_is_the_hour_holding_the_bounds_last_instant() -> None:
    assert loss(0, H).hours_end == H  # every lost record is older than 10:00: hours up to 09:00
    assert loss(0, H + timedelta(milliseconds=1)).hours_end == H + HOUR  # one may be at 10:00:00.000
    assert loss(0, H + timedelta(minutes=59)).hours_end == H + HOUR


def test_incomplete_hours_have_no_lower_bound_and_acceptance_clears_them() -> None:
    a, b = loss(0, H), loss(100, H + 3 * HOUR, partition=1)
    start, end = H - 3 * HOUR, H + 5 * HOUR
    got = incomplete_hours([a, b], {}, start, end)
    assert list(got) == [start + i * HOUR for i in range(6)]  # a: up to 09:00; b: up to 12:00
    assert got[H - HOUR] == [a, b] and got[H] == [b]
    accepted = {a.key: {H - 3 * HOUR, H - 2 * HOUR}, b.key: {H - 3 * HOUR, H + 2 * HOUR}}
    got = incomplete_hours([a, b], accepted, start, end)
    assert H - 3 * HOUR not in got
    assert got[H - 2 * HOUR] == [b] and H + 2 * HOUR not in got
    # a year before anything seen is still incomplete: a 7-day retention deletes replayed history at once
    assert H - 8760 * HOUR in incomplete_hours([a], {}, H - 8760 * HOUR, H)
    assert incomplete_hours([a], {}, H, H + 5 * HOUR) == {}  # hours after the bound are whole


def test_airflows_pendulum_times_are_accepted() -> None:
    import pendulum

    start = pendulum.datetime(2026, 5, 1, 8, tz="UTC")
    assert list(incomplete_hours([loss(0, H)], {}, start, start + 3 * HOUR)) == [H - 2 * HOUR, H - HOUR]
    assert pin_problem(pendulum.datetime(2026, 5, 1, 9, tz="UTC"), Watermark(H - 24 * HOUR, H)) is None


def test_refusal_names_the_topic_partition_offsets_and_the_flag() -> None:
    with pytest.raises(LossNotAcceptedError) as caught:
        refuse_loss("events", {H: [loss(40, H + HOUR, partition=2)]})
    msg = str(caught.value)
    assert "events partition 2 offsets 40..49" in msg and "10 records" in msg and "--accept-loss" in msg
    refuse_loss("events", {})  # nothing incomplete: no refusal


def test_records_without_a_timestamp_are_counted_apart_from_lost_ones() -> None:
    ix = PartitionIndexer(PartitionState(0, next_offset=5, lost=5), gap=3)
    for offset, ts in ((5, dt_to_ms(H)), (6, -1), (7, dt_to_ms(H) + 1)):
        ix.add(offset, ts)
    assert (ix.state.untimed, ix.state.lost, ix.new_records) == (1, 5, 2)


def test_a_pin_is_a_whole_hour_at_or_below_the_watermark() -> None:
    wm = Watermark(H - 24 * HOUR, H)
    assert pin_problem(H, wm) is None and pin_problem(H - 5 * HOUR, wm) is None
    assert "above the batch watermark" in (pin_problem(H + HOUR, wm) or "")
    assert "not a whole hour" in (pin_problem(H - timedelta(minutes=30), wm) or "")
    assert "no batch watermark" in (pin_problem(H, Watermark()) or "")
    assert "time zone" in (pin_problem(H.replace(tzinfo=None), wm) or "")
    assert pinned_hours(Watermark(H - 24 * HOUR, H, H - 2 * HOUR)) == [H - 2 * HOUR, H - HOUR]
    assert pinned_hours(wm) == []


def hll(users: range) -> bytes:
    sk = ds.hll_sketch(12, ds.tgt_hll_type.HLL_8)
    for u in users:
        sk.update(f"u{u}")
    return bytes(sk.serialize_compact())


def est(users: range) -> sketches.Estimate:
    return sketches.users([hll(users)], num_std_dev=3)


def test_beyond_the_bounds() -> None:
    same = est(range(500))
    assert beyond(800, same, 800, same) == (0, "", "")
    assert beyond(800, same, 790, est(range(495)))[0] == 0  # the speed layer dropped 10 late events: allowed
    amount, what, _ = beyond(800, same, 830, same)  # the speed view holds more than the truth
    assert (amount, what) == (30, "events")
    amount, what, why = beyond(800, est(range(2000)), 800, same)  # same counts, a quarter of the users
    assert what == "users" and amount > 1000 and "users batch" in why
    # 1,500 events fewer in speed can remove up to 1,500 users: within the bound
    assert beyond(2000, est(range(2000)), 500, same)[0] == 0


class Row(NamedTuple):
    events: int
    users_hll: bytes


def test_compare_finds_the_worst_minute_and_a_minute_only_the_speed_view_has() -> None:
    m = [H + timedelta(minutes=i) for i in range(4)]
    batch = {m[0]: Row(10, hll(range(10))), m[1]: Row(5, hll(range(5))), m[2]: Row(7, hll(range(7)))}
    speed = {m[0]: Row(10, hll(range(10))), m[1]: Row(4, hll(range(4))), m[3]: Row(3, hll(range(3)))}
    rec = Reconciliation(H, "run")
    compare(rec, "*", batch, speed, 10)
    assert (rec.events_batch, rec.events_speed) == (22, 17)
    assert (rec.buckets_missing_in_speed, rec.buckets_missing_in_batch) == (1, 1)
    assert rec.beyond_bound == 3 and rec.worst["bucket"] == m[3].isoformat()  # 3 events the batch view lacks
    within = Reconciliation(H, "run")
    compare(within, "*", batch, {k: v for k, v in speed.items() if k != m[3]}, 10)
    assert within.beyond_bound == 0 and "within bounds" in within.line()
