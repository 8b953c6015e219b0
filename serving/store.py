"""Read both views from Cassandra for a merge plan: the boundary, coverage, freshness and the rows of each span.

All statements are prepared once per reader and bound; every read uses the read consistency profile. A reader
holds one session, its statements and its caches, and no state of a request: the API keeps one for its lifetime and
every request uses it. The read path goes one way: :meth:`ViewReader.coverage` reads the state of both layers (with
the current run of every hour of the window), :func:`serving.merge.plan` splits the window, :meth:`ViewReader.stream`
reads the rows of the plan's spans under the runs of that same coverage, and :mod:`serving.queries` merges them
(through the answer cache of :mod:`serving.cache`).

Batch rows are immutable once their run is current (a rerun writes a new version under a new run id and swaps the
pointer), so a reader keeps the batch rows it has read in a bounded LRU (:class:`RowCache`) keyed by the run they
belong to: a rerun changes the key, never the entry, and a cached row cannot be stale. Daily rollups are keyed by
the fingerprint of their day's pointers and cached only when the row read carries that fingerprint. Speed rows
change with every micro-batch: :mod:`serving.cache` keeps them by the events the speed layer counted in their minute.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from time import monotonic
from typing import TYPE_CHECKING, Any

from infra.cassandra import READ_PROFILE
from infra.service_settings import CassandraSettings
from infra.settings import Settings
from serving.cache import AnswerCache, Bucket, RowCache
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
    runs: Mapping[date, Mapping[datetime, uuid.UUID]] = field(default_factory=dict)  # current run per hour, per day

    @property
    def speed_fresh_until(self) -> datetime | None:
        """Return the end of the newest minute the speed layer has read (its current epoch)."""
        return self.speed.fresh_until


RECENT_WINDOWS = 256  # coverages kept for serving.state_max_age_ms (a handful of windows are asked at any time)
QUORUM_LEVELS = {"QUORUM", "LOCAL_QUORUM", "EACH_QUORUM", "ALL"}
EVERY_DC_WRITES = {"EACH_QUORUM", "ALL"}  # a write acknowledged by a quorum of every data centre
GLOBAL_LEVELS = {"QUORUM", "EACH_QUORUM", "ALL"}  # quorums of all replicas, whatever their data centre


class RecentStates:
    """The layers' state of each recent window, stamped with when its read began (``serving.state_max_age_ms``).

    Concurrent requests read the state at once; the one whose read began last is kept, so a slow read that ends
    later never replaces a newer state (answers never step back) and never looks younger than it is.
    """

    def __init__(self, limit: int = RECENT_WINDOWS) -> None:
        self.limit = limit
        self._states: dict[Hashable, tuple[float, Coverage]] = {}

    def keep(self, window: Hashable, began: float, cov: Coverage) -> None:
        """Keep a state read that began at ``began`` (monotonic s) unless one that began later is kept."""
        if len(self._states) > self.limit:
            self._states.clear()
        kept = self._states.get(window)
        if kept is None or kept[0] <= began:
            self._states[window] = (began, cov)

    def get(self, window: Hashable, max_age_s: float, now: float) -> Coverage | None:
        """Return the state of the window whose read began at most ``max_age_s`` before ``now`` (else None)."""
        kept = self._states.get(window)
        if kept is None or now - kept[0] > max_age_s:
            return None
        return kept[1]


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
    """Prepared reads of the speed and batch views over one session, and the caches of the process that holds it.

    It keeps no state of a request (the pointers a request reads travel in its :class:`Coverage`), so concurrent
    requests share one reader.
    """

    def __init__(self, settings: Settings, sess: Session) -> None:
        self.settings = settings
        self.sess = sess
        self.pointer_store = PointerStore(settings, sess)
        self.batch_rows = BatchRows(settings, sess)
        self.speed_rows = SpeedRows(settings, sess)
        self.loss_store = LossStore(settings, sess)
        self._rows: dict[frozenset[str], dict[str, Any]] = {}
        self._recent = RecentStates()
        cacheable = rows_cacheable(settings)
        if not cacheable and settings.serving.cache_mb > 0:
            _ok, why = reads_see_acknowledged_writes(settings.cassandra)
            logger.info("batch row and answer caches off: %s do not make every read see every acknowledged write", why)
        mib = 1024 * 1024
        self.cache = RowCache(settings.serving.cache_mb * mib) if cacheable else None
        # speed minutes kept by their epoch's count: right at any consistency level (a short row is never kept)
        self.speed_cache = RowCache(settings.serving.cache_mb * mib) if settings.serving.cache_mb > 0 else None
        answers_mb = settings.serving.answer_cache_mb
        self.answers = AnswerCache(answers_mb * mib) if cacheable and answers_mb > 0 else None

    def recent_coverage(self, start: datetime, end: datetime, slice_: str) -> Coverage | None:
        """Return the coverage of this window read less than ``serving.state_max_age_ms`` ago (None: none that recent).

        Only to answer from the answer cache: the speed rows' keep-until is checked against the clock again (a gap
        that appears by expiry is never hidden), and anything to read is planned on a coverage read anew.
        """
        max_age = self.settings.serving.state_max_age_ms / 1000
        cov = self._recent.get((start, end, slice_), max_age, monotonic()) if max_age > 0 else None
        if cov is None:
            return None
        return dataclasses.replace(cov, speed=dataclasses.replace(cov.speed, now=datetime.now(UTC)))

    def statements(self, fields: frozenset[str]) -> dict[str, Any]:
        """Return the row reads selecting only ``fields`` of the sketches (prepared once per field set)."""
        stmts = self._rows.get(fields)
        if stmts is None:
            stmts = self._rows[fields] = cql.prepare_reads(self.sess, self.settings, fields)
        return stmts

    def ping(self, timeout: float) -> None:
        """Read one row of the watermark table (readiness); raise the driver's error when Cassandra cannot."""
        self.pointer_store.ping(timeout)

    def _exec_many(self, requests: list[Request]) -> list[list[Any]]:
        """Run reads concurrently (one round trip of latency instead of one per read); results in order."""
        futures = [self.sess.execute_async(stmt, params, execution_profile=READ_PROFILE) for stmt, params in requests]
        return [list(f.result()) for f in futures]

    def pointers(self, day: date) -> dict[datetime, uuid.UUID]:
        """Return the current batch run per completed hour of a day (read now)."""
        return self.read_pointers([day])[0][day]

    def read_pointers(
        self, days: Iterable[date]
    ) -> tuple[dict[date, dict[datetime, uuid.UUID]], dict[datetime, int | None]]:
        """Return the current run per hour of each day, and the indexed records each run read (one round)."""
        wanted = sorted(set(days))
        runs: dict[date, dict[datetime, uuid.UUID]] = {}
        indexed: dict[datetime, int | None] = {}
        rows = self._exec_many([self.pointer_store.pointers_request(d) for d in wanted])
        for day, day_rows in zip(wanted, rows, strict=True):
            pointers = decode_pointers(day_rows)
            runs[day] = {h: p.run_id for h, p in pointers.items()}
            indexed.update({h: p.indexed for h, p in pointers.items()})
        return runs, indexed

    def stale_hours(self, limit: int = 1000) -> dict[datetime, int]:
        """Return every batch hour whose indexed records grew after its current run, with how many arrived since."""
        noticed = self.pointer_store.stale(self.settings.kafka.events_topic)
        _, indexed = self.read_pointers({h.date() for h in noticed})
        out = {}
        for hour, records in noticed.items():
            read = indexed.get(hour)
            if read is not None and records > read:
                out[hour] = records - read
        return dict(sorted(out.items())[:limit])

    def coverage(self, start: datetime, end: datetime, slice_: str) -> Coverage:
        """Read the boundary, the completed hours (with their runs), current daily rollups and what speed counted.

        One round of concurrent reads (the watermark, the speed progress and epochs, the hour pointers of the
        window's days, the daily rollups' fingerprints of its months), then one more for the speed coverage of the
        part of the window at or above the boundary.
        """
        began = monotonic()  # the state read is as old as its start (a slow read must not look fresh)
        days = days_between(start, end)
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
                *(self.pointer_store.pointers_request(d) for d in days),
                *(self.batch_rows.fingerprints_request(slice_, m) for m in months),
            ]
        )
        mark_rows, prog_rows, stale_rows, epoch_rows, loss_rows = rows[:5]
        rest = rows[5:]
        losses = [decode_loss(topic, r) for r in loss_rows]
        incomplete = self.loss_store.incomplete(topic, start, end, losses) if losses else {}
        mark = decode_watermark(mark_rows[0] if mark_rows else None)
        speed = self._speed_coverage(start, end, slice_, mark.boundary, decode_epochs(epoch_rows))
        runs: dict[date, dict[datetime, uuid.UUID]] = {}
        indexed: dict[datetime, int | None] = {}
        for day, pointer_rows in zip(days, rest[: len(days)], strict=True):
            pointers = decode_pointers(pointer_rows)
            runs[day] = {h: p.run_id for h, p in pointers.items()}
            indexed.update({h: p.indexed for h, p in pointers.items()})
        current: set[date] = set()
        for month_days, rollups in zip(months.values(), rest[len(days) :], strict=True):
            wanted = set(month_days)
            for r in rollups:
                day = as_date(r.day)
                if day in wanted and r.hour_runs == fingerprint_of(runs[day]):
                    current.add(day)
        hours: set[datetime] = set()
        for day in days:
            hours |= set(runs[day])
        prog = prog_rows[0] if prog_rows else None
        stale = {}
        for hour, records in decode_stale(stale_rows).items():  # stale while the index holds more than its run read
            read = indexed.get(hour)
            if hour in hours and read is not None and records > read:
                stale[hour] = records - read
        cov = Coverage(
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
            runs=runs,
        )
        if self.settings.serving.state_max_age_ms > 0:
            self._recent.keep((start, end, slice_), began, cov)
        return cov

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

    def read(
        self,
        spans: list[Span],
        slice_: str,
        fields: Iterable[str] = SKETCH_FIELDS,
        runs: Mapping[date, Mapping[datetime, uuid.UUID]] | None = None,
    ) -> list[Bucket]:
        """Return all the rows that serve the spans, in time order (see :meth:`stream`; this holds them all)."""
        return list(self.stream(spans, slice_, fields, runs=runs))

    def stream(
        self,
        spans: list[Span],
        slice_: str,
        fields: Iterable[str] = SKETCH_FIELDS,
        budget: ReadBudget | None = None,
        runs: Mapping[date, Mapping[datetime, uuid.UUID]] | None = None,
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
        :arg runs: the current run of each hour of the batch spans' days, as the plan's coverage read them (the
            spans were planned with them); None reads them now.
        """
        if runs is None:
            batch_days = {s.start.date() for s in spans if s.layer == "batch"}
            runs = self.read_pointers(batch_days)[0] if batch_days else {}
        wanted = frozenset(fields)
        reads = _ReadSchedule(self.sess, self.statements(wanted), self.cache, slice_, wanted, runs)
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
    def bucket(start: datetime | None, resolution: Resolution, layer: Layer, r: Any) -> Bucket:
        """Turn a row read into a :class:`Bucket` (sketches not selected are empty)."""
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
        self.charge_bytes(bucket.sketch_bytes)

    def charge_bytes(self, sketch_bytes: int, rows: int = 1) -> None:
        """Count rows served from the answer cache as if read (the same question costs the same budget).

        :raises ReadBudgetExceededError: the request has read more sketch bytes than allowed.
        """
        self.rows += rows
        self.bytes += sketch_bytes
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
    """The reads of one :meth:`ViewReader.stream`, scheduled: a unit per read (or cache hit), run in time order.

    It is given all it reads with (the session, the prepared reads, the batch-row cache, the runs of the plan's
    coverage) and reaches back into nothing.
    """

    def __init__(
        self,
        sess: Session,
        statements: Mapping[str, Any],
        cache: RowCache | None,
        slice_: str,
        fields: frozenset[str],
        runs: Mapping[date, Mapping[datetime, uuid.UUID]],
    ) -> None:
        self.sess = sess
        self.stmt = statements
        self.cache = cache
        self.slice = slice_
        self.fields = fields
        self.runs = runs
        self.units: list[_Unit] = []

    def pointers(self, day: date) -> Mapping[datetime, uuid.UUID]:
        """Return the current runs of a day's hours as the plan's coverage read them."""
        return self.runs.get(day, {})

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
        return self.cache.get(key) if self.cache is not None else None

    def _remember(self, key: Hashable, rows: Iterable[Bucket]) -> None:
        if self.cache is not None:
            self.cache.put(key, tuple(rows))

    def speed(self, span: Span) -> None:
        """Read a speed span a day at a time, streamed in pages (never cached: it changes every micro-batch)."""
        bucket = ViewReader.bucket

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
        fingerprint = fingerprint_of(self.pointers(day))
        key = ("day", self.slice, day, fingerprint, self.fields)
        hit = self._cached(key)
        if hit is not None:
            self._add(span.start, None, (), lambda _rows: hit)
            return

        def emit(result: Iterable[Any]) -> list[Bucket]:
            rows = list(result)
            got = [ViewReader.bucket(span.start, "day", "batch", r) for r in rows]
            if all(r.hour_runs == fingerprint for r in rows):  # re-merged since the coverage read: don't keep it
                self._remember(key, got)
            return got

        self._add(span.start, "days", (self.slice, month_key(day), day, day + timedelta(days=1)), emit, 1)

    def minutes(self, span: Span) -> None:
        """Serve batch minutes from the current run's whole hour (cached under that run)."""
        hour = floor(span.start, HOUR)
        run = self.pointers(hour.date()).get(hour)
        key = ("minutes", self.slice, hour, run, self.fields)
        hit = self._cached(key)
        if hit is not None:
            self._add(span.start, None, (), lambda _rows: [b for b in hit if span.start <= b.start < span.end])
            return

        def emit(rows: Iterable[Any]) -> list[Bucket]:
            got = [ViewReader.bucket(utc(r.bucket_start), "minute", "batch", r) for r in rows]
            self._remember(key, got)
            return [b for b in got if span.start <= b.start < span.end]

        whole = self.cache is not None  # without a cache, read only the span
        lo, hi = (hour, hour + HOUR) if whole else (span.start, span.end)
        self._add(span.start, "minutes", (self.slice, hour, run, lo, hi), emit, int((hi - lo) / MINUTE))

    def hours(self, day: date, spans: list[Span]) -> None:
        """Serve whole hours of a day: cached ones from the cache, the others with one range read (<= 24 rows)."""
        pointers = self.pointers(day)
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
                    found[hour] = (ViewReader.bucket(hour, "hour", "batch", r),)
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
        sess = self.sess
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
