"""The pipeline's long-running ``trends`` commands (the streaming job, the API) run in the background like servers.

They are started as commands (``trends speed run``, ``trends serve``), never imported: infra stays below the layers.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from typing_extensions import override

from infra.errors import StackError
from infra.security import exposure_problem
from infra.settings import SECRETS_DIR_ENV
from infra.settings_env import env_var, secret_vars, to_env
from infra.speed_checkpoint import checkpoint_state
from stack.process import child_env, http_ok, write_private
from stack.services.base import LoopbackProcess, ServiceStatus
from stack.supervisor import SupervisorState


class PipelineService(LoopbackProcess):
    """A long-running ``trends`` command of the pipeline (the streaming job, the API), run like the servers.

    Its environment is the stack's settings as ``TRENDS_*`` variables, so it reads exactly what the stack was
    started with (``conf/settings.env`` keeps a private copy for the operator to read), without secrets: those of
    the services it talks to (``secret_sections``) are files in its own ``secrets`` folder (``TRENDS_SECRETS_DIR``).
    """

    needs_java = False
    bundle = None
    args: tuple[str, ...] = ()
    secret_sections: tuple[str, ...] = ()

    @property
    def secrets_dir(self) -> Path:
        """Return the private folder of the secrets this process is given."""
        return self.home / "secrets"

    @override
    def render_config(self) -> Path:
        env = self.home / "conf" / "settings.env"
        secret = secret_vars(self.settings)
        settings_env = {k: v for k, v in to_env(self.settings).items() if k not in secret}
        settings_env[SECRETS_DIR_ENV] = str(self.secrets_dir)
        write_private(env, "".join(f"{k}={v}\n" for k, v in sorted(settings_env.items())))
        return env

    @override
    def command(self, java: str, config: Path) -> list[str]:
        return [str(Path(sys.executable).parent / "trends"), *self.args]

    @override
    def is_ours(self, argv: list[str]) -> bool:
        return self.command("", self.home)[0] in argv and all(a in argv for a in self.args)

    @override
    def process_env(self) -> dict[str, str]:
        return child_env(self.settings, self.secret_sections, self.secrets_dir)

    @override
    def data_paths(self) -> list[Path]:
        return []


class SpeedService(PipelineService):
    """``trends speed run`` in the background, under :mod:`stack.supervisor`: ready once its /metrics answers.

    A run that exits non-zero (a write error, Cassandra down, a crash) is restarted with exponential back-off
    (``stack.speed_restart_*``); ``status`` shows the restarts, and the job exports them as a metric. ``status``
    also says whether the job has a checkpoint, and where it starts without one (``speed.from_watermark``).
    """

    name = "speed"
    args: tuple[str, ...] = ("speed", "run")
    secret_sections = ("kafka", "cassandra")

    @property
    def state_file(self) -> Path:
        """Return the supervisor's state file (restarts, last exit)."""
        return self.home / "supervisor.json"

    @override
    def command(self, java: str, config: Path) -> list[str]:
        st = self.settings.stack
        return [
            sys.executable, "-m", "stack.supervisor", "--state", str(self.state_file),
            "--backoff", str(st.speed_restart_backoff_s), "--backoff-max", str(st.speed_restart_backoff_max_s),
            "--healthy-after", str(st.speed_restart_healthy_s),
            "--", *super().command(java, config),
        ]  # fmt: skip

    @override
    def is_ours(self, argv: list[str]) -> bool:
        return "stack.supervisor" in argv and str(self.state_file) in argv and all(a in argv for a in self.args)

    def supervisor_state(self) -> SupervisorState | None:
        """Return what the supervisor last recorded (None before the first start)."""
        return SupervisorState.read(self.state_file)

    @override
    def status(self) -> ServiceStatus:
        base = super().status()
        state = self.supervisor_state()
        checkpoint = checkpoint_state(self.settings).describe()
        if state is None or base.pid is None:
            return dataclasses.replace(base, detail=checkpoint)
        return dataclasses.replace(base, detail=f"{state.describe()}; {checkpoint}")

    @property
    @override
    def client_port(self) -> int:
        return self.settings.metrics.speed_port

    @override
    def ports(self) -> list[tuple[int, str, str]]:
        port = self.settings.metrics.speed_port
        return [(port, "metrics", env_var("metrics.speed_port"))] if port else []

    @override
    def is_ready(self) -> bool:
        if not self.client_port:  # no endpoint to ask: running is all we can tell
            return self.pid() is not None
        return super().is_ready()

    @override
    def accepts_clients(self) -> bool:
        return http_ok(f"http://{self.host}:{self.client_port}/metrics")


class BridgeService(SpeedService):
    """``trends ingest kafka`` in the background, under :mod:`stack.supervisor` like the speed job.

    It reads ``bridge.sources`` in ``bridge.format`` with ``bridge.mapping``; a run that stops on an error (a
    registry away longer than ``registry.max_wait_s``, a transaction failing again and again) is restarted with
    the speed service's back-off and resumes at its group's committed offsets. Ready once its ingest metrics
    answer (``metrics.ingest_port``), or once it runs when no port is set.
    """

    name = "bridge"
    args = ("ingest", "kafka", "--no-progress")
    secret_sections = ("kafka", "registry")

    @override
    def check_safe(self) -> None:
        if not self.settings.bridge.sources:
            msg = f"the bridge service needs its source topics: set {env_var('bridge.sources')} (a JSON list)"
            raise StackError(msg)

    @override
    def status(self) -> ServiceStatus:
        base = PipelineService.status(self)
        state = self.supervisor_state()
        if state is None or base.pid is None:
            return base
        return dataclasses.replace(base, detail=state.describe())

    @property
    @override
    def client_port(self) -> int:
        return self.settings.metrics.ingest_port or 0

    @override
    def ports(self) -> list[tuple[int, str, str]]:
        port = self.client_port
        return [(port, "metrics", env_var("metrics.ingest_port"))] if port else []


class ApiService(PipelineService):
    """``trends serve`` in the background (API and dashboard): ready once /health answers."""

    name = "api"
    args = ("serve",)
    secret_sections = ("cassandra", "serving")

    @property
    @override
    def host(self) -> str:
        host = self.settings.serving.host
        return "127.0.0.1" if host in {"0.0.0.0", "::", ""} else host  # noqa: S104 - reach a wildcard bind on loopback

    @property
    @override
    def client_port(self) -> int:
        return self.settings.serving.port

    @override
    def ports(self) -> list[tuple[int, str, str]]:
        return [(self.client_port, "HTTP", env_var("serving.port"))]

    @override
    def accepts_clients(self) -> bool:
        return http_ok(f"http://{self.host}:{self.client_port}/health")

    @override
    def check_safe(self) -> None:
        token = self.settings.serving.api_token
        problem = exposure_problem(
            "the API",
            self.settings.serving.host,
            token.get_secret_value() if token is not None else None,
            guard_var=env_var("serving.api_token"),
            host_var=env_var("serving.host"),
        )
        if problem:
            raise StackError(problem)
