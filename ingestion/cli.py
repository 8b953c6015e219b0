"""``trends ingest``: generate synthetic events, replay files, and inspect the dead-letter topic."""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

import click

from infra.settings import Settings
from infra.settings_env import env_var, with_env_vars
from infra.user_time import TIME_HELP, UTC_TIME

logger = logging.getLogger(__name__)


def scoped(
    settings: Settings, topic: str | None, dlq_topic: str | None, key_field: str | None, **ingest: Any
) -> Settings:
    """Return settings with the CLI's topic, key and producer overrides applied."""
    kafka = {k: v for k, v in (("events_topic", topic), ("dlq_topic", dlq_topic)) if v}
    ingest = {k: v for k, v in ingest.items() if v is not None}
    if key_field:
        ingest["key_field"] = key_field
    return settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(update=kafka),
            "ingest": settings.ingest.model_copy(update=ingest),
        }
    )


def _topic_options(fn: Any) -> Any:
    fn = click.option("--topic", help=f"Events topic (default: {env_var('kafka.events_topic')}).")(fn)
    fn = click.option("--dlq-topic", help=f"Dead-letter topic (default: {env_var('kafka.dlq_topic')}).")(fn)
    fn = click.option(
        "--key-field",
        type=click.Choice(["item", "user", "id", "none"]),
        help=f"Field that keys the records (default: {env_var('ingest.key_field')}).",
    )(fn)
    return fn


def _mapping_options(noun: str) -> Callable[[Any], Any]:
    """Return the decorator of the options that build a :class:`~ingestion.mapping.ColumnMapping`.

    :arg noun: what the source calls a field: ``column`` (files) or ``field`` (records of other topics, whose
        dimensions are a map and whose times may be Avro or Protobuf timestamps).
    """
    records = noun == "field"
    dims_kind = "a map" if records else "a JSON object"
    stamps = ", Avro/Protobuf timestamps" if records else ""

    def decorate(fn: Any) -> Any:
        fn = click.option("--assume-tz", help="IANA zone of times written without an offset (default: reject them).")(
            fn
        )
        fn = click.option(
            "--time-format",
            default="auto",
            show_default=True,
            help=f"auto (ISO with offset, epoch s/ms{stamps}), iso, epoch_s, epoch_ms, epoch_us, or a strptime "
            "pattern.",
        )(fn)
        fn = click.option(
            "--dims-column",
            default="dims",
            show_default=True,
            help=f"{noun.capitalize()} holding {dims_kind} of dimensions.",
        )(fn)
        fn = click.option(
            "--dim", "dims", multiple=True, metavar="NAME[=COLUMN]", help=f"A {noun} to use as a dimension."
        )(fn)
        return click.option(
            "-m",
            "--map",
            "pairs",
            multiple=True,
            metavar="FIELD=COLUMN",
            help=f"Source {noun} of an event field (id, ts, item, user, value); repeatable. Unmapped fields use their "
            "name; dotted paths reach into nested records.",
        )(fn)

    return decorate


def _print_summary(lines: list[str], *, err: bool) -> None:
    from infra.security import escape_text

    for line in lines:
        click.echo(escape_text(line), err=err)


def _with_pseudonyms(lines: list[str], producer: Any) -> list[str]:
    """Add the pseudonym counts of a run (no ids: counts only) when it pseudonymised."""
    if producer.pseudonymiser is None:
        return lines
    return [*lines, producer.pseudonymiser.stats.line()]


@click.group()
def ingest() -> None:
    """Feed events into Kafka: a synthetic stream, files of past events, stdin; inspect dead letters.

    Every record reaches the events topic once or the dead-letter topic with a reason; a summary (sent, failed,
    invalid per reason, events/s) ends each run. Ctrl-C stops reading and flushes what is queued.
    """


