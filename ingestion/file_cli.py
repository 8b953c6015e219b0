"""``trends ingest file``: replay JSONL or CSV files of events, or stdin, into Kafka (:mod:`ingestion.files`)."""

from __future__ import annotations

import os
import sys

import click

from infra.settings import Settings
from ingestion.cli_options import mapping_options, print_summary, scoped, topic_options, with_pseudonyms

FILE_EXAMPLES = """\b
Examples:
  trends ingest file events.jsonl.gz
  trends ingest file clicks.csv -m id=event_id -m ts=timestamp -m item=page -m user=uid \\
      -m value=latency_ms --dim country --time-format epoch_ms --speed 60
  zcat old.jsonl.gz | trends ingest file -
"""


@click.command(name="file", epilog=FILE_EXAMPLES)
@click.argument("path")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv"]), help="Input format (default: from the name).")
@mapping_options("column")
@click.option(
    "--speed", type=click.FloatRange(min=0, min_open=True), help="Replay paced by event time, N times faster."
)
@click.option("--limit", type=click.IntRange(min=1), help="Stop after this many records.")
@click.option("--no-progress", is_flag=True, help="Do not print progress lines.")
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Processes that parse and validate (0: one per CPU; 1: in this process). Order is kept either way.",
)
@topic_options
@click.pass_obj
def file_(
    settings: Settings,
    *,
    path: str,
    fmt: str | None,
    pairs: tuple[str, ...],
    dims: tuple[str, ...],
    dims_column: str,
    time_format: str,
    assume_tz: str | None,
    speed: float | None,
    limit: int | None,
    no_progress: bool,
    workers: int,
    topic: str | None,
    dlq_topic: str | None,
    key_field: str | None,
) -> None:
    """Replay a JSONL or CSV file (gzip too; '-' reads stdin) of events, historical times included.

    Invalid records go to the dead-letter topic with the original bytes, a reason, the file and line.
    """
    from ingestion import files, metrics
    from ingestion.mapping import ColumnMapping, MappingError
    from ingestion.producer import DeliveryError, EventProducer
    from ingestion.progress import Progress, graceful_stop

    settings = scoped(settings, topic, dlq_topic, key_field)
    try:
        mapping = ColumnMapping.parse(
            pairs, dims, dims_column=dims_column or None, time_format=time_format, assume_tz=assume_tz
        )
        files.detect_format(path, fmt)
    except (MappingError, files.SourceError) as exc:
        raise click.UsageError(str(exc)) from exc
    progress = Progress(settings.ingest.progress_interval_s, enabled=not no_progress)
    producer = EventProducer(settings, success_reports=False)  # no acks per record here: failures are still reported
    producer.check_topics()

    def show(stats: files.ReplayStats, source: files.OpenSource) -> None:
        fraction = source.position() / source.size if source.position and source.size else None
        progress.update(stats.records, producer.summary, fraction=fraction)

    stats = files.ReplayStats()
    try:
        with graceful_stop() as stopper, metrics.serving(settings, lambda: producer.summary, "file"):
            try:
                stats = files.replay(
                    settings,
                    producer,
                    path,
                    fmt=fmt,
                    mapping=mapping,
                    speed=speed,
                    limit=limit,
                    should_stop=stopper,
                    on_progress=show,
                    workers=workers or os.cpu_count() or 1,
                )
            finally:
                producer.summary.interrupted = stopper.stop
                progress.done()
                summary = producer.close()  # flush even when reading failed
    except DeliveryError as exc:
        print_summary(exc.summary.lines(), err=False)
        raise
    lines = [f"read      {stats.records:>12,} records from {path}", *summary.lines()]
    print_summary(with_pseudonyms(lines, producer), err=False)
    if stats.stopped:
        sys.exit(130)
