"""Answers over the merged views: counts, distinct users, quantiles, top-N, trending items and time series.

Every answer carries its provenance (which spans came from which layer, the boundary, the speed layer's
freshness), its gaps, and its error bounds, so a reader can tell a fresh approximate figure from an exact one.

Trending score: ``lift = (recent + 1) / (baseline_upper * len(recent)/len(baseline) + 1)`` — the item's count in the
recent window against the upper bound of its count in the baseline window (so an item the baseline's sketch stopped
tracking cannot fake a rise) scaled to the same length, with one pseudo-event on both
sides so an item with no baseline gets a finite lift that grows with its recent count, and noise on tiny counts
cannot dominate. Items need ``min_support`` recent events; they rank by lift, then recent count.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import datasketches as ds

from serving.cache import Answer, AnswerCache, BatchPart, Bucket, RowCache, SpeedPart, speed_key
from serving.merge import GAP_REASONS, Resolution, Span, plan, punch
from serving.store import SKETCH_FIELDS, Coverage, ReadBudget, ViewReader
from views import sketches
from views.buckets import DAY, HOUR, MINUTE, floor

logger = logging.getLogger(__name__)

RESOLUTIONS = {"minute": MINUTE, "hour": HOUR, "day": DAY}

# The sketches each answer reads (the count is always read).
NEEDS: dict[str, tuple[str, ...]] = {
    "count": (),
    "users": ("users_hll",),
    "quantiles": ("values_kll",),
    "top": ("items_fi",),
    "trending": ("items_fi",),
    "series": (),
    "series_item": ("items_fi",),
    "summary": SKETCH_FIELDS,
}


@dataclass
class Provenance:
    """Which layer served which span, and the state of both layers."""

    spans: list[dict[str, Any]]
    gaps: list[dict[str, Any]]
    boundary: datetime | None
    boundary_pinned: bool
    speed_newest_event: datetime | None
    speed_updated_at: datetime | None
    stale: list[dict[str, Any]] = field(default_factory=list)  # batch hours with records indexed since their run
    # hours that records removed from Kafka before they were indexed may belong to: incomplete, whoever served them
    incomplete: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, spans: list[Span], cov: Coverage) -> Provenance:
        """Describe a plan and the coverage it was made with."""

        def d(s: Span) -> dict[str, Any]:
            out: dict[str, Any] = {"start": s.start, "end": s.end, "layer": s.layer, "resolution": s.resolution}
            if s.reason:
                out["reason"] = s.reason
            return out

        return cls(
            spans=[d(s) for s in spans if s.layer != "gap"],
            gaps=[d(s) for s in spans if s.layer == "gap"],
            boundary=cov.boundary,
            boundary_pinned=cov.pinned,
            speed_newest_event=cov.speed_newest_event,
            speed_updated_at=cov.speed_updated_at,
            stale=[
                {"hour": h, "records_since": n}
                for h, n in sorted(cov.stale.items())
                if any(s.layer == "batch" and s.start < h + HOUR and h < s.end for s in spans)
            ],
            incomplete=_incomplete_ranges(cov, spans),
        )


def _incomplete_ranges(cov: Coverage, spans: list[Span]) -> list[dict[str, Any]]:
    """Return the incomplete hours the answered spans touch, as ranges of hours with the same losses."""
    out: list[dict[str, Any]] = []
    for hour, losses in sorted(cov.incomplete.items()):
        if not any(s.layer != "gap" and s.start < hour + HOUR and hour < s.end for s in spans):
            continue
        described = [loss.describe() for loss in losses]
        if out and out[-1]["end"] == hour and out[-1]["losses"] == described:
            out[-1]["end"] = hour + HOUR
        else:
            out.append({"start": hour, "end": hour + HOUR, "losses": described})
    return out


class Merged:
    """A window's rows merged as they stream in: the count, the sketches' union and the counts per bucket.

    Rows are not kept (unless the window is loaded with ``keep_rows``): an answer over a long window holds the
    merged sketches, never the window's rows.
    """

    def __init__(self, step: timedelta, item: str | None = None) -> None:
        self.step = step
        self.item = item
        self.events = 0
        self.rows = 0
        self.sketches = sketches.SketchUnion()
        self.counts: dict[datetime, int] = defaultdict(int)  # events per step (or the item's estimate)
        # answers derived from these merged sketches (a cached window is asked the same questions again)
        self.derived: dict[tuple[Any, ...], Any] = {}

    def add(self, b: Bucket) -> None:
        """Merge one row."""
        self.events += b.events
        self.rows += 1
        key = floor(b.start, self.step)
        if self.item is None:
            self.counts[key] += b.events
            self.sketches.add(b.users_hll, b.values_kll, b.items_fi)
        elif b.items_fi:  # a per-item series: the item's estimate per bucket, no union needed
            self.counts[key] += int(ds.frequent_strings_sketch.deserialize(b.items_fi).get_estimate(self.item))


@dataclass
class Window:
    """A query window, its rows merged, and the provenance of the rows."""

    start: datetime
    end: datetime
    slice: str
    provenance: Provenance
    merged: Merged
    buckets: list[Bucket] = field(default_factory=list)  # only when loaded with keep_rows


def load(
    reader: ViewReader,
    start: datetime,
    end: datetime,
    slice_: str,
    coarsest: Resolution = "day",
    fields: Sequence[str] = SKETCH_FIELDS,
    *,
    item: str | None = None,
    keep_rows: bool | None = None,
    budget: ReadBudget | None = None,
) -> Window:
    """Plan the window with the merge rule (rollups no coarser than ``coarsest``) and merge its rows as they come.

    :arg fields: the sketches the answer needs (:data:`NEEDS`); the others are left empty.
    :arg item: merge the per-bucket estimates of this item only (a per-item :func:`series`).
    :arg keep_rows: also keep the rows in ``Window.buckets``; by default only when a per-item series may be asked
        of the window later (the items are read at a resolution finer than days and no ``item`` is given).
    :arg budget: what the request may read (``serving.max_read_mb``).
    """
    return load_many(reader, [(start, end)], slice_, coarsest, fields, item=item, keep_rows=keep_rows, budget=budget)[0]


def load_many(
    reader: ViewReader,
    windows: Sequence[tuple[datetime, datetime]],
    slice_: str,
    coarsest: Resolution = "day",
    fields: Sequence[str] = SKETCH_FIELDS,
    *,
    item: str | None = None,
    keep_rows: bool | None = None,
    budget: ReadBudget | None = None,
) -> list[Window]:
    """Load disjoint windows (e.g. trending's recent and baseline) with one coverage read and one stream of reads.

    One direction: read the state of both layers (:meth:`ViewReader.coverage`), plan every window with the merge
    rule, look the question up in the answer cache (:mod:`serving.cache`), read only what the cache lacks (under the
    runs the plan was made with), merge.
    """
    ordered = sorted(windows)
    if any(a[1] > b[0] for a, b in itertools.pairwise(ordered)):
        msg = f"windows overlap: {windows}"
        raise ValueError(msg)
    if keep_rows is None:
        keep_rows = "items_fi" in fields and coarsest != "day" and item is None
    lo, hi = min(w[0] for w in windows), max(w[1] for w in windows)
    question = (tuple(windows), slice_, coarsest, frozenset(fields), item)
    answers = reader.answers if not keep_rows else None
    recent = reader.recent_coverage(lo, hi, slice_) if answers is not None else None
    if answers is not None and recent is not None:  # state read moments ago: enough to answer from the cache
        plans = [_plan(recent, start, end, coarsest) for start, end in windows]
        hit = _hit(answers, question, plans, recent, budget)
        if hit is not None:
            return hit
    cov = reader.coverage(lo, hi, slice_)
    plans = [_plan(cov, start, end, coarsest) for start, end in windows]
    if answers is not None:
        return _answer(reader, answers, question, plans, cov, budget)
    return _merge_read(reader, windows, slice_, plans, cov, fields, item, keep_rows, budget, RESOLUTIONS[coarsest])


def _merge_read(
    reader: ViewReader,
    windows: Sequence[tuple[datetime, datetime]],
    slice_: str,
    plans: list[list[Span]],
    cov: Coverage,
    fields: Sequence[str],
    item: str | None,
    keep_rows: bool,
    budget: ReadBudget | None,
    step: timedelta,
) -> list[Window]:
    """Read every row of the plans and merge them as they stream in (no answer cache, or the rows are kept)."""
    out = [
        Window(start, end, slice_, Provenance.of(spans, cov), Merged(step, item))
        for (start, end), spans in zip(windows, plans, strict=True)
    ]
    speed_rows: set[datetime] = set()
    short: set[datetime] = set()  # speed rows holding fewer events than the speed layer counted there
    spans = [s for spans in plans for s in spans]
    for bucket in reader.stream(spans, slice_, fields, budget, runs=cov.runs):
        if bucket.layer == "speed":
            speed_rows.add(bucket.start)
            if bucket.events < cov.speed.expected(bucket.start):
                short.add(bucket.start)
                continue
        for w in out:
            if w.start <= bucket.start < w.end:
                w.merged.add(bucket)
                if keep_rows:
                    w.buckets.append(bucket)
                break
    holes = short | _missing_speed_rows(plans, cov, speed_rows)
    if holes:
        logger.warning(
            "%d speed minute(s) counted by the speed layer have no (whole) row: answered as gaps", len(holes)
        )
        for w, spans in zip(out, plans, strict=True):
            w.provenance = Provenance.of(punch(spans, holes), cov)
    return out


SpeedMinuteVersion = tuple[datetime, str, int]  # a minute of a speed span, the epoch owning it, the events it counted


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
                runs = cov.runs.get(s.start.date(), {})
                out.append((s.start, s.end, "day", tuple(sorted(runs.items()))))
            else:
                hour = floor(s.start, HOUR)
                hours = []
                while hour < s.end:
                    hours.append((hour, cov.runs.get(hour.date(), {}).get(hour)))
                    hour += HOUR
                out.append((s.start, s.end, s.resolution, tuple(hours)))
    return tuple(out)


def _plan(cov: Coverage, start: datetime, end: datetime, coarsest: Resolution) -> list[Span]:
    return plan(start, end, cov.boundary, cov.batch_hours, cov.current_days, cov.speed, coarsest)


def _signature(plans: list[list[Span]], cov: Coverage) -> tuple[Any, list[SpeedMinuteVersion], Any]:
    """Return the batch signature, the speed minutes with their versions, and the whole signature of the plans."""
    batch_signature = _batch_signature(plans, cov)
    minutes = _speed_minutes(plans, cov)
    others = tuple((s.start, s.end, s.layer, s.reason) for spans in plans for s in spans if s.layer != "batch")
    return batch_signature, minutes, (batch_signature, others, tuple(minutes))


def _hit(
    cache: AnswerCache, question: tuple[Any, ...], plans: list[list[Span]], cov: Coverage, budget: ReadBudget | None
) -> list[Window] | None:
    """Return the cached answer when its signature is the plans' (a lookup), else None."""
    before = cache.peek(question)
    if before is None or before.signature != _signature(plans, cov)[2]:
        return None
    cache.count("hit")
    if budget is not None:
        budget.charge_bytes(sum(p.sketch_bytes for p in before.batch_parts) + before.speed_bytes, 0)
    return _described(before.windows, plans, cov, before.holes)


def _answer(
    reader: ViewReader,
    cache: AnswerCache,
    question: tuple[Any, ...],
    plans: list[list[Span]],
    cov: Coverage,
    budget: ReadBudget | None,
) -> list[Window]:
    """Answer from the cache when nothing the answer rests on moved; else read only what moved, merge, keep."""
    hit = _hit(cache, question, plans, cov, budget)
    if hit is not None:
        return hit
    windows, slice_, coarsest, fields, item = question
    batch_signature, _, signature = _signature(plans, cov)
    before = cache.peek(question)
    step = RESOLUTIONS[coarsest]
    if before is not None and before.batch_signature == batch_signature:
        cache.count("partial")
        parts = before.batch_parts
        if budget is not None:
            budget.charge_bytes(sum(p.sketch_bytes for p in parts), 0)
    else:
        cache.count("miss")
        batch_spans = [s for spans in plans for s in spans if s.layer == "batch"]
        rows = reader.stream(batch_spans, slice_, fields, budget, runs=cov.runs) if batch_spans else iter(())
        parts = _batch_parts(windows, rows, step, item)
    settled_before = _settled_before(reader, cov)
    olds = before.speed_parts if before is not None else [None] * len(windows)
    holes: set[datetime] = set()
    merged: list[Window] = []
    speed_parts: list[SpeedPart] = []
    speed_bytes = 0
    for (start, end), part, spans, old in zip(windows, parts, plans, olds, strict=True):
        versions = _speed_minutes([spans], cov)
        settled = tuple(v for v in versions if v[0] < settled_before)
        sp = _settled_part(reader, question, settled, old, budget)
        speed_parts.append(sp)
        holes |= sp.holes
        m = Merged(step, item)
        m.events = part.events + sp.part.events
        m.rows = part.rows + sp.part.rows
        m.counts = defaultdict(int, part.counts)
        for t, n in sp.part.counts.items():
            m.counts[t] += n
        if item is None:
            m.sketches.add(*part.sketches)
            m.sketches.add(*sp.part.sketches)
        tail = versions[len(settled) :]
        for b in _speed_rows(reader, slice_, fields, tail, budget, holes):  # merged as they stream in
            speed_bytes += b.sketch_bytes
            m.add(b)
        speed_bytes += sp.part.sketch_bytes
        merged.append(Window(start, end, slice_, Provenance.of([], cov), m))
    if holes:
        logger.warning(
            "%d speed minute(s) counted by the speed layer have no (whole) row: answered as gaps", len(holes)
        )
    size = sum(p.size for p in parts) + sum(sp.part.size for sp in speed_parts)
    size += sum(_merged_size(w.merged) for w in merged)
    answer = Answer(batch_signature, signature, parts, merged, frozenset(holes), speed_bytes, size, speed_parts)
    cache.put(question, answer)
    return _described(merged, plans, cov, holes)


def _settled_before(reader: ViewReader, cov: Coverage) -> datetime:
    """Return the minute before which the speed layer no longer changes its rows (its lateness behind its newest).

    Late events up to ``speed.allowed_lateness_s`` behind the newest event still update a minute's row; older
    minutes are final for their epoch, so the answer keeps them merged in one part, and a speed move re-merges only
    the minutes after it.
    """
    fresh = cov.speed.fresh_until
    if fresh is None:
        return datetime.min.replace(tzinfo=UTC)
    lateness = timedelta(seconds=reader.settings.speed.allowed_lateness_s)
    return floor(fresh - lateness, MINUTE) - MINUTE


def _settled_part(
    reader: ViewReader,
    question: tuple[Any, ...],
    settled: tuple[SpeedMinuteVersion, ...],
    old: SpeedPart | None,
    budget: ReadBudget | None,
) -> SpeedPart:
    """Return the window's settled speed minutes merged: the previous part as it was, extended, or built anew."""
    _, slice_, coarsest, fields, item = question
    step = RESOLUTIONS[coarsest]
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
    rows = _speed_rows(reader, slice_, fields, list(new), budget, holes)
    part = _merge_part(rows, step, item, seed.part if seed is not None else None)
    return SpeedPart(settled, part, frozenset(holes))


def _merge_part(rows: Iterable[Bucket], step: timedelta, item: str | None, seed: BatchPart | None) -> BatchPart:
    """Merge rows as they stream in into one part (on top of ``seed``'s): counts, sketches serialized, bytes read."""
    union = sketches.SketchUnion()
    events, count, spent = 0, 0, 0
    counts: dict[datetime, int] = defaultdict(int)
    if seed is not None:
        events, count, spent = seed.events, seed.rows, seed.sketch_bytes
        counts.update(seed.counts)
        union.add(*seed.sketches)
    for b in rows:
        events += b.events
        count += 1
        spent += b.sketch_bytes
        key = floor(b.start, step)
        if item is None:
            counts[key] += b.events
            union.add(b.users_hll, b.values_kll, b.items_fi)
        elif b.items_fi:
            counts[key] += int(ds.frequent_strings_sketch.deserialize(b.items_fi).get_estimate(item))
    return BatchPart(events, count, dict(counts), union.serialized(), spent)


def _merged_size(m: Merged) -> int:
    """Return roughly what a merged window holds: its counts and its sketches serialized."""
    size = 200 * (1 + len(m.counts))
    items = m.sketches.items
    if items is not None:
        size += int(items.get_serialized_size_bytes())
    return size + 8 * 1024  # the HLL union (lg_k 12) and a merged KLL sketch


def _described(
    windows: list[Window], plans: list[list[Span]], cov: Coverage, holes: Collection[datetime]
) -> list[Window]:
    """Return the windows with the provenance of this request's coverage (never a cached one)."""
    return [
        Window(w.start, w.end, w.slice, Provenance.of(punch(spans, holes), cov), w.merged)
        for w, spans in zip(windows, plans, strict=True)
    ]


def _batch_parts(
    windows: Sequence[tuple[datetime, datetime]], rows: Iterable[Bucket], step: timedelta, item: str | None
) -> list[BatchPart]:
    """Merge each window's batch rows, as they stream in, into one part: its counts and its sketches, serialized."""
    merged = [Merged(step, item) for _ in windows]
    unions = [sketches.SketchUnion() for _ in windows]
    spent = [0] * len(windows)
    for b in rows:
        for i, (start, end) in enumerate(windows):
            if start <= b.start < end:
                m = merged[i]
                m.events += b.events
                m.rows += 1
                spent[i] += b.sketch_bytes
                key = floor(b.start, step)
                if item is None:
                    m.counts[key] += b.events
                    unions[i].add(b.users_hll, b.values_kll, b.items_fi)
                elif b.items_fi:
                    m.counts[key] += int(ds.frequent_strings_sketch.deserialize(b.items_fi).get_estimate(item))
                break
    return [
        BatchPart(m.events, m.rows, dict(m.counts), union.serialized(), cost)
        for m, union, cost in zip(merged, unions, spent, strict=True)
    ]


KEEP_SPEED_MINUTES = 360  # a question's speed minutes are kept one by one up to this many (~13 MB of 36 KB rows)


def _speed_rows(
    reader: ViewReader,
    slice_: str,
    fields: frozenset[str],
    minutes: list[SpeedMinuteVersion],
    budget: ReadBudget | None,
    holes: set[datetime],
) -> Iterator[Bucket]:
    """Yield the speed rows of the minutes in time order (kept ones from the cache, the others read); note the holes.

    A row is kept under its minute's version only when it holds exactly the events its epoch counted there (a
    short row is a hole; a longer one was written by a micro-batch whose count is not recorded yet: used, not kept).
    A minute counted events in whose row is missing or short is a hole (answered as a gap). Rows are kept one by one
    only for a question with at most :data:`KEEP_SPEED_MINUTES` of them: a long speed window (the batch layer
    lagging) streams through, costing time, not memory.
    """
    cache = reader.speed_cache if len(minutes) <= KEEP_SPEED_MINUTES else None
    kept: list[Bucket] = []
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
    read = reader.stream(_runs_of(sorted(todo)), slice_, fields, budget) if todo else iter(())
    seen: set[datetime] = set()
    yield from heapq.merge(kept, _checked(read, todo, holes, seen, cache, slice_, fields), key=lambda b: b.start)
    for minute, (_, epoch, counted) in todo.items():
        if minute in seen:
            continue
        if counted > 0:
            holes.add(minute)  # counted, but no row
        elif cache is not None:
            cache.put(speed_key(slice_, fields, epoch, minute, counted), ())


def _checked(
    read: Iterable[Bucket],
    todo: dict[datetime, SpeedMinuteVersion],
    holes: set[datetime],
    seen: set[datetime],
    cache: RowCache | None,
    slice_: str,
    fields: frozenset[str],
) -> Iterator[Bucket]:
    """Yield the rows read that hold at least what their epoch counted (keeping exact ones), noting short ones."""
    for bucket in read:
        version = todo.get(bucket.start)
        if version is None:
            continue
        seen.add(bucket.start)
        _, epoch, counted = version
        if bucket.events < counted:
            holes.add(bucket.start)
            continue
        if cache is not None and bucket.events == counted:
            cache.put(speed_key(slice_, fields, epoch, bucket.start, counted), (bucket,))
        yield bucket


def _runs_of(minutes: list[datetime]) -> list[Span]:
    """Return sorted minutes as speed spans of consecutive minutes (one read each, split by day by the reader)."""
    spans: list[Span] = []
    for m in minutes:
        if spans and spans[-1].end == m:
            spans[-1] = Span(spans[-1].start, m + MINUTE, "speed", "minute")
        else:
            spans.append(Span(m, m + MINUTE, "speed", "minute"))
    return spans


def _missing_speed_rows(plans: list[list[Span]], cov: Coverage, found: set[datetime]) -> set[datetime]:
    """Return the speed minutes of the plans that the speed layer counted events in and no row was read for."""
    spans = [s for spans in plans for s in spans if s.layer == "speed"]
    missing = set()
    for (epoch, minute), events in cov.speed.counted.items():
        if events > 0 and minute not in found and any(s.start <= minute < s.end for s in spans):
            owner = cov.speed.owner(minute)
            if owner is not None and owner.id == epoch:
                missing.add(minute)
    return missing


def gap_minutes(reader: ViewReader, now: datetime, hours: int = 24) -> dict[str, int]:
    """Return, by reason, the minutes of the last ``hours`` (to the current minute) an answer reports as gaps.

    The symptom users feel: a figure over these minutes leaves them out. The current minute is excluded (nothing
    has been seen of it yet by definition).
    """
    end = floor(now, MINUTE)
    start = end - hours * HOUR
    window = load(reader, start, end, "*", "hour", ())
    out = dict.fromkeys(GAP_REASONS, 0)
    for g in window.provenance.gaps:
        out[g["reason"]] = out.get(g["reason"], 0) + int((g["end"] - g["start"]) / MINUTE)
    return out


def losses(reader: ViewReader, now: datetime) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Return the recorded losses and the incomplete hours (ranges) from the batch view's first hour up to now."""
    topic = reader.settings.kafka.events_topic
    found = reader.loss_store.losses(topic)
    if not found:
        return [], []
    low = reader.pointer_store.watermark().low or floor(now, HOUR) - 7 * DAY
    start = min(low, min(loss.hours_end for loss in found) - HOUR)
    ranges: list[dict[str, Any]] = []
    for hour, touching in reader.loss_store.incomplete(topic, start, floor(now, HOUR) + HOUR, found).items():
        keys = [f"{x.partition}:{x.first_offset}..{x.last_offset}" for x in touching]
        if ranges and ranges[-1]["end"] == hour and ranges[-1]["losses"] == keys:
            ranges[-1]["end"] = hour + HOUR
        else:
            ranges.append({"start": hour, "end": hour + HOUR, "losses": keys})
    return [loss.to_json() for loss in found], ranges


def pin_effect(reader: ViewReader) -> dict[str, Any] | None:
    """Say what a pin hands to the speed view (``[pin, watermark)``) and which of those minutes it still covers.

    :returns: None when there is no pin below the watermark.
    """
    mark = reader.pointer_store.watermark()
    if mark.pinned is None or mark.mark is None or mark.pinned >= mark.mark:
        return None
    window = load(reader, mark.pinned, mark.mark, "*", "hour", ())  # the boundary is the pin: all of it is speed's
    gaps = window.provenance.gaps
    moved = int((mark.mark - mark.pinned) / MINUTE)
    return {
        "pinned": mark.pinned,
        "watermark": mark.mark,
        "moved_to_speed_minutes": moved,
        "covered_minutes": moved - sum(int((g["end"] - g["start"]) / MINUTE) for g in gaps),
        "gaps": [{"start": g["start"], "end": g["end"], "reason": g["reason"]} for g in gaps],
    }


@dataclass
class Summary:
    """Count, distinct users, value quantiles and top items of a window, with bounds and provenance."""

    start: datetime
    end: datetime
    slice: str
    events: int
    users: float
    users_lower: float
    users_upper: float
    users_rse: float
    quantiles: dict[str, float | None]
    quantile_rank_error: float
    top_items: list[dict[str, Any]]
    items_max_error: int
    provenance: Provenance


def summary(w: Window, ranks: Sequence[float] = (0.5, 0.9, 0.99), top_n: int = 10) -> Summary:
    """Answer the window's count (exact), users (HLL), quantiles (KLL) and top-N items (frequent items)."""
    merged = w.merged.sketches
    users = merged.users(num_std_dev=2)
    return Summary(
        start=w.start,
        end=w.end,
        slice=w.slice,
        events=w.merged.events,
        users=users.value,
        users_lower=users.lower,
        users_upper=users.upper,
        users_rse=sketches.HLL_RSE,
        quantiles={str(r): q for r, q in zip(ranks, merged.quantiles(ranks), strict=True)},
        quantile_rank_error=merged.rank_error(),
        top_items=[asdict(t) for t in sketches.frequent(merged.items, top_n)],
        items_max_error=sketches.items_max_error(merged.items),
        provenance=w.provenance,
    )


@dataclass
class Count:
    """The exact number of events in a window."""

    start: datetime
    end: datetime
    slice: str
    events: int
    provenance: Provenance


def count(w: Window) -> Count:
    """Answer the window's event count (exact: both views count every event once)."""
    return Count(w.start, w.end, w.slice, w.merged.events, w.provenance)


@dataclass
class Users:
    """Distinct users of a window: the HLL estimate and its 95% bounds."""

    start: datetime
    end: datetime
    slice: str
    users: float
    users_lower: float
    users_upper: float
    users_rse: float
    provenance: Provenance


def users(w: Window) -> Users:
    """Answer the window's distinct users from the union of its HLL sketches."""
    u = w.merged.sketches.users(num_std_dev=2)
    return Users(w.start, w.end, w.slice, u.value, u.lower, u.upper, sketches.HLL_RSE, w.provenance)


@dataclass
class Quantiles:
    """Value quantiles of a window at the asked ranks, with the KLL rank error."""

    start: datetime
    end: datetime
    slice: str
    quantiles: dict[str, float | None]
    quantile_rank_error: float
    provenance: Provenance


def quantiles(w: Window, ranks: Sequence[float] = (0.5, 0.9, 0.99)) -> Quantiles:
    """Answer value quantiles from the merged KLL sketches of the window."""
    merged = w.merged.sketches
    qs = {str(r): q for r, q in zip(ranks, merged.quantiles(ranks), strict=True)}
    return Quantiles(w.start, w.end, w.slice, qs, merged.rank_error(), w.provenance)


@dataclass
class Top:
    """The most frequent items of a window with their count bounds."""

    start: datetime
    end: datetime
    slice: str
    items: list[dict[str, Any]]
    items_max_error: int
    provenance: Provenance


def top(w: Window, limit: int = 10) -> Top:
    """Answer the top-N items from the merged frequent-items sketches."""
    fi = w.merged.sketches.items
    items = [asdict(t) for t in sketches.frequent(fi, limit)]
    return Top(w.start, w.end, w.slice, items, sketches.items_max_error(fi), w.provenance)


@dataclass
class TrendingItem:
    """One item's rise from the baseline to the recent window."""

    item: str
    recent: int
    baseline: int
    baseline_upper: int
    lift: float
    recent_lower: int
    recent_upper: int


@dataclass
class Trending:
    """Trending items with the windows, the score's definition and both windows' provenance."""

    recent_start: datetime
    recent_end: datetime
    baseline_start: datetime
    baseline_end: datetime
    slice: str
    items: list[TrendingItem]
    min_support: int
    items_max_error: int
    provenance: dict[str, Provenance] = field(default_factory=dict)
    score: str = "lift = (recent + 1) / (baseline_upper * len_recent / len_baseline + 1)"


def trending(recent: Window, baseline: Window, limit: int = 10, min_support: int = 5) -> Trending:
    """Rank items by their lift from the baseline window to the recent window."""
    key = ("trending", id(baseline.merged), baseline.start, baseline.end, limit, min_support)
    ranked = recent.merged.derived.get(key)
    if ranked is None:
        ranked = recent.merged.derived[key] = _rank(recent, baseline, limit, min_support)
    items, max_error = ranked
    return Trending(
        recent.start,
        recent.end,
        baseline.start,
        baseline.end,
        recent.slice,
        list(items),
        min_support,
        max_error,
        {"recent": recent.provenance, "baseline": baseline.provenance},
    )


def _rank(recent: Window, baseline: Window, limit: int, min_support: int) -> tuple[tuple[TrendingItem, ...], int]:
    """Return the ``limit`` items rising most and the recent sketch's maximum error (kept with the merged window)."""
    recent_fi = recent.merged.sketches.items
    base_fi = baseline.merged.sketches.items
    scale = (recent.end - recent.start) / (baseline.end - baseline.start)
    ranked: list[tuple[float, int, str, int, int, int]] = []
    max_error = 0
    if recent_fi is not None and not recent_fi.is_empty():
        max_error = sketches.items_max_error(recent_fi)
        upper = base_fi.get_upper_bound if base_fi is not None else None
        for item, est, lo, hi in recent_fi.get_frequent_items(ds.frequent_items_error_type.NO_FALSE_NEGATIVES):
            if est < min_support:
                continue
            # The rise is measured against the most the baseline can hold: an item the baseline's sketch no longer
            # tracks reads 0 there, but may have had up to the sketch's maximum error.
            base_hi = int(upper(item)) if upper is not None else 0
            ranked.append((round((est + 1) / (base_hi * scale + 1), 4), int(est), item, base_hi, int(lo), int(hi)))
    best = heapq.nsmallest(limit, ranked, key=lambda t: (-t[0], -t[1], t[2]))
    items = tuple(
        TrendingItem(item, est, int(base_fi.get_estimate(item)) if base_fi is not None else 0, base_hi, lift, lo, hi)
        for lift, est, item, base_hi, lo, hi in best
    )
    return items, max_error


@dataclass
class Series:
    """Counts per bucket at a chosen resolution (of one item, or of all events)."""

    start: datetime
    end: datetime
    slice: str
    resolution: str
    item: str | None
    points: list[dict[str, Any]]
    provenance: Provenance


def series(w: Window, resolution: str = "hour", item: str | None = None) -> Series:
    """Return counts per bucket of a window loaded with ``coarsest`` = the resolution (or finer).

    :arg item: count only this item (frequent-items estimates, bounded by the sketches' error); the window was
        loaded with this ``item``, or with its rows kept.
    """
    step = RESOLUTIONS[resolution]
    counts: dict[datetime, int] = defaultdict(int)
    if w.merged.item == item:
        for t, n in w.merged.counts.items():
            counts[floor(t, step)] += n
    elif w.buckets:
        for b in w.buckets:
            if item is None:
                n = b.events
            else:
                n = int(ds.frequent_strings_sketch.deserialize(b.items_fi).get_estimate(item)) if b.items_fi else 0
            counts[floor(b.start, step)] += n
    elif w.merged.rows:
        msg = f"the window was merged for item {w.merged.item!r}, not {item!r}, and its rows were not kept"
        raise ValueError(msg)
    gaps = [(g["start"], g["end"]) for g in w.provenance.gaps]
    points: list[dict[str, Any]] = []
    t = floor(w.start, step)
    while t < w.end:
        lo, hi = max(t, w.start), min(t + step, w.end)
        gap = sum(((min(hi, b) - max(lo, a)) for a, b in gaps if a < hi and lo < b), timedelta())
        if gap >= hi - lo:  # nothing answered here: no count, never a zero
            points.append({"start": t, "count": None, "gap": True})
        else:
            points.append({"start": t, "count": counts.get(t, 0), **({"gap": True} if gap else {})})
        t += step
    return Series(w.start, w.end, w.slice, resolution, item, points, w.provenance)
