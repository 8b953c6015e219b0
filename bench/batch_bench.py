"""Batch layer benchmark: recompute of one closed hour against a bare Kafka batch read + count of the same offsets.

Run: ``.venv/bin/python bench/batch_bench.py [--events 1000000] [--repeat 2] [--stages]`` with the stack up
(``trends stack up``). Everything runs against a throw-away topic and keyspace, deleted at the end.

1. A topic like the events topic (its partition count, ``retention.ms=-1``) is filled with N events (the JSON of
   ``bench/speed_bench.py``, unique ids) spread over ONE historical UTC hour a few days ago, then one later event
   into EVERY partition, past end + grace, so the hour counts as closed (``batch_layer.offsets.check_closed``).
2. In one SparkSession, a warm-up of everything measured below on a small topic (index, bare read, recompute).
3. The event-time index of the topic is built (``views.indexing.indexer.run_index``, timed warm: the indexer's figure)
   and compared with a bare read + count of the same records, also warm.
4. Alternately and ``--repeat`` times each:
   - bare: ``spark.read.format("kafka")`` over exactly the offsets the index plans for the hour
     (``batch_layer.compute.extract``) -> ``count()``;
   - recompute: ``batch_layer.job.run`` of the hour, as ``trends batch run`` does it (index catch-up, closed
     check, plan, lineage, read, parse, dedupe, minute aggregation with ``origin`` slices, hourly rollup,
     versioned write to Cassandra, pointer swap, daily rollup, watermark).
   Prints the median seconds and events/s of each and ratio = bare s / recompute s (goal >= 0.35).
5. Checks that the batch view's hourly row of the global slice ``*`` counts N events.

``--stages`` also times the steps of one recompute separately (the production functions called one by one), and
prints the ratio the read + decode alone, and the read + decode + exact dedupe alone, would reach (probes, left
out of the total of the steps): no recompute of these JSON events can beat them; and the recompute's ratio to the
second of them (goal >= 0.85).
Figures only, from a shared machine: nothing is asserted about timing; the counts are (exit 1 when wrong).
``--smoke`` runs every step, ``--stages`` included, on a few thousand events (CI: a bench that measures nothing fails).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from confluent_kafka import Producer

# bench/ is the script's folder, hence on sys.path: the same event shape as the speed layer bench.
from speed_bench import event_json

from batch_layer import compute, horizon, job, load, offsets, report, transform
from batch_layer.publish import BatchStore
from infra import migrations, topics
from infra.cassandra import session
from infra.settings import Settings
from views.aggregation import GLOBAL_SLICE
from views.buckets import HOUR, utc
from views.indexing import indexer
from views.store.batch import BatchRows
from views.store.index import IndexStore
from views.store.pointers import PointerStore

GOAL = 0.35
# --smoke: no warm-up (its figures are not comparable anyway; the first measured step pays for the JIT)
SMOKE = {"events": 3000, "warmup_events": 0, "repeat": 1, "stages": True}
PARSE_ONLY = "read Kafka + parse (alone)"
DEDUPE_ONLY = "read Kafka + parse + exact dedupe (alone)"


def producer_for(settings: Settings) -> Producer:
    return Producer(
        {
            **settings.kafka.client_config(),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 131072,
            "compression.type": "lz4",
        }
    )


def produce(producer: Producer, topic: str, value: bytes, ts: datetime, partition: int | None = None) -> None:
    kwargs: dict[str, Any] = {"value": value, "timestamp": int(ts.timestamp() * 1000)}
    if partition is not None:
        kwargs["partition"] = partition
    while True:
        try:
            producer.produce(topic, **kwargs)
            return
        except BufferError:
            producer.poll(0.05)


def fill_hour(settings: Settings, hour: datetime, count: int, partitions: int) -> None:
    """Write ``count`` events over ``[hour, hour + 1 h)`` in time order, then close the hour in every partition."""
    topic = settings.kafka.events_topic
    rng = random.Random(7)
    items = [f"#item{i}" for i in range(2000)]
    weights = [1 / (i + 1) for i in range(len(items))]
    producer = producer_for(settings)
    step = HOUR / count
    t0 = time.monotonic()
    for i in range(count):
        ts = hour + step * i
        produce(producer, topic, event_json(rng, i, ts, items, weights), ts)
        if i % 10_000 == 0:
            producer.poll(0)
    # The hour is closed when EVERY partition's newest event time has passed end + grace: one event each, an hour
    # beyond that and beyond the lateness widening, so no offset range of the hour includes them.
    grace = max(settings.batch.grace_s, settings.batch.lateness_s)
    later = hour + HOUR + timedelta(seconds=grace) + HOUR
    for p in range(partitions):
        produce(producer, topic, event_json(rng, count + p, later, items, weights), later, partition=p)
    assert producer.flush(120) == 0
    print(f"filled {topic} with {count:,} events of {hour:%Y-%m-%dT%H:%MZ} in {time.monotonic() - t0:.1f} s")


def bare_count(spark: Any, settings: Settings, plan: offsets.Plan) -> int:
    """Count the planned records with a bare Kafka batch read: nothing parsed, aggregated or written."""
    return int(compute.extract(spark, settings, plan).count())


def plan_of(settings: Settings, hour: datetime) -> offsets.Plan:
    """Return the index's plan of one hour."""
    with session(settings) as sess:
        return offsets.plan(settings, IndexStore(settings, sess), [hour])


