"""What every server of the local stack is: the :class:`StackService` contract and the one-process :class:`Service`.

Each server is one process started in its own session (process group) with its output in a log file and its pid in
a pid file under ``<data_dir>/<service>/`` (:mod:`stack.process`). A pid file is trusted only while the process it
names still runs, started when the recorded one did, with our config on its command line, so a reused pid cannot make
us kill a stranger. Every wait is bounded; a server that dies or hangs at start is reported with the tail of its log.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Protocol

from typing_extensions import override

from infra import jars
from infra.errors import StackError
from infra.settings import Settings
from infra.settings_env import env_var
from stack.process import (
    PidFile,
    cmdline,
    ensure_port_free,
    launch,
    port_is_open,
    process_alive,
    reap,
    rss_mib,
    stop_groups,
    tail,
    write_private,
)

logger = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
MIN_JAVA = 17


@dataclass(frozen=True)
class ServiceStatus:
    """What ``trends stack status`` shows of one server."""

    name: str
    pid: int | None
    ready: bool
    address: str
    rss_mib: float | None
    data_dir: Path
    log_file: Path
    detail: str = ""

    @property
    def state(self) -> str:
        """Return running/starting/stopped as one word."""
        if self.pid is None:
            return "stopped"
        return "running" if self.ready else "starting"


class StackService(Protocol):
    """What ``up``/``down``/``status``/``reset`` and the CLI need of a server of the local stack."""

    @property
    def name(self) -> str:
        """Return the service's name in ``trends stack`` commands."""

    @property
    def needs_java(self) -> bool:
        """Tell whether starting it needs a JDK."""

    @property
    def stdout_file(self) -> Path:
        """Return the file the process's own output goes to."""

    @property
    def address(self) -> str:
        """Return where clients reach the server."""

    @property
    def main_log(self) -> Path:
        """Return the log that ``trends stack logs`` shows."""

    def pid(self) -> int | None:
        """Return the pid of the running server, or None."""

    def start(self, java: str) -> int:
        """Launch the server unless it runs; return its pid without waiting for readiness."""

    def wait_ready(self, pid: int) -> float:
        """Wait (bounded) until the server accepts clients; return the seconds waited."""

    def stop(self) -> bool:
        """Stop the server; return whether it ran."""

    def check_safe(self) -> None:
        """Raise :class:`StackError` when starting the server as configured would expose it without authentication."""

    def status(self) -> ServiceStatus:
        """Return the server's current state."""

    def data_paths(self) -> list[Path]:
        """Return what ``reset`` deletes."""


JVM_DIRS = (Path("/usr/lib/jvm"), Path("/opt/java"))  # where Debian's and Temurin's JDKs install


def java_major(java: str) -> int:
    """Return the major version of a ``java`` executable (0 when it does not tell).

    :raises StackError: when it cannot be run.
    """
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False)  # noqa: S603
    except (OSError, subprocess.TimeoutExpired) as exc:
        msg = f"{java} -version failed: {exc}"
        raise StackError(msg) from exc
    match = re.search(r'version "(\d+)(?:\.(\d+))?', proc.stderr + proc.stdout)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):  # "1.8" style
        major = int(match.group(2))
    return major


