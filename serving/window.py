"""Load a query window: plan it, read and merge its rows (through the answer cache), and describe its provenance.

The loader drives one direction — planning, reading, merging, answering — and every module it calls only calls
further down: :meth:`~serving.reader.ViewReader.coverage` reads the state of both layers, :meth:`Coverage.plan`
splits each window with the merge rule, the answer cache (:mod:`serving.answer_cache`) answers the question or reads
(:meth:`~serving.reader.ViewReader.stream`) and merges (:mod:`serving.merge`) only what moved, and the windows come
back with a :class:`Provenance` described from this request's coverage (never a cached one). The answers over a
window are :mod:`serving.queries`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from serving import answer_cache
from serving.answer_cache import Question
from serving.bucket import Bucket
from serving.budget import ReadBudget
from serving.merge import Merged
from serving.plan import RESOLUTIONS, Coverage, Resolution, Span, punch, runs
from serving.reader import SKETCH_FIELDS, ViewReader
from views.buckets import HOUR

logger = logging.getLogger(__name__)


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

        def served(hour: datetime, layers: Collection[str]) -> bool:
            return any(s.layer in layers and s.start < hour + HOUR and hour < s.end for s in spans)

        incomplete = [
            (hour, tuple(loss.describe() for loss in losses))
            for hour, losses in sorted(cov.incomplete.items())
            if served(hour, ("batch", "speed"))
        ]
        return cls(
            spans=[d(s) for s in spans if s.layer != "gap"],
            gaps=[d(s) for s in spans if s.layer == "gap"],
            boundary=cov.boundary,
            boundary_pinned=cov.pinned,
            speed_newest_event=cov.speed_newest_event,
            speed_updated_at=cov.speed_updated_at,
            stale=[{"hour": h, "records_since": n} for h, n in sorted(cov.stale.items()) if served(h, ("batch",))],
            incomplete=[{"start": a, "end": b, "losses": list(v)} for a, b, v in runs(incomplete, HOUR)],
        )


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

    :arg fields: the sketches the answer needs (:data:`serving.queries.NEEDS`); the others are left empty.
    :arg item: merge the per-bucket estimates of this item only (a per-item :func:`serving.queries.series`).
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
    rule, look the question up in the answer cache (:mod:`serving.answer_cache`), read only what the cache lacks
    (under the runs the plan was made with), merge, describe.
    """
    ordered = sorted(windows)
    if any(a[1] > b[0] for a, b in itertools.pairwise(ordered)):
        msg = f"windows overlap: {windows}"
        raise ValueError(msg)
    if keep_rows is None:
        keep_rows = "items_fi" in fields and coarsest != "day" and item is None
    lo, hi = min(w[0] for w in windows), max(w[1] for w in windows)
    question = Question(tuple(windows), slice_, coarsest, frozenset(fields), item)
    cache = reader.answers if not keep_rows else None
    recent = reader.recent_coverage(lo, hi, slice_) if cache is not None else None
    if cache is not None and recent is not None:  # state read moments ago: enough to answer from the cache
        plans = [recent.plan(start, end, coarsest) for start, end in windows]
        hit = answer_cache.lookup(cache, question, plans, recent, budget)
        if hit is not None:
            return _described(windows, slice_, hit[0], plans, recent, hit[1])
    cov = reader.coverage(lo, hi, slice_)
    plans = [cov.plan(start, end, coarsest) for start, end in windows]
    if cache is not None:
        merged, holes = answer_cache.answer(reader, cache, question, plans, cov, budget)
        return _described(windows, slice_, merged, plans, cov, holes)
    return _merge_read(reader, question, plans, cov, keep_rows, budget)


def _described(
    windows: Sequence[tuple[datetime, datetime]],
    slice_: str,
    merged: list[Merged],
    plans: list[list[Span]],
    cov: Coverage,
    holes: Collection[datetime],
) -> list[Window]:
    """Return the windows with the provenance of this request's coverage (never a cached one)."""
    return [
        Window(start, end, slice_, Provenance.of(punch(spans, holes), cov), m)
        for (start, end), m, spans in zip(windows, merged, plans, strict=True)
    ]


def _merge_read(
    reader: ViewReader,
    question: Question,
    plans: list[list[Span]],
    cov: Coverage,
    keep_rows: bool,
    budget: ReadBudget | None,
) -> list[Window]:
    """Read every row of the plans and merge them as they stream in (no answer cache, or the rows are kept)."""
    step = RESOLUTIONS[question.coarsest]
    merged = [Merged(step, question.item) for _ in question.windows]
    kept: list[list[Bucket]] = [[] for _ in question.windows]
    speed_rows: set[datetime] = set()
    short: set[datetime] = set()  # speed rows holding fewer events than the speed layer counted there
    spans = [s for spans in plans for s in spans]
    for bucket in reader.stream(spans, question.slice, question.fields, budget, runs=cov.runs):
        if bucket.layer == "speed":
            speed_rows.add(bucket.start)
            if bucket.events < cov.speed.expected(bucket.start):
                short.add(bucket.start)
                continue
        for i, (start, end) in enumerate(question.windows):
            if start <= bucket.start < end:
                merged[i].add(bucket)
                if keep_rows:
                    kept[i].append(bucket)
                break
    holes = short | _missing_speed_rows(plans, cov, speed_rows)
    if holes:
        logger.warning(
            "%d speed minute(s) counted by the speed layer have no (whole) row: answered as gaps", len(holes)
        )
    out = _described(question.windows, question.slice, merged, plans, cov, holes)
    for w, rows in zip(out, kept, strict=True):
        w.buckets = rows
    return out


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
