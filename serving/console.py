"""The operator console: for a range of hours, why each hour's answer is what it is, assembled for one JSON answer.

One strip per hour says which batch run holds the hour (completed with its run id and events, empty, stale with
the records indexed since, incomplete, missing), what the speed layer counted minute by minute (which epoch covers
which minutes, minutes whose rows expired or are missing, minutes before an epoch started, minutes not yet seen),
and the gaps of the merged answer with their reasons — the same plan and the same punching of lost speed rows that
every query uses (:func:`serving.window.load`), so the console and the answers cannot disagree. Around the strips:
the batch watermark and the pin (what the pin moves to the speed view, and whether the speed view still holds
those minutes), the event-time index's horizon and the partition holding it, the ``trends_backfill`` runs in
Airflow with their progress, and the dead letters by reason.

Airflow and Kafka are read by :mod:`serving.console_sources`, with short time bounds and at most every few seconds
per process; either being down is shown in its section ("Airflow unreachable"), never as an error of the page.
Cassandra down is the API's 503, as for every other answer.

Records lost before indexing (:func:`index_losses`, :func:`incomplete_hours`) and the stored reconciliations
(:func:`last_reconciliations`) come from the batch layer's records in Cassandra (``views.store.losses``,
``views.store.checks``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from infra.speed_checkpoint import CheckpointState, checkpoint_state
from serving import console_sources, params
from serving.console_model import (
    AnswerInfo,
    BatchInfo,
    BoundaryInfo,
    CheckpointInfo,
    ConsoleAnswer,
    EpochInfo,
    GapInfo,
    HorizonInfo,
    HourStrip,
    LossInfo,
    PartitionInfo,
    PinInfo,
    PinMove,
    QueryVersion,
    Reconciliation,
    ServedSpan,
    ServingVersionInfo,
    SpeedInfo,
    SpeedSegmentInfo,
    SpeedState,
    Versions,
)
from serving.plan import NOT_YET_SEEN, SPEED_ROWS_GONE, STARTED_AFTER, STOPPED_INSIDE, Span, SpeedCoverage
from serving.reader import ViewReader
from serving.window import load
from views.buckets import DAY, HOUR, MINUTE, days_between, floor
from views.definition import GLOBAL_SLICE
from views.store.checks import Checks
from views.store.definitions import other_definition_hours
from views.store.index import index_horizon, read_index_state
from views.store.pointers import Pointer
from views.store.speed import decode_counts, decode_hours

logger = logging.getLogger(__name__)

MAX_HOURS: Final = 48  # strips of one answer: a range is read minute by minute (speed) and hour by hour (batch)
DEFAULT_HOURS: Final = 6  # without start/end: the hours up to the end of the current one
PIN_MAX_HOURS: Final = 24 * 7  # the part of a pin's moved range whose speed coverage is checked minute by minute
UNKNOWN: Final = "unknown"  # an input the console cannot read yet

RANGE_RULES = (
    "Every combination of `start` and `end` (ISO-8601 with an offset) has one meaning: the range runs from `start` "
    f"floored to `end` rounded up to whole hours; `start` alone means {DEFAULT_HOURS} hours from it, `end` alone the "
    f"{DEFAULT_HOURS} hours up to it, neither the {DEFAULT_HOURS} hours up to the end of the current hour. Bounds "
    f"given the wrong way round make the same range, a range within one hour is that hour, and one longer than "
    f"{MAX_HOURS} hours keeps its last {MAX_HOURS}."
)

STATE_OF_REASON: dict[str, SpeedState] = {
    SPEED_ROWS_GONE: "expired",
    STARTED_AFTER: "started_after",
    STOPPED_INSIDE: "stopped",
    NOT_YET_SEEN: "not_yet_seen",
}
REASON_OF_STATE: dict[SpeedState, str] = {v: k for k, v in STATE_OF_REASON.items()}


# -- the range ------------------------------------------------------------------------------------------------------
def hour_range(start: str | None, end: str | None, now: datetime) -> tuple[datetime, datetime]:
    """Return the whole hours ``[start, end)`` a console request asks for (:data:`RANGE_RULES`).

    :raises params.BadQueryError: a bad time.
    """
    a = params.parse_time("start", start) if start is not None else None
    b = params.parse_time("end", end) if end is not None else None
    if a is not None and b is not None:
        t0, t1 = floor(min(a, b), HOUR), _ceil_hour(max(a, b))
        t1 = max(t1, t0 + HOUR)
    elif a is not None:
        t0 = floor(a, HOUR)
        t1 = t0 + DEFAULT_HOURS * HOUR
    else:
        t1 = _ceil_hour(b) if b is not None else floor(now, HOUR) + HOUR
        t0 = t1 - DEFAULT_HOURS * HOUR
    return max(t0, t1 - MAX_HOURS * HOUR), t1


def _ceil_hour(t: datetime) -> datetime:
    hour = floor(t, HOUR)
    return hour if hour == t else hour + HOUR


# -- the batch layer's records ----------------------------------------------------------------------------------------
def index_losses(reader: ViewReader) -> list[LossInfo]:
    """Return the records removed from the events topic before the index read them, each with its bound and why."""
    return [
        LossInfo(
            **loss.to_json(),
            why=f"{loss.describe()}: the hours before {loss.hours_end:%Y-%m-%dT%H:%MZ} may miss them and are "
            "incomplete until a recompute accepts the loss (trends batch run --accept-loss)",
        )
        for loss in reader.loss_store.losses(reader.settings.kafka.events_topic)
    ]


def incomplete_hours(reader: ViewReader, start: datetime, end: datetime) -> dict[datetime, list[str]] | str:
    """Return the hours of ``[start, end)`` that lost records may belong to, each with the losses (not accepted)."""
    found = reader.loss_store.incomplete(reader.settings.kafka.events_topic, start, end)
    return {hour: [loss.describe() for loss in losses] for hour, losses in found.items()}


def last_reconciliations(reader: ViewReader, hours: Sequence[datetime]) -> dict[datetime, Reconciliation] | str:
    """Return each hour's last reconciliation of the batch view against the speed view (hours never checked: none).

    ``beyond_bound``: the largest difference beyond the sketches' bounds, in events (0: the views agree within them).
    """
    found = Checks(reader.settings, reader.sess).of_hours(hours)
    return {
        hour: Reconciliation(run_id=str(c.run_id), checked_at=c.checked_at, beyond_bound=c.beyond_bound, ok=c.ok)
        for hour, c in found.items()
    }


# -- speed coverage, minute by minute ---------------------------------------------------------------------------
@dataclass(frozen=True)
class SpeedSegment:
    """Consecutive minutes in the same speed state, owned by the same epoch."""

    start: datetime
    end: datetime
    state: SpeedState
    epoch: str | None
    events: int  # events in the speed rows read (covered minutes), or counted there (expired ones)

    def info(self) -> SpeedSegmentInfo:
        """Return the segment as the console's answer shows it."""
        return SpeedSegmentInfo(
            start=self.start,
            end=self.end,
            state=self.state,
            epoch=self.epoch,
            events=self.events,
            minutes=int((self.end - self.start) / MINUTE),
            why=speed_why(self),
        )


