"""What a long window costs the serving process, on the real Cassandra: rows merged as they stream in, never held.

A throw-away keyspace holds a day of speed-view minutes with 30 KB frequent-items sketches (the batch view lagging:
the costly case). The answer over the whole window is merged while the rows arrive; Python's allocations are traced
(``tracemalloc``) and must stay a small fraction of the bytes read. The same window loaded with its rows kept shows
that the measure sees holding them.
"""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import datasketches as ds
import pytest

from infra import migrations
from infra.cassandra import session
from infra.settings import Settings
from serving import queries, window
from serving.budget import ReadBudget, ReadBudgetExceededError
from serving.reader import ViewReader
from speed_layer.sink import SpeedViewSink
from views.store.rows import ViewRow

END = datetime(2026, 3, 2, tzinfo=UTC)
ROWS = 1440
MIN = timedelta(minutes=1)


@pytest.fixture
def long_speed_window(keyspace_settings: Settings) -> tuple[Settings, int, int]:
    """Write a day of speed minutes with big sketches; return the settings, the events and the sketch bytes."""
    settings = keyspace_settings
    migrations.migrate(settings)
    rng = random.Random(16)
    variants = []
    for _ in range(8):
        fi = ds.frequent_strings_sketch(11)
        for _ in range(3000):
            fi.update(f"#item-{rng.randrange(5000):06d}")
        variants.append(bytes(fi.serialize()))
    start = END - ROWS * MIN
    # Planted through the speed layer's sink, which writes the coverage beside the rows: serving answers only
    # minutes the speed layer says it counted.
    sink = SpeedViewSink(settings, settings.speed.query_name, settings.speed.view_ttl_s, epoch_id="planted")
    try:
        sink.write_rows(
            [ViewRow("*", start + i * MIN, 3000, b"", b"", variants[i % 8], start + i * MIN, start + i * MIN)
             for i in range(ROWS)],
            0,
        )  # fmt: skip
        sink.read_all(datetime.now(UTC))  # as the job records after a batch that read the whole topic
    finally:
        sink.close()
    return settings, 3000 * ROWS, sum(len(variants[i % 8]) for i in range(ROWS))


def traced_peak(fn: Callable[[], Any]) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_long_window_is_merged_as_it_streams_in(long_speed_window: tuple[Settings, int, int]) -> None:
    settings, events, sketch_bytes = long_speed_window
    assert sketch_bytes > 40 * 2**20  # 1,440 rows of ~30 KB
    with session(settings) as sess:
        reader = ViewReader(settings, sess)
        # prepare, warm the driver
        window.load(reader, END - 60 * MIN, END, "*", fields=("items_fi",))

        def top() -> queries.Top:
            w = window.load(reader, END - ROWS * MIN, END, "*", fields=("items_fi",), keep_rows=False)
            assert w.provenance.spans[0]["layer"] == "speed" and not w.buckets
            return queries.top(w, 10)

        answer, streamed = traced_peak(top)
        held, holding = traced_peak(
            lambda: window.load(reader, END - ROWS * MIN, END, "*", fields=("items_fi",), keep_rows=True)
        )
    assert sum(b.events for b in held.buckets) == events == held.merged.events  # the same rows, all of them
    assert answer.items and answer.items_max_error > 0
    assert holding > sketch_bytes  # the measure sees rows held
    assert streamed < sketch_bytes / 4, (streamed, holding, sketch_bytes)  # merged as they came, a page at a time


def test_the_read_budget_stops_a_request_that_reads_too_much(long_speed_window: tuple[Settings, int, int]) -> None:
    settings, _, sketch_bytes = long_speed_window
    with session(settings) as sess:
        reader = ViewReader(settings, sess)
        budget = ReadBudget(sketch_bytes // 4)
        with pytest.raises(ReadBudgetExceededError, match=r"serving\.max_read_mb") as exc:
            window.load(reader, END - ROWS * MIN, END, "*", fields=("items_fi",), budget=budget)
        assert budget.bytes > sketch_bytes // 4 and budget.rows < ROWS // 3, (budget.rows, exc.value)
        enough = ReadBudget(sketch_bytes)
        window.load(reader, END - ROWS * MIN, END, "*", fields=("items_fi",), budget=enough)
        assert (enough.rows, enough.bytes) == (ROWS, sketch_bytes)
