"""The answer cache: merged windows kept by question, under the signature of what they rest on, and its algorithm.

Every question passes through :func:`serving.answer.answer`, which asks this module when the cache is on.

What a serving process keeps between requests is keyed by what makes it true, so nothing kept can be stale:

* Rows (:class:`~serving.lru.RowCache`, held by the reader). Batch rows are keyed by the run they belong to
  (immutable once current: a rerun changes the key, never the entry). Speed minutes are keyed by the epoch that owns
  the minute and the events it says it counted there (:func:`speed_key`): the speed layer writes the full cumulative
  state of a minute, then its count, so a row holding as many events as counted is that state, and a minute whose
  count moved has a new key (its old row is simply not asked for again).
* :class:`AnswerCache` — merged windows per :class:`Question` (the windows, the slice, the sketches, the resolution,
  the item), with the signature they were merged under: the plan (the boundary or pin, every span and gap with its
  reason, so a gap that appears — speed rows expiring at their hour's keep-until — changes it), the run of every
  batch hour merged (and the pointers' fingerprint of every daily rollup) and, per speed minute, its owning epoch
  and count. A repeated question whose signature is unchanged is a lookup (:func:`lookup`); when only the speed part
  moved, the merged batch part is kept, and so is the merged part of the speed minutes older than the speed layer's
  lateness (final for their epoch): only the newer minutes are merged again, and only those whose count changed are
  read (:func:`merge_cached`).

A question whose rows are kept (a per-item series may be asked of them later), or asked with the cache off, is read
whole and merged as its rows stream in, by :func:`serving.answer.answer` without this cache.

Provenance is never cached: every answer is described from the coverage read for it (:mod:`serving.provenance`).
"""

from __future__ import annotations

import heapq
import logging
import uuid
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, NamedTuple, Protocol

from infra.settings import Settings
from serving.budget import ReadBudget
from serving.lru import BytesLru, RowCache
from serving.merge import Merged, MergedPart
from serving.plan import RESOLUTIONS, Coverage, Resolution, Span, runs
from serving.served_row import ServedRow
from views.buckets import HOUR, MINUTE, floor

logger = logging.getLogger(__name__)


class RowSource(Protocol):
    """What the answer reads through: the view reader, which holds the caches.

    A protocol, so :mod:`serving.reader` and this module do not import each other.
    """

    settings: Settings
    speed_cache: RowCache | None
    answers: AnswerCache | None

    def recent_coverage(self, start: datetime, end: datetime, slice_: str) -> Coverage | None:
        """Return the coverage of this window read moments ago (None: none that recent)."""
        ...

    def coverage(self, start: datetime, end: datetime, slice_: str) -> Coverage:
        """Read the state of both layers over the window."""
        ...

    def stream(
        self,
        spans: list[Span],
        slice_: str,
        fields: Iterable[str] = ...,
        budget: ReadBudget | None = None,
        runs: Mapping[date, Mapping[datetime, uuid.UUID]] | None = None,
        query: str | None = None,
        rollups: Coverage | None = None,
        day_parts: bool = False,
    ) -> Iterator[ServedRow]:
        """Yield the rows that serve the spans, in time order (speed rows of ``query``, the serving version)."""
        ...


KEEP_SPEED_MINUTES = 360  # a question's speed minutes are kept one by one up to this many (~13 MB of 36 KB rows)

SpeedMinuteVersion = tuple[datetime, str, int]  # a minute of a speed span, the epoch owning it, the events it counted


class Question(NamedTuple):
    """What an answer is kept under: the windows, the slice, the coarsest rollup, the sketches and the item."""

    windows: tuple[tuple[datetime, datetime], ...]
    slice: str
    coarsest: Resolution
    fields: frozenset[str]
    item: str | None


@dataclass(frozen=True)
class SpeedPart:
    """A window's settled speed minutes (older than the speed layer's lateness) merged, with their versions.

    :arg versions: (minute, epoch, events counted) of each minute merged, in time order.
    :arg holes: those minutes counted whose rows were missing or short.
    """

    versions: tuple[SpeedMinuteVersion, ...]
    part: MergedPart
    holes: frozenset[datetime]


