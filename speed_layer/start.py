"""Where a new speed checkpoint starts when it starts from the batch watermark, and the record of it.

The batch layer holds every hour below the batch watermark, so a new checkpoint (a lost one, a new view
definition) need not recount the topic from its beginning, nor leave the minutes between the watermark and the
restart as gaps (``latest``). It starts, per partition, at the first offset of any record whose event time is at
or above the watermark's hour. Offset-by-timestamp cannot find that offset (the log is not in time order), so it
comes from the event-time index (:mod:`views.indexing`): the smallest first offset of every indexed span of every
hour at or above the watermark, brought up to date first. A partition with no such span starts where the index
has read up to — never at Kafka's ``latest``, which would skip the records produced after the index's pass.
Records below the watermark met on the way are filtered out before the aggregation (the batch view has them),
and the epoch counts completely from the watermark's hour.

The start is written into the checkpoint folder before Spark's first offsets, and read back on every later start
of the same checkpoint: a restart filters with the same boundary, whatever the watermark has become since.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from infra.cassandra import session
from infra.settings import Settings
from infra.speed_checkpoint import START_FILE
from speed_layer.checkpoint_definition import CheckpointFiles
from views.buckets import HOUR, floor, utc
from views.store.index import IndexedPartition, IndexStore, OffsetSpan, read_index_state
from views.store.pointers import PointerStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamStart:
    """A new checkpoint's start from the batch watermark.

    :arg since: the first minute counted (the watermark's hour, or the pin's): records before it are skipped.
    :arg offsets: the first offset to read, per partition.
    :arg topic_records: the records the topic held per partition when the start was planned (high - low).
    :arg to_read: the records from the start offsets to the topic's end then, per partition.
    """

    topic: str
    since: datetime
    offsets: dict[int, int]
    topic_records: int = 0
    to_read: int = 0

    def spark_offsets(self) -> str:
        """Return the Kafka source's ``startingOffsets``: JSON of topic -> partition -> offset."""
        return json.dumps({self.topic: {str(p): o for p, o in sorted(self.offsets.items())}})

    def describe(self) -> str:
        """Return a line for logs and the epoch's record."""
        return f"watermark {self.since.isoformat()} {self.spark_offsets()}"

    def to_json(self) -> str:
        """Return the record kept in the checkpoint folder."""
        return json.dumps(
            {
                "topic": self.topic,
                "since": self.since.isoformat(),
                "offsets": {str(p): o for p, o in sorted(self.offsets.items())},
                "topic_records": self.topic_records,
                "to_read": self.to_read,
            },
            indent=1,
        )

    @staticmethod
    def from_json(text: str) -> StreamStart:
        """Read the record kept in the checkpoint folder."""
        d = json.loads(text)
        since = utc(datetime.fromisoformat(d["since"]))
        assert since is not None  # noqa: S101 - written by to_json
        offsets = {int(p): int(o) for p, o in d["offsets"].items()}
        return StreamStart(d["topic"], since, offsets, int(d.get("topic_records", 0)), int(d.get("to_read", 0)))


def start_offsets(
    since: datetime,
    by_hour: Mapping[datetime, Iterable[OffsetSpan]],
    indexed: Iterable[IndexedPartition],
    partitions: Iterable[int] = (),
) -> dict[int, int]:
    """Return, per partition, the first offset to read so that every record at or after ``since`` is read (pure).

    :arg by_hour: indexed spans by hour; every span of every hour at or above ``since`` counts (the log is not in
        time order: an early offset may hold a late hour), the spans of earlier hours none.
    :arg indexed: how far the index has read each partition; a partition without such a span starts there, so the
        records after the index's pass (any hour) are read too.
    :arg partitions: the topic's partitions; one the index never read starts at 0.
    """
    out = {p.partition: p.next_offset for p in indexed}
    for p in partitions:
        out.setdefault(p, 0)
    for hour, spans in by_hour.items():
        if hour < floor(since, HOUR):
            continue
        for s in spans:
            out[s.partition] = min(out.get(s.partition, s.first), s.first)
    return dict(sorted(out.items()))


