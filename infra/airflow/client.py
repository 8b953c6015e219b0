"""A client of the local Airflow: log in, trigger a DAG, wait for runs (the REST API), and create backfills.

Backfills go through the ``airflow`` CLI (``airflow backfill create``), whose refusals are told apart by their output.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from infra.airflow.config import AirflowConfig
from infra.errors import StackError
from infra.process import tail
from infra.settings import Settings

logger = logging.getLogger(__name__)

TOKEN_PATH = "/auth/token"  # noqa: S105 - a URL path, not a password


class AirflowClient:
    """Operate the Airflow of these settings through its REST API (as the admin) and its CLI."""

    def __init__(self, settings: Settings) -> None:
        self.config = AirflowConfig(settings)
        self.url = self.config.url

    def token(self, user: str | None = None, password: str | None = None) -> str:
        """Log in to the REST API (``POST /auth/token``) and return the JWT.

        :raises StackError: when the login is refused or the API does not answer.
        """
        body = json.dumps(
            {
                "username": user or self.config.conf.admin_user,
                "password": password or self.config.conf.admin_password.get_secret_value(),
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
            msg = f"logging in to Airflow at {self.url} as {user or self.config.conf.admin_user} failed: {exc} {detail}"
            raise StackError(msg) from exc

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
                msg = f"DAG {dag_id} not parsed within {timeout_s:.0f} s:\n{tail(self.config.log_files())}"
                raise StackError(msg)
            time.sleep(2)

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
                msg = f"{dag_id} run {run_id} failed\n{tail(self.config.log_files())}"
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
                msg = f"{dag_id} runs failed: {', '.join(failed)}\n{tail(self.config.log_files())}"
                raise StackError(msg)
            if len({datetime.fromisoformat(r["data_interval_start"]) for r in mine}) == len(wanted) and all(
                v == "success" for v in states.values()
            ):
                return states
            time.sleep(3)
        msg = f"{dag_id} runs not done within {timeout_s:.0f} s: {states}"
        raise StackError(msg)

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
        unpause = self.config.cli("dags", "unpause", dag_id)
        if unpause.returncode != 0:
            msg = f"airflow dags unpause {dag_id} failed: {(unpause.stdout + unpause.stderr)[-2000:]}"
            raise StackError(msg)
        args = ["backfill", "create", "--dag-id", dag_id, "--from-date", first.isoformat()]
        args += ["--to-date", last.isoformat(), "--max-active-runs", str(max_active_runs), *extra]
        deadline = time.monotonic() + retry_s
        reasons: list[str] = []
        while True:
            proc = self.config.cli(*args)
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
