"""``trends speed``: run the streaming job and inspect its freshness."""

from __future__ import annotations

import click

from infra.settings import Settings
from infra.settings_env import env_var


@click.group()
def speed() -> None:
    """Run and inspect the speed layer (Spark Structured Streaming from Kafka into the Cassandra speed view)."""


@speed.command()
@click.option("--available-now", is_flag=True, help="Process what is in the topic now, then stop (no waiting).")
@click.option("--trigger", type=click.FloatRange(min=0.1), help="Micro-batch interval in seconds (setting default).")
@click.option("--max-offsets", type=click.IntRange(min=1), help="Most records per micro-batch (setting default).")
@click.option("--starting-offsets", help="earliest, latest or per-partition JSON; only for a query without checkpoint.")
@click.option(
    "--from-watermark/--no-from-watermark",
    default=None,
    help="Where a new checkpoint starts: at the batch watermark (offsets from the event-time index, indexed first; "
    f"records below it are skipped), or at --starting-offsets. Default: {env_var('speed.from_watermark')} (on); "
    "ignored once a checkpoint exists.",
)
@click.option("--max-seconds", type=click.FloatRange(min=1), help="Stop gracefully after this many seconds.")
@click.pass_obj
def run(
    settings: Settings,
    available_now: bool,
    trigger: float | None,
    max_offsets: int | None,
    starting_offsets: str | None,
    from_watermark: bool | None,
    max_seconds: float | None,
) -> None:
    """Run the streaming job until Ctrl-C/SIGTERM (the running micro-batch finishes first).

    Restarting resumes from the checkpoint; a crash never loses or double counts a bucket.
    """
    from speed_layer.job import checkpoint_location
    from speed_layer.job import run as run_job

    overrides = {
        k: v
        for k, v in {
            "trigger_seconds": trigger,
            "max_offsets_per_trigger": max_offsets,
            "starting_offsets": starting_offsets,
            "from_watermark": from_watermark,
        }.items()
        if v is not None
    }
    if overrides:
        settings = settings.model_copy(update={"speed": settings.speed.model_copy(update=overrides)})
    click.echo(
        f"speed layer: {settings.kafka.events_topic} -> {settings.cassandra.keyspace}.speed_minutes, query "
        f"{settings.speed.query_name} (checkpoint {checkpoint_location(settings)})",
        err=True,
    )
    summary = run_job(settings, available_now=available_now, max_seconds=max_seconds)
    if summary.demoted_by is not None:
        click.echo(
            f"{settings.speed.query_name} no longer serves answers: {summary.demoted_by} was promoted "
            "(trends speed promote); stopped, its rows expire by their TTL",
            err=True,
        )
    if summary.begin is not None:
        b = summary.begin
        click.echo(
            f"checkpoint started from the batch watermark {b.since.isoformat()}: offsets {b.spark_offsets()}, "
            f"{b.to_read} of the topic's {b.topic_records} records after them when it started; this run skipped "
            f"{summary.skipped_below_watermark_rows} events below it",
            err=True,
        )
    click.echo(
        f"stopped after {summary.seconds:.0f} s: {summary.batches} batches, {summary.input_rows} rows read, "
        f"{summary.dropped_late_rows} dropped as too late, {summary.unparseable_rows} unparseable, "
        f"{summary.future_rows} beyond now + skew (not aggregated)",
        err=True,
    )


@speed.command()
@click.pass_obj
def status(settings: Settings) -> None:
    """Show the speed view's freshness (newest event time written, watermark, last batch) and the checkpoint."""
    from infra.cassandra import session
    from infra.speed_checkpoint import checkpoint_state
    from views.store.speed import SpeedRows

    click.echo(f"{settings.speed.query_name}: {checkpoint_state(settings).describe()}")

    with session(settings) as sess:
        rows = SpeedRows(settings, sess).progress()
    if not rows:
        click.echo("the speed layer has not written anything yet")
        return
    for r in rows:
        click.echo(
            f"{r.query}: newest event {r.newest_event_ts}, watermark {r.watermark}, "
            f"batch {r.last_batch_id} ({r.last_batch_rows} bucket rows) written at {r.updated_at}"
        )


@speed.command()
@click.argument("query")
@click.pass_obj
def promote(settings: Settings, query: str) -> None:
    """Make QUERY (a speed query running a new view definition) the one answers come from.

    Refused (usage error) until its current epoch has caught up: it has read as far as the serving query, and it
    counts every minute from the batch boundary (watermark or pin) on. The switch is one lightweight transaction;
    the replaced query notices within speed.serving_check_s and stops, its rows expire by their TTL.
    """
    from infra.cassandra import session
    from speed_layer.promote import promote_problems, read_versions
    from views.store.definitions import DefinitionStore

    with session(settings) as sess:
        v = read_versions(settings, sess, query)
        problems = promote_problems(query, v.serving, v.green, v.blue, v.boundary)
        if problems:
            raise click.UsageError(f"cannot promote {query}: " + "; ".join(problems))
        assert v.green is not None and v.green.definition is not None  # noqa: S101 - promote_problems checked it
        applied, now = DefinitionStore(settings, sess).promote(query, v.green.definition, v.serving)
    if not applied:
        msg = f"another promote won meanwhile: {now.describe()} serves answers now (nothing changed)"
        raise click.ClickException(msg)
    click.echo(f"serving view version: {v.serving.describe()} -> {now.describe()}")


@speed.command()
@click.pass_obj
def versions(settings: Settings) -> None:
    """Show the view versions: the serving speed query and every other one, with their progress."""
    from infra.cassandra import session
    from views.store.definitions import DefinitionStore
    from views.store.pointers import PointerStore
    from views.store.speed import SpeedRows

    with session(settings) as sess:
        serving = DefinitionStore(settings, sess).serving()
        speed = SpeedRows(settings, sess)
        queries = sorted({r.query for r in speed.progress()} | {serving.query})
        boundary = PointerStore(settings, sess).watermark().boundary
        click.echo(f"batch boundary {boundary.isoformat() if boundary else 'none yet'}")
        for q in queries:
            epochs = speed.epochs(q)
            e = max(epochs, key=lambda x: x.started_at, default=None)
            role = "SERVING" if q == serving.query else "standby"
            if e is None:
                click.echo(f"{role:8} {q}: no epoch")
                continue
            click.echo(
                f"{role:8} {q}: definition {e.definition or 'not recorded'}, epoch {e.id} counts from "
                f"{e.counts_from.isoformat() if e.counts_from else 'nothing'}, seen until "
                f"{e.seen_until.isoformat() if e.seen_until else 'nothing'}, read the whole topic as of "
                f"{e.read_all_at.isoformat() if e.read_all_at else 'never yet'}"
            )
