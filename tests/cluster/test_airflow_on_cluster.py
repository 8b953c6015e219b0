"""Airflow's ``trends_backfill`` DAG submitting to the Spark standalone master through its own SparkSubmitOperator.

This is how a deployment runs the batch layer: the Airflow connection ``batch.spark_conn_id`` names the master
(``spark://host:7077``), and each mapped ``recompute`` task runs ``spark-submit`` in client mode. The driver runs in
the Airflow task's process; the executors run on the cluster's workers. The test starts a private Airflow (the
stack's own service, free ports), triggers ``trends batch backfill --wait`` over two hours, and checks two things:
the master lists the batch applications as completed, and the answers equal those of a local-mode run into a
keyspace of its own. ``make test-cluster``.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from batch_layer import job
from infra import migrations, topics
from infra.airflow.client import AirflowClient
from infra.cassandra import session
from infra.dag_contract import dags_folder
from infra.settings import Settings
from stack import control
from stack.airflow.config import AirflowConfig
from tests.cluster import workload
from tests.cluster.workload import HOUR
from tests.helpers import free_port

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1500)]


def test_the_backfill_dag_submits_to_the_standalone_master_in_client_mode(
    stack_up: Settings, spark_cluster: str, spark: Any, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    topic = f"test.afcluster.{run}"
    topics.ensure_topics(stack_up.kafka, [topics.TopicSpec(topic, 4, 1, {"retention.ms": "-1"})])
    base = workload.scoped(stack_up, topic, f"test_af_{run}", tmp_path / "cluster")
    on_cluster = base.model_copy(
        update={
            "data_dir": tmp_path / "data",  # the private Airflow's home; Kafka and Cassandra are the session's
            "spark": base.spark.model_copy(update={"master": spark_cluster}),
            "airflow": base.airflow.model_copy(update={"api_port": free_port(), "dags_folder": dags_folder()}),
        }
    )
    local = workload.scoped(stack_up, topic, f"test_afl_{run}", tmp_path / "local")
    for s in (on_cluster, local):
        migrations.migrate(s)
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - 6 * HOUR
    events = workload.produce_two_hours(on_cluster, run, start)
    window = (start, start + 2 * HOUR)
    # The connection the DAG submits through is the deployment's: it names the standalone master.
    env = AirflowConfig(on_cluster).airflow_env()
    assert spark_cluster in env[f"AIRFLOW_CONN_{on_cluster.batch.spark_conn_id.upper()}"]
    try:
        t0 = time.monotonic()
        control.up(on_cluster, ["airflow"])
        af = AirflowClient(on_cluster)
        af.wait_dag(af.token(), "trends_backfill")
        print(f"private Airflow up in {time.monotonic() - t0:.0f} s")
        before = workload.completed_apps(stack_up)
        t0 = time.monotonic()
        out = workload.trends(
            on_cluster, "batch", "backfill", "--start", window[0].isoformat(), "--end", window[1].isoformat(),
            "--wait", "--poll", "2", "--timeout", "900", timeout=1000,
        )  # fmt: skip
        print(f"trends batch backfill --wait on the cluster: {time.monotonic() - t0:.0f} s\n{out[-1500:]}")
        assert "succeeded" in out and "2 hours" in out, out
        # the chunk's spark-submit ran its executors on the cluster: the master lists it as a completed application
        workload.wait_apps(stack_up, before, Counter({"trends-batch": 1}))
        job.run(local, *window, spark=spark)
        workload.same_answers(on_cluster, local, events, window, "batch")
    finally:
        control.down(on_cluster, ["airflow"])
        with session(stack_up) as sess:
            for s in (on_cluster, local):
                sess.execute(f"DROP KEYSPACE IF EXISTS {s.cassandra.keyspace}")
        topics.delete_topics(stack_up.kafka, [topic])
