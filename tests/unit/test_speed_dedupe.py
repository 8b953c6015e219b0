"""The speed layer's dedupe: each id counted once, late copies dropped, and no id kept once the watermark passed it.

Its eviction scans the whole dedupe state every micro-batch, so how long ids stay there is the speed job's cost per
batch at a steady rate (docs/history.md, "The soak"): Spark's default on ``ts`` kept them for twice the lateness.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from infra.settings import Settings
from speed_layer.checkpoint_definition import DEDUPE_ID, DEDUPE_ID_AND_TIME
from speed_layer.job import dedupe

pytestmark = pytest.mark.spark

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
TRACK_ROWS = "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows"


def write_batch(folder: Path, n: int, rows: list[tuple[str, int]]) -> None:
    """One file a micro-batch (maxFilesPerTrigger 1), in order: (id, seconds after T0)."""
    path = folder / f"{n:02d}.json"
    path.write_text(
        "".join(json.dumps({"id": i, "ts": (T0 + timedelta(seconds=s)).isoformat()}) + "\n" for i, s in rows)
    )
    os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))  # the file source takes the oldest first


@pytest.mark.parametrize(("by", "kept"), [(DEDUPE_ID_AND_TIME, 4), (DEDUPE_ID, 104)])
def test_events_are_counted_once_late_copies_dropped_and_ids_kept_while_a_copy_could_count(
    spark: Any, settings: Settings, tmp_path: Path, by: str, kept: int
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    write_batch(source, 0, [*((f"a{i}", i) for i in range(100)), ("a5", 5)])  # a copy within the batch
    write_batch(source, 1, [("b0", 1000), ("a7", 7)])  # a copy a batch later; the watermark then moves to T0+400 s
    # Batch N drops rows behind batch N-1's watermark and evicts ids behind its own (Spark's two watermarks).
    write_batch(source, 2, [("c0", 1001), ("a50", 50), ("d0", 450)])  # a50 is behind, but still in the state
    write_batch(source, 3, [("e0", 1002), ("a60", 60)])  # late now: the watermark is T0+400 s, a60 gone by id and ts

    lateness = settings.model_copy(update={"speed": settings.speed.model_copy(update={"allowed_lateness_s": 600})})
    events = spark.readStream.schema("id string, ts timestamp").option("maxFilesPerTrigger", 1).json(str(source))
    before = spark.conf.get(TRACK_ROWS)
    spark.conf.set(TRACK_ROWS, "true")
    try:
        query = (
            dedupe(events, lateness, by)
            .writeStream.format("memory")
            .queryName("dedupe_test")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(180), "the query did not drain its four files in 180 s"
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
        ids = [r["id"] for r in spark.sql("select id from dedupe_test").collect()]
    finally:
        for active in spark.streams.active:
            active.stop()
        spark.conf.set(TRACK_ROWS, before)
        spark.catalog.dropTempView("dedupe_test")

    assert [p["numInputRows"] for p in progress] == [101, 2, 3, 2]
    assert sorted(ids) == sorted([*(f"a{i}" for i in range(100)), "b0", "c0", "d0", "e0"])  # each once
    (last,) = progress[-1]["stateOperators"]
    assert last["numRowsDroppedByWatermark"] == 1
    # The watermark is T0+401 s in the last batch: every a-id is behind it. By id and event time none is kept;
    # by id alone (Spark's dropDuplicatesWithinWatermark) all are, until the watermark is 600 s past them.
    assert last["numRowsTotal"] == kept, last
    assert progress[-1]["eventTime"]["watermark"] == "2026-11-26T12:06:41.000Z", progress[-1]["eventTime"]
