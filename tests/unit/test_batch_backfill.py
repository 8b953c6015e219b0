"""``trends batch backfill`` without services: usage errors (refused before Airflow is called), the progress line
and what a failed task's log is cut down to. The command against a real Airflow is tests/services/
test_batch_backfill_cli.py.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from app.cli import cli
from batch_layer.backfill import Snapshot, TaskState, chunk_hours, duration, error_lines
from infra.airflow.client import AirflowAPIError
from infra.settings import Settings
from tests.helpers import free_port

H = datetime(2025, 9, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


@pytest.fixture(autouse=True)
def _nowhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Point the client at a port where nothing listens: a usage error must come before any call."""
    for key in ("TRENDS_AIRFLOW__API_TOKEN", "TRENDS_AIRFLOW__API_URL", "TRENDS_AIRFLOW__API_USER"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TRENDS_AIRFLOW__API_PORT", str(free_port()))
    monkeypatch.chdir(tmp_path)  # no stray .env file
    from infra.settings import get_settings

    get_settings.cache_clear()


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["batch", "backfill", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--start", "2025-09-02", "--end", "2025-09-01"], "is not after --start"),
        (["--start", "2025-09-01", "--end", "2025-09-01"], "the range is empty"),
        (["--start", "2025-09-01T00:30Z", "--end", "2025-09-02"], "--start 2025-09-01T00:30:00Z is not a whole hour"),
        (["--start", "2025-09-01", "--end", "2025-09-01T10:00:05Z"], "--end 2025-09-01T10:00:05Z is not a whole hour"),
        (["--start", "2025-09-01", "--end", "2099-01-01"], "--end 2099-01-01T00:00Z is in the future"),
        (["--start", "2025-09-01"], "give --start and --end"),
        ([], "give --start and --end"),
        (["--start", "yesterday-ish", "--end", "2025-09-02"], "'yesterday-ish' is not a time"),
        (["--start", "1960-01-01", "--end", "2025-09-02"], "no event is that old"),
        (["--run-id", "manual__x", "--start", "2025-09-01"], "--run-id follows an existing run"),
        (["--run-id", "manual__x", "--only-missing"], "--run-id follows an existing run"),
        (["--start", "2025-09-01", "--end", "2025-09-02", "--timeout", "60"], "--timeout applies to --wait"),
        (["--start", "2025-09-01", "--end", "2025-09-02", "--wait", "--timeout", "-1"], "-1"),
        (["--start", "2025-09-01", "--end", "2025-09-02", "--wait", "--poll", "0"], "--poll"),
    ],
)
def test_usage_errors_exit_2_before_calling_airflow(args: list[str], says: str) -> None:
    code, output = run(*args)
    assert code == 2, output
    assert says in output, output


def test_a_valid_range_does_call_airflow() -> None:
    """The counterpart of the above: with valid options the command reaches for Airflow (and says it is not there)."""
    result = CliRunner().invoke(cli, ["batch", "backfill", "--start", "2025-09-01", "--end", "2025-09-02"])
    assert isinstance(result.exception, AirflowAPIError), result.output  # exit 1 with this message from `trends`
    assert "logging in to Airflow" in str(result.exception) and "Connection refused" in str(result.exception)


def test_settings_token_and_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRENDS_AIRFLOW__API_TOKEN", "")
    monkeypatch.setenv("TRENDS_AIRFLOW__API_PASSWORD", " ")
    s = Settings()
    assert s.airflow.api_token is None and s.airflow.api_password is None  # empty means unset: log in
    monkeypatch.setenv("TRENDS_AIRFLOW__API_TOKEN", "eyJ.secret.jwt")
    monkeypatch.setenv("TRENDS_AIRFLOW__API_URL", "https://airflow.example.com/")
    s = Settings()
    assert s.airflow.api_token is not None and s.airflow.api_token.get_secret_value() == "eyJ.secret.jwt"
    assert "eyJ.secret.jwt" not in repr(s)
    from infra.airflow.client import AirflowClient

    client = AirflowClient(s)
    assert client.url == "https://airflow.example.com"
    assert client.bearer() == "eyJ.secret.jwt"  # used as is: no login
    monkeypatch.setenv("TRENDS_AIRFLOW__API_URL", "airflow.example.com:8080")
    with pytest.raises(Exception, match="api_url"):
        Settings()


