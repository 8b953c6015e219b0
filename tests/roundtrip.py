"""Prove the stack end to end: Kafka -> Spark Structured Streaming -> Cassandra, and back.

Events are produced to Kafka, read by a streaming query, written to Cassandra and read back. It uses a throw-away
topic and checkpoint per run (deleted afterwards) and a partition of its own in ``roundtrip_events``, so it can
run against a stack that also holds real data. The table is the test's own (created here; no deployment has it).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra import topics
from infra.cassandra import READ_PROFILE, session, table
from infra.errors import TrendsError
from infra.settings import Settings
from infra.spark import get_spark, kafka_options

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

logger = logging.getLogger(__name__)

CREATE = """
CREATE TABLE IF NOT EXISTS {table} (
    run_id text,
    event_id text,
    item text,
    ts timestamp,
    kafka_partition int,
    kafka_offset bigint,
    PRIMARY KEY ((run_id), event_id)
) WITH default_time_to_live = 86400"""
INSERT = "INSERT INTO {table} (run_id, event_id, item, ts, kafka_partition, kafka_offset) VALUES (?, ?, ?, ?, ?, ?)"
SELECT = "SELECT event_id, item, ts, kafka_partition, kafka_offset FROM {table} WHERE run_id = ?"
QUERY_TIMEOUT_S = 300


@dataclass(frozen=True)
class RoundTripRow:
    """One event as read back from Cassandra."""

    event_id: str
    item: str
    ts: datetime
    kafka_partition: int
    kafka_offset: int


def produce(settings: Settings, topic: str, events: list[dict[str, Any]]) -> int:
    """Produce events with the pipeline's reliability settings; return how many were acknowledged.

    :raises TrendsError: when any delivery fails.
    """
    from confluent_kafka import Producer

    producer = Producer({**settings.kafka.client_config(), "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    errors: list[str] = []
    acked = 0

    def on_delivery(err: Any, _msg: Any) -> None:
        nonlocal acked
        if err is not None:
            errors.append(str(err))
        else:
            acked += 1

    for event in events:
        ts_ms = int(datetime.fromisoformat(event["ts"]).timestamp() * 1000)
        producer.produce(topic, key=event["item"], value=json.dumps(event), timestamp=ts_ms, on_delivery=on_delivery)
    remaining = producer.flush(30)
    if errors or remaining:
        msg = f"producing to {topic} failed: {remaining} undelivered, errors: {errors[:3]}"
        raise TrendsError(msg)
    return acked


def stream_to_cassandra(spark: SparkSession, settings: Settings, topic: str, run_id: str, checkpoint: str) -> int:
    """Run a streaming query over everything in the topic (``availableNow``) that upserts rows into Cassandra.

    :returns: the number of rows written.
    """
    from cassandra.concurrent import execute_concurrent_with_args
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType(
        [StructField("id", StringType()), StructField("ts", StringType()), StructField("item", StringType())]
    )
    source = (
        spark.readStream.format("kafka")
        .options(**kafka_options(settings.kafka))
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("failOnDataLoss", "true")
        .load()
    )
    rows = source.select(F.from_json(F.col("value").cast("string"), schema).alias("e"), "partition", "offset").select(
        F.col("e.id").alias("event_id"),
        F.col("e.item").alias("item"),
        F.to_timestamp(F.col("e.ts")).alias("ts"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
    )
    written = 0
    with session(settings) as sess:
        insert = sess.prepare(INSERT.format(table=table(settings, "roundtrip_events")))
        insert.is_idempotent = True

        def write_batch(batch: DataFrame, batch_id: int) -> None:
            nonlocal written
            params = [
                (run_id, r.event_id, r.item, r.ts, r.kafka_partition, r.kafka_offset) for r in batch.toLocalIterator()
            ]
            results = execute_concurrent_with_args(
                sess,
                insert,
                params,
                concurrency=settings.cassandra.write_concurrency,
                raise_on_first_error=True,
            )
            written += sum(1 for ok, _ in results if ok)
            logger.info("round-trip batch %s: %d rows", batch_id, len(params))

        query = (
            rows.writeStream.queryName(f"roundtrip_{run_id}")
            .foreachBatch(write_batch)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        if not query.awaitTermination(QUERY_TIMEOUT_S):
            query.stop()
            msg = f"the round-trip streaming query did not finish within {QUERY_TIMEOUT_S} s"
            raise TrendsError(msg)
        if query.exception() is not None:
            msg = f"the round-trip streaming query failed: {query.exception()}"
            raise TrendsError(msg)
    return written


def read_back(settings: Settings, run_id: str) -> list[RoundTripRow]:
    """Return the run's rows from Cassandra, ordered by event id."""
    with session(settings) as sess:
        result = sess.execute(
            sess.prepare(SELECT.format(table=table(settings, "roundtrip_events"))),
            (run_id,),
            execution_profile=READ_PROFILE,
        )
        return [
            RoundTripRow(r.event_id, r.item, r.ts.replace(tzinfo=UTC), r.kafka_partition, r.kafka_offset)
            for r in result
        ]


def sample_events(run_id: str, count: int) -> list[dict[str, Any]]:
    """Return a few events with distinct ids, items and times (one minute apart, ending now)."""
    now = datetime.now(UTC).replace(microsecond=0)
    return [
        {
            "id": f"{run_id}-{i:04d}",
            "ts": (now - timedelta(minutes=count - i)).isoformat(),
            "item": f"#item{i % 3}",
        }
        for i in range(count)
    ]


def run(settings: Settings, count: int = 5, spark: SparkSession | None = None) -> list[RoundTripRow]:
    """Round-trip ``count`` events Kafka -> Spark -> Cassandra; return what Cassandra holds afterwards."""
    run_id = uuid.uuid4().hex[:12]
    topic = f"{settings.kafka.events_topic}.roundtrip.{run_id}"
    checkpoint = f"{settings.checkpoint_root}/roundtrip-{run_id}"
    spec = topics.TopicSpec(topic, 2, settings.kafka.replication_factor, {"retention.ms": "86400000"})
    topics.ensure_topics(settings.kafka, [spec])
    with session(settings) as sess:
        sess.execute(CREATE.format(table=table(settings, "roundtrip_events")))
    try:
        events = sample_events(run_id, count)
        t0 = time.monotonic()
        acked = produce(settings, topic, events)
        logger.info("produced %d events to %s", acked, topic)
        if spark is None:
            from pyspark.sql import SparkSession

            spark = SparkSession.getActiveSession()
        own_spark = spark is None  # never stop a session someone else started
        spark = spark or get_spark(settings, "roundtrip")
        try:
            stream_to_cassandra(spark, settings, topic, run_id, checkpoint)
        finally:
            if own_spark:
                spark.stop()
        rows = read_back(settings, run_id)
        logger.info("round trip of %d events took %.1f s", count, time.monotonic() - t0)
        return sorted(rows, key=lambda r: r.event_id)
    finally:
        topics.delete_topics(settings.kafka, [topic])
        if "://" not in checkpoint:
            shutil.rmtree(Path(checkpoint), ignore_errors=True)
