"""Where a new speed checkpoint starts from the batch watermark: the pure offset computation and its record."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from speed_layer.start import StreamStart, hours_from, start_offsets
from views.buckets import HOUR
from views.store.index import IndexedPartition, OffsetSpan

W = datetime(2026, 5, 1, 10, tzinfo=UTC)


def part(p: int, next_offset: int) -> IndexedPartition:
    return IndexedPartition(p, next_offset, W, W, W)


def test_every_span_of_every_hour_at_or_above_the_watermark_counts_not_only_the_watermarks_hour() -> None:
    # partition 0 holds a replay: hour W+2 sits at offsets 5..9, before hour W's records (100..120)
    by_hour = {
        W: [OffsetSpan(0, 100, 120, 21), OffsetSpan(1, 40, 60, 21)],
        W + 2 * HOUR: [OffsetSpan(0, 5, 9, 5)],
        W + HOUR: [OffsetSpan(1, 70, 90, 21)],
    }
    assert start_offsets(W, by_hour, [part(0, 200), part(1, 95)]) == {0: 5, 1: 40}


def test_hours_below_the_watermark_do_not_move_the_start_back() -> None:
    by_hour = {W - HOUR: [OffsetSpan(0, 0, 50, 51)], W: [OffsetSpan(0, 51, 80, 30)]}
    assert start_offsets(W, by_hour, [part(0, 81)]) == {0: 51}


def test_a_partition_without_records_at_or_above_the_watermark_starts_at_the_index_end_not_at_its_beginning() -> None:
    # partition 1 only has old records (offsets 0..29): it starts where the index has read up to, so records
    # produced after the index's pass are read, and none of the old ones
    by_hour = {W - 3 * HOUR: [OffsetSpan(1, 0, 29, 30)], W: [OffsetSpan(0, 10, 12, 3)]}
    assert start_offsets(W, by_hour, [part(0, 13), part(1, 30)], partitions=[0, 1]) == {0: 10, 1: 30}


def test_a_partition_the_index_never_read_starts_at_its_beginning() -> None:
    assert start_offsets(W, {}, [part(0, 7)], partitions=[0, 1, 2]) == {0: 7, 1: 0, 2: 0}


def test_a_start_inside_an_hour_counts_that_whole_hour() -> None:
    by_hour = {W: [OffsetSpan(0, 3, 4, 2)]}
    assert start_offsets(W + HOUR / 2, by_hour, [part(0, 9)]) == {0: 3}


def test_the_kafka_source_gets_json_per_topic_and_partition_and_the_record_reads_back() -> None:
    start = StreamStart("events", W, {1: 30, 0: 5}, topic_records=1000, to_read=40)
    assert json.loads(start.spark_offsets()) == {"events": {"0": 5, "1": 30}}
    assert StreamStart.from_json(start.to_json()) == start


def test_hours_from_the_watermark_to_the_newest_indexed_record() -> None:
    assert hours_from(W, W + 2 * HOUR + HOUR / 3) == [W, W + HOUR, W + 2 * HOUR]
    assert hours_from(W, None) == []
    assert hours_from(W, W - HOUR) == []
