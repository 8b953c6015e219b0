"""The DAG folder parses with no import errors, no network at parse time, and the expected shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from infra.settings import Settings

REPO = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, socket
def refuse(*args, **kwargs):
    raise AssertionError(f"network access at DAG parse time: {args}")
socket.socket.connect = refuse
socket.create_connection = refuse
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder="dags")
dag = bag.dags.get("trends_batch")
out = {"errors": {k: str(v) for k, v in bag.import_errors.items()}, "dags": sorted(bag.dags)}
backfill = bag.dags.get("trends_backfill")
if backfill is not None:
    out.update(
        backfill_tasks={t.task_id: sorted(t.downstream_task_ids) for t in backfill.tasks},
        backfill_params=sorted(backfill.params.keys()),
        backfill_schedule=type(backfill.timetable).__name__,
        backfill_mapped=type(backfill.get_task("recompute")).__name__,
        backfill_parallel=backfill.get_task("recompute").max_active_tis_per_dag,
        timeouts=sorted({str(t.execution_timeout) for d in bag.dags.values() for t in d.tasks}),
    )
erasure = bag.dags.get("trends_erasure")
if erasure is not None:
    out.update(
        erasure_tasks={t.task_id: sorted(t.downstream_task_ids) for t in erasure.tasks},
        erasure_params=sorted(erasure.params.keys()),
        erasure_schedule=type(erasure.timetable).__name__,
        erasure_runs=erasure.max_active_runs,
        erasure_sensor=erasure.get_task("wait_until_closed").mode,
    )
if dag is not None:
    tt = dag.timetable
    out.update(
        tasks={t.task_id: sorted(t.downstream_task_ids) for t in dag.tasks},
        timetable=type(tt).__name__,
        cron=tt._expression, tz=str(tt._timezone),
        max_active_runs=dag.max_active_runs, catchup=dag.catchup,
        retries={t.task_id: t.retries for t in dag.tasks},
        recompute=type(dag.get_task("recompute")).__name__,
        sensor_mode=dag.get_task("wait_until_closed").mode,
    )
print("RESULT " + json.dumps(out))
"""


def test_dag_folder_parses_with_the_expected_dag(tmp_path: Path) -> None:
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line.removeprefix("RESULT "))
    assert out["errors"] == {}
    assert out["dags"] == ["trends_backfill", "trends_batch", "trends_erasure"]
    assert out["tasks"] == {
        "wait_until_closed": ["plan"],
        "plan": ["recompute"],
        "recompute": ["verify"],
        "verify": ["advance_watermark"],
        "advance_watermark": [],
    }
    assert (out["timetable"], out["cron"], out["tz"]) == ("CronDataIntervalTimetable", "0 * * * *", "UTC")
    assert out["max_active_runs"] <= 2 and out["catchup"] is False
    assert all(n >= 2 for n in out["retries"].values())
    assert out["recompute"] == "SparkSubmitOperator"
    assert out["sensor_mode"] == "reschedule"
    assert out["backfill_tasks"] == {
        "chunks": ["recompute"],
        "recompute": ["advance_watermark"],
        "advance_watermark": [],
    }
    assert out["backfill_params"] == ["accept_loss", "end", "only_missing", "start"]
    assert out["backfill_schedule"] == "NullTimetable"  # triggered with a range, never scheduled
    assert out["backfill_mapped"] == "MappedOperator" and out["backfill_parallel"] == 2
    assert out["erasure_tasks"] == {
        "wait_until_closed": ["chunks"],
        "chunks": ["recompute"],
        "recompute": ["purge"],
        "purge": [],
    }
    assert out["erasure_params"] == ["hours", "request"]
    assert (out["erasure_schedule"], out["erasure_runs"], out["erasure_sensor"]) == ("NullTimetable", 1, "reschedule")
    settings = Settings()
    assert out["timeouts"] == [str(timedelta(seconds=settings.batch.task_timeout_s))]  # every task, the setting's


ONE_LINE_PROBE = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
recompute = bag.dags["trends_batch"].get_task("recompute")
print("RESULT " + json.dumps({
    "errors": {k: str(v) for k, v in bag.import_errors.items()},
    "dags": {d: bag.dags[d].fileloc for d in sorted(bag.dags)},
    "application": recompute.application,
    "env": recompute.env_vars,
}))
"""


def test_a_one_line_dag_file_elsewhere_runs_the_installed_package(tmp_path: Path) -> None:
    """`trends admin dags --install DIR` gives a deployment's own DAG folder the package's DAGs, no checkout."""
    from click.testing import CliRunner

    from app.cli import cli
    from infra.dag_contract import submit_script

    folder = tmp_path / "dags"
    result = CliRunner().invoke(cli, ["admin", "dags", "--install", str(folder)])
    assert result.exit_code == 0, result.output
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "home"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [sys.executable, "-c", ONE_LINE_PROBE, str(folder)],
        cwd=tmp_path,  # not the checkout: the DAGs come from the installed package
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT ")).removeprefix("RESULT "))
    one_line = str(folder / "trends_dags.py")
    assert out["errors"] == {}
    assert out["dags"] == {"trends_backfill": one_line, "trends_batch": one_line, "trends_erasure": one_line}
    # spark-submit runs the package's entry point with this interpreter; no PYTHONPATH into a checkout
    assert out["application"] == str(submit_script()) and Path(out["application"]).is_file()
    assert out["env"]["PYSPARK_PYTHON"] == sys.executable and "PYTHONPATH" not in out["env"]
