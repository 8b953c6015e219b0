"""Merged answers over both real layers: exact counts across the boundary, rollups, gaps, pinning, trending."""

from __future__ import annotations

import random
import uuid
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka import Producer

from batch_layer import job
from batch_layer.publish import BatchStore
from infra import migrations
from infra.cassandra import session
from infra.settings import Settings
from serving import params, queries, status, window
from serving.reader import ViewReader
from tests.helpers import drop_keyspace, speed_drain
from views.event import Event
from views.sketches import merge_all
from views.store.rows import ViewRow

pytestmark = pytest.mark.spark

H0 = datetime(2025, 11, 23, 10, tzinfo=UTC)
HOUR = timedelta(hours=1)
MIN = timedelta(minutes=1)


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, stack_up: Settings, spark: Any
) -> Iterator[tuple[Settings, list[Event]]]:
    """Three hours of historical events with a planted burst: batch computes two hours, speed sees all."""
    from infra import topics

    run = random.randrange(1 << 30)
    topic = f"test.serving.{run}"
    keyspace = f"test_serving_{run}"
    topics.ensure_topics(stack_up.kafka, [topics.TopicSpec(topic, 3, 1, {"retention.ms": "-1"})])
    settings = stack_up.model_copy(
        update={
            "kafka": stack_up.kafka.model_copy(update={"events_topic": topic}),
            "cassandra": stack_up.cassandra.model_copy(update={"keyspace": keyspace}),
            "batch": stack_up.batch.model_copy(update={"lateness_s": 300, "grace_s": 300}),
            "views": stack_up.views.model_copy(update={"slice_dims": ["origin"]}),
            # the layers' state read for every answer: a rerun or a new hour shows in the very next answer
            "serving": stack_up.serving.model_copy(update={"state_max_age_ms": 0}),
        }
    )
    migrations.migrate(settings)
    rng = random.Random(run)
    events = []
    for i in range(6000):
        ts = H0 + timedelta(seconds=rng.randrange(3 * 3600))
        item = f"#steady{rng.randrange(20)}"
        if H0 + 2 * HOUR + 20 * MIN <= ts < H0 + 2 * HOUR + 40 * MIN and rng.random() < 0.3:
            item = "#burst"  # rises from nothing to a third of the traffic for 20 minutes
        events.append(
            Event(id=f"s{i}", ts=ts, item=item, user=f"u{rng.randrange(500)}", value=float(i % 100),
                  dims={"origin": rng.choice(["JFK", "LAX"])})
        )  # fmt: skip
    events.sort(key=lambda e: e.ts)
    producer = Producer({**settings.kafka.client_config(), "enable.idempotence": True, "acks": "all"})
    for e in events:
        producer.produce(topic, key=e.item, value=e.to_json(), timestamp=e.ts_ms)
    assert producer.flush(30) == 0
    speed_drain(settings, tmp_path_factory.mktemp("speed"), lateness_s=3600)
    job.run(settings, H0, H0 + 2 * HOUR, spark=spark)
    yield settings, events
    drop_keyspace(stack_up, keyspace)
    topics.delete_topics(stack_up.kafka, [topic])


def exact(events: list[Event], start: datetime, end: datetime, origin: str | None = None) -> list[Event]:
    return [e for e in events if start <= e.ts < end and (origin is None or e.dims.get("origin") == origin)]


def answer(settings: Settings, start: datetime, end: datetime, slice_: str = "*", **kw: Any) -> window.Window:
    with session(settings) as sess:
        return window.load(ViewReader(settings, sess), start, end, slice_, **kw)


def test_window_across_the_boundary_is_exact_and_says_who_served_what(served: tuple[Settings, list[Event]]) -> None:
    settings, events = served
    start, end = H0 + 30 * MIN, H0 + 2 * HOUR + 30 * MIN
    w = answer(settings, start, end)
    s = queries.summary(w, top_n=5)
    truth = exact(events, start, end)
    assert s.events == len(truth)
    assert s.users_lower <= len({e.user for e in truth}) <= s.users_upper
    layers = [(p["layer"], p["resolution"], p["start"], p["end"]) for p in s.provenance.spans]
    assert layers == [
        ("batch", "minute", start, H0 + HOUR),
        ("batch", "hour", H0 + HOUR, H0 + 2 * HOUR),
        ("speed", "minute", H0 + 2 * HOUR, end),
    ]
    assert s.provenance.boundary == H0 + 2 * HOUR and s.provenance.gaps == []
    jfk = queries.summary(answer(settings, start, end, "origin=JFK"))
    assert jfk.events == len(exact(events, start, end, "JFK"))


