"""The speed and batch jobs, unchanged, on a Spark standalone cluster (master + 2 workers from pyspark's
``spark-class``, started by the stack): the same answers as in local mode. ``make test-cluster``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from batch_layer import job
from infra import migrations, stack, topics
from infra.cassandra import session
from infra.services.spark import SparkMaster
from infra.settings import Settings
from tests.cluster import workload
from tests.cluster.workload import HOUR

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def spark_cluster(stack_up: Settings) -> Iterator[str]:
    results = stack.up(stack_up, stack.SPARK_CLUSTER)
    yield SparkMaster(stack_up).url
    started = [r.name for r in results if not r.already_running]
    if started and not os.environ.get("TRENDS_TEST_KEEP_STACK"):
        stack.down(stack_up, started)


def test_speed_and_batch_jobs_on_a_standalone_cluster(
    stack_up: Settings, spark_cluster: str, spark: Any, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    topic = f"test.cluster.{run}"
    topics.ensure_topics(stack_up.kafka, [topics.TopicSpec(topic, 4, 1, {"retention.ms": "-1"})])
    on_cluster = workload.scoped(stack_up, topic, f"test_cl_{run}", tmp_path / "cluster")
    local = workload.scoped(stack_up, topic, f"test_lo_{run}", tmp_path / "local")
    for s in (on_cluster, local):
        migrations.migrate(s)
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - 6 * HOUR
    events = workload.events(run, start)
    delivery = workload.Delivery()
    producer = workload.producer(on_cluster)
    workload.produce(producer, topic, events, delivery)
    workload.close_partitions(producer, topic, start + 4 * HOUR, 4, delivery)
    assert producer.flush(30) == 0 and delivery.errors == []
    window = (start, start + 2 * HOUR)
    try:
        master = {"TRENDS_SPARK__MASTER": spark_cluster}
        workload.trends(on_cluster, "speed", "run", "--available-now", extra_env=master)
        workload.trends(
            on_cluster,
            "batch",
            "run",
            "--start",
            window[0].isoformat(),
            "--end",
            window[1].isoformat(),
            extra_env=master,
        )
        apps = SparkMaster(stack_up).state().get("completedapps", [])
        assert {a["name"] for a in apps} >= {"trends-speed", "trends-batch"}, apps

        job.run(local, *window, spark=spark)  # the same batch job in local mode, for comparison
        cluster_answer, local_answer = workload.answer(on_cluster, *window), workload.answer(local, *window)
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
