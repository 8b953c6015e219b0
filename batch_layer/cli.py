"""``trends batch``: recompute closed hours, inspect lineage and the watermark, pin the serving boundary."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from infra.params import UTC_TIME
from infra.settings import Settings


@click.group()
def batch() -> None:
    """Recompute closed hours from Kafka offsets into the batch view (the source of truth)."""


def _echo_results(results: list[Any]) -> None:
    if len(results) <= 48:
        for result in results:
            click.echo(result.line())
            click.echo(f"  offsets {result.offsets}  watermark {result.watermark}")
    if results:
        kept = sum(r.counts.get("kept", 0) for r in results)
        empty = sum(1 for r in results if not r.counts.get("read"))
        click.echo(
            f"{len(results)} hours computed ({empty} empty), {kept:,} events kept; "
            f"batch watermark now {results[-1].watermark}"
        )


@batch.command()
@click.option("--start", type=UTC_TIME, help="First hour (inclusive), e.g. 2026-05-01T00:00Z.")
@click.option("--end", type=UTC_TIME, help="End (exclusive), a whole hour.")
@click.option("--stale", is_flag=True, help="Recompute the hours that received records after their current run.")
@click.option("--force", is_flag=True, help="Compute even if the interval is not closed yet.")
@click.pass_obj
def run(settings: Settings, start: datetime | None, end: datetime | None, stale: bool, force: bool) -> None:
    """Recompute every hour of [START, END) (or the stale hours) and advance the batch watermark.

    Brings the event-time index up to date first, then computes the hours in Spark passes of up to
    batch.chunk_hours hours / batch.chunk_events events, printing a progress line per pass. A rerun replaces an
    hour's version atomically for readers. Refuses a range that is not closed (unless --force) and one whose
    offsets Kafka no longer holds.
    """
    from batch_layer.job import hours_between, stale_hours
    from batch_layer.job import run as run_batch

    if stale == (start is not None or end is not None) or (not stale and (start is None or end is None)):
        msg = "give --start and --end, or --stale"
        raise click.UsageError(msg)

    def progress(p: Any) -> None:
        click.echo(p.line(), err=True)

    if stale:
        hours = list(stale_hours(settings))
        if not hours:
            click.echo("no stale hours")
            return
        click.echo(f"{len(hours)} stale hours: {', '.join(f'{h:%Y-%m-%dT%HZ}' for h in hours[:10])}")
        results = run_batch(settings, hours=hours, force=True, progress=progress)
    else:
        assert start is not None and end is not None  # noqa: S101 - checked above
        list(hours_between(start, end))  # validate before starting anything
        results = run_batch(settings, start, end, force=force, progress=progress)
    _echo_results(results)


@batch.command()
@click.pass_obj
def index(settings: Settings) -> None:
    """Bring the event-time index of the events topic up to date (incremental; safe to kill and rerun)."""
    from batch_layer.index import horizon, run_index

    def progress(r: Any) -> None:
        click.echo(r.line(), err=True)

    click.echo(run_index(settings, progress=progress).line())
    click.echo(horizon(settings).describe())


@batch.command()
@click.option("--hours", default=6, show_default=True, help="How many recent watermark hours to list runs of.")
@click.pass_obj
def status(settings: Settings, hours: int) -> None:
    """Show the batch watermark, the pin, the index horizon, stale hours and the latest runs below the watermark."""
    from batch_layer.index import horizon
    from batch_layer.job import stale_hours
    from batch_layer.store import BatchStore
    from infra.cassandra import session
    from views.buckets import HOUR

    click.echo(horizon(settings).describe())
    stale = stale_hours(settings)
    if stale:
        click.echo(f"stale hours ({len(stale)}; `trends batch run --stale` recomputes them):")
        for hour, (now, read) in list(stale.items())[:50]:
            click.echo(f"  {hour:%Y-%m-%dT%H:%MZ}: {now - read} records arrived since its run ({read} -> {now})")
    else:
        click.echo("stale hours: none")
    with session(settings) as sess:
        store = BatchStore(settings, sess)
        low, mark, pinned = store.pointers.watermark()
        click.echo(f"batch watermark: [{low}, {mark})  pinned: {pinned or '-'}")
        if mark is None:
            return
        for i in range(1, hours + 1):
            hour = mark - i * HOUR
            for r in store.latest_runs(hour, 3):
                click.echo(
                    f"  {hour:%Y-%m-%dT%H:%MZ} {r.status:9} read {r.rows_read} kept {r.rows_kept} "
                    f"dedup {r.rows_deduped} late {r.rows_late} offsets {r.offsets} code {r.code_version}"
                )


@batch.command()
@click.option("--at", "at", type=UTC_TIME, help="Boundary to pin (a whole hour).")
@click.option("--clear", is_flag=True, help="Remove the pin: serving follows the watermark again.")
@click.pass_obj
def pin(settings: Settings, at: datetime | None, clear: bool) -> None:
    """Pin the boundary serving uses (e.g. while a bad batch run is redone), or clear the pin."""
    from infra.cassandra import session
    from views.store.pointers import PointerStore

    if clear == (at is not None):
        msg = "give exactly one of --at or --clear"
        raise click.UsageError(msg)
    with session(settings) as sess:
        PointerStore(settings, sess).pin(None if clear else at)
    click.echo("pin cleared" if clear else f"boundary pinned at {at}")


from batch_layer.backfill import backfill  # noqa: E402 - registered last, beside the commands above
from batch_layer.exporter import exporter  # noqa: E402 - registered last, beside the commands above

batch.add_command(exporter)
batch.add_command(backfill)
