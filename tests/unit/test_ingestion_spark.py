"""Spark parses what ingestion writes, with the schema derived from the model, to the same millisecond."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from ingestion.generator import SyntheticStream
from ingestion.generator_config import GeneratorConfig
from views.event import Event
from views.event_frames import SPARK_JSON_OPTIONS, spark_schema

pytestmark = pytest.mark.spark


def test_spark_reads_every_field_of_the_normalized_json(spark: Any) -> None:
    from pyspark.sql import functions as F

    stream = SyntheticStream(GeneratorConfig(seed=2, count=300, rate=None, start=datetime(2025, 11, 22, tzinfo=UTC)))
    generated = [v for c in stream.chunks() for v in c.values]
    edge = [
        Event(id="epoch", ts=0, item="#zero").to_json(),
        Event(
            id="ms", ts="2025-11-22T23:59:59.999+00:00", item="#é", user="ü", value=-1e-3, dims={"a.b": "ö"}
        ).to_json(),
    ]
    values = generated + edge
    frame = spark.createDataFrame([(v,) for v in values], "value binary")
    parsed = frame.select(F.from_json(F.col("value").cast("string"), spark_schema(), SPARK_JSON_OPTIONS).alias("e"))
    rows = parsed.select("e.*", F.unix_millis("e.ts").alias("ms")).collect()
    assert len(rows) == len(values)
    for raw, row in zip(values, rows, strict=True):
        event = Event.model_validate_json(raw)
        assert (row.v, row.id, row.item, row.user, row.value) == (
            event.v,
            event.id,
            event.item,
            event.user,
            event.value,
        )
        assert row.ms == event.ts_ms
        assert (row.dims or {}) == event.dims
