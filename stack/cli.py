"""``trends stack``: fetch, start, stop, inspect and reset the local Kafka + Cassandra (+ Airflow) stack."""

from __future__ import annotations

import shlex
import time

import click

from infra import jars
from infra.admin_cli import init_clusters
from infra.errors import StackError
from infra.settings import Settings
from infra.settings_env import with_env_vars
from stack import control
from stack.airflow.config import AirflowConfig
from stack.airflow.service import Airflow
from stack.process import follow as follow_log


def _known_services(ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    """Reject unknown names as a usage error; node names such as kafka-2 depend on the settings."""
    if value:
        try:
            control.services(ctx.find_object(Settings) or Settings(), value)
        except StackError as exc:
            raise click.BadParameter(str(exc)) from exc
    return value


SERVICES_ARG = click.argument("services", nargs=-1, callback=_known_services)
WITH_AIRFLOW = click.option(
    "--with-airflow", is_flag=True, help="Include Airflow (API server, scheduler, DAG processor) with the defaults."
)


def _names(services: tuple[str, ...], *, with_airflow: bool = False) -> list[str] | None:
    if services:
        return list(services)
    return [*control.SERVICES, "airflow"] if with_airflow else None


@click.group()
def stack() -> None:
    """Run the local single-node Kafka (KRaft) and Cassandra, from jars fetched with Maven, and Airflow on request."""


@stack.command()
@click.option("--force", is_flag=True, help="Fetch again even if the cached jars are current.")
@click.option(
    "--with-registry",
    is_flag=True,
    help="Also the schema registry (Apicurio, 160 MB; else fetched at its first start).",
)
@click.pass_obj
def fetch(settings: Settings, force: bool, with_registry: bool) -> None:
    """Fetch Kafka, Cassandra and the Spark Kafka connector into the jar cache (once; `admin jars` is the last)."""
    for name, path in jars.fetch_all(settings, force=force, on_demand=with_registry).items():
        click.echo(f"{name:12} {len(list(path.glob('*.jar'))):4d} jars  {path}")


@stack.command()
@SERVICES_ARG
@WITH_AIRFLOW
@click.option("--no-init", is_flag=True, help="Do not create topics and apply CQL migrations after start.")
@click.pass_obj
def up(settings: Settings, services: tuple[str, ...], with_airflow: bool, no_init: bool) -> None:
    """Start the servers (Kafka and Cassandra by default), wait until they accept clients, create topics and schema.

    Airflow starts only when named (`up airflow`) or with --with-airflow. Running servers are left alone, so a
    second `up` is a no-op. Data survives `down`/`up`.
    """
    t0 = time.monotonic()
    names = _names(services, with_airflow=with_airflow)
    for result in control.up(settings, names):
        how = "already running" if result.already_running else f"ready in {result.seconds:.1f} s"
        click.echo(f"{result.name:14} {result.address:22} pid {result.pid:<8} {how}")
    if not no_init:
        _init(settings, names)
    if names and "airflow" in names:
        airflow = AirflowConfig(settings)
        click.echo(f"airflow    {airflow.login_hint()}")
        click.echo(f'airflow    DAGs from {airflow.dags_folder}; CLI: eval "$(trends stack airflow-env)"; airflow …')
    click.echo(f"stack up in {time.monotonic() - t0:.1f} s (data in {settings.data_dir})")


def _init(settings: Settings, names: list[str] | None, *, apply_topic_config: bool = False) -> None:
    from infra.privacy.subjects import ensure_key_file

    # The local stack's producers key the hash of user ids with this secret; a deployment brings its own.
    if settings.privacy.pseudonymise and ensure_key_file(settings.subject_key_path):
        click.echo(f"privacy    created the subject key {settings.subject_key_path} (mode 0600)")
    init_clusters(
        settings,
        kafka=names is None or "kafka" in names,
        cassandra=names is None or "cassandra" in names,
        apply_topic_config=apply_topic_config,
    )


@stack.command()
@click.option(
    "--apply-topic-config",
    is_flag=True,
    help="Set the configured configs (retention, min ISR, timestamps) on existing topics too; prints each change.",
)
@click.pass_obj
def init(settings: Settings, apply_topic_config: bool) -> None:
    """Create the topics and apply the CQL migrations on the local stack (re-runnable): `trends admin init`."""
    _init(settings, None, apply_topic_config=apply_topic_config)


@stack.command(context_settings={"ignore_unknown_options": True})
@click.option("--node", default=0, show_default=True, help="Which Cassandra node (0 is the seed).")
@click.argument("args", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_obj
def nodetool(settings: Settings, node: int, args: tuple[str, ...]) -> None:
    """Run Cassandra's nodetool against a local node (e.g. `flush`, `garbagecollect KEYSPACE TABLE`, `drain`)."""
    from stack.services.cassandra import Cassandra

    click.echo(Cassandra(settings, node).nodetool(*args), nl=False)


@stack.command()
@SERVICES_ARG
@click.pass_obj
def down(settings: Settings, services: tuple[str, ...]) -> None:
    """Stop the servers this stack started (found by pid file), Airflow included when it runs. Data is kept."""
    stopped = control.down(settings, _names(services))
    click.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@stack.command()
@click.pass_obj
def status(settings: Settings) -> None:
    """Show each server's state, address, pid and memory (Airflow's: all its processes together)."""
    for st in control.status(settings, control.ALL_SERVICES):
        rss = f"{st.rss_mib:7.0f} MiB" if st.rss_mib is not None else "        -  "
        pid = str(st.pid) if st.pid else "-"
        detail = f"  {st.detail}" if st.detail else ""
        click.echo(f"{st.name:14} {st.state:9} {st.address:22} pid {pid:<8} {rss}  log {st.log_file}{detail}")


@stack.command()
@click.argument("service", callback=lambda ctx, param, value: _known_services(ctx, param, (value,))[0])
@click.option("-n", "--lines", default=40, show_default=True, help="How many lines to show.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines (Ctrl-C to stop).")
@click.option("--stdout", "raw", is_flag=True, help="Show the JVM's stdout/stderr instead of the server log.")
@click.option(
    "-c",
    "--component",
    type=click.Choice(["scheduler", "api-server", "dag-processor", "triggerer", "migrate"]),
    help="Airflow only: whose output to show (default: the scheduler).",
)
@click.pass_obj
def logs(settings: Settings, service: str, lines: int, follow: bool, raw: bool, component: str | None) -> None:
    """Show a server's log (Airflow: one component's output; task logs are in the UI)."""
    svc = control.services(settings, [service])[0]
    path = svc.stdout_file if raw else svc.main_log
    if component:
        if not isinstance(svc, Airflow):
            msg = "--component applies to airflow only"
            raise click.UsageError(msg)
        path = svc.log_file(component)
    if not path.exists():
        click.echo(f"no log yet at {path}")
        return
    for line in follow_log(path, lines=lines, follow_file=follow):
        click.echo(line)


@stack.command()
@SERVICES_ARG
@WITH_AIRFLOW
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def reset(settings: Settings, services: tuple[str, ...], with_airflow: bool, yes: bool) -> None:
    """Stop the servers and DELETE their data (all topics, tables and streaming checkpoints).

    Airflow's metadata DB and task logs only when asked: `reset airflow` or --with-airflow.
    """
    names = _names(services, with_airflow=with_airflow)
    what = ", ".join(names) if names else "kafka, cassandra"
    if not names or set(control.SERVICES) <= set(names):
        what += " and the streaming checkpoints"
    if not yes:
        click.confirm(f"Delete all data of {what} under {settings.data_dir}?", abort=True)
    for path in control.reset(settings, names):
        click.echo(f"deleted {path}")


@stack.command("airflow-env")
@click.pass_obj
@with_env_vars
def airflow_env(settings: Settings) -> None:
    """Print `export` lines that point the `airflow` CLI at this stack's Airflow.

    Use: eval "$(trends stack airflow-env)"; airflow dags list. Secrets are never printed: the keys and a database
    URL stay in $AIRFLOW_HOME/airflow.cfg, and secret-looking entries of ${airflow.config} (passwords, keys,
    tokens, AIRFLOW_CONN_*, URIs with a password) go to a private file that the printed `.` line reads.
    """
    airflow = AirflowConfig(settings)
    airflow.render_config()  # the keys the CLI needs (JWT secret, Fernet key) must exist before its first run
    plain, secret = airflow.split_secret_env(airflow.airflow_env())
    click.echo(f'export PATH={shlex.quote(str(airflow.bin_dir()))}:"$PATH"')
    for key, value in plain.items():
        click.echo(f"export {key}={shlex.quote(value)}")
    if secret:
        path = airflow.write_secret_env(secret)
        click.echo(f". {shlex.quote(str(path))}  # {len(secret)} secret value(s): {', '.join(secret)}")