def test_gaps_are_reported_not_skipped(served: tuple[Settings, list[Event]]) -> None:
    settings, events = served
    newest = max(e.ts for e in events)
    w = answer(settings, H0 - HOUR, H0 + 4 * HOUR)
    gaps = [(g["start"], g["end"]) for g in w.provenance.gaps]
    # before the first batch hour, below the boundary: no batch run; after the newest event: not seen yet
    assert gaps[0] == (H0 - HOUR, H0)
    assert gaps[-1][1] == H0 + 4 * HOUR and gaps[-1][0] <= newest + MIN
    assert queries.summary(w).events == len(events)


def test_a_pinned_boundary_moves_the_split(served: tuple[Settings, list[Event]]) -> None:
    settings, events = served
    with session(settings) as sess:
        BatchStore(settings, sess).pointers.pin(H0 + HOUR)
    try:
        w = answer(settings, H0, H0 + 3 * HOUR)
        assert w.provenance.boundary == H0 + HOUR and w.provenance.boundary_pinned
        assert [p["layer"] for p in w.provenance.spans] == ["batch", "speed"]
        assert queries.summary(w).events == len(exact(events, H0, H0 + 3 * HOUR))
        with session(settings) as sess:
            moved = status.pin_effect(ViewReader(settings, sess))
        # the hour the pin hands to the speed view is still covered there (the speed layer read it all)
        assert moved is not None and moved.moved_to_speed_minutes == 60 == moved.covered_minutes
        assert moved.gaps == []
    finally:
        with session(settings) as sess:
            BatchStore(settings, sess).pointers.pin(None)


def test_planted_burst_ranks_first_and_series_match(served: tuple[Settings, list[Event]]) -> None:
    settings, events = served
    recent = answer(settings, H0 + 2 * HOUR + 20 * MIN, H0 + 2 * HOUR + 40 * MIN)
    baseline = answer(settings, H0 + 20 * MIN, H0 + 2 * HOUR + 20 * MIN)
    t = queries.trending(recent, baseline, limit=5, min_support=5)
    assert t.items[0].item == "#burst"
    assert t.items[0].baseline == 0
    ser = queries.series(answer(settings, H0, H0 + 3 * HOUR, coarsest="hour"), "hour")
    per_hour = Counter(e.ts.replace(minute=0, second=0, microsecond=0) for e in events)
    assert [p["count"] for p in ser.points] == [per_hour[H0 + i * HOUR] for i in range(3)]


def test_bad_windows_are_refused(served: tuple[Settings, list[Event]]) -> None:
    settings, _ = served
    with pytest.raises(ValueError, match="whole minutes"):
        answer(settings, H0 + HOUR, H0)
    with pytest.raises(ValueError, match="15m"):
        params.parse_last("15x")


