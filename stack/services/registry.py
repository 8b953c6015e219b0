"""The local schema registry: Apicurio Registry 3 (in-memory storage), for Avro and Protobuf sources of the bridge.

Started only when named (``trends stack up registry``): Kafka and Cassandra do not need it, and it costs ~300 MiB.
It serves the Confluent-compatible REST API at ``/apis/ccompat/v7`` on the host and port of ``registry.url``.
Its storage is in memory: schemas registered are gone when it stops (a local stack for tests and demos; run a
registry with persistent storage for anything else). Apicurio 3 is built for Java 21: the service looks for a JDK
21+ (``stack.registry_java_home``, else the stack's Java when new enough, else the newest under /usr/lib/jvm).
"""

from __future__ import annotations

from pathlib import Path

from typing_extensions import override

from infra import jars
from infra.errors import StackError
from infra.security import is_loopback
from infra.settings_env import env_var
from stack.process import http_ok, write_private
from stack.services.base import Service, find_java

REGISTRY_JAVA = 21


class Registry(Service):
    """Apicurio Registry 3.3.3 from its Quarkus fast-jar layout (``java -jar quarkus-run.jar``)."""

    name = "registry"
    bundle = jars.REGISTRY

    @property
    @override
    def host(self) -> str:
        return self.settings.registry.host_port[0]

    @property
    @override
    def client_port(self) -> int:
        return self.settings.registry.host_port[1]

    @property
    @override
    def start_timeout(self) -> float:
        return self.settings.stack.registry_start_timeout_s

    @property
    @override
    def main_log(self) -> Path:
        return self.stdout_file

    @override
    def ports(self) -> list[tuple[int, str, str]]:
        return [(self.client_port, "REST API", env_var("registry.url"))]

    @override
    def check_safe(self) -> None:
        """Refuse an address off loopback: the local registry runs without authentication."""
        if not is_loopback(self.host):
            msg = (
                f"refusing to start the schema registry on {self.host}:{self.client_port}, which is not a loopback "
                f"address: the local registry has no authentication. Keep {env_var('registry.url')} on 127.0.0.1, or "
                f"run your own registry and point {env_var('registry.url')} at it."
            )
            raise StackError(msg)

    @override
    def render_config(self) -> Path:
        config = self.conf_dir / "application.properties"
        write_private(
            config,
            f"quarkus.http.host={self.host}\nquarkus.http.port={self.client_port}\n"
            # Apicurio's management interface (health, metrics) binds 0.0.0.0:9000 by default: loopback, any free
            # port (readiness is asked of the API itself), so two registries do not collide
            "quarkus.management.host=127.0.0.1\nquarkus.management.port=0\nquarkus.log.console.level=INFO\n",
        )
        return config

    @override
    def command(self, java: str, config: Path) -> list[str]:
        app = jars.bundle_dir(self.settings, jars.REGISTRY) / "quarkus-run.jar"
        return [
            java, f"-Xmx{self.settings.stack.registry_heap}", f"-Dquarkus.config.locations={config}",
            f"-Dquarkus.http.host={self.host}", f"-Dquarkus.http.port={self.client_port}",
            "-Dquarkus.management.host=127.0.0.1", "-Dquarkus.management.port=0", "-jar", str(app),
        ]  # fmt: skip

    @override
    def start(self, java: str) -> int:
        """Start with a Java 21+ of its own, whatever Java the other servers run on."""
        if self.pid() is not None:
            return super().start(java)
        own = find_java(self.settings, REGISTRY_JAVA, self.settings.stack.registry_java_home)
        return super().start(own)

    @override
    def accepts_clients(self) -> bool:
        return http_ok(f"{self.settings.registry.url.rstrip('/')}/subjects")

    @override
    def data_paths(self) -> list[Path]:
        return []  # in-memory storage