def speed_why(s: SpeedSegment) -> str:
    """Explain a segment in one sentence."""
    span = f"{s.start:%H:%M}-{s.end:%H:%M}"
    epoch = f"epoch {s.epoch[:8]}" if s.epoch else "no epoch"
    if s.state == "covered":
        return f"{span}: counted by {epoch}; its rows hold {s.events} events"
    if s.state == "expired" and s.events:
        return f"{span}: {SPEED_ROWS_GONE}: {epoch} counted {s.events} events here; the view no longer holds them all"
    if s.state == "expired":
        return (
            f"{span}: {SPEED_ROWS_GONE}: {epoch} covers these minutes but has no record that the hour's rows are still "
            "kept (their TTL passed, or it never wrote this hour)"
        )
    if s.state == "stopped":
        return f"{span}: {STOPPED_INSIDE}: {epoch} has not read the whole topic lately; it holds only part of it"
    if s.state == "started_after":
        return f"{span}: {STARTED_AFTER}: no epoch counts these minutes completely (lost checkpoint, start at latest)"
    return f"{span}: {NOT_YET_SEEN}: no epoch has read this far"


def read_speed_coverage(reader: ViewReader, start: datetime, end: datetime, query: str | None = None) -> SpeedCoverage:
    """Read what the serving speed query counted in ``[start, end)`` for the global slice, wherever the boundary is."""
    rows = reader.speed_rows
    query = query or reader.definitions.serving().query
    epochs = rows.epochs(query)
    hour_reqs = rows.hours_requests(query, floor(start, HOUR), end)
    count_reqs = rows.counts_requests(query, GLOBAL_SLICE, floor(start, HOUR), end)
    futures = [reader.sess.execute_async(stmt, values) for stmt, values in (*hour_reqs, *count_reqs)]
    results = [list(f.result()) for f in futures]
    kept = {(k.hour, k.epoch): k.kept_until for day in results[: len(hour_reqs)] for k in decode_hours(day)}
    counted = {key: n for day in results[len(hour_reqs) :] for key, n in decode_counts(day).items()}
    live = reader.settings.serving.speed_live_within
    return SpeedCoverage(tuple(epochs), kept, counted, datetime.now(UTC), live_within=live)


