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
from views.event import Event

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]


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
    cluster_answer, local_answer = workload.answer(on_cluster, *window), workload.answer(local, *window)
    for a in (cluster_answer, local_answer):
        assert {p["layer"] for p in a.provenance.spans} == {layer} and not a.provenance.gaps, a.provenance
    assert cluster_answer.events == local_answer.events == len(events)
    cluster_minutes, local_minutes = workload.per_minute(on_cluster, *window), workload.per_minute(local, *window)
    assert cluster_minutes == local_minutes == workload.true_per_minute(events, *window)
    users = len({e.user for e in events})
    for a, b in ((cluster_answer, local_answer), (local_answer, cluster_answer)):
        assert a.users_lower <= users <= a.users_upper
        assert a.users_lower <= b.users <= a.users_upper
    if layer == "batch":
        assert cluster_answer.users == local_answer.users
    else:
        assert workload.users_per_minute(on_cluster, *window) == workload.users_per_minute(local, *window)
    assert cluster_answer.top_items == local_answer.top_items
    assert [t["item"] for t in cluster_answer.top_items] == [
        i for i, _ in Counter(e.item for e in events).most_common(5)
    ]
    jfk = [workload.answer(s, *window, "origin=JFK").events for s in (on_cluster, local)]
    assert jfk == [sum(e.dims["origin"] == "JFK" for e in events)] * 2


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
        same_answers(on_cluster, local, events, window, "speed")

        # The batch job over the window: on the cluster, then in local mode; both answers now come from the batch view.
        window_args = ("--start", window[0].isoformat(), "--end", window[1].isoformat())
        workload.trends(on_cluster, "batch", "run", *window_args, extra_env=master)
        job.run(local, *window, spark=spark)
        workload.wait_apps(stack_up, apps_before, Counter({"trends-speed": 1, "trends-batch": 1}))
        same_answers(on_cluster, local, events, window, "batch")
    finally:
        with session(stack_up) as sess:
            for s in (on_cluster, local):
                sess.execute(f"DROP KEYSPACE IF EXISTS {s.cassandra.keyspace}")
        topics.delete_topics(stack_up.kafka, [topic])
