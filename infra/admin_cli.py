"""``trends admin``: set up a deployment's clusters and artifacts — topics and schema, connector jars, DAG files.

These are the commands an operator runs against real clusters (``trends stack`` runs the same ones for the local
stack); they use only the client settings and are re-runnable.
"""

from __future__ import annotations

from pathlib import Path

import click

from infra import jars
from infra.dag_contract import DAG_MODULE, dags_folder
from infra.settings import Settings
from infra.settings_env import with_env_vars

# The one-line DAG file `admin dags --install` writes: Airflow parses files that name both "airflow" and "dag".
DAG_FILE = "trends_dags.py"
DAG_FILE_TEXT = (
    '"""The trends batch DAGs (airflow) of the installed package, written by `trends admin dags --install`."""\n'
    "\n"
    f"from {DAG_MODULE} import backfill_dag, batch_dag, erasure_dag  # noqa: F401\n"
)


def init_clusters(
    settings: Settings, *, kafka: bool = True, cassandra: bool = True, apply_topic_config: bool = False
) -> None:
    """Create the topics and apply the CQL migrations, printing what each step did."""
    from infra import migrations, topics  # noqa: PLC0415 - the clients load only when used

    if kafka:
        changes: list[topics.ConfigChange] = []
        for topic, state in topics.ensure_topics(
            settings.kafka, apply_config=apply_topic_config, changes=changes, privacy=settings.privacy
        ).items():
            click.echo(f"topic      {topic:22} {state}")
        for change in changes:
            if apply_topic_config:
                click.echo(f"topic      changed {change.describe()}")
            else:
                click.echo(
                    f"topic      kept {change.topic} {change.key}={change.current} (settings: {change.wanted}; "
                    "--apply-topic-config applies them)"
                )
    if cassandra:
        applied = migrations.migrate(settings)
        total = len(migrations.discover())
        click.echo(f"schema     {settings.cassandra.keyspace:22} {len(applied)} migration(s) applied, {total} in total")


@click.group()
def admin() -> None:
    """Set up a deployment: topics and schema on the configured clusters, Spark's connector jars, the DAG files."""


@admin.command()
@click.option(
    "--apply-topic-config",
    is_flag=True,
    help="Set the configured configs (retention, min ISR, timestamps) on existing topics too; prints each change.",
)
@click.option("--only", type=click.Choice(["kafka", "cassandra"]), help="Set up one of the two only.")
@click.pass_obj
def init(settings: Settings, apply_topic_config: bool, only: str | None) -> None:
    """Create the topics and apply the CQL migrations on the configured clusters (re-runnable).

    New topics get the configured configs; an existing topic's configs are the operator's (kafka-configs.sh) and
    are only listed where they differ, unless --apply-topic-config. Migrations take a lock, so two deployments
    running init at once apply them once.
    """
    init_clusters(
        settings,
        kafka=only in (None, "kafka"),
        cassandra=only in (None, "cassandra"),
        apply_topic_config=apply_topic_config,
    )


@admin.command("jars")
@click.option("--force", is_flag=True, help="Fetch again even if the cached jars are current.")
@click.pass_obj
@with_env_vars
def fetch_jars(settings: Settings, force: bool) -> None:
    """Fetch Spark's Kafka connector (and spark-avro, with ${kafka.events_format} avro) into the jar cache.

    The cache is ${cache_dir}; Maven fetches once per machine. Every machine that runs a Spark driver needs them:
    the speed job's, and each Airflow worker that runs the batch recompute. Spark ships them to its executors.
    """
    for bundle in jars.job_bundles(settings):
        path = jars.fetch(settings, bundle, force=force)
        click.echo(f"{bundle.name:12} {len(list(path.glob('*.jar'))):4d} jars  {path}")


@admin.command()
@click.option(
    "--install",
    "target",
    type=click.Path(file_okay=False, path_type=Path),
    help=f"Write a one-line DAG file ({DAG_FILE}) importing the package's DAGs into this DAG folder.",
)
def dags(target: Path | None) -> None:
    """Print the installed package's DAG folder (point Airflow's dags_folder at it), or install a one-line DAG file.

    Either way the DAGs run the installed package's code: upgrading the package upgrades them.
    """
    if target is None:
        click.echo(str(dags_folder()))
        return
    target.mkdir(parents=True, exist_ok=True)
    path = target / DAG_FILE
    path.write_text(DAG_FILE_TEXT)
    click.echo(f"wrote {path} (imports {DAG_MODULE} from {dags_folder()})")
