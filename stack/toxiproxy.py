"""A small typed client of Toxiproxy's HTTP API, to put faults on the link between two components of the stack.

A proxy listens on one address and forwards each connection to its upstream; toxics on it degrade the traffic one
way (``downstream``: upstream -> client, ``upstream``: client -> upstream). A client is pointed at a proxy by settings
only (its host:port), so the code under test never knows. Standard library only (urllib): the stack package ships
without the dev dependencies.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Literal

from infra.errors import StackError

logger = logging.getLogger(__name__)

Stream = Literal["upstream", "downstream"]
REQUEST_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Proxy:
    """One proxy as the server reports it."""

    name: str
    listen: str
    upstream: str
    enabled: bool
    toxics: tuple[str, ...]


class Toxiproxy:
    """The HTTP API of one Toxiproxy server (``http://host:port``)."""

    def __init__(self, url: str, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(  # noqa: S310 - our own server's http URL
            f"{self.url}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip()
            msg = f"toxiproxy {method} {path} answered {exc.code}: {detail}"
            raise StackError(msg) from exc
        except OSError as exc:
            msg = f"toxiproxy at {self.url} did not answer {method} {path}: {exc}"
            raise StackError(msg) from exc
        return json.loads(raw) if raw.strip() else None

    # -- the server ------------------------------------------------------------------------------------------
    def version(self) -> str:
        """Return the server's version (a cheap request: readiness)."""
        req = urllib.request.Request(f"{self.url}/version")  # noqa: S310
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                return str(resp.read().decode().strip())
        except OSError as exc:
            msg = f"toxiproxy at {self.url} did not answer /version: {exc}"
            raise StackError(msg) from exc

    def reset(self) -> None:
        """Enable every proxy and remove every toxic (the healthy network)."""
        self._call("POST", "/reset")

    # -- proxies ---------------------------------------------------------------------------------------------
    def create(self, name: str, listen: str, upstream: str) -> Proxy:
        """Create a proxy from ``listen`` (host:port) to ``upstream`` (host:port), replacing one of that name."""
        if name in self.proxies():
            self.delete(name)
        out = self._call("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream, "enabled": True})
        logger.info("toxiproxy: %s %s -> %s", name, listen, upstream)
        return _proxy(out)

    def proxies(self) -> dict[str, Proxy]:
        """Return every proxy by name."""
        return {name: _proxy(p) for name, p in (self._call("GET", "/proxies") or {}).items()}

    def proxy(self, name: str) -> Proxy:
        """Return one proxy."""
        return _proxy(self._call("GET", f"/proxies/{name}"))

    def delete(self, name: str) -> None:
        """Delete a proxy (its open connections are closed)."""
        self._call("DELETE", f"/proxies/{name}")

    def set_enabled(self, name: str, enabled: bool) -> None:
        """Enable or disable a proxy: disabled, it closes every connection and refuses new ones (a link down)."""
        self._call("POST", f"/proxies/{name}", {"enabled": enabled})
        logger.info("toxiproxy: %s %s", name, "enabled" if enabled else "disabled")

    # -- toxics ----------------------------------------------------------------------------------------------
    def add_toxic(
        self,
        proxy: str,
        kind: str,
        attributes: dict[str, int],
        *,
        name: str | None = None,
        stream: Stream = "downstream",
        toxicity: float = 1.0,
    ) -> str:
        """Add a toxic of ``kind`` to a proxy; return its name (default ``<kind>_<stream>``)."""
        toxic = name or f"{kind}_{stream}"
        body = {"name": toxic, "type": kind, "stream": stream, "toxicity": toxicity, "attributes": attributes}
        self._call("POST", f"/proxies/{proxy}/toxics", body)
        logger.info("toxiproxy: %s += %s %s (%s)", proxy, kind, attributes, stream)
        return toxic

    def remove_toxic(self, proxy: str, toxic: str) -> None:
        """Remove one toxic from a proxy."""
        self._call("DELETE", f"/proxies/{proxy}/toxics/{toxic}")
        logger.info("toxiproxy: %s -= %s", proxy, toxic)

    def clear(self, proxy: str) -> None:
        """Remove every toxic of one proxy and enable it."""
        for toxic in self.proxy(proxy).toxics:
            self.remove_toxic(proxy, toxic)
        self.set_enabled(proxy, True)

    def latency(self, proxy: str, ms: int, jitter_ms: int = 0, *, stream: Stream = "downstream") -> str:
        """Delay data by ``ms`` ± ``jitter_ms`` milliseconds."""
        return self.add_toxic(proxy, "latency", {"latency": ms, "jitter": jitter_ms}, stream=stream)

    def bandwidth(self, proxy: str, kb_per_s: int, *, stream: Stream = "downstream") -> str:
        """Cap the rate at ``kb_per_s`` KB/s."""
        return self.add_toxic(proxy, "bandwidth", {"rate": kb_per_s}, stream=stream)

    def timeout(self, proxy: str, ms: int = 0, *, stream: Stream = "downstream") -> str:
        """Stop all data (a black hole); close the connection after ``ms`` (0: never, until the toxic is removed)."""
        return self.add_toxic(proxy, "timeout", {"timeout": ms}, stream=stream)

    def reset_peer(self, proxy: str, ms: int = 0, *, stream: Stream = "downstream") -> str:
        """Reset connections (TCP RST) after ``ms``: at once with 0."""
        return self.add_toxic(proxy, "reset_peer", {"timeout": ms}, stream=stream)

    def slicer(
        self,
        proxy: str,
        average_size: int,
        size_variation: int = 0,
        delay_us: int = 0,
        *,
        stream: Stream = "downstream",
    ) -> str:
        """Slice data into small packets (``average_size`` ± ``size_variation`` bytes, ``delay_us`` apart)."""
        attributes = {"average_size": average_size, "size_variation": size_variation, "delay": delay_us}
        return self.add_toxic(proxy, "slicer", attributes, stream=stream)


def _proxy(raw: dict[str, Any]) -> Proxy:
    return Proxy(
        name=str(raw["name"]),
        listen=str(raw["listen"]),
        upstream=str(raw["upstream"]),
        enabled=bool(raw["enabled"]),
        toxics=tuple(str(t["name"]) for t in raw.get("toxics") or ()),
    )
