"""The soak's pre-written events are the model's own: the same bytes the model writes for the event they decode to."""

from __future__ import annotations

from datetime import UTC, datetime

from tests.soak.probe import SoakEvents
from views.event import Event


def test_every_pooled_event_is_what_the_model_writes() -> None:
    events = SoakEvents(pool=2_000)
    ts = datetime(2026, 11, 28, 3, 4, 5, 67_000, tzinfo=UTC)
    text = events.ts_text(int(ts.timestamp() * 1000))
    assert text == b"2026-11-28T03:04:05.067Z"
    for n in range(4_000):  # twice round the pool: the id differs, the tail repeats
        wire, key = events.wire(n, text)
        event = Event.model_validate_json(wire)
        assert (event.id, event.ts, event.ts_ms) == (f"soak-{n}", ts, int(ts.timestamp() * 1000))
        assert event.to_json() == wire
        assert event.key("item") == key
