"""``trends ingest dlq``: the dead-letter topic read back, counted by reason and source, sampled to fix and replay."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import click

from infra.settings import Settings
from infra.settings_env import env_var
from infra.user_time import TIME_HELP, UTC_TIME

DLQ_EXAMPLES = """\b
Examples:
  trends ingest dlq
  trends ingest dlq --since -1h --reason bad_time --raw-out fix-me.jsonl
"""


@click.command(epilog=DLQ_EXAMPLES)
@click.option("--topic", help=f"Dead-letter topic (default: {env_var('kafka.dlq_topic')}).")
@click.option("--since", type=UTC_TIME, help=f"Only records rejected since: {TIME_HELP}.")
@click.option("--reason", help="Only this reason code.")
@click.option("--limit", type=click.IntRange(min=1), help="Read at most this many records.")
@click.option("--samples", type=click.IntRange(min=0), default=3, show_default=True, help="Samples per reason.")
@click.option("--json", "as_json", is_flag=True, help="Print every matching record as a JSON line instead.")
@click.option(
    "--raw-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the original bytes of matching records here, one per line, to fix and replay.",
)
@click.pass_obj
def dlq(
    settings: Settings,
    *,
    topic: str | None,
    since: datetime | None,
    reason: str | None,
    limit: int | None,
    samples: int,
    as_json: bool,
    raw_out: Path | None,
) -> None:
    """Show the dead-letter records: counts per reason and source, and samples to fix and replay."""
    from infra.security import escape_json, escape_text
    from ingestion.dlq import read_dead_letters, report

    letters = read_dead_letters(settings, topic, since=since, limit=limit)
    selected = (x for x in letters if reason is None or x.reason == reason)
    raw_fh: IO[bytes] | None = raw_out.open("wb") if raw_out else None
    try:

        def tee() -> Iterator[Any]:
            for letter in selected:
                if raw_fh is not None:
                    raw_fh.write(letter.raw + b"\n")
                if as_json:
                    click.echo(escape_json(json.dumps(_letter_dict(letter), ensure_ascii=False)))
                yield letter

        result = report(tee(), samples_per_reason=samples)
    finally:
        if raw_fh is not None:
            raw_fh.close()
    if as_json:
        return
    name = topic or settings.kafka.dlq_topic
    # Everything below comes from the records (reasons, sources, details, raw bytes): printed with control
    # characters escaped, so a record cannot drive the terminal.
    shown = escape_text(f"{name}" + (f" with reason {reason}" if reason else ""))
    click.echo(f"{result.total:,} dead-letter record(s) in {shown}")
    if result.total:
        click.echo("\nby reason:")
        for code, n in result.by_reason.most_common():
            click.echo(f"  {escape_text(code):<20} {n:>10,}")
        click.echo("\nby source:")
        for source, n in result.by_source.most_common(10):
            click.echo(f"  {escape_text(source):<50} {n:>10,}")
    for code, kept in result.samples.items():
        if not kept:
            continue
        click.echo(f"\n{escape_text(code)}:")
        for letter in kept:
            where = f"{letter.source}:{letter.line}" if letter.line is not None else letter.source
            raw = letter.raw[:160].decode("utf-8", "backslashreplace")
            more = f" … ({letter.raw_size:,} bytes)" if letter.raw_size > 160 else ""
            click.echo(f"  {escape_text(where)}  {escape_text(letter.detail[:160])}\n    {escape_text(raw)}{more}")
    if raw_out is not None:
        click.echo(f"\nwrote the original records to {raw_out}")


def _letter_dict(letter: Any) -> dict[str, Any]:
    from views.event import format_ts

    return {
        "reason": letter.reason,
        "detail": letter.detail,
        "source": letter.source,
        "line": letter.line,
        "rejected_at": format_ts(letter.rejected_at),
        "raw": letter.raw.decode("utf-8", "backslashreplace"),
        "raw_size": letter.raw_size,
        "truncated": letter.truncated,
        "partition": letter.partition,
        "offset": letter.offset,
    }