GENERATE_EXAMPLES = """\b
Examples:
  trends ingest generate --rate 2000 --duration 600 --burst '@150:10:2:3' --truth truth.json
  trends ingest generate --start -365d --end -364d --event-rate 50 --fast
  trends ingest generate --fast -n 1000000 -o events.jsonl.gz
"""
FILE_EXAMPLES = """\b
Examples:
  trends ingest file events.jsonl.gz
  trends ingest file clicks.csv -m id=event_id -m ts=timestamp -m item=page -m user=uid \\
      -m value=latency_ms --dim country --time-format epoch_ms --speed 60
  zcat old.jsonl.gz | trends ingest file -
"""
DLQ_EXAMPLES = """\b
Examples:
  trends ingest dlq
  trends ingest dlq --since -1h --reason bad_time --raw-out fix-me.jsonl
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


@ingest.command(epilog=GENERATE_EXAMPLES)
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
@_topic_options
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
    producer = EventProducer(settings)
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
        _print_summary(exc.summary.lines(), err=False)
        raise
    finally:
        if truth is not None:
            gen.write_truth(stream, truth)
    _print_summary(_with_pseudonyms(summary.lines(), producer), err=False)
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


@ingest.command(name="file", epilog=FILE_EXAMPLES)
@click.argument("path")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv"]), help="Input format (default: from the name).")
@_mapping_options("column")
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
@_topic_options
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
    producer = EventProducer(settings)
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
        _print_summary(exc.summary.lines(), err=False)
        raise
    lines = [f"read      {stats.records:>12,} records from {path}", *summary.lines()]
    _print_summary(_with_pseudonyms(lines, producer), err=False)
    if stats.stopped:
        sys.exit(130)


COLLECT_EXAMPLES = """\b
Examples:
  trends collect
  curl -s -H 'Content-Type: application/json' -d '[{"ts": "2026-11-27T10:00:00Z", "item": "#a", "user": "u1"}]' \\
      http://127.0.0.1:8010/api/v1/events
  gzip -c events.jsonl | curl -s -H 'Content-Type: application/x-ndjson' -H 'Content-Encoding: gzip' \\
      --data-binary @- http://127.0.0.1:8010/api/v1/events
"""


@click.command(epilog=COLLECT_EXAMPLES)
@click.option("--host", help="Bind address (default: collector.host, loopback).")
@click.option("--port", type=click.IntRange(0, 65535), help="Port (default: collector.port).")
@click.option(
    "--insecure",
    is_flag=True,
    help="Bind a non-loopback address without an API token (or with a short one); logs a warning.",
)
@_topic_options
@click.pass_obj
@with_env_vars
def collect(
    settings: Settings,
    *,
    host: str | None,
    port: int | None,
    insecure: bool,
    topic: str | None,
    dlq_topic: str | None,
    key_field: str | None,
) -> None:
    """Serve the HTTP collector: POST /api/v1/events puts a batch of events into Kafka.

    The body is a JSON array of events (application/json) or JSON lines (application/x-ndjson), gzip allowed;
    each record is validated as `trends ingest file` does. The answer comes once Kafka acknowledged every record:
    200 with the accepted and rejected counts (rejects go to the dead-letter topic with their reason), or 503 with
    Retry-After. Requests need ${serving.api_token} when it is set; off loopback it must be set.
    `trends collect` and `trends ingest collect` are the same command.
    """
    from infra.errors import TrendsError
    from infra.security import refuse_exposure
    from ingestion.producer import EventProducer

    settings = scoped(settings, topic, dlq_topic, key_field)
    host = host if host is not None else settings.collector.host
    port = port if port is not None else settings.collector.port
    refuse_exposure(
        "the collector",
        host,
        settings.serving.api_token,
        host_var=f"--host/{env_var('collector.host')}",
        insecure=insecure,
        risk="write events",
    )
    # Missing topics are a set-up error, found now (after a short wait: topics just created may not be in the
    # broker's metadata yet); an unreachable broker is not: requests get 503 until it is back.
    probe = EventProducer(settings)
    deadline = time.monotonic() + settings.collector.delivery_timeout_s
    try:
        while True:
            try:
                probe.check_topics(timeout_s=settings.collector.delivery_timeout_s)
                break
            except TrendsError as exc:
                if "do not exist" not in str(exc):
                    logger.warning("starting without Kafka (%s): requests get 503 until it answers", exc)
                    break
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        probe.close(5, raise_on_failure=False)

    import uvicorn

    from ingestion.collector import EVENTS_PATH, create_app

    click.echo(f"collector http://{host}:{port}{EVENTS_PATH}  metrics http://{host}:{port}/metrics", err=True)
    uvicorn.run(create_app(settings), host=host, port=port, log_level=settings.log_level.lower(), access_log=False)


ingest.add_command(collect)


KAFKA_EXAMPLES = """\b
Examples:
  trends ingest kafka --from clicks --format json -m id=event_id -m ts=timestamp -m item=page -m user=uid
  trends ingest kafka --from orders.v1 --from orders.v2 --format avro -m item=sku -m user=customer.id
  trends ingest kafka --from telemetry --format protobuf --group telemetry-bridge --dim region
