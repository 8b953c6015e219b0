"""Airflow started by the stack code, for real: health, login, and scheduler-driven backfills (CLI and REST).

The instance is private to this module — its own data dir under tmp, a free API port, a temporary DAGs folder with
one tiny hourly DAG — so it never meets a developer's running stack, and it is stopped at the end whatever happens.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest

from infra.airflow.client import AirflowClient
from infra.errors import StackError
from infra.settings import Settings
from stack import control
from stack.airflow.config import airflow_executable
from stack.airflow.service import Airflow
from stack.process import port_is_open, tail
from tests.helpers import free_port

DAG_ID = "probe_hourly"
# Start and end dates bracket the test's hours, so unpausing the DAG schedules nothing besides the backfills.
PROBE_DAG = '''
"""Write each run's data interval (and what the task saw) into one file per hour."""
from __future__ import annotations

import json
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

from airflow.sdk import dag, task
from airflow.timetables.interval import CronDataIntervalTimetable

OUT = Path({out!r})


@dag(
    dag_id={dag_id!r},
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    start_date=datetime(2026, 5, 1, tzinfo=UTC),
    end_date=datetime(2026, 5, 2, 23, tzinfo=UTC),
    catchup=False,
)
def probe_hourly():
    @task
    def record(data_interval_start=None, data_interval_end=None, ti=None):
        doc = {{
            "start": data_interval_start.isoformat(),
            "end": data_interval_end.isoformat(),
            "try_number": ti.try_number,
            "trends_data_dir": os.environ.get("TRENDS_DATA_DIR"),
            "airflow_on_path": shutil.which("airflow"),
        }}
        target = OUT / f"{{data_interval_start:%Y%m%dT%H}}.json"
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(target)  # overwrite: a rerun replaces, never adds

    record()


