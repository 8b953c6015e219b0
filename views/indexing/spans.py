"""The event-time index's span algorithm: one partition's records, in offset order, into hour spans (pure, no I/O).

A span ``[first, last]`` of an hour grows while the hour's next record lies at most ``index_span_gap`` records
after it (so interleaved hours near a boundary share spans instead of shattering them into thousands), else a new
span starts. Records are placed by their **record timestamp** (ingestion sets it to the event time); a record
without a usable timestamp is counted apart (``untimed``). The state it works on is the checkpoint the indexer
stores (:class:`views.store.index.PartitionState`), so a pass resumes where the last one stopped.
"""

from __future__ import annotations

from datetime import timedelta

from views.buckets import HOUR
from views.store.index import OffsetSpan, OpenSpan, PartitionState

HOUR_MS = int(HOUR / timedelta(milliseconds=1))  # the hour bucket in epoch milliseconds (the indexer works in ms)


class PartitionIndexer:
    """Turns one partition's records, in offset order, into hour spans (pure: no I/O)."""

    def __init__(self, state: PartitionState, gap: int) -> None:
        self.state = state
        self.gap = gap
        self.changed: dict[tuple[int, int], OpenSpan] = {}  # (hour, first) -> span to write
        self.touched: set[int] = set()
        self.new_records = 0

    def add(self, offset: int, ts_ms: int) -> None:
        """Index one record (offsets ascending)."""
        st = self.state
        st.next_offset = offset + 1
        if ts_ms < 0:
            st.untimed += 1
            return
        hour = ts_ms - ts_ms % HOUR_MS
        late = 1 if st.max_ts_ms is not None and st.max_ts_ms >= hour + HOUR_MS else 0
        span = st.open.get(hour)
        if span is not None and offset - span.last <= self.gap:
            span.last = offset
            span.records += 1
            span.late += late
        else:
            span = OpenSpan(offset, offset, 1, late)
            st.open[hour] = span
        self.changed[(hour, span.first)] = span
        self.touched.add(hour)
        if st.max_ts_ms is None or ts_ms > st.max_ts_ms:
            st.max_ts_ms = ts_ms
        self.new_records += 1

    def drain(self) -> list[tuple[int, OffsetSpan]]:
        """Return the spans changed since the last drain and forget the open ones no record can extend any more."""
        out = [
            (h, OffsetSpan(self.state.partition, s.first, s.last, s.records, s.late))
            for (h, _), s in self.changed.items()
        ]
        self.changed = {}
        horizon = self.state.next_offset - 1 - self.gap
        self.state.open = {h: s for h, s in self.state.open.items() if s.last >= horizon}
        return out
