"""Batch layer DAGs: the hourly recompute of live data, and backfills of long history in chunked Spark passes.

Thin on purpose: no I/O and no heavy imports at parse time; every task is keyed by its data interval or its
range, and idempotent — a recompute writes new versions and swaps the hours' pointers, so retries, reruns and
backfills replace instead of adding.

* ``trends_batch`` (hourly, ``[data_interval_start, data_interval_end)``): index the topic and wait until the hour
  is closed, plan (the hour, up to ``batch.heal_max_hours`` closed hours below it without a current run — left by
  an outage, ``catchup=False`` schedules only the latest — and as many stale hours), recompute them in one
  spark-submit, verify the hour against the speed view (the task fails when they differ beyond their bounds),
  advance the watermark. An incomplete hour (records lost before indexing may belong to it) is refused, never
  healed: ``trends batch run --accept-loss`` computes it.
* ``trends_backfill`` (triggered with a range): index, split ``[start, end)`` into chunks
  (``batch.chunk_hours`` / ``batch.chunk_events``), one mapped spark-submit per chunk, ``batch.backfill_parallelism``
  at a time, then advance the watermark. Trigger it from the UI's form, with ``airflow dags trigger
  trends_backfill --conf '{"start": "...", "end": "..."}'`` or ``POST /api/v2/dags/trends_backfill/dagRuns``;
  ``"accept_loss": true`` accepts records lost before indexing for the range's incomplete hours.
* ``trends_erasure`` (triggered by ``trends privacy forget --exclude`` with a request id and its hours, one run at a
  time): wait until the last hour is closed, recompute the hours in chunks (every batch run leaves out the erased
  subjects), then purge the hours' superseded versions and speed rows and advance the watermark.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Param, PokeReturnValue, dag, task
from airflow.timetables.interval import CronDataIntervalTimetable

from infra.dag_contract import (
    ACCEPT_LOSS_ARG,
    ACCEPT_LOSS_PARAM,
    ADVANCE_TASK,
    BACKFILL_DAG,
    BATCH_DAG,
    CHUNKS_TASK,
    END_PARAM,
    ERASURE_DAG,
    FORCE_ARG,
    HOURS_ARG,
    HOURS_PARAM,
    NO_INDEX_ARG,
    ONLY_MISSING_PARAM,
    PLAN_TASK,
    PURGE_TASK,
    RECOMPUTE_TASK,
    REQUEST_PARAM,
    START_PARAM,
    VERIFY_TASK,
    WAIT_TASK,
    submit_script,
)
from infra.settings_env import env_var  # light: names the variables, reads no settings

# The batch job's spark-submit entry point inside the installed package (found without importing it), and the
# interpreter that has the package: the DAG processor's own, unless the worker's environment names another.
SUBMIT = str(submit_script())
PYTHON = os.environ.get("PYSPARK_PYTHON", sys.executable)
# Settings read from the environment at parse time without reading files (the defaults are those of
# infra.settings.BatchSettings; tests/unit/test_dags.py checks they agree).
SPARK_CONN_ID = os.environ.get(env_var("batch.spark_conn_id"), "trends_spark")
TASK_TIMEOUT = timedelta(seconds=int(os.environ.get(env_var("batch.task_timeout_s"), "10800")))
BACKFILL_PARALLELISM = int(os.environ.get(env_var("batch.backfill_parallelism"), "2"))


def connector_jars() -> str:
    """Return the jars for --jars: the Kafka connector, and spark-avro for Avro events.

    A macro: resolved when the task runs, not at parse.
    """
    from infra import jars
    from infra.settings import Settings

    return ",".join(str(p) for p in jars.spark_jars(Settings()))


DEFAULT_ARGS = {
    "owner": "trends",
    "retries": 3,
    "retry_delay": timedelta(minutes=1),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(minutes=20),
    "execution_timeout": TASK_TIMEOUT,
}


def _submit(task_id: str, **kwargs: Any) -> Any:
    """Return the spark-submit of the installed ``batch_layer/submit.py`` (partial when mapped)."""
    common = {
        "task_id": task_id,
        "conn_id": SPARK_CONN_ID,
        "application": SUBMIT,
        "jars": "{{ connector_jars() }}",
        # The driver binds where settings say (loopback by default); the job reads TRENDS_* like everything else.
        "env_vars": {
            "PYSPARK_PYTHON": PYTHON,
            "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON", PYTHON),
            "SPARK_LOCAL_IP": os.environ.get(env_var("spark.local_ip"), "127.0.0.1"),
        },
        "pool_slots": 1,
    }
    return {**common, **kwargs}


@dag(
    dag_id=BATCH_DAG,
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    start_date=datetime(2025, 1, 1, tzinfo=UTC),
    catchup=False,  # the plan task heals hours an outage left behind; history is filled by trends_backfill
    # At most two scheduled hours at a time. Airflow 3 bounds a backfill by its own --max-active-runs instead (the
    # README and `trends demo` pass 2), and every task by the executor's parallelism (TRENDS_AIRFLOW__PARALLELISM).
    max_active_runs=2,
    default_args=DEFAULT_ARGS,
    tags=["trends", "batch-layer"],
    user_defined_macros={"connector_jars": connector_jars},
    doc_md=__doc__,
)
def trends_batch() -> None:
    """Recompute one closed hour of the views (and heal missing and stale hours below it)."""

    @task.sensor(task_id=WAIT_TASK, poke_interval=120, timeout=6 * 3600, mode="reschedule")
    def wait_until_closed(data_interval_end: datetime | None = None) -> PokeReturnValue:
        """Index new records, then poke until every active partition has passed the hour's end + grace."""
        from batch_layer.tasks import hour_closed
        from infra.settings import Settings

        assert data_interval_end is not None
        return PokeReturnValue(is_done=hour_closed(Settings(), data_interval_end))

    @task(task_id=PLAN_TASK)
    def plan(data_interval_start: datetime | None = None, dag_run: Any = None) -> str:
        """Return the hours to compute (JSON): this one, missing closed hours below it, stale hours.

        Fails without retries when this hour is incomplete (records lost before indexing may belong to it): an
        operator accepts the loss with ``trends batch run --accept-loss``, then clears this run.
        """
        import json

        from airflow.sdk.exceptions import AirflowFailException

        from batch_layer.offsets import LossNotAcceptedError
        from batch_layer.tasks import plan_hourly
        from infra.settings import Settings

        assert data_interval_start is not None
        # A backfill has a run of its own for every hour, some side by side: healing there would compute an hour
        # another run of the backfill is computing (twice, racing). Scheduled runs heal what an outage left.
        run_type = getattr(dag_run, "run_type", None)
        backfill = getattr(run_type, "value", run_type) == "backfill"
        try:
            hours = plan_hourly(Settings(), data_interval_start, heal=not backfill)
        except LossNotAcceptedError as exc:
            raise AirflowFailException(str(exc)) from exc
        return json.dumps([h.isoformat() for h in hours])

    # --force: the sensor decided the hour is closed; --no-index: it has just indexed
    recompute = SparkSubmitOperator(
        **_submit(
            RECOMPUTE_TASK,
            name="trends-batch-{{ data_interval_start.strftime('%Y%m%dT%H') }}",
            application_args=[HOURS_ARG, f"{{{{ ti.xcom_pull(task_ids='{PLAN_TASK}') }}}}", FORCE_ARG, NO_INDEX_ARG],
        )
    )

    @task(task_id=VERIFY_TASK)
    def verify(data_interval_start: datetime | None = None) -> str:
        """Compare the batch view with the speed view for the hour, store the verdict, fail beyond the bounds.

        A difference beyond the bounds is not transient: the task fails without retries (the run turns red) and
        ``trends batch status`` shows the hour's last reconciliation; a Cassandra error still retries.
        """
        from airflow.sdk.exceptions import AirflowFailException

        from batch_layer.reconcile import BeyondBoundsError, verify
        from infra.settings import Settings

        assert data_interval_start is not None
        try:
            return verify(Settings(), data_interval_start).line()
        except BeyondBoundsError as exc:
            raise AirflowFailException(str(exc)) from exc

    @task(task_id=ADVANCE_TASK)
    def advance_watermark(data_interval_start: datetime | None = None) -> str:
        """Extend the batch watermark over contiguous completed hours."""
        from batch_layer.tasks import advance
        from infra.settings import Settings

        assert data_interval_start is not None
        low, mark = advance(Settings(), data_interval_start)
        return f"batch watermark [{low}, {mark})"

    wait_until_closed() >> plan() >> recompute >> verify() >> advance_watermark()


