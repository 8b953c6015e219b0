"""Where the local Airflow lives and how it is configured: its components, paths, environment and config files.

Configuration is ``AIRFLOW__*`` variables (``trends stack airflow-env`` prints them for the ``airflow`` CLI) plus a
private ``airflow.cfg`` holding only the generated keys — the JWT secret must be the same in every component or tasks
cannot authenticate — and a PostgreSQL URL when one is set.
"""

from __future__ import annotations

import base64
import configparser
import importlib.util
import json
import logging
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from infra.airflow.client import AirflowClient
from infra.dag_contract import dags_folder
from infra.errors import StackError
from infra.security import MIN_SECRET_CHARS, exposure_problem, has_userinfo, is_loopback, is_secret_key
from infra.service_settings import LOCAL_ADMIN_PASSWORD
from infra.settings import Settings
from infra.settings_env import env_var
from stack.process import child_env, tail, write_private

logger = logging.getLogger(__name__)

SIMPLE_AUTH_MANAGER = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"


@dataclass(frozen=True)
class Component:
    """One long-running ``airflow`` process."""

    name: str
    args: tuple[str, ...]
    health_key: str


API_SERVER = Component("api-server", ("api-server",), "metadatabase")
# --skip-serve-logs: the log servers bind 0.0.0.0 on fixed ports; with LocalExecutor the API server reads task logs
# from the shared local folder instead.
SCHEDULER = Component("scheduler", ("scheduler", "--skip-serve-logs"), "scheduler")
DAG_PROCESSOR = Component("dag-processor", ("dag-processor",), "dag_processor")
TRIGGERER = Component("triggerer", ("triggerer", "--skip-serve-logs"), "triggerer")
COMPONENTS = (API_SERVER, SCHEDULER, DAG_PROCESSOR, TRIGGERER)


def airflow_executable() -> Path:
    """Return the ``airflow`` command of this venv.

    :raises StackError: when apache-airflow is not installed here.
    """
    candidate = Path(sys.executable).parent / "airflow"
    if candidate.exists():
        return candidate
    found = shutil.which("airflow")
    if found:
        return Path(found)
    msg = "the `airflow` command was not found next to this Python or on PATH; install the project (`make setup`)."
    raise StackError(msg)