"""


@ingest.command(name="kafka", epilog=KAFKA_EXAMPLES)
@click.option(
    "--from",
    "sources",
    multiple=True,
    metavar="TOPIC",
    help=f"A topic to read (repeatable), as the consumer group --group. Default: {env_var('bridge.sources')}.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "avro", "protobuf"]),
    help=f"json: plain JSON; avro, protobuf: Confluent wire format, schemas from {env_var('registry.url')}. "
    f"Default: {env_var('bridge.format')}.",
)
@_mapping_options("field")
@click.option("--group", help=f"Consumer group on the source topics (default: {env_var('bridge.group_id')}).")
@click.option(
    "--transactional-id",
    help="transactional.id of the producer (default: <group>.bridge); each bridge of one group needs its own.",
)
@click.option(
    "--idle-exit",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Stop after this many seconds without a record (catch up, then exit). Default: run until stopped.",
)
@click.option("--no-progress", is_flag=True, help="Do not print progress lines.")
@_topic_options
@click.pass_obj
def kafka(
    settings: Settings,
    *,
    sources: tuple[str, ...],
    fmt: str | None,
    pairs: tuple[str, ...],
    dims: tuple[str, ...],
    dims_column: str,
    time_format: str,
    assume_tz: str | None,
    group: str | None,
    transactional_id: str | None,
    idle_exit: float | None,
    no_progress: bool,
    topic: str | None,
    dlq_topic: str | None,
    key_field: str | None,
) -> None:
    """Bridge other Kafka topics into the events topic, exactly once, until stopped (SIGTERM/Ctrl-C: clean stop).

    Each batch of source records becomes one Kafka transaction holding its events, its dead letters (with the
    source topic, partition and offset) and the group's offsets: a kill at any point neither loses nor duplicates
    an event. Readers of the events topic must read committed records only (the speed and batch layers do).
    """
    from ingestion import metrics
    from ingestion.bridge import Bridge, BridgeError
    from ingestion.mapping import ColumnMapping, MappingError
    from ingestion.progress import Progress, graceful_stop
    from ingestion.wire import Format

    settings = scoped(settings, topic, dlq_topic, key_field)
    bridge_update = {k: v for k, v in (("group_id", group), ("transactional_id", transactional_id)) if v}
    settings = settings.model_copy(update={"bridge": settings.bridge.model_copy(update=bridge_update)})
    sources = sources or tuple(settings.bridge.sources)
    if not sources:
        msg = f"name the topics to read: --from TOPIC (or {env_var('bridge.sources')})"
        raise click.UsageError(msg)
    try:
        mapping = ColumnMapping.parse(
            pairs or settings.bridge.mapping,
            dims or settings.bridge.dims,
            dims_column=dims_column or None,
            time_format=time_format,
            assume_tz=assume_tz,
        )
    except MappingError as exc:
        raise click.UsageError(str(exc)) from exc
    progress = Progress(settings.ingest.progress_interval_s, enabled=not no_progress)
    bridge = Bridge(settings, sources, cast("Format", fmt or settings.bridge.format), mapping)
    try:
        with graceful_stop() as stopper, metrics.serving(settings, lambda: bridge.stats.summary, "kafka"):
            try:
                stats = bridge.run(
                    stopper,
                    idle_exit_s=idle_exit,
                    on_batch=lambda st: progress.update(st.records, st.summary),
                )
            finally:
                progress.done()
                bridge.close()
    except BridgeError as exc:
        del exc
        _print_summary(bridge.stats.lines(), err=False)
        raise
    _print_summary(stats.lines(), err=False)


@ingest.command(epilog=DLQ_EXAMPLES)
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
