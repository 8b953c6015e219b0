"""Hourly batch layer DAG: wait until the hour is closed, recompute it from Kafka, verify, advance the watermark.

Thin on purpose: no I/O and no heavy imports at parse time; every task is keyed by its data interval
(``[data_interval_start, data_interval_end)`` = one UTC hour) and idempotent — the recompute writes a new
version and swaps the interval's pointer, so retries, reruns and backfills replace instead of adding.
Backfills: ``airflow backfill create --dag-id trends_batch --from-date A --to-date B`` (see the README).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import PokeReturnValue, dag, task
from airflow.timetables.interval import CronDataIntervalTimetable

REPO = Path(__file__).resolve().parent.parent
SUBMIT = str(REPO / "batch_layer" / "submit.py")
# The connection of the Spark master to submit to (e.g. spark://host:7077, or local[2]); Settings' default name.
SPARK_CONN_ID = os.environ.get("TRENDS_BATCH__SPARK_CONN_ID", "trends_spark")


def connector_jars() -> str:
    """Return the Spark Kafka connector jars for --jars (a macro: resolved when the task runs, not at parse)."""
    from infra import jars
    from infra.settings import Settings

    return ",".join(str(p) for p in jars.bundle_jars(Settings(), jars.SPARK_KAFKA))


DEFAULT_ARGS = {
    "owner": "trends",
    "retries": 3,
    "retry_delay": timedelta(minutes=1),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(minutes=20),
}


@dag(
    dag_id="trends_batch",
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    start_date=datetime(2025, 1, 1, tzinfo=UTC),
    catchup=False,  # history is filled by explicit backfills, not by a burst of catch-up runs
    # At most two scheduled hours at a time. Airflow 3 bounds a backfill by its own --max-active-runs instead (the
    # README and `trends demo` pass 2), and every task by the executor's parallelism (TRENDS_AIRFLOW__PARALLELISM).
    max_active_runs=2,
    default_args=DEFAULT_ARGS,
    tags=["trends", "batch-layer"],
    user_defined_macros={"connector_jars": connector_jars},
    doc_md=__doc__,
)
def trends_batch() -> None:
    """Recompute one closed hour of the views."""

    @task.sensor(poke_interval=120, timeout=6 * 3600, mode="reschedule")
    def wait_until_closed(data_interval_end: datetime | None = None) -> PokeReturnValue:
        """Poke until every partition's newest event time has passed the hour's end + grace."""
        from batch_layer import offsets
        from infra.settings import Settings

        settings = Settings()
        assert data_interval_end is not None
        grace = max(timedelta(seconds=settings.batch.grace_s), timedelta(seconds=settings.batch.lateness_s))
        horizon = offsets.closed_at(settings.kafka, settings.kafka.events_topic)
        return PokeReturnValue(is_done=horizon is not None and horizon >= data_interval_end + grace)

    recompute = SparkSubmitOperator(
        task_id="recompute",
        conn_id=SPARK_CONN_ID,
        application=SUBMIT,
        name="trends-batch-{{ data_interval_start.strftime('%Y%m%dT%H') }}",
        # --force: the sensor above decided the hour is closed; the job must not refuse it a second time
        application_args=[
            "--start",
            "{{ data_interval_start.isoformat() }}",
            "--end",
            "{{ data_interval_end.isoformat() }}",
            "--force",
        ],
        jars="{{ connector_jars() }}",
        # The driver binds where settings say (loopback by default); the job reads TRENDS_* like everything else.
        env_vars={"PYTHONPATH": str(REPO), "SPARK_LOCAL_IP": os.environ.get("TRENDS_SPARK__LOCAL_IP", "127.0.0.1")},
        pool_slots=1,
    )

    @task
    def verify(data_interval_start: datetime | None = None) -> str:
        """Compare the batch view with the speed view for the hour and store the report."""
        from batch_layer.reconcile import reconcile
        from infra.settings import Settings

        assert data_interval_start is not None
        return reconcile(Settings(), data_interval_start).line()

    @task
    def advance_watermark(data_interval_start: datetime | None = None) -> str:
        """Extend the batch watermark over contiguous completed hours."""
        from batch_layer.job import advance
        from infra.settings import Settings

        assert data_interval_start is not None
        low, mark = advance(Settings(), data_interval_start)
        return f"batch watermark [{low}, {mark})"

    wait_until_closed() >> recompute >> verify() >> advance_watermark()


trends_batch()
