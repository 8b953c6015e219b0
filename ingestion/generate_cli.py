"""``trends ingest generate``: the synthetic stream (:mod:`ingestion.generator`) to Kafka or to a JSON lines file."""

from __future__ import annotations

import contextlib
import gzip
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO, cast

import click

from infra.settings import Settings
from infra.user_time import TIME_HELP, UTC_TIME
from ingestion.cli_options import print_summary, scoped, topic_options, with_pseudonyms

GENERATE_EXAMPLES = """\b
Examples:
  trends ingest generate --rate 2000 --duration 600 --burst '@150:10:2:3' --truth truth.json
  trends ingest generate --start -365d --end -364d --event-rate 50 --fast
  trends ingest generate --fast -n 1000000 -o events.jsonl.gz
"""


def parse_hours(text: str) -> tuple[int, ...]:
    """Parse ``0-7`` or ``0-5,22,23`` into hours.

    :raises click.UsageError: on anything else.
    """
    hours: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            hours += range(int(lo), int(hi or lo) + 1)
    except ValueError as exc:
        msg = f"--quiet-hours {text!r}: expected hours like 0-7 or 0-5,22,23"
        raise click.UsageError(msg) from exc
    return tuple(hours)


@click.command(epilog=GENERATE_EXAMPLES)
@click.option("-n", "--count", type=click.IntRange(min=0), help="Number of events.")
@click.option("--duration", type=click.FloatRange(min=0), help="Seconds: wall clock (live) or event time (historical).")
@click.option("--rate", type=click.FloatRange(min=0), help="Events per second; 0 = as fast as possible. [live: 1000]")
@click.option("--fast", is_flag=True, help="As fast as possible (same as --rate 0).")
@click.option("--start", type=UTC_TIME, help=f"First event time of a historical stream: {TIME_HELP}.")
@click.option("--end", type=UTC_TIME, help="End (exclusive) of a historical stream's event time.")
@click.option("--event-rate", type=click.FloatRange(min=0.001), help="Historical: events per event-time second.")
@click.option(
    "--quiet-hours",
    metavar="H-H[,H]",
    help="Historical: UTC hours of the day without events, e.g. 0-7 (nights) or 0-5,22,23.",
)
@click.option(
    "--gap-every-days", type=click.IntRange(min=0), default=0, help="Historical: every n-th day has no event (n >= 2)."
)
@click.option("--seed", type=int, default=42, show_default=True, help="Random seed: same seed, same stream.")
@click.option("--items", type=click.IntRange(min=1), default=10_000, show_default=True, help="Distinct items.")
@click.option("--zipf", type=float, default=1.1, show_default=True, help="Zipf exponent of item popularity.")
@click.option("--users", type=click.IntRange(min=1), default=100_000, show_default=True, help="Distinct users.")
@click.option(
    "--burst",
    "bursts",
    multiple=True,
    help="Planted trend ITEM:FACTOR:START_MIN:DURATION_MIN, e.g. '#t150:8:10:5' or '@150:8:10:5' (repeatable).",
)
@click.option("--truth", type=click.Path(dir_okay=False, path_type=Path), help="Write the ground truth JSON here.")
@click.option(
    "-o",
    "--output",
    help="Write JSON lines to this file (.gz compresses; '-' = stdout) instead of producing to Kafka.",
)
@topic_options
@click.pass_obj
def generate(
    settings: Settings,
    *,
    count: int | None,
    duration: float | None,
    rate: float | None,
    fast: bool,
    start: datetime | None,
    end: datetime | None,
    event_rate: float | None,
    quiet_hours: str | None,
    gap_every_days: int,
    seed: int,
    items: int,
    zipf: float,
    users: int,
    bursts: tuple[str, ...],
    truth: Path | None,
    output: str | None,
    topic: str | None,
    dlq_topic: str | None,
    key_field: str | None,
) -> None:
    """Generate a synthetic stream: Zipf items, users, values, dimensions and planted bursts.

    Live (default): event time is the wall clock, paced at --rate (1000/s unless --fast). Historical (--start):
    event time runs from --start at --event-rate events per second, produced as fast as possible unless --rate.
    """
    from ingestion.generator_config import Burst, GeneratorConfig, GeneratorError

    settings = scoped(settings, topic, dlq_topic, key_field)
    now = datetime.now(UTC)
    if end is not None and start is None:
        msg = "--end needs --start (a historical stream)"
        raise click.UsageError(msg)
    pace = None if fast or rate == 0 else rate if rate is not None else (None if start else 1000.0)
    try:
        config = GeneratorConfig(
            seed=seed,
            count=count,
            duration_s=duration if start else None,
            rate=pace,
            start=start,
            end=end,
            event_rate=event_rate,
            items=items,
            zipf_s=zipf,
            users=users,
            bursts=tuple(Burst.parse(b) for b in bursts),
            key_field=settings.ingest.key_field,
            quiet_hours=parse_hours(quiet_hours) if quiet_hours else (),
            gap_every_days=gap_every_days,
        )
        config.check(now, timedelta(seconds=settings.ingest.max_future_skew_s))
    except GeneratorError as exc:
        raise click.UsageError(str(exc)) from exc
    wall_duration = None if start else duration
    if output is not None:
        stopped = _generate_to_file(settings, config, output, wall_duration, truth)
    else:
        stopped = _generate_to_kafka(settings, config, wall_duration, truth)
    if stopped:
        sys.exit(130)


