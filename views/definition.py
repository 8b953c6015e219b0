"""The view definition as a version: what both layers aggregate, its fingerprint, and each slice's own fingerprint.

A *definition* is everything a view row depends on: the bucket, the global slice's name, the slice dimensions, the
sketch parameters and the row columns. Its :func:`fingerprint` names it (speed checkpoints record it, batch runs
and pointers record it, serving names it in every answer). The speed query keeps one definition for its lifetime
(its checkpoint check refuses another), so a streaming query *is* a version of the views: a new definition runs as
a second query beside the serving one (blue/green) and is promoted once it has caught up.

A slice's rows depend on less than the whole definition: the global slice does not depend on which dimensions are
sliced, nor does ``country=US`` on whether ``device`` is one too. :func:`slice_fingerprint` is the fingerprint of
the aggregation of one slice — every part of the definition but the list of dimensions, plus that slice's own
dimension — so adding a dimension keeps the fingerprint of the global slice and of every existing slice (their batch
hours computed before stay servable), while changing a sketch parameter changes every slice's. A slice the
definition does not slice by has no fingerprint (None): it is not defined there.

:class:`Definition` is frozen: a fingerprint names one definition, and a definition read from ``view_definitions``
is shared by every request that serves with it. Its canonical JSON (:func:`to_json`, what the table stores and the
fingerprints hash) is the same bytes the dict it replaced gave, so every stored fingerprint still matches.

Pure: no Spark, no Cassandra. The Spark aggregation (:mod:`views.aggregation`) takes its constants from here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from views.buckets import MINUTE

if TYPE_CHECKING:
    from infra.settings import Settings

BUCKET = f"{int(MINUTE.total_seconds())} seconds"  # the minute bucket (views.buckets) as a Spark window duration
GLOBAL_SLICE = "*"
HLL_LG_K = 12
KLL_K = 200  # kll_sketch_agg_double's default k (views.aggregation passes none)
DEFAULT_TOP_K_ITEMS = 1024
VIEW_COLUMNS = (
    "bucket_start",
    "slice",
    "events",
    "users_hll",
    "values_kll",
    "items_fi",
    "min_ts",
    "max_ts",
)
SLICE_DIMS = "slice_dims"  # the one part of a definition that says which slices exist, not how one is computed


class Definition(BaseModel):
    """What every view row depends on; built by :func:`definition_of`, read back by :func:`from_json`.

    Extra fields are kept, not refused: a definition registered by a later release (with a part this one does not
    know) still reads, and its fingerprint is still computed over all of it.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    bucket: str
    global_slice: str
    slice_dims: tuple[str, ...]  # sorted: the order of the setting does not change a slice
    top_k_items: int
    hll_lg_k: int
    kll_k: int
    columns: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        """Return the definition as the JSON object it is stored as (lists for the tuples)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.model_dump().items()}


def definition_of(slice_dims: Sequence[str], top_k_items: int) -> Definition:
    """Return the definition of views sliced by ``slice_dims`` with a frequent-items sketch of ``top_k_items``."""
    return Definition(
        bucket=BUCKET,
        global_slice=GLOBAL_SLICE,
        slice_dims=tuple(sorted(slice_dims)),
        top_k_items=int(top_k_items),
        hll_lg_k=HLL_LG_K,
        kll_k=KLL_K,
        columns=VIEW_COLUMNS,
    )


def view_definition(settings: Settings) -> Definition:
    """Return the definition the settings ask for (``views.slice_dims``, ``views.top_k_items``)."""
    return definition_of(settings.views.slice_dims, settings.views.top_k_items)


def _hash(obj: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def fingerprint(definition: Definition) -> str:
    """Return a short hash of a definition (canonical JSON): the name of a version of the views."""
    return _hash(definition.as_json())


def dimension_of(slice_: str) -> str:
    """Return the dimension a slice belongs to (``country=US`` -> ``country``; the global slice is its own)."""
    return GLOBAL_SLICE if slice_ == GLOBAL_SLICE else slice_.split("=", 1)[0]


def slice_definition(definition: Definition, slice_: str) -> dict[str, Any] | None:
    """Return what one slice's rows depend on under a definition, as JSON (None: the definition has no such slice).

    Everything but the list of dimensions, plus the slice's own dimension: independent of the other slices.
    """
    dim = dimension_of(slice_)
    if dim != GLOBAL_SLICE and dim not in definition.slice_dims:
        return None
    out = {k: v for k, v in definition.as_json().items() if k != SLICE_DIMS}
    out["slice_dim"] = dim
    return out


def slice_fingerprint(definition: Definition, slice_: str) -> str | None:
    """Return the fingerprint of one slice's aggregation under a definition (None: the slice is not defined)."""
    sliced = slice_definition(definition, slice_)
    return None if sliced is None else _hash(sliced)


def slice_matcher(
    serving: Definition, serving_fp: str | None, slice_: str, lookup: Callable[[str], Definition | None]
) -> tuple[str | None, Callable[[str | None], bool]]:
    """Return the slice's fingerprint under the serving definition, and a test whether a definition is servable.

    A definition (by fingerprint) is servable for the slice when it defines the slice exactly as the serving one
    does; a definition never registered (``lookup`` returns None), none recorded, or a slice the serving
    definition does not have, never is. Rows of a run with no recorded definition (from before definitions were
    recorded) are the caller's to map to the serving fingerprint first.
    """
    mine = slice_fingerprint(serving, slice_)

    def servable(other: str | None) -> bool:
        if mine is None or other is None:
            return False
        if other == serving_fp:
            return True
        found = lookup(other)
        return found is not None and slice_fingerprint(found, slice_) == mine

    return mine, servable


def differences(recorded: dict[str, Any], current: Definition) -> list[str]:
    """Return ``key: old -> new`` for every part of the definition that changed (``recorded``: its stored JSON)."""
    now = current.as_json()
    keys = sorted(set(recorded) | set(now))
    return [f"{k}: {recorded.get(k)!r} -> {now.get(k)!r}" for k in keys if recorded.get(k) != now.get(k)]


def to_json(definition: Definition) -> str:
    """Return the canonical JSON of a definition (what ``view_definitions`` stores)."""
    return json.dumps(definition.as_json(), sort_keys=True)


def from_json(text: str) -> Definition:
    """Read a definition stored by :func:`to_json`."""
    return Definition.model_validate_json(text)


def with_definition(settings: Settings, definition: Definition) -> Settings:
    """Return the settings with ``views.*`` set to what a definition says (the batch layer runs a recorded one)."""
    views = settings.views.model_copy(
        update={"slice_dims": list(definition.slice_dims), "top_k_items": definition.top_k_items}
    )
    return settings.model_copy(update={"views": views})
