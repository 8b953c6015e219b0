"""Read both views from Cassandra for a merge plan: the boundary, coverage, freshness and the rows of each span.

All statements are prepared once per reader and bound; every read uses the read consistency profile. A reader
holds one session (the API keeps one for its lifetime).

Batch rows are immutable once their run is current (a rerun writes a new version under a new run id and swaps the
pointer), so a reader keeps the batch rows it has read in a bounded LRU (:class:`RowCache`) keyed by the run they
belong to: a rerun changes the key, never the entry, and a cached row cannot be stale. Daily rollups are keyed by
the fingerprint of their day's pointers and cached only when the row read carries that fingerprint. Speed rows
change with every micro-batch and are always read.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import TYPE_CHECKING, Any

from infra.cassandra import READ_PROFILE
from infra.settings import CassandraSettings, Settings
from serving.merge import Layer, Resolution, Span, SpeedCoverage
from views.buckets import DAY, HOUR, MINUTE, as_date, days_between, floor, month_key, utc
from views.store import cql
from views.store.batch import BatchRows
from views.store.losses import Loss, LossStore, decode_loss
from views.store.pointers import PointerStore, decode_pointers, decode_stale, decode_watermark, fingerprint_of
from views.store.rows import Request
from views.store.speed import Epoch, SpeedRows, decode_counts, decode_epochs, decode_hours

if TYPE_CHECKING:
    from cassandra.cluster import Session

logger = logging.getLogger(__name__)

SKETCH_FIELDS = cql.SKETCH_FIELDS


@dataclass(frozen=True)
class Bucket:
    """One row of a view as a query sees it."""

    start: datetime
    resolution: Resolution
    layer: Layer
    events: int
    users_hll: bytes
    values_kll: bytes
    items_fi: bytes


@dataclass(frozen=True)
class Coverage:
    """What the merge rule needs to know about both layers for a window."""

    boundary: datetime | None
    pinned: bool
    batch_low: datetime | None
    batch_hours: set[datetime]
    current_days: set[date]
    speed_newest_event: datetime | None
    speed_updated_at: datetime | None
    speed: SpeedCoverage = field(default_factory=lambda: SpeedCoverage(()))
    stale: dict[datetime, int] = field(default_factory=dict)  # batch hours -> records indexed since their run
    incomplete: dict[datetime, list[Loss]] = field(default_factory=dict)  # hours lost records may belong to

    @property
    def speed_fresh_until(self) -> datetime | None:
        """Return the end of the newest minute the speed layer has read (its current epoch)."""
        return self.speed.fresh_until


ROW_OVERHEAD_BYTES = 200  # a cached row's object and key, besides its sketch bytes


def _size(rows: tuple[Bucket, ...]) -> int:
    return ROW_OVERHEAD_BYTES + sum(
        ROW_OVERHEAD_BYTES + len(b.users_hll) + len(b.values_kll) + len(b.items_fi) for b in rows
    )


class RowCache:
    """A thread-safe LRU of immutable batch rows, bounded in bytes: key -> the rows (maybe none) one read returned."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, tuple[tuple[Bucket, ...], int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> tuple[Bucket, ...] | None:
        """Return the cached rows of a key (most recently used now), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[0]

    def put(self, key: Hashable, rows: tuple[Bucket, ...]) -> None:
        """Keep the rows of a key, evicting the least recently used entries beyond ``max_bytes``."""
        size = _size(rows)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (rows, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._bytes -= evicted

    @property
    def bytes(self) -> int:
        """Return the bytes held (sketches plus a fixed overhead per row and entry)."""
        return self._bytes


QUORUM_LEVELS = {"QUORUM", "LOCAL_QUORUM", "EACH_QUORUM", "ALL"}
EVERY_DC_WRITES = {"EACH_QUORUM", "ALL"}  # a write acknowledged by a quorum of every data centre
GLOBAL_LEVELS = {"QUORUM", "EACH_QUORUM", "ALL"}  # quorums of all replicas, whatever their data centre


def reads_see_acknowledged_writes(cfg: CassandraSettings) -> tuple[bool, str]:
    """Tell whether a read is sure to see every acknowledged write (R + W > RF where the replicas are), and why.

    In one data centre any quorum pair does. Across data centres ``LOCAL_QUORUM`` writes and reads overlap only in
    the writer's data centre: a reader in another one can read an empty or partial hour of a run whose pointer it
    already sees. There it takes writes to a quorum of every data centre (``EACH_QUORUM``/``ALL``), or reads and
    writes at global ``QUORUM``, or ``ALL`` reads.
    """
    if cfg.replication_strategy == "NetworkTopologyStrategy":
        dcs = cfg.datacenter_replication or {cfg.local_datacenter: cfg.replication_factor}
    else:
        dcs = {"": cfg.replication_factor}
    r, w = cfg.read_consistency, cfg.write_consistency
    if sum(dcs.values()) == 1:
        return True, "one replica"
    if len(dcs) == 1:
        ok = r in QUORUM_LEVELS and w in QUORUM_LEVELS
        return ok, f"{r} reads and {w} writes in one data centre"
    every_dc = w in EVERY_DC_WRITES and r in QUORUM_LEVELS
    ok = every_dc or (r in GLOBAL_LEVELS and w in GLOBAL_LEVELS) or (r == "ALL" and w in QUORUM_LEVELS)
    return ok, f"{r} reads and {w} writes across {len(dcs)} data centres ({', '.join(sorted(dcs))})"


def rows_cacheable(settings: Settings) -> bool:
    """Tell whether batch rows may be kept: reads must see a whole run once its pointer is seen.

    With weaker levels a read may miss rows of a just-swapped run: harmless once, wrong if cached (the cache
    would serve the empty or partial hour under the run's id for the reader's lifetime).
    """
    return settings.serving.cache_mb > 0 and reads_see_acknowledged_writes(settings.cassandra)[0]


class ViewReader:
    """Prepared reads of the speed and batch views."""

    def __init__(self, settings: Settings, sess: Session) -> None:
        self.settings = settings
        self.sess = sess
        self.pointer_store = PointerStore(settings, sess)
        self.batch_rows = BatchRows(settings, sess)
        self.speed_rows = SpeedRows(settings, sess)
        self.loss_store = LossStore(settings, sess)
        self._rows: dict[frozenset[str], dict[str, Any]] = {}
        self._pointers: dict[date, dict[datetime, Any]] = {}
        self._indexed: dict[datetime, int | None] = {}
        self.cache = RowCache(settings.serving.cache_mb * 1024 * 1024) if rows_cacheable(settings) else None
        if self.cache is None and settings.serving.cache_mb > 0:
            _ok, why = reads_see_acknowledged_writes(settings.cassandra)
            logger.info("batch row cache off: %s do not make every read see every acknowledged write", why)

    def _row_statements(self, fields: frozenset[str]) -> dict[str, Any]:
        """Return the row reads selecting only ``fields`` of the sketches (prepared once per field set)."""
        stmts = self._rows.get(fields)
        if stmts is None:
            stmts = self._rows[fields] = cql.prepare_reads(self.sess, self.settings, fields)
        return stmts

    def request_reader(self) -> ViewReader:
        """Return a reader sharing this one's session and prepared statements, with an empty pointer cache.

        A long-lived process (the API) takes one per request: batch reruns move the pointers, and requests served
        by concurrent threads must not share a cache.
        """
        other = copy.copy(self)
        other._pointers = {}
        other._indexed = {}
        return other

    def ping(self, timeout: float) -> None:
        """Read one row of the watermark table (readiness); raise the driver's error when Cassandra cannot."""
        self.pointer_store.ping(timeout)

    def _exec_many(self, requests: list[Request]) -> list[list[Any]]:
        """Run reads concurrently (one round trip of latency instead of one per read); results in order."""
        futures = [self.sess.execute_async(stmt, params, execution_profile=READ_PROFILE) for stmt, params in requests]
        return [list(f.result()) for f in futures]

    def pointers(self, day: date) -> dict[datetime, Any]:
        """Return the current batch run per completed hour of a day (cached per reader)."""
        self._load_pointers([day])
        return self._pointers[day]

    def _load_pointers(self, days: list[date]) -> None:
        missing = [d for d in days if d not in self._pointers]
        requests = [self.pointer_store.pointers_request(d) for d in missing]
        for day, rows in zip(missing, self._exec_many(requests), strict=True):
            self._keep_pointers(day, rows)

    def _keep_pointers(self, day: date, rows: list[Any]) -> None:
        pointers = decode_pointers(rows)
        self._pointers[day] = {h: p.run_id for h, p in pointers.items()}
        self._indexed.update({h: p.indexed for h, p in pointers.items()})

    def stale_hours(self, limit: int = 1000) -> dict[datetime, int]:
        """Return every batch hour whose indexed records grew after its current run, with how many arrived since."""
        noticed = self.pointer_store.stale(self.settings.kafka.events_topic)
        self._load_pointers(sorted({h.date() for h in noticed}))
        out = {}
        for hour, records in noticed.items():
            read = self._indexed.get(hour)
            if read is not None and records > read:
                out[hour] = records - read
        return dict(sorted(out.items())[:limit])

    def coverage(self, start: datetime, end: datetime, slice_: str) -> Coverage:
        """Read the boundary, the completed hours, current daily rollups and what the speed layer counted.

        One round of concurrent reads (the watermark, the speed progress and epochs, the hour pointers of the
        window's days not cached yet, the daily rollups' fingerprints of its months), then one more for the speed
        coverage of the part of the window at or above the boundary.
        """
        days = days_between(start, end)
        missing = [d for d in days if d not in self._pointers]
        months: dict[str, list[date]] = {}
        for day in days:
            months.setdefault(month_key(day), []).append(day)
        query = self.settings.speed.query_name
        topic = self.settings.kafka.events_topic
        rows = self._exec_many(
            [
                self.pointer_store.watermark_request(),
                self.speed_rows.progress_request(query),
                self.pointer_store.stale_request(topic, floor(start, HOUR), end),
                self.speed_rows.epochs_request(query),
                self.loss_store.losses_request(topic),
                *(self.pointer_store.pointers_request(d) for d in missing),
                *(self.batch_rows.fingerprints_request(slice_, m) for m in months),
            ]
        )
        mark_rows, prog_rows, stale_rows, epoch_rows, loss_rows = rows[:5]
        rest = rows[5:]
        losses = [decode_loss(topic, r) for r in loss_rows]
        incomplete = self.loss_store.incomplete(topic, start, end, losses) if losses else {}
        mark = decode_watermark(mark_rows[0] if mark_rows else None)
        speed = self._speed_coverage(start, end, slice_, mark.boundary, decode_epochs(epoch_rows))
        for day, pointer_rows in zip(missing, rest[: len(missing)], strict=True):
            self._keep_pointers(day, pointer_rows)
        current: set[date] = set()
        for month_days, rollups in zip(months.values(), rest[len(missing) :], strict=True):
            wanted = set(month_days)
            for r in rollups:
                day = as_date(r.day)
                if day in wanted and r.hour_runs == fingerprint_of(self._pointers[day]):
                    current.add(day)
        hours: set[datetime] = set()
        for day in days:
            hours |= set(self._pointers[day])
        prog = prog_rows[0] if prog_rows else None
        stale = {}
        for hour, records in decode_stale(stale_rows).items():  # stale while the index holds more than its run read
            read = self._indexed.get(hour)
            if hour in hours and read is not None and records > read:
                stale[hour] = records - read
        return Coverage(
            speed=speed,
            stale=stale,
            incomplete=incomplete,
            boundary=mark.boundary,
            pinned=mark.pinned is not None,
            batch_low=mark.low,
            batch_hours=hours,
            current_days=current,
            speed_newest_event=utc(prog.newest_event_ts) if prog else None,
            speed_updated_at=utc(prog.updated_at) if prog else None,
        )

    def _speed_coverage(
        self, start: datetime, end: datetime, slice_: str, boundary: datetime | None, epochs: list[Epoch]
    ) -> SpeedCoverage:
        """Read what the speed layer counted in the part of the window it may serve (a second round of reads).

        Only from the boundary on, and only where an epoch has read: speed rows expire by the time they were
        written, not by their event time, so no other bound is safe.
        """
        now = datetime.now(UTC)
        lo = start if boundary is None else max(start, boundary)
        firsts = [e.covered_from for e in epochs]
        if epochs and None not in firsts:
            lo = max(lo, min(t for t in firsts if t is not None))
        hi = min(end, max((e.seen_until for e in epochs if e.seen_until is not None), default=lo))
        if lo >= hi:
            return SpeedCoverage(tuple(epochs), now=now)
        lo = floor(lo, HOUR)
        query = self.settings.speed.query_name
        hour_reqs = self.speed_rows.hours_requests(query, lo, hi)
        rows = self._exec_many([*hour_reqs, *self.speed_rows.counts_requests(query, slice_, lo, hi)])
        return SpeedCoverage(
            tuple(epochs),
            {(k.hour, k.epoch): k.kept_until for day in rows[: len(hour_reqs)] for k in decode_hours(day)},
            {key: n for day in rows[len(hour_reqs) :] for key, n in decode_counts(day).items()},
            now,
        )

    def read(self, spans: list[Span], slice_: str, fields: Iterable[str] = SKETCH_FIELDS) -> list[Bucket]:
        """Return all the rows that serve the spans, in time order (see :meth:`stream`; this holds them all)."""
        return list(self.stream(spans, slice_, fields))

    def stream(
        self,
        spans: list[Span],
        slice_: str,
        fields: Iterable[str] = SKETCH_FIELDS,
        budget: ReadBudget | None = None,
    ) -> Iterator[Bucket]:
        """Yield the rows that serve the spans (gaps read nothing) in time order, as they arrive.

        Few rows are held at once: a long read with sketches comes in pages of :data:`PAGE_ROWS_SKETCHES` rows (a short
        one in one page), and reads run ahead only while their first pages stay within :data:`IN_FLIGHT_ROWS` rows: a
        long window costs time, not memory.
        Consecutive whole hours of a day are read with one range query; rows of other runs are dropped. Only the
        sketches in ``fields`` are read (the others are empty in the buckets): an answer that needs the items only
        moves a fraction of the bytes. Batch rows come from the cache when their run's rows were read before; a
        batch minute span reads (and caches) its whole hour of that run, so a sliding window reuses it.

        :arg budget: charged with every row yielded; it raises once the request has read too much.
        """
        reads = _ReadSchedule(self, slice_, frozenset(fields))
        hour_spans: dict[date, list[Span]] = {}
        for span in spans:
            if span.layer == "gap":
                continue
            if span.layer == "speed":
                reads.speed(span)
            elif span.resolution == "day":
                reads.day(span)
            elif span.resolution == "hour":
                hour_spans.setdefault(span.start.date(), []).append(span)
            else:
                reads.minutes(span)
        for day, day_spans in hour_spans.items():
            reads.hours(day, day_spans)
        for bucket in reads.run():
            if budget is not None:
                budget.charge(bucket)
            yield bucket

    @staticmethod
    def _bucket(start: datetime | None, resolution: Resolution, layer: Layer, r: Any) -> Bucket:
        if start is None:
            msg = "a view row without a bucket start"
            raise ValueError(msg)
        return Bucket(
            start.astimezone(UTC),
            resolution,
            layer,
            int(r.events),
            bytes(getattr(r, "users_hll", b"")),
            bytes(getattr(r, "values_kll", b"")),
            bytes(getattr(r, "items_fi", b"")),
        )