# Named at module level, so a one-line DAG file elsewhere (`trends admin dags --install`) can import them.
batch_dag = trends_batch()


@dag(
    dag_id=BACKFILL_DAG,
    schedule=None,
    start_date=datetime(2025, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["trends", "batch-layer", "backfill"],
    user_defined_macros={"connector_jars": connector_jars},
    params={
        START_PARAM: Param(
            "2025-01-01T00:00:00+00:00", type="string", format="date-time", description="First hour (inclusive), UTC."
        ),
        END_PARAM: Param(
            "2025-01-02T00:00:00+00:00", type="string", format="date-time", description="End (exclusive), a whole hour."
        ),
        ONLY_MISSING_PARAM: Param(False, type="boolean", description="Skip hours that already have a current run."),
        ACCEPT_LOSS_PARAM: Param(
            False,
            type="boolean",
            description="Compute hours that records lost before indexing may belong to (the lineage records the "
            "accepted loss); without it such a range is refused.",
        ),
    },
    doc_md=__doc__,
)
def trends_backfill() -> None:
    """Recompute a range of closed hours in chunked Spark passes, several at a time."""

    @task(task_id=CHUNKS_TASK)
    def chunks(params: dict[str, Any] | None = None) -> list[list[str]]:
        """Index the topic, refuse an open or incomplete range, and return the spark-submit arguments of each chunk."""
        from airflow.sdk.exceptions import AirflowFailException

        from batch_layer.offsets import LossNotAcceptedError
        from batch_layer.tasks import backfill_chunks
        from infra.settings import Settings

        assert params is not None
        settings = Settings()
        start, end = datetime.fromisoformat(params[START_PARAM]), datetime.fromisoformat(params[END_PARAM])
        accept = bool(params.get(ACCEPT_LOSS_PARAM))
        try:
            planned = backfill_chunks(
                settings, start, end, only_missing=bool(params.get(ONLY_MISSING_PARAM)), accept_loss=accept
            )
        except LossNotAcceptedError as exc:
            raise AirflowFailException(str(exc)) from exc
        extra = [ACCEPT_LOSS_ARG] if accept else []
        return [[HOURS_ARG, chunk, FORCE_ARG, NO_INDEX_ARG, *extra] for chunk in planned]

    recompute = SparkSubmitOperator.partial(
        **_submit(
            RECOMPUTE_TASK,
            name="trends-backfill-{{ run_id | replace(':', '') | replace('+', '') }}",
            max_active_tis_per_dag=BACKFILL_PARALLELISM,
        )
    ).expand(application_args=chunks())

    @task(task_id=ADVANCE_TASK)
    def advance_watermark(params: dict[str, Any] | None = None) -> str:
        """Extend the batch watermark over the range's contiguous completed hours."""
        from batch_layer.tasks import advance
        from infra.settings import Settings

        assert params is not None
        low, mark = advance(Settings(), datetime.fromisoformat(params[START_PARAM]))
        return f"batch watermark [{low}, {mark})"

    recompute >> advance_watermark()


backfill_dag = trends_backfill()


@dag(
    dag_id=ERASURE_DAG,
    schedule=None,
    start_date=datetime(2025, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,  # a second request waits for the first's recompute (their hours may overlap)
    default_args=DEFAULT_ARGS,
    tags=["trends", "batch-layer", "privacy"],
    user_defined_macros={"connector_jars": connector_jars},
    params={
        REQUEST_PARAM: Param("", type="string", description="The request's id in the erasure ledger (a hash)."),
        HOURS_PARAM: Param(
            [], type="array", items={"type": "string"}, description="The hours holding the subject, ISO-8601 UTC."
        ),
    },
    doc_md=__doc__,
)
def trends_erasure() -> None:
    """Recompute the hours holding an erased subject without it, then purge what still holds it."""

    @task.sensor(task_id=WAIT_TASK, poke_interval=60, timeout=6 * 3600, mode="reschedule")
    def wait_until_closed(params: dict[str, Any] | None = None) -> PokeReturnValue:
        """Index new records, then poke until the last of the hours is closed."""
        from batch_layer.erasure import hours_closed, parse_hours
        from infra.settings import Settings

        assert params is not None
        return PokeReturnValue(is_done=hours_closed(Settings(), parse_hours(params[HOURS_PARAM])))

    @task(task_id=CHUNKS_TASK)
    def chunks(params: dict[str, Any] | None = None) -> list[list[str]]:
        """Return the spark-submit arguments of each chunk of the hours (refused when an hour is incomplete)."""
        from airflow.sdk.exceptions import AirflowFailException

        from batch_layer.erasure import erasure_chunks, parse_hours
        from batch_layer.offsets import LossNotAcceptedError
        from infra.settings import Settings

        assert params is not None
        try:
            planned = erasure_chunks(Settings(), parse_hours(params[HOURS_PARAM]))
        except LossNotAcceptedError as exc:
            raise AirflowFailException(str(exc)) from exc
        return [[HOURS_ARG, chunk, FORCE_ARG, NO_INDEX_ARG] for chunk in planned]

    planned = chunks()
    recompute = SparkSubmitOperator.partial(
        **_submit(
            RECOMPUTE_TASK,
            name="trends-erasure-{{ run_id | replace(':', '') | replace('+', '') }}",
            max_active_tis_per_dag=BACKFILL_PARALLELISM,
        )
    ).expand(application_args=planned)

    @task(task_id=PURGE_TASK)  # only after every chunk succeeded: until then the old versions are the current ones
    def purge(params: dict[str, Any] | None = None, dag_run: Any = None) -> str:
        """Delete the hours' superseded versions and speed rows, advance the watermark, record it in the ledger."""
        from batch_layer.erasure import finish, parse_hours
        from infra.settings import Settings

        assert params is not None
        return finish(
            Settings(), params[REQUEST_PARAM], parse_hours(params[HOURS_PARAM]), getattr(dag_run, "run_id", "")
        )

    wait_until_closed() >> planned
    recompute >> purge()


erasure_dag = trends_erasure()