@dataclass
class Answer:
    """A question's merged windows and what they were merged under.

    :arg batch_signature: the batch spans with their runs (and daily fingerprints).
    :arg signature: the batch signature, the plan's speed spans and gaps, and each speed minute's epoch and count.
    :arg merged: each window's rows merged (the provenance is described anew on every use).
    :arg holes: speed minutes counted whose rows were missing or short (answered as gaps).
    """

    batch_signature: Hashable
    signature: Hashable
    batch_parts: list[MergedPart]
    merged: list[Merged]
    holes: frozenset[datetime]
    speed_bytes: int  # the speed rows' sketch bytes merged (the budget of a hit)
    size: int
    speed_parts: list[SpeedPart]  # per window, its settled speed minutes merged


class AnswerCache(BytesLru[Answer]):
    """Merged answers by question (:class:`Answer`), an LRU bounded in bytes; counts full hits, speed-only moves."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes)
        self.partial = 0  # questions answered with the batch part kept, only changed speed minutes read

    def count(self, outcome: str) -> None:
        """Count a question's outcome: ``hit`` (a lookup), ``partial`` (speed minutes re-read) or ``miss``."""
        with self._lock:
            if outcome == "hit":
                self.hits += 1
            elif outcome == "partial":
                self.partial += 1
            else:
                self.misses += 1

    def put(self, key: Hashable, answer: Answer) -> None:
        """Keep an answer (replacing the question's previous one)."""
        self._put(key, answer, answer.size)


def speed_key(slice_: str, fields: frozenset[str], epoch: str, minute: datetime, counted: int) -> Hashable:
    """Return the key of a speed minute's row: valid while its owning epoch's count of the minute is ``counted``."""
    return ("speed", slice_, fields, epoch, minute, counted)


# -- the algorithm ----------------------------------------------------------------------------------------------------
Merge = tuple[list[Merged], frozenset[datetime]]  # each window merged, and the speed minutes answered as gaps


def lookup(
    cache: AnswerCache, question: Question, plans: list[list[Span]], cov: Coverage, budget: ReadBudget | None
) -> Merge | None:
    """Return the cached merge when its signature is the plans' (a lookup), else None."""
    before = cache.peek(question)
    if before is None or before.signature != _signature(plans, cov)[2]:
        return None
    cache.count("hit")
    if budget is not None:
        budget.charge_bytes(sum(p.sketch_bytes for p in before.batch_parts) + before.speed_bytes, 0)
    return before.merged, before.holes


def merge_cached(
    reader: RowSource,
    cache: AnswerCache,
    question: Question,
    plans: list[list[Span]],
    cov: Coverage,
    budget: ReadBudget | None,
) -> Merge:
    """Answer from the cache when nothing the answer rests on moved; else read only what moved, merge, keep."""
    hit = lookup(cache, question, plans, cov, budget)
    if hit is not None:
        return hit
    batch_signature, _, signature = _signature(plans, cov)
    rollups = cov if question.coarsest != "minute" else None  # a ten-minute row never splits into minutes
    before = cache.peek(question)
    step = RESOLUTIONS[question.coarsest]
    if before is not None and before.batch_signature == batch_signature:
        cache.count("partial")
        parts = before.batch_parts
        if budget is not None:
            budget.charge_bytes(sum(p.sketch_bytes for p in parts), 0)
    else:
        cache.count("miss")
        batch_spans = [s for spans in plans for s in spans if s.layer == "batch"]
        rows = (
            reader.stream(
                batch_spans,
                question.slice,
                question.fields,
                budget,
                runs=cov.runs,
                rollups=rollups,
                day_parts=question.coarsest == "day",
            )
            if batch_spans
            else ()
        )
        parts = _batch_parts(question, rows, step)
    settled_before = _settled_before(reader.settings.speed.allowed_lateness_s, cov)
    olds = before.speed_parts if before is not None else [None] * len(question.windows)
    holes: set[datetime] = set()
    merged: list[Merged] = []
    speed_parts: list[SpeedPart] = []
    speed_bytes = 0
    for part, spans, old in zip(parts, plans, olds, strict=True):
        versions = _speed_minutes([spans], cov)
        settled = tuple(v for v in versions if v[0] < settled_before)
        sp = _settled_part(reader, question, settled, old, budget, speed_query(cov), rollups)
        speed_parts.append(sp)
        holes |= sp.holes
        m = Merged(step, question.item)
        m.add_part(part)
        m.add_part(sp.part)
        fresh = versions[len(settled) :]
        m.add_all(_speed_rows(reader, question, fresh, budget, holes, speed_query(cov)))  # merged as they stream in
        speed_bytes += m.sketch_bytes - part.sketch_bytes
        merged.append(m)
    if holes:
        logger.warning(
            "%d speed minute(s) counted by the speed layer have no (whole) row: answered as gaps", len(holes)
        )
    size = sum(p.size for p in parts) + sum(sp.part.size for sp in speed_parts) + sum(m.size for m in merged)
    kept = Answer(batch_signature, signature, parts, merged, frozenset(holes), speed_bytes, size, speed_parts)
    cache.put(question, kept)
    return merged, kept.holes


