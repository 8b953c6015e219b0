"""Backfill benchmark: a year of sparse history recomputed (a) with ``trends batch run`` and (b) through Airflow's
``trends_backfill`` DAG, beside a bare Spark read + count of the same offsets in the same run.

Run: ``.venv/bin/python bench/backfill_bench.py [--events 340000] [--skip-airflow]`` with the stack up (``trends
stack up``; Airflow is started here on a free port with its own data folder). Everything runs against a throw-away
topic and keyspaces, deleted at the end.

1. A topic like the events topic (its partition count, ``retention.ms=-1``) gets this week's live events first,
   then a year of history (the generator's daily cycle: every night 00-07 UTC empty, so a third of the hours, and
   every 7th day empty), replayed behind them — the case offset-by-timestamp cannot plan.
2. The indexer (``views.indexing.indexer.run_index``) is timed beside a bare Spark read + count of all the topic's
   offsets (warm session): ratio = bare s / indexer s (goal >= 0.5).
3. (a) ``trends batch run --start Y --end Y+1`` as a subprocess, end to end (Spark start, index catch-up, chunked
   passes, Cassandra writes, lineage, watermark); goal <= 120 s. (b) ``trends_backfill`` triggered through the REST
   API with the same range into a second keyspace (its own index), timed from trigger to success; goal <= 300 s.
   Each is printed with its ratio to the bare read of the year's offsets.
4. Checks: every one of the 8,760 hours has a current run in both keyspaces, and the daily rollups sum to the
   events produced; the run exits 1 when they do not. Figures only, from a shared machine: nothing is asserted
   about timing.

``--smoke`` runs the steps (but Airflow's: starting it costs a minute here; its DAG runs in ``make test`` through
``tests/services/test_batch_dag.py``) over the first two days of the year with 2,000 events, checks included.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from batch_layer import offsets
from batch_layer.publish import BatchStore
from infra import migrations, topics
from infra.airflow.client import AirflowClient
from infra.cassandra import session
from infra.dag_contract import BACKFILL_DAG, END_PARAM, START_PARAM
from infra.settings import Settings
from infra.settings_env import to_env
from ingestion.generator import SyntheticStream
from ingestion.generator_config import GeneratorConfig
from stack import control
from views.buckets import month_key
from views.event import Event
from views.indexing import indexer
from views.store.batch import BatchRows
from views.store.index import IndexStore, OffsetSpan

REPO = Path(__file__).resolve().parent.parent
CLI_GOAL_S, AIRFLOW_GOAL_S, INDEX_GOAL = 120.0, 300.0, 0.5
YEAR_START = datetime(2025, 1, 1, tzinfo=UTC)
YEAR_END = datetime(2026, 1, 1, tzinfo=UTC)
SMOKE = {"days": 2, "events": 2000, "skip_airflow": True}  # --smoke


def produce(settings: Settings, events: int, end: datetime = YEAR_END) -> tuple[int, dict[Any, int], int]:
    """Live events first, then sparse history from the year's start to ``end``; return (history events, events per
    day, hours with any)."""
    p = Producer({**settings.kafka.client_config(), "enable.idempotence": True, "acks": "all", "linger.ms": 10,
                  "batch.size": 262144, "compression.type": "lz4"})  # fmt: skip
    topic = settings.kafka.events_topic
    now = datetime.now(UTC)
    for i in range(2_000):
        e = Event(id=f"live-{i}", ts=now - timedelta(seconds=i), item=f"#l{i % 50}", user=f"l{i % 300}")
        p.produce(topic, value=e.to_json(), timestamp=e.ts_ms, partition=i % settings.kafka.partitions)
    active_hours = (end - YEAR_START).days * 16 * 6 / 7  # nights and every 7th day empty
    config = GeneratorConfig(
        seed=11,
        start=YEAR_START,
        end=end,
        event_rate=events / (active_hours * 3600),
        rate=None,
        items=5_000,
        users=50_000,
        quiet_hours=tuple(range(8)),
        gap_every_days=7,
    )
    per_day: dict[Any, int] = {}
    hours: set[int] = set()
    n = 0
    for chunk in SyntheticStream(config).chunks():
        for value, key, ts in zip(chunk.values, chunk.keys, chunk.ts_ms, strict=True):
            while True:
                try:
                    p.produce(topic, value=value, key=key, timestamp=ts)
                    break
                except BufferError:
                    p.poll(0.1)
            day = datetime.fromtimestamp(ts / 1000, UTC).date()
            per_day[day] = per_day.get(day, 0) + 1
            hours.add(ts // 3_600_000)
            n += 1
    assert p.flush(120) == 0
    return n, per_day, len(hours)


def free_port() -> int:
    """Return a free loopback port."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bare_read(spark: Any, settings: Settings) -> tuple[float, int]:
    """Count every offset of the topic with a bare Kafka batch read (the plan of one span per partition)."""
    from batch_layer.compute import extract

    with session(settings) as sess:
        states = IndexStore(settings, sess).states(settings.kafka.events_topic)
    spans = tuple(OffsetSpan(p, 0, s.next_offset - 1, s.next_offset) for p, s in states.items() if s.next_offset)
    plan = offsets.Plan(settings.kafka.events_topic, (offsets.HourPlan(YEAR_START, spans),),
                        tuple(offsets.Range(s.partition, s.first, s.last + 1) for s in spans))  # fmt: skip
    extract(spark, settings, plan).count()  # warm
    t0 = time.monotonic()
    n = extract(spark, settings, plan).count()
    return time.monotonic() - t0, n


