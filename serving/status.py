"""The serving side's health as users feel it: minutes answered as gaps, recorded losses, what a pin hands over.

Each reads through the same loader as every answer (:func:`serving.window.load`), so the figures the API's status,
metrics and console show cannot disagree with the answers.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from serving.plan import GAP_REASONS, runs
from serving.reader import ViewReader
from serving.window import load
from views.buckets import DAY, HOUR, MINUTE, floor


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
    incomplete = reader.loss_store.incomplete(topic, start, floor(now, HOUR) + HOUR, found)
    keys = [(h, tuple(f"{x.partition}:{x.first_offset}..{x.last_offset}" for x in xs)) for h, xs in incomplete.items()]
    ranges = [{"start": a, "end": b, "losses": list(v)} for a, b, v in runs(keys, HOUR)]
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