def _speed_minutes(plans: list[list[Span]], cov: Coverage) -> list[SpeedMinuteVersion]:
    """Return every minute the plans serve from the speed view, with its owning epoch and count (its version)."""
    out: list[SpeedMinuteVersion] = []
    counted = cov.speed.counted
    for spans in plans:
        for s in spans:
            if s.layer != "speed":
                continue
            owner = cov.speed.owner(s.start)  # spans are cut where the owner changes: one owner per span
            epoch = owner.id if owner is not None else ""
            out.extend((m, epoch, counted.get((epoch, m), 0)) for m in s.minutes())
    return out


def _batch_signature(plans: list[list[Span]], cov: Coverage) -> tuple[Any, ...]:
    """Return what makes the batch part of the plans true: its spans, each hour's run, each daily rollup's runs."""
    out: list[Any] = []
    for spans in plans:
        for s in spans:
            if s.layer != "batch":
                continue
            if s.resolution == "day":
                day_runs = cov.runs.get(s.start.date(), {})
                out.append((s.start, s.end, "day", tuple(sorted(day_runs.items()))))
            else:
                hour = floor(s.start, HOUR)
                hours = []
                while hour < s.end:
                    hours.append((hour, cov.runs.get(hour.date(), {}).get(hour)))
                    hour += HOUR
                out.append((s.start, s.end, s.resolution, tuple(hours)))
    return tuple(out)


def _signature(plans: list[list[Span]], cov: Coverage) -> tuple[Any, list[SpeedMinuteVersion], Any]:
    """Return the batch signature, the speed minutes with their versions, and the whole signature of the plans."""
    # the serving view version first: a promote changes every answer's signature (no answer of the old one is kept)
    batch_signature = (cov.version, _batch_signature(plans, cov))
    minutes = _speed_minutes(plans, cov)
    others = tuple((s.start, s.end, s.layer, s.reason) for spans in plans for s in spans if s.layer != "batch")
    return batch_signature, minutes, (batch_signature, others, tuple(minutes))


def speed_query(cov: Coverage) -> str | None:
    """Return the speed query (view version) a coverage was read for."""
    return cov.version.query if cov.version is not None else None


def _batch_parts(question: Question, rows: Iterable[ServedRow], step: timedelta) -> list[MergedPart]:
    """Merge each window's batch rows, as they stream in, into one part: its counts and its sketches, serialized."""
    merged = [Merged(step, question.item) for _ in question.windows]
    for b in rows:
        for m, (start, end) in zip(merged, question.windows, strict=True):
            if start <= b.start < end:
                m.add(b)
                break
    return [m.part() for m in merged]


def _settled_before(allowed_lateness_s: float, cov: Coverage) -> datetime:
    """Return the minute before which the speed layer no longer changes its rows (its lateness behind its newest).

    Late events up to ``speed.allowed_lateness_s`` behind the newest event still update a minute's row; older
    minutes are final for their epoch (:meth:`SpeedCoverage.final_until`), so the answer keeps them merged in one
    part, and a speed move re-merges only the minutes after it.
    """
    final = cov.speed.final_until(allowed_lateness_s)
    return datetime.min.replace(tzinfo=UTC) if final is None else final


