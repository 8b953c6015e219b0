"""A client of Airflow's REST API: log in, trigger a DAG, follow runs. It reads only the ``airflow`` settings.

The REST API is the local stack's unless ``airflow.api_url`` points at a deployment. Calls authenticate with a JWT:
``airflow.api_token`` as given (any auth manager), or one from the auth manager's token endpoint
(``POST /auth/token`` with a user and password: SimpleAuthManager's, which the local stack runs; FAB's has the same
shape).
"""

from __future__ import annotations

import functools
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

from infra.errors import AirflowError
from infra.settings import Settings
from infra.settings_env import env_var

logger = logging.getLogger(__name__)

TOKEN_PATH = "/auth/token"  # noqa: S105 - a URL path, not a password
API = "/api/v2"  # the REST API's paths, built here only (the exporter, the console and the backfill use these)
API_TIMEOUT_S = 30


def _q(part: str) -> str:
    return urllib.parse.quote(part, safe="")  # "~" (every DAG, every run) is never quoted


def _query(params: dict[str, Any]) -> str:
    return f"?{urllib.parse.urlencode(params)}" if params else ""


def dags_path(**params: Any) -> str:
    """Return the path of the DAG list (``limit``…)."""
    return f"{API}/dags{_query(params)}"


def dag_path(dag_id: str) -> str:
    """Return the path of one DAG."""
    return f"{API}/dags/{_q(dag_id)}"


def runs_path(dag_id: str, **params: Any) -> str:
    """Return the path of a DAG's runs (``state``, ``order_by``, ``limit``…; ``~`` for every DAG)."""
    return f"{dag_path(dag_id)}/dagRuns{_query(params)}"


def run_path(dag_id: str, run_id: str) -> str:
    """Return the path of one run (``~`` for every run)."""
    return f"{runs_path(dag_id)}/{_q(run_id)}"


def ui_run_path(dag_id: str, run_id: str) -> str:
    """Return the path of a run's page in Airflow's web UI (not the REST API), for an operator to open."""
    return f"/dags/{_q(dag_id)}/runs/{_q(run_id)}"


def task_instances_path(dag_id: str, run_id: str, **params: Any) -> str:
    """Return the path of a run's task instances (``~`` for every run; ``state``, ``limit``, ``offset``…)."""
    return f"{run_path(dag_id, run_id)}/taskInstances{_query(params)}"


class AirflowAPIError(AirflowError):
    """The REST API answered an error, or did not answer (``status`` None)."""

    def __init__(self, message: str, status: int | None) -> None:
        super().__init__(message)
        self.status = status


