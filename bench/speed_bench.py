"""Speed layer benchmark: throughput against a bare Kafka -> noop query, and produce-to-Cassandra latency.

Run: ``.venv/bin/python bench/speed_bench.py [--events 1000000]`` with the stack up (``trends stack up``).

1. Throughput: the same topic of N events is read twice in one SparkSession with the same settings — once by a
   bare ``readStream.format("kafka") -> writeStream.format("noop")`` query, once by the speed layer (parse,
   watermark, dedupe, the four sketches, RocksDB state, update mode, Cassandra upserts) — both with
   ``availableNow`` and the same ``maxOffsetsPerTrigger``. Prints rows/s of each and the ratio (goal >= 0.6). The
   speed layer and the same with ``speed.write_rollups`` off run twice each, in turns (not in ``--smoke``): the
   better of each gives the cost of its rollups.
   Two more queries bound what is reachable: Kafka -> the same decode (``views.event_frames.parse_events``) -> noop,
   the decode's ceiling (no consumer of the JSON events beats its ratio), and the same plus the speed layer's exact
   dedupe in RocksDB (no speed layer that dedupes does). Every query is timed warm: each ran once on a small topic
   first (JIT, code generation, connector classes), and all read the same N records from the same topic.
2. Freshness: ``trends speed run`` with a 1 s trigger in its own process while events are produced at half the
   rate the speed layer *achieved* in 1; the producer's own achieved rate is measured and printed too (on a shared
   machine it may fall short of the target). The newest event time visible in Cassandra is polled every 50 ms,
   and each sampled timestamp's latency is the time until Cassandra shows it. A sample that never becomes visible
   is counted as lost and reported, and p50/p99 are taken over all samples with the lost ones as never visible
   (a p99 that falls on a lost sample is printed as such). Goal p50 <= 2 s, p99 <= 5 s. A run in which no sample
   became visible measured nothing and exits 1.

3. The events' format: the topic's records, read once in a batch and cached, are decoded in Spark three ways to the
   same event columns and aggregated the same way (a sum over every field, so every field is decoded): ``from_json``
   with ``views.event_frames.spark_schema()`` and ``SPARK_JSON_OPTIONS``, the layers' own decode
   (``views.event_frames.parse_events``), and ``from_avro`` (spark-avro, its own bundle of the jar cache) of the same
   events encoded as plain Avro binary of ``views.event.avro_schema()``. A bare scan summing the JSON's bytes is the
   baseline. All in one session, warm (one untimed run of each first), ``--decode-runs`` rounds taking each in turn;
   prints best and median rates and the ratios, and fails if the three decodes' sums differ. Runs first, its cache
   dropped before 1.

``--smoke`` runs every part on a few thousand events without the warm-up runs, with 3 s of freshness samples and one
decode round (CI: a bench that measures nothing fails). ``--decode-only`` runs 3 alone.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

from confluent_kafka import Producer

from infra import jars, migrations, topics
from infra.cassandra import session, table
from infra.settings import Settings
from infra.spark import kafka_options
from views.event import avro_schema, format_ts

# --smoke: a few thousand events, no warm-up, 3 s of freshness samples, one decode round
START_WAIT_S = 300.0  # the freshness run's wait for the speed job's first progress row
SMOKE = {"events": 3000, "warmup_events": 0, "latency_seconds": 3.0, "decode_runs": 1}
BARE, COUNTED = "bare Kafka -> noop", "bare Kafka -> count -> noop"
PARSE_ONLY = "Kafka -> decode -> noop"
DEDUPE_ONLY = "... -> exact dedupe -> noop"
ORIGINS = ["JFK", "LAX", "SFO", "ORD", "ATL"]


def event_json(rng: random.Random, i: int, ts: datetime, items: list[str], weights: list[float]) -> bytes:
    event = {
        "v": 1,
        "id": f"b{i}",
        "ts": format_ts(ts),
        "item": rng.choices(items, weights)[0],
        "user": f"u{rng.randrange(100_000)}",
        "value": round(rng.lognormvariate(3, 1), 3),
        "dims": {"origin": rng.choice(ORIGINS)},
    }
    return json.dumps(event, separators=(",", ":")).encode()


def bench_producer(settings: Settings) -> Producer:
    """Return the producer that fills a bench topic: idempotent, acks=all, batched and compressed for throughput."""
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


def fill_topic(settings: Settings, topic: str, count: int) -> None:
    rng = random.Random(7)
    items = [f"#item{i}" for i in range(2000)]
    weights = [1 / (i + 1) for i in range(len(items))]
    producer = bench_producer(settings)
    start = datetime.now(UTC) - timedelta(hours=2)
    step = timedelta(hours=1) / count  # one hour of event time, in order
    t0 = time.monotonic()
    for i in range(count):
        ts = start + step * i
        while True:
            try:
                producer.produce(
                    topic, value=event_json(rng, i, ts, items, weights), timestamp=int(ts.timestamp() * 1000)
                )
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0
    print(f"filled {topic} with {count:,} events in {time.monotonic() - t0:.1f} s")


def _timed(query: object) -> tuple[float, int]:
    t0 = time.monotonic()
    query.awaitTermination()  # type: ignore[attr-defined]
    rows = sum(p["numInputRows"] for p in query.recentProgress)  # type: ignore[attr-defined]
    return time.monotonic() - t0, rows


class CollectSink:
    """The speed layer's null sink: each micro-batch's rows reach the driver (a bucket's last state wins), unwritten.

    The peers' null sinks hand their rows to the client the same way (Flink's collect sink, quixstreams' file), so
    the speed layer's figure without Cassandra is comparable and its output still checkable.
    """

    def __init__(self) -> None:
        self.rows: dict[tuple[str, datetime], Any] = {}

    def __call__(self, batch: Any, batch_id: int) -> None:
        for r in batch.select("slice", "bucket_start", "events", "users_hll", "values_kll", "items_fi").collect():
            self.rows[(r.slice, r.bucket_start)] = r


def throughput(
    settings: Settings,
    warmup: Settings | None,
    count: int,
    collect: CollectSink | None = None,
    without_rollups: bool = True,
) -> dict[str, float]:
    """Return rows/s of the bare queries and of the speed layer, each measured after a warm-up run.

    :arg warmup: the settings of a small topic each query runs on first (None: no warm-up, the first query pays for
        the JIT).
    :arg collect: also time the speed layer with this null sink (``speed layer (null)``), its rows kept in it.
    """
    from infra.spark import get_spark
    from speed_layer import job
    from speed_layer.sink import SpeedViewSink

    spark = get_spark(settings, "bench")

    def kafka(s: Settings) -> object:
        return (
            spark.readStream.format("kafka")
            .options(**kafka_options(s.kafka))
            .option("subscribe", s.kafka.events_topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(s.speed.max_offsets_per_trigger))
            .load()
        )

    def bare(s: Settings, tag: str, counted: bool) -> object:
        frame = kafka(s)
        frame = frame.groupBy().count() if counted else frame  # type: ignore[attr-defined]
        return (
            frame.writeStream.format("noop")  # type: ignore[attr-defined]
            .outputMode("update" if counted else "append")
            .option("checkpointLocation", f"{s.checkpoint_root}/bench-{tag}-{uuid.uuid4().hex[:6]}")
            .trigger(availableNow=True)
            .start()
        )

    def floor(s: Settings, tag: str, dedupe: bool) -> object:
        """Kafka -> the speed layer's JSON parse (-> its exact dedupe in RocksDB) -> noop: no sketches, no sink."""
        from views.event_frames import parse_events, valid_events

        events = valid_events(parse_events(kafka(s)))  # type: ignore[arg-type]
        if dedupe:
            events = job.dedupe(events, s)
        return (
            events.writeStream.format("noop")
            .option("checkpointLocation", f"{s.checkpoint_root}/bench-{tag}-{uuid.uuid4().hex[:6]}")
            .trigger(availableNow=True)
            .start()
        )

    def speed(s: Settings, null_sink: CollectSink | None = None, rollups: bool = True) -> object:
        sink = SpeedViewSink(s, f"{s.speed.query_name}_{uuid.uuid4().hex[:4]}", s.speed.view_ttl_s, rollups=rollups)
        return job.start(
            spark,
            s.model_copy(update={"speed": s.speed.model_copy(update={"query_name": sink.query})}),
            cast(SpeedViewSink, null_sink) if null_sink is not None else sink,  # foreachBatch takes any callable
            available_now=True,
        )

    rates: dict[str, float] = {}
    try:
        # Warm-up on a small topic: JIT, code generation and connector classes, so no query pays for them.
        if warmup is not None:
            for query in (
                bare(warmup, "warm", False),
                bare(warmup, "warm", True),
                floor(warmup, "warm", True),
                speed(warmup),
            ):
                _timed(query)
        for name, query_factory in (
            (BARE, lambda: bare(settings, "bare", False)),
            (COUNTED, lambda: bare(settings, "count", True)),
            (PARSE_ONLY, lambda: floor(settings, "parse", False)),
            (DEDUPE_ONLY, lambda: floor(settings, "dedupe", True)),
            *([(NO_ROLLUPS, lambda: speed(settings, rollups=False))] if without_rollups else []),
            ("speed layer", lambda: speed(settings)),
            # the two again, in the other order: a busy moment or the order must not make the difference
            *([("speed layer", lambda: speed(settings))] if without_rollups else []),
            *([(NO_ROLLUPS, lambda: speed(settings, rollups=False))] if without_rollups else []),
            *([("speed layer (null)", lambda: speed(settings, collect))] if collect is not None else []),
        ):
            seconds, rows = _timed(query_factory())
            assert rows == count, (name, rows, count)
            rates[name] = max(rates.get(name, 0.0), count / seconds)  # the best of its runs
    finally:
        spark.stop()
    return rates


NO_ROLLUPS = "speed layer, no rollups"

SCAN, FROM_JSON, LAYERS_DECODE, FROM_AVRO = (
    "bare scan (sum of JSON bytes)",
    "from_json, spark_schema",
    "the layers' decode (parse_events)",
    "from_avro, avro_schema",
)


def decode_formats(spark: Any, settings: Settings, count: int, runs: int, warm: bool) -> dict[str, Any]:
    """Time the decode of the topic's events from JSON (two ways) and from Avro, cached, in this session.

    :arg runs: timed rounds; each round runs every decode once, in turn (a busy moment hits them alike).
    :arg warm: run each decode once, untimed, first.
    :returns: ``seconds`` (name -> the rounds' times), ``bytes`` (format -> mean bytes per event).
    :raises AssertionError: when a decode's sums differ from the others' (they decoded different events).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro, to_avro

    from views.event_frames import EVENT_COLUMNS, SPARK_JSON_OPTIONS, parse_events, spark_schema

    schema = avro_schema()
    avsc = json.dumps(schema)
    raw = (
        spark.read.format("kafka")
        .options(**kafka_options(settings.kafka))
        .option("subscribe", settings.kafka.events_topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
        .select("value")
    )
    js = raw.cache()
    parsed = js.select(F.from_json(F.col("value").cast("string"), spark_schema(), SPARK_JSON_OPTIONS).alias("e"))
    # The same events as plain Avro binary, encoded by Spark: the JSON leaves out empty dims, Avro requires the map.
    fields = [
        F.coalesce(F.col("e.dims"), F.create_map().cast("map<string,string>")).alias(f["name"])
        if f["name"] == "dims"
        else F.col(f"e.{f['name']}")
        for f in schema["fields"]
    ]
    avro = parsed.select(to_avro(F.struct(*fields), avsc).alias("value")).cache()
    # One job fills both caches (the Avro is encoded from the cached JSON): the smoke pays for few cold jobs.
    avro_count, avro_bytes = avro.agg(F.count("*"), F.avg(F.length("value"))).first()
    assert avro_count == count, (avro_count, count)

    def summed(events: Any) -> Any:
        """Sum every event column (a forced full decode) and count the events with an id, a time and an item."""
        return events.agg(
            F.count("*"),
            F.count_if(F.col("id").isNotNull() & F.col("ts").isNotNull() & F.col("item").isNotNull()),
            F.sum(F.length("id")),
            F.sum(F.unix_millis("ts")),
            F.sum(F.length("item")),
            F.sum(F.length("user")),
            F.sum("value"),
            F.sum(F.aggregate(F.map_values("dims"), F.lit(0), lambda acc, x: acc + F.length(x))),
        ).first()

    decodes = {
        SCAN: lambda: js.agg(F.count("*"), F.sum(F.length("value"))).first(),
        FROM_JSON: lambda: summed(parsed.select(*(F.col(f"e.{c}") for c in EVENT_COLUMNS))),
        LAYERS_DECODE: lambda: summed(parse_events(js, keep=())),
        FROM_AVRO: lambda: summed(
            avro.select(from_avro("value", avsc, {"mode": "PERMISSIVE"}).alias("e")).select(
                *(F.col(f"e.{c}") for c in EVENT_COLUMNS)
            )
        ),
    }
    seconds: dict[str, list[float]] = {name: [] for name in decodes}
    sums: dict[str, Any] = {}
    try:
        for round_ in range(runs + (1 if warm else 0)):
            for name, decode in decodes.items():
                t0 = time.monotonic()
                sums[name] = decode()
                if round_ or not warm:
                    seconds[name].append(time.monotonic() - t0)
    finally:
        js.unpersist()
        avro.unpersist()
    decoded = {name: tuple(sums[name]) for name in (FROM_JSON, LAYERS_DECODE, FROM_AVRO)}
    assert len(set(decoded.values())) == 1, decoded
    assert decoded[FROM_AVRO][:2] == (count, count), decoded  # every event decoded, and valid
    json_count, json_bytes = sums[SCAN]
    assert json_count == count, (json_count, count)
    return {"seconds": seconds, "bytes": {"JSON": json_bytes / count, "Avro": avro_bytes}}


def print_decode_formats(result: dict[str, Any], count: int, warm: bool) -> None:
    """Print each decode's best and median rate beside the bare scan's, and the Avro/JSON ratios."""
    seconds = result["seconds"]
    runs = len(seconds[SCAN])
    best = {name: min(times) for name, times in seconds.items()}
    median = {name: statistics.median(times) for name, times in seconds.items()}
    how = "warm (after an untimed run of each)" if warm else "cold"
    print(f"\ndecode of the same {count:,} events, cached, {how}, best / median of {runs} rounds, one session:")
    for name in seconds:
        print(
            f"  {name:36} {best[name]:6.2f} / {median[name]:6.2f} s  {count / best[name]:>12,.0f} / "
            f"{count / median[name]:>10,.0f} rows/s  ({best[SCAN] / best[name]:.2f} of the bare scan's best)"
        )
    size = result["bytes"]
    print(f"  bytes per event: JSON {size['JSON']:.1f}, Avro {size['Avro']:.1f} ({size['Avro'] / size['JSON']:.2f})")
    for base in (FROM_JSON, LAYERS_DECODE):
        print(
            f"  ratio from_avro / {base}: {best[base] / best[FROM_AVRO]:.2f}x faster (best), "
            f"{median[base] / median[FROM_AVRO]:.2f}x (median)"
        )


def latency(settings: Settings, env: dict[str, str], rate: float, seconds: float) -> tuple[list[float], int, float]:
    """Return the visible samples' latencies, the number of lost samples, and the producer's achieved rate."""
    trends = str(Path(sys.executable).parent / "trends")
    log = (settings.data_dir / "bench-speed-latency.log").open("wb")
    proc = subprocess.Popen(
        # earliest: the topic is this run's own, and an epoch from the beginning counts its first minute (one from
        # latest counts from the next whole minute: up to a minute of waiting for its first row)
        [trends, "speed", "run", "--trigger", "1", "--starting-offsets", "earliest"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    produced: list[float] = []
    visible: dict[float, float] = {}
    stop = threading.Event()
    try:
        with session(settings) as sess:
            progress = sess.prepare(f"SELECT newest_event_ts FROM {table(settings, 'speed_progress')} WHERE query = ?")
            # wait for the job to be up: its first (empty) batches write progress (a JVM's start and a first batch
            # took over 90 s on 2 cores busy with other Spark smokes)
            deadline = time.monotonic() + START_WAIT_S
            producer = Producer(
                {**settings.kafka.client_config(), "enable.idempotence": True, "acks": "all", "linger.ms": 5}
            )
            rng = random.Random(3)
            items = [f"#item{i}" for i in range(2000)]
            weights = [1 / (i + 1) for i in range(len(items))]
            warm = 0
            first_ts = datetime.now(UTC)
            while time.monotonic() < deadline:
                ts = datetime.now(UTC)
                producer.produce(
                    settings.kafka.events_topic,
                    value=event_json(rng, warm, ts, items, weights),
                    timestamp=int(ts.timestamp() * 1000),
                )
                producer.flush(5)
                warm += 1
                row = sess.execute(progress, (settings.speed.query_name,)).one()
                if row and row.newest_event_ts and row.newest_event_ts.replace(tzinfo=UTC) >= first_ts:
                    break
                time.sleep(1)
            else:
                raise RuntimeError(f"the speed job did not start writing within {START_WAIT_S:.0f} s")

            def poll() -> None:
                while not stop.is_set():
                    row = sess.execute(progress, (settings.speed.query_name,)).one()
                    now = time.time()
                    if row and row.newest_event_ts:
                        newest = row.newest_event_ts.replace(tzinfo=UTC).timestamp()
                        for t in produced:
                            if t not in visible and t <= newest:
                                visible[t] = now
                    time.sleep(0.05)

            poller = threading.Thread(target=poll, daemon=True)
            poller.start()
            # Payloads are made before the clock starts (the producer must keep up on two cores shared with Spark):
            # the same JSON as event_json, with the id and the time filled in per event, sent in 5 ms ticks.
            tails = []
            for _ in range(20_000):
                body = event_json(rng, 0, first_ts, items, weights)
                tails.append(body[body.index(b'","item"') :])
            t_start = time.monotonic()
            t_end = t_start
            i = 10_000_000
            next_sample = 0.0
            while (elapsed := time.monotonic() - t_start) < seconds:
                ts = datetime.now(UTC)
                stamp, millis = format_ts(ts).encode(), int(ts.timestamp() * 1000)
                due = 10_000_000 + int(elapsed * rate)
                sent = i
                while i < due:
                    value = b'{"v":1,"id":"b%d","ts":"%s' % (i, stamp) + tails[i % len(tails)]
                    try:
                        producer.produce(settings.kafka.events_topic, value=value, timestamp=millis)
                    except BufferError:
                        producer.poll(0.01)
                        continue
                    i += 1
                if i > sent and elapsed >= next_sample:  # sample a timestamp every 100 ms for latency
                    produced.append(millis / 1000)
                    next_sample += 0.1
                producer.poll(0)
                time.sleep(0.005)
            t_end = time.monotonic()
            producer.flush(30)
            settle = time.monotonic() + 8  # the samples still in flight become visible (or are lost)
            while time.monotonic() < settle and len(visible) < len(produced):
                time.sleep(0.1)
            stop.set()
            poller.join(5)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    lost = sum(1 for t in produced if t not in visible)
    achieved = (i - 10_000_000) / (t_end - t_start) if t_end > t_start else 0.0
    return [visible[t] - t for t in produced if t in visible], lost, achieved


BATCH_LINE = re.compile(rb"batch \d+: (\d+) rows in (\d+) ms")


def batch_durations(log: Path) -> list[tuple[int, int]]:
    """Return (rows, ms) of every micro-batch with rows that the freshness run's speed job logged."""
    found = [(int(m[1]), int(m[2])) for m in BATCH_LINE.finditer(log.read_bytes())] if log.exists() else []
    return [(rows, ms) for rows, ms in found if rows > 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--latency-seconds", type=float, default=60)
    parser.add_argument("--warmup-events", type=int, default=50_000, help="events of the warm-up topic (0: none)")
    parser.add_argument("--decode-runs", type=int, default=5, help="timed rounds of the JSON/Avro decode")
    parser.add_argument("--decode-only", action="store_true", help="measure the JSON/Avro decode alone")
    parser.add_argument("--smoke", action="store_true", help=f"tiny sizes, every check kept (CI): {SMOKE}")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
        print("smoke: tiny sizes, no warm-up, figures not comparable")

    base = Settings()
    run = uuid.uuid4().hex[:6]
    topic = f"bench.speed.{run}"
    keyspace = f"bench_{run}"
    settings = base.model_copy(
        update={
            "kafka": base.kafka.model_copy(update={"events_topic": topic}),
            "cassandra": base.cassandra.model_copy(update={"keyspace": keyspace}),
            "speed": base.speed.model_copy(update={"query_name": f"bench_{run}"}),
            "metrics": base.metrics.model_copy(update={"speed_port": 0}),
            "views": base.views.model_copy(update={"slice_dims": ["origin"]}),
            "spark": base.spark.model_copy(
                update={
                    "checkpoint_root": str(base.data_dir / "bench-checkpoints" / run),
                    "extra_jars": [*base.spark.extra_jars, *map(str, jars.bundle_jars(base, jars.SPARK_AVRO))],
                }
            ),
        }
    )
    topics.ensure_topics(settings.kafka, [topics.TopicSpec(topic, base.kafka.partitions, 1, {"retention.ms": "-1"})])
    migrations.migrate(settings)
    try:
        fill_topic(settings, topic, args.events)
        from infra.spark import get_spark

        # The session throughput() takes up (get_spark returns the running one) and stops.
        spark = get_spark(settings, "bench")
        t0 = time.monotonic()
        formats = decode_formats(spark, settings, args.events, args.decode_runs, warm=not args.smoke)
        print_decode_formats(formats, args.events, warm=not args.smoke)
        print(f"  (the decode comparison took {time.monotonic() - t0:.1f} s in all)")
        if args.decode_only:
            spark.stop()
            return
        warmup = None
        if args.warmup_events:
            warm_topic = f"bench.warm.{run}"
            topics.ensure_topics(settings.kafka, [topics.TopicSpec(warm_topic, base.kafka.partitions, 1, {})])
            warm_kafka = settings.kafka.model_copy(update={"events_topic": warm_topic})
            warmup = settings.model_copy(update={"kafka": warm_kafka})
            fill_topic(warmup, warm_topic, args.warmup_events)
        rates = throughput(settings, warmup, args.events, without_rollups=not args.smoke)
        speed = rates["speed layer"]
        how = "every query warm (after a warm-up run of each)" if warmup else "cold (no warm-up)"
        print(f"\nthroughput over {args.events:,} events, {how}:")
        for name, rate in rates.items():
            print(f"  {name:30} {rate:>10,.0f} rows/s")
        for name in (COUNTED, BARE):
            print(f"  ratio speed layer / {name}: {speed / rates[name]:.2f} (goal >= 0.3 to noop)")
        print(f"  ratio decode / {BARE} (the decode's ceiling): {rates[PARSE_ONLY] / rates[BARE]:.2f} (goal >= 0.75)")
        for floor_name in (PARSE_ONLY, DEDUPE_ONLY):
            ratios = ", ".join(f"{rates[floor_name] / rates[n]:.2f}" for n in (COUNTED, BARE))
            print(f"  ceiling set by '{floor_name}': {ratios} (to count, to noop)")
        print(
            f"  speed layer / its own decode + dedupe ceiling: {speed / rates[DEDUPE_ONLY]:.2f} (goal >= 0.85); "
            f"/ its decode ceiling: {speed / rates[PARSE_ONLY]:.2f}"
        )
        if NO_ROLLUPS in rates:
            print(
                f"  speed layer / the same without rollups (speed.write_rollups off): {speed / rates[NO_ROLLUPS]:.2f}"
                " (goal >= 0.9)"
            )

        lat_topic = f"bench.latency.{run}"
        topics.ensure_topics(settings.kafka, [topics.TopicSpec(lat_topic, base.kafka.partitions, 1, {})])
        lat_settings = settings.model_copy(
            update={
                "kafka": settings.kafka.model_copy(update={"events_topic": lat_topic}),
                "speed": settings.speed.model_copy(update={"query_name": f"bench_lat_{run}"}),
            }
        )
        env = {
            **os.environ,
            "TRENDS_KAFKA__EVENTS_TOPIC": lat_topic,
            "TRENDS_CASSANDRA__KEYSPACE": keyspace,
            "TRENDS_SPEED__QUERY_NAME": f"bench_lat_{run}",
            "TRENDS_METRICS__SPEED_PORT": "0",
            "TRENDS_VIEWS__SLICE_DIMS": '["origin"]',
            "TRENDS_SPARK__CHECKPOINT_ROOT": str(base.data_dir / "bench-checkpoints" / run),
        }
        rate = speed / 2
        lat, lost, achieved = latency(lat_settings, env, rate, args.latency_seconds)
        total = len(lat) + lost
        # lost samples rank after every visible one: they never became visible
        ranked = sorted(lat) + [float("inf")] * lost

        def pct(q: float) -> str:
            if not ranked:
                return "n/a"
            value = ranked[min(len(ranked) - 1, int(len(ranked) * q))]
            return "lost (never visible)" if value == float("inf") else f"{value:.2f} s"

        print(
            f"freshness, 1 s trigger: target {rate:,.0f} events/s (half the speed layer's achieved {speed:,.0f}), "
            f"producer achieved {achieved:,.0f} events/s ({achieved / rate:.0%} of the target)"
        )
        print(
            f"  {total} samples, {lost} lost ({lost / total if total else 0:.1%}): p50 {pct(0.5)}   p99 {pct(0.99)}"
            f"   (goal p50 <= 2 s, p99 <= 5 s)"
        )
        batches = batch_durations(base.data_dir / "bench-speed-latency.log")
        if batches:
            ms = sorted(d for _, d in batches)
            rows = sorted(r for r, _ in batches)
            print(
                f"  bound: the job's {len(batches)} micro-batches with rows took p50 {ms[len(ms) // 2] / 1000:.2f} s "
                f"(p90 {ms[int(len(ms) * 0.9)] / 1000:.2f} s) for p50 {rows[len(rows) // 2]:,} rows; an event waits "
                f"for the batch after the one running (trigger 1 s), then that batch's whole duration"
            )
            few, few_ms = min(batches)
            print(
                f"  the batch with the fewest rows: {few:,} rows in {few_ms / 1000:.2f} s (the fixed cost of a batch)"
            )
        if not lat:
            raise SystemExit(f"speed bench: none of {total} freshness samples became visible: nothing was measured")
    finally:
        made = [topic] if args.decode_only else [topic, f"bench.latency.{run}"]
        for name in (*made, *([f"bench.warm.{run}"] if args.warmup_events and not args.decode_only else [])):
            try:
                topics.delete_topics(settings.kafka, [name])
            except Exception as exc:  # noqa: BLE001 - clean-up of a topic that may not exist
                print(f"(topic {name} not deleted: {exc})")
        with session(settings) as sess:
            sess.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")
        shutil.rmtree(base.data_dir / "bench-checkpoints" / run, ignore_errors=True)  # the run's checkpoints


if __name__ == "__main__":
    main()
