"""Run Airflow 3 for the local stack: metadata DB, API server, scheduler and DAG processor, from the venv.

Why separate processes rather than ``airflow standalone``: standalone cannot pass ``--skip-serve-logs``, so its
scheduler and triggerer start log servers on ``0.0.0.0:8793``/``8794`` — off loopback, and colliding between two
instances (a test stack beside a developer's); it also rewrites the auth-manager settings and prints generated
passwords. Separate processes give each component its own pid file, process group and log, so a component that dies
is reported by name with its own log tail, ``status`` can say which one is missing, and ``up`` restarts only that.

Each component runs ``airflow <component>`` from the venv's ``bin`` (also put first on PATH, since Airflow starts
``airflow …`` subprocesses) in its own session. Its pid file holds the pid and the process start time, so a reused pid
is never taken for ours; stopping signals the group, SIGKILLs it after the timeout, then ends the task processes that
Airflow moved to groups of their own. The configuration is :mod:`stack.airflow.config`'s.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from infra.airflow.client import AirflowClient
from infra.errors import StackError
from infra.settings_env import env_var
from stack.airflow.config import API_SERVER, COMPONENTS, AirflowConfig, Component, airflow_executable
from stack.process import PidFile, ensure_port_free, family_rss_mib, launch, stop_groups, tail
from stack.services.base import ServiceStatus

logger = logging.getLogger(__name__)

HEALTH_PATH = "/api/v2/monitor/health"
LOG_ROTATE_BYTES = 50 * 1024 * 1024


class Airflow(AirflowConfig):
    """The local Airflow as a server of the stack: the contract of ``Service``, several processes instead of one."""

    needs_java = False

    # -- processes --------------------------------------------------------------------------------------------
    def component_pid(self, component: Component) -> int | None:
        """Return the pid of a running component of ours, or None (removing a stale pid file)."""
        return PidFile(self.pid_file(component)).running()

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
        self.check_driver()
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
        logger.info("starting airflow %s", component.name)
        pid = launch([str(airflow_executable()), *component.args], log, cwd=self.home, env=env)
        PidFile(self.pid_file(component)).write(pid)
        return pid

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
            ensure_port_free(self.api_host, self.api_port, "airflow (API server)", env_var("airflow.api_port"))
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
                    launched = PidFile(self.pid_file(component)).mtime()
                    if datetime.fromisoformat(beat).timestamp() < launched - 1:
                        return False
        return True

    def is_ready(self) -> bool:
        """Tell whether the API answers health with the DB, scheduler and DAG processor healthy."""
        return self._healthy(self.health())

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
                AirflowClient(self.settings).token()  # the admin can log in
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
        timeout = self.settings.stack.stop_timeout_s
        for phase in (first, {n: p for n, p in running.items() if n == API_SERVER.name}):
            stop_groups({f"airflow {n}": p for n, p in phase.items()}, timeout, end_leftovers=True)
        for component in COMPONENTS:
            PidFile(self.pid_file(component)).remove()
        return True

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
            rss_mib=family_rss_mib(running) if running else None,
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
                "the metadata DB at %s is left alone; to wipe it run "
                "`airflow db reset` with the environment of `trends stack airflow-env`",
                env_var("airflow.database_url"),
            )
            return []
        return [self.data_dir]
