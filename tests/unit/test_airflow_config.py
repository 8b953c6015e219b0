"""How the local Airflow is configured, without starting it: env, files, refusals, and the settings round trip."""

from __future__ import annotations

import configparser
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from infra.dag_contract import dags_folder
from infra.errors import StackError
from infra.settings import Settings, get_settings
from infra.settings_env import to_env
from stack.airflow.service import Airflow


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for key in list(os.environ):
        if key.startswith(("TRENDS_", "AIRFLOW")):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)  # no stray .env file
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_settings_survive_the_round_trip_through_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    original = Settings(
        data_dir=tmp_path / "data",
        kafka={"bootstrap_servers": "k1:9092,k2:9092", "sasl_password": "p@ss"},
        cassandra={"contact_points": ["10.0.0.1", "10.0.0.2"], "datacenter_replication": {"dc1": 3}},
        spark={"local_ip": None, "conf": {"spark.ui.port": "4050"}},
        views={"slice_dims": ["origin"]},
        airflow={"api_port": 18080, "database_url": "postgresql://a:b%40c@127.0.0.1/airflow", "triggerer": True},
    )
    env = to_env(original)
    assert env["TRENDS_AIRFLOW__API_PORT"] == "18080"
    assert env["TRENDS_KAFKA__SASL_PASSWORD"] == "p@ss"  # noqa: S105 - tasks need the real secret
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    again = Settings()
    unset = {"spark": {"local_ip"}}  # None travels as "" (the documented "unset"), checked below
    assert again.model_dump(exclude=unset) == original.model_dump(exclude=unset)
    assert again.kafka.sasl_password is not None and again.kafka.sasl_password.get_secret_value() == "p@ss"
    assert not again.spark.local_ip


def test_airflow_env_follows_the_settings(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, airflow={"api_port": 18123, "parallelism": 3}, spark={"master": "local[3]"})
    airflow = Airflow(settings)
    env = airflow.airflow_env()
    assert env["AIRFLOW_HOME"] == str(tmp_path / "airflow")
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:18123/execution/"
    assert env["AIRFLOW__API__PORT"] == "18123" and env["AIRFLOW__API__HOST"] == "127.0.0.1"
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor" and env["AIRFLOW__CORE__PARALLELISM"] == "3"
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    # the installed package's DAG folder: in this editable install, the checkout's dags/
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(dags_folder()) == str(Path(__file__).resolve().parents[2] / "dags")
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{tmp_path}/airflow/data/airflow.db?timeout=60"
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "admin:admin"
    assert json.loads(env["AIRFLOW_CONN_TRENDS_SPARK"]) == {"conn_type": "spark", "host": "local[3]"}

    process = airflow.process_env()
    assert process["PATH"].split(os.pathsep)[0] == str(airflow.bin_dir())
    assert (airflow.bin_dir() / "airflow").exists()
    assert process["TRENDS_DATA_DIR"] == str(tmp_path)  # tasks read the same settings


# Run by Airflow's own engine set-up, with the stack's environment: a session leaves a result unread (its read
# snapshot open), another process commits, then the next session writes.
UNREAD_RESULT_THEN_WRITE = """
import sqlite3
from sqlalchemy import text
from airflow import settings

settings.configure_orm()
with settings.engine.begin() as conn:
    conn.execute(text("CREATE TABLE probe (x INTEGER)"))
    conn.execute(text("INSERT INTO probe VALUES (1), (2), (3)"))
held = settings.Session()
unread = held.execute(text("SELECT x FROM probe"))  # kept alive, as a traceback's frames keep Airflow's
unread.fetchone()
held.close()
other = sqlite3.connect(settings.engine.url.database)
other.execute("INSERT INTO probe VALUES (4)")
other.commit()
fresh = settings.Session()
fresh.execute(text("INSERT INTO probe VALUES (5)"))
fresh.commit()
print(type(settings.engine.pool).__name__)
"""