def hours_from(since: datetime, newest: datetime | None) -> list[datetime]:
    """Return the hours from ``since`` to the hour of ``newest`` (inclusive; none when nothing newer is indexed)."""
    if newest is None or newest < since:
        return []
    hours, h = [], floor(since, HOUR)
    while h <= newest:
        hours.append(h)
        h += HOUR
    return hours


def plan_start(settings: Settings, topic: str | None = None) -> StreamStart | None:
    """Bring the index up to date and return where a new checkpoint starts (None: no batch watermark yet).

    The boundary is serving's: the operator's pin when set (it is at or below the watermark), else the watermark.
    """
    from views.indexing import kafka_topic  # noqa: PLC0415
    from views.indexing.indexer import run_index  # noqa: PLC0415

    topic = topic or settings.kafka.events_topic
    with session(settings) as sess:
        boundary = PointerStore(settings, sess).watermark().boundary
    if boundary is None:
        return None
    since = floor(utc(boundary), HOUR)  # type: ignore[arg-type]
    indexed_now = run_index(settings, topic=topic)
    with session(settings) as sess:
        parts = read_index_state(settings, sess, topic)
        newest = max((p.max_ts for p in parts if p.max_ts is not None), default=None)
        by_hour = IndexStore(settings, sess).spans(topic, hours_from(since, newest))
    spans = sum(len(ss) for ss in by_hour.values())
    consumer = kafka_topic.index_consumer(settings)
    try:
        partitions = kafka_topic.partitions(consumer, topic)
        marks = _marks(consumer, topic, partitions)
    finally:
        consumer.close()
    offsets = start_offsets(since, by_hour, parts, partitions)
    start = StreamStart(
        topic,
        since,
        offsets,
        topic_records=sum(high - low for low, high in marks.values()),
        to_read=sum(max(0, marks[p][1] - max(o, marks[p][0])) for p, o in offsets.items() if p in marks),
    )
    logger.info(
        "new checkpoint starts from the batch boundary %s: %d indexed spans of %d hours at or above it "
        "(index pass: %d new records); offsets %s: %d of the topic's %d records to read",
        since.isoformat(), spans, len(by_hour), indexed_now.records, start.spark_offsets(), start.to_read,
        start.topic_records,
    )  # fmt: skip
    return start


def _marks(consumer: Any, topic: str, partitions: Iterable[int]) -> dict[int, tuple[int, int]]:
    from confluent_kafka import TopicPartition  # noqa: PLC0415

    return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30) for p in partitions}


def has_offsets(files: CheckpointFiles) -> bool:
    """Tell whether Spark has logged offsets in the checkpoint (it resumes there, ignoring any start)."""
    return files.exists("offsets") and len(files.fs.listStatus(files.path("offsets"))) > 0


def resolve_start(spark: Any, settings: Settings, checkpoint: str) -> StreamStart | None:
    """Return the checkpoint's start from the watermark: the recorded one, or a new one when asked for.

    A checkpoint that recorded a start keeps it (a restart skips the same records). A checkpoint without offsets
    starts from the watermark when ``speed.from_watermark`` is set (and a watermark exists; else it starts at
    ``speed.starting_offsets``, with a warning); one that Spark already started otherwise is left alone.
    """
    files = CheckpointFiles(spark, checkpoint)
    if files.exists(START_FILE):
        recorded = StreamStart.from_json(files.read(START_FILE))
        logger.info("speed checkpoint %s started from %s", checkpoint, recorded.describe())
        return recorded
    if has_offsets(files) or not settings.speed.from_watermark:
        return None
    start = plan_start(settings)
    if start is None:
        logger.warning(
            "no batch watermark yet: the new speed checkpoint %s starts at starting_offsets=%s instead",
            checkpoint, settings.speed.starting_offsets,
        )  # fmt: skip
        return None
    files.write(START_FILE, start.to_json())
    return start
