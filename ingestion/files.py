"""Replay files of past events (JSONL or CSV, plain or gzip, or stdin) into the events topic.

Readers work on bytes so a record's original bytes can go to the dead-letter topic untouched, and every read is
bounded: a line longer than the record limit is cut (its start kept, its size counted), a quoted CSV field may
span at most :data:`MAX_CSV_RECORD_LINES` lines. Replay runs as fast as possible, or paced by event time with a
speed-up factor (``speed=60``: an hour of events in a minute).
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import itertools
import logging
import multiprocessing
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO, Final, Literal, cast

from infra.errors import TrendsError
from infra.settings import Settings
from ingestion.mapping import DEFAULT_MAPPING, ColumnMapping
from ingestion.producer import EventProducer
from ingestion.pseudonyms import Pseudonymiser
from ingestion.validate import (
    MAX_RECORD_BYTES,
    Context,
    Outcome,
    Reject,
    encode_json,
    encoded,
    validate_csv,
    validate_json,
)
from views.event import Event

logger = logging.getLogger(__name__)

Format = Literal["jsonl", "csv"]
FORMATS: Final = ("jsonl", "csv")
MAX_CSV_RECORD_LINES: Final = 100
CLOCK_REFRESH_RECORDS: Final = 1000  # refresh "now" (future-skew check, rejected_at) this often
PROGRESS_EVERY: Final = 2000
BATCH_RECORDS: Final = 8000  # records a validation worker takes at a time (a multiple of PROGRESS_EVERY)
BATCHES_AHEAD: Final = 3  # batches in flight per worker: bounds the memory a replay holds
_GZIP_MAGIC: Final = b"\x1f\x8b"
_BOM: Final = b"\xef\xbb\xbf"
_SUFFIXES: Final = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv"}


class SourceError(TrendsError):
    """A whole source is unusable (missing, unknown format, no CSV header)."""


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One record's original bytes (line break removed) and where it starts.

    :arg size: the full size when ``raw`` holds only the first bytes of an overlong record.
    """

    raw: bytes
    line: int
    size: int | None = None


def detect_format(path: str, fmt: str | None = None) -> Format:
    """Return the format named, or the one the file name implies (``.csv[.gz]``, ``.jsonl[.gz]``…).

    :raises SourceError: when neither tells.
    """
    if fmt is not None:
        if fmt not in FORMATS:
            msg = f"unknown format {fmt!r}; choose {' or '.join(FORMATS)}"
            raise SourceError(msg)
        return "csv" if fmt == "csv" else "jsonl"
    if path == "-":
        return "jsonl"
    suffixes = [s.lower() for s in Path(path).suffixes if s.lower() != ".gz"]
    found = _SUFFIXES.get(suffixes[-1]) if suffixes else None
    if found is None:
        msg = f"cannot tell the format of {path} from its name; pass --format jsonl or --format csv"
        raise SourceError(msg)
    return "csv" if found == "csv" else "jsonl"


@dataclass
class OpenSource:
    """An opened source: the decompressed byte stream and how far through the file we are."""

    stream: BinaryIO
    size: int | None  # bytes of the file on disk, if known
    position: Callable[[], int] | None  # bytes of the file on disk consumed so far