def find_java(settings: Settings, minimum: int = MIN_JAVA, home: Path | None = None) -> str:
    """Return the ``java`` executable to run a server with, checking that it is at least ``minimum``.

    :arg home: a JDK asked for by name (a setting): it must do, no other is looked for.
    Otherwise ``stack.java_home``, ``$JAVA_HOME`` or ``java`` on PATH; when that one is too old for ``minimum``
    (Apicurio Registry needs 21, the machine's default may be 17), the newest JDK that is new enough under
    :data:`JVM_DIRS`.

    :raises StackError: when no Java is found or none is new enough.
    """
    if home is not None:
        java = str(home / "bin" / "java")
    else:
        home = settings.stack.java_home or (Path(os.environ["JAVA_HOME"]) if os.environ.get("JAVA_HOME") else None)
        java = str(home / "bin" / "java") if home else (shutil.which("java") or "")
    if not java or not Path(java).exists():
        if minimum > MIN_JAVA and (found := _discover_java(minimum)):
            return found
        msg = (
            f"Java was not found: the servers need a JDK {minimum} or newer. Install one (e.g. Debian's "
            f"openjdk-{minimum}-jre-headless) or set {env_var('stack.java_home')} / JAVA_HOME."
        )
        raise StackError(msg)
    major = java_major(java)
    if major >= minimum:
        return java
    if minimum > MIN_JAVA and not settings.stack.registry_java_home and (found := _discover_java(minimum)):
        return found
    msg = f"{java} is Java {major or 'unknown'}; this server needs Java {minimum} or newer."
    if minimum > MIN_JAVA:
        msg += f" Install a JDK {minimum}+ under /usr/lib/jvm or set {env_var('stack.registry_java_home')}."
    raise StackError(msg)


def _discover_java(minimum: int) -> str | None:
    """Return the newest JDK of at least ``minimum`` installed under :data:`JVM_DIRS`, or None."""
    best: tuple[int, str] | None = None
    for root in JVM_DIRS:
        if not root.is_dir():
            continue
        for candidate in sorted(root.glob("*/bin/java")):
            if candidate.parent.parent.is_symlink():
                continue  # Debian's aliases (java-1.17.0-openjdk-amd64) of the same JDK
            try:
                major = java_major(str(candidate))
            except StackError:
                continue
            if major >= minimum and (best is None or major > best[0]):
                best = (major, str(candidate))
    if best is not None:
        logger.info("using Java %s at %s (Java %s+ needed)", best[0], best[1], minimum)
    return best[1] if best else None


def render(template: str, target: Path, **values: object) -> Path:
    """Fill a config template of ``infra/conf``; the file is private (0600): it may hold a password."""
    text = Template((CONF_DIR / template).read_text()).substitute({k: str(v) for k, v in values.items()})
    write_private(target, text)
    return target