@dataclass(frozen=True)
class SpeedMinute:
    """One minute as the speed layer has it."""

    start: datetime
    state: SpeedState
    epoch: str | None
    events: int


def speed_minutes(
    reader: ViewReader, cov: SpeedCoverage, start: datetime, end: datetime, query: str | None = None
) -> list[SpeedMinute]:
    """Return the speed state of every minute of ``[start, end)`` (rows read: their counts only).

    A minute the coverage serves is *covered* unless the epoch owning it counted events there and its row is gone
    or holds fewer: then it is *expired*, as the answers punch it (:func:`serving.merge.punch`). ``events`` is what
    the rows hold (covered) or what the epoch counted (expired).
    """
    fresh = cov.fresh_until
    hi = end if fresh is None else min(end, fresh)
    found: dict[datetime, int] = {}
    if fresh is not None and start < hi:
        for b in reader.stream([Span(start, hi, "speed", "minute")], GLOBAL_SLICE, (), query=query):
            found[b.start] = b.events
    out = []
    m = start
    while m < end:
        owner = cov.owner(m)
        state: SpeedState = STATE_OF_REASON.get(cov.status(m), "covered")
        expected, events = cov.expected(m), found.get(m, 0)
        if state == "covered" and expected > 0 and events < expected:
            state = "expired"
        out.append(
            SpeedMinute(m, state, owner.id if owner else None, {"covered": events, "expired": expected}.get(state, 0))
        )
        m += MINUTE
    return out


def segments_of(minutes: Iterable[SpeedMinute]) -> list[SpeedSegment]:
    """Group consecutive minutes of the same state and epoch."""
    out: list[SpeedSegment] = []
    for m in minutes:
        prev = out[-1] if out else None
        if prev is not None and prev.state == m.state and prev.epoch == m.epoch and prev.end == m.start:
            out[-1] = SpeedSegment(prev.start, m.start + MINUTE, m.state, m.epoch, prev.events + m.events)
        else:
            out.append(SpeedSegment(m.start, m.start + MINUTE, m.state, m.epoch, m.events))
    return out


def clip_spans(spans: Iterable[Span], start: datetime, end: datetime) -> list[Span]:
    """Return the spans overlapping ``[start, end)``, cut to it."""
    return [
        Span(max(s.start, start), min(s.end, end), s.layer, s.resolution, s.reason)
        for s in spans
        if max(s.start, start) < min(s.end, end)
    ]


