"""Run Airflow 3 for the local stack: metadata DB, API server, scheduler and DAG processor, from the venv.

Why separate processes rather than ``airflow standalone``: standalone cannot pass ``--skip-serve-logs``, so its
scheduler and triggerer start log servers on ``0.0.0.0:8793``/``8794`` — off loopback, and colliding between two
instances (a test stack beside a developer's); it also rewrites the auth-manager settings and prints generated
passwords. Separate processes give each component its own pid file, process group and log, so a component that dies
is reported by name with its own log tail, ``status`` can say which one is missing, and ``up`` restarts only that.

Each component runs ``airflow <component>`` from the venv's ``bin`` (also put first on PATH, since Airflow starts
``airflow …`` subprocesses) in its own session. Its pid file holds the pid and the process start time, so a reused pid
is never taken for ours; stopping signals the group, SIGKILLs it after the timeout, then ends the task processes that
Airflow moved to groups of their own. Configuration is ``AIRFLOW__*`` variables (``trends stack airflow-env`` prints
them for the ``airflow`` CLI) plus a private ``airflow.cfg`` holding only the generated keys — the JWT secret must be
the same in every component or tasks cannot authenticate — and a PostgreSQL URL when one is set.
"""

from __future__ import annotations

import base64
import configparser
import contextlib
import importlib.util
import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from infra.errors import StackError
from infra.security import MIN_SECRET_CHARS, exposure_problem, has_userinfo, is_loopback, is_secret_key
from infra.settings import LOCAL_ADMIN_PASSWORD, Settings
from infra.stack import ServiceStatus, ensure_port_free, process_alive, reap, signal_group, tail

logger = logging.getLogger(__name__)

REPO_DAGS = Path(__file__).resolve().parent.parent / "dags"
HEALTH_PATH = "/api/v2/monitor/health"
TOKEN_PATH = "/auth/token"  # noqa: S105 - a URL path, not a password
SIMPLE_AUTH_MANAGER = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
WILDCARD = frozenset({"0.0.0.0", "::", ""})  # noqa: S104 - recognised, to reach such a server on loopback
LOG_ROTATE_BYTES = 50 * 1024 * 1024


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
COMPONENT_NAMES = tuple(c.name for c in COMPONENTS)


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