class AirflowConfig:
    """The local Airflow instance: its layout and configuration; :class:`~stack.airflow.service.Airflow` runs it."""

    name = "airflow"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.conf = settings.airflow
        self.home = settings.data_dir / "airflow"
        self.log_dir = self.home / "logs"
        self.data_dir = self.home / "data"
        self.task_log_dir = self.data_dir / "task-logs"
        self.cfg_file = self.home / "airflow.cfg"
        self.passwords_file = self.home / "simple_auth_manager_passwords.json"

    # -- where things are -------------------------------------------------------------------------------------
    @property
    def components(self) -> tuple[Component, ...]:
        """Return the components this configuration runs, in start order."""
        return tuple(c for c in COMPONENTS if c is not TRIGGERER or self.conf.triggerer)

    @property
    def api_host(self) -> str:
        """Return the address the API server really binds."""
        return self.conf.bind_host

    @property
    def api_port(self) -> int:
        """Return the port the API server really binds."""
        return self.conf.bind_port

    @property
    def client_host(self) -> str:
        """Return the address to reach the API server at (loopback when it binds every interface)."""
        return self.conf.client_host

    @property
    def url(self) -> str:
        """Return the base URL of the local UI and REST API."""
        host = f"[{self.client_host}]" if ":" in self.client_host else self.client_host
        return f"http://{host}:{self.api_port}"

    @property
    def address(self) -> str:
        """Return host:port of the API server."""
        return f"{self.client_host}:{self.api_port}"

    @property
    def dags_folder(self) -> Path:
        """Return the folder of DAG files: the setting, else the installed package's (``trends admin dags``)."""
        return (self.conf.dags_folder or dags_folder()).expanduser().resolve()

    def log_file(self, component: str) -> Path:
        """Return the output file of one component (or ``migrate`` for ``airflow db migrate``)."""
        return self.log_dir / f"{component}.log"

    @property
    def main_log(self) -> Path:
        """Return the scheduler's log: where task failures and DAG runs show first."""
        return self.log_file(SCHEDULER.name)

    @property
    def stdout_file(self) -> Path:
        """Return the same file as :attr:`main_log`: a component's output is its log."""
        return self.main_log

    def log_files(self) -> list[Path]:
        """Return the files worth showing when Airflow misbehaves."""
        return [self.log_file("migrate"), *(self.log_file(c.name) for c in self.components)]

    def pid_file(self, component: Component) -> Path:
        """Return the pid file of one component."""
        return self.home / f"{component.name}.pid"

    @property
    def database_url(self) -> str:
        """Return the metadata DB URL: the setting, else SQLite under ``<data_dir>/airflow/data``."""
        if self.conf.database_url is not None:
            return self.conf.database_url.get_secret_value()
        # A writer waits up to 60 s for SQLite's lock instead of pysqlite's 5 s: under load the scheduler, the API
        # server, the DAG processor, the tasks and the CLI contend, and "database is locked" fails the loser.
        return f"sqlite:///{self.data_dir / 'airflow.db'}?timeout=60"

    # -- environment and files --------------------------------------------------------------------------------
    def airflow_env(self) -> dict[str, str]:
        """Return the ``AIRFLOW*`` variables that make Airflow (and the ``airflow`` CLI) this stack's instance.

        Secrets are not among them: keys and a PostgreSQL URL live in ``airflow.cfg`` under ``AIRFLOW_HOME``.
        """
        conf = self.conf
        env = {
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW_CONFIG": str(self.cfg_file),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(conf.parallelism),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            # Tasks report to the API server's execution API; it must follow the port, or every task fails.
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__CORE__AUTH_MANAGER": SIMPLE_AUTH_MANAGER,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{conf.admin_user}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.passwords_file),
            "AIRFLOW__API__HOST": conf.host,
            "AIRFLOW__API__PORT": str(conf.api_port),
            "AIRFLOW__API__WORKERS": str(conf.api_workers),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.task_log_dir),
        }
        if self.conf.database_url is None:
            env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = self.database_url
        if self.database_url.startswith("sqlite"):
            # No connection pool on SQLite. A result left unread holds a read snapshot on its connection (Airflow's
            # backfill creation leaves one when it reprocesses a run and the write fails); once another process
            # commits, every write on that connection fails at once with "database is locked", whatever the busy
            # timeout, until the result is garbage-collected. Pooled, the next request inherits that connection;
            # unpooled, it is closed with its session (SQLAlchemy 1.4's default for a SQLite file).
            env["AIRFLOW__DATABASE__SQL_ALCHEMY_POOL_ENABLED"] = "False"
        # The batch DAG submits to this connection; an operator's own definition wins.
        conn_var = f"AIRFLOW_CONN_{self.settings.batch.spark_conn_id.upper()}"
        if conn_var not in os.environ:
            env[conn_var] = json.dumps({"conn_type": "spark", "host": self.settings.spark.master})
        env.update(conf.config)
        return env

    @staticmethod
    def split_secret_env(env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
        """Split Airflow variables into those safe to print and the secret ones (by name, or a URI's password)."""
        plain: dict[str, str] = {}
        secret: dict[str, str] = {}
        for key, value in env.items():
            # The SQLite URL the stack sets is a path; a URL with a password is caught by its userinfo.
            is_secret = (is_secret_key(key) and key != "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN") or has_userinfo(value)
            (secret if is_secret else plain)[key] = value
        return plain, secret

    def write_secret_env(self, secret: dict[str, str]) -> Path:
        """Write ``export`` lines of secret variables to a file only the owner reads; return its path."""
        self.home.mkdir(parents=True, exist_ok=True)
        path = self.home / "secret.env"
        write_private(path, "".join(f"export {k}={shlex.quote(v)}\n" for k, v in secret.items()))
        return path

    @staticmethod
    def bin_dir() -> Path:
        """Return the venv's ``bin``, which must come first on PATH (Airflow runs ``airflow …`` subprocesses)."""
        return airflow_executable().parent

    def process_env(self) -> dict[str, str]:
        """Return the whole environment of Airflow's processes: ours, every setting as TRENDS_*, Airflow's own.

        Of the pipeline's secrets they get Kafka's and Cassandra's (the tasks run the batch job), as files in
        ``<airflow home>/secrets`` (:func:`stack.process.child_env`); Airflow's own live in ``airflow.cfg``.
        """
        path = os.pathsep.join([str(self.bin_dir()), os.environ.get("PATH", os.defpath)])
        base = child_env(self.settings, ("kafka", "cassandra"), self.home / "secrets")
        return {**base, **self.airflow_env(), "PATH": path}

    def _keys(self) -> dict[str, str]:
        """Return the keys of the existing ``airflow.cfg``, generating them only for a new one (kept across starts).

        The Fernet key encrypts the connections and variables stored in the metadata DB: a new one makes them
        unreadable. So an ``airflow.cfg`` that exists but cannot be read or parsed, or that lost its Fernet key while
        a metadata DB exists, is an error naming the file, never a reason to generate a new key.

        :raises StackError: on such a file.
        """
        parser = configparser.RawConfigParser()
        exists = self.cfg_file.exists() or self.cfg_file.is_symlink()
        if exists:
            try:
                with self.cfg_file.open(encoding="utf-8") as fh:
                    parser.read_file(fh, source=str(self.cfg_file))
            except (OSError, UnicodeError, configparser.Error) as exc:
                msg = (
                    f"cannot read {self.cfg_file}: {_why_unreadable(exc)}. It holds the Fernet key of the "
                    "connections stored in the metadata DB, so no new key is generated: fix the file (permissions, "
                    "contents) or restore it from a backup. Only if the metadata DB holds nothing to keep, delete the "
                    "file and run `trends stack reset airflow`."
                )
                raise StackError(msg) from exc
        wanted: dict[tuple[str, str], Callable[[], str]] = {
            ("core", "fernet_key"): lambda: base64.urlsafe_b64encode(os.urandom(32)).decode(),
            ("api_auth", "jwt_secret"): lambda: secrets.token_urlsafe(32),
            ("api", "secret_key"): lambda: secrets.token_urlsafe(32),
        }
        if exists and not parser.get("core", "fernet_key", fallback="") and self._metadata_db_exists():
            msg = (
                f"{self.cfg_file} has no [core] fernet_key while the metadata DB exists: the connections stored there "
                "were encrypted with it, so no new key is generated. Restore the key (or the file) from a backup; "
                "only if the metadata DB holds nothing to keep, run `trends stack reset airflow`."
            )
            raise StackError(msg)
        return {
            f"{section}.{key}": parser.get(section, key, fallback="") or make()
            for (section, key), make in wanted.items()
        }

    def _metadata_db_exists(self) -> bool:
        """Tell whether a metadata DB may already hold encrypted data (a configured URL is assumed to)."""
        return self.conf.database_url is not None or (self.data_dir / "airflow.db").exists()

    def render_config(self) -> Path:
        """Write ``airflow.cfg`` (generated keys, a PostgreSQL URL if set) and the passwords file; return the cfg.

        Re-run at every start, so a changed password or database URL takes effect; the keys are kept.
        """
        for folder in (self.home, self.log_dir, self.data_dir, self.task_log_dir):
            folder.mkdir(parents=True, exist_ok=True)
        keys = self._keys()
        lines = [
            "# Written by stack/airflow/config.py at every `trends stack up airflow`; edits are lost. The keys are",
            "# generated once and kept. Every other option is an AIRFLOW__* variable: see `trends stack airflow-env`.",
        ]
        for section in ("core", "api", "api_auth"):
            lines += ["", f"[{section}]"]
            lines += [f"{k.split('.')[1]} = {v}" for k, v in keys.items() if k.startswith(f"{section}.")]
        if self.conf.database_url is not None:
            # Airflow's parser interpolates %: a URL-encoded password needs it doubled.
            lines += ["", "[database]", f"sql_alchemy_conn = {self.database_url.replace('%', '%%')}"]
        write_private(self.cfg_file, "\n".join(lines) + "\n")
        password = self.conf.admin_password.get_secret_value()
        write_private(self.passwords_file, json.dumps({self.conf.admin_user: password}) + "\n")
        return self.cfg_file

    # -- checks before starting -------------------------------------------------------------------------------
    def check_safe(self) -> None:
        """Refuse a non-loopback API server with the default, a short or no admin password, or with auth disabled.

        The host checked is the one Airflow will bind: ``AIRFLOW__API__HOST`` in ``airflow.config`` wins over
        ``airflow.host``.

        :raises StackError: on an unsafe configuration, or a DAGs folder that does not exist.
        """
        host = self.api_host
        if not is_loopback(host):
            password = self.conf.admin_password.get_secret_value()
            where = env_var("airflow.host") + (
                f" and AIRFLOW__API__HOST in {env_var('airflow.config')}"
                if "AIRFLOW__API__HOST" in self.conf.config
                else ""
            )
            if password == LOCAL_ADMIN_PASSWORD:
                msg = (
                    f"refusing to serve Airflow on {host or 'every interface'} (not loopback) with the default admin "
                    f"password: set {env_var('airflow.admin_password')} (at least {MIN_SECRET_CHARS} characters), or "
                    f"keep {where} on 127.0.0.1."
                )
                raise StackError(msg)
            problem = exposure_problem(
                "Airflow", host, password, guard_var=env_var("airflow.admin_password"), host_var=where
            )
            if problem:
                raise StackError(problem)
            if "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE" in self.conf.config:
                msg = (
                    f"refusing to serve Airflow on {host or 'every interface'} (not loopback) with "
                    f"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE in {env_var('airflow.config')}: the passwords "
                    f"in that file cannot be checked; set {env_var('airflow.admin_password')} instead."
                )
                raise StackError(msg)
            all_admins = self.airflow_env().get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "")
            if all_admins.strip().lower() in {"true", "1", "t", "yes", "on"}:
                msg = (
                    f"refusing to serve Airflow on {host or 'every interface'} (not loopback) with "
                    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS set: it lets everyone in as admin."
                )
                raise StackError(msg)
        if not self.dags_folder.is_dir():
            msg = f"the DAGs folder {self.dags_folder} does not exist ({env_var('airflow.dags_folder')})."
            raise StackError(msg)

    def check_driver(self) -> None:
        """Name the missing database driver instead of letting every component die on its import."""
        scheme = self.database_url.partition("://")[0]
        dialect, _, driver = scheme.partition("+")
        defaults = {"postgresql": "psycopg2", "mysql": "MySQLdb"}
        if dialect not in defaults:
            return
        module = {"psycopg2": "psycopg2", "psycopg": "psycopg", "mysqldb": "MySQLdb"}.get(driver, driver)
        module = module or defaults[dialect]
        if importlib.util.find_spec(module) is None:
            msg = (
                f"the metadata DB URL needs the Python module {module!r}, which is not installed in this venv "
                "(for PostgreSQL: the psycopg2-binary package). Install it, or unset "
                f"{env_var('airflow.database_url')} "
                "to use SQLite."
            )
            raise StackError(msg)

    def login_hint(self) -> str:
        """Return how to log in to the UI (the password itself only when it is the documented default)."""
        password = self.conf.admin_password.get_secret_value()
        shown = password if password == LOCAL_ADMIN_PASSWORD else f"the value of {env_var('airflow.admin_password')}"
        return f"UI {self.url}  login {self.conf.admin_user} / {shown}"

    def cli(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """Run ``airflow <args>`` against this instance (its environment and metadata DB)."""
        return subprocess.run(  # noqa: S603 - the venv's airflow with our arguments
            [str(airflow_executable()), *args],
            env=self.process_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def client(self) -> AirflowClient:
        """Return a REST client of this instance whose errors end with the tail of its logs."""
        return AirflowClient(self.settings, diagnostics=lambda: tail(self.log_files()))

    def backfill(
        self,
        dag_id: str,
        first: datetime,
        last: datetime,
        *extra: str,
        max_active_runs: int = 2,
        retry_s: float = 600,
    ) -> None:
        """Unpause the DAG and create a scheduler-driven backfill (``airflow backfill create``).

        The runs are those whose data intervals start in ``[first, last]``; ``extra`` e.g.
        ``--reprocess-behavior completed``. A backfill's runs are bounded by its own ``--max-active-runs`` (Airflow
        3 does not apply the DAG's to them), so it is passed explicitly. Airflow allows one unfinished backfill per
        DAG: while the previous one is being marked complete (or SQLite reports a lock), the creation is retried for up
        to ``retry_s``.

        :raises StackError: the CLI refused for another reason, or for longer than ``retry_s``.
        """
        unpause = self.cli("dags", "unpause", dag_id)
        if unpause.returncode != 0:
            msg = f"airflow dags unpause {dag_id} failed: {(unpause.stdout + unpause.stderr)[-2000:]}"
            raise StackError(msg)
        args = ["backfill", "create", "--dag-id", dag_id, "--from-date", first.isoformat()]
        args += ["--to-date", last.isoformat(), "--max-active-runs", str(max_active_runs), *extra]
        deadline = time.monotonic() + retry_s
        reasons: list[str] = []
        while True:
            proc = self.cli(*args)
            if proc.returncode == 0:
                return
            out = proc.stdout + proc.stderr
            # Retried: the refusal while the previous backfill is being completed, and a lock error of SQLite
            # (SQLITE_BUSY on a lock upgrade does not wait for the busy timeout) — on that one Airflow deletes the
            # half-created backfill and its runs itself (models.backfill._cleanup_partial_backfill; when that delete
            # fails too, the scheduler closes the empty backfill after 2 minutes and the retries see it running
            # until then). Anything else may have left runs behind: not retried.
            transient = next((t for t in ("AlreadyRunningBackfill", "database is locked") if t in out), None)
            if transient is None or time.monotonic() > deadline:
                msg = f"airflow backfill create failed (earlier attempts: {reasons or 'none'}): {out[-2000:]}"
                raise StackError(msg)
            reasons.append(transient)
            logger.warning("backfill of %s not created yet (%s); retrying", dag_id, transient)
            time.sleep(5)


def _why_unreadable(exc: Exception) -> str:
    """Describe why a config file did not parse without quoting it (its lines hold keys and passwords)."""
    if isinstance(exc, OSError):
        return f"{type(exc).__name__} ({exc.strerror or exc})"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 at byte {exc.start}"
    lines = {n for n, _ in getattr(exc, "errors", [])}  # ParsingError: (line number, line) pairs
    if isinstance(getattr(exc, "lineno", None), int):
        lines.add(exc.lineno)  # type: ignore[attr-defined]
    where = f" at line {', '.join(map(str, sorted(lines)))}" if lines else ""
    return f"{type(exc).__name__}{where}"