@pytest.mark.parametrize("pool_enabled", [None, "True"], ids=["stack", "pooled"])
def test_a_connection_left_with_an_unread_result_never_fails_the_next_write(
    tmp_path: Path, pool_enabled: str | None
) -> None:
    """On SQLite an unread result makes every later write on its connection fail at once ("database is locked",
    whatever the busy timeout): the stack's Airflow must not hand that connection to the next request."""
    airflow = Airflow(Settings(data_dir=tmp_path))
    airflow.render_config()  # also makes the folder of the SQLite file
    env = airflow.process_env()
    if pool_enabled is not None:  # the pool SQLAlchemy 2 would use: shows the probe can fail
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_POOL_ENABLED"] = pool_enabled
    proc = subprocess.run(
        [sys.executable, "-c", UNREAD_RESULT_THEN_WRITE], env=env, capture_output=True, text=True, check=False
    )
    if pool_enabled is None:
        assert (proc.returncode, proc.stdout.strip()) == (0, "NullPool"), proc.stderr[-2000:]
    else:
        assert proc.returncode != 0 and "database is locked" in proc.stderr, proc.stdout + proc.stderr[-2000:]


def test_extra_config_applies_last_and_must_be_airflow_variables(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, airflow={"config": {"AIRFLOW__CORE__PARALLELISM": "1"}})
    assert Airflow(settings).airflow_env()["AIRFLOW__CORE__PARALLELISM"] == "1"
    with pytest.raises(ValidationError, match="not Airflow variables"):
        Settings(airflow={"config": {"PATH": "/tmp"}})


