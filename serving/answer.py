"""Every query's one path from a question to its merged windows: the layers' state, the plan, the cache or the reads.

:func:`answer` is what :mod:`serving.window` calls for every answer, with the answer cache on or off: it reads the
state of both layers (a state read moments ago is enough when the cache can answer), plans each window with
:mod:`serving.plan`, then either looks the question up in the answer cache and reads only what moved
(:mod:`serving.answer_cache`) or, with the cache off or the rows kept, reads every row of the plan and merges it as
it streams in. It goes one direction, and it is the only place a question's rows are merged.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import NamedTuple

from serving.answer_cache import Question, RowSource, lookup, merge_cached, speed_query
from serving.budget import ReadBudget
from serving.merge import Merged
from serving.plan import RESOLUTIONS, Coverage, Span
from serving.served_row import ServedRow

logger = logging.getLogger(__name__)


class Answered(NamedTuple):
    """A question's windows merged, with the coverage and the plans they were merged under.

    :arg holes: speed minutes counted whose rows were missing or short (to be answered as gaps).
    :arg rows: each window's rows, when the question kept them (else empty lists).
    """

    coverage: Coverage
    plans: list[list[Span]]
    merged: list[Merged]
    holes: frozenset[datetime]
    rows: list[list[ServedRow]]


def answer(reader: RowSource, question: Question, budget: ReadBudget | None, keep_rows: bool = False) -> Answered:
    """Merge a question's windows: read the state of both layers, plan, answer from the cache or read, merge.

    A state read moments ago (``serving.state_max_age_ms``) is enough to answer from the cache when nothing moved;
    anything to read is planned on a coverage read anew. With ``keep_rows`` (or the cache off) every row of the plan
    is read and merged as it streams in.
    """
    lo, hi = min(w[0] for w in question.windows), max(w[1] for w in question.windows)
    cache = reader.answers if not keep_rows else None
    recent = reader.recent_coverage(lo, hi, question.slice) if cache is not None else None
    none: list[list[ServedRow]] = [[] for _ in question.windows]
    if cache is not None and recent is not None:
        plans = [recent.plan(start, end, question.coarsest) for start, end in question.windows]
        hit = lookup(cache, question, plans, recent, budget)
        if hit is not None:
            return Answered(recent, plans, hit[0], hit[1], none)
    cov = reader.coverage(lo, hi, question.slice)
    plans = [cov.plan(start, end, question.coarsest) for start, end in question.windows]
    if cache is None:
        return _read_whole(reader, question, plans, cov, keep_rows, budget)
    merged, holes = merge_cached(reader, cache, question, plans, cov, budget)
    return Answered(cov, plans, merged, holes, none)


def _read_whole(
    reader: RowSource,
    question: Question,
    plans: list[list[Span]],
    cov: Coverage,
    keep_rows: bool,
    budget: ReadBudget | None,
) -> Answered:
    """Read every row of the plans and merge them as they stream in (no answer cache, or the rows are kept)."""
    step = RESOLUTIONS[question.coarsest]
    merged = [Merged(step, question.item) for _ in question.windows]
    kept: list[list[ServedRow]] = [[] for _ in question.windows]
    found: set[datetime] = set()
    holes: set[datetime] = set()  # speed rows holding fewer events than the speed layer counted there, or none
    spans = [s for spans in plans for s in spans]
    rollups = cov if question.coarsest != "minute" else None  # a ten-minute row never splits into minutes
    rows = reader.stream(
        spans, question.slice, question.fields, budget, cov.runs, speed_query(cov), rollups,
        day_parts=question.coarsest == "day",
    )  # fmt: skip
    for bucket in rows:
        if bucket.layer == "speed":
            if bucket.resolution == "minute":
                found.add(bucket.start)
                short = bucket.events < cov.speed.expected(bucket.start)
            else:  # a rollup: read only when it holds exactly what its minutes counted
                minutes = list(bucket.minutes())
                found.update(minutes)
                short = bucket.events < sum(cov.speed.expected(m) for m in minutes)
            if short:
                holes.add(bucket.start)
                continue
        for i, (start, end) in enumerate(question.windows):
            if start <= bucket.start < end:
                merged[i].add(bucket)
                if keep_rows:
                    kept[i].append(bucket)
                break
    speed_spans = [s for s in spans if s.layer == "speed"]
    for (epoch, minute), events in cov.speed.counted.items():  # counted, in a speed span, owned, and no row read
        if events > 0 and minute not in found and any(s.start <= minute < s.end for s in speed_spans):
            owner = cov.speed.owner(minute)
            if owner is not None and owner.id == epoch:
                holes.add(minute)
    if holes:
        logger.warning(
            "%d speed minute(s) counted by the speed layer have no (whole) row: answered as gaps", len(holes)
        )
    return Answered(cov, plans, merged, frozenset(holes), kept)
