"""A Spark Structured Streaming query reads the real topic and writes rows into the real Cassandra."""

from __future__ import annotations

from typing import Any

import pytest

from infra import jars
from infra.settings import Settings
from infra.spark import spark_conf
from tests import roundtrip

pytestmark = pytest.mark.spark


def test_spark_conf_comes_from_settings(stack_up: Settings) -> None:
    custom = stack_up.model_copy(
        update={"spark": stack_up.spark.model_copy(update={"master": "spark://10.0.0.1:7077", "shuffle_partitions": 7})}
    )
    conf = spark_conf(custom, "job")
    assert conf["spark.master"] == "spark://10.0.0.1:7077"
    assert conf["spark.sql.shuffle.partitions"] == "7"
    shipped = conf["spark.jars"].split(",")
    assert any("spark-sql-kafka-0-10_2.13-4.2.0.jar" in j for j in shipped)
    assert any("kafka-clients-" in j for j in shipped)
    # jars that pyspark already ships are not passed twice
    assert not any(jars.artifact_name(j.rsplit("/", 1)[-1]) in jars.pyspark_jar_names() for j in shipped)


def test_streaming_query_round_trips_events_into_cassandra(stack_up: Settings, spark: Any) -> None:
    rows = roundtrip.run(stack_up, count=25, spark=spark)
    assert len(rows) == 25
    assert len({r.event_id for r in rows}) == 25
    assert {r.item for r in rows} == {"#item0", "#item1", "#item2"}
    per_partition: dict[int, list[int]] = {}
    for r in rows:
        per_partition.setdefault(r.kafka_partition, []).append(r.kafka_offset)
    for offsets in per_partition.values():  # every record read exactly once: offsets 0..n-1 per partition
        assert sorted(offsets) == list(range(len(offsets)))
    first, last = rows[0], rows[-1]
    assert (last.ts - first.ts).total_seconds() == 24 * 60