class Service(ABC):
    """One server of the local stack: config rendering, start, readiness, stop."""

    name: str
    bundle: jars.Bundle | None
    needs_java = True

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = settings.data_dir / self.name
        self.conf_dir = self.home / "conf"
        self.log_dir = self.home / "logs"
        self.pid_file = self.home / f"{self.name}.pid"
        self.stdout_file = self.log_dir / "stdout.log"

    # -- what each server defines -------------------------------------------------------------------------
    @property
    @abstractmethod
    def host(self) -> str:
        """Return the address the server binds to."""

    @property
    @abstractmethod
    def client_port(self) -> int:
        """Return the port clients connect to."""

    @abstractmethod
    def ports(self) -> list[tuple[int, str, str]]:
        """Return (port, purpose, setting that moves it) of every port the server binds."""

    @abstractmethod
    def render_config(self) -> Path:
        """Write the server's config files; return the main one (its path marks our process)."""

    @abstractmethod
    def command(self, java: str, config: Path) -> list[str]:
        """Return the command line that runs the server in the foreground."""

    @abstractmethod
    def accepts_clients(self) -> bool:
        """Tell whether a real client request succeeds now."""

    @property
    @abstractmethod
    def main_log(self) -> Path:
        """Return the server's own log file."""

    @property
    @abstractmethod
    def start_timeout(self) -> float:
        """Return the longest wait for readiness."""

    def prepare(self, java: str, config: Path) -> None:  # noqa: B027 - optional hook
        """Run one-time set-up before the first start (e.g. format storage)."""

    def process_env(self) -> dict[str, str] | None:
        """Return the environment of the server process (None: inherit ours)."""
        return None

    def check_safe(self) -> None:  # noqa: B027 - optional hook
        """Raise :class:`StackError` when starting the server as configured would expose it without authentication.

        Runs before anything is launched (``up`` checks every server first). Servers on loopback always pass.
        """

    def is_ours(self, argv: list[str]) -> bool:
        """Tell whether a process with these arguments is this server: our config folder is on its command line."""
        return str(self.conf_dir) in " ".join(argv)

    # -- shared machinery ----------------------------------------------------------------------------------
    @property
    def address(self) -> str:
        """Return host:port for clients."""
        return f"{self.host}:{self.client_port}"

    def pid(self) -> int | None:
        """Return the pid of our running server, or None (removing a stale pid file)."""
        return PidFile(self.pid_file).running(self._runs_as_ours)

    def _runs_as_ours(self, pid: int) -> bool:
        argv = cmdline(pid)
        return argv is None or self.is_ours(argv)  # no /proc: trust the pid file

    def is_ready(self) -> bool:
        """Tell whether the server accepts clients."""
        return port_is_open(self.host, self.client_port) and self.accepts_clients()

    def status(self) -> ServiceStatus:
        """Return the server's current state."""
        pid = self.pid()
        return ServiceStatus(
            name=self.name,
            pid=pid,
            ready=pid is not None and self.is_ready(),
            address=self.address,
            rss_mib=rss_mib(pid) if pid else None,
            data_dir=self.home,
            log_file=self.main_log,
        )

    def log_files(self) -> list[Path]:
        """Return the files worth showing when the server misbehaves."""
        return [self.stdout_file, self.main_log]

    def start(self, java: str) -> int:
        """Launch the server unless ours is already running; return its pid without waiting for readiness.

        :raises StackError: when a port is taken by a process we did not start.
        """
        pid = self.pid()
        if pid is not None:
            logger.info("%s already running (pid %s)", self.name, pid)
            return pid
        self.check_safe()
        for port, purpose, setting in self.ports():
            ensure_port_free(self.host, port, f"{self.name} ({purpose})", setting)
        if self.bundle is not None:
            jars.fetch(self.settings, self.bundle)
        for folder in (self.conf_dir, self.log_dir):
            folder.mkdir(parents=True, exist_ok=True)
        config = self.render_config()
        self.prepare(java, config)
        cmd = self.command(java, config)
        logger.info("starting %s: %s", self.name, " ".join(cmd[:3]) + " …")
        pid = launch(cmd, self.stdout_file, cwd=self.home, env=self.process_env())
        PidFile(self.pid_file).write(pid)
        return pid

    def wait_ready(self, pid: int) -> float:
        """Wait until the server accepts clients; return the seconds waited.

        :raises StackError: when the process dies or the wait times out (the server is then stopped).
        """
        started = time.monotonic()
        deadline = started + self.start_timeout
        while time.monotonic() < deadline:
            if not process_alive(pid):
                reap(pid)
                PidFile(self.pid_file).remove()
                msg = f"{self.name} exited during start-up.\n{tail(self.log_files())}"
                raise StackError(msg)
            if self.is_ready():
                return time.monotonic() - started
            time.sleep(0.5)
        logs = tail(self.log_files())
        self.stop()
        msg = f"{self.name} did not accept clients within {self.start_timeout:.0f} s; stopped it.\n{logs}"
        raise StackError(msg)

    def stop(self) -> bool:
        """Stop our server: SIGTERM its process group, SIGKILL after the timeout; return whether it ran."""
        pid = self.pid()
        if pid is None:
            return False
        logger.info("stopping %s (pid %s)", self.name, pid)
        stop_groups({self.name: pid}, self.settings.stack.stop_timeout_s)
        PidFile(self.pid_file).remove()
        return True

    def data_paths(self) -> list[Path]:
        """Return what ``reset`` deletes: the server's stored data (configs and logs are kept)."""
        return [self.home / "data"]


class LoopbackProcess(Service):
    """A server of the tools this machine runs (Spark's daemons, Prometheus, the pipeline's commands).

    It binds to loopback, and its own output is its log. It starts in seconds (Spark's daemons say otherwise).
    """

    @property
    @override
    def host(self) -> str:
        return "127.0.0.1"

    @property
    @override
    def start_timeout(self) -> float:
        return self.settings.stack.pipeline_start_timeout_s

    @property
    @override
    def main_log(self) -> Path:
        return self.stdout_file