def test_cached_batch_rows_follow_the_pointer(served: tuple[Settings, list[Event]], spark: Any) -> None:
    """A warm cache answers like a cold read, and a new current run of an hour is served at once, never stale."""
    settings, events = served
    start, end = H0 + 30 * MIN, H0 + 2 * HOUR + 30 * MIN  # batch minutes of H0, batch hour H0+1, speed minutes
    with session(settings) as sess:
        reader = ViewReader(settings, sess)
        assert reader.cache is not None
        cold = queries.summary(window.load(reader, start, end, "*"))
        misses = reader.cache.misses
        warm = queries.summary(window.load(reader, start, end, "*"))
        assert reader.answers is not None and reader.answers.hits == 1  # the same question again: a lookup
        shorter = window.load(reader, start, end - MIN, "*")  # another question over the same batch rows
        assert queries.summary(shorter).events == len(exact(events, start, end - MIN))
        assert reader.cache.misses == misses and reader.cache.hits > 0  # every batch row came from the cache
        assert (warm.events, warm.users, warm.top_items) == (cold.events, cold.users, cold.top_items)
        # KLL compaction is randomized: warm and cold quantiles are each within the rank error of the exact ranks
        values = sorted(e.value for e in exact(events, start, end) if e.value is not None)
        for answer in (cold, warm):
            for rank, v in answer.quantiles.items():
                assert v is not None
                lo, hi = bisect_left(values, v) / len(values), bisect_right(values, v) / len(values)
                assert lo - answer.quantile_rank_error <= float(rank) <= hi + answer.quantile_rank_error

        # A new version of H0 with every minute counted twice becomes current: the warm reader serves it at once.
        minutes = window.load(reader, H0, H0 + HOUR, "*", coarsest="minute").buckets
        doubled = [ViewRow("*", b.start, 2 * b.events, b.users_hll, b.values_kll, b.items_fi, b.start, b.start)
                   for b in minutes]  # fmt: skip
        merged = merge_all((b.users_hll, b.values_kll, b.items_fi) for b in minutes)
        hour_row = ViewRow("*", H0, sum(r.events for r in doubled), *merged, H0, H0)
        store = BatchStore(settings, sess)
        run = uuid.uuid1()
        store.rows.write_versions({H0: run}, {H0: doubled}, {H0: [hour_row]})
        store.pointers.swap([(H0, run, None)])
        after = queries.summary(window.load(reader, start, end, "*"))
        assert after.events == cold.events + len(exact(events, start, H0 + HOUR))

        job.run(settings, H0, H0 + HOUR, spark=spark)  # the batch layer's rerun restores the hour: served at once
        restored = queries.summary(window.load(reader, start, end, "*"))
        assert restored.events == cold.events == len(exact(events, start, end))


def test_no_row_cache_without_read_your_writes(served: tuple[Settings, list[Event]]) -> None:
    settings, events = served
    weak = settings.model_copy(
        update={"cassandra": settings.cassandra.model_copy(update={"read_consistency": "ONE", "replication_factor": 3})}
    )
    with session(weak) as sess:
        reader = ViewReader(weak, sess)
        assert reader.cache is None
        w = window.load(reader, H0 + 30 * MIN, H0 + 2 * HOUR + 30 * MIN, "*")
        assert queries.summary(w).events == len(exact(events, H0 + 30 * MIN, H0 + 2 * HOUR + 30 * MIN))


def test_whole_days_are_served_by_the_daily_rollups(stack_up: Settings) -> None:
    """Two batch days of one event per hour: a window over one and a half days reads hours, then the daily rollup."""
    import datasketches as ds

    keyspace = f"test_days_{random.randrange(1 << 30)}"
    settings = stack_up.model_copy(update={"cassandra": stack_up.cassandra.model_copy(update={"keyspace": keyspace})})
    migrations.migrate(settings)
    day0 = datetime(2025, 6, 1, tzinfo=UTC)
    try:
        with session(settings) as sess:
            store = BatchStore(settings, sess)
            for h in range(48):
                hour = day0 + h * HOUR
                hll, kll, fi = ds.hll_sketch(12), ds.kll_doubles_sketch(200), ds.frequent_strings_sketch(10)
                hll.update(f"u{h}")
                kll.update(float(h))
                fi.update(f"#h{h % 3}")
                sketches = (bytes(hll.serialize_compact()), bytes(kll.serialize()), bytes(fi.serialize()))
                run = uuid.uuid1()
                row = ViewRow("*", hour, 1, *sketches, hour, hour)
                store.rows.write_versions({hour: run}, {hour: [row]}, {hour: [row]})
                store.pointers.swap([(hour, run, None)])
            for d in (day0, day0 + 24 * HOUR):
                store.remerge_day(d.date())
            store.pointers.write_watermark(day0, day0 + 48 * HOUR)
        w = answer(settings, day0 + 12 * HOUR, day0 + 48 * HOUR)
        spans = [(p["layer"], p["resolution"], p["start"], p["end"]) for p in w.provenance.spans]
        assert spans[:-1] == [("batch", "hour", day0 + h * HOUR, day0 + (h + 1) * HOUR) for h in range(12, 24)]
        assert spans[-1] == ("batch", "day", day0 + 24 * HOUR, day0 + 48 * HOUR)
        s = queries.summary(w)
        assert (s.events, round(s.users)) == (36, 36) and w.provenance.gaps == []
    finally:
        drop_keyspace(stack_up, keyspace)
