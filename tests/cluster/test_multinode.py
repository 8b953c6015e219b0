"""The pipeline on a 3-broker Kafka (replication factor 3, min ISR 2) and a 2-node Cassandra (replication factor 2)
started by the stack on 127.0.0.x addresses: the same answers as on the single-node stack. ``make test-cluster``.

One broker is SIGKILLed half-way through producing: with acks=all and min.insync.replicas=2 the producer carries
on against the other two (no delivery error, nothing lost), and the broker rejoins and catches up before the jobs run.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from infra import migrations, topics
from infra.cassandra import session
from infra.settings import Settings
from serving import queries
from stack import control
from stack.process import signal_group
from stack.services.kafka import Kafka
from tests.cluster import workload
from tests.cluster.workload import HOUR
from tests.helpers import drop_keyspace
from views.event import Event

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800)]


def multinode(base: Settings) -> Settings:
    """Return settings for a local cluster beside the single-node stack: same ports, other loopback addresses."""
    port = base.kafka.first_broker[1]
    return base.model_copy(
        update={
            "data_dir": base.data_dir / "multinode",
            "kafka": base.kafka.model_copy(
                update={
                    "bootstrap_servers": ",".join(f"127.0.0.{n}:{port}" for n in (11, 12, 13)),
                    "replication_factor": 3,
                    "min_insync_replicas": 2,
                }
            ),
            "cassandra": base.cassandra.model_copy(
                update={"contact_points": ["127.0.0.21", "127.0.0.22"], "replication_factor": 2}
            ),
            # JMX listens on 127.0.0.1 whatever the node's address: keep clear of the single node's port
            "stack": base.stack.model_copy(update={"cassandra_jmx_port": base.stack.cassandra_jmx_port + 100}),
        }
    )


@pytest.fixture(scope="module")
def cluster(settings: Settings) -> Iterator[Settings]:
    """Start (or reuse) the 3 brokers and 2 Cassandra nodes; stop them afterwards if this test started them."""
    multi = multinode(settings)
    t0 = time.monotonic()
    results = control.up(multi)
    print(f"local cluster up in {time.monotonic() - t0:.1f} s: {[r.name for r in results]}")
    yield multi
    if any(not r.already_running for r in results) and not os.environ.get("TRENDS_TEST_KEEP_STACK"):
        control.down(multi)


def in_sync(settings: Settings, topic: str) -> list[int]:
    """Return the number of in-sync replicas of each partition of a topic."""
    md = AdminClient(settings.kafka.client_config()).list_topics(topic, timeout=10)
    return [len(p.isrs) for _, p in sorted(md.topics[topic].partitions.items())]


def exact(events: list[Event], start: datetime, end: datetime, origin: str | None = None) -> list[Event]:
    return [e for e in events if start <= e.ts < end and (origin is None or e.dims.get("origin") == origin)]


def check(answer: queries.Summary, events: list[Event], layer: str) -> None:
    """Counts exact, users within the HLL bounds, top items within their bounds, served by the expected layer."""
    assert answer.events == len(events)
    assert answer.users_lower <= len({e.user for e in events}) <= answer.users_upper
    counts = Counter(e.item for e in events)
    for t in answer.top_items:
        assert t["lower"] <= counts[t["item"]] <= t["upper"], t
    assert [t["item"] for t in answer.top_items] == [i for i, _ in counts.most_common(5)]
    assert {s["layer"] for s in answer.provenance.spans} == {layer}


def test_same_answers_on_3_brokers_and_2_cassandra_nodes(stack_up: Settings, cluster: Settings, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:8]
    topic = f"test.multinode.{run}"
    one = workload.scoped(stack_up, topic, f"test_one_{run}", tmp_path / "one")
    multi = workload.scoped(cluster, topic, f"test_multi_{run}", tmp_path / "multi")
    topics.ensure_topics(one.kafka, [topics.TopicSpec(topic, 4, 1, {"retention.ms": "-1"})])
    topics.ensure_topics(
        multi.kafka, [topics.TopicSpec(topic, 4, 3, {"retention.ms": "-1", "min.insync.replicas": "2"})]
    )
    for s in (one, multi):
        migrations.migrate(s)
    try:
        # the replication is real: 3 replicas of every partition, and a keyspace with 2 replicas on 2 nodes
        assert in_sync(multi, topic) == [3, 3, 3, 3]
        with session(multi) as sess:
            assert [r.peer for r in sess.execute("SELECT peer FROM system.peers_v2")] != []
            ks = sess.execute(
                "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = %s", [multi.cassandra.keyspace]
            ).one()
            assert ks.replication["replication_factor"] == "2"

        start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - 6 * HOUR
        events = workload.events(run, start)
        window = (start, start + 2 * HOUR)
        half = len(events) // 2
        for s in (one, multi):
            delivery = workload.Delivery()
            prod = workload.producer(s)
            workload.produce(prod, topic, events[:half], delivery)
            assert prod.flush(60) == 0
            if s is multi:  # one broker dies hard; acks=all with min ISR 2 carries on on the other two
                victim = Kafka(multi, 2)
                pid = victim.pid()
                assert pid is not None
                signal_group(pid, signal.SIGKILL)
                victim.stop()  # reaps it and clears the pid file
            workload.produce(prod, topic, events[half:], delivery)
            workload.close_partitions(prod, topic, start + 4 * HOUR, 4, delivery)
            assert prod.flush(180) == 0
            assert delivery.errors == [] and delivery.acked == len(events) + 4
        assert min(in_sync(multi, topic)) == 2  # written while a replica was down …
        control.up(multi, ["kafka-3"])
        deadline = time.monotonic() + 120
        while in_sync(multi, topic) != [3, 3, 3, 3] and time.monotonic() < deadline:
            time.sleep(1)
        assert in_sync(multi, topic) == [3, 3, 3, 3]  # … and the restarted broker caught up

        for s in (one, multi):
            workload.trends(s, "speed", "run", "--available-now")
        speed_one, speed_multi = workload.answer(one, *window), workload.answer(multi, *window)
        for a in (speed_one, speed_multi):
            check(a, exact(events, *window), "speed")
        assert speed_one.top_items == speed_multi.top_items

        for s in (one, multi):
            workload.trends(s, "batch", "run", "--start", window[0].isoformat(), "--end", window[1].isoformat())
        batch_one, batch_multi = workload.answer(one, *window), workload.answer(multi, *window)
        for a in (batch_one, batch_multi):
            check(a, exact(events, *window), "batch")
        assert batch_one.users == batch_multi.users  # HLL unions are order-independent: identical
        assert batch_one.top_items == batch_multi.top_items
        jfk = [workload.answer(s, *window, "origin=JFK").events for s in (one, multi)]
        assert jfk == [len(exact(events, *window, "JFK"))] * 2
    finally:
        for s in (one, multi):
            drop_keyspace(s, s.cassandra.keyspace)
            topics.delete_topics(s.kafka, [topic])