def test_config_files_keep_their_keys_and_are_private(tmp_path: Path) -> None:
    url = "postgresql+psycopg2://airflow:p%40ss@127.0.0.1:5432/airflow"
    airflow = Airflow(Settings(data_dir=tmp_path, airflow={"database_url": url, "admin_password": "s3cret"}))
    cfg = airflow.render_config()
    first = cfg.read_text()
    assert airflow.render_config().read_text() == first  # keys generated once, then kept
    parser = configparser.ConfigParser()  # the same %-interpolation as Airflow's parser
    parser.read(cfg)
    assert parser.get("database", "sql_alchemy_conn") == url
    assert parser.get("api_auth", "jwt_secret") and parser.get("core", "fernet_key")
    assert json.loads(airflow.passwords_file.read_text()) == {"admin": "s3cret"}
    for path in (cfg, airflow.passwords_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    env = airflow.airflow_env()
    assert "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" not in env
    assert not any("p%40ss" in v or "s3cret" in v for v in env.values())
    assert airflow.data_paths() == []  # a configured database is never dropped by `reset`


def test_unsafe_or_impossible_configurations_are_refused_before_anything_starts(tmp_path: Path) -> None:
    public = Airflow(Settings(data_dir=tmp_path, airflow={"host": "0.0.0.0"}))  # noqa: S104 - refused below
    with pytest.raises(StackError, match="default admin password"):
        public.start("")
    no_dags = Airflow(Settings(data_dir=tmp_path, airflow={"dags_folder": tmp_path / "missing"}))
    with pytest.raises(StackError, match="DAGs folder"):
        no_dags.start("")
    no_driver = Airflow(
        Settings(data_dir=tmp_path, airflow={"database_url": "postgresql+nosuchdriver://a@127.0.0.1/airflow"})
    )
    with pytest.raises(StackError, match="'nosuchdriver', which is not installed"):
        no_driver.start("")
    assert all(pid is None for pid in no_driver.pids().values())
    with pytest.raises(ValidationError, match="postgresql"):
        Settings(airflow={"database_url": "postgres://a@127.0.0.1/airflow"})


def test_airflow_env_command_prints_exports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.cli import cli

    monkeypatch.setenv("TRENDS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TRENDS_AIRFLOW__API_PORT", "18555")
    result = CliRunner().invoke(cli, ["stack", "airflow-env"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines and all(line.startswith("export ") for line in lines if not line.startswith(". "))
    assert f"export AIRFLOW_HOME={tmp_path / 'airflow'}" in lines
    assert "export AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://127.0.0.1:18555/execution/" in lines
    assert lines[0].endswith(':"$PATH"')
    assert (tmp_path / "airflow" / "airflow.cfg").exists()  # the CLI finds the keys on its first run


def test_stack_up_keeps_airflow_opt_in() -> None:
    from stack import control

    assert [svc.name for svc in control.services(Settings())] == ["kafka", "cassandra"]
    assert [svc.name for svc in control.services(Settings(), ["airflow", "kafka"])] == ["kafka", "airflow"]
    with pytest.raises(StackError, match="unknown service"):
        control.services(Settings(), ["zookeeper"])


def test_airflow_env_never_prints_secrets_but_the_shell_still_gets_them(tmp_path: Path) -> None:
    import subprocess

    config = {
        "AIRFLOW_CONN_WAREHOUSE": "postgresql://etl:hunter2@db:5432/dw",
        "AIRFLOW__SECRETS__BACKEND_KWARGS": '{"token": "tok-hunter2"}',
        "AIRFLOW__WEBSERVER__BASE_URL": "http://viewer:hunter2@127.0.0.1:8080",
        "AIRFLOW__CORE__PARALLELISM": "3",
    }
    env = {
        **os.environ,
        "TRENDS_DATA_DIR": str(tmp_path),
        "TRENDS_AIRFLOW__CONFIG": json.dumps(config),
        "TRENDS_AIRFLOW__ADMIN_PASSWORD": "admin-hunter2",
    }
    trends = str(Path(sys.executable).parent / "trends")
    printed = subprocess.run([trends, "stack", "airflow-env"], env=env, capture_output=True, text=True, check=True)
    assert "hunter2" not in printed.stdout + printed.stderr
    assert "export AIRFLOW__CORE__PARALLELISM=3" in printed.stdout.splitlines()
    secret_file = tmp_path / "airflow" / "secret.env"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    # What `eval "$(trends stack airflow-env)"` gives the airflow CLI: every value, the secret ones included.
    names = ("AIRFLOW_CONN_WAREHOUSE", "AIRFLOW__SECRETS__BACKEND_KWARGS", "AIRFLOW__WEBSERVER__BASE_URL")
    script = 'eval "$1"; printf "%s\\n" ' + " ".join(f'"${name}"' for name in names)
    shell = subprocess.run(["bash", "-c", script, "-", printed.stdout], capture_output=True, text=True, check=True)
    assert shell.stdout.splitlines() == [
        config["AIRFLOW_CONN_WAREHOUSE"],
        config["AIRFLOW__SECRETS__BACKEND_KWARGS"],
        config["AIRFLOW__WEBSERVER__BASE_URL"],
    ]


def test_trends_config_masks_secret_keys_and_userinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.cli import cli
    from infra.settings import get_settings

    for key, value in {
        "TRENDS_DATA_DIR": str(tmp_path),
        "TRENDS_SPARK__CONF": json.dumps(
            {
                "spark.hadoop.fs.s3a.secret.key": "hunter2",
                "spark.hive.metastore.uris": "thrift://u:hunter2@h:9083",
                "spark.sql.shuffle.partitions": "7",
            }
        ),
        "TRENDS_SPARK__MASTER": "spark://user:hunter2@127.0.0.1:7077",
        "TRENDS_AIRFLOW__CONFIG": json.dumps(
            {
                "AIRFLOW_CONN_PG": "postgresql://u:hunter2@h/d",
                "AIRFLOW__CORE__FERNET_KEY": "hunter2",
                "AIRFLOW__API__AUTH_TOKEN": "hunter2",
                "AIRFLOW__CORE__PARALLELISM": "3",
            }
        ),
        "TRENDS_AIRFLOW__DATABASE_URL": "postgresql://airflow:hunter2@127.0.0.1/airflow",
        "TRENDS_AIRFLOW__ADMIN_PASSWORD": "hunter2",
        "TRENDS_KAFKA__SASL_PASSWORD": "hunter2",
        "TRENDS_CASSANDRA__PASSWORD": "hunter2",
        "TRENDS_SERVING__API_TOKEN": "hunter2",
    }.items():
        monkeypatch.setenv(key, value)
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(cli, ["config"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    assert "hunter2" not in result.output
    shown = json.loads(result.output)
    assert shown["spark"]["conf"]["spark.sql.shuffle.partitions"] == "7"  # the rest stays readable
    assert shown["spark"]["conf"]["spark.hive.metastore.uris"] == "thrift://**********@h:9083"
    assert shown["spark"]["master"] == "spark://**********@127.0.0.1:7077"
    assert shown["airflow"]["config"]["AIRFLOW__CORE__PARALLELISM"] == "3"
    assert shown["airflow"]["config"]["AIRFLOW_CONN_PG"] == "**********"
    assert shown["cassandra"]["keyspace"] == "trends"


@pytest.mark.parametrize("damage", ["directory", "not-ini", "not-utf8", "dangling-symlink"])
def test_an_unreadable_airflow_cfg_is_an_error_never_a_new_fernet_key(tmp_path: Path, damage: str) -> None:
    airflow = Airflow(Settings(data_dir=tmp_path))
    airflow.render_config()
    cfg = airflow.cfg_file
    if damage == "directory":
        cfg.unlink()
        cfg.mkdir()
    elif damage == "not-ini":
        cfg.write_text("fernet_key = lost its section header\n")
    elif damage == "not-utf8":
        cfg.write_bytes(b"[core]\nfernet_key = \xff\xfe\n")
    else:
        cfg.unlink()
        cfg.symlink_to(tmp_path / "moved-away.cfg")
    before = _snapshot(cfg)
    with pytest.raises(StackError, match=r"cannot read .*airflow\.cfg: .*no new key is generated") as err:
        airflow.render_config()
    assert "lost its section header" not in str(err.value)  # the file's lines (keys, passwords) are never quoted
    assert _snapshot(cfg) == before  # left exactly as it was for the operator to repair


def test_a_lost_fernet_key_with_an_existing_metadata_db_is_an_error(tmp_path: Path) -> None:
    airflow = Airflow(Settings(data_dir=tmp_path))
    airflow.render_config()
    airflow.cfg_file.write_text("[core]\n\n[api]\nsecret_key = s\n")  # readable, but the key is gone
    airflow.render_config()  # no metadata DB yet: nothing was encrypted, a new key is fine
    assert _fernet_key(airflow)
    airflow.cfg_file.write_text("[core]\n")
    (airflow.data_dir / "airflow.db").write_bytes(b"SQLite format 3\x00")
    with pytest.raises(StackError, match="no \\[core\\] fernet_key while the metadata DB exists"):
        airflow.render_config()


def test_airflow_env_command_reports_an_unreadable_cfg(tmp_path: Path) -> None:
    import subprocess

    airflow = Airflow(Settings(data_dir=tmp_path))
    airflow.home.mkdir(parents=True)
    airflow.cfg_file.write_text("garbage without a section\n")
    trends = str(Path(sys.executable).parent / "trends")
    env = {**os.environ, "TRENDS_DATA_DIR": str(tmp_path)}
    proc = subprocess.run([trends, "stack", "airflow-env"], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 1
    assert "cannot read" in proc.stderr and "export" not in proc.stdout
    assert airflow.cfg_file.read_text() == "garbage without a section\n"


def _fernet_key(airflow: Airflow) -> str:
    parser = configparser.RawConfigParser()
    parser.read(airflow.cfg_file)
    return parser.get("core", "fernet_key")


def _snapshot(path: Path) -> str:
    if path.is_symlink():
        return f"symlink -> {os.readlink(path)}"
    if path.is_dir():
        return f"dir {sorted(p.name for p in path.iterdir())}"
    return path.read_bytes().decode("utf-8", "replace")
