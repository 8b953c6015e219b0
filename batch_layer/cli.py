"""``trends batch``: recompute closed hours, inspect lineage and the watermark, pin the serving boundary."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from infra.settings import Settings


class UtcTime(click.ParamType[datetime, Any]):
    """An ISO-8601 time with an offset or Z."""

    name = "time"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        """Parse the value or fail with a usage error."""
        if isinstance(value, datetime):
            return value
        try:
            ts = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            self.fail(f"{value!r} is not an ISO-8601 time (e.g. 2026-05-01T10:00Z)", param, ctx)
        if ts.tzinfo is None:
            self.fail(f"{value!r} has no time zone: add Z or +hh:mm", param, ctx)
        return ts


UTC_TIME = UtcTime()


@click.group()
def batch() -> None:
    """Recompute closed hours from Kafka offsets into the batch view (the source of truth)."""


@batch.command()
@click.option("--start", required=True, type=UTC_TIME, help="First hour (inclusive), e.g. 2026-05-01T00:00Z.")
@click.option("--end", required=True, type=UTC_TIME, help="End (exclusive), a whole hour.")
@click.option("--force", is_flag=True, help="Compute even if the interval is not closed yet.")
@click.pass_obj
def run(settings: Settings, start: datetime, end: datetime, force: bool) -> None:
    """Recompute every hour of [START, END) and advance the batch watermark.

    A rerun replaces an hour's version atomically for readers. Refuses an hour that is not closed
    (unless --force) and one whose offsets Kafka no longer holds.
    """
    from batch_layer.job import hours_between
    from batch_layer.job import run as run_batch

    list(hours_between(start, end))  # validate before starting Spark
    for result in run_batch(settings, start, end, force=force):
        click.echo(result.line())
        click.echo(f"  offsets {result.offsets}  watermark {result.watermark}")


@batch.command()
@click.option("--hours", default=6, show_default=True, help="How many recent watermark hours to list runs of.")
@click.pass_obj
def status(settings: Settings, hours: int) -> None:
    """Show the batch watermark, the pin and the latest runs below it."""
    from batch_layer.store import HOUR, BatchStore
    from infra.cassandra import READ_PROFILE, session, table

    with session(settings) as sess:
        store = BatchStore(settings, sess)
        low, mark, pinned = store.watermark()
        click.echo(f"batch watermark: [{low}, {mark})  pinned: {pinned or '-'}")
        if mark is None:
            return
        runs = sess.prepare(
            f"SELECT run_id, status, rows_read, rows_kept, rows_deduped, rows_late, offsets, code_version "
            f"FROM {table(settings, 'batch_runs')} WHERE hour = ? LIMIT 3"
        )
        for i in range(1, hours + 1):
            hour = mark - i * HOUR
            for r in sess.execute(runs, (hour,), execution_profile=READ_PROFILE):
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
    from batch_layer.store import BatchStore
    from infra.cassandra import session

    if clear == (at is not None):
        msg = "give exactly one of --at or --clear"
        raise click.UsageError(msg)
    with session(settings) as sess:
        BatchStore(settings, sess).pin(None if clear else at)
    click.echo("pin cleared" if clear else f"boundary pinned at {at}")