class AirflowClient:
    """Operate the Airflow of these settings through its REST API and (for the local stack) its CLI."""

    def __init__(self, settings: Settings, *, diagnostics: Callable[[], str] | None = None) -> None:
        """:arg diagnostics: what to add to the error of a failed run or an unparsed DAG (the local stack's logs)."""
        self.conf = settings.airflow
        self.url = self.conf.base_url
        self._diagnostics = diagnostics
        self._bearer: str | None = None

    def _details(self) -> str:
        return f"\n{self._diagnostics()}" if self._diagnostics is not None else ""

    def token(self, user: str | None = None, password: str | None = None) -> str:
        """Log in to the REST API (``POST /auth/token``) and return the JWT.

        :raises AirflowError: when the login is refused or the API does not answer.
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
            status = exc.code if isinstance(exc, urllib.error.HTTPError) else None
            detail = exc.read().decode(errors="replace")[:300] if isinstance(exc, urllib.error.HTTPError) else ""
            msg = f"logging in to Airflow at {self.url} as {user or self.conf.admin_user} failed: {exc} {detail}"
            if status in {401, 403}:
                msg += (
                    f" (check {env_var('airflow.api_user')} / {env_var('airflow.api_password')}, "
                    f"or set {env_var('airflow.api_token')})"
                )
            elif status in {404, 405}:
                msg += (
                    f" (this Airflow's auth manager has no {TOKEN_PATH} login endpoint: set "
                    f"{env_var('airflow.api_token')} "
                    "to a token it issued)"
                )
            raise AirflowAPIError(msg, status) from exc

    def bearer(self, *, renew: bool = False) -> str:
        """Return the token REST calls send: ``airflow.api_token`` as is, else a login (cached; ``renew`` logs in).

        The login is ``airflow.api_user`` / ``airflow.api_password``, defaulting to the local stack's admin.
        """
        conf = self.conf
        if conf.api_token is not None:
            return conf.api_token.get_secret_value()
        if self._bearer is None or renew:
            password = conf.api_password if conf.api_password is not None else conf.admin_password
            self._bearer = self.token(conf.api_user or conf.admin_user, password.get_secret_value())
        return self._bearer

    def send(self, method: str, path: str, body: Any = None, *, token: str, accept: str = "application/json") -> Any:
        """Make one REST call with ``token`` and return the decoded JSON (None for an empty answer).

        :raises AirflowAPIError: an HTTP error (with its status and Airflow's detail), or no answer.
        """
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {token}", "Accept": accept}
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=API_TIMEOUT_S) as resp:  # noqa: S310 - the configured API
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:1000]
            msg = f"Airflow answered {exc.code} to {method} {path}: {detail}"
            raise AirflowAPIError(msg, exc.code) from exc
        except OSError as exc:  # refused, reset, timed out, DNS
            msg = f"Airflow's REST API at {self.url} did not answer {method} {path}: {exc}"
            raise AirflowAPIError(msg, None) from exc
        return json.loads(raw) if raw.strip() else None

    def api(self, method: str, path: str, body: Any = None, *, accept: str = "application/json") -> Any:
        """Make a REST call as :meth:`bearer`; a refused login token is renewed once (it expired during a wait).

        :raises AirflowAPIError: as :meth:`send`; a refused ``airflow.api_token`` names the setting.
        """
        static = self.conf.api_token is not None
        try:
            return self.send(method, path, body, token=self.bearer(), accept=accept)
        except AirflowAPIError as exc:
            # Airflow 3: 401 "Token Expired", 403 "Invalid JWT token" (not its signature), 403 "Forbidden" (no right)
            invalid = exc.status == 401 or (exc.status == 403 and "Invalid JWT" in str(exc))
            if static and invalid:
                msg = (
                    f"Airflow at {self.url} refused the token of {env_var('airflow.api_token')} ({exc.status}: "
                    f"expired, or not issued by this Airflow's auth manager): {exc}"
                )
                raise AirflowAPIError(msg, exc.status) from exc
            if exc.status == 403 and not invalid:
                msg = f"{exc} (the user lacks a permission: it reads and triggers DAG runs, reads their tasks and logs)"
                raise AirflowAPIError(msg, 403) from exc
            if exc.status != 401:
                raise
        logger.info("Airflow refused the token (expired?); logging in again")
        return self.send(method, path, body, token=self.bearer(renew=True), accept=accept)

    def get(self, token: str, path: str) -> Any:
        """GET a REST API path (``/api/v2/…``) and return the decoded JSON."""
        request = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {token}"})  # noqa: S310
        with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 - http://host:port of our API server
            return json.load(resp)

    def wait_dag(self, token: str, dag_id: str, timeout_s: float = 120) -> None:
        """Wait until the DAG processor has parsed ``dag_id``.

        :raises AirflowError: not parsed in time (with the DAG processor's log tail).
        """
        deadline = time.monotonic() + timeout_s
        while dag_id not in {d["dag_id"] for d in self.get(token, dags_path(limit=1000))["dags"]}:
            if time.monotonic() > deadline:
                msg = f"DAG {dag_id} not parsed within {timeout_s:.0f} s{self._details()}"
                raise AirflowError(msg)
            time.sleep(2)

    def trigger(self, token: str | None, dag_id: str, conf: dict[str, Any]) -> str:
        """Unpause the DAG and trigger a run with ``conf`` (``POST /api/v2/dags/{id}/dagRuns``); return its run id.

        :arg token: a JWT, or None for :meth:`bearer` (renewed once if refused).
        :raises AirflowAPIError: the API refused (with its answer; 404: the DAG is not parsed, or another folder).
        """
        call = self.api if token is None else functools.partial(self.send, token=token)
        run_id = f"manual__{datetime.now(UTC):%Y%m%dT%H%M%S}_{uuid.uuid4().hex[:6]}"
        try:
            call("PATCH", dag_path(dag_id), {"is_paused": False})
        except AirflowAPIError as exc:
            if exc.status == 404:
                msg = (
                    f"Airflow at {self.url} does not know the DAG {dag_id} (not parsed yet, or its DAGs folder is "
                    f"another; `airflow dags list-import-errors` shows parse errors): {exc}"
                )
                raise AirflowAPIError(msg, 404) from exc
            raise
        call("POST", runs_path(dag_id), {"dag_run_id": run_id, "logical_date": None, "conf": conf})
        return run_id

    # -- one run, as the REST API shows it ------------------------------------------------------------------
    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        """Return a DAG run (``state``, ``conf``, ``start_date``, ``end_date``, …)."""
        return dict(self.api("GET", run_path(dag_id, run_id)))

    def task_instances(self, dag_id: str, run_id: str, page: int = 100) -> list[dict[str, Any]]:
        """Return every task instance of a run, each mapped instance separately (``map_index`` >= 0)."""
        out: list[dict[str, Any]] = []
        while True:
            body = self.api("GET", task_instances_path(dag_id, run_id, limit=page, offset=len(out)))
            out += body["task_instances"]
            if not body["task_instances"] or len(out) >= body["total_entries"]:
                return out

    def tries(self, dag_id: str, run_id: str, task_id: str, *, map_index: int = -1) -> list[dict[str, Any]]:
        """Return every try of one task instance (``try_number``, ``state``), earlier tries included."""
        path = f"{task_instances_path(dag_id, run_id)}/{task_id}/{map_index}/tries"
        return list(self.api("GET", path)["task_instances"])

    def xcom(self, dag_id: str, run_id: str, task_id: str, *, map_index: int = -1, key: str = "return_value") -> Any:
        """Return an XCom value as stored (JSON), or None when the task has not pushed it."""
        path = f"{task_instances_path(dag_id, run_id)}/{task_id}/xcomEntries/{key}?map_index={map_index}"
        try:
            return self.api("GET", path)["value"]
        except AirflowAPIError as exc:
            if exc.status == 404:
                return None
            raise

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int, *, map_index: int = -1) -> list[str]:
        """Return the lines of one try's log (``event`` of each structured record, with its level if not info)."""
        path = (
            f"{task_instances_path(dag_id, run_id)}/{task_id}/logs/{try_number}?map_index={map_index}&full_content=true"
        )
        content = self.api("GET", path).get("content") or []
        lines: list[str] = []
        for record in content if isinstance(content, list) else [content]:
            if isinstance(record, dict):
                level = str(record.get("level") or "").lower()
                text = str(record.get("event") or "")
                lines.append(f"{level}: {text}" if level and level != "info" else text)
            else:
                lines.extend(str(record).splitlines())
        return lines

    def wait_run(
        self,
        token: str,
        dag_id: str,
        run_id: str,
        timeout_s: float = 1800,
        on_poll: Callable[[dict[str, int]], None] | None = None,
    ) -> None:
        """Wait until a run succeeded; ``on_poll`` gets its task instances' states counted.

        :raises AirflowError: the run failed, or did not finish in time.
        """
        deadline = time.monotonic() + timeout_s
        state = "?"
        while time.monotonic() < deadline:
            state = self.get(token, run_path(dag_id, run_id))["state"]
            if on_poll is not None:
                tis = self.get(token, task_instances_path(dag_id, run_id, limit=1000))
                counts: dict[str, int] = {}
                for ti in tis["task_instances"]:
                    key = f"{ti['task_id']} {ti['state'] or 'queued'}"
                    counts[key] = counts.get(key, 0) + 1
                on_poll(counts)
            if state == "success":
                return
            if state == "failed":
                msg = f"{dag_id} run {run_id} failed{self._details()}"
                raise AirflowError(msg)
            time.sleep(3)
        msg = f"{dag_id} run {run_id} not done within {timeout_s:.0f} s (state {state})"
        raise AirflowError(msg)

    def wait_runs(
        self,
        token: str,
        dag_id: str,
        starts: list[datetime],
        timeout_s: float = 600,
        on_poll: Callable[[dict[str, str]], None] | None = None,
    ) -> dict[str, str]:
        """Wait until the runs of these data-interval starts all succeeded; return run id -> state.

        :raises AirflowError: a run failed, or not all succeeded in time.
        """
        deadline = time.monotonic() + timeout_s
        wanted = set(starts)
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            runs = self.get(token, runs_path(dag_id, limit=1000))["dag_runs"]
            mine = [r for r in runs if datetime.fromisoformat(r["data_interval_start"]) in wanted]
            states = {r["dag_run_id"]: r["state"] for r in mine}
            if on_poll is not None:
                on_poll(states)
            failed = [k for k, v in states.items() if v == "failed"]
            if failed:
                msg = f"{dag_id} runs failed: {', '.join(failed)}{self._details()}"
                raise AirflowError(msg)
            if len({datetime.fromisoformat(r["data_interval_start"]) for r in mine}) == len(wanted) and all(
                v == "success" for v in states.values()
            ):
                return states
            time.sleep(3)
        msg = f"{dag_id} runs not done within {timeout_s:.0f} s: {states}"
        raise AirflowError(msg)
