"""What an answer says of itself: which layer served which span, the gaps and their reasons, the layers' state.

Described from the plan and the coverage read for this request (never a cached one), after the rows were read:
a speed minute the speed layer counted events in whose row was missing or short becomes a gap here
(:func:`serving.plan.punch`), so an answer never shows a minute as served that it could not merge.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import NotRequired

from typing_extensions import TypedDict

from serving.plan import Coverage, Layer, Resolution, Span, punch, runs
from views.buckets import HOUR


class SpanInfo(TypedDict):
    """Minutes one layer served at one resolution, or (layer ``gap``) a gap with its ``reason``."""

    start: datetime
    end: datetime
    layer: Layer
    resolution: Resolution
    reason: NotRequired[str]


class StaleInfo(TypedDict):
    """A batch hour served with records indexed since its run."""

    hour: datetime
    records_since: int


class IncompleteInfo(TypedDict):
    """Hours served that records lost before indexing may belong to, and those losses."""

    start: datetime
    end: datetime
    losses: list[str]


class DefinitionInfo(TypedDict, total=False):
    """The view version that served the answer (empty: none known)."""

    query: str
    fingerprint: str | None
    slice_fingerprint: str | None


@dataclass
class Provenance:
    """Which layer served which span, and the state of both layers."""

    spans: list[SpanInfo]
    gaps: list[SpanInfo]
    boundary: datetime | None
    boundary_pinned: bool
    speed_newest_event: datetime | None
    speed_updated_at: datetime | None
    stale: list[StaleInfo] = field(default_factory=list)  # batch hours with records indexed since their run
    # hours that records removed from Kafka before they were indexed may belong to: incomplete, whoever served them
    incomplete: list[IncompleteInfo] = field(default_factory=list)
    # the view version that served the answer: the serving speed query, its definition's fingerprint and the slice's
    # own (every batch hour and speed minute served defines the slice as that one; the others are gaps)
    definition: DefinitionInfo = field(default_factory=DefinitionInfo)

    @classmethod
    def of(cls, planned: list[Span], cov: Coverage, holes: Iterable[datetime] = ()) -> Provenance:
        """Describe a plan, its speed minutes found without a (whole) row (``holes``), and its coverage."""
        spans = punch(planned, holes)

        def d(s: Span) -> SpanInfo:
            out = SpanInfo(start=s.start, end=s.end, layer=s.layer, resolution=s.resolution)
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
            stale=[StaleInfo(hour=h, records_since=n) for h, n in sorted(cov.stale.items()) if served(h, ("batch",))],
            incomplete=[IncompleteInfo(start=a, end=b, losses=list(v)) for a, b, v in runs(incomplete, HOUR)],
            definition=_definition(cov),
        )


def _definition(cov: Coverage) -> DefinitionInfo:
    v = cov.version
    if v is None:
        return DefinitionInfo()
    return DefinitionInfo(query=v.query, fingerprint=v.fingerprint, slice_fingerprint=v.slice_fingerprint)
