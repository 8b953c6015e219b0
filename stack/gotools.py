"""Build Go tools (Prometheus, promtool, Toxiproxy) from Go modules into the cache, like the jars: once, outside git.

``go install <module>/cmd/<name>@<version>`` resolves the module through Go's configured module proxy (``go env
GOPROXY``; nothing here names a host) and compiles it; the binaries go to
``<cache_dir>/bin/<tool>-<version>/``. A build is staged in a temporary folder and renamed into place, so an
interrupted build never leaves half a tool behind, and a tool is rebuilt only when one of its binaries is missing.
Building promtool takes about 5-10 minutes of two cores here (the Prometheus server a little more, from the same
module); every later use is instant.

``python -m stack.gotools [--force] [TOOL ...]`` builds them: ``make test`` builds ``promtool`` only, the suites
with a real Prometheus or Toxiproxy (``make test-alerting``, ``make test-network``) build them all.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from infra.errors import StackError
from infra.settings import Settings, get_settings

logger = logging.getLogger(__name__)

BUILD_TIMEOUT_S = 1800


@dataclass(frozen=True)
class GoTool:
    """Commands of one Go module at one version, built together into one cache folder."""

    name: str
    module: str
    version: str
    commands: tuple[str, ...]

    @property
    def folder(self) -> str:
        """Return the cache folder's name (tool and version: two versions live side by side)."""
        return f"{self.name}-{self.version}"

    def packages(self) -> list[str]:
        """Return the ``go install`` arguments, one per command."""
        return [f"{self.module}/cmd/{cmd}@{self.version}" for cmd in self.commands]


# promtool (the rules' checks and unit tests, in every `make test`) and the Prometheus server (the alerting and
# network suites only) are separate builds, so a first `make test` compiles only promtool.
PROMTOOL = GoTool("promtool", "github.com/prometheus/prometheus", "v0.316.0", ("promtool",))
PROMETHEUS = GoTool("prometheus", "github.com/prometheus/prometheus", "v0.316.0", ("prometheus",))
# Toxiproxy's server, for the network-fault suite (a proxy between two components that adds latency, black holes,
# reset connections...); it builds in seconds.
TOXIPROXY = GoTool("toxiproxy", "github.com/Shopify/toxiproxy/v2", "v2.5.0", ("server",))
TOOLS = {tool.name: tool for tool in (PROMTOOL, PROMETHEUS, TOXIPROXY)}


def tool_dir(settings: Settings, tool: GoTool) -> Path:
    """Return the folder holding a tool's binaries."""
    return settings.cache_dir / "bin" / tool.folder


def is_built(settings: Settings, tool: GoTool) -> bool:
    """Tell whether every command of the tool is in the cache."""
    folder = tool_dir(settings, tool)
    return all(os.access(folder / cmd, os.X_OK) for cmd in tool.commands)


def binary(settings: Settings, command: str, tool: GoTool | None = None) -> Path:
    """Return the path of one command of a tool (the tool with that command by default), building it if needed."""
    if tool is None:
        tool = next((t for t in TOOLS.values() if command in t.commands), PROMTOOL)
    if command not in tool.commands:
        msg = f"{tool.name} has no command {command!r} (it has {', '.join(tool.commands)})"
        raise StackError(msg)
    build(settings, tool)
    return tool_dir(settings, tool) / command


def build(settings: Settings, tool: GoTool, *, force: bool = False) -> Path:
    """Build a tool into the cache unless it is there.

    :arg force: build again even if the binaries are there.
    :returns: the tool's folder.
    :raises StackError: when Go is missing or the build fails (with the tail of its output).
    """
    target = tool_dir(settings, tool)
    if not force and is_built(settings, tool):
        return target
    go = shutil.which("go")
    if go is None:
        msg = f"Go (`go`) is not on PATH; it is needed once to build {tool.name} {tool.version} into {target}."
        raise StackError(msg)
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("building %s %s (%s) into %s; this takes minutes", tool.name, tool.version, tool.commands, target)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f".{tool.folder}-", dir=target.parent) as tmp:
        out = Path(tmp) / "bin"
        out.mkdir()
        env = {**os.environ, "GOBIN": str(out)}
        try:
            proc = subprocess.run(  # noqa: S603 - go from PATH, fixed arguments
                [go, "install", *tool.packages()],
                capture_output=True,
                text=True,
                env=env,
                timeout=BUILD_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            msg = f"go install of {tool.name} did not finish within {BUILD_TIMEOUT_S} s"
            raise StackError(msg) from exc
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
            msg = f"go install {' '.join(tool.packages())} failed:\n{tail}"
            raise StackError(msg)
        missing = [cmd for cmd in tool.commands if not (out / cmd).exists()]
        if missing:
            msg = f"go install of {tool.name} produced no {', '.join(missing)}"
            raise StackError(msg)
        if target.exists():
            shutil.rmtree(target)
        out.rename(target)
    logger.info("built %s %s in %.0f s", tool.name, tool.version, time.monotonic() - began)
    return target


def main(argv: list[str] | None = None) -> int:
    """Build the Go tools into the cache (``python -m stack.gotools``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--force", action="store_true", help="build again even if the binaries are cached")
    parser.add_argument("tools", nargs="*", metavar="TOOL", help=f"which tools ({', '.join(TOOLS)}; default: all)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.tools) - set(TOOLS))
    if unknown:
        parser.error(f"unknown tool {', '.join(unknown)} (known: {', '.join(TOOLS)})")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    settings = get_settings()
    for name in args.tools or list(TOOLS):
        try:
            folder = build(settings, TOOLS[name], force=args.force)
        except StackError as exc:
            logger.error("%s", exc)  # the message is the whole story: no traceback for a missing Go
            return 1
        logger.info("%s", folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
