"""The speed and batch jobs, unchanged, on a Spark standalone cluster (master + 2 workers from pyspark's
``spark-class``, started by the stack): the same answers as in local mode. ``make test-cluster``.

Each job runs twice over the same topic, once on the cluster and once in local mode, each into its own keyspace; the
speed job's answers (served from the speed view, before any batch run) and then the batch job's are compared, with
each other and with the events themselves.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from batch_layer import job
from infra import migrations, topics
from infra.cassandra import session
from infra.settings import Settings
from tests.cluster import workload
from tests.cluster.workload import HOUR

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]


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
    events = workload.produce_two_hours(on_cluster, run, start)
    window = (start, start + 2 * HOUR)
    try:
        master = {"TRENDS_SPARK__MASTER": spark_cluster}
        # The speed job, over the whole topic: on the cluster, then in local mode; only the first reaches the master.
        apps_before = workload.completed_apps(stack_up)
        workload.trends(on_cluster, "speed", "run", "--available-now", extra_env=master)
        workload.trends(local, "speed", "run", "--available-now")
        workload.wait_apps(stack_up, apps_before, Counter({"trends-speed": 1}))
        workload.same_answers(on_cluster, local, events, window, "speed")

        # The batch job over the window: on the cluster, then in local mode; both answers now come from the batch view.
        window_args = ("--start", window[0].isoformat(), "--end", window[1].isoformat())
        workload.trends(on_cluster, "batch", "run", *window_args, extra_env=master)
        job.run(local, *window, spark=spark)
        workload.wait_apps(stack_up, apps_before, Counter({"trends-speed": 1, "trends-batch": 1}))
        workload.same_answers(on_cluster, local, events, window, "batch")
    finally:
        with session(stack_up) as sess:
            for s in (on_cluster, local):
                sess.execute(f"DROP KEYSPACE IF EXISTS {s.cassandra.keyspace}")
        topics.delete_topics(stack_up.kafka, [topic])
