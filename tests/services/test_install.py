"""`pip install .` without extras is the whole pipeline, without Airflow (``make test-install``).

Every step runs the ``trends`` command of a separate venv that has only the pinned core dependencies
(``TRENDS_TEST_CORE_VENV``, made by ``make test-install``; the fixture makes it when it is missing): the topic and
schema (``trends admin init``), a generated file replayed into Kafka (``trends ingest generate -o`` then ``trends
ingest file``), the speed job, the index and a batch recompute, and ``trends serve``, whose answer must count every
generated event of the window, the closed hours from the batch view and the rest from the speed view.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from infra import topics
from infra.settings import Settings
from infra.settings_env import to_env
from tests.helpers import drop_keyspace, iso, wait_ready
from tests.helpers import run_trends as trends

pytestmark = [pytest.mark.install, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
H0 = datetime(2025, 9, 14, 6, tzinfo=UTC)
PORT = 19210  # this suite's private port (19200-19299)


@pytest.fixture(scope="module")
def core_venv() -> Path:
    """Return the venv with `pip install -c constraints.txt .` (made here, non-editable, when it is missing)."""
    venv = Path(os.environ.get("TRENDS_TEST_CORE_VENV", ROOT / ".venv-core"))
    if not venv.is_absolute():
        venv = ROOT / venv
    if not (venv / "bin" / "trends").exists():
        subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "--quiet", "-c", str(ROOT / "constraints.txt"), str(ROOT)],
            check=True,
            timeout=1200,
        )
    return venv


@pytest.fixture(scope="module")
def env(stack_up: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Return the environment of the core venv's commands: a topic and keyspace of their own."""
    run = random.randrange(1 << 30)
    topic, keyspace = f"test.install.{run}", f"test_install_{run}"
    work = tmp_path_factory.mktemp("install")
    out = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TRENDS_", "VIRTUAL_ENV", "PYTHON"))},
        **to_env(stack_up),
        "TRENDS_KAFKA__EVENTS_TOPIC": topic,
        "TRENDS_KAFKA__DLQ_TOPIC": f"{topic}.dlq",
        "TRENDS_KAFKA__PARTITIONS": "2",
        "TRENDS_CASSANDRA__KEYSPACE": keyspace,
        "TRENDS_SPARK__CHECKPOINT_ROOT": str(work / "checkpoints"),
        "TRENDS_METRICS__SPEED_PORT": "0",
        "TRENDS_SPEED__ALLOWED_LATENESS_S": "7200",
        "TRENDS_BATCH__LATENESS_S": "300",
        "TRENDS_BATCH__GRACE_S": "300",
        "TRENDS_SERVING__PORT": str(PORT),
        "TRENDS_TEST_WORK": str(work),
    }
    yield out
    drop_keyspace(stack_up, keyspace)
    topics.delete_topics(stack_up.kafka, [topic, f"{topic}.dlq"])


@pytest.fixture(scope="module")
def airflow_venv() -> Path:
    """Return the venv with `pip install -c constraints.txt '.[airflow]'` (made here when it is missing)."""
    venv = Path(os.environ.get("TRENDS_TEST_AIRFLOW_VENV", ROOT / ".venv-airflow"))
    venv = venv if venv.is_absolute() else ROOT / venv
    if not (venv / "bin" / "airflow").exists():
        subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "--quiet", "-c", str(ROOT / "constraints.txt"), f"{ROOT}[airflow]"],
            check=True,
            timeout=1800,
        )
    return venv


PARSE = r"""
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=%r)
print("ERRORS", {k: str(v)[-500:] for k, v in bag.import_errors.items()})
print("DAGS", sorted(bag.dags))
"""


def test_the_dag_files_parse_with_only_the_airflow_extra(airflow_venv: Path, tmp_path: Path) -> None:
    """`pip install '.[airflow]'` (no dev tools) is enough for the DAG processor."""
    proc = subprocess.run(
        [str(airflow_venv / "bin" / "python"), "-c", PARSE % str(ROOT / "dags")],
        cwd=tmp_path,  # the installed package, not the checkout, provides the pipeline's modules
        env={**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ERRORS {}" in proc.stdout, proc.stdout[-3000:]
    assert "DAGS ['trends_backfill', 'trends_batch']" in proc.stdout
    pytest_missing = subprocess.run(
        [str(airflow_venv / "bin" / "python"), "-c", "import pytest"], capture_output=True, check=False
    )
    assert pytest_missing.returncode != 0  # no dev tools in it


def test_airflow_is_not_installed(core_venv: Path) -> None:
    proc = subprocess.run(
        [str(core_venv / "bin" / "python"), "-c", "import airflow"], capture_output=True, text=True, check=False
    )
    assert proc.returncode != 0 and "No module named 'airflow'" in proc.stderr
    # pandas is no dependency either (nothing imports it; toArrow does not need it)
    proc = subprocess.run(
        [str(core_venv / "bin" / "python"), "-c", "import pandas"], capture_output=True, text=True, check=False
    )
    assert proc.returncode != 0


def test_ingest_speed_batch_and_serve_without_airflow(core_venv: Path, env: dict[str, str]) -> None:
    work = Path(env["TRENDS_TEST_WORK"])
    print(trends(core_venv, env, "admin", "init"))
    events_file = work / "events.jsonl"
    end = H0 + timedelta(hours=3)
    trends(core_venv, env, "ingest", "generate", "--start", iso(H0), "--end", iso(end), "--event-rate", "0.5",
           "--items", "200", "--users", "2000", "--seed", "7", "-o", str(events_file))  # fmt: skip
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    assert len(events) > 4000
    print(trends(core_venv, env, "ingest", "file", str(events_file)))

    print(trends(core_venv, env, "speed", "run", "--available-now"))
    print(trends(core_venv, env, "batch", "index"))
    print(trends(core_venv, env, "batch", "run", "--start", iso(H0), "--end", iso(H0 + timedelta(hours=2))))

    log = (work / "serve.log").open("w")
    proc = subprocess.Popen([str(core_venv / "bin" / "trends"), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{PORT}"
    try:
        wait_ready(proc, url, work / "serve.log")
        window = {"start": iso(H0 + timedelta(minutes=30)), "end": iso(end)}
        got = httpx.get(f"{url}/api/v1/count", params=window, timeout=60).json()
        lo, hi = window["start"], window["end"]
        assert got["events"] == sum(1 for e in events if lo <= e["ts"][:19] + "Z" < hi), got
        layers = [(s["layer"], s["resolution"]) for s in got["provenance"]["spans"]]
        assert ("batch", "hour") in layers and ("speed", "minute") in layers, got["provenance"]
        assert got["provenance"]["boundary"] == iso(H0 + timedelta(hours=2))
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()