class ReadBudget:
    """What one request may read: sketch bytes up to ``serving.max_read_mb``; rows and bytes are counted."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.rows = 0
        self.bytes = 0

    def charge(self, bucket: Bucket) -> None:
        """Count a row read.

        :raises ReadBudgetExceededError: the request has read more sketch bytes than allowed.
        """
        self.rows += 1
        self.bytes += len(bucket.users_hll) + len(bucket.values_kll) + len(bucket.items_fi)
        if self.bytes > self.max_bytes:
            raise ReadBudgetExceededError(self.max_bytes, self.rows)


class ReadBudgetExceededError(ValueError):
    """A request reads more sketch bytes than ``serving.max_read_mb`` allows (the API answers 400)."""

    def __init__(self, max_bytes: int, rows: int) -> None:
        mib = max_bytes / (1024 * 1024)
        super().__init__(
            f"this answer reads more than {mib:g} MiB of sketches (serving.max_read_mb; {rows} rows read): ask for "
            "a shorter window or a narrower answer (count and series read no sketches); long windows are cheap "
            "where the batch layer's hourly and daily rollups serve them"
        )


PAGE_ROWS = 1000  # rows per page of a read that carries no sketch
PAGE_ROWS_SKETCHES = 25  # rows per page of a long read with sketches (a frequent-items sketch is 8-100 KB)
SHORT_READ_ROWS = 200  # a read of at most this many rows comes in one page (the speed tail of an ordinary window)
IN_FLIGHT_ROWS = 150  # reads run ahead of the one being consumed while their first pages hold at most this many rows


@dataclass
class _Unit:
    """One read of a request (or rows from the cache), placed in time, and what turns its result into buckets."""

    start: datetime
    request: Any  # a bound statement, paged; None when the cache serves the unit
    emit: Callable[[Iterable[Any]], Iterable[Bucket]]
    rows: int  # most rows its first page holds


class _ReadSchedule:
    """The reads of one :meth:`ViewReader.stream`, scheduled: a unit per read (or cache hit), run in time order."""

    def __init__(self, reader: ViewReader, slice_: str, fields: frozenset[str]) -> None:
        self.reader = reader
        self.slice = slice_
        self.fields = fields
        self.stmt = reader._row_statements(fields)
        self.units: list[_Unit] = []

    def _add(
        self,
        start: datetime,
        statement: str | None,
        params: tuple[Any, ...],
        emit: Callable[[Iterable[Any]], Iterable[Bucket]],
        rows: int = 0,
    ) -> None:
        if statement is None:
            self.units.append(_Unit(start, None, emit, 0))
            return
        short = rows <= SHORT_READ_ROWS
        page = PAGE_ROWS if not self.fields else (rows if short else PAGE_ROWS_SKETCHES)
        bound = self.stmt[statement].bind(params)
        bound.fetch_size = max(page, 1)
        self.units.append(_Unit(start, bound, emit, min(rows, page)))

    def _cached(self, key: Hashable) -> tuple[Bucket, ...] | None:
        cache = self.reader.cache
        return cache.get(key) if cache is not None else None

    def _remember(self, key: Hashable, rows: Iterable[Bucket]) -> None:
        if self.reader.cache is not None:
            self.reader.cache.put(key, tuple(rows))

    def speed(self, span: Span) -> None:
        """Read a speed span a day at a time, streamed in pages (never cached: it changes every micro-batch)."""
        bucket = self.reader._bucket

        def emit(rows: Iterable[Any]) -> Iterator[Bucket]:
            return (bucket(utc(r.bucket_start), "minute", "speed", r) for r in rows)

        for day in days_between(span.start, span.end):
            first = max(span.start, datetime.combine(day, time(), UTC))
            last = min(span.end, datetime.combine(day, time(), UTC) + DAY)
            minutes = int((last - first) / MINUTE)
            self._add(first, "speed", (self.slice, day, span.start, span.end), emit, minutes)

    def day(self, span: Span) -> None:
        """Serve a daily rollup, cached under the fingerprint of the day's pointers."""
        day = span.start.date()
        fingerprint = fingerprint_of(self.reader.pointers(day))
        key = ("day", self.slice, day, fingerprint, self.fields)
        hit = self._cached(key)
        if hit is not None:
            self._add(span.start, None, (), lambda _rows: hit)
            return

        def emit(result: Iterable[Any]) -> list[Bucket]:
            rows = list(result)
            got = [self.reader._bucket(span.start, "day", "batch", r) for r in rows]
            if all(r.hour_runs == fingerprint for r in rows):  # re-merged since the coverage read: don't keep it
                self._remember(key, got)
            return got

        self._add(span.start, "days", (self.slice, month_key(day), day, day + timedelta(days=1)), emit, 1)

    def minutes(self, span: Span) -> None:
        """Serve batch minutes from the current run's whole hour (cached under that run)."""
        hour = floor(span.start, HOUR)
        run = self.reader.pointers(hour.date()).get(hour)
        key = ("minutes", self.slice, hour, run, self.fields)
        hit = self._cached(key)
        if hit is not None:
            self._add(span.start, None, (), lambda _rows: [b for b in hit if span.start <= b.start < span.end])
            return

        def emit(rows: Iterable[Any]) -> list[Bucket]:
            got = [self.reader._bucket(utc(r.bucket_start), "minute", "batch", r) for r in rows]
            self._remember(key, got)
            return [b for b in got if span.start <= b.start < span.end]

        whole = self.reader.cache is not None  # without a cache, read only the span
        lo, hi = (hour, hour + HOUR) if whole else (span.start, span.end)
        self._add(span.start, "minutes", (self.slice, hour, run, lo, hi), emit, int((hi - lo) / MINUTE))

    def hours(self, day: date, spans: list[Span]) -> None:
        """Serve whole hours of a day: cached ones from the cache, the others with one range read (<= 24 rows)."""
        pointers = self.reader.pointers(day)
        cached: dict[datetime, tuple[Bucket, ...]] = {}
        missing: dict[datetime, Hashable] = {}
        for span in spans:
            key = ("hour", self.slice, span.start, pointers.get(span.start), self.fields)
            hit = self._cached(key)
            if hit is None:
                missing[span.start] = key
            else:
                cached[span.start] = hit

        def emit(rows: Iterable[Any]) -> list[Bucket]:
            found: dict[datetime, tuple[Bucket, ...]] = dict(cached)
            for r in rows:
                hour = utc(r.hour)
                if hour is not None and hour in missing and pointers.get(hour) == r.run_id:
                    found[hour] = (self.reader._bucket(hour, "hour", "batch", r),)
            for hour, key in missing.items():  # an hour without a row for this slice is cached as empty
                found.setdefault(hour, ())
                self._remember(key, found[hour])
            return [b for hour in sorted(found) for b in found[hour]]

        first = min(s.start for s in spans)
        if missing:
            self._add(first, "hours", (self.slice, day, min(missing), max(missing) + HOUR), emit, len(missing))
        else:
            self._add(first, None, (), emit)

    def run(self) -> Iterator[Bucket]:
        """Yield every unit's rows in time order, reads running ahead while their first pages stay small.

        Reads are issued ahead of the one being consumed as long as the rows their first pages may hold stay within
        :data:`IN_FLIGHT_ROWS` (a short window's reads all run at once; a long one's a few at a time). Units never
        overlap in time (the spans of a plan are disjoint), so this order is the order of the rows' bucket starts,
        whether they come from the cache or from Cassandra: warm and cold answers merge alike.
        """
        units = sorted(self.units, key=lambda u: u.start)
        sess = self.reader.sess
        pending: dict[int, Any] = {}
        issued, ahead_rows = 0, 0
        for i, unit in enumerate(units):
            while issued < len(units) and (issued <= i or ahead_rows + units[issued].rows <= IN_FLIGHT_ROWS):
                req = units[issued].request
                if req is not None:
                    pending[issued] = sess.execute_async(req, execution_profile=READ_PROFILE)
                    ahead_rows += units[issued].rows
                issued += 1
            future = pending.pop(i, None)
            ahead_rows -= unit.rows if future is not None else 0
            yield from unit.emit(future.result() if future is not None else ())