# -- the answer -----------------------------------------------------------------------------------------------------
def build(reader: ViewReader, start: datetime, end: datetime, now: datetime | None = None) -> ConsoleAnswer:
    """Assemble the console's answer for the whole hours ``[start, end)``.

    :raises: the driver's errors when Cassandra cannot answer (the API makes them a 503).
    """
    settings = reader.settings
    now = now or datetime.now(UTC)
    slow = console_sources.start(settings)  # Airflow and Kafka answer while Cassandra is read
    hours = [start + i * HOUR for i in range(int((end - start) / HOUR))]
    cov = reader.coverage(start, end, GLOBAL_SLICE)
    mark = reader.pointer_store.watermark()
    pointers = reader.pointer_store.pointers_indexed(sorted({h.date() for h in hours}))
    window = load(reader, start, end, GLOBAL_SLICE, coarsest="hour", fields=(), keep_rows=False)
    completed = [h for h in hours if h in pointers]
    batch_events = {b.start: b.events for b in reader.stream([Span(h, h + HOUR, "batch", "hour") for h in completed],
                                                              GLOBAL_SLICE, ())}  # fmt: skip
    query = cov.version.query if cov.version is not None else None
    speed = read_speed_coverage(reader, start, end, query)
    minutes = speed_minutes(
        reader, speed, start, end, query
    )  # contiguous from start: hour i is minutes[60 i : 60 (i+1)]
    incomplete = incomplete_hours(reader, start, end)
    checks = last_reconciliations(reader, hours)
    spans = [Span(s["start"], s["end"], s["layer"], s["resolution"]) for s in window.provenance.spans]
    gaps = [Span(g["start"], g["end"], "gap", "minute", g["reason"]) for g in window.provenance.gaps]
    strips = [
        _strip(
            h, pointers.get(h), batch_events.get(h, 0), cov.stale.get(h), cov.boundary, incomplete, checks,
            segments_of(minutes[i * 60 : (i + 1) * 60]), clip_spans(spans, h, h + HOUR), clip_spans(gaps, h, h + HOUR),
            window.merged.counts.get(h, 0),
        )
        for i, h in enumerate(hours)
    ]  # fmt: skip
    parts = read_index_state(settings, reader.sess, settings.kafka.events_topic)
    horizon = index_horizon(parts, now, timedelta(seconds=settings.batch.idle_partition_s))
    newest = speed.fresh_until
    return ConsoleAnswer(
        start=start,
        end=end,
        now=now,
        max_hours=MAX_HOURS,
        refresh_s=settings.serving.dashboard_refresh_s,
        boundary=BoundaryInfo(
            boundary=cov.boundary,
            watermark=mark.mark,
            low=mark.low,
            pinned=mark.pinned,
            pin=_pin(reader, mark.pinned, mark.mark),
            why=_boundary_why(mark.low, mark.mark, mark.pinned),
        ),
        horizon=HorizonInfo(
            topic=settings.kafka.events_topic,
            closed_at=horizon.closed_at,
            held_by=horizon.held_by,
            idle=list(horizon.idle),
            idle_after_s=settings.batch.idle_partition_s,
            partitions=[
                PartitionInfo(
                    partition=p.partition, next_offset=p.next_offset, max_ts=p.max_ts, last_record_at=p.last_record_at
                )
                for p in parts
            ],
            why=_horizon_why(horizon.closed_at, horizon.held_by, horizon.idle, bool(parts)),
        ),
        versions=view_versions(reader, now),
        speed=SpeedInfo(
            query=query or settings.speed.query_name,
            checkpoint=_checkpoint(checkpoint_state(settings)),
            fresh_until=newest,
            newest_event=cov.speed_newest_event,
            updated_at=cov.speed_updated_at,
            lag_s=None if newest is None else round((now - newest).total_seconds(), 1),
            epochs=[
                EpochInfo(
                    id=e.id,
                    started_at=e.started_at,
                    covered_from=e.covered_from,
                    counts_from=e.counts_from,
                    seen_until=e.seen_until,
                    starting_offsets=e.starting_offsets,
                    last_batch_id=e.last_batch_id,
                )
                for e in speed.epochs
            ],
        ),
        answer=AnswerInfo(events=window.merged.events, gaps=len(window.provenance.gaps)),
        hours=strips,
        losses=index_losses(reader),
        erasures=console_sources.read_erasures(settings, reader.sess, now),
        airflow=slow.airflow_section(),
        dead_letters=slow.dead_letter_section(),
    )


RECENT_VERSION = timedelta(hours=1)  # another speed query with an epoch updated this recently is shown beside


