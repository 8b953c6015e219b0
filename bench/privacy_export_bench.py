"""Export benchmark: what finding one subject's events costs, against a bare scan of the whole topic for them.

Run: ``.venv/bin/python bench/privacy_export_bench.py [--hours 8760] [--per-hour 20]`` with the stack up
(``trends stack up``). Everything runs against a throw-away topic, keyspace and subject key, deleted at the end.

1. A topic of 4 partitions receives ``--hours`` hours of history (``--per-hour`` events an hour from 200 users,
   keyed by item, in time order) plus two subjects: ``sparse`` (one event a day) and ``dense`` (one event every
   hour); the subject store records every user's pseudonym and hours, and the batch layer's indexer indexes it.
2. ``privacy.export.export`` of each subject (the hours from the subject store, their offset spans from the index,
   only those read from Kafka), against the bare alternative measured in the same run: one consumer reading every
   record of the topic and keeping the subject's (``bare``). Prints seconds, records read and ratio = bare s /
   export s, and checks each export found exactly the subject's events (exit 1 when not).
3. ``forget`` of each subject: ``sparse`` unlinked, ``dense`` excluded (its recompute not run: no Airflow here); the
   time of its part done at once, the hours it found, and an export after it that must find nothing.
Figures only, from a shared machine: nothing is asserted about timing. ``--smoke``: two days of 5 events an hour.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from infra import migrations, topics
from infra.cassandra import session
from infra.privacy.ledger import Request
from infra.privacy.subjects import SubjectStore, ensure_key_file
from infra.settings import Settings
from privacy.erasure import forget
from privacy.export import export
from views.event import Event
from views.indexing.indexer import run_index

PARTITIONS = 4


def bare_scan(settings: Settings, topic: str, pseudonym: str) -> tuple[int, int, float]:
    """Read the whole topic with one consumer; return (the subject's events, records read, seconds)."""
    t0 = time.monotonic()
    consumer = Consumer({**settings.kafka.client_config(), "group.id": uuid.uuid4().hex, "enable.auto.commit": False})
    ends = {}
    for p in range(PARTITIONS):
        _, ends[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    found = read = 0
    done = {p for p, end in ends.items() if end == 0}
    while len(done) < PARTITIONS:
        for msg in consumer.consume(10_000, 1.0):
            if msg.error() is not None:
                continue
            read += 1
            value = msg.value()
            if pseudonym.encode() in value and json.loads(value).get("user") == pseudonym:
                found += 1
            if msg.offset() >= ends[msg.partition()] - 1:
                done.add(msg.partition())
    consumer.close()
    return found, read, time.monotonic() - t0


def forget_lanes(settings: Settings, store: SubjectStore, wanted: dict[str, int]) -> bool:
    """Time a forget in each mode over the year (its part at once: Airflow's recompute is the backfill bench's).

    ``sparse`` is unlinked, ``dense`` excluded with a trigger that only keeps the hours it is handed (this bench runs
    no Airflow). Each must find every hour of its subject, and the export must then find nothing.
    """
    handed: list[int] = []

    def keep_hours(_settings: Settings, request: Request) -> list[str]:
        handed.append(len(request.hours))
        return ["bench"]

    ok = True
    for who, exclude in (("sparse", False), ("dense", True)):
        t0 = time.perf_counter()
        result = forget(settings, who, exclude=exclude, store=store, trigger=keep_hours)
        took = time.perf_counter() - t0
        after = export(settings, who, lambda _v: None, store=store)
        hours = 0 if result.request is None else len(result.request.hours)
        ok &= hours == wanted[who] and after.events == 0
        mode = "exclude" if exclude else "unlink"
        print(
            f"forget --{mode} {who}: {result.outcome} ({result.request.state if result.request else '-'}) in "
            f"{took:.2f} s, {hours} hour(s) found{f', {handed[-1]} handed to the recompute' if exclude else ''}; "
            f"export after it: {after.events} events"
        )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hours", type=int, default=8760)
    parser.add_argument("--per-hour", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="Every step on two days of 5 events an hour (CI).")
    args = parser.parse_args()
    if args.smoke:
        args.hours, args.per_hour = 48, 5

    base = Settings()
    run = uuid.uuid4().hex[:8]
    topic, keyspace = f"bench.privacy.{run}", f"bench_privacy_{run}"
    key_dir = Path(tempfile.mkdtemp(prefix="trends-privacy-bench-"))
    ensure_key_file(key_dir / "subject.key")
    settings = base.model_copy(
        update={
            "kafka": base.kafka.model_copy(update={"events_topic": topic}),
            "cassandra": base.cassandra.model_copy(update={"keyspace": keyspace}),
            "privacy": base.privacy.model_copy(update={"subject_key_file": key_dir / "subject.key"}),
        }
    )
    topics.ensure_topics(settings.kafka, [topics.TopicSpec(topic, PARTITIONS, 1, {"retention.ms": "-1"})])
    ok = True
    try:
        migrations.migrate(settings)
        start = datetime(2025, 1, 1, tzinfo=UTC)
        users = [f"user{i}" for i in range(200)]
        with SubjectStore(settings) as store:
            pseudo = store.pseudonyms([*users, "sparse", "dense"])
            producer = Producer({**settings.kafka.client_config(), "linger.ms": 20, "compression.type": "lz4"})
            wanted = {"sparse": 0, "dense": 0}
            t0 = time.monotonic()
            for h in range(args.hours):
                hour = start + timedelta(hours=h)
                batch = [
                    Event(ts=hour + timedelta(seconds=i * 3600 // args.per_hour), item=f"#t{i % 50}", user=pseudo[u])
                    for i, u in enumerate(users[(h * 7 + j) % len(users)] for j in range(args.per_hour))
                ]
                batch.append(Event(ts=hour + timedelta(minutes=31), item="#d", user=pseudo["dense"]))
                wanted["dense"] += 1
                if h % 24 == 12:
                    batch.append(Event(ts=hour + timedelta(minutes=17), item="#s", user=pseudo["sparse"]))
                    wanted["sparse"] += 1
                for e in batch:
                    producer.produce(topic, key=e.item, value=e.to_json(), timestamp=e.ts_ms)
                producer.poll(0)
                # only the measured subjects' hours: the others' would cost writes and change nothing measured
                store.note_hours([(e.user or "", e.ts) for e in batch[args.per_hour :]])
            assert producer.flush(120) == 0
            total = args.hours * (args.per_hour + 1) + wanted["sparse"]
            print(f"history: {total} events over {args.hours} hours in {time.monotonic() - t0:.1f} s")
            indexed = run_index(settings)
            print(f"index: {indexed.records} records in {indexed.seconds:.1f} s")
            print(f"{'subject':<8} {'hours':>6} {'events':>7} {'read':>8} {'ranges':>6} {'export s':>9} "
                  f"{'bare s':>7} {'ratio':>6}")  # fmt: skip
            for who in ("sparse", "dense"):
                got = export(settings, who, lambda _v: None, store=store)
                found, read, bare_s = bare_scan(settings, topic, pseudo[who])
                ok &= got.events == wanted[who] == found
                print(
                    f"{who:<8} {got.hours:>6} {got.events:>7} {got.records_read:>8} {got.ranges:>6} "
                    f"{got.seconds:>9.2f} {bare_s:>7.2f} {bare_s / got.seconds:>6.2f}   (bare read {read}; phases "
                    + ", ".join(f"{k} {v:.2f} s" for k, v in got.phases_s.items())
                    + ")"
                )
            ok &= forget_lanes(settings, store, wanted)
    finally:
        with session(base) as sess:  # schema changes are slow on a busy node: wait for it
            sess.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=180)
        topics.delete_topics(base.kafka, [topic])
        shutil.rmtree(key_dir, ignore_errors=True)
    if not ok:
        print("FAILED: an export did not find exactly the subject's events", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
