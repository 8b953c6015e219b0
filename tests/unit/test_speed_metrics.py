from __future__ import annotations

from datetime import UTC, datetime

from speed_layer.metrics import BatchMetrics, MetricsRegistry

PROGRESS = {
    "batchId": 7,
    "numInputRows": 3000,
    "inputRowsPerSecond": 1500.0,
    "processedRowsPerSecond": 2500.5,
    "batchDuration": 1200,
    "eventTime": {"watermark": "2026-05-01T10:00:00.000Z"},
    "stateOperators": [
        {"numRowsTotal": 100, "numRowsDroppedByWatermark": 2},
        {"numRowsTotal": 40, "numRowsDroppedByWatermark": 1},
    ],
    "sources": [{"metrics": {"maxOffsetsBehindLatest": "120", "avgOffsetsBehindLatest": "30.0"}}],
    "observedMetrics": {"parse": {"rows": 3000, "unparseable": 4}},
}


def test_progress_is_reduced_to_the_operator_figures() -> None:
    m = BatchMetrics.from_progress(PROGRESS)
    assert (m.batch_id, m.input_rows, m.batch_duration_ms) == (7, 3000, 1200)
    assert (m.state_rows, m.dropped_late_rows, m.unparseable_rows, m.kafka_lag_max) == (140, 3, 4, 120)
    assert m.watermark == datetime(2026, 5, 1, 10, tzinfo=UTC)
    line = m.log_line()
    assert "3000 rows" in line and "dropped late 3" in line and "kafka lag 120" in line


def test_empty_progress_does_not_break() -> None:
    m = BatchMetrics.from_progress({"batchId": 0})
    assert (m.input_rows, m.watermark, m.kafka_lag_max) == (0, None, None)


def test_prometheus_text_accumulates_counters() -> None:
    reg = MetricsRegistry("speed_view")
    reg.record(BatchMetrics.from_progress(PROGRESS))
    reg.record(BatchMetrics.from_progress({**PROGRESS, "batchId": 8}))
    text = reg.render()
    assert 'trends_speed_input_rows_total{query="speed_view"} 6000' in text
    assert 'trends_speed_dropped_late_rows_total{query="speed_view"} 6' in text
    assert 'trends_speed_last_batch_id{query="speed_view"} 8' in text
    assert 'trends_speed_kafka_lag_records{query="speed_view"} 120' in text
    for line in text.splitlines():
        assert line.startswith("# TYPE ") or line.split(" ")[-1].replace(".", "", 1).lstrip("-").isdigit()
