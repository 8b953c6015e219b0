"""The speed and batch jobs, unchanged, on a Spark standalone cluster (master + 2 workers from pyspark's
``spark-class``, started by the stack): the same answers as in local mode. ``make test-cluster``.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from batch_layer import job
from infra import migrations, stack, topics
from infra.cassandra import session
from infra.settings import Settings
from ingestion.model import Event
from serving import queries
from serving.store import ViewReader

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]

TRENDS = str(Path(sys.executable).parent / "trends")
HOUR = timedelta(hours=1)


@pytest.fixture(scope="module")
def spark_cluster(stack_up: Settings) -> Iterator[str]:
    results = stack.up(stack_up, stack.SPARK_CLUSTER)
    yield stack.SparkMaster(stack_up).url
    started = [r.name for r in results if not r.already_running]
    if started and not os.environ.get("TRENDS_TEST_KEEP_STACK"):
        stack.down(stack_up, started)


def scoped(base: Settings, topic: str, keyspace: str, tmp: Path) -> Settings:
    return base.model_copy(
        update={
            "kafka": base.kafka.model_copy(update={"events_topic": topic}),
            "cassandra": base.cassandra.model_copy(update={"keyspace": keyspace}),
            "batch": base.batch.model_copy(update={"lateness_s": 300, "grace_s": 300}),
            "views": base.views.model_copy(update={"slice_dims": ["origin"]}),
            "speed": base.speed.model_copy(update={"metrics_port": 0, "allowed_lateness_s": 3600}),
            "spark": base.spark.model_copy(update={"checkpoint_root": str(tmp / "checkpoints")}),
        }
    )


def answer(settings: Settings, start: datetime, end: datetime) -> queries.Summary:
    with session(settings) as sess:
        return queries.summary(queries.load(ViewReader(settings, sess), start, end, "*"), top_n=5)


def test_speed_and_batch_jobs_on_a_standalone_cluster(
    stack_up: Settings, spark_cluster: str, spark: Any, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    topic = f"test.cluster.{run}"
    topics.ensure_topics(stack_up.kafka, [topics.TopicSpec(topic, 4, 1, {"retention.ms": "-1"})])
    on_cluster = scoped(stack_up, topic, f"test_cl_{run}", tmp_path / "cluster")
    local = scoped(stack_up, topic, f"test_lo_{run}", tmp_path / "local")
    for s in (on_cluster, local):
        migrations.migrate(s)
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - 6 * HOUR
    rng = random.Random(run)
    events = sorted(
        (
            Event(id=f"c{i}", ts=start + timedelta(milliseconds=rng.randrange(2 * 3_600_000)),
                  item=f"#c{min(int(rng.paretovariate(1.2)), 80)}", user=f"u{rng.randrange(3000)}",
                  value=round(rng.lognormvariate(3, 1), 3), dims={"origin": rng.choice(["JFK", "LAX"])})
            for i in range(20_000)
        ),
        key=lambda e: e.ts,
    )  # fmt: skip
    producer = Producer({**on_cluster.kafka.client_config(), "enable.idempotence": True, "acks": "all"})
    for e in events:
        producer.produce(topic, key=e.item, value=e.to_json(), timestamp=e.ts_ms)
        producer.poll(0)
    for p in range(4):
        closer = Event(id=f"closer{p}", ts=start + 4 * HOUR, item="#closer")
        producer.produce(topic, value=closer.to_json(), timestamp=closer.ts_ms, partition=p)
    assert producer.flush(30) == 0
    window = (start, start + 2 * HOUR)
    try:
        env = {**os.environ, **on_cluster.to_env(), "TRENDS_SPARK__MASTER": spark_cluster}
        for args in (
            ["speed", "run", "--available-now"],
            ["batch", "run", "--start", window[0].isoformat(), "--end", window[1].isoformat()],
        ):
            proc = subprocess.run([TRENDS, *args], env=env, capture_output=True, text=True, timeout=600, check=False)
            assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        apps = stack.SparkMaster(stack_up).state().get("completedapps", [])
        assert {a["name"] for a in apps} >= {"trends-speed", "trends-batch"}, apps

        job.run(local, *window, spark=spark)  # the same batch job in local mode, for comparison
        cluster_answer, local_answer = answer(on_cluster, *window), answer(local, *window)
        assert cluster_answer.events == local_answer.events == len(events)
        assert cluster_answer.users == local_answer.users  # HLL unions are order-independent: identical
        assert cluster_answer.users_lower <= len({e.user for e in events}) <= cluster_answer.users_upper
        assert [t["item"] for t in cluster_answer.top_items] == [t["item"] for t in local_answer.top_items]
        assert {p["layer"] for p in cluster_answer.provenance.spans} == {"batch"}
    finally:
        with session(stack_up) as sess:
            for s in (on_cluster, local):
                sess.execute(f"DROP KEYSPACE IF EXISTS {s.cassandra.keyspace}")
        topics.delete_topics(stack_up.kafka, [topic])