probe_hourly()
'''


@dataclass
class Instance:
    """The module's Airflow: its settings, where the probe DAG writes, and an API token."""

    settings: Settings
    out: Path
    token: str = ""

    @property
    def airflow(self) -> Airflow:
        return Airflow(self.settings)

    def call(self, method: str, path: str, body: Any = None, *, token: str | None = None) -> tuple[int, Any]:
        """Call the REST API; return (status, decoded JSON body)."""
        headers = {"Content-Type": "application/json"}
        bearer = self.token if token is None else token
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        data = json.dumps(body).encode() if body is not None else None
        url = self.airflow.url + path  # http://127.0.0.1:<port>/…
        request = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            text = exc.read()
            try:
                return exc.code, json.loads(text)
            except ValueError:
                return exc.code, text.decode(errors="replace")

    def create_backfill(self, body: dict[str, Any], retry_s: float = 300) -> tuple[int, Any]:
        """POST a backfill; retried while SQLite reports a lock (Airflow answers 503 and removes the half-made one,
        or the scheduler closes it 2 minutes later) or the previous backfill is still being completed (409), as
        ``Airflow.backfill`` does for the CLI."""
        deadline = time.monotonic() + retry_s
        while True:
            status, created = self.call("POST", "/api/v2/backfills", body)
            transient = status == 409 or (status == 503 and "locked" in str(created))
            if not transient or time.monotonic() > deadline:
                return status, created
            time.sleep(5)

    def airflow_cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run the real `airflow` CLI with the stack's environment."""
        return subprocess.run(
            [str(airflow_executable()), *args],
            env=self.airflow.process_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def runs(self) -> list[dict[str, Any]]:
        status, body = self.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns?limit=100")
        assert status == 200, body
        return list(body["dag_runs"])

    def wait_runs(self, starts: list[datetime], timeout_s: float = 120) -> dict[datetime, dict[str, Any]]:
        """Wait (bounded) until the backfill runs of these interval starts have succeeded; fail fast on a failure."""
        deadline = time.monotonic() + timeout_s
        by_start: dict[datetime, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            by_start = {
                datetime.fromisoformat(r["data_interval_start"]): r
                for r in self.runs()
                if r["run_type"] == "backfill" and datetime.fromisoformat(r["data_interval_start"]) in starts
            }
            failed = [r["dag_run_id"] for r in by_start.values() if r["state"] == "failed"]
            assert not failed, f"runs failed: {failed}\n{self.task_log(failed[0])}"
            if len(by_start) == len(starts) and all(r["state"] == "success" for r in by_start.values()):
                return by_start
            time.sleep(1)
        states = {k.isoformat(): v["state"] for k, v in by_start.items()}
        pytest.fail(f"backfill runs not all successful within {timeout_s} s: {states}\n{tail_logs(self)}")

    def wait_backfills_completed(self, timeout_s: float = 60) -> None:
        """Wait until the scheduler marks every backfill of the DAG complete (only one may run at a time)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status, body = self.call("GET", f"/api/v2/backfills?dag_id={DAG_ID}")
            assert status == 200, body
            if all(b["completed_at"] for b in body["backfills"]):
                return
            time.sleep(1)
        pytest.fail(f"backfills of {DAG_ID} not marked complete within {timeout_s} s: {body}")

    def task_log(self, run_id: str, try_number: int = 1) -> str:
        quoted = urllib.request.quote(run_id, safe="")
        status, body = self.call(
            "GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{quoted}/taskInstances/record/logs/{try_number}"
        )
        return json.dumps(body)[:4000] if status == 200 else f"(log: HTTP {status} {body})"


def tail_logs(instance: Instance) -> str:
    return tail(instance.airflow.log_files(), 20)


def hours(start: datetime, count: int) -> list[datetime]:
    return [start + timedelta(hours=i) for i in range(count)]


def recorded(out: Path, start: datetime) -> dict[str, Any]:
    return dict(json.loads((out / f"{start:%Y%m%dT%H}.json").read_text()))


@pytest.fixture(scope="module")
def instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Instance]:
    """Start a private Airflow through `stack.control.up`; always stop it afterwards."""
    root = tmp_path_factory.mktemp("airflow")
    dags, out = root / "dags", root / "out"
    dags.mkdir()
    out.mkdir()
    (dags / f"{DAG_ID}.py").write_text(PROBE_DAG.format(out=str(out), dag_id=DAG_ID))
    # A database error's answer names its statement and SQLite's message (else only an id in the API server's log).
    config = {"AIRFLOW__API__EXPOSE_STACKTRACE": "True"}
    airflow = {"api_port": free_port(), "dags_folder": dags, "config": config}
    settings = Settings(data_dir=root / "data", airflow=airflow)
    try:
        started = time.monotonic()
        (result,) = control.up(settings, ["airflow"])
        print(f"airflow ready in {time.monotonic() - started:.1f} s, {control.status(settings, ['airflow'])[0]}")
        assert result.name == "airflow" and not result.already_running
        inst = Instance(settings, out)
        inst.token = AirflowClient(settings).token()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # healthy does not mean parsed: wait for the DAG to be listed
            status, body = inst.call("GET", "/api/v2/dags")
            if status == 200 and DAG_ID in {d["dag_id"] for d in body["dags"]}:
                break
            time.sleep(1)
        else:
            pytest.fail(f"{DAG_ID} was not parsed within 60 s\n{tail_logs(inst)}")
        yield inst
    finally:
        control.down(settings, ["airflow"])


def test_up_serves_health_and_a_login(instance: Instance) -> None:
    st = control.status(instance.settings, ["airflow"])[0]
    assert (st.state, st.address) == ("running", instance.airflow.address)
    assert st.rss_mib is not None and st.rss_mib > 100

    status, health = instance.call("GET", "/api/v2/monitor/health", token="")
    assert status == 200
    for key in ("metadatabase", "scheduler", "dag_processor"):
        assert health[key]["status"] == "healthy", health

    assert instance.call("GET", "/api/v2/dags", token="")[0] == 401  # auth is not ignored
    status, _ = instance.call("POST", "/auth/token", {"username": "admin", "password": "wrong"}, token="")
    assert status == 401
    status, body = instance.call("POST", "/auth/token", {"username": "admin", "password": "admin"}, token="")
    assert status == 201, body
    status, body = instance.call("GET", "/api/v2/dags", token=body["access_token"])
    assert status == 200
    assert [d["dag_id"] for d in body["dags"]] == [DAG_ID]

    again = control.up(instance.settings, ["airflow"])  # a second `up` is a no-op
    assert again[0].already_running and again[0].pid == st.pid


def test_every_airflow_socket_is_on_loopback(instance: Instance) -> None:
    pids = [p for p in instance.airflow.pids().values() if p is not None]
    family = [proc for pid in pids for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]]
    listening = [
        conn.laddr for proc in family for conn in proc.net_connections(kind="inet") if conn.status == psutil.CONN_LISTEN
    ]
    assert listening, "the API server should listen"
    assert {addr.ip for addr in listening} == {"127.0.0.1"}, listening  # no log server on 0.0.0.0:8793
    assert {addr.port for addr in listening} == {instance.settings.airflow.api_port}


@pytest.mark.backfill  # Airflow's own backfill (make test-backfill): kept out of make test for its time
def test_cli_backfill_runs_every_hour_through_the_scheduler(instance: Instance) -> None:
    # New DAGs are paused; a backfill of a paused DAG stays queued for ever, so unpause it first (as the README says).
    proc = instance.airflow_cli("dags", "unpause", DAG_ID)
    assert proc.returncode == 0, proc.stderr[-2000:]
    first = datetime(2026, 5, 1, tzinfo=UTC)
    proc = instance.airflow_cli(
        "backfill",
        "create",
        "--dag-id",
        DAG_ID,
        "--from-date",
        "2026-05-01T00:00:00+00:00",
        "--to-date",
        "2026-05-01T02:00:00+00:00",
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    runs = instance.wait_runs(hours(first, 3))  # dates inclusive: 00:00, 01:00 and 02:00
    instance.wait_backfills_completed()
    assert sorted(runs) == hours(first, 3)
    files = sorted(p.name for p in instance.out.glob("20260501T*.json"))
    assert files == ["20260501T00.json", "20260501T01.json", "20260501T02.json"]
    for start in hours(first, 3):
        doc = recorded(instance.out, start)
        assert datetime.fromisoformat(doc["start"]) == start
        assert datetime.fromisoformat(doc["end"]) == start + timedelta(hours=1)
        assert doc["trends_data_dir"] == str(instance.settings.data_dir)  # tasks see the stack's settings
        assert Path(doc["airflow_on_path"]).parent == airflow_executable().parent
    # Task logs are read from the shared local folder (no log server runs).
    log = instance.task_log(runs[first]["dag_run_id"])
    assert not log.startswith("(log: HTTP") and "Done. Returned value was: None" in log, log


@pytest.mark.backfill  # Airflow's own backfill (make test-backfill): kept out of make test for its time
def test_rest_backfill_and_reprocess_of_completed_hours(instance: Instance) -> None:
    instance.airflow_cli("dags", "unpause", DAG_ID)  # idempotent; the test may run alone
    instance.wait_backfills_completed()
    body = {
        "dag_id": DAG_ID,
        "from_date": "2026-05-02T00:00:00Z",
        "to_date": "2026-05-02T01:00:00Z",
        "max_active_runs": 2,
    }
    status, created = instance.create_backfill(body)
    assert status == 200, created
    second = datetime(2026, 5, 2, tzinfo=UTC)
    instance.wait_runs(hours(second, 2))
    instance.wait_backfills_completed()
    for start in hours(second, 2):
        doc = recorded(instance.out, start)
        assert (doc["start"], doc["end"]) == (start.isoformat(), (start + timedelta(hours=1)).isoformat())

    # After a code fix: rerun hours that already succeeded; each is replaced, not added.
    status, created = instance.create_backfill(
        {**body, "to_date": "2026-05-02T00:00:00Z", "reprocess_behavior": "completed"}
    )
    assert status == 200, created
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and recorded(instance.out, second)["try_number"] < 2:
        time.sleep(1)
    assert recorded(instance.out, second)["try_number"] == 2, tail_logs(instance)
    instance.wait_runs([second])
    assert len(list(instance.out.glob("20260502T*.json"))) == 2


def test_port_taken_by_another_process_is_reported(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, airflow={"api_port": free_port()})
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", settings.airflow.api_port))
        squatter.listen()
        with pytest.raises(StackError, match=r"already taken by .*TRENDS_AIRFLOW__API_PORT"):
            control.up(settings, ["airflow"])
    assert all(pid is None for pid in Airflow(settings).pids().values())


def test_component_that_dies_at_start_is_named_with_its_log(tmp_path: Path) -> None:
    bad = {"api_port": free_port(), "config": {"AIRFLOW__CORE__EXECUTOR": "NoSuchExecutor"}}
    settings = Settings(data_dir=tmp_path, airflow=bad)
    with pytest.raises(StackError, match=r"airflow scheduler exited during start-up(.|\n)*NoSuchExecutor"):
        control.up(settings, ["airflow"])
    assert all(pid is None for pid in Airflow(settings).pids().values())  # the others were stopped too
    assert not port_is_open("127.0.0.1", settings.airflow.api_port)


def test_down_stops_every_airflow_process(instance: Instance) -> None:
    """Last in the module: stop the instance through the stack and check nothing is left behind."""
    pids = [p for p in instance.airflow.pids().values() if p is not None]
    family = [proc for pid in pids for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]]
    assert len(family) >= 3
    started = time.monotonic()
    assert control.down(instance.settings, ["airflow"]) == ["airflow"]
    print(f"airflow stopped in {time.monotonic() - started:.1f} s")
    gone = [proc for proc in family if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE]
    assert len(gone) == len(family)
    assert control.status(instance.settings, ["airflow"])[0].state == "stopped"
    assert not port_is_open("127.0.0.1", instance.settings.airflow.api_port)
    assert control.down(instance.settings, ["airflow"]) == []
