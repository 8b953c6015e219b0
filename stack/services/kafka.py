"""The local Kafka: one KRaft node (broker and controller in one JVM) per configured bootstrap address."""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from pathlib import Path

from typing_extensions import override

from infra import jars
from infra.errors import StackError
from infra.security import MIN_SECRET_CHARS, is_loopback, too_short
from infra.settings import Settings
from infra.settings_env import env_var
from stack.certificates import ensure_stack_tls
from stack.services.base import CONF_DIR, Service, render

logger = logging.getLogger(__name__)


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
            (self.client_port, "clients", env_var("kafka.bootstrap_servers")),
            (self.controller_port, "controller", env_var("stack.kafka_controller_port")),
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
        if self.settings.stack.tls:
            self._check_tls(where)
            if kafka.security_protocol == "SASL_SSL" and not is_loopback(self.host):
                password = kafka.sasl_password.get_secret_value() if kafka.sasl_password is not None else ""
                short = too_short(env_var("kafka.sasl_password"), password)
                if short:
                    msg = f"refusing to start {where}, which is not a loopback address: {short}"
                    raise StackError(msg)
            return
        if kafka.security_protocol not in ("PLAINTEXT", "SASL_PLAINTEXT"):
            msg = (
                f"refusing to start {where}: {env_var('kafka.security_protocol')}={kafka.security_protocol} needs TLS: "
                f"set {env_var('stack.tls')}=true (the stack then generates a CA and certificates), or run PLAINTEXT "
                f"(loopback only) or SASL_PLAINTEXT with {env_var('kafka.sasl_mechanism')}=PLAIN."
            )
            raise StackError(msg)
        if kafka.security_protocol == "SASL_PLAINTEXT":
            self._check_sasl(where)
        if is_loopback(self.host):
            return
        if kafka.security_protocol == "PLAINTEXT":
            msg = (
                f"refusing to start {where}, which is not a loopback address, without authentication (PLAINTEXT "
                f"listeners). Keep {env_var('kafka.bootstrap_servers')} on 127.0.0.x, or let the stack run its brokers "
                f"with SASL: set {env_var('kafka.security_protocol')}=SASL_PLAINTEXT, "
                f"{env_var('kafka.sasl_mechanism')}=PLAIN, "
                f"{env_var('kafka.sasl_username')} and {env_var('kafka.sasl_password')} (at least "
                f"{MIN_SECRET_CHARS} characters). SASL_PLAINTEXT sends that password unencrypted: on an untrusted "
                f"network let the stack run TLS ({env_var('stack.tls')}=true with SASL_SSL and SCRAM-SHA-512; "
                "docs/deploy.md), or run your own brokers and point the pipeline at them."
            )
            raise StackError(msg)
        short = too_short(
            env_var("kafka.sasl_password"),
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

    def _check_tls(self, where: str) -> None:
        """Refuse ``stack.tls`` with a plaintext protocol, or SASL_SSL without a user the stack can create."""
        kafka = self.settings.kafka
        if kafka.security_protocol not in ("SSL", "SASL_SSL"):
            msg = (
                f"refusing to start {where} with {env_var('stack.tls')}=true and {env_var('kafka.security_protocol')}="
                f"{kafka.security_protocol}: the TLS stack listens with SSL or SASL_SSL; set "
                f"{env_var('kafka.security_protocol')}=SASL_SSL (with {env_var('kafka.sasl_mechanism')}=SCRAM-SHA-512, "
                f"{env_var('kafka.sasl_username')} and {env_var('kafka.sasl_password')}) or SSL."
            )
            raise StackError(msg)
        if kafka.security_protocol == "SASL_SSL":
            self._check_sasl(where, mechanisms=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"))

    def _check_sasl(self, where: str, mechanisms: tuple[str, ...] = ("PLAIN",)) -> None:
        kafka = self.settings.kafka
        password = kafka.sasl_password.get_secret_value() if kafka.sasl_password is not None else ""
        missing = [
            var
            for var, ok in (
                (f"{env_var('kafka.sasl_mechanism')}={'|'.join(mechanisms)}", kafka.sasl_mechanism in mechanisms),
                (env_var("kafka.sasl_username"), bool(kafka.sasl_username)),
                (env_var("kafka.sasl_password"), bool(password)),
            )
            if not ok
        ]
        if missing:
            msg = (
                f"refusing to start {where} with {kafka.security_protocol}: the local stack sets up one user of "
                f"{' or '.join(mechanisms)}; set {', '.join(missing)} (SCRAM needs {env_var('stack.tls')}=true and "
                "SASL_SSL)."
            )
            raise StackError(msg)
        if not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", kafka.sasl_username or "") or any(
            c in password for c in '"\\\n\r,[]='
        ):
            msg = (
                f"for the local stack {env_var('kafka.sasl_username')} must be letters, digits, `_`, `.` or `-`, and "
                f"{env_var('kafka.sasl_password')} must not contain quotes, backslashes, line breaks, `,`, `[`, `]` "
                "or `=` (both go into a JAAS config and kafka-storage's --add-scram)."
            )
            raise StackError(msg)

    def listener_config(self) -> str:
        """Return the listener lines of server.properties: PLAINTEXT, or SASL_PLAINTEXT with PLAIN everywhere."""
        host, port, ctl = self.host, self.client_port, self.controller_port
        kafka = self.settings.kafka
        if self.settings.stack.tls:
            return self.tls_listener_config()
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

    def tls_listener_config(self) -> str:
        """Return the listener lines for ``stack.tls``: clients and brokers on SSL or SASL_SSL, the controller on SSL.

        The PEM keystore (key and chain) and CA come from :func:`stack.certificates.ensure_stack_tls`. With SASL_SSL the
        brokers log in to each other as the configured user with its mechanism; SCRAM users are created by
        ``kafka-storage format --add-scram`` (:meth:`prepare`), PLAIN users are listed in the JAAS config. With SSL
        every client must present a certificate of the CA (``ssl.client.auth=required``: mutual TLS).
        """
        host, port, ctl = self.host, self.client_port, self.controller_port
        kafka = self.settings.kafka
        files = ensure_stack_tls(self.settings.tls_dir, [h for h, _ in kafka.brokers])
        proto = kafka.security_protocol
        lines = [
            f"listeners={proto}://{host}:{port},CONTROLLER://{host}:{ctl}",
            f"advertised.listeners={proto}://{host}:{port}",
            f"inter.broker.listener.name={proto}",
            f"listener.security.protocol.map={proto}:{proto},CONTROLLER:SSL",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={files.server_keystore}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={files.ca}",
            "ssl.endpoint.identification.algorithm=https",
            # SSL alone: the client certificate is the authentication (mutual TLS); SASL_SSL: the SASL login is.
            f"ssl.client.auth={'required' if proto == 'SSL' else 'none'}",
        ]
        if proto != "SASL_SSL":
            return "\n".join(lines)
        mechanism = kafka.sasl_mechanism or ""
        user = kafka.sasl_username or ""
        password = kafka.sasl_password.get_secret_value() if kafka.sasl_password is not None else ""
        if mechanism == "PLAIN":
            jaas = (
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'username="{user}" password="{password}" user_{user}="{password}";'
            )
        else:
            module = "org.apache.kafka.common.security.scram.ScramLoginModule"
            jaas = f'{module} required username="{user}" password="{password}";'
        lines += [
            f"sasl.enabled.mechanisms={mechanism}",
            f"sasl.mechanism.inter.broker.protocol={mechanism}",
            f"listener.name.sasl_ssl.{mechanism.lower()}.sasl.jaas.config={jaas}",
        ]
        return "\n".join(lines)

    def scram_arguments(self) -> list[str]:
        """Return kafka-storage's ``--add-scram`` arguments creating the SCRAM user of ``stack.tls`` (else none)."""
        kafka = self.settings.kafka
        if not (self.settings.stack.tls and kafka.security_protocol == "SASL_SSL"):
            return []
        if not (kafka.sasl_mechanism or "").startswith("SCRAM-"):
            return []
        password = kafka.sasl_password.get_secret_value() if kafka.sasl_password is not None else ""
        return ["--add-scram", f"{kafka.sasl_mechanism}=[name={kafka.sasl_username},password={password}]"]

    @override
    def render_config(self) -> Path:
        shutil.copy(CONF_DIR / "kafka" / "log4j2.properties", self.conf_dir / "log4j2.properties")
        brokers = self.settings.kafka.brokers
        port0 = self.settings.stack.kafka_controller_port
        voters = ",".join(f"{i + 1}@{host}:{port0 + i}" for i, (host, _) in enumerate(brokers))
        return render(
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

    def _java(self, java: str, heap: str, *flags: str) -> list[str]:
        classpath = str(jars.bundle_dir(self.settings, jars.KAFKA) / "*")
        return [
            java,
            *flags,
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
        """Format the KRaft storage once (``--ignore-formatted`` makes it a no-op afterwards), with the SCRAM user.

        SCRAM credentials live in the cluster metadata: they are written at the first format only, so a password
        changed later is set with ``kafka-configs --alter --add-config SCRAM-SHA-512=[password=…]``.
        """
        cmd = [
            *self._java(java, "256m"),  # a tool run, not the server: its own small heap
            "kafka.tools.StorageTool",
            "format",
            "-t",
            self.settings.stack.kafka_cluster_id,
            "-c",
            str(config),
            "--ignore-formatted",
            *self.scram_arguments(),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603
        if proc.returncode != 0:
            output = f"{proc.stdout}{proc.stderr}"
            for arg in self.scram_arguments():
                output = output.replace(arg, "--add-scram <masked>")
            msg = f"formatting Kafka storage failed:\n{output}"
            raise StackError(msg)

    @override
    def command(self, java: str, config: Path) -> list[str]:
        # The heap resident from the start (as Cassandra's own jvm-server.options does): otherwise the broker's RSS
        # climbs toward -Xmx for as long as it runs, which hides real growth (the soak's bound on it).
        return [*self._java(java, self.settings.stack.kafka_heap, "-XX:+AlwaysPreTouch"), "kafka.Kafka", str(config)]

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
