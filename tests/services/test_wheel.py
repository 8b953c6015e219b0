"""One built wheel deploys every role with no checkout (``make test-install``).

The wheel (and sdist) are built with ``python -m build`` as a release would be, installed with the ``[airflow]``
extra into a fresh venv under an empty temporary folder, and every command runs there with ``PYTHONPATH`` unset and
that folder as its working directory, so nothing of the repository can be imported. Against the local stack's Kafka
and Cassandra (a topic and keyspace of the test's own) and an Airflow started from that venv with its
``dags_folder`` at the installed package's DAG folder (``trends admin dags``): ``trends admin init``, a generated
history produced, the speed job, the closed hours recomputed by the ``trends_backfill`` DAG through Airflow's
scheduler, and ``trends serve``, whose answer must count every event of the window, the closed hours from the
batch view.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from infra import topics
from infra.settings import Settings
from infra.settings_env import to_env
from tests.helpers import drop_keyspace, free_port, iso, run_trends, wait_ready

pytestmark = [pytest.mark.install, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
H0 = datetime(2025, 10, 5, 6, tzinfo=UTC)

# What each role runs from the wheel: (role, a file the wheel must hold).
ROLES = {
    "ingestion": "ingestion/producer.py",
    "speed job": "speed_layer/job.py",
    "batch job": "batch_layer/job.py",
    "batch job's spark-submit entry point": "batch_layer/submit.py",
    "DAG files": "dags/trends_batch.py",
    "API": "serving/api.py",
    "dashboard and console pages": "serving/static/dashboard.html",
    "batch exporter": "batch_layer/exporter.py",
    "CQL migrations": "infra/cql/0003_batch.cql",
    "Prometheus rules": "infra/prometheus/trends.rules.yml",
    "Grafana dashboards": "infra/grafana/trends-speed.json",
    "Spark connector pom": "infra/maven/spark-kafka/pom.xml",
}


@dataclass(frozen=True)
class Built:
    """The built wheel and sdist."""

    wheel: Path
    sdist: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """Build the sdist and, from it, the wheel, as a release does (``python -m build``)."""
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), "-m", "build", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return Built(next(out.glob("trends-*.whl")), next(out.glob("trends-*.tar.gz")))


def test_the_wheel_holds_every_role_and_no_tests(built: Built) -> None:
    names = zipfile.ZipFile(built.wheel).namelist()
    missing = {role: path for role, path in ROLES.items() if path not in names}
    assert not missing, missing
    tops = Counter(n.split("/", 1)[0] for n in names if "/" in n and ".dist-info" not in n)
    assert not {"tests", "bench", "docs"} & set(tops), tops
    version = built.wheel.name.split("-")[1]
    assert version not in ("0.1.0", "0.0.0"), version  # from git, not a fallback
    print(f"wheel {built.wheel.name}: {built.wheel.stat().st_size / 1024:.0f} KiB, files by package {dict(tops)}")


@pytest.fixture(scope="module")
def venv(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a fresh venv with the wheel and its ``[airflow]`` extra, pinned by constraints.txt."""
    venv = tmp_path_factory.mktemp("wheel-venv") / "venv"
    subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
         "-c", str(ROOT / "constraints.txt"), f"trends[airflow] @ {built.wheel.as_uri()}"],
        check=True, timeout=1800,
    )  # fmt: skip
    return venv