def _start_ticks(pid: int) -> str | None:
    """Return the start time of a process (clock ticks since boot), which tells a reused pid apart."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner may read (it holds keys or passwords), replacing it atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _family(pid: int) -> list[Any]:
    """Return the process and all its descendants as psutil objects (they survive pid reuse checks)."""
    import psutil  # noqa: PLC0415 - only needed when stopping or measuring

    try:
        proc = psutil.Process(pid)
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return []


class Airflow:
    """The local Airflow: same contract as :class:`infra.stack.Service`, several processes instead of one."""

    name = "airflow"
    needs_java = False

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
        """Return the address the API server really binds: ``airflow.config`` overrides ``airflow.host``."""
        return self.conf.config.get("AIRFLOW__API__HOST", self.conf.host)

    @property
    def api_port(self) -> int:
        """Return the port the API server really binds: ``airflow.config`` overrides ``airflow.api_port``."""
        value = self.conf.config.get("AIRFLOW__API__PORT", "")
        return int(value) if value.strip().isdigit() else self.conf.api_port

    @property
    def client_host(self) -> str:
        """Return the address to reach the API server at (loopback when it binds every interface)."""
        return "127.0.0.1" if self.api_host in WILDCARD else self.api_host

    @property
    def url(self) -> str:
        """Return the base URL of the UI and REST API."""
        host = f"[{self.client_host}]" if ":" in self.client_host else self.client_host
        return f"http://{host}:{self.api_port}"

    @property
    def address(self) -> str:
        """Return host:port of the API server."""
        return f"{self.client_host}:{self.api_port}"

    @property
    def dags_folder(self) -> Path:
        """Return the folder of DAG files: the setting, else the repository's ``dags/``."""
        return (self.conf.dags_folder or REPO_DAGS).expanduser().resolve()

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

    def _pid_file(self, component: Component) -> Path:
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
        _write_private(path, "".join(f"export {k}={shlex.quote(v)}\n" for k, v in secret.items()))
        return path

    @staticmethod
    def bin_dir() -> Path:
        """Return the venv's ``bin``, which must come first on PATH (Airflow runs ``airflow …`` subprocesses)."""
        return airflow_executable().parent

    def process_env(self) -> dict[str, str]:
        """Return the whole environment of Airflow's processes: ours, every setting as TRENDS_*, Airflow's own."""
        path = os.pathsep.join([str(self.bin_dir()), os.environ.get("PATH", os.defpath)])
        return {**os.environ, **self.settings.to_env(), **self.airflow_env(), "PATH": path}

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
            "# Written by infra/airflow.py at every `trends stack up airflow`; edits are lost. The keys are generated",
            "# once and kept. Every other option is an AIRFLOW__* variable: see `trends stack airflow-env`.",
        ]
        for section in ("core", "api", "api_auth"):
            lines += ["", f"[{section}]"]
            lines += [f"{k.split('.')[1]} = {v}" for k, v in keys.items() if k.startswith(f"{section}.")]
        if self.conf.database_url is not None:
            # Airflow's parser interpolates %: a URL-encoded password needs it doubled.
            lines += ["", "[database]", f"sql_alchemy_conn = {self.database_url.replace('%', '%%')}"]
        _write_private(self.cfg_file, "\n".join(lines) + "\n")
        password = self.conf.admin_password.get_secret_value()
        _write_private(self.passwords_file, json.dumps({self.conf.admin_user: password}) + "\n")
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
            where = "TRENDS_AIRFLOW__HOST" + (
                " and AIRFLOW__API__HOST in TRENDS_AIRFLOW__CONFIG" if "AIRFLOW__API__HOST" in self.conf.config else ""
            )
            if password == LOCAL_ADMIN_PASSWORD:
                msg = (
                    f"refusing to serve Airflow on {host or 'every interface'} (not loopback) with the default admin "
                    f"password: set TRENDS_AIRFLOW__ADMIN_PASSWORD (at least {MIN_SECRET_CHARS} characters), or keep "
                    f"{where} on 127.0.0.1."
                )
                raise StackError(msg)
            problem = exposure_problem(
                "Airflow", host, password, guard_var="TRENDS_AIRFLOW__ADMIN_PASSWORD", host_var=where
            )
            if problem:
                raise StackError(problem)
            if "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE" in self.conf.config:
                msg = (
                    f"refusing to serve Airflow on {host or 'every interface'} (not loopback) with "
                    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE in TRENDS_AIRFLOW__CONFIG: the passwords in "
                    "that file cannot be checked; set TRENDS_AIRFLOW__ADMIN_PASSWORD instead."
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
            msg = f"the DAGs folder {self.dags_folder} does not exist (TRENDS_AIRFLOW__DAGS_FOLDER)."
            raise StackError(msg)

    def _check_driver(self) -> None:
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
                "(for PostgreSQL: the psycopg2-binary package). Install it, or unset TRENDS_AIRFLOW__DATABASE_URL "
                "to use SQLite."
            )
            raise StackError(msg)

    # -- processes --------------------------------------------------------------------------------------------
    def component_pid(self, component: Component) -> int | None:
        """Return the pid of a running component of ours, or None (removing a stale pid file)."""
        pid_file = self._pid_file(component)
        try:
            fields = pid_file.read_text().split()
            pid, ticks = int(fields[0]), fields[1] if len(fields) > 1 else None
        except (OSError, ValueError, IndexError):
            return None
        if process_alive(pid) and (ticks is None or _start_ticks(pid) in (ticks, None)):
            return pid
        reap(pid)
        logger.debug("removing stale pid file %s (pid %s)", pid_file, pid)
        pid_file.unlink(missing_ok=True)
        return None

    def pids(self) -> dict[str, int | None]:
        """Return the pid (or None) of every component, the disabled triggerer included (it may still run)."""
        return {c.name: self.component_pid(c) for c in COMPONENTS}

    def pid(self) -> int | None:
        """Return the API server's pid when every enabled component runs, else None (``up`` then completes it)."""
        pids = self.pids()
        if all(pids[c.name] is not None for c in self.components):
            return pids[API_SERVER.name]
        return None

    def init_db(self) -> float:
        """Write the config and create or upgrade the metadata DB, without starting any component.

        Enough for ``airflow dags test`` (tasks run in-process against the DB); returns the seconds taken.
        """
        self._check_driver()
        self.home.mkdir(parents=True, exist_ok=True)
        self.render_config()
        return self.migrate(self.process_env())

    def migrate(self, env: dict[str, str]) -> float:
        """Create or upgrade the metadata DB with ``airflow db migrate`` (a no-op when current); return seconds.

        :raises StackError: when it fails or exceeds the start timeout, with the tail of its output.
        """
        log = self.log_file("migrate")
        started = time.monotonic()
        with log.open("ab") as out:
            out.write(f"\n=== airflow db migrate {datetime.now(UTC).isoformat(timespec='seconds')} ===\n".encode())
            out.flush()
            try:
                proc = subprocess.run(  # noqa: S603 - our own command line
                    [str(airflow_executable()), "db", "migrate"],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=self.home,
                    env=env,
                    timeout=self.conf.start_timeout_s,
                    check=False,
                )
            except subprocess.TimeoutExpired as exc:
                msg = f"airflow db migrate did not finish within {self.conf.start_timeout_s:.0f} s.\n{tail([log])}"
                raise StackError(msg) from exc
        if proc.returncode != 0:
            msg = f"airflow db migrate failed (exit {proc.returncode}).\n{tail([log])}"
            raise StackError(msg)
        return time.monotonic() - started

    def _launch(self, component: Component, env: dict[str, str]) -> int:
        log = self.log_file(component.name)
        if log.exists() and log.stat().st_size > LOG_ROTATE_BYTES:
            log.replace(log.with_suffix(".log.1"))
        cmd = [str(airflow_executable()), *component.args]
        logger.info("starting airflow %s", component.name)
        with log.open("ab") as out:
            out.write(f"\n=== start {datetime.now(UTC).isoformat(timespec='seconds')} ===\n".encode())
            out.flush()
            proc = subprocess.Popen(  # noqa: S603 - our own command line
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                env=env,
                start_new_session=True,
            )
        self._pid_file(component).write_text(f"{proc.pid} {_start_ticks(proc.pid) or ''}\n")
        return proc.pid

    def start(self, java: str) -> int:
        """Migrate the metadata DB and launch the components that are not running; return the API server's pid.

        Does not wait for readiness (see :meth:`wait_ready`). ``java`` is part of the stack's contract, unused here.

        :raises StackError: on an unsafe or impossible configuration, a taken port or a failed migration.
        """
        pids = self.pids()
        if all(pids[c.name] is not None for c in self.components):
            logger.info("airflow already running (api-server pid %s)", pids[API_SERVER.name])
            return int(pids[API_SERVER.name] or 0)
        self.check_safe()
        if pids[API_SERVER.name] is None:
            ensure_port_free(self.api_host, self.api_port, "airflow (API server)", "TRENDS_AIRFLOW__API_PORT")
        env = self.process_env()
        seconds = self.init_db()
        logger.info("airflow metadata DB ready in %.1f s", seconds)
        for component in self.components:
            if pids[component.name] is None:
                pids[component.name] = self._launch(component, env)
        return int(pids[API_SERVER.name] or 0)

    # -- readiness --------------------------------------------------------------------------------------------
    def health(self) -> dict[str, Any] | None:
        """Return the API server's health document, or None while it does not answer."""
        try:
            with urllib.request.urlopen(self.url + HEALTH_PATH, timeout=3) as resp:  # noqa: S310 - http://host:port
                body = json.load(resp)
        except (OSError, ValueError):
            return None
        return body if isinstance(body, dict) else None

    def _healthy(self, health: dict[str, Any] | None) -> bool:
        """Tell whether every running component reports healthy, with a heartbeat from after its own start."""
        if not health:
            return False
        for component in self.components:
            entry = health.get(component.health_key) or {}
            if entry.get("status") != "healthy":
                return False
            beat = entry.get(f"latest_{component.health_key}_heartbeat")
            if beat:  # an old heartbeat (a previous run) must not pass for the new process
                with contextlib.suppress(OSError, ValueError):
                    launched = self._pid_file(component).stat().st_mtime
                    if datetime.fromisoformat(beat).timestamp() < launched - 1:
                        return False
        return True

    def is_ready(self) -> bool:
        """Tell whether the API answers health with the DB, scheduler and DAG processor healthy."""
        return self._healthy(self.health())

    def token(self, user: str | None = None, password: str | None = None) -> str:
        """Log in to the REST API (``POST /auth/token``) and return the JWT.

        :raises StackError: when the login is refused or the API does not answer.
        """
        body = json.dumps(
            {
                "username": user or self.conf.admin_user,
                "password": password or self.conf.admin_password.get_secret_value(),
            }
        ).encode()
        request = urllib.request.Request(  # noqa: S310 - http://host:port of our API server
            self.url + TOKEN_PATH, data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310
                return str(json.load(resp)["access_token"])
        except (OSError, ValueError, KeyError) as exc:
            detail = exc.read().decode(errors="replace")[:300] if isinstance(exc, urllib.error.HTTPError) else ""
            msg = f"logging in to Airflow at {self.url} as {user or self.conf.admin_user} failed: {exc} {detail}"
            raise StackError(msg) from exc

    def wait_ready(self, pid: int) -> float:
        """Wait until the API reports every component healthy and the admin can log in; return the seconds.

        Every component is watched, not only ``pid`` (the API server's).

        :raises StackError: when a component dies or the wait times out (Airflow is then stopped).
        """
        started = time.monotonic()
        deadline = started + self.conf.start_timeout_s
        health: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            for component in self.components:
                if self.component_pid(component) is None:
                    logs = tail([self.log_file(component.name)])
                    self.stop()
                    msg = f"airflow {component.name} exited during start-up; stopped Airflow.\n{logs}"
                    raise StackError(msg)
            health = self.health()
            if self._healthy(health):
                self.token()
                return time.monotonic() - started
            time.sleep(0.5)
        logs = tail(self.log_files())
        self.stop()
        msg = (
            f"airflow did not report healthy at {self.url}{HEALTH_PATH} within {self.conf.start_timeout_s:.0f} s "
            f"(last answer: {json.dumps(health) if health else 'none'}); stopped it.\n{logs}"
        )
        raise StackError(msg)

    # -- stop, status, reset ----------------------------------------------------------------------------------
    def stop(self) -> bool:
        """Stop every component: the scheduler and the others first, the API server last; return whether any ran.

        Tasks still running report to the API server, so it goes last. Each group gets SIGTERM, then SIGKILL after
        ``stack.stop_timeout_s``; task processes that Airflow moved to groups of their own are ended after.
        """
        running = {c.name: pid for c in COMPONENTS if (pid := self.component_pid(c)) is not None}
        if not running:
            return False
        logger.info("stopping airflow (%s)", ", ".join(f"{n} pid {p}" for n, p in running.items()))
        first = {n: p for n, p in running.items() if n != API_SERVER.name}
        for phase in (first, {n: p for n, p in running.items() if n == API_SERVER.name}):
            if phase:
                self._stop_group(phase)
        for component in COMPONENTS:
            self._pid_file(component).unlink(missing_ok=True)
        return True

    def _stop_group(self, pids: dict[str, int]) -> None:
        family = [proc for pid in pids.values() for proc in _family(pid)]
        for pid in pids.values():
            signal_group(pid, signal.SIGTERM)
        timeout = self.settings.stack.stop_timeout_s
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(process_alive(p) for p in pids.values()):
            time.sleep(0.2)
            for pid in pids.values():
                reap(pid)
        stubborn = [name for name, pid in pids.items() if process_alive(pid)]
        if stubborn:
            logger.warning("airflow %s ignored SIGTERM for %.0f s; killing", ", ".join(stubborn), timeout)
            for name in stubborn:
                signal_group(pids[name], signal.SIGKILL)
        _end_leftovers([proc for proc in family if _still_running(proc)])
        kill_deadline = time.monotonic() + 10
        while time.monotonic() < kill_deadline and any(process_alive(p) for p in pids.values()):
            time.sleep(0.1)
            for pid in pids.values():
                reap(pid)

    def rss_mib(self) -> float | None:
        """Return the resident memory of every running component and its children (workers, tasks), in MiB."""
        total = 0
        for pid in self.pids().values():
            if pid is not None:
                for proc in _family(pid):
                    with contextlib.suppress(Exception):
                        total += proc.memory_info().rss
        return total / 2**20 if total else None

    def status(self) -> ServiceStatus:
        """Return Airflow's state; ``detail`` names components that are not running, or how to log in."""
        pids = self.pids()
        missing = [c.name for c in self.components if pids[c.name] is None]
        running = [p for p in pids.values() if p is not None]
        main = pids[API_SERVER.name] or (running[0] if running else None)
        ready = main is not None and not missing and self.is_ready()
        if main is None:
            detail = ""
        elif missing:
            detail = f"not running: {', '.join(missing)} (`trends stack up airflow` restarts them)"
        else:
            detail = f"UI {self.url}"
        return ServiceStatus(
            name=self.name,
            pid=main,
            ready=ready,
            address=self.address,
            rss_mib=self.rss_mib() if running else None,
            data_dir=self.home,
            log_file=self.main_log,
            detail=detail,
        )

    def data_paths(self) -> list[Path]:
        """Return what ``reset airflow`` deletes: the SQLite metadata DB and the task logs that describe its runs.

        A configured database URL is never dropped from here.
        """
        if self.conf.database_url is not None:
            logger.warning(
                "the metadata DB at TRENDS_AIRFLOW__DATABASE_URL is left alone; to wipe it run "
                "`airflow db reset` with the environment of `trends stack airflow-env`"
            )
            return []
        return [self.data_dir]

    def login_hint(self) -> str:
        """Return how to log in to the UI (the password itself only when it is the documented default)."""
        password = self.conf.admin_password.get_secret_value()
        shown = password if password == LOCAL_ADMIN_PASSWORD else "the value of TRENDS_AIRFLOW__ADMIN_PASSWORD"
        return f"UI {self.url}  login {self.conf.admin_user} / {shown}"

    # -- operating it ---------------------------------------------------------------------------------------
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

    def get(self, token: str, path: str) -> Any:
        """GET a REST API path (``/api/v2/…``) and return the decoded JSON."""
        request = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {token}"})  # noqa: S310
        with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 - http://host:port of our API server
            return json.load(resp)

    def wait_dag(self, token: str, dag_id: str, timeout_s: float = 120) -> None:
        """Wait until the DAG processor has parsed ``dag_id``.

        :raises StackError: not parsed in time (with the DAG processor's log tail).
        """
        deadline = time.monotonic() + timeout_s
        while dag_id not in {d["dag_id"] for d in self.get(token, "/api/v2/dags?limit=1000")["dags"]}:
            if time.monotonic() > deadline:
                msg = f"DAG {dag_id} not parsed within {timeout_s:.0f} s:\n{tail(self.log_files())}"
                raise StackError(msg)
            time.sleep(2)

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
            # half-created backfill and its runs itself (models.backfill._cleanup_partial_backfill). Anything
            # else may have left runs behind: not retried.
            transient = next((t for t in ("AlreadyRunningBackfill", "database is locked") if t in out), None)
            if transient is None or time.monotonic() > deadline:
                msg = f"airflow backfill create failed (earlier attempts: {reasons or 'none'}): {out[-2000:]}"
                raise StackError(msg)
            reasons.append(transient)
            logger.warning("backfill of %s not created yet (%s); retrying", dag_id, transient)
            time.sleep(5)

    def trigger(self, token: str, dag_id: str, conf: dict[str, Any]) -> str:
        """Unpause the DAG and trigger a run with ``conf`` (``POST /api/v2/dags/{id}/dagRuns``); return its run id.

        :raises StackError: the API refused (with its answer).
        """
        run_id = f"manual__{datetime.now(UTC):%Y%m%dT%H%M%S}_{uuid.uuid4().hex[:6]}"
        for method, path, body in (
            ("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False}),
            ("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"dag_run_id": run_id, "logical_date": None, "conf": conf}),
        ):
            request = urllib.request.Request(  # noqa: S310 - http://host:port of our API server
                self.url + path,
                data=json.dumps(body).encode(),
                method=method,
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=30):  # noqa: S310
                    pass
            except urllib.error.HTTPError as exc:
                msg = f"{method} {path} answered {exc.code}: {exc.read()[:2000]!r}"
                raise StackError(msg) from exc
        return run_id

    def wait_run(
        self,
        token: str,
        dag_id: str,
        run_id: str,
        timeout_s: float = 1800,
        on_poll: Callable[[dict[str, int]], None] | None = None,
    ) -> None:
        """Wait until a run succeeded; ``on_poll`` gets its task instances' states counted.

        :raises StackError: the run failed, or did not finish in time.
        """
        deadline = time.monotonic() + timeout_s
        quoted = urllib.parse.quote(run_id, safe="")
        state = "?"
        while time.monotonic() < deadline:
            state = self.get(token, f"/api/v2/dags/{dag_id}/dagRuns/{quoted}")["state"]
            if on_poll is not None:
                tis = self.get(token, f"/api/v2/dags/{dag_id}/dagRuns/{quoted}/taskInstances?limit=1000")
                counts: dict[str, int] = {}
                for ti in tis["task_instances"]:
                    key = f"{ti['task_id']} {ti['state'] or 'queued'}"
                    counts[key] = counts.get(key, 0) + 1
                on_poll(counts)
            if state == "success":
                return
            if state == "failed":
                msg = f"{dag_id} run {run_id} failed\n{tail(self.log_files())}"
                raise StackError(msg)
            time.sleep(3)
        msg = f"{dag_id} run {run_id} not done within {timeout_s:.0f} s (state {state})"
        raise StackError(msg)

    def wait_runs(
        self,
        token: str,
        dag_id: str,
        starts: list[datetime],
        timeout_s: float = 600,
        on_poll: Callable[[dict[str, str]], None] | None = None,
    ) -> dict[str, str]:
        """Wait until the runs of these data-interval starts all succeeded; return run id -> state.

        :raises StackError: a run failed, or not all succeeded in time.
        """
        deadline = time.monotonic() + timeout_s
        wanted = set(starts)
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            runs = self.get(token, f"/api/v2/dags/{dag_id}/dagRuns?limit=1000")["dag_runs"]
            mine = [r for r in runs if datetime.fromisoformat(r["data_interval_start"]) in wanted]
            states = {r["dag_run_id"]: r["state"] for r in mine}
            if on_poll is not None:
                on_poll(states)
            failed = [k for k, v in states.items() if v == "failed"]
            if failed:
                msg = f"{dag_id} runs failed: {', '.join(failed)}\n{tail(self.log_files())}"
                raise StackError(msg)
            if len({datetime.fromisoformat(r["data_interval_start"]) for r in mine}) == len(wanted) and all(
                v == "success" for v in states.values()
            ):
                return states
            time.sleep(3)
        msg = f"{dag_id} runs not done within {timeout_s:.0f} s: {states}"
        raise StackError(msg)


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


def _end_leftovers(procs: list[Any]) -> None:
    """End task processes that outlived their component (Airflow gives each task its own process group)."""
    if not procs:
        return
    import psutil  # noqa: PLC0415

    logger.warning("ending %s airflow task process(es) left behind", len(procs))
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=5)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()


def _still_running(proc: Any) -> bool:
    try:
        return bool(proc.is_running()) and proc.status() != "zombie"
    except Exception:  # noqa: BLE001 - gone or not ours to inspect: nothing to end
        return False