def _generate_to_file(
    settings: Settings, config: Any, output: str, wall_duration: float | None, truth: Path | None
) -> bool:
    from ingestion import generator as gen
    from ingestion.progress import Progress, graceful_stop

    stream = gen.SyntheticStream(config)
    progress = Progress(settings.ingest.progress_interval_s)
    total = config.total()
    with graceful_stop() as stopper, _open_output(output) as out:
        stats = gen.run(
            stream,
            gen.jsonl_writer(out),
            rate=config.rate,
            duration_s=wall_duration,
            should_stop=stopper,
            on_progress=lambda s: progress.update(s.emitted, fraction=s.emitted / total if total else None),
            progress_interval_s=settings.ingest.progress_interval_s,
        )
    progress.done()
    if truth is not None:
        gen.write_truth(stream, truth)
    rate_text = f"{stats.emitted / stats.elapsed_s:,.0f} events/s" if stats.elapsed_s else ""
    click.echo(f"wrote {stats.emitted:,} events to {output} in {stats.elapsed_s:.1f} s ({rate_text})", err=True)
    return stats.stopped


def _generate_to_kafka(settings: Settings, config: Any, wall_duration: float | None, truth: Path | None) -> bool:
    from ingestion import generator as gen
    from ingestion import metrics
    from ingestion.producer import DeliveryError, EventProducer
    from ingestion.progress import Progress, graceful_stop

    progress = Progress(settings.ingest.progress_interval_s)
    total = config.total()
    producer = EventProducer(settings, success_reports=False)  # no acks per record here: failures are still reported
    producer.check_topics()
    # Users are pseudonymised as each chunk is made (privacy.pseudonymise); a file (-o) keeps the generated ids.
    stream = gen.SyntheticStream(config, pseudonymiser=producer.pseudonymiser)
    try:
        with graceful_stop() as stopper, metrics.serving(settings, lambda: producer.summary, "generate"):
            stats = gen.run(
                stream,
                lambda c: producer.produce_many(c.values, c.keys, c.ts_ms),
                rate=config.rate,
                duration_s=wall_duration,
                wait=producer.poll,
                should_stop=stopper,
                on_progress=lambda s: progress.update(
                    s.emitted, producer.summary, fraction=s.emitted / total if total else None
                ),
                progress_interval_s=settings.ingest.progress_interval_s,
            )
            producer.summary.interrupted = stats.stopped
            progress.done()
            summary = producer.close()  # flushes; raises DeliveryError after the last flush
    except DeliveryError as exc:
        progress.done()
        print_summary(exc.summary.lines(), err=False)
        raise
    finally:
        if truth is not None:
            gen.write_truth(stream, truth)
    print_summary(with_pseudonyms(summary.lines(), producer), err=False)
    if truth is not None:
        click.echo(f"ground truth: {truth}")
    return stats.stopped


@contextlib.contextmanager
def _open_output(output: str) -> Iterator[BinaryIO]:
    if output == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
    elif output.endswith(".gz"):
        with gzip.open(output, "wb", compresslevel=4) as fh:
            yield cast("BinaryIO", fh)
    else:
        with Path(output).open("wb") as fh:
            yield fh