@contextlib.contextmanager
def open_source(path: str) -> Iterator[OpenSource]:
    """Open a file (gzip recognised by its magic bytes) or ``-`` for stdin, as bytes.

    :raises SourceError: when the file cannot be opened.
    """
    if path == "-":
        stdin = sys.stdin.buffer
        peek = stdin.peek(2)[:2] if isinstance(stdin, io.BufferedReader) else b""
        if peek == _GZIP_MAGIC:
            with gzip.GzipFile(fileobj=stdin) as unzipped:
                yield OpenSource(cast("BinaryIO", io.BufferedReader(unzipped, 1 << 20)), None, None)
        else:
            yield OpenSource(stdin, None, None)
        return
    try:
        raw = Path(path).open("rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        msg = f"cannot open {path}: {exc.strerror}"
        raise SourceError(msg) from exc
    with raw:
        size = Path(path).stat().st_size
        if raw.peek(2)[:2] == _GZIP_MAGIC:
            with gzip.GzipFile(fileobj=raw) as unzipped:
                yield OpenSource(cast("BinaryIO", io.BufferedReader(unzipped, 1 << 20)), size, raw.tell)
        else:
            yield OpenSource(raw, size, raw.tell)


def read_lines(stream: BinaryIO, limit: int = MAX_RECORD_BYTES) -> Iterator[RawRecord]:
    """Yield the non-blank lines of a stream as records, cutting lines longer than ``limit`` bytes."""
    readline = stream.readline
    cap = limit + 2  # room for the line break itself
    number = 0
    while True:
        chunk = readline(cap)
        if not chunk:
            return
        number += 1
        if number == 1 and chunk.startswith(_BOM):
            chunk = chunk[len(_BOM) :]
        if len(chunk) >= cap and not chunk.endswith(b"\n"):
            size = len(chunk)
            while True:  # skip the rest of the overlong line, counting it
                more = readline(1 << 20)
                size += len(more)
                if not more or more.endswith(b"\n"):
                    break
            ending = 2 if more.endswith(b"\r\n") else 1 if more.endswith(b"\n") else 0
            yield RawRecord(chunk, number, size - ending)
            continue
        raw = chunk.rstrip(b"\r\n") if chunk.endswith(b"\n") else chunk
        if raw.strip():
            yield RawRecord(raw, number)


def read_csv(stream: BinaryIO, limit: int = MAX_RECORD_BYTES) -> tuple[list[str], Iterator[RawRecord]]:
    """Return a CSV stream's header and an iterator of its records (rows, which may span lines in quotes).

    A record ends at a line break outside quotes, recognized by an even count of ``"`` (quotes inside quoted
    fields are doubled, so they keep the parity). An unbalanced quote ends the record after
    :data:`MAX_CSV_RECORD_LINES` lines or ``limit`` bytes, so it cannot swallow the rest of the file.

    :raises SourceError: when there is no readable header.
    """
    lines = read_lines(stream, limit)
    first = next(lines, None)
    if first is None:
        msg = "the CSV source is empty (it needs a header row)"
        raise SourceError(msg)
    try:
        header = next(csv.reader([first.raw.decode("utf-8")], strict=True))
    except (UnicodeDecodeError, csv.Error, StopIteration) as exc:
        msg = f"the CSV header (line {first.line}) is not readable: {exc}"
        raise SourceError(msg) from exc
    if len(set(header)) != len(header):
        msg = f"the CSV header has duplicate column names: {header}"
        raise SourceError(msg)

    def records() -> Iterator[RawRecord]:
        parts: list[bytes] = []
        start = 0
        quotes = 0
        size = 0
        for rec in lines:
            if rec.size is not None:  # an overlong line: a record of its own
                if parts:
                    yield RawRecord(b"\n".join(parts), start, size)
                    parts, quotes, size = [], 0, 0
                yield rec
                continue
            if not parts:
                start = rec.line
            parts.append(rec.raw)
            size += len(rec.raw) + (1 if len(parts) > 1 else 0)
            quotes += rec.raw.count(b'"')
            if quotes % 2 == 0 or len(parts) >= MAX_CSV_RECORD_LINES or size > limit:
                yield RawRecord(b"\n".join(parts), start, size if size > limit else None)
                parts, quotes, size = [], 0, 0
        if parts:
            yield RawRecord(b"\n".join(parts), start, size if size > limit else None)

    return header, records()


def outcomes(
    source: OpenSource,
    name: str,
    fmt: Format,
    ctx: Context,
    *,
    refresh_clock: bool = True,
) -> Iterator[tuple[RawRecord, Outcome]]:
    """Yield each record of a source with its validation outcome.

    :arg name: the source name recorded in rejects (the path as given, ``-`` for stdin).
    :arg refresh_clock: move the validation clock forward as the replay runs (off in tests that pin "now").
    """
    ctx = replace(ctx, source=name)
    if fmt == "csv":
        header, records = read_csv(source.stream)
        validate: Callable[[RawRecord, Context], Outcome] = lambda r, c: validate_csv(  # noqa: E731
            r.raw, header, c, r.line, size=r.size
        )
    else:
        records = read_lines(source.stream)
        validate = lambda r, c: validate_json(r.raw, c, r.line, size=r.size)  # noqa: E731
    for count, record in enumerate(records, 1):
        if refresh_clock and count % CLOCK_REFRESH_RECORDS == 0:
            ctx = replace(ctx, now=datetime.now(UTC))
        yield record, validate(record, ctx)


@dataclass
class ReplayStats:
    """How far a replay got."""

    records: int = 0
    first_event_time: datetime | None = None
    last_event_time: datetime | None = None
    stopped: bool = False


class Pacer:
    """Hold events back so event time advances ``speed`` times faster than the wall clock.

    The first paced event anchors both clocks; an event earlier than one already sent (out of order) goes at
    once. Waiting is done by polling the producer, so delivery reports keep flowing.
    """

    def __init__(self, speed: float, producer: EventProducer, should_stop: Callable[[], bool]) -> None:
        if speed <= 0:
            msg = f"the speed-up factor must be positive, not {speed}"
            raise ValueError(msg)
        self.speed = speed
        self.producer = producer
        self.should_stop = should_stop
        self._anchor: tuple[datetime, float] | None = None

    def wait_for(self, ts: datetime) -> None:
        """Return when the event at ``ts`` is due (or at once when asked to stop)."""
        if self._anchor is None:
            self._anchor = (ts, time.monotonic())
            return
        event0, wall0 = self._anchor
        due = wall0 + (ts - event0).total_seconds() / self.speed
        while not self.should_stop():
            delay = due - time.monotonic()
            if delay <= 0:
                return
            self.producer.poll(min(delay, 0.2))


@dataclass(slots=True)
class Validated:
    """A batch of records as a worker hands it back: its events ready to produce, in order, and its rejects.

    Plain lists of bytes and ints cross the process boundary much cheaper than a tuple per record.
    """

    values: list[bytes] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    stamps: list[int] = field(default_factory=list)  # record timestamps (event time, epoch ms)
    rejects: list[Reject] = field(default_factory=list)
    subject_stats: dict[str, int] = field(default_factory=dict)  # a worker's pseudonym counts for this batch

    def __len__(self) -> int:
        return len(self.values) + len(self.rejects)


def _validate_batch(
    raws: list[bytes],
    lines: list[int],
    sizes: dict[int, int],
    header: list[str] | None,
    ctx: Context,
    key_field: str,
    pseudonymiser: Pseudonymiser | None = None,
) -> Validated:
    """Validate and encode a batch of records (in a worker process); keep their order.

    :arg sizes: the full size of each overlong record, by its index in the batch.
    :arg pseudonymiser: replaces the users of the batch's events by pseudonyms (all at once, after validation).
    """
    ctx = replace(ctx, now=datetime.now(UTC))
    out = Validated()
    add_value, add_key, add_stamp = out.values.append, out.keys.append, out.stamps.append
    for i, (raw, line) in enumerate(zip(raws, lines, strict=True)):
        size = sizes.get(i) if sizes else None
        if header is None:
            done = encode_json(raw, ctx, key_field, line, size=size)
        else:
            done = encoded(validate_csv(raw, header, ctx, line, size=size), key_field)
        if type(done) is tuple:
            value, key, stamp = done
            add_value(value)
            add_key(key)
            add_stamp(stamp)
        else:
            out.rejects.append(cast("Reject", done))
    if pseudonymiser is not None and out.values:
        pseudonymised = pseudonymiser.encoded(list(zip(out.values, out.keys, out.stamps, strict=True)), key_field)
        out.values = [v for v, _k, _t in pseudonymised]
        out.keys = [k for _v, k, _t in pseudonymised]
    return out


# A validation worker's own pseudonymiser (its own Cassandra session), made by the pool's initializer.
_WORKER_PSEUDONYMISER: Pseudonymiser | None = None


def _init_worker(settings: Settings | None) -> None:
    global _WORKER_PSEUDONYMISER  # noqa: PLW0603 - one per worker process, for the life of the pool
    _WORKER_PSEUDONYMISER = Pseudonymiser.from_settings(settings) if settings is not None else None


def _validate_in_worker(
    raws: list[bytes], lines: list[int], sizes: dict[int, int], header: list[str] | None, ctx: Context, key_field: str
) -> Validated:
    pseudonymiser = _WORKER_PSEUDONYMISER
    if pseudonymiser is None:
        return _validate_batch(raws, lines, sizes, header, ctx, key_field)
    before = asdict(pseudonymiser.stats)
    out = _validate_batch(raws, lines, sizes, header, ctx, key_field, pseudonymiser)
    after = asdict(pseudonymiser.stats)
    out.subject_stats = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    return out


def _resolved_ahead(
    records: Iterator[tuple[RawRecord, Event | Reject]], pseudonymiser: Pseudonymiser | None
) -> Iterator[tuple[RawRecord, Event | Reject]]:
    """Pass the records on, the users of each :data:`BATCH_RECORDS` resolved in one call to the subject store first.

    The producer then finds each event's pseudonym (and hour) in the store's memory: one call per record would
    wait for Cassandra once per new user.
    """
    if pseudonymiser is None:
        yield from records
        return
    while batch := list(itertools.islice(records, BATCH_RECORDS)):
        users = [(o.user, o.ts_ms) for _r, o in batch if isinstance(o, Event) and o.user is not None]
        if users:
            pseudonymiser.table(dict.fromkeys(u for u, _ in users), users)
        yield from batch


def _columns(batch: list[RawRecord]) -> tuple[list[bytes], list[int], dict[int, int]]:
    sizes = {i: r.size for i, r in enumerate(batch) if r.size is not None}
    return [r.raw for r in batch], [r.line for r in batch], sizes


def _batches(records: Iterator[RawRecord], limit: int | None) -> Iterator[list[RawRecord]]:
    if limit is not None:
        records = itertools.islice(records, limit)
    while batch := list(itertools.islice(records, BATCH_RECORDS)):
        yield batch


def _replay_parallel(
    settings: Settings,
    producer: EventProducer,
    source: OpenSource,
    fmt: Format,
    ctx: Context,
    workers: int,
    stats: ReplayStats,
    should_stop: Callable[[], bool],
    on_progress: Callable[[ReplayStats, OpenSource], None] | None,
    limit: int | None,
) -> None:
    """Validate batches of records in ``workers`` processes and produce their outcomes in the file's order.

    The parent reads and produces; the workers parse, validate and serialize. Outcomes come back batch by batch
    in the order the batches were read, so every record is produced in file order (the order per key holds) and
    every reject reaches the dead-letter topic as in a sequential replay. With the producer pseudonymising,
    each worker pseudonymises its batches itself (its own subject store; the store's transactions make every
    process agree on a user's pseudonym).
    """
    if fmt == "csv":
        header_list, records = read_csv(source.stream)
        header: list[str] | None = header_list
    else:
        header, records = None, read_lines(source.stream)
    batches = _batches(records, limit)
    first = next(batches, [])
    if len(first) < BATCH_RECORDS:  # a small source: starting processes would cost more than it saves
        done = _validate_batch(*_columns(first), header, ctx, producer.key_field, producer.pseudonymiser)
        _produce_batch(done, producer, stats, source, on_progress)
        return
    # spawn: the parent's producer runs librdkafka threads, which a fork would copy in an unknown state
    worker_settings = settings if producer.pseudonymiser is not None else None
    with multiprocessing.get_context("spawn").Pool(workers, _init_worker, (worker_settings,)) as pool:
        pending: deque[Any] = deque()
        batches = itertools.chain([first], batches)
        exhausted = False
        while True:
            while not exhausted and len(pending) < workers * BATCHES_AHEAD:
                batch = next(batches, None)
                if batch is None:
                    exhausted = True
                    break
                job = (*_columns(batch), header, ctx, producer.key_field)
                pending.append(pool.apply_async(_validate_in_worker, job))
            if not pending:
                return
            _produce_batch(pending.popleft().get(), producer, stats, source, on_progress)
            if should_stop():
                stats.stopped = True
                pool.terminate()
                return


def _produce_batch(
    done: Validated,
    producer: EventProducer,
    stats: ReplayStats,
    source: OpenSource,
    on_progress: Callable[[ReplayStats, OpenSource], None] | None,
) -> None:
    """Produce a validated batch: its events in the file's order, then its rejects (another topic) in theirs."""
    if done.subject_stats and producer.pseudonymiser is not None:
        producer.pseudonymiser.add_stats(done.subject_stats)
    if done.values:
        producer.produce_many(done.values, done.keys, done.stamps)
        if stats.first_event_time is None:
            stats.first_event_time = _EPOCH + timedelta(milliseconds=done.stamps[0])
        stats.last_event_time = _EPOCH + timedelta(milliseconds=done.stamps[-1])
    for reject in done.rejects:
        producer.produce_reject(reject)
    before = stats.records
    stats.records += len(done)
    if on_progress is not None and stats.records // PROGRESS_EVERY > before // PROGRESS_EVERY:
        on_progress(stats, source)


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def replay(
    settings: Settings,
    producer: EventProducer,
    path: str,
    *,
    fmt: str | None = None,
    mapping: ColumnMapping = DEFAULT_MAPPING,
    speed: float | None = None,
    limit: int | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    on_progress: Callable[[ReplayStats, OpenSource], None] | None = None,
    workers: int = 1,
) -> ReplayStats:
    """Validate every record of a file and produce it: events to the events topic, rejects to the dead letters.

    Historical times are fine (the events topic keeps them, see ``infra.topics``); only times beyond the allowed
    future skew are rejected.

    :arg speed: replay paced by event time at this speed-up factor; ``None`` replays as fast as possible.
    :arg limit: stop after this many records.
    :arg should_stop: polled between records; a true answer ends the replay early (Ctrl-C).
    :arg on_progress: called every :data:`PROGRESS_EVERY` records and at the end.
    :arg workers: processes that parse and validate (a replay as fast as possible only; paced replays and
        ``workers=1`` validate in this process). Records are produced in the file's order either way.
    :raises SourceError: when the file cannot be read at all.
    """
    resolved = detect_format(path, fmt)
    ctx = Context(source=path, max_future_skew=timedelta(seconds=settings.ingest.max_future_skew_s), mapping=mapping)
    stats = ReplayStats()
    pacer = Pacer(speed, producer, should_stop) if speed else None
    with open_source(path) as source:
        if workers > 1 and pacer is None:
            _replay_parallel(
                settings,
                producer,
                source,
                resolved,
                replace(ctx, source=path),
                workers,
                stats,
                should_stop,
                on_progress,
                limit,
            )
            if on_progress is not None:
                on_progress(stats, source)
            return stats
        for _record, outcome in _resolved_ahead(outcomes(source, path, resolved, ctx), producer.pseudonymiser):
            if isinstance(outcome, Event):
                if stats.first_event_time is None:
                    stats.first_event_time = outcome.ts
                stats.last_event_time = outcome.ts
                if pacer is not None:
                    pacer.wait_for(outcome.ts)
                producer.produce(outcome)
            else:
                producer.produce_reject(outcome)
            stats.records += 1
            if on_progress is not None and stats.records % PROGRESS_EVERY == 0:
                on_progress(stats, source)
            if should_stop():
                stats.stopped = True
                break
            if limit is not None and stats.records >= limit:
                break
        if on_progress is not None:
            on_progress(stats, source)
    return stats
