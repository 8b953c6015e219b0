"""Run Kafka (KRaft) and Cassandra on loopback, one node each or a small cluster, from the jars in the cache.

Airflow (``infra/airflow.py``) joins them on request: it keeps the same contract (:class:`StackService`) but is
several Python processes, not one JVM, so it is a sibling of :class:`Service` rather than a subclass.

Each server is a JVM started in its own session (process group) with its output in a log file and its pid in a
pid file under ``<data_dir>/<service>/``. Stopping signals that group — never a process found by name — and a pid
file is trusted only while the process it names still runs with our config file on its command line, so a reused
pid cannot make us kill a stranger. Every wait is bounded; a server that dies or hangs at start is reported with
the tail of its log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any, Protocol

from typing_extensions import override

from infra import jars
from infra.errors import StackError
from infra.security import MIN_SECRET_CHARS, exposure_problem, is_loopback, too_short
from infra.settings import Settings
from infra.supervisor import SupervisorState

logger = logging.getLogger(__name__)

CONF_DIR = Path(__file__).parent / "conf"
MIN_JAVA = 17
LOG_TAIL_LINES = 30


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


def find_java(settings: Settings) -> str:
    """Return the ``java`` executable to run the servers with, checking that it is JDK 17 or newer.

    :raises StackError: when no Java is found or it is too old.
    """
    home = settings.stack.java_home or (Path(os.environ["JAVA_HOME"]) if os.environ.get("JAVA_HOME") else None)
    java = str(home / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        msg = (
            "Java was not found: the servers need a JDK 17 or newer. Install one (e.g. Debian's "
            "openjdk-17-jre-headless) or set TRENDS_STACK__JAVA_HOME / JAVA_HOME."
        )
        raise StackError(msg)
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False)  # noqa: S603
    except (OSError, subprocess.TimeoutExpired) as exc:
        msg = f"{java} -version failed: {exc}"
        raise StackError(msg) from exc
    match = re.search(r'version "(\d+)(?:\.(\d+))?', proc.stderr + proc.stdout)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):  # "1.8" style
        major = int(match.group(2))
    if major < MIN_JAVA:
        msg = f"{java} is Java {major or 'unknown'}; the servers need Java {MIN_JAVA} or newer."
        raise StackError(msg)
    return java


def port_is_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """Tell whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def port_owner(port: int) -> str:
    """Describe the process that listens on a port, if the system lets us see it."""
    try:
        import psutil  # noqa: PLC0415 - optional nicety for the error message

        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                proc = psutil.Process(conn.pid)
                return f"pid {conn.pid} ({' '.join(proc.cmdline())[:120]})"
    except Exception:
        logger.debug("could not look up the owner of port %s", port, exc_info=True)
    return "another process"