def _settled_part(
    reader: RowSource,
    question: Question,
    settled: tuple[SpeedMinuteVersion, ...],
    old: SpeedPart | None,
    budget: ReadBudget | None,
    query: str | None = None,
    rollups: Coverage | None = None,
) -> SpeedPart:
    """Return the window's settled speed minutes merged: the previous part as it was, extended, or built anew."""
    if old is not None and old.versions == settled:
        if budget is not None:
            budget.charge_bytes(old.part.sketch_bytes, 0)
        return old
    seed = None
    new = settled
    if old is not None and old.versions and settled[: len(old.versions)] == old.versions:
        seed, new = old, settled[len(old.versions) :]  # minutes settled since: merged into the previous part
        if budget is not None:
            budget.charge_bytes(old.part.sketch_bytes, 0)
    holes: set[datetime] = set(seed.holes) if seed is not None else set()
    m = Merged(RESOLUTIONS[question.coarsest], question.item)
    if seed is not None:
        m.add_part(seed.part)
    m.add_all(_speed_rows(reader, question, list(new), budget, holes, query, rollups))
    return SpeedPart(settled, m.part(), frozenset(holes))


def _speed_rows(
    reader: RowSource,
    question: Question,
    minutes: list[SpeedMinuteVersion],
    budget: ReadBudget | None,
    holes: set[datetime],
    query: str | None = None,
    rollups: Coverage | None = None,
) -> Iterator[ServedRow]:
    """Yield the speed rows of the minutes in time order (kept ones from the cache, the others read); note the holes.

    With ``rollups`` (the plan's speed coverage), whole closed intervals among the minutes to read come from their
    rollups where they match what was counted (never kept one by one: they are not minutes).

    A row is kept under its minute's version only when it holds exactly the events its epoch counted there (a
    short row is a hole; a longer one was written by a micro-batch whose count is not recorded yet: used, not kept).
    A minute counted events in whose row is missing or short is a hole (answered as a gap). Rows are kept one by one
    only for a question with at most :data:`KEEP_SPEED_MINUTES` of them: a long speed window (the batch layer
    lagging) streams through, costing time, not memory.
    """
    slice_, fields = question.slice, question.fields
    cache = reader.speed_cache if len(minutes) <= KEEP_SPEED_MINUTES else None
    kept: list[ServedRow] = []
    todo: dict[datetime, SpeedMinuteVersion] = {}
    for version in minutes:
        minute, epoch, counted = version
        hit = cache.get(speed_key(slice_, fields, epoch, minute, counted)) if cache is not None else None
        if hit is None:
            todo[minute] = version
        elif hit:
            kept.append(hit[0])
            if budget is not None:
                budget.charge(hit[0])
    spans = [Span(a, b, "speed", "minute") for a, b, _ in runs([(m, None) for m in sorted(todo)], MINUTE)]
    read = reader.stream(spans, slice_, fields, budget, query=query, rollups=rollups) if todo else iter(())
    seen: set[datetime] = set()
    yield from heapq.merge(kept, _checked(read, todo, holes, seen, cache, question), key=lambda b: b.start)
    for minute, (_, epoch, counted) in todo.items():
        if minute in seen:
            continue
        if counted > 0:
            holes.add(minute)  # counted, but no row
        elif cache is not None:
            cache.put(speed_key(slice_, fields, epoch, minute, counted), ())


def _checked(
    read: Iterable[ServedRow],
    todo: dict[datetime, SpeedMinuteVersion],
    holes: set[datetime],
    seen: set[datetime],
    cache: RowCache | None,
    question: Question,
) -> Iterator[ServedRow]:
    """Yield the rows read that hold at least what their epoch counted (keeping exact ones), noting short ones."""
    for bucket in read:
        if bucket.resolution != "minute":  # a rollup, read only when it holds exactly what its minutes counted
            seen.update(bucket.minutes())
            yield bucket
            continue
        version = todo.get(bucket.start)
        if version is None:
            continue
        seen.add(bucket.start)
        _, epoch, counted = version
        if bucket.events < counted:
            holes.add(bucket.start)
            continue
        if cache is not None and bucket.events == counted:
            cache.put(speed_key(question.slice, question.fields, epoch, bucket.start, counted), (bucket,))
        yield bucket
