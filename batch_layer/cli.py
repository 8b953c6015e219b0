"""``trends batch``: recompute closed hours, inspect lineage and the watermark, pin the serving boundary."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from infra.settings import Settings
from infra.user_time import UTC_TIME


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
@click.option(
    "--accept-loss",
    is_flag=True,
    help="Compute incomplete hours (records removed before indexing may belong to them); the lineage records the "
    "accepted loss and the hours are no longer incomplete.",
)
@click.pass_obj
def run(
    settings: Settings, start: datetime | None, end: datetime | None, stale: bool, force: bool, accept_loss: bool
) -> None:
    """Recompute every hour of [START, END) (or the stale hours) and advance the batch watermark.

    Brings the event-time index up to date first, then computes the hours in Spark passes of up to
    batch.chunk_hours hours / batch.chunk_events events, printing a progress line per pass. A rerun replaces an
    hour's version atomically for readers. Refuses a range that is not closed (unless --force), one whose
    offsets Kafka no longer holds, and one with incomplete hours (unless --accept-loss).
    """
    from batch_layer.hours import hours_between
    from batch_layer.job import run as run_batch
    from batch_layer.tasks import stale_hours

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
        results = run_batch(settings, hours=hours, force=True, progress=progress, accept_loss=accept_loss)
    else:
        assert start is not None and end is not None  # noqa: S101 - checked above
        list(hours_between(start, end))  # validate before starting anything
        results = run_batch(settings, start, end, force=force, progress=progress, accept_loss=accept_loss)
    _echo_results(results)


@batch.command()
@click.option(
    "--rebuild",
    is_flag=True,
    help="Drop the topic's index (spans, hour totals, checkpoint) and index the whole topic again from Kafka.",
)
@click.option(
    "--force",
    is_flag=True,
    help="With --rebuild: rebuild even though Kafka removed the first offsets of some partition (they become "
    "losses and their hours incomplete).",
)
@click.pass_obj
def index(settings: Settings, rebuild: bool, force: bool) -> None:
    """Bring the event-time index of the events topic up to date (incremental; safe to kill and rerun).

    With --rebuild, first drop it and read the topic from its first offsets: after an upgrade that changes how the
    index is built, or when its rows were lost or damaged. Pause the DAGs (and other `trends batch index` runs)
    meanwhile; batch runs and pointers are kept, hours whose count differs afterwards turn stale.
    """
    from batch_layer.horizon import horizon
    from views.indexing.indexer import rebuild_index, run_index

    if force and not rebuild:
        msg = "--force only goes with --rebuild"
        raise click.UsageError(msg)

    def progress(r: Any) -> None:
        click.echo(r.line(), err=True)

    if rebuild:
        dropped, result = rebuild_index(settings, force=force, progress=progress)
        click.echo(f"dropped the index of {settings.kafka.events_topic}: {dropped} day(s) of spans; rebuilt from Kafka")
    else:
        result = run_index(settings, progress=progress)
    click.echo(result.line())
    click.echo(horizon(settings).describe())
    if result.losses:
        click.echo("incomplete hours follow from these losses: see `trends batch status`", err=True)


@batch.command()
@click.option("--hours", default=6, show_default=True, help="How many recent watermark hours to list runs of.")
@click.pass_obj
def status(settings: Settings, hours: int) -> None:
    """Show the index horizon, losses, incomplete and stale hours, the watermark, the pin and what it moves.

    Then the latest runs and the last reconciliation of the hours below the watermark.
    """
    from batch_layer.horizon import horizon
    from batch_layer.publish import BatchStore
    from batch_layer.tasks import stale_hours
    from infra.cassandra import session
    from views.buckets import HOUR
    from views.store.checks import Checks
    from views.store.pointers import pinned_hours

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
        current = store.pointers.watermark()
        low, mark, pinned = current
        _echo_losses(settings, store, low, mark)
        click.echo(f"batch watermark: [{low}, {mark})  pinned: {pinned or '-'}")
        moved = pinned_hours(current)
        if moved:
            click.echo(
                f"  the pin serves {len(moved)} hour(s) [{moved[0]:%Y-%m-%dT%H:%MZ}, {mark:%Y-%m-%dT%H:%MZ}) "
                "from the speed view instead of the batch view"
            )
        if mark is None:
            return
        _echo_old_definition(settings, sess, low, mark)
        checks = Checks(settings, sess).of_hours([mark - i * HOUR for i in range(1, hours + 1)])
        for i in range(1, hours + 1):
            hour = mark - i * HOUR
            for r in store.latest_runs(hour, 3):
                accepted = f" accepted loss {r.accepted_loss}" if r.accepted_loss else ""
                click.echo(
                    f"  {hour:%Y-%m-%dT%H:%MZ} {r.status:9} read {r.rows_read} kept {r.rows_kept} "
                    f"dedup {r.rows_deduped} late {r.rows_late} offsets {r.offsets} code {r.code_version}{accepted}"
                )
            check = checks.get(hour)
            if check is not None:
                verdict = "within bounds" if check.ok else f"BEYOND BOUNDS by {check.beyond_bound}"
                click.echo(
                    f"  {hour:%Y-%m-%dT%H:%MZ} reconciled {check.checked_at:%Y-%m-%dT%H:%M:%SZ}: {verdict} "
                    f"({check.details.get('line', '')})"
                )


def _echo_old_definition(settings: Settings, sess: Any, low: datetime | None, mark: datetime) -> None:
    """Print the hours below the watermark computed with another view definition than the serving one."""
    from views.buckets import DAY, HOUR, days_between, floor
    from views.store.definitions import DefinitionStore, other_definition_hours
    from views.store.pointers import PointerStore

    start = max(low or mark, floor(mark - settings.metrics.batch_scan_days * DAY, HOUR))
    serving = DefinitionStore(settings, sess).serving()
    pointers = PointerStore(settings, sess).pointers_indexed(days_between(start, mark))
    old = other_definition_hours({h: p for h, p in pointers.items() if h >= start}, serving.fingerprint, mark)
    click.echo(f"serving view version: {serving.describe()}")
    if not old:
        click.echo("old-definition hours: none (every hour's current run computed with the serving definition)")
        return
    click.echo(
        f"old-definition hours ({len(old)}; served only for the slices their definition defines alike, the others "
        "are gaps until `trends batch run --start ... --end ...` recomputes them):"
    )
    for hour, fp in list(old.items())[:50]:
        click.echo(f"  {hour:%Y-%m-%dT%H:%MZ}: definition {fp}")


def _echo_losses(settings: Settings, store: Any, low: datetime | None, mark: datetime | None) -> None:
    """Print the losses and the incomplete hours of the batch view's span (and up to the last loss's bound)."""
    losses = store.losses.losses(settings.kafka.events_topic)
    if not losses:
        click.echo("losses: none (no records were removed before they were indexed)")
        return
    click.echo(f"losses ({len(losses)}; records removed before they were indexed):")
    for loss in losses:
        click.echo(f"  {loss.describe()}; its hours before {loss.hours_end:%Y-%m-%dT%H:%MZ} are incomplete")
    from views.buckets import DAY

    end = max(x.hours_end for x in losses)
    start = min(low or end, end - DAY)  # nothing bounds lost records from below: the batch view's span, or a day
    incomplete = store.losses.incomplete(settings.kafka.events_topic, start, max(end, mark or end), losses)
    shown = ", ".join(f"{h:%Y-%m-%dT%HZ}" for h in list(incomplete)[:24])
    more = f" … ({len(incomplete)} in all)" if len(incomplete) > 24 else ""
    click.echo(
        f"incomplete hours in [{start:%Y-%m-%dT%HZ}, {end:%Y-%m-%dT%HZ}) (and every earlier hour not accepted): "
        f"{shown or 'none'}{more}; `trends batch run --start … --end … --accept-loss` computes them and accepts "
        "the loss"
    )


@batch.command()
@click.option("--at", "at", type=UTC_TIME, help="Boundary to pin (a whole hour).")
@click.option("--clear", is_flag=True, help="Remove the pin: serving follows the watermark again.")
@click.pass_obj
def pin(settings: Settings, at: datetime | None, clear: bool) -> None:
    """Pin the boundary serving uses (e.g. while a bad batch run is redone), or clear the pin.

    The pin must be a whole hour at or below the batch watermark: [pin, watermark) is then served from the speed
    view (keep speed.view_ttl_s longer than the pin lasts); above the watermark it would make holes.
    """
    from infra.cassandra import session
    from views.store.pointers import PinError, PointerStore, pinned_hours

    if clear == (at is not None):
        msg = "give exactly one of --at or --clear"
        raise click.UsageError(msg)
    with session(settings) as sess:
        pointers = PointerStore(settings, sess)
        try:
            pointers.pin(None if clear else at)
        except PinError as exc:
            raise click.UsageError(str(exc)) from exc
        moved = pinned_hours(pointers.watermark())
    if clear:
        click.echo("pin cleared")
    else:
        click.echo(f"boundary pinned at {at}: {len(moved)} hour(s) up to the watermark are served from the speed view")


from batch_layer.backfill import backfill  # noqa: E402 - registered last, beside the commands above
from batch_layer.exporter import exporter  # noqa: E402 - registered last, beside the commands above

batch.add_command(exporter)
batch.add_command(backfill)