@pytest.fixture(scope="module")
def env(stack_up: Settings, venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Return the environment of the wheel's commands: a topic, keyspace, data dir and Airflow of their own."""
    run = random.randrange(1 << 30)
    topic, keyspace = f"test.wheel.{run}", f"test_wheel_{run}"
    work = tmp_path_factory.mktemp("wheel-work")
    out = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TRENDS_", "VIRTUAL_ENV", "PYTHON", "AIRFLOW"))},
        **to_env(stack_up),
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "TRENDS_DATA_DIR": str(work / "data"),
        # A deployment brings its own subject key (docs/privacy.md): here the stack's, as a setting.
        "TRENDS_PRIVACY__SUBJECT_KEY_FILE": str(stack_up.subject_key_path),
        "TRENDS_KAFKA__EVENTS_TOPIC": topic,
        "TRENDS_KAFKA__DLQ_TOPIC": f"{topic}.dlq",
        "TRENDS_KAFKA__PARTITIONS": "2",
        "TRENDS_CASSANDRA__KEYSPACE": keyspace,
        "TRENDS_METRICS__SPEED_PORT": "0",
        "TRENDS_SPEED__ALLOWED_LATENESS_S": "7200",
        "TRENDS_BATCH__LATENESS_S": "300",
        "TRENDS_BATCH__GRACE_S": "300",
        "TRENDS_AIRFLOW__API_PORT": str(free_port()),
        "TRENDS_SERVING__PORT": str(free_port()),
    }
    out.pop("PYTHONPATH", None)
    yield out
    drop_keyspace(stack_up, keyspace)
    topics.delete_topics(stack_up.kafka, [topic, f"{topic}.dlq"])


def test_every_role_runs_from_the_wheel_with_no_checkout(venv: Path, env: dict[str, str], tmp_path: Path) -> None:
    cwd = tmp_path / "empty"
    cwd.mkdir()

    def trends(*args: str, timeout: float = 900) -> str:
        out = run_trends(venv, env, *args, timeout=timeout, cwd=cwd)
        print(f"$ trends {' '.join(args)}\n{out[-1500:]}")
        return out

    # Nothing of the repository is importable: the modules are the venv's.
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import dags, batch_layer, sys; print(dags.__file__, sys.path)"],
        cwd=cwd, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert str(ROOT) not in where and str(venv) in where, where

    init = trends("admin", "init")
    assert "created" in init and "migration(s) applied" in init
    jars = trends("admin", "jars")
    assert "spark-kafka" in jars
    dags = Path(trends("admin", "dags").strip().splitlines()[-1])
    assert dags.is_relative_to(venv) and (dags / "trends_batch.py").is_file(), dags
    env["TRENDS_AIRFLOW__DAGS_FOLDER"] = str(dags)

    events_file = tmp_path / "events.jsonl"
    end = H0 + timedelta(hours=3)
    trends("ingest", "generate", "--start", iso(H0), "--end", iso(end), "--event-rate", "0.5", "--items", "200",
           "--users", "2000", "--seed", "11", "-o", str(events_file))  # fmt: skip
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    assert len(events) > 4000
    trends("ingest", "file", str(events_file))
    trends("speed", "run", "--available-now")

    # Airflow from the wheel's venv, parsing the installed package's DAG folder, recomputes the closed hours.
    try:
        up = trends("stack", "up", "airflow")
        assert f"DAGs from {dags}" in up, up
        trends("batch", "backfill", "--start", iso(H0), "--end", iso(H0 + timedelta(hours=2)), "--wait",
               "--timeout", "900", timeout=1200)  # fmt: skip
    finally:
        trends("stack", "down", "airflow", timeout=180)
    # each hour's lineage names the wheel's version as the code that computed it
    version = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('trends'))"],
        cwd=cwd, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    status = trends("batch", "status")
    assert status.count("completed read") == 2 and status.count(f"code {version}") == 2, status

    log_path = tmp_path / "serve.log"
    url = f"http://127.0.0.1:{env['TRENDS_SERVING__PORT']}"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [str(venv / "bin" / "trends"), "serve"], env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            wait_ready(proc, url, log_path)
            window = {"start": iso(H0 + timedelta(minutes=30)), "end": iso(end)}
            got = httpx.get(f"{url}/api/v1/count", params=window, timeout=60).json()
        finally:
            proc.terminate()
            proc.wait(20)
    lo, hi = window["start"], window["end"]
    assert got["events"] == sum(1 for e in events if lo <= e["ts"][:19] + "Z" < hi), got
    layers = [(s["layer"], s["resolution"]) for s in got["provenance"]["spans"]]
    assert ("batch", "hour") in layers and ("speed", "minute") in layers, got["provenance"]
    assert got["provenance"]["boundary"] == iso(H0 + timedelta(hours=2))
