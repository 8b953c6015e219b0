"""Airflow's paths are built in one place (``infra.airflow.client``), with ids quoted as path segments."""

from __future__ import annotations

from infra.airflow.client import run_path, task_instances_path, ui_run_path


def test_a_run_id_is_one_path_segment_in_the_rest_api_and_the_ui() -> None:
    run_id = "manual__2026-11-28T08:00:00+00:00/x"  # a slash in an id must not make a second segment
    assert run_path("trends_backfill", run_id).endswith(
        "/dags/trends_backfill/dagRuns/manual__2026-11-28T08%3A00%3A00%2B00%3A00%2Fx"
    )
    assert (
        ui_run_path("trends_backfill", run_id)
        == "/dags/trends_backfill/runs/manual__2026-11-28T08%3A00%3A00%2B00%3A00%2Fx"
    )
    assert task_instances_path("~", "~", limit=5).endswith("/dags/~/dagRuns/~/taskInstances?limit=5")
