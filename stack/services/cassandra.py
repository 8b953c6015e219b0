"""The local Cassandra: one node per configured contact point, with its superuser role set up on first start."""

from __future__ import annotations

import logging
import re
import secrets
import shutil
import subprocess
import time
from pathlib import Path

from typing_extensions import override

from infra import jars
from infra.cassandra import ssl_context
from infra.errors import StackError
from infra.security import MIN_SECRET_CHARS, is_loopback, too_short
from infra.settings import Settings
from infra.settings_env import env_var
from stack.certificates import ensure_stack_tls
from stack.process import port_is_open, process_alive, tail
from stack.services.base import CONF_DIR, Service, find_java, render

logger = logging.getLogger(__name__)


def jvm_options() -> list[str]:
    """Return the JVM options of ``jvm17-server.options`` as arguments ("--add-opens x" lines are two)."""
    opts: list[str] = []
    for line in (CONF_DIR / "cassandra" / "jvm17-server.options").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            opts.extend(line.strip().split(" ", 1))
    return opts


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
            (self.client_port, "CQL clients", env_var("cassandra.port")),
            (stack.cassandra_storage_port, "storage", env_var("stack.cassandra_storage_port")),
            (self.jmx_port, "JMX", env_var("stack.cassandra_jmx_port")),
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
            msg = (
                f"refusing to start {where}: set both {env_var('cassandra.username')} and "
                f"{env_var('cassandra.password')}."
            )
            raise StackError(msg)
        if self.auth_enabled and not re.fullmatch(r"[a-z][a-z0-9_]{0,47}", cfg.username or ""):
            msg = (
                f"refusing to start {where}: for the local stack {env_var('cassandra.username')} must be a lower-case "
                "identifier (letters, digits, _), as the role it creates is named after it."
            )
            raise StackError(msg)
        if self.settings.stack.tls:
            self._check_tls(where)
        if is_loopback(self.host):
            return
        if not self.auth_enabled:
            msg = (
                f"refusing to start {where}, which is not a loopback address, without authentication "
                f"(AllowAllAuthenticator). Keep {env_var('cassandra.contact_points')} on 127.0.0.x, or let the stack "
                f"run it with PasswordAuthenticator: set {env_var('cassandra.username')} and "
                f"{env_var('cassandra.password')} (at "
                f"least {MIN_SECRET_CHARS} characters); the stack creates that superuser role and disables the "
                f"default cassandra/cassandra one. Client traffic is not encrypted unless {env_var('stack.tls')}=true "
                "(client_encryption_options; docs/deploy.md): set it on an untrusted network."
            )
            raise StackError(msg)
        short = too_short(
            env_var("cassandra.password"), cfg.password.get_secret_value() if cfg.password is not None else ""
        )
        if short:
            msg = f"refusing to start {where}, which is not a loopback address: {short}"
            raise StackError(msg)

    def _check_tls(self, where: str) -> None:
        """Refuse ``stack.tls`` without client TLS or without a password: the TLS stack is the authenticated one."""
        cfg = self.settings.cassandra
        missing = [
            var
            for var, ok in (
                (f"{env_var('cassandra.ssl')}=true", cfg.ssl),
                (env_var("cassandra.username"), self.auth_enabled),
                (env_var("cassandra.password"), self.auth_enabled),
            )
            if not ok
        ]
        if missing:
            msg = (
                f"refusing to start {where} with {env_var('stack.tls')}=true: its clients need {', '.join(missing)} "
                "(the TLS stack runs client encryption with PasswordAuthenticator)."
            )
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
        return render(
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
            client_encryption=self.client_encryption(),
        )

    def client_encryption(self) -> str:
        """Return ``client_encryption_options`` for ``stack.tls`` (PEM keystore, TLS required), else nothing.

        Clients authenticate with their password (PasswordAuthenticator), not a certificate: Cassandra 5.0's
        ``require_client_auth`` is all or nothing, and the tests need both kinds of client.
        """
        if not self.settings.stack.tls:
            return ""
        files = ensure_stack_tls(self.settings.tls_dir, self.settings.cassandra.contact_points)
        return "\n".join(
            [
                "client_encryption_options:",
                "  enabled: true",
                "  optional: false",
                "  ssl_context_factory:",
                "    class_name: org.apache.cassandra.security.PEMBasedSslContextFactory",
                f"  keystore: {files.server_keystore}",
                f"  truststore: {files.ca}",
                "  require_client_auth: false",
                "  accepted_protocols: [TLSv1.2, TLSv1.3]",
            ]
        )

    @override
    def command(self, java: str, config: Path) -> list[str]:
        folder = jars.bundle_dir(self.settings, jars.CASSANDRA)
        jamm = next(iter(sorted(folder.glob("jamm-*.jar"))), None)
        if jamm is None:
            msg = f"jamm agent jar missing from {folder}; run `trends stack fetch --force`"
            raise StackError(msg)
        opts = jvm_options()
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

    def nodetool(self, *args: str, timeout_s: float = 600) -> str:
        """Run ``nodetool`` against this node over its local JMX port (the jars the stack fetched); return its output.

        The operator's steps of an erasure (flush, garbagecollect, drain) and any other maintenance on the local
        stack; a real cluster uses its own ``nodetool``.

        :raises StackError: when nodetool fails (its output says why).
        """
        folder = jars.bundle_dir(self.settings, jars.CASSANDRA)
        cmd = [
            find_java(self.settings),
            *(o for o in jvm_options() if o.startswith("--add-") or not o.startswith("-")),  # module access only
            "-cp",
            f"{self.conf_dir}:{folder}/*",
            f"-Dlogback.configurationFile={self.conf_dir / 'logback.xml'}",
            "org.apache.cassandra.tools.NodeTool",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.jmx_port),
            *args,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)  # noqa: S603 - ours
        if proc.returncode != 0:
            output = proc.stderr[-2000:] or proc.stdout[-2000:]
            msg = f"nodetool {' '.join(args)} on {self.name} failed ({proc.returncode}): {output}"
            raise StackError(msg)
        return proc.stdout

    def prepare(self, java: str, config: Path) -> None:
        """Clear the node's compaction log; hold a joining node back until the seed accepts clients."""
        self.clear_compaction_history()
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

    def clear_compaction_history(self) -> int:
        """Delete the stopped node's ``system.compaction_history`` files; return the bytes freed.

        Cassandra 5.0 rewrites every row of that table at each start (``SystemKeyspaceMigrator41``), one write at a
        time, each waiting for its commit-log group (15 ms). The test suites' thousands of compactions (the table
        keeps a row per compaction for 7 days) made a start take over three minutes. The table is a log that
        ``nodetool compactionhistory`` reads and nothing else does; the stack starts each node with it empty.
        """
        freed = 0
        for table in (self.home / "data" / "data" / "system").glob("compaction_history-*"):
            for file in table.iterdir():
                if file.is_file():
                    freed += file.stat().st_size
                    file.unlink()
        if freed:
            logger.info("%s: cleared system.compaction_history (%d bytes) before the start", self.name, freed)
        return freed

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
            f"already has roles, {env_var('cassandra.password')} must be that role's password (the stack creates the "
            f"role only on a node that still has the default superuser).\n{logs}"
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
            ssl_context=ssl_context(cfg),
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
            ssl_context=ssl_context(cfg),
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
