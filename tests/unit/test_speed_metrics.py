from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from speed_layer.metrics import COUNTERS, GAUGES, BatchMetrics, MetricsRegistry

PROGRESS = {
    "batchId": 7,
    "numInputRows": 3000,
    "inputRowsPerSecond": 1500.0,
    "processedRowsPerSecond": 2500.5,
    "batchDuration": 1200,
    "eventTime": {"watermark": "2026-05-01T10:00:00.000Z"},
    "stateOperators": [
        {"numRowsTotal": 100, "numRowsDroppedByWatermark": 2, "memoryUsedBytes": 3000},
        {"numRowsTotal": 40, "numRowsDroppedByWatermark": 1, "memoryUsedBytes": 500},
    ],
    "sources": [{"metrics": {"maxOffsetsBehindLatest": "120", "avgOffsetsBehindLatest": "30.0"}}],
    "observedMetrics": {"parse": {"rows": 3000, "unparseable": 4, "below_watermark": 5}},
}


def test_progress_is_reduced_to_the_operator_figures() -> None:
    m = BatchMetrics.from_progress(PROGRESS)
    assert (m.batch_id, m.input_rows, m.batch_duration_ms) == (7, 3000, 1200)
    assert (m.state_rows, m.dropped_late_rows, m.unparseable_rows, m.kafka_lag_max) == (140, 3, 4, 120)
    assert m.watermark == datetime(2026, 5, 1, 10, tzinfo=UTC)
    line = m.log_line()
    assert "3000 rows" in line and "dropped late 3" in line and "kafka lag 120" in line
    assert m.skipped_below_watermark_rows == 5 and "below the batch watermark 5" in line
    assert m.state_memory_bytes == 3500


def test_empty_progress_does_not_break() -> None:
    m = BatchMetrics.from_progress({"batchId": 0})
    assert (m.input_rows, m.watermark, m.kafka_lag_max) == (0, None, None)
    assert (m.started_at, m.read_to_end) == (None, False)
    assert m.state_memory_bytes is None  # no stateful operator: no figure rather than 0


def test_a_batch_read_the_whole_topic_only_when_no_partition_was_left_behind() -> None:
    """Its trigger's start is then how far the epoch has read everything (serving's live minute rests on it)."""
    at = {"timestamp": "2026-05-01T10:00:01.500Z"}
    behind = BatchMetrics.from_progress({**PROGRESS, **at})
    assert behind.started_at == datetime(2026, 5, 1, 10, 0, 1, 500000, tzinfo=UTC) and not behind.read_to_end
    level = {"metrics": {"maxOffsetsBehindLatest": "0"}}
    assert BatchMetrics.from_progress({**PROGRESS, **at, "sources": [level]}).read_to_end
    unknown = {"metrics": {}}  # a source that reports no lag is not known to be level
    assert not BatchMetrics.from_progress({**PROGRESS, **at, "sources": [level, unknown]}).read_to_end
    assert not BatchMetrics.from_progress({**PROGRESS, **at, "sources": []}).read_to_end


def test_prometheus_text_accumulates_counters() -> None:
    reg = MetricsRegistry("speed_view")
    reg.record(BatchMetrics.from_progress(PROGRESS))
    reg.record(BatchMetrics.from_progress({**PROGRESS, "batchId": 8}))
    reg.newest_event_ts = datetime(2026, 5, 1, 10, 5, tzinfo=UTC)
    samples = {
        (s.name, s.labels["query"]): s.value
        for family in text_string_to_metric_families(reg.render())
        for s in family.samples
    }
    assert samples[("trends_speed_input_rows_total", "speed_view")] == 6000
    assert samples[("trends_speed_dropped_late_rows_total", "speed_view")] == 6
    assert samples[("trends_speed_skipped_below_batch_watermark_rows_total", "speed_view")] == 10
    assert samples[("trends_speed_last_batch_id", "speed_view")] == 8
    assert samples[("trends_speed_consumer_lag_records", "speed_view")] == 120
    assert samples[("trends_speed_batch_duration_seconds", "speed_view")] == 1.2
    assert (
        samples[("trends_speed_watermark_timestamp_seconds", "speed_view")]
        == datetime(2026, 5, 1, 10, tzinfo=UTC).timestamp()
    )
    assert (
        samples[("trends_speed_newest_event_timestamp_seconds", "speed_view")]
        == datetime(2026, 5, 1, 10, 5, tzinfo=UTC).timestamp()
    )
    assert set(COUNTERS) | set(GAUGES) == {name for name, _ in samples}


