"""The workload the cluster tests push through the pipeline, and the answer they compare: one place for both."""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

from confluent_kafka import KafkaError, Message, Producer

from infra.cassandra import session
from infra.settings import Settings
from infra.settings_env import to_env
from serving import queries, window
from serving.reader import ViewReader
from stack.services.spark import SparkMaster
from tests.helpers import VENV, run_trends
from views.event import Event

HOUR = timedelta(hours=1)
MINUTE = timedelta(minutes=1)


def events(seed: str, start: datetime, n: int = 20_000, span: timedelta = 2 * HOUR) -> list[Event]:
    """Return ``n`` events over ``span`` from ``start`` (Pareto items, 3,000 users, two origins), by event time."""
    rng = random.Random(seed)
    return sorted(
        (
            Event(id=f"c{i}", ts=start + timedelta(milliseconds=rng.randrange(int(span.total_seconds() * 1000))),
                  item=f"#c{min(int(rng.paretovariate(1.2)), 80)}", user=f"u{rng.randrange(3000)}",
                  value=round(rng.lognormvariate(3, 1), 3), dims={"origin": rng.choice(["JFK", "LAX"])})
            for i in range(n)
        ),
        key=lambda e: e.ts,
    )  # fmt: skip


class Delivery:
    """Counts what the broker acknowledged and keeps every delivery error."""

    def __init__(self) -> None:
        self.acked = 0
        self.errors: list[KafkaError] = []

    def __call__(self, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self.acked += 1
        else:
            self.errors.append(err)


def producer(settings: Settings) -> Producer:
    """Return an idempotent producer that waits for all in-sync replicas, as ingestion's is."""
    return Producer({**settings.kafka.client_config(), "enable.idempotence": True, "acks": "all", "linger.ms": 20})


def produce(prod: Producer, topic: str, batch: list[Event], delivery: Delivery) -> None:
    """Produce events keyed by item with their event time as the record timestamp."""
    for e in batch:
        prod.produce(topic, key=e.item, value=e.to_json(), timestamp=e.ts_ms, on_delivery=delivery)
        prod.poll(0)


def close_partitions(prod: Producer, topic: str, at: datetime, partitions: int, delivery: Delivery) -> None:
    """Write one late-enough event to every partition so the batch layer sees the interval as closed."""
    for p in range(partitions):
        closer = Event(id=f"closer{p}", ts=at, item="#closer")
        prod.produce(topic, value=closer.to_json(), timestamp=closer.ts_ms, partition=p, on_delivery=delivery)


def produce_two_hours(settings: Settings, run: str, start: datetime) -> list[Event]:
    """Produce the workload's two hours from ``start`` into the settings' topic (4 partitions), then close them."""
    topic = settings.kafka.events_topic
    batch = events(run, start)
    delivery = Delivery()
    prod = producer(settings)
    produce(prod, topic, batch, delivery)
    close_partitions(prod, topic, start + 4 * HOUR, 4, delivery)
    assert prod.flush(30) == 0 and delivery.errors == []
    return batch


def completed_apps(settings: Settings) -> Counter[str]:
    """Return how many applications of each name the standalone master has completed."""
    return Counter(a["name"] for a in SparkMaster(settings).state().get("completedapps", []))


def wait_apps(settings: Settings, before: Counter[str], want: Counter[str], timeout_s: float = 30) -> None:
    """Wait (bounded) until the master lists exactly ``want`` as completed since ``before``."""
    deadline = time.monotonic() + timeout_s
    while (got := completed_apps(settings) - before) != want and time.monotonic() < deadline:
        time.sleep(1)
    assert got == want, got


def trends(settings: Settings, *args: str, extra_env: dict[str, str] | None = None, timeout: float = 600) -> str:
    """Run a ``trends`` command with exactly these settings; return its output, failing with its tail."""
    env = {**os.environ, **to_env(settings), **(extra_env or {})}
    return run_trends(VENV, env, *args, timeout=timeout, stdout_only=True)


def scoped(base: Settings, topic: str, keyspace: str, tmp: Path) -> Settings:
    """Return settings for one test run: its own topic, keyspace and checkpoints; one slice dimension."""
    return base.model_copy(
        update={
            "kafka": base.kafka.model_copy(update={"events_topic": topic}),
            "cassandra": base.cassandra.model_copy(update={"keyspace": keyspace}),
            "batch": base.batch.model_copy(update={"lateness_s": 300, "grace_s": 300}),
            "views": base.views.model_copy(update={"slice_dims": ["origin"]}),
            "speed": base.speed.model_copy(update={"allowed_lateness_s": 3600}),
            "metrics": base.metrics.model_copy(update={"speed_port": 0}),
            "spark": base.spark.model_copy(update={"checkpoint_root": str(tmp / "checkpoints")}),
        }
    )


def answer(settings: Settings, start: datetime, end: datetime, slice_: str = "*") -> queries.Summary:
    """Return the merged summary of a window, as ``trends query summary`` computes it."""
    with session(settings) as sess:
        return queries.summary(window.load(ViewReader(settings, sess), start, end, slice_), top_n=5)


def per_minute(settings: Settings, start: datetime, end: datetime, slice_: str = "*") -> list[int]:
    """Return the merged event count of every minute of a window (zeros included), as ``trends query series``."""
    with session(settings) as sess:
        w = window.load(ViewReader(settings, sess), start, end, slice_, coarsest="minute", fields=())
    return [int(p["count"]) for p in queries.series(w, "minute").points]


def users_per_minute(settings: Settings, start: datetime, end: datetime) -> list[float]:
    """Return the distinct-users estimate of every minute of a window (one read of all the minutes)."""
    minutes = [(start + i * MINUTE, start + (i + 1) * MINUTE) for i in range(int((end - start) / MINUTE))]
    with session(settings) as sess:
        windows = window.load_many(ViewReader(settings, sess), minutes, "*", "minute", queries.NEEDS["users"])
    return [queries.users(w).users for w in windows]


def true_per_minute(batch: list[Event], start: datetime, end: datetime) -> list[int]:
    """Return the exact count of every minute of a window, from the events themselves."""
    counts = [0] * int((end - start) / MINUTE)
    for e in batch:
        if start <= e.ts < end:
            counts[int((e.ts - start) / MINUTE)] += 1
    return counts


def same_answers(
    on_cluster: Settings, local: Settings, events: list[Event], window: tuple[datetime, datetime], layer: str
) -> None:
    """Check that the cluster's run and the local one answer the window alike, from ``layer``, and exactly.

    Counts (in all, per minute and per slice) are exact and equal, the top items and their bounds equal, the distinct
    users within the HLL bounds of both. The users estimate of a union of HLL sketches holding the same users is the
    same only when every sketch is in HLL mode (registers are merged by max): a sketch of a few hundred users is still a
    list of coupons, which the union adds one by one, in whatever order that sketch was built in, into an estimator
    (HIP) that depends on the order. So the speed view's 120 small minute sketches, built from partial aggregates
    merged in a different order on the cluster, give the window a slightly different estimate (measured: 2,986.5 on
    the cluster, 2,991.1 locally, for 2,9xx users), while each minute's own estimate, a count of its coupons, is equal;
    the batch view's two hour sketches are in HLL mode, and their union is identical.
    """
    cluster_answer, local_answer = answer(on_cluster, *window), answer(local, *window)
    for a in (cluster_answer, local_answer):
        assert {p["layer"] for p in a.provenance.spans} == {layer} and not a.provenance.gaps, a.provenance
    assert cluster_answer.events == local_answer.events == len(events)
    cluster_minutes, local_minutes = per_minute(on_cluster, *window), per_minute(local, *window)
    assert cluster_minutes == local_minutes == true_per_minute(events, *window)
    users = len({e.user for e in events})
    for a, b in ((cluster_answer, local_answer), (local_answer, cluster_answer)):
        assert a.users_lower <= users <= a.users_upper
        assert a.users_lower <= b.users <= a.users_upper
    if layer == "batch":
        assert cluster_answer.users == local_answer.users
    else:
        assert users_per_minute(on_cluster, *window) == users_per_minute(local, *window)
    assert cluster_answer.top_items == local_answer.top_items
    assert [t["item"] for t in cluster_answer.top_items] == [
        i for i, _ in Counter(e.item for e in events).most_common(5)
    ]
    jfk = [answer(s, *window, "origin=JFK").events for s in (on_cluster, local)]
    assert jfk == [sum(e.dims["origin"] == "JFK" for e in events)] * 2