def view_versions(reader: ViewReader, now: datetime) -> Versions:
    """Return the view versions: the serving speed query and every other one with a recent epoch, with progress.

    Each with its definition, its current epoch's ``counts_from`` and ``seen_until``; and the hours below the
    watermark whose current run computed with another definition than the serving one (within the metrics scan).
    """
    settings = reader.settings
    serving = reader.definitions.serving()
    progress = {p.query: p for p in reader.speed_rows.progress()}
    out = []
    for q in sorted(set(progress) | {serving.query}):
        epoch = max(reader.speed_rows.epochs(q), key=lambda e: e.started_at, default=None)
        recent = epoch is not None and epoch.updated_at is not None and now - epoch.updated_at <= RECENT_VERSION
        if q != serving.query and not recent:
            continue
        out.append(
            QueryVersion(
                query=q,
                serving=q == serving.query,
                definition=epoch.definition if epoch is not None else None,
                epoch=epoch.id if epoch is not None else None,
                counts_from=epoch.counts_from if epoch is not None else None,
                seen_until=epoch.seen_until if epoch is not None else None,
                updated_at=epoch.updated_at if epoch is not None else None,
            )
        )
    mark = reader.pointer_store.watermark()
    old: dict[datetime, str] = {}
    if mark.mark is not None:
        lo = max(mark.low or mark.mark, floor(mark.mark - settings.metrics.batch_scan_days * DAY, HOUR))
        pointers = reader.pointer_store.pointers_indexed(days_between(lo, mark.mark))
        old = other_definition_hours({h: p for h, p in pointers.items() if h >= lo}, serving.fingerprint, mark.mark)
    return Versions(
        serving=ServingVersionInfo(
            query=serving.query, fingerprint=serving.fingerprint, previous_query=serving.previous_query,
            promoted_at=serving.promoted_at,
        ),
        queries=out,
        old_definition_hours=len(old),
        old_definition_first=min(old, default=None),
        old_definition_last=max(old, default=None),
    )  # fmt: skip


def _checkpoint(st: CheckpointState) -> CheckpointInfo:
    """Return the speed checkpoint as this host sees it (none: the next start is a new epoch, from where)."""
    return CheckpointInfo(location=st.location, exists=st.exists, last_batch=st.last_batch,
                          from_watermark=st.from_watermark, next_start=st.next_start, why=st.describe())  # fmt: skip


def _strip(
    hour: datetime,
    pointer: Pointer | None,
    events: int,
    records_since: int | None,
    boundary: datetime | None,
    incomplete: dict[datetime, list[str]] | str,
    checks: dict[datetime, Reconciliation] | str,
    segments: list[SpeedSegment],
    spans: list[Span],
    gaps: list[Span],
    answered: int,
) -> HourStrip:
    """One hour: its batch state, its speed coverage, the answer's sources and gaps, each explained."""
    below = boundary is not None and hour < boundary
    lost = UNKNOWN if isinstance(incomplete, str) else incomplete.get(hour, [])
    batch = _batch(hour, pointer, events, records_since, below, lost)
    served = [ServedSpan(start=s.start, end=s.end, layer=s.layer, resolution=s.resolution) for s in spans]
    gap_list = [
        GapInfo(start=g.start, end=g.end, reason=g.reason, minutes=int((g.end - g.start) / MINUTE)) for g in gaps
    ]
    why = [batch.why]
    sources = ", ".join(f"{s.start:%H:%M}-{s.end:%H:%M} {s.layer} ({s.resolution} rows)" for s in spans)
    why.append(f"answer: {answered} events" + (f" from {sources}" if sources else " (nothing served)"))
    why += [f"gap {g.start:%H:%M}-{g.end:%H:%M}: {g.reason}" for g in gap_list]
    if below:
        why.append("speed coverage below the boundary is shown for comparison: the batch view answers here")
    return HourStrip(
        hour=hour,
        below_boundary=below,
        batch=batch,
        speed=[s.info() for s in segments],
        served=served,
        gaps=gap_list,
        events=answered,
        reconciliation=checks if isinstance(checks, str) else checks.get(hour),
        why=why,
    )