def test_unknown_figures_have_no_sample_rather_than_a_zero() -> None:
    reg = MetricsRegistry("q")
    names = {f.name for f in text_string_to_metric_families(reg.render())}
    # counters start at 0; gauges nobody measured yet (lag, watermark, freshness) are absent, not 0
    assert "trends_speed_consumer_lag_records" not in names
    assert "trends_speed_newest_event_timestamp_seconds" not in names
    assert "trends_speed_batches" in names  # the family name of trends_speed_batches_total


def test_the_textfile_is_the_same_exposition(tmp_path: Path) -> None:
    reg = MetricsRegistry("q")
    reg.record(BatchMetrics.from_progress(PROGRESS))
    target = tmp_path / "metrics" / "speed.prom"
    reg.write_textfile(target)
    assert 'trends_speed_input_rows_total{query="q"} 3000.0' in target.read_text()


def test_uncounted_state_rows_are_not_exported_as_zero() -> None:
    """With speed.track_state_rows off Spark reports 0 state rows: the gauge is left out rather than read as 0."""
    m = BatchMetrics.from_progress(PROGRESS, state_rows_tracked=False)
    assert m.state_rows is None
    assert "state - rows" in m.log_line()
    registry = MetricsRegistry("q")
    registry.record(m)
    assert "trends_speed_state_rows" not in registry.render()
    registry.record(BatchMetrics.from_progress(PROGRESS))
    assert 'trends_speed_state_rows{query="q"} 140.0' in registry.render()


def test_the_log_line_says_where_the_batch_time_went() -> None:
    progress = {**PROGRESS, "durationMs": {"addBatch": 700, "walCommit": 60, "triggerExecution": 900}}
    line = BatchMetrics.from_progress(progress).log_line()
    assert line.startswith("batch 7: 3000 rows in 1200 ms")  # what the soak and the bench parse
    assert "; ms: addBatch 700, walCommit 60, triggerExecution 900;" in line


def test_the_log_line_says_what_each_stateful_operator_took() -> None:
    """The dedupe's eviction scans its state every batch: its removals time is what grows with the lateness."""
    ops = [
        {"operatorName": "dedupeWithinWatermark", "allUpdatesTimeMs": 40, "allRemovalsTimeMs": 310, "commitTimeMs": 9},
        {"operatorName": "stateStoreSave", "allUpdatesTimeMs": 25, "allRemovalsTimeMs": 3, "commitTimeMs": 7},
    ]
    m = BatchMetrics.from_progress({**PROGRESS, "stateOperators": ops})
    assert m.state_ms == {"dedupeWithinWatermark": (40, 310, 9), "stateStoreSave": (25, 3, 7)}
    assert m.log_line().endswith(
        "; state ms (updates/removals/commit): dedupeWithinWatermark 40/310/9, stateStoreSave 25/3/7"
    )


def test_operators_of_one_name_are_kept_apart() -> None:
    ops = [{"operatorName": "stateStoreSave", "allRemovalsTimeMs": 1}, {"operatorName": "stateStoreSave"}]
    m = BatchMetrics.from_progress({**PROGRESS, "stateOperators": ops})
    assert m.state_ms == {"stateStoreSave": (0, 1, 0), "stateStoreSave#1": (0, 0, 0)}