def check(settings: Settings, produced_per_day: dict[Any, int], end: datetime = YEAR_END) -> tuple[str, bool]:
    """Return a line saying whether every hour from the year's start to ``end`` has a run and the daily rollups add
    up, and whether both hold."""
    with session(settings) as sess:
        store = BatchStore(settings, sess)
        days = [(YEAR_START + timedelta(days=i)).date() for i in range((end - YEAR_START).days)]
        hours = sum(len(store.pointers.runs(d)) for d in days)
        got: dict[Any, int] = {}
        rows = BatchRows(settings, sess)
        for month in sorted({month_key(d) for d in days}):
            got.update({day: r.events for day, r in rows.month_days("*", month).items()})
    exact = all(got.get(d, 0) == produced_per_day.get(d, 0) for d in days)
    line = f"{hours} of {24 * len(days)} hours with a current run; daily counts {'EXACT' if exact else 'WRONG'}"
    return line, exact and hours == 24 * len(days)


def checked(failed: list[str], what: str, settings: Settings, produced_per_day: dict[Any, int], end: datetime) -> None:
    """Print :func:`check`'s line of a backfill, and note it in ``failed`` when it does not hold."""
    line, ok = check(settings, produced_per_day, end)
    print(f"    {line}")
    if not ok:
        failed.append(f"{what}: {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=340_000)
    parser.add_argument("--skip-airflow", action="store_true")
    parser.add_argument("--days", type=int, default=365, help="days of the year backfilled (the default: all)")
    parser.add_argument("--smoke", action="store_true", help=f"tiny sizes, checks kept (CI): {SMOKE}")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
        print("smoke: tiny sizes, Airflow skipped, figures not comparable")
    end = YEAR_START + timedelta(days=args.days)
    failed = []

    base = Settings()
    run = uuid.uuid4().hex[:6]
    topic = f"bench.backfill.{run}"
    settings = base.model_copy(
        update={
            "kafka": base.kafka.model_copy(update={"events_topic": topic}),
            "cassandra": base.cassandra.model_copy(update={"keyspace": f"bench_bf_{run}"}),
            "views": base.views.model_copy(update={"slice_dims": ["country"]}),
        }
    )
    via_airflow = settings.model_copy(
        update={"cassandra": settings.cassandra.model_copy(update={"keyspace": f"bench_bfa_{run}"})}
    )
    spec = topics.topic_specs(settings.kafka)[0]
    spark = None
    af: AirflowClient | None = None
    try:
        topics.ensure_topics(settings.kafka, [topics.TopicSpec(topic, spec.partitions, spec.replication_factor,
                                                              {**spec.config, "retention.ms": "-1"})])  # fmt: skip
        migrations.migrate(settings)
        if not args.skip_airflow:
            migrations.migrate(via_airflow)
        t0 = time.monotonic()
        produced, per_day, busy_hours = produce(settings, args.events, end)
        empty = 24 * args.days - busy_hours
        print(f"produced 2,000 live events, then {produced:,} events of {YEAR_START:%Y} over {len(per_day)} days "
              f"({empty} of {24 * args.days:,} hours empty) in {time.monotonic() - t0:.1f} s")  # fmt: skip

        from infra.spark import get_spark

        t0 = time.monotonic()
        indexed = indexer.run_index(settings)
        index_s = time.monotonic() - t0
        spark = get_spark(settings, "bench")
        bare_s, bare_n = bare_read(spark, settings)
        spark.stop()
        spark = None
        print(f"indexer: {indexed.records:,} records in {index_s:.1f} s; bare Spark read + count {bare_n:,} in "
              f"{bare_s:.1f} s: ratio {bare_s / index_s:.2f} (goal >= {INDEX_GOAL})")  # fmt: skip

        env = {**os.environ, **to_env(settings)}
        trends = str(Path(sys.executable).parent / "trends")
        t0 = time.monotonic()
        proc = subprocess.run(
            [trends, "batch", "run", "--start", YEAR_START.isoformat(), "--end", end.isoformat()],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        cli_s = time.monotonic() - t0
        for line in (proc.stderr + proc.stdout).splitlines():
            if line.startswith(("chunk", "8760 hours", "batch watermark")) or "hours computed" in line:
                print(f"  | {line}")
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-3000:])
            raise SystemExit(1)
        print(f"(a) trends batch run, {args.days} days: {cli_s:.1f} s (goal <= {CLI_GOAL_S:.0f} s) "
              f"{'PASS' if cli_s <= CLI_GOAL_S else 'MISS'}; ratio bare read / it = {bare_s / cli_s:.3f}")  # fmt: skip
        checked(failed, "trends batch run", settings, per_day, end)

        if not args.skip_airflow:
            data = Path(f"/tmp/trends-bench-airflow-{run}")  # noqa: S108 - a throw-away Airflow home
            via_airflow = via_airflow.model_copy(
                update={
                    "data_dir": data,
                    "airflow": via_airflow.airflow.model_copy(
                        update={"api_port": free_port(), "dags_folder": REPO / "dags"}
                    ),
                }
            )
            control.up(via_airflow, ["airflow"])
            af = AirflowClient(via_airflow)
            token = af.token()
            af.wait_dag(token, BACKFILL_DAG)
            t0 = time.monotonic()
            run_id = af.trigger(token, BACKFILL_DAG, {START_PARAM: YEAR_START.isoformat(), END_PARAM: end.isoformat()})
            af.wait_run(token, BACKFILL_DAG, run_id, timeout_s=1800)
            af_s = time.monotonic() - t0
            verdict = "PASS" if af_s <= AIRFLOW_GOAL_S else "MISS"
            print(f"(b) Airflow trends_backfill, {args.days} days: {af_s:.1f} s (goal <= {AIRFLOW_GOAL_S:.0f} s) "
                  f"{verdict}; ratio bare read / it = {bare_s / af_s:.3f}")  # fmt: skip
            checked(failed, "trends_backfill", via_airflow, per_day, end)
    finally:
        if spark is not None:
            spark.stop()
        if af is not None:
            control.down(af.config.settings, ["airflow"])
        try:
            topics.delete_topics(settings.kafka, [topic])
        except Exception as exc:  # noqa: BLE001 - clean-up
            print(f"(topic {topic} not deleted: {exc})")
        with session(settings) as sess:
            for ks in (settings.cassandra.keyspace, *([] if args.skip_airflow else [via_airflow.cassandra.keyspace])):
                sess.execute(f"DROP KEYSPACE IF EXISTS {ks}")
    if failed:
        raise SystemExit(f"backfill bench: {'; '.join(failed)}")


if __name__ == "__main__":
    main()