def _batch(
    hour: datetime, pointer: Pointer | None, events: int, since: int | None, below: bool, lost: list[str] | str
) -> BatchInfo:
    where = (
        "below the boundary: the batch view answers" if below else "at or above the boundary: the speed view answers"
    )
    if pointer is None:
        state = "incomplete" if lost and not isinstance(lost, str) else "missing"
        why = f"no completed batch run; {where}" + (" (a gap: no completed batch run for this hour)" if below else "")
        if state == "incomplete":
            why += "; records that may belong here were lost: " + "; ".join(lost)
        return BatchInfo(state=state, run_id=None, events=None, indexed=None, records_since=None,
                         incomplete=lost, why=why)  # fmt: skip
    run = str(pointer.run_id)
    indexed = f" ({pointer.indexed} records indexed when it ran)" if pointer.indexed is not None else ""
    if lost and not isinstance(lost, str):
        state, what = "incomplete", f"run {run[:8]} holds {events} events but records that may belong here were lost: "
        what += "; ".join(lost)
    elif since:
        state = "stale"
        what = (
            f"run {run[:8]} holds {events} events; {since} records were indexed since (late data): answers use the "
            "run until the hour is recomputed (trends batch run --stale)"
        )
    elif events == 0:
        state, what = "empty", f"run {run[:8]} completed with no events{indexed}"
    else:
        state, what = "completed", f"run {run[:8]} holds {events} events{indexed}"
    return BatchInfo(state=state, run_id=run, events=events, indexed=pointer.indexed, records_since=since,
                     incomplete=lost, why=f"{what}; {where}")  # fmt: skip


def _pin(reader: ViewReader, pinned: datetime | None, mark: datetime | None) -> PinInfo | None:
    """Say what the pin moves between the views, and whether the speed view still holds what it moves there."""
    if pinned is None:
        return None
    if mark is None or pinned >= mark:
        moved = "nothing" if mark is not None and pinned == mark else "hours above the watermark to the batch view"
        return PinInfo(moves_to_speed=None, why=f"pinned at {pinned:%Y-%m-%d %H:%M}: moves {moved}")
    hi = min(mark, pinned + PIN_MAX_HOURS * HOUR)
    segments = segments_of(speed_minutes(reader, read_speed_coverage(reader, pinned, hi), pinned, hi))
    minutes = int((mark - pinned) / MINUTE)
    by_state: dict[SpeedState, int] = {}
    for s in segments:
        by_state[s.state] = by_state.get(s.state, 0) + int((s.end - s.start) / MINUTE)
    covered = by_state.get("covered", 0)
    holes = [s.info() for s in segments if s.state != "covered"]
    checked = "" if hi == mark else f" (the first {PIN_MAX_HOURS} hours checked)"
    why = (
        f"pinned at {pinned:%Y-%m-%d %H:%M}, below the watermark {mark:%Y-%m-%d %H:%M}: {minutes} minutes move to "
        f"the speed view; {covered} of them are covered there{checked}"
    )
    if holes:
        why += "; the others are gaps: " + ", ".join(
            f"{n} minutes {REASON_OF_STATE[st]}" for st, n in by_state.items() if st != "covered"
        )
    return PinInfo(
        moves_to_speed=PinMove(start=pinned, end=mark, minutes=minutes, covered=covered, by_state=by_state,
                               holes=holes[:50]),
        why=why,
    )  # fmt: skip


def _boundary_why(low: datetime | None, mark: datetime | None, pinned: datetime | None) -> str:
    if mark is None:
        return "no batch run has completed: the speed view answers everything it covers"
    out = f"every hour of [{low:%Y-%m-%d %H:%M}, {mark:%Y-%m-%d %H:%M}) has a completed batch run"
    if pinned is not None:
        return out + f"; an operator pinned the boundary at {pinned:%Y-%m-%d %H:%M} (trends batch pin), which wins"
    return out + "; the batch view answers below the watermark, the speed view from it on"


def _horizon_why(closed: datetime | None, held_by: int | None, idle: Sequence[int], indexed: bool) -> str:
    if not indexed:
        return "the event-time index has not read this topic yet"
    if closed is None:
        return "the index holds no record time yet"
    held = f"held back by partition {held_by}" if held_by is not None else "every partition idle"
    idle_text = f"; idle partitions (ignored): {', '.join(map(str, idle))}" if idle else ""
    return (
        f"event time closed up to {closed:%Y-%m-%d %H:%M:%S} ({held}{idle_text}): an hour is recomputed once the "
        "horizon passes its end plus the grace"
    )