def ensure_port_free(host: str, port: int, what: str, setting: str) -> None:
    """Raise a clear error when a port the server needs is already taken by someone else.

    :arg setting: the env var that moves the port, named in the message.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            msg = (
                f"cannot start {what}: port {host}:{port} is already taken by {port_owner(port)} "
                f"that this stack did not start ({exc.strerror}). Stop it, or move the port with {setting}."
            )
            raise StackError(msg) from exc


def tail(paths: Iterable[Path], lines: int = LOG_TAIL_LINES) -> str:
    """Return the last lines of each existing file, headed by its name."""
    out = []
    for path in paths:
        if path.is_file() and path.stat().st_size:
            with path.open("rb") as fh:
                fh.seek(max(0, path.stat().st_size - 64 * 1024))
                text = fh.read().decode("utf-8", "replace").splitlines()[-lines:]
            out.append(f"--- {path} (last {len(text)} lines) ---\n" + "\n".join(text))
    return "\n".join(out) or "(no log output)"


def process_alive(pid: int) -> bool:
    """Tell whether a process runs (a zombie does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours is dead for our purposes
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def reap(pid: int) -> None:
    """Collect the exit status of a child of ours, if it has exited, so it leaves no zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


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

    # -- shared machinery ----------------------------------------------------------------------------------
    @property
    def address(self) -> str:
        """Return host:port for clients."""
        return f"{self.host}:{self.client_port}"

    def pid(self) -> int | None:
        """Return the pid of our running server, or None (removing a stale pid file)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        if process_alive(pid) and self._is_ours(pid):
            return pid
        reap(pid)
        logger.debug("removing stale pid file %s (pid %s)", self.pid_file, pid)
        self.pid_file.unlink(missing_ok=True)
        return None

    def _is_ours(self, pid: int) -> bool:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return True  # no /proc: trust the pid file
        return str(self.conf_dir) in cmdline

    def is_ready(self) -> bool:
        """Tell whether the server accepts clients."""
        return port_is_open(self.host, self.client_port) and self.accepts_clients()

    def rss_mib(self, pid: int) -> float | None:
        """Return the resident memory of the server process in MiB."""
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None

    def status(self) -> ServiceStatus:
        """Return the server's current state."""
        pid = self.pid()
        return ServiceStatus(
            name=self.name,
            pid=pid,
            ready=pid is not None and self.is_ready(),
            address=self.address,
            rss_mib=self.rss_mib(pid) if pid else None,
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
        with self.stdout_file.open("ab") as out:
            out.write(f"\n=== start {time.strftime('%Y-%m-%dT%H:%M:%S%z')} ===\n".encode())
            out.flush()
            proc = subprocess.Popen(  # noqa: S603 - our own command line
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                env=self.process_env(),
                start_new_session=True,
            )
        self.pid_file.write_text(f"{proc.pid}\n")
        return proc.pid

    def wait_ready(self, pid: int) -> float:
        """Wait until the server accepts clients; return the seconds waited.

        :raises StackError: when the process dies or the wait times out (the server is then stopped).
        """
        started = time.monotonic()
        deadline = started + self.start_timeout
        while time.monotonic() < deadline:
            if not process_alive(pid):
                reap(pid)
                self.pid_file.unlink(missing_ok=True)
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
        self._signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.settings.stack.stop_timeout_s
        while time.monotonic() < deadline and process_alive(pid):
            time.sleep(0.2)
            reap(pid)
        if process_alive(pid):
            logger.warning("%s ignored SIGTERM for %.0f s; killing it", self.name, self.settings.stack.stop_timeout_s)
            self._signal_group(pid, signal.SIGKILL)
            kill_deadline = time.monotonic() + 10
            while time.monotonic() < kill_deadline and process_alive(pid):
                time.sleep(0.1)
                reap(pid)
        self.pid_file.unlink(missing_ok=True)
        return True

    @staticmethod
    def _signal_group(pid: int, sig: signal.Signals) -> None:
        signal_group(pid, sig)

    def data_paths(self) -> list[Path]:
        """Return what ``reset`` deletes: the server's stored data (configs and logs are kept)."""
        return [self.home / "data"]


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Send a signal to the process group of a process we started in its own session."""
    try:
        os.killpg(os.getpgid(pid), sig)
    except ProcessLookupError:
        return
    except PermissionError:
        os.kill(pid, sig)


def _render(template: str, target: Path, **values: object) -> Path:
    """Fill a config template; the file is private (0600): it may hold a password."""
    text = Template((CONF_DIR / template).read_text()).substitute({k: str(v) for k, v in values.items()})
    _write_private(target, text)
    return target


class Kafka(Service):
    """One Kafka 4.3 KRaft node (broker and controller in one JVM) per address of ``kafka.bootstrap_servers``.

    One address gives the single-node stack (``kafka``); several give a cluster (``kafka-1`` … ``kafka-N``) whose
    nodes are all controllers of one static quorum, with the internal topics replicated up to 3 ways.
    """

    name = "kafka"
    bundle = jars.KAFKA

    def __init__(self, settings: Settings, node: int = 0) -> None:
        self.node = node
        self.cluster_size = len(settings.kafka.brokers)
        if self.cluster_size > 1:
            self.name = f"kafka-{node + 1}"
        super().__init__(settings)

    @property
    @override
    def host(self) -> str:
        return self.settings.kafka.brokers[self.node][0]

    @property
    @override
    def client_port(self) -> int:
        return self.settings.kafka.brokers[self.node][1]

    @property
    def controller_port(self) -> int:
        """Return this node's controller port (the setting plus the node index, so nodes may share a host)."""
        return self.settings.stack.kafka_controller_port + self.node

    @property
    @override
    def start_timeout(self) -> float:
        return self.settings.stack.kafka_start_timeout_s

    @property
    @override
    def main_log(self) -> Path:
        return self.log_dir / "server.log"

    @override
    def ports(self) -> list[tuple[int, str, str]]:
        return [
            (self.client_port, "clients", "TRENDS_KAFKA__BOOTSTRAP_SERVERS"),
            (self.controller_port, "controller", "TRENDS_STACK__KAFKA_CONTROLLER_PORT"),
        ]

    @override
    def check_safe(self) -> None:
        """Refuse what the local broker cannot be, and a broker off loopback without SASL.

        The local stack runs PLAINTEXT listeners, or SASL_PLAINTEXT with the PLAIN mechanism (one user, from
        ``kafka.sasl_username``/``sasl_password``) on the client, inter-broker and controller listeners alike. Off
        loopback it needs the latter, with a password of at least :data:`MIN_SECRET_CHARS` characters.
        """
        kafka = self.settings.kafka
        where = f"{self.name} on {self.host}:{self.client_port}"
        if kafka.security_protocol not in ("PLAINTEXT", "SASL_PLAINTEXT"):
            msg = (
                f"refusing to start {where}: TRENDS_KAFKA__SECURITY_PROTOCOL={kafka.security_protocol} needs TLS "
                "keystores, which the local stack does not set up. It runs PLAINTEXT (loopback only) or "
                "SASL_PLAINTEXT with TRENDS_KAFKA__SASL_MECHANISM=PLAIN; for TLS, run your own brokers "
                "(docs/deploy.md) and point TRENDS_KAFKA__BOOTSTRAP_SERVERS at them without `trends stack up kafka`."
            )
            raise StackError(msg)
        if kafka.security_protocol == "SASL_PLAINTEXT":
            self._check_sasl(where)
        if is_loopback(self.host):
            return
        if kafka.security_protocol == "PLAINTEXT":
            msg = (
                f"refusing to start {where}, which is not a loopback address, without authentication (PLAINTEXT "
                "listeners). Keep TRENDS_KAFKA__BOOTSTRAP_SERVERS on 127.0.0.x, or let the stack run its brokers "
                "with SASL: set TRENDS_KAFKA__SECURITY_PROTOCOL=SASL_PLAINTEXT, TRENDS_KAFKA__SASL_MECHANISM=PLAIN, "
                "TRENDS_KAFKA__SASL_USERNAME and TRENDS_KAFKA__SASL_PASSWORD (at least "
                f"{MIN_SECRET_CHARS} characters). SASL_PLAINTEXT sends that password unencrypted: on an untrusted "
                "network run brokers with SASL_SSL (TLS keystores, SCRAM users, an authorizer; docs/deploy.md) and "
                "point the pipeline at them instead."
            )
            raise StackError(msg)
        short = too_short(
            "TRENDS_KAFKA__SASL_PASSWORD",
            kafka.sasl_password.get_secret_value() if kafka.sasl_password is not None else "",
        )
        if short:
            msg = f"refusing to start {where}, which is not a loopback address: {short}"
            raise StackError(msg)
        logger.warning(
            "%s listens on %s with SASL/PLAIN over plaintext: the password crosses the network unencrypted",
            self.name,
            self.host,
        )

    def _check_sasl(self, where: str) -> None:
        kafka = self.settings.kafka
        password = kafka.sasl_password.get_secret_value() if kafka.sasl_password is not None else ""
        missing = [
            var
            for var, ok in (
                ("TRENDS_KAFKA__SASL_MECHANISM=PLAIN", kafka.sasl_mechanism == "PLAIN"),
                ("TRENDS_KAFKA__SASL_USERNAME", bool(kafka.sasl_username)),
                ("TRENDS_KAFKA__SASL_PASSWORD", bool(password)),
            )
            if not ok
        ]
        if missing:
            msg = (
                f"refusing to start {where} with SASL_PLAINTEXT: the local stack sets up the PLAIN mechanism with one "
                f"user; set {', '.join(missing)} (SCRAM users need `kafka-storage format --add-scram`: run your own "
                "brokers for them)."
            )
            raise StackError(msg)
        if not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", kafka.sasl_username or "") or any(
            c in password for c in '"\\\n\r'
        ):
            msg = (
                "for the local stack TRENDS_KAFKA__SASL_USERNAME must be letters, digits, `_`, `.` or `-`, and "
                "TRENDS_KAFKA__SASL_PASSWORD must not contain quotes, backslashes or line breaks (both go into a JAAS "
                "config)."
            )
            raise StackError(msg)

    def listener_config(self) -> str:
        """Return the listener lines of server.properties: PLAINTEXT, or SASL_PLAINTEXT with PLAIN everywhere."""
        host, port, ctl = self.host, self.client_port, self.controller_port
        kafka = self.settings.kafka
        if kafka.security_protocol != "SASL_PLAINTEXT":
            return "\n".join(
                [
                    f"listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{ctl}",
                    f"advertised.listeners=PLAINTEXT://{host}:{port}",
                    "inter.broker.listener.name=PLAINTEXT",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                ]
            )
        user = kafka.sasl_username or ""
        password = kafka.sasl_password.get_secret_value() if kafka.sasl_password is not None else ""
        # The broker's own login (username/password) and the users it accepts (user_<name>): the same single user.
        jaas = (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{user}" password="{password}" user_{user}="{password}";'
        )
        return "\n".join(
            [
                f"listeners=SASL_PLAINTEXT://{host}:{port},CONTROLLER://{host}:{ctl}",
                f"advertised.listeners=SASL_PLAINTEXT://{host}:{port}",
                "inter.broker.listener.name=SASL_PLAINTEXT",
                "listener.security.protocol.map=SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT",
                "sasl.enabled.mechanisms=PLAIN",
                "sasl.mechanism.inter.broker.protocol=PLAIN",
                "sasl.mechanism.controller.protocol=PLAIN",
                f"listener.name.sasl_plaintext.plain.sasl.jaas.config={jaas}",
                f"listener.name.controller.plain.sasl.jaas.config={jaas}",
            ]
        )

    @override
    def render_config(self) -> Path:
        shutil.copy(CONF_DIR / "kafka" / "log4j2.properties", self.conf_dir / "log4j2.properties")
        brokers = self.settings.kafka.brokers
        port0 = self.settings.stack.kafka_controller_port
        voters = ",".join(f"{i + 1}@{host}:{port0 + i}" for i, (host, _) in enumerate(brokers))
        return _render(
            "kafka/server.properties",
            self.conf_dir / "server.properties",
            node_id=self.node + 1,
            voters=voters,
            listener_config=self.listener_config(),
            log_dirs=self.home / "data",
            partitions=self.settings.kafka.partitions,
            internal_rf=min(3, len(brokers)),
            internal_min_isr=min(2, len(brokers)),
        )

    def _java(self, java: str, heap: str) -> list[str]:
        classpath = str(jars.bundle_dir(self.settings, jars.KAFKA) / "*")
        return [
            java,
            f"-Xms{heap}",
            f"-Xmx{heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:ParallelGCThreads=2",
            "-XX:CICompilerCount=2",
            "-Djava.awt.headless=true",
            f"-Dkafka.logs.dir={self.log_dir}",
            f"-Dlog4j2.configurationFile={self.conf_dir / 'log4j2.properties'}",
            "-cp",
            classpath,
        ]

    def prepare(self, java: str, config: Path) -> None:
        """Format the KRaft storage once (``--ignore-formatted`` makes it a no-op afterwards)."""
        cmd = [
            *self._java(java, "256m"),  # a tool run, not the server: its own small heap
            "kafka.tools.StorageTool",
            "format",
            "-t",
            self.settings.stack.kafka_cluster_id,
            "-c",
            str(config),
            "--ignore-formatted",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603
        if proc.returncode != 0:
            msg = f"formatting Kafka storage failed:\n{proc.stdout}{proc.stderr}"
            raise StackError(msg)

    @override
    def command(self, java: str, config: Path) -> list[str]:
        return [*self._java(java, self.settings.stack.kafka_heap), "kafka.Kafka", str(config)]

    @override
    def accepts_clients(self) -> bool:
        from confluent_kafka.admin import AdminClient  # noqa: PLC0415

        admin = AdminClient(
            {
                **self.settings.kafka.client_config(),
                "bootstrap.servers": self.address,  # this node, not whichever of the cluster answers first
                "socket.timeout.ms": 3000,
                "log_level": 3,
            }
        )
        try:
            metadata = admin.list_topics(timeout=3)
        except Exception:  # noqa: BLE001 - any failure means "not yet"
            return False
        registered = self.node + 1 in metadata.brokers
        return registered and metadata.controller_id is not None and metadata.controller_id >= 0


class Cassandra(Service):
    """One Cassandra 5.0 node per address of ``cassandra.contact_points``, all on the same ports.

    One address gives the single-node stack (``cassandra``); several give a cluster (``cassandra-1`` …) on
    loopback addresses such as 127.0.0.21 and 127.0.0.22, seeded by the first node. A node joins only once the
    seed accepts clients (Cassandra bootstraps one joining node at a time), so ``up`` starts them in order.
    """

    name = "cassandra"
    bundle = jars.CASSANDRA

    def __init__(self, settings: Settings, node: int = 0) -> None:
        self.node = node
        if len(settings.cassandra.contact_points) > 1:
            self.name = f"cassandra-{node + 1}"
        super().__init__(settings)

    @property
    @override
    def host(self) -> str:
        return self.settings.cassandra.contact_points[self.node]

    @property
    @override
    def client_port(self) -> int:
        return self.settings.cassandra.port

    @property
    def seed(self) -> str:
        """Return the address of the seed node (the first contact point)."""
        return self.settings.cassandra.contact_points[0]

    @property
    def jmx_port(self) -> int:
        """Return this node's JMX port (JMX listens on 127.0.0.1 only, so nodes need distinct ports)."""
        return self.settings.stack.cassandra_jmx_port + self.node

    @property
    @override
    def start_timeout(self) -> float:
        return self.settings.stack.cassandra_start_timeout_s

    @property
    @override
    def main_log(self) -> Path:
        return self.log_dir / "system.log"

    @override
    def ports(self) -> list[tuple[int, str, str]]:
        stack = self.settings.stack
        return [
            (self.client_port, "CQL clients", "TRENDS_CASSANDRA__PORT"),
            (stack.cassandra_storage_port, "storage", "TRENDS_STACK__CASSANDRA_STORAGE_PORT"),
            (self.jmx_port, "JMX", "TRENDS_STACK__CASSANDRA_JMX_PORT"),
        ]

    @property
    def auth_enabled(self) -> bool:
        """Tell whether the node runs PasswordAuthenticator (``cassandra.username`` and ``password`` set)."""
        cfg = self.settings.cassandra
        return bool(cfg.username) and cfg.password is not None and bool(cfg.password.get_secret_value())

    @override
    def check_safe(self) -> None:
        """Refuse a node off loopback without PasswordAuthenticator (and a password of 16+ characters)."""
        cfg = self.settings.cassandra
        where = f"{self.name} on {self.host}:{self.client_port}"
        if bool(cfg.username) != (cfg.password is not None and bool(cfg.password.get_secret_value())):
            msg = f"refusing to start {where}: set both TRENDS_CASSANDRA__USERNAME and TRENDS_CASSANDRA__PASSWORD."
            raise StackError(msg)
        if self.auth_enabled and not re.fullmatch(r"[a-z][a-z0-9_]{0,47}", cfg.username or ""):
            msg = (
                f"refusing to start {where}: for the local stack TRENDS_CASSANDRA__USERNAME must be a lower-case "
                "identifier (letters, digits, _), as the role it creates is named after it."
            )
            raise StackError(msg)
        if is_loopback(self.host):
            return
        if not self.auth_enabled:
            msg = (
                f"refusing to start {where}, which is not a loopback address, without authentication "
                "(AllowAllAuthenticator). Keep TRENDS_CASSANDRA__CONTACT_POINTS on 127.0.0.x, or let the stack run "
                "it with PasswordAuthenticator: set TRENDS_CASSANDRA__USERNAME and TRENDS_CASSANDRA__PASSWORD (at "
                f"least {MIN_SECRET_CHARS} characters); the stack creates that superuser role and disables the "
                "default cassandra/cassandra one. Client traffic is not encrypted: on an untrusted network run nodes "
                "with client TLS (client_encryption_options) and point the pipeline at them instead."
            )
            raise StackError(msg)
        short = too_short(
            "TRENDS_CASSANDRA__PASSWORD", cfg.password.get_secret_value() if cfg.password is not None else ""
        )
        if short:
            msg = f"refusing to start {where}, which is not a loopback address: {short}"
            raise StackError(msg)

    @override
    def render_config(self) -> Path:
        shutil.copy(CONF_DIR / "cassandra" / "logback.xml", self.conf_dir / "logback.xml")
        mode = self.settings.stack.cassandra_commitlog_sync
        option = {
            "group": "commitlog_sync_group_window: 15ms",
            "batch": "",
            "periodic": "commitlog_sync_period: 10000ms",
        }[mode]
        return _render(
            "cassandra/cassandra.yaml",
            self.conf_dir / "cassandra.yaml",
            host=self.host,
            seed=self.seed,
            storage_port=self.settings.stack.cassandra_storage_port,
            native_port=self.client_port,
            data_dir=self.home / "data",
            commitlog_sync=mode,
            commitlog_sync_option=option,
            authenticator="PasswordAuthenticator" if self.auth_enabled else "AllowAllAuthenticator",
            authorizer="CassandraAuthorizer" if self.auth_enabled else "AllowAllAuthorizer",
        )

    @override
    def command(self, java: str, config: Path) -> list[str]:
        folder = jars.bundle_dir(self.settings, jars.CASSANDRA)
        jamm = next(iter(sorted(folder.glob("jamm-*.jar"))), None)
        if jamm is None:
            msg = f"jamm agent jar missing from {folder}; run `trends stack fetch --force`"
            raise StackError(msg)
        options = [
            line.strip()
            for line in (CONF_DIR / "cassandra" / "jvm17-server.options").read_text().splitlines()
            if line.strip() and not line.startswith("#")
        ]
        opts: list[str] = []
        for option in options:  # "--add-opens x" lines are two arguments
            opts.extend(option.split(" ", 1))
        heap = self.settings.stack.cassandra_heap
        return [
            java,
            f"-Xms{heap}",
            f"-Xmx{heap}",
            *opts,
            f"-javaagent:{jamm}",
            "-Dcassandra-foreground=yes",
            f"-Dcassandra.config=file://{config}",
            f"-Dcassandra.storagedir={self.home / 'data'}",
            f"-Dcassandra.logdir={self.log_dir}",
            f"-Dlogback.configurationFile={self.conf_dir / 'logback.xml'}",
            f"-Dcassandra.jmx.local.port={self.jmx_port}",
            "-Dcassandra.skip_wait_for_gossip_to_settle=0",
            "-Dcassandra.ring_delay_ms=1000",
            # With PasswordAuthenticator: create the default superuser at once, so `wait_ready` can replace it.
            "-Dcassandra.superuser_setup_delay_ms=0",
            "-cp",
            f"{self.conf_dir}:{folder}/*",
            "org.apache.cassandra.service.CassandraDaemon",
        ]

    def prepare(self, java: str, config: Path) -> None:
        """Hold a joining node back until the seed accepts clients (it has nothing to join before)."""
        if self.node == 0:
            return
        deadline = time.monotonic() + self.start_timeout
        seed = Cassandra(self.settings, 0)
        while not (
            port_is_open(self.seed, self.client_port)
            and (self._ping(self.seed) or (self.auth_enabled and seed._bootstrap_role() and self._ping(self.seed)))
        ):
            if time.monotonic() > deadline:
                msg = f"{self.name} waits for the seed node {self.seed}, which did not accept clients in time"
                raise StackError(msg)
            time.sleep(1)

    @override
    def wait_ready(self, pid: int) -> float:
        """Wait until the node accepts the configured clients; with auth, create their role on first start.

        A new node with PasswordAuthenticator has only the default ``cassandra``/``cassandra`` superuser. The seed
        node's wait logs in with it once, creates the configured role (superuser, login) and then, as that role,
        takes the default one's login and superuser status away, so the well-known password opens nothing. The
        window between the node's start and that step is the wait itself (seconds).
        """
        if not self.auth_enabled or self.node != 0:
            return super().wait_ready(pid)
        started = time.monotonic()
        deadline = started + self.start_timeout
        while time.monotonic() < deadline:
            if not process_alive(pid):
                return super().wait_ready(pid)  # reports the exit with the log tail
            if port_is_open(self.host, self.client_port):
                if self._ping(self.host):
                    return time.monotonic() - started
                if self._bootstrap_role():
                    continue
            time.sleep(1)
        logs = tail(self.log_files())
        self.stop()
        user = self.settings.cassandra.username
        msg = (
            f"{self.name} did not accept the role {user} within {self.start_timeout:.0f} s; stopped it. If the node "
            "already has roles, TRENDS_CASSANDRA__PASSWORD must be that role's password (the stack creates the role "
            f"only on a node that still has the default superuser).\n{logs}"
        )
        raise StackError(msg)

    def _bootstrap_role(self) -> bool:
        """Replace the default superuser by the configured role; return whether it was done now."""
        from cassandra.auth import PlainTextAuthProvider  # noqa: PLC0415
        from cassandra.cluster import Cluster  # noqa: PLC0415

        cfg = self.settings.cassandra
        user, password = cfg.username or "", cfg.password.get_secret_value() if cfg.password else ""
        default = Cluster(
            [self.host],
            port=self.client_port,
            auth_provider=PlainTextAuthProvider("cassandra", "cassandra"),
            protocol_version=cfg.protocol_version,
            connect_timeout=5,
        )
        try:
            sess = default.connect()
            # system_auth is read at QUORUM for the default superuser: fine on the one node that exists now.
            create = f"CREATE ROLE IF NOT EXISTS {user} WITH PASSWORD = %s AND SUPERUSER = true AND LOGIN = true"
            sess.execute(create, (password,))
        except Exception:  # not up yet, or the default superuser is gone: the caller retries, then times out
            logger.debug("cassandra default superuser not usable (yet)", exc_info=True)
            return False
        finally:
            default.shutdown()
        ours = Cluster(
            [self.host],
            port=self.client_port,
            auth_provider=PlainTextAuthProvider(user, password),
            protocol_version=cfg.protocol_version,
            connect_timeout=5,
        )
        try:
            sess = ours.connect()
            sess.execute(
                "ALTER ROLE cassandra WITH PASSWORD = %s AND SUPERUSER = false AND LOGIN = false",
                (secrets.token_urlsafe(24),),
            )
        finally:
            ours.shutdown()
        logger.info("%s: created role %s and disabled the default cassandra superuser", self.name, user)
        return True

    def _ping(self, host: str) -> bool:
        from infra.cassandra import ping  # noqa: PLC0415

        only = self.settings.cassandra.model_copy(update={"contact_points": [host]})
        return ping(self.settings.model_copy(update={"cassandra": only}))

    @override
    def accepts_clients(self) -> bool:
        return self._ping(self.host)


class PipelineService(Service):
    """A long-running ``trends`` command of the pipeline (the streaming job, the API), run like the servers.

    Its environment is the stack's settings as ``TRENDS_*`` variables, so it reads exactly what the stack was
    started with (``conf/settings.env`` keeps a private copy for the operator to read).
    """

    needs_java = False
    bundle = None
    args: tuple[str, ...] = ()

    @property
    @override
    def host(self) -> str:
        return "127.0.0.1"

    @property
    @override
    def main_log(self) -> Path:
        return self.stdout_file

    @property
    @override
    def start_timeout(self) -> float:
        return self.settings.stack.kafka_start_timeout_s

    @override
    def render_config(self) -> Path:
        env = self.home / "conf" / "settings.env"
        settings_env = self.settings.to_env()
        _write_private(env, "".join(f"{k}={v}\n" for k, v in sorted(settings_env.items())))
        return env

    @override
    def command(self, java: str, config: Path) -> list[str]:
        return [str(Path(sys.executable).parent / "trends"), *self.args]

    @override
    def _is_ours(self, pid: int) -> bool:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            return True
        return self.command("", self.home)[0] in argv and all(a in argv for a in self.args)

    @override
    def process_env(self) -> dict[str, str]:
        return {**os.environ, **self.settings.to_env()}

    @override
    def data_paths(self) -> list[Path]:
        return []


class SpeedService(PipelineService):
    """``trends speed run`` in the background, under :mod:`infra.supervisor`: ready once its /metrics answers.

    A run that exits non-zero (a write error, Cassandra down, a crash) is restarted with exponential back-off
    (``stack.speed_restart_*``); ``status`` shows the restarts, and the job exports them as a metric.
    """

    name = "speed"
    args = ("speed", "run")

    @property
    def state_file(self) -> Path:
        """Return the supervisor's state file (restarts, last exit)."""
        return self.home / "supervisor.json"

    @override
    def command(self, java: str, config: Path) -> list[str]:
        st = self.settings.stack
        return [
            sys.executable, "-m", "infra.supervisor", "--state", str(self.state_file),
            "--backoff", str(st.speed_restart_backoff_s), "--backoff-max", str(st.speed_restart_backoff_max_s),
            "--healthy-after", str(st.speed_restart_healthy_s),
            "--", *super().command(java, config),
        ]  # fmt: skip

    @override
    def _is_ours(self, pid: int) -> bool:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            return True
        return "infra.supervisor" in argv and str(self.state_file) in argv and all(a in argv for a in self.args)

    def supervisor_state(self) -> SupervisorState | None:
        """Return what the supervisor last recorded (None before the first start)."""
        return SupervisorState.read(self.state_file)

    @override
    def status(self) -> ServiceStatus:
        base = super().status()
        state = self.supervisor_state()
        if state is None or base.pid is None:
            return base
        return dataclasses.replace(base, detail=state.describe())

    @property
    @override
    def client_port(self) -> int:
        return self.settings.speed.metrics_port

    @override
    def ports(self) -> list[tuple[int, str, str]]:
        port = self.settings.speed.metrics_port
        return [(port, "metrics", "TRENDS_SPEED__METRICS_PORT")] if port else []

    @override
    def is_ready(self) -> bool:
        if not self.client_port:  # no endpoint to ask: running is all we can tell
            return self.pid() is not None
        return super().is_ready()

    @override
    def accepts_clients(self) -> bool:
        return _http_ok(f"http://{self.host}:{self.client_port}/metrics")


class ApiService(PipelineService):
    """``trends serve`` in the background (API and dashboard): ready once /health answers."""

    name = "api"
    args = ("serve",)

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
        return [(self.client_port, "HTTP", "TRENDS_SERVING__PORT")]

    @override
    def accepts_clients(self) -> bool:
        return _http_ok(f"http://{self.host}:{self.client_port}/health")

    @override
    def check_safe(self) -> None:
        token = self.settings.serving.api_token
        problem = exposure_problem(
            "the API",
            self.settings.serving.host,
            token.get_secret_value() if token is not None else None,
            guard_var="TRENDS_SERVING__API_TOKEN",
            host_var="TRENDS_SERVING__HOST",
        )
        if problem:
            raise StackError(problem)


class SparkMaster(Service):
    """A Spark standalone master from pyspark's own ``spark-class`` (a cluster on one machine, for tests and demos)."""

    name = "spark-master"
    bundle = None
    _java = ""  # the java `up` chose, handed to spark-class as JAVA_HOME

    @property
    @override
    def host(self) -> str:
        return "127.0.0.1"

    @property
    @override
    def client_port(self) -> int:
        return self.settings.stack.spark_master_port

    @property
    def url(self) -> str:
        """Return the master URL to give ``TRENDS_SPARK__MASTER``."""
        return f"spark://{self.host}:{self.client_port}"

    @property
    @override
    def address(self) -> str:
        return self.url

    @property
    @override
    def start_timeout(self) -> float:
        return self.settings.stack.kafka_start_timeout_s

    @property
    @override
    def main_log(self) -> Path:
        return self.stdout_file

    @override
    def ports(self) -> list[tuple[int, str, str]]:
        st = self.settings.stack
        return [
            (st.spark_master_port, "RPC", "TRENDS_STACK__SPARK_MASTER_PORT"),
            (st.spark_master_webui_port, "web UI", "TRENDS_STACK__SPARK_MASTER_WEBUI_PORT"),
        ]

    @override
    def render_config(self) -> Path:
        conf = self.conf_dir / "spark-defaults.conf"
        conf.write_text("spark.ui.showConsoleProgress false\n")
        return conf

    def spark_class(self) -> str:
        """Return pyspark's ``bin/spark-class``."""
        import pyspark  # noqa: PLC0415 - heavy, and only needed here

        return str(Path(pyspark.__file__).parent / "bin" / "spark-class")

    @override
    def command(self, java: str, config: Path) -> list[str]:
        st = self.settings.stack
        return [
            self.spark_class(),
            "org.apache.spark.deploy.master.Master",
            "--host", self.host, "--port", str(st.spark_master_port), "--webui-port", str(st.spark_master_webui_port),
        ]  # fmt: skip

    @override
    def process_env(self) -> dict[str, str]:
        # SPARK_CONF_DIR heads the JVM's classpath, which is how `_is_ours` recognises the process.
        env = {**os.environ, "SPARK_CONF_DIR": str(self.conf_dir), "SPARK_LOCAL_IP": self.host}
        if self._java:
            env["JAVA_HOME"] = str(Path(self._java).resolve().parent.parent)
        return env

    @override
    def prepare(self, java: str, config: Path) -> None:
        self._java = java

    def state(self) -> dict[str, Any]:
        """Return the master's /json status (workers, applications), or {} while it does not answer."""
        try:
            url = f"http://{self.host}:{self.settings.stack.spark_master_webui_port}/json/"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return dict(json.load(resp))
        except (OSError, ValueError):
            return {}

    @override
    def accepts_clients(self) -> bool:
        return self.state().get("status") == "ALIVE"

    @override
    def data_paths(self) -> list[Path]:
        return []


class SparkWorker(SparkMaster):
    """A Spark standalone worker registered with the local master."""

    index = 1

    @property
    @override
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def webui_port(self) -> int:
        """Return this worker's web UI port."""
        return self.settings.stack.spark_worker_webui_port + self.index - 1

    @property
    @override
    def client_port(self) -> int:
        return self.webui_port

    @property
    @override
    def address(self) -> str:
        return f"{self.host}:{self.webui_port}"

    @override
    def ports(self) -> list[tuple[int, str, str]]:
        return [(self.webui_port, "web UI", "TRENDS_STACK__SPARK_WORKER_WEBUI_PORT")]

    @override
    def command(self, java: str, config: Path) -> list[str]:
        st = self.settings.stack
        return [
            self.spark_class(),
            "org.apache.spark.deploy.worker.Worker",
            SparkMaster(self.settings).url,
            "--host", self.host, "--webui-port", str(self.webui_port), "--cores", str(st.spark_worker_cores),
            "--memory", st.spark_worker_memory, "--work-dir", str(self.home / "work"),
        ]  # fmt: skip

    @override
    def accepts_clients(self) -> bool:
        """Tell whether the master lists this worker as ALIVE."""
        workers = SparkMaster(self.settings).state().get("workers", [])
        return any(w.get("state") == "ALIVE" and f":{self.webui_port}" in w.get("webuiaddress", "") for w in workers)

    @override
    def data_paths(self) -> list[Path]:
        return [self.home / "work"]


class SparkWorker1(SparkWorker):
    """The first local Spark worker."""

    name = "spark-worker-1"
    index = 1


class SparkWorker2(SparkWorker):
    """The second local Spark worker."""

    name = "spark-worker-2"
    index = 2


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - http://host:port of our own process
            return bool(resp.status == 200)
    except OSError:
        return False


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


# What `up` starts when no server is named; tests and `make demo` rely on it being just these two.
# The servers `up` starts by default: one node or a local cluster each, by the number of addresses configured.
SERVICES = ("kafka", "cassandra")
# Started only when named (`trends stack up airflow speed api`, `--with-airflow`, `trends demo`); `down` and `status`
# cover them too.
OPTIONAL_SERVICES = ("airflow", "speed", "api", "spark-master", "spark-worker-1", "spark-worker-2")
SPARK_CLUSTER = ("spark-master", "spark-worker-1", "spark-worker-2")
ALL_SERVICES = (*SERVICES, *OPTIONAL_SERVICES)


def nodes(settings: Settings, group: str) -> list[Service]:
    """Return the nodes of Kafka or Cassandra: one per configured address."""
    if group == "kafka":
        return [Kafka(settings, i) for i in range(len(settings.kafka.brokers))]
    return [Cassandra(settings, i) for i in range(len(settings.cassandra.contact_points))]


def services(settings: Settings, names: Sequence[str] | None = None) -> list[StackService]:
    """Return the stack's servers: the named ones (in stack order), else Kafka and Cassandra.

    ``kafka`` and ``cassandra`` name all nodes of a local cluster; ``kafka-2`` or ``cassandra-1`` name one.
    """
    chosen = list(names) if names else list(SERVICES)
    node_names = {n.name: n for group in SERVICES for n in nodes(settings, group)}
    unknown = [n for n in chosen if n not in ALL_SERVICES and n not in node_names]
    if unknown:
        known = ", ".join(dict.fromkeys([*node_names, *ALL_SERVICES]))
        msg = f"unknown service(s) {', '.join(unknown)}; choose from {known}"
        raise StackError(msg)
    from infra.airflow import Airflow  # noqa: PLC0415 - infra.airflow builds on this module

    picked: list[StackService] = [
        node for group in SERVICES for node in nodes(settings, group) if group in chosen or node.name in chosen
    ]
    factories: dict[str, Callable[[Settings], StackService]] = {
        "airflow": Airflow,
        "speed": SpeedService,
        "api": ApiService,
        "spark-master": SparkMaster,
        "spark-worker-1": SparkWorker1,
        "spark-worker-2": SparkWorker2,
    }
    return [*picked, *(factories[n](settings) for n in OPTIONAL_SERVICES if n in chosen)]


@dataclass(frozen=True)
class UpResult:
    """What ``up`` did for one server."""

    name: str
    address: str
    pid: int
    already_running: bool
    seconds: float


def up(settings: Settings, names: Sequence[str] | None = None) -> list[UpResult]:
    """Start the servers that are not running (all launched first, then awaited) and wait until each is ready.

    A second call while they run is a no-op. Data survives ``down``/``up``.
    """
    chosen = services(settings, names)
    for svc in chosen:  # refuse an unsafe configuration before anything is launched
        if svc.pid() is None:
            svc.check_safe()
    java = find_java(settings) if any(svc.needs_java and svc.pid() is None for svc in chosen) else ""
    launched: list[tuple[StackService, int, bool, float]] = []
    try:
        for svc in chosen:
            before = svc.pid()
            t0 = time.monotonic()
            pid = before if before is not None else svc.start(java)
            launched.append((svc, pid, before is not None, t0))
        results = []
        for svc, pid, already, t0 in launched:
            svc.wait_ready(pid)
            results.append(UpResult(svc.name, svc.address, pid, already, time.monotonic() - t0))
    except BaseException:
        for svc, _pid, already, _t0 in launched:  # don't leave half a stack we just started
            if not already:
                svc.stop()
        raise
    return results


def down(settings: Settings, names: Sequence[str] | None = None) -> list[str]:
    """Stop the servers this stack started (by pid file), Airflow first; return the names that were running.

    With no names it stops every server of the stack, Airflow included when it runs.
    """
    chosen = list(reversed(services(settings, names or ALL_SERVICES)))
    brokers = [svc for svc in chosen if isinstance(svc, Kafka)]
    stopped: list[str] = []
    for svc in chosen:
        if not isinstance(svc, Kafka):
            if svc.stop():
                stopped.append(svc.name)
        elif svc is brokers[0]:
            # The nodes of a Kafka cluster together: stopped one by one, the last ones lose their controller
            # quorum and hang in controlled shutdown until they are killed.
            with ThreadPoolExecutor(len(brokers)) as pool:
                ran = list(pool.map(lambda b: b.stop(), brokers))
            stopped += [b.name for b, r in zip(brokers, ran, strict=True) if r]
    return stopped


def status(settings: Settings, names: Sequence[str] | None = None) -> list[ServiceStatus]:
    """Return the state of each server (Kafka and Cassandra unless others are named)."""
    return [svc.status() for svc in services(settings, names)]


def reset(settings: Settings, names: Sequence[str] | None = None) -> list[Path]:
    """Stop the servers and delete their stored data (and, for a full reset, the streaming checkpoints).

    Airflow's metadata DB is deleted only when ``airflow`` is named.
    """
    chosen = services(settings, names)
    for svc in chosen:
        svc.stop()
    removed = []
    paths = [p for svc in chosen for p in svc.data_paths()]
    if not names or set(SERVICES) <= set(names):
        paths.append(Path(settings.checkpoint_root))
    for path in paths:
        if path.exists():
            shutil.rmtree(path)
            removed.append(path)
    return removed


def follow(path: Path, *, lines: int, follow_file: bool) -> Iterator[str]:
    """Yield the last lines of a log file, then (optionally) new lines as they are written."""
    if not path.exists():
        return
    yield from tail([path], lines).splitlines()[1:]
    if not follow_file:
        return
    with path.open("r", errors="replace") as fh:
        fh.seek(0, os.SEEK_END)
        while True:
            line = fh.readline()
            if line:
                yield line.rstrip("\n")
            else:
                time.sleep(0.5)
