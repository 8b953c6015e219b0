"""The ``trends`` console command: one subcommand group per layer, each defined next to the code it runs.

Groups are imported lazily (``--help`` must not start a JVM or import pyspark). Known failures
(:class:`~infra.errors.TrendsError`) print their message and exit 1 (78 when the settings or state are refused: a
supervisor does not restart that); usage errors exit 2 as usual with click.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

import click
from typing_extensions import override

from infra.errors import TrendsError

logger = logging.getLogger(__name__)

# name -> "module:attribute" of a click command; add a layer's group here when it lands.
SUBCOMMANDS = {
    "stack": "stack.cli:stack",
    "config": "infra.config_cli:config",
    "admin": "infra.admin_cli:admin",
    "demo": "app.demo:demo",
    "ingest": "ingestion.cli:ingest",
    "collect": "ingestion.collect_cli:collect",
    "speed": "speed_layer.cli:speed",
    "batch": "batch_layer.cli:batch",
    "query": "serving.cli:query",
    "serve": "app.api:serve",
    "privacy": "privacy.cli:privacy",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported only when used."""

    def __init__(self, *args: Any, lazy: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    @override
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    @override
    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            module, _, attr = self.lazy[cmd_name].partition(":")
            command = getattr(importlib.import_module(module), attr)
            if not isinstance(command, click.Command):
                msg = f"{self.lazy[cmd_name]} is not a click command"
                raise TypeError(msg)
            return command
        return super().get_command(ctx, cmd_name)


def setup_logging(level: str) -> None:
    """Log to stderr with one format for every layer."""
    logging.basicConfig(
        level=getattr(logging, level),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    for noisy in ("cassandra", "py4j"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))


@click.group(cls=LazyGroup, lazy=SUBCOMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log at DEBUG level.")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """Trending analytics on a Lambda architecture: Kafka, Spark, Cassandra, Airflow.

    Settings come from TRENDS_* environment variables or a .env file; see `trends config`.
    """
    from infra.settings import get_settings

    try:
        settings = get_settings()
    except Exception as exc:  # pydantic's ValidationError names the bad variable
        msg = f"invalid settings: {exc}"
        raise click.UsageError(msg) from exc
    setup_logging("DEBUG" if verbose else settings.log_level)
    ctx.obj = settings


def main() -> None:
    """Run the CLI, turning known errors into a message and exit status 1."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except TrendsError as exc:
        click.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