def recompute(spark: Any, settings: Settings, hour: datetime) -> report.RunResult:
    """Recompute the hour exactly as ``trends batch run`` does (closed check included)."""
    results = job.run(settings, hour, hour + HOUR, spark=spark)
    assert len(results) == 1
    return results[0]


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.monotonic()
    out = fn()
    return time.monotonic() - t0, out


def hourly_count(settings: Settings, hour: datetime) -> tuple[int | None, int]:
    """Return the current batch hour row's count of the global slice, and the sum of its minute rows."""
    with session(settings) as sess:
        runs = PointerStore(settings, sess).runs(hour.date())
        rows = BatchRows(settings, sess)
        hours = [r.events for r in rows.day_hours(GLOBAL_SLICE, hour.date(), runs) if utc(r.hour) == hour]
        minutes = rows.run_minutes(GLOBAL_SLICE, hour, runs.get(hour)).values()
        return (hours[0] if len(hours) == 1 else None), sum(r.events for r in minutes)


def stages(spark: Any, settings: Settings, hour: datetime) -> list[tuple[str, float]]:
    """Time the steps of one recompute separately, calling the production functions one by one (as job.run)."""
    out: list[tuple[str, float]] = []

    def step(name: str, fn: Callable[[], Any]) -> Any:
        seconds, value = timed(fn)
        out.append((name, seconds))
        return value

    step("index catch-up (nothing new)", lambda: indexer.run_index(settings))
    step("closed check", lambda: offsets.check_closed(horizon.horizon(settings), hour + HOUR, settings))
    plan = step("plan from the index", lambda: plan_of(settings, hour))
    from pyspark.sql import functions as F

    from views.event_frames import EVENT_COLUMNS, parse_events

    def digest(frame: Any) -> Any:  # touches every column, so no parsing is pruned away
        return frame.select(F.sum(F.hash(*(c for c in EVENT_COLUMNS if c != "dims"), F.map_values("dims")))).collect()

    parsed = parse_events(compute.extract(spark, settings, plan)).where("parsed_ok")
    step(PARSE_ONLY, lambda: digest(parsed))
    step(DEDUPE_ONLY, lambda: digest(transform.dedupe(parsed)))
    done = step(
        "one pass: read, parse, dedupe, aggregate, rollups (compute.compute)",
        lambda: compute.compute(spark, settings, plan),
    )
    t_session = time.monotonic()
    with session(settings) as sess:
        store = BatchStore(settings, sess)
        out.append(("Cassandra session + prepared statements", time.monotonic() - t_session))
        n_rows = sum(len(v) for v in done.minutes.values()) + sum(len(v) for v in done.hours.values())
        step(
            f"load: {n_rows} rows, swap, daily rollup, lineage (load.load)",
            lambda: load.load(store, plan, done, force=True, code="bench"),
        )
    return out


