"""Load query windows: their rows merged (:func:`serving.answer.answer`), then their provenance described.

Two steps, one direction: :func:`~serving.answer.answer` reads the state of both layers
(:meth:`~serving.reader.ViewReader.coverage`), plans each window with the merge rule (:mod:`serving.plan`), answers
from the answer cache or reads (:meth:`~serving.reader.ViewReader.stream`) and merges (:mod:`serving.merge`) only
what moved; then each window is described (:class:`~serving.provenance.Provenance`) from this request's coverage,
never a cached one. The answers over a window are :mod:`serving.queries`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from serving import answer
from serving.answer_cache import Question
from serving.budget import ReadBudget
from serving.merge import Merged
from serving.plan import Resolution
from serving.provenance import Provenance
from serving.reader import SKETCH_FIELDS, ViewReader
from serving.served_row import ServedRow


@dataclass
class Window:
    """A query window, its rows merged, and the provenance of the rows."""

    start: datetime
    end: datetime
    slice: str
    provenance: Provenance
    merged: Merged
    buckets: list[ServedRow] = field(default_factory=list)  # only when loaded with keep_rows


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
    question = Question(tuple(windows), slice_, coarsest, frozenset(fields), item)
    got = answer.answer(reader, question, budget, keep_rows)
    return [
        Window(start, end, slice_, Provenance.of(spans, got.coverage, got.holes), merged, rows)
        for (start, end), spans, merged, rows in zip(windows, got.plans, got.merged, got.rows, strict=True)
    ]
