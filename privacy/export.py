"""Export a subject's events (GDPR Art. 15): every event that can still be linked to the user, as JSON lines.

Finding them without scanning the log: the subject store knows the hours that hold the subject
(:meth:`SubjectStore.hours`), and the batch layer's event-time index knows which offset spans of which partitions
hold each hour (:meth:`views.store.index.IndexStore.spans`). Only those spans are read, coalesced per partition,
plus each partition's tail past the index's checkpoint (records not indexed yet), and the events whose ``user`` is
the subject's pseudonym are kept. Cost grows with the records of the subject's hours (every event of those hours
is read and parsed, not only the subject's), not with the log. After a forget nothing is linked: nothing is found.

Records are JSON or framed Avro (``kafka.events_format``; a topic may hold both): both are read through
:class:`views.event_avro.EventValues` and exported as the event's JSON. An Avro record that may be the subject's
but does not decode (an id the registry does not know) stops the export: it is never silently shorter.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from infra.cassandra import session as cassandra_session
from infra.errors import TrendsError
from infra.privacy.subjects import SubjectStore
from infra.settings import Settings
from views.event_avro import EventValues, UnreadableEventError, is_framed
from views.store.index import IndexStore

if TYPE_CHECKING:
    from cassandra.cluster import Session

logger = logging.getLogger(__name__)

POLL_S = 1.0
# Spans of one partition closer than this many records are read as one range: a few hundred foreign records cost
# less than a new fetch, yet a subject in every 20th hour does not read the hours in between.
MERGE_GAP = 500
READ_TIMEOUT_S = 60.0  # a range whose records do not arrive within this is an error, never a silent short export


class ExportError(TrendsError):
    """The export could not read what the index says holds the subject's events."""


@dataclass
class ExportResult:
    """What an export found and what finding it cost."""

    linked: bool
    events: int = 0
    hours: int = 0
    ranges: int = 0
    records_read: int = 0
    seconds: float = 0.0
    phases_s: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        """Return the result in one line (no id, no pseudonym)."""
        if not self.linked:
            return "no data linked to this user (never seen, or forgotten): nothing to export"
        phases = ", ".join(f"{k} {v:.2f} s" for k, v in self.phases_s.items())
        return (
            f"exported {self.events} event(s) of {self.hours} hour(s): read {self.records_read} record(s) in "
            f"{self.ranges} offset range(s), {self.seconds:.2f} s ({phases})"
        )


def coalesce(spans: Iterable[tuple[int, int, int]], gap: int = 0) -> dict[int, list[tuple[int, int]]]:
    """Return ``(partition, first, last)`` spans merged per partition into sorted, disjoint ``[first, last]`` ranges.

    Spans closer than ``gap`` offsets are merged too: one read of a few extra records costs less than a new fetch.
    """
    out: dict[int, list[tuple[int, int]]] = {}
    for partition, first, last in sorted(spans):
        ranges = out.setdefault(partition, [])
        if ranges and first <= ranges[-1][1] + 1 + gap:
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], last))
        else:
            ranges.append((first, last))
    return out


def _consumer(settings: Settings) -> Any:
    from confluent_kafka import Consumer  # noqa: PLC0415

    return Consumer(
        {
            **settings.kafka.client_config(),
            "group.id": "trends-privacy-export",  # offsets are never committed: ranges are assigned explicitly
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 50,  # short ranges: do not wait for more bytes than the range holds
            "log_level": 3,
        }
    )


def read_ranges(settings: Settings, topic: str, ranges: dict[int, list[tuple[int, int]]]) -> Iterator[Any]:
    """Yield the records of the offset ranges (inclusive); the partitions are read at once, each range after a seek.

    A partition's end reached inside a range ends the range (offsets of transaction markers are never delivered).

    :raises ExportError: when records stop arriving (removed by retention, or the broker is away).
    """
    from confluent_kafka import KafkaError, TopicPartition  # noqa: PLC0415

    todo = {p: list(spans) for p, spans in ranges.items() if spans}
    if not todo:
        return
    current = {p: spans.pop(0) for p, spans in todo.items()}
    position = {p: first for p, (first, _) in current.items()}  # the next offset each current range expects
    consumer = _consumer(settings)

    def advance(p: int) -> None:
        if todo[p]:
            current[p] = todo[p].pop(0)
            position[p] = current[p][0]
            consumer.seek(TopicPartition(topic, p, current[p][0]))
        else:
            del current[p]
            consumer.pause([TopicPartition(topic, p)])

    try:
        consumer.assign([TopicPartition(topic, p, first) for p, (first, _) in current.items()])
        deadline = time.monotonic() + READ_TIMEOUT_S
        while current:
            # consume() returns when it holds this many records or at its timeout: ask no more than the current
            # ranges still hold, or every short range waits for the timeout
            wanted = sum(current[p][1] - position[p] + 1 for p in current)
            batch = consumer.consume(max(1, min(10_000, wanted)), POLL_S)
            if batch:
                deadline = time.monotonic() + READ_TIMEOUT_S
            elif time.monotonic() > deadline:
                msg_text = (
                    f"the ranges {current} of topic {topic} did not arrive within {READ_TIMEOUT_S:.0f} s (removed "
                    "by retention, or the broker is unreachable)"
                )
                raise ExportError(msg_text)
            for msg in batch:
                p, err = msg.partition(), msg.error()
                if p not in current:
                    continue
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        advance(p)
                        continue
                    msg_text = f"reading partition {p} of topic {topic}: {err}"
                    raise ExportError(msg_text)
                first, last = current[p]
                offset = msg.offset()
                if offset < first:
                    continue  # fetched before the seek
                position[p] = offset + 1
                if offset <= last:
                    yield msg
                if offset >= last:
                    advance(p)
    finally:
        consumer.close()


