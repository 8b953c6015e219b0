"""Read both views from Cassandra for a merge plan: the state of both layers (its :class:`Coverage`) and the rows.

All statements are prepared once per reader and bound; every read uses the read consistency profile. A reader
holds one session, its statements and its caches, and no state of a request: the API keeps one for its lifetime and
every request uses it. The read path goes one way (:func:`serving.answer.answer` drives it):
:meth:`ViewReader.coverage` reads the state of both layers (with the current run of every hour of the window),
:func:`serving.plan.plan` splits the window, :meth:`ViewReader.stream` reads the rows of the plan's spans under the
runs of that same coverage (scheduled by :mod:`serving.read_schedule`), and :mod:`serving.merge` merges them.

Batch rows are immutable once their run is current (a rerun writes a new version under a new run id and swaps the
pointer), so a reader keeps the batch rows it has read in a bounded LRU (:class:`~serving.lru.RowCache`) keyed by
the run they belong to: a rerun changes the key, never the entry, and a cached row cannot be stale. Daily rollups are
keyed by the fingerprint of their day's pointers and cached only when the row read carries that fingerprint. Speed
rows change with every micro-batch: :mod:`serving.answer_cache` keeps them by the events the speed layer counted in
their minute. Whether rows may be kept at all depends on the consistency levels (:func:`rows_cacheable`).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from datetime import UTC, date, datetime, timedelta
from time import monotonic
from typing import TYPE_CHECKING, Any

from infra.service_settings import CassandraSettings
from infra.settings import Settings
from serving.answer_cache import AnswerCache
from serving.budget import ReadBudget
from serving.lru import RowCache
from serving.plan import Coverage, ServedBy, Span, SpeedCoverage
from serving.read_schedule import ReadSchedule
from serving.served_row import ServedRow
from views.buckets import HOUR, as_date, days_between, floor, month_key
from views.definition import slice_matcher, view_definition
from views.store import cql
from views.store.batch import BatchRows
from views.store.definitions import DefinitionStore, decode_serving
from views.store.losses import LossStore, decode_loss
from views.store.pointers import PointerStore, decode_pointers, decode_stale, decode_watermark, fingerprint_of
from views.store.rows import read_many
from views.store.speed import Epoch, SpeedRows, counted_span, decode_counted, decode_epochs, decode_freshness

if TYPE_CHECKING:
    from cassandra.cluster import Session

logger = logging.getLogger(__name__)

SKETCH_FIELDS = cql.SKETCH_FIELDS


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


def _batch_state(
    days: list[date],
    months: Mapping[str, list[date]],
    pointer_rows: list[Any],
    rollup_rows: list[list[Any]],
    stale_rows: list[Any],
) -> tuple[
    dict[date, dict[datetime, uuid.UUID]], dict[datetime, str | None], set[date], dict[datetime, int], set[datetime]
]:
    """Decode the batch view's state: each hour's run and definition, the current daily rollups, the stale hours.

    The last: the hours whose current run wrote ten-minute rows.
    """
    pointers = decode_pointers(pointer_rows)  # the days' rows, read together
    runs = _runs_by_day(days, pointers)
    indexed = {h: p.indexed for h, p in pointers.items()}
    definitions = {h: p.definition for h, p in pointers.items()}
    tens = {h for h, p in pointers.items() if p.tens}
    current: set[date] = set()
    for month_days, rollups in zip(months.values(), rollup_rows, strict=True):
        wanted = set(month_days)
        for r in rollups:
            day = as_date(r.day)
            if day in wanted and r.hour_runs == fingerprint_of(runs[day]):
                current.add(day)
    stale = {}
    for hour, records in decode_stale(stale_rows).items():  # stale while the index holds more than its run read
        read = indexed.get(hour)
        if hour in runs.get(hour.date(), {}) and read is not None and records > read:
            stale[hour] = records - read
    return runs, definitions, current, stale, tens


def _runs_by_day(days: Iterable[date], pointers: Mapping[datetime, Any]) -> dict[date, dict[datetime, uuid.UUID]]:
    """Return the current run of each hour, by day: every day asked, with or without a completed hour."""
    runs: dict[date, dict[datetime, uuid.UUID]] = {day: {} for day in days}
    for h, p in pointers.items():
        runs.setdefault(h.date(), {})[h] = p.run_id
    return runs


def rollups_until(speed: SpeedCoverage | None, settings: Settings) -> datetime | None:
    """Return the time by which speed intervals are worth reading from rollups (None: none).

    The speed layer merges an interval once its Spark watermark has passed its end: the intervals ending by
    :meth:`SpeedCoverage.final_until`. Newer ones are read as minutes at once rather than looked up and missed.
    """
    return speed.final_until(settings.speed.allowed_lateness_s) if speed is not None else None


def edge_ttl(settings: Settings) -> timedelta | None:
    """Return how long the speed layer keeps its intervals' edges (None: it writes none)."""
    ttl = settings.speed.edge_ttl_s if settings.speed.write_rollups else 0
    return timedelta(seconds=ttl) if ttl > 0 else None


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
        self.definitions = DefinitionStore(settings, sess)
        self._serving_query = settings.speed.query_name  # the last serving query read (read with the state)
        self._boundary: tuple[datetime | None] | None = None  # the last boundary read (None: none read yet)
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

    def pointers(self, day: date) -> dict[datetime, uuid.UUID]:
        """Return the current batch run per completed hour of a day (read now)."""
        return self.read_pointers([day])[0][day]

    def read_pointers(
        self, days: Iterable[date]
    ) -> tuple[dict[date, dict[datetime, uuid.UUID]], dict[datetime, int | None]]:
        """Return the current run per hour of each day, and the indexed records each run read (one round)."""
        wanted = sorted(set(days))
        rows = read_many(self.sess, self.pointer_store.pointers_requests(wanted))
        pointers = decode_pointers(r for chunk in rows for r in chunk)
        return _runs_by_day(wanted, pointers), {h: p.indexed for h, p in pointers.items()}

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
        window's days, the daily rollups' fingerprints of its months, and the speed coverage from the boundary read
        last), and one more for the speed coverage only when the boundary moved back (or on the first read) or a
        promote changed the serving query. Decoded store by store: the batch pointers, the losses, the speed
        layer's state.
        """
        began = monotonic()  # the state read is as old as its start (a slow read must not look fresh)
        days = days_between(start, end)
        months: dict[str, list[date]] = {}
        for day in days:
            months.setdefault(month_key(day), []).append(day)
        query = self._serving_query
        topic = self.settings.kafka.events_topic
        # what the speed layer counted is read from the boundary on, which the first reads return: read it with them
        # from the boundary read last (it moves forward an hour at a time), and again only when it moved back
        ahead = self._ahead(start, end)
        ahead_reqs = self.speed_rows.counted_requests(query, slice_, *ahead) if ahead is not None else []
        pointer_reqs = self.pointer_store.pointers_requests(days)
        rows = read_many(
            self.sess,
            [
                self.pointer_store.watermark_request(),
                self.pointer_store.stale_request(topic, floor(start, HOUR), end),
                *pointer_reqs,
                *(self.batch_rows.fingerprints_request(slice_, m) for m in months),
                self.loss_store.losses_request(topic),
                self.speed_rows.progress_request(query),
                self.speed_rows.epochs_request(query),
                self.definitions.serving_request(),
                *ahead_reqs,
            ],
        )
        ahead_rows = rows[len(rows) - len(ahead_reqs) :]
        rows = rows[: len(rows) - len(ahead_reqs)]
        mark_rows, stale_rows = rows[:2]
        pointer_rows = [r for chunk in rows[2 : 2 + len(pointer_reqs)] for r in chunk]
        rollup_rows = rows[2 + len(pointer_reqs) : -4]
        loss_rows, prog_rows, epoch_rows, serving_rows = rows[-4:]
        serving_row = next(iter(serving_rows), None)
        if serving_row is not None and serving_row.query != query:  # a promote: read the new version's state
            query = self._serving_query = serving_row.query
            ahead = None
            prog_rows, epoch_rows = read_many(
                self.sess, [self.speed_rows.progress_request(query), self.speed_rows.epochs_request(query)]
            )
        # the batch view: the watermark, each hour's run, the current daily rollups, stale hours
        mark = decode_watermark(mark_rows[0] if mark_rows else None)
        runs, hour_definitions, current, stale, tens = _batch_state(days, months, pointer_rows, rollup_rows, stale_rows)
        hours = {h for day in days for h in runs[day]}
        # records lost before they were indexed
        losses = [decode_loss(topic, r) for r in loss_rows]
        incomplete = self.loss_store.incomplete(topic, start, end, losses) if losses else {}
        # the speed view: its freshness, its epochs and what they counted
        newest, updated = decode_freshness(prog_rows)
        epochs = decode_epochs(epoch_rows)
        self._boundary = (mark.boundary,)
        kept, counted = self._counted(query, slice_, (start, end), mark.boundary, epochs, ahead, ahead_rows)
        # the view version: which batch hours and speed epochs define the slice as the serving definition does
        version = decode_serving(serving_row, self.settings, epochs)
        served_by, same = self._slice_version(version.query, version.fingerprint, slice_)
        other_hours = frozenset(h for h, fp in hour_definitions.items() if fp is not None and not same(fp))
        other_epochs = frozenset(e.id for e in epochs if not same(e.definition or version.fingerprint))
        cov = Coverage(
            speed=SpeedCoverage(
                tuple(epochs), kept, counted, datetime.now(UTC), other_epochs, self.settings.serving.speed_live_within
            ),
            stale=stale,
            incomplete=incomplete,
            boundary=mark.boundary,
            pinned=mark.pinned is not None,
            batch_low=mark.low,
            batch_hours=hours,
            current_days=current,
            speed_newest_event=newest,
            speed_updated_at=updated,
            runs=runs,
            other_definition=other_hours,
            version=served_by,
            tens=frozenset(tens),
        )
        if self.settings.serving.state_max_age_ms > 0:
            self._recent.keep((start, end, slice_), began, cov)
        return cov

    def _counted(
        self,
        query: str,
        slice_: str,
        window: tuple[datetime, datetime],
        boundary: datetime | None,
        epochs: list[Epoch],
        ahead: tuple[datetime, datetime] | None,
        ahead_rows: list[list[Any]],
    ) -> tuple[dict[tuple[datetime, str], datetime | None], dict[tuple[str, datetime], int]]:
        """Return what the speed layer counted in its part of the window: from the rows read ahead when they hold it."""
        span = counted_span(*window, boundary, epochs)
        if span is None:
            return {}, {}
        if ahead is not None and floor(span[0], HOUR) >= floor(ahead[0], HOUR):
            return decode_counted(ahead_rows, span)
        return self.speed_rows.counted(query, slice_, *window, boundary, epochs)

    def _ahead(self, start: datetime, end: datetime) -> tuple[datetime, datetime] | None:
        """Return the part of the window whose speed coverage to read with the state (None: wait for the boundary)."""
        if self._boundary is None:
            return None
        (boundary,) = self._boundary
        lo = start if boundary is None else max(start, floor(boundary, HOUR))
        return (lo, end) if lo < end else None

    def _slice_version(self, query: str, fp: str | None, slice_: str) -> tuple[ServedBy, Callable[[str | None], bool]]:
        """Return the version serving a slice, and a test whether a definition defines the slice the same way."""
        serving = self.definitions.get(fp) if fp else None
        mine, servable = slice_matcher(serving or view_definition(self.settings), fp, slice_, self.definitions.get)
        return ServedBy(query, fp, mine), servable

    def read(
        self,
        spans: list[Span],
        slice_: str,
        fields: Iterable[str] = SKETCH_FIELDS,
        runs: Mapping[date, Mapping[datetime, uuid.UUID]] | None = None,
        rollups: Coverage | None = None,
        day_parts: bool = False,
    ) -> list[ServedRow]:
        """Return all the rows that serve the spans, in time order (see :meth:`stream`; this holds them all)."""
        return list(self.stream(spans, slice_, fields, runs=runs, rollups=rollups, day_parts=day_parts))

    def stream(
        self,
        spans: list[Span],
        slice_: str,
        fields: Iterable[str] = SKETCH_FIELDS,
        budget: ReadBudget | None = None,
        runs: Mapping[date, Mapping[datetime, uuid.UUID]] | None = None,
        query: str | None = None,
        rollups: Coverage | None = None,
        day_parts: bool = False,
    ) -> Iterator[ServedRow]:
        """Yield the rows that serve the spans (gaps read nothing) in time order, as they arrive.

        Few rows are held at once: a long read with sketches comes in pages of :data:`PAGE_ROWS_SKETCHES` rows (a short
        one in one page), and reads run ahead only while their first pages stay within :data:`IN_FLIGHT_ROWS` rows: a
        long window costs time, not memory.
        Consecutive whole hours of a day are read with one range query; rows of other runs are dropped. Only the
        sketches in ``fields`` are read (the others are empty in the served rows): an answer that needs the items only
        moves a fraction of the bytes. Batch rows come from the cache when their run's rows were read before; a
        batch minute span reads (and caches) its whole hour of that run, so a sliding window reuses it.

        :arg budget: charged with every row yielded; it raises once the request has read too much.
        :arg runs: the current run of each hour of the batch spans' days, as the plan's coverage read them (the
            spans were planned with them); None reads them now.
        :arg query: the speed query (view version) the plan's coverage read (None: the last one read).
        :arg rollups: the plan's coverage, to read whole ten minutes from ten-minute rows (``serving.ten_minute_rows``):
            the batch view's of hours whose run wrote them, and the speed rollups of closed intervals (checked
            against its speed coverage). None: minutes only (a series by the minute).
        :arg day_parts: whole hours at a day's start or end may come from the day's parts (``batch.day_parts``): only
            for an answer whose coarsest rollup is a day (a series by the hour counts each hour apart).
        """
        if runs is None:
            batch_days = {s.start.date() for s in spans if s.layer == "batch"}
            runs = self.read_pointers(batch_days)[0] if batch_days else {}
        wanted = frozenset(fields)
        tens = rollups if self.settings.serving.ten_minute_rows else None
        until = rollups_until(tens.speed, self.settings) if tens is not None else None
        reads = ReadSchedule(
            self.sess, self.statements(wanted), self.cache, slice_, wanted, runs, query or self._serving_query,
            tens.speed if tens is not None else None, until, tens.tens if tens is not None else frozenset(),
            live=self.settings.speed.write_rollups and self.settings.speed.live_rollups,
            parts=day_parts and self.settings.batch.day_parts,
            edge_ttl=edge_ttl(self.settings),
        )  # fmt: skip
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
