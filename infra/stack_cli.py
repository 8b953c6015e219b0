"""``trends stack``: fetch, start, stop, inspect and reset the local Kafka + Cassandra stack."""

from __future__ import annotations

import time

import click

from infra import jars
from infra import stack as local_stack
from infra.settings import Settings

SERVICE_CHOICE = click.Choice(sorted(local_stack.SERVICES))


def _names(services: tuple[str, ...]) -> list[str] | None:
    return list(services) or None


@click.group()
def stack() -> None:
    """Run the local single-node Kafka (KRaft) and Cassandra, from jars fetched with Maven."""


@stack.command()
@click.option("--force", is_flag=True, help="Fetch again even if the cached jars are current.")
@click.pass_obj
def fetch(settings: Settings, force: bool) -> None:
    """Fetch Kafka, Cassandra and the Spark Kafka connector into the jar cache (once)."""
    for name, path in jars.fetch_all(settings, force=force).items():
        click.echo(f"{name:12} {len(list(path.glob('*.jar'))):4d} jars  {path}")


@stack.command()
@click.argument("services", nargs=-1, type=SERVICE_CHOICE)
@click.option("--no-init", is_flag=True, help="Do not create topics and apply CQL migrations after start.")
@click.pass_obj
def up(settings: Settings, services: tuple[str, ...], no_init: bool) -> None:
    """Start the servers (all by default), wait until they accept clients, create topics and schema.

    Running servers are left alone, so a second `up` is a no-op. Data survives `down`/`up`.
    """
    t0 = time.monotonic()
    for result in local_stack.up(settings, _names(services)):
        how = "already running" if result.already_running else f"ready in {result.seconds:.1f} s"
        click.echo(f"{result.name:10} {result.address:22} pid {result.pid:<8} {how}")
    if not no_init:
        _init(settings, _names(services))
    click.echo(f"stack up in {time.monotonic() - t0:.1f} s (data in {settings.data_dir})")


def _init(settings: Settings, names: list[str] | None) -> None:
    from infra import migrations, topics  # noqa: PLC0415

    if names is None or "kafka" in names:
        for topic, state in topics.ensure_topics(settings.kafka).items():
            click.echo(f"topic      {topic:22} {state}")
    if names is None or "cassandra" in names:
        applied = migrations.migrate(settings)
        total = len(migrations.discover())
        click.echo(f"schema     {settings.cassandra.keyspace:22} {len(applied)} migration(s) applied, {total} in total")


@stack.command()
@click.pass_obj
def init(settings: Settings) -> None:
    """Create the topics and apply the CQL migrations on the configured clusters (re-runnable).

    Works against real clusters too: it only uses the client settings.
    """
    _init(settings, None)


@stack.command()
@click.argument("services", nargs=-1, type=SERVICE_CHOICE)
@click.pass_obj
def down(settings: Settings, services: tuple[str, ...]) -> None:
    """Stop the servers this stack started (found by pid file). Data is kept."""
    stopped = local_stack.down(settings, _names(services))
    click.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@stack.command()
@click.pass_obj
def status(settings: Settings) -> None:
    """Show each server's state, address, pid and memory."""
    for st in local_stack.status(settings):
        rss = f"{st.rss_mib:7.0f} MiB" if st.rss_mib is not None else "        -  "
        pid = str(st.pid) if st.pid else "-"
        click.echo(f"{st.name:10} {st.state:9} {st.address:22} pid {pid:<8} {rss}  log {st.log_file}")


@stack.command()
@click.argument("service", type=SERVICE_CHOICE)
@click.option("-n", "--lines", default=40, show_default=True, help="How many lines to show.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines (Ctrl-C to stop).")
@click.option("--stdout", "raw", is_flag=True, help="Show the JVM's stdout/stderr instead of the server log.")
@click.pass_obj
def logs(settings: Settings, service: str, lines: int, follow: bool, raw: bool) -> None:
    """Show a server's log."""
    svc = local_stack.services(settings, [service])[0]
    path = svc.stdout_file if raw else svc.main_log
    if not path.exists():
        click.echo(f"no log yet at {path}")
        return
    for line in local_stack.follow(path, lines=lines, follow_file=follow):
        click.echo(line)


@stack.command()
@click.argument("services", nargs=-1, type=SERVICE_CHOICE)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def reset(settings: Settings, services: tuple[str, ...], yes: bool) -> None:
    """Stop the servers and DELETE their data (all topics, tables and streaming checkpoints)."""
    what = ", ".join(services) if services else "kafka, cassandra and the streaming checkpoints"
    if not yes:
        click.confirm(f"Delete all data of {what} under {settings.data_dir}?", abort=True)
    for path in local_stack.reset(settings, _names(services)):
        click.echo(f"deleted {path}")