def _tail(settings: Settings, topic: str, checkpoints: dict[int, int]) -> dict[int, list[tuple[int, int]]]:
    """Return each partition's range past the index's checkpoint up to its end now (records not indexed yet)."""
    from confluent_kafka import TopicPartition  # noqa: PLC0415

    consumer = _consumer(settings)
    try:
        meta = consumer.list_topics(topic, timeout=30).topics.get(topic)
        if meta is None or meta.error is not None:
            msg = f"topic {topic} does not exist"
            raise ExportError(msg)
        out = {}
        for p in sorted(meta.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            start = max(checkpoints.get(p, low), low)
            if start < high:
                out[p] = [(start, high - 1)]
        return out
    finally:
        consumer.close()


def export(
    settings: Settings,
    user: str,
    write: Callable[[bytes], None],
    *,
    topic: str | None = None,
    store: SubjectStore | None = None,
    session: Session | None = None,
) -> ExportResult:
    """Write every event of the user that can still be linked (one JSON document per call of ``write``).

    :raises ExportError: when the subject has more hours than ``privacy.export_max_hours``, or a range is unreadable.
    """
    topic = topic or settings.kafka.events_topic
    t0 = time.monotonic()
    phases: dict[str, float] = {}

    def phase(name: str, began: float) -> float:
        now = time.monotonic()
        phases[name] = now - began
        return now

    with nullcontext(session) if session is not None else cassandra_session(settings) as sess:
        subjects = store or SubjectStore(settings, sess)
        pseudonym = subjects.lookup(user)
        if pseudonym is None:
            return ExportResult(linked=False, seconds=time.monotonic() - t0)
        hours = subjects.hours(user)
        if len(hours) > settings.privacy.export_max_hours:
            msg = (
                f"the subject has {len(hours)} hours of history, more than privacy.export_max_hours "
                f"({settings.privacy.export_max_hours}); raise it to export them all"
            )
            raise ExportError(msg)
        t = phase("subject", t0)
        index = IndexStore(settings, sess)
        by_hour = index.spans(topic, hours)
        checkpoints = {p: s.next_offset for p, s in index.states(topic).items()}
        t = phase("index", t)
    spans = [(s.partition, s.first, s.last) for hour_spans in by_hour.values() for s in hour_spans]
    ranges = coalesce(spans, MERGE_GAP)
    for p, tail in _tail(settings, topic, checkpoints).items():
        ranges[p] = coalesce([(p, a, b) for a, b in [*ranges.get(p, []), *tail]])[p]
    result = ExportResult(linked=True, hours=len(hours), ranges=sum(len(r) for r in ranges.values()))
    values = EventValues(settings.registry)
    for msg in read_ranges(settings, topic, ranges):
        result.records_read += 1
        value = msg.value()
        if value is None or pseudonym.encode() not in value:  # cheap pre-filter before the parse (Avro text is UTF-8)
            continue
        try:
            event, as_json = values.decode(value)
        except UnreadableEventError as exc:
            if is_framed(value):
                where = f"partition {msg.partition()} offset {msg.offset()} of topic {topic}"
                msg_text = f"{where} may hold the subject's event but does not decode: {exc}"
                raise ExportError(msg_text) from exc
            continue  # ingestion only writes valid JSON; another producer's record is not the subject's
        if event.get("user") == pseudonym:
            write(as_json)
            result.events += 1
    phase("read", t)
    result.phases_s, result.seconds = phases, time.monotonic() - t0
    logger.info("%s", result.line())
    return result