def warm_up(spark: Any, warmup: Settings, hour: datetime, events: int) -> None:
    """Index, read and recompute the warm-up topic's hour: JIT, code generation, connector classes and the Cassandra
    driver, so no measured step pays for them (every figure, the indexer's and its baseline's included, is warm)."""
    if not events:
        print("no warm-up (--warmup-events 0): the first measured step pays for the JIT")
        return
    indexer.run_index(warmup)
    warm_plan = plan_of(warmup, hour)
    t_warm = time.monotonic()
    assert bare_count(spark, warmup, warm_plan) == events
    assert recompute(spark, warmup, hour).counts["kept"] == events
    print(f"warm-up on {events:,} events: {time.monotonic() - t_warm:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--warmup-events", type=int, default=50_000)
    parser.add_argument("--stages", action="store_true", help="also time the steps of one recompute")
    parser.add_argument("--smoke", action="store_true", help=f"tiny sizes, every check kept (CI): {SMOKE}")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
        print("smoke: tiny sizes, figures not comparable")

    base = Settings()
    run = uuid.uuid4().hex[:6]
    topic, warm_topic = f"bench.batch.{run}", f"bench.batch.warm.{run}"
    keyspace = f"bench_{run}"
    settings = base.model_copy(
        update={
            "kafka": base.kafka.model_copy(update={"events_topic": topic}),
            "cassandra": base.cassandra.model_copy(update={"keyspace": keyspace}),
            "views": base.views.model_copy(update={"slice_dims": ["origin"]}),
        }
    )
    warmup = settings.model_copy(update={"kafka": settings.kafka.model_copy(update={"events_topic": warm_topic})})
    # A fixed, closed hour a few days ago; the warm-up uses the day before it (its own rows, same keyspace).
    hour = (datetime.now(UTC) - timedelta(days=3)).replace(minute=0, second=0, microsecond=0)
    warm_hour = hour - timedelta(days=1)
    parts = base.kafka.partitions

    def spec(name: str) -> topics.TopicSpec:
        events = topics.topic_specs(settings.kafka.model_copy(update={"events_topic": name}))[0]
        return topics.TopicSpec(name, parts, base.kafka.replication_factor, {**events.config, "retention.ms": "-1"})

    spark = None
    try:
        topics.ensure_topics(settings.kafka, [spec(topic), spec(warm_topic)])
        migrations.migrate(settings)
        fill_hour(settings, hour, args.events, parts)
        if args.warmup_events:
            fill_hour(warmup, warm_hour, args.warmup_events, parts)

        from infra.spark import get_spark

        spark = get_spark(settings, "bench")
        warm_up(spark, warmup, warm_hour, args.warmup_events)

        warm = "warm" if args.warmup_events else "cold"
        index_s, indexed = timed(lambda: indexer.run_index(settings))
        plan = plan_of(settings, hour)
        assert plan.records == args.events, (plan.records, args.events)
        print(f"offsets of the hour: {plan.hours[0].to_json()} ({plan.records:,} records)")
        bare_index_s, _ = timed(lambda: bare_count(spark, settings, plan))
        print(
            f"indexer ({warm}): {indexed.records:,} records in {index_s:.1f} s ({indexed.records / index_s:,.0f}/s) "
            f"vs bare Spark read + count of them ({warm}) {bare_index_s:.1f} s "
            f"({indexed.records / bare_index_s:,.0f}/s): ratio {bare_index_s / index_s:.2f} (goal >= 0.5)"
        )

        bare_s: list[float] = []
        recompute_s: list[float] = []
        for i in range(args.repeat):
            seconds, counted = timed(lambda: bare_count(spark, settings, plan))
            assert counted == args.events, (counted, args.events)
            bare_s.append(seconds)
            seconds, result = timed(lambda: recompute(spark, settings, hour))
            assert result.counts["kept"] == args.events, result.counts
            assert result.offsets == plan.hours[0].to_json(), (result.offsets, plan.hours[0].to_json())
            recompute_s.append(seconds)
            print(f"  round {i + 1}: bare {bare_s[-1]:.1f} s, recompute {recompute_s[-1]:.1f} s | {result.line()}")

        bare, recomp = statistics.median(bare_s), statistics.median(recompute_s)
        print(
            f"indexer {index_s:.1f} s vs the median bare read + count of the rounds {bare:.1f} s: "
            f"ratio {bare / index_s:.2f} (both {warm}; the first read of a topic above also sets up its consumers)"
        )
        ratio = bare / recomp
        print(
            f"\n1 hour of {args.events:,} events, {parts} partitions, {settings.spark.master}, median of {args.repeat}:"
        )
        print(f"  {'bare Kafka batch read -> count':34} {bare:7.1f} s {args.events / bare:>10,.0f} events/s")
        print(f"  {'batch recompute (job.run)':34} {recomp:7.1f} s {args.events / recomp:>10,.0f} events/s")
        verdict = "PASS" if ratio >= GOAL else "MISS"
        print(f"  ratio = bare s / recompute s = {ratio:.2f} (goal >= {GOAL}), both {warm} {verdict}")

        hourly, minute_sum = hourly_count(settings, hour)
        ok = hourly == args.events and minute_sum == args.events
        print(
            f"  batch view, slice '{GLOBAL_SLICE}', {hour:%Y-%m-%dT%H:%MZ}: hourly row {hourly}, "
            f"sum of minute rows {minute_sum:,} (expected {args.events:,}) {'OK' if ok else 'WRONG'}"
        )

        if args.stages:
            print("\nstages of one recompute (production functions called one by one):")
            timings = stages(spark, settings, hour)
            for name, seconds in timings:
                print(f"  {name:58} {seconds:6.1f} s")
            # the probes re-read the records on their own: they are not steps of the recompute
            total = sum(seconds for name, seconds in timings if name not in (PARSE_ONLY, DEDUPE_ONLY))
            print(f"  {'total of the recompute steps (probes excluded)':58} {total:6.1f} s")
            alone = dict(timings)
            for name in (PARSE_ONLY, DEDUPE_ONLY):
                print(
                    f"  ceiling set by '{name}' ({args.events / alone[name]:,.0f} events/s): "
                    f"ratio {bare / alone[name]:.2f}"
                )
            print(
                f"  recompute / its own read + decode + dedupe ceiling: {alone[DEDUPE_ONLY] / recomp:.2f} "
                "(goal >= 0.85)"
            )
        if not ok:
            raise SystemExit(1)
    finally:
        if spark is not None:
            spark.stop()
        for name in (topic, warm_topic):
            try:
                topics.delete_topics(settings.kafka, [name])
            except Exception as exc:  # noqa: BLE001 - clean-up of a topic that may not exist
                print(f"(topic {name} not deleted: {exc})")
        with session(settings) as sess:
            sess.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")


if __name__ == "__main__":
    main()