def test_chunk_hours_read_from_the_chunks_xcom() -> None:
    chunk = [(H + i * HOUR).isoformat() for i in range(3)]
    xcom = [["--hours", json.dumps(chunk), "--force", "--no-index"], ["--hours", json.dumps(chunk[:1])]]
    assert chunk_hours(xcom) == [[H, H + HOUR, H + 2 * HOUR], [H]]
    assert chunk_hours(None) is None
    assert chunk_hours([["--force"]]) is None  # not the shape the DAG pushes: no progress rather than a wrong one


def ti(task: str, map_index: int, state: str | None, tries: int = 1, seconds: float = 0.0) -> TaskState:
    return TaskState(task, map_index, state, tries, 3, seconds)


def test_progress_line_counts_chunks_hours_events_and_eta() -> None:
    chunks = [[H + i * HOUR for i in range(10)], [H + i * HOUR for i in range(10, 30)], [H + 30 * HOUR]]
    tasks = [
        ti("chunks", -1, "success", seconds=5),
        ti("recompute", 0, "success", seconds=60),
        ti("recompute", 1, "running", seconds=30),
        ti("recompute", 2, "up_for_retry", 2),
        ti("advance_watermark", -1, None),
    ]
    snap = Snapshot("running", tasks, chunks, [1000, 3000, 0], slots=2)
    assert snap.status() == ("running | chunks 1/3 done, 1 running, 1 up for retry | hours 10/31 | events 1,000/4,000")
    # 60 s for 1,000 events: chunk 1 needs 180 s and has run 30; chunk 2 holds no event
    assert snap.eta_s() == 150.0
    assert snap.line(75).startswith("[ 1m15s] running | chunks 1/3") and snap.line(75).endswith("ETA 2m30s")

    by_hours = Snapshot("running", tasks, chunks, None, slots=2)  # the index could not be read: weigh by hours
    assert "events" not in by_hours.status()
    assert by_hours.eta_s() == 90.0  # 6 s an hour: chunk 1 has 20 * 6 - 30 left, chunk 2 6 s beside it
    one_slot = Snapshot("running", tasks, chunks, None, slots=1)
    assert one_slot.eta_s() == 96.0  # one chunk at a time: the two remainders add up

    planning = Snapshot("queued", [ti("chunks", -1, None)], None, None)
    assert planning.status() == "queued (one trends_backfill run at a time) | planning the chunks"
    assert planning.line(5).endswith("ETA -")
    none_done = Snapshot("running", tasks[:1] + [ti("recompute", i, "running", seconds=9) for i in range(3)], chunks)
    assert none_done.eta_s() is None  # no rate before a chunk is done
    all_done = Snapshot("success", [ti("recompute", i, "success", seconds=9) for i in range(3)], chunks)
    assert all_done.eta_s() is None and "chunks 3/3 done" in all_done.status()


def test_task_state_reads_the_rest_api() -> None:
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    running = {"task_id": "recompute", "map_index": 1, "state": "running", "try_number": 2, "max_tries": 3,
               "start_date": "2026-01-01T11:59:00Z", "duration": None}  # fmt: skip
    t = TaskState.of(running, now)
    assert (t.name, t.state, t.try_number, t.seconds) == ("recompute[1]", "running", 2, 60.0)
    ended = TaskState.of({"task_id": "chunks", "state": "success", "try_number": 1, "duration": 4.5}, now)
    assert (ended.name, ended.map_index, ended.seconds) == ("chunks", -1, 4.5)
    waiting = TaskState.of({"task_id": "advance_watermark", "map_index": -1, "state": None, "try_number": 0}, now)
    assert (waiting.state, waiting.seconds) == (None, 0.0)


def test_error_lines_pick_what_went_wrong() -> None:
    log = [
        "Executing spark-submit",
        "INFO pass of 240 hours",
        "cassandra.cluster.NoHostAvailable: ('Unable to connect to any servers', {'127.0.0.1:9': ConnectionRefused})",
        "error: Task failed with exception",
        "error: Task failed with exception",
        "done",
    ]
    assert error_lines(log) == [log[2], log[3]]
    noise = ["WARN NativeCodeLoader: Unable to load native-hadoop library", "Traceback (most recent call last):"]
    assert error_lines([*noise, log[2]]) == [log[2]]
    assert error_lines(["a", "b", "", "c"], keep=2) == ["b", "c"]  # nothing looks like an error: the last lines


def test_duration() -> None:
    assert [duration(s) for s in (0, 42.4, 65, 3600 + 125)] == ["0s", "42s", "1m05s", "1h02m"]
