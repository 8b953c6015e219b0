"""What an answer says of itself: which layer served which span, the gaps and their reasons, the layers' state.

Described from the plan and the coverage read for this request (never a cached one), after the rows were read:
a speed minute the speed layer counted events in whose row was missing or short becomes a gap here
(:func:`serving.plan.punch`), so an answer never shows a minute as served that it could not merge.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from serving.plan import Coverage, Span, punch, runs
from views.buckets import HOUR


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
    # the view version that served the answer: the serving speed query, its definition's fingerprint and the slice's
    # own (every batch hour and speed minute served defines the slice as that one; the others are gaps)
    definition: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, planned: list[Span], cov: Coverage, holes: Iterable[datetime] = ()) -> Provenance:
        """Describe a plan, its speed minutes found without a (whole) row (``holes``), and its coverage."""
        spans = punch(planned, holes)

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
            definition=asdict(cov.version) if cov.version is not None else {},
        )
