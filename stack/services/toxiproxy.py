"""Toxiproxy in the local stack: a server of TCP proxies on loopback, to put network faults between components.

The server is built from Go modules into the cache (:mod:`stack.gotools`, seconds). It starts with no proxy (a config
of ``[]`` under its conf folder, which also marks the process as ours); the proxies and their toxics are created
through its HTTP API (:class:`stack.toxiproxy.Toxiproxy`). Not one of ``trends stack up``'s services: the
network-fault suite (``make test-network``) starts its own.
"""

from __future__ import annotations

from pathlib import Path

from typing_extensions import override

from infra.errors import StackError
from infra.settings import Settings
from stack import gotools
from stack.process import write_private
from stack.services.base import LoopbackProcess
from stack.toxiproxy import Toxiproxy

DEFAULT_PORT = 8474  # Toxiproxy's own default


class ToxiproxyService(LoopbackProcess):
    """A Toxiproxy server whose HTTP API listens on loopback at ``port``; its proxies listen on loopback too."""

    name = "toxiproxy"
    bundle = None
    needs_java = False

    def __init__(self, settings: Settings, port: int = DEFAULT_PORT) -> None:
        super().__init__(settings)
        self.port = port

    @property
    @override
    def client_port(self) -> int:
        return self.port

    @property
    def url(self) -> str:
        """Return the HTTP API's base URL."""
        return f"http://{self.host}:{self.client_port}"

    def api(self) -> Toxiproxy:
        """Return a client of this server's HTTP API."""
        return Toxiproxy(self.url)

    @override
    def ports(self) -> list[tuple[int, str, str]]:
        return [(self.client_port, "HTTP API", "the port argument of ToxiproxyService")]

    @override
    def render_config(self) -> Path:
        target = self.conf_dir / "toxiproxy.json"
        write_private(target, "[]\n")  # no proxy at start: they are made through the API
        return target

    @override
    def command(self, java: str, config: Path) -> list[str]:
        server = gotools.binary(self.settings, "server", gotools.TOXIPROXY)
        return [str(server), "-host", self.host, "-port", str(self.client_port), "-config", str(config)]

    @override
    def accepts_clients(self) -> bool:
        try:
            self.api().version()
        except StackError:
            return False
        return True
