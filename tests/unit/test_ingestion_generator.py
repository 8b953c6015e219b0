"""The synthetic stream: reproducible, valid, Zipf-shaped, with bursts where the ground truth says."""

from __future__ import annotations

import io
import json
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from ingestion.generator import CHUNK, SyntheticStream, jsonl_writer, run, write_truth
from ingestion.generator_config import Burst, GeneratorConfig, GeneratorError
from ingestion.validate import Context, validate_json
from views.event import Event, ts_millis

START = datetime(2025, 11, 22, 0, 0, tzinfo=UTC)
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def historical(**kw: object) -> GeneratorConfig:
    base: dict[str, object] = {"seed": 7, "start": START, "event_rate": 100.0, "rate": None, "count": 3 * CHUNK + 5}
    base.update(kw)
    return GeneratorConfig(**base)  # type: ignore[arg-type]


def events_of(config: GeneratorConfig) -> list[bytes]:
    return [v for chunk in SyntheticStream(config).chunks() for v in chunk.values]


def test_the_same_seed_gives_the_same_stream_and_another_seed_does_not() -> None:
    a, b = events_of(historical()), events_of(historical())
    assert a == b
    assert len(a) == 3 * CHUNK + 5
    assert events_of(historical(seed=8)) != a


def test_chunk_sizes_do_not_change_the_stream() -> None:
    config = historical()
    small = [v for c in SyntheticStream(config).chunks(iter(lambda: 37, None)) for v in c.values]
    assert small == events_of(config)


def test_every_generated_record_is_a_valid_event_in_normalized_form() -> None:
    ctx = Context(source="generator", now=NOW)
    for raw in events_of(historical(count=2000)):
        event = validate_json(raw, ctx)
        assert isinstance(event, Event), event
        assert event.to_json() == raw  # the fast path writes exactly what the model would
        assert 140 <= len(raw) <= 170  # ~150-byte events, as the benchmark assumes


def test_historical_time_runs_from_start_at_the_event_rate_with_unique_ids() -> None:
    stream = SyntheticStream(historical(count=1000, event_rate=50.0))
    chunks = list(stream.chunks())
    ts = [t for c in chunks for t in c.ts_ms]
    assert ts[0] == ts_millis(START)
    assert ts[-1] == ts_millis(START) + 999 * 20
    assert ts == sorted(ts)
    ids = [json.loads(v)["id"] for c in chunks for v in c.values]
    assert len(set(ids)) == len(ids)
    end_config = historical(count=None, end=START + timedelta(minutes=2), event_rate=10.0)
    assert end_config.total() == 1200


def test_item_popularity_is_zipf_shaped() -> None:
    counts = Counter(json.loads(v)["item"] for v in events_of(historical(count=50_000, items=1000, zipf_s=1.1)))
    assert counts.most_common(1)[0][0] == "#t1"
    ratio = counts["#t1"] / counts["#t10"]
    assert 10**1.1 * 0.8 < ratio < 10**1.1 * 1.25  # p(1)/p(10) = 10^s


def test_a_planted_burst_lifts_its_item_only_inside_its_window_and_the_truth_says_so(tmp_path: Path) -> None:
    burst = Burst.parse("@50:10:5:3")  # #t50 ten-fold from minute 5 for 3 minutes
    config = historical(count=60_000, event_rate=100.0, items=1000, bursts=(burst,))  # 10 minutes of event time
    stream = SyntheticStream(config)
    inside = outside = 0
    total_inside = total_outside = 0
    lo, hi = ts_millis(START) + 5 * 60_000, ts_millis(START) + 8 * 60_000
    for chunk in stream.chunks():
        for value, ts in zip(chunk.values, chunk.ts_ms, strict=True):
            hit = json.loads(value)["item"] == "#t50"
            if lo <= ts < hi:
                inside += hit
                total_inside += 1
            else:
                outside += hit
                total_outside += 1
    lift = (inside / total_inside) / (outside / total_outside)
    assert 7 < lift < 14, lift
    truth_file = tmp_path / "truth.json"
    write_truth(stream, truth_file)
    truth = json.loads(truth_file.read_text())
    (planted,) = truth["bursts"]
    assert planted["item"] == "#t50" and planted["factor"] == 10
    assert planted["window_start"] == "2025-11-22T00:05:00.000Z"
    assert planted["window_end"] == "2025-11-22T00:08:00.000Z"
    assert (planted["events_in_window"], planted["all_events_in_window"]) == (inside, total_inside)
    assert truth["count"] == 60_000 and truth["mode"] == "historical"


def test_planting_a_burst_leaves_the_rest_of_the_stream_alone() -> None:
    plain = events_of(historical(count=2000, items=1000))
    with_burst = events_of(historical(count=2000, items=1000, bursts=(Burst.parse("@900:5:100:1"),)))
    assert plain == with_burst  # the burst's window lies after these events


def test_keys_follow_the_key_field() -> None:
    chunk = next(SyntheticStream(historical(count=10, key_field="user")).chunks())
    assert chunk.keys == [json.loads(v)["user"].encode() for v in chunk.values]
    chunk = next(SyntheticStream(historical(count=10, key_field="none")).chunks())
    assert chunk.keys == [None] * 10


@pytest.mark.parametrize(
    "config",
    [
        historical(count=None),  # unbounded historical stream
        historical(start=NOW - timedelta(seconds=10), count=100_000, event_rate=10.0),  # runs into the future
        historical(bursts=(Burst("#t99999", 2, 0, 1),)),  # unknown item
        GeneratorConfig(rate=-1),
    ],
)
def test_inconsistent_configs_are_refused_up_front(config: GeneratorConfig) -> None:
    with pytest.raises(GeneratorError):
        config.check(NOW, timedelta(minutes=5))


def test_bad_burst_specs_are_refused() -> None:
    for spec in ("#t1:10", "#t1:x:1:1", "#t1:0.5:1:1", "#t1:2:1:0"):
        with pytest.raises(GeneratorError):
            Burst.parse(spec)


def test_live_streams_use_the_wall_clock_and_pacing_holds_the_rate() -> None:
    config = GeneratorConfig(seed=1, count=600, rate=1500.0)
    stream = SyntheticStream(config)
    out = io.BytesIO()
    before = int(time.time() * 1000)
    stats = run(stream, jsonl_writer(out), rate=1500.0)
    after = int(time.time() * 1000)
    lines = out.getvalue().splitlines()
    assert stats.emitted == len(lines) == 600
    assert 0.3 <= stats.elapsed_s < 2.0  # 600 events at 1,500/s: 0.4 s
    stamps = [ts_millis(datetime.fromisoformat(json.loads(x)["ts"])) for x in lines]
    assert before <= stamps[0] <= stamps[-1] <= after


def test_run_stops_when_asked() -> None:
    stream = SyntheticStream(GeneratorConfig(seed=1, rate=None))  # unbounded
    out = io.BytesIO()
    calls = iter(range(1_000_000))
    stats = run(stream, jsonl_writer(out), rate=None, should_stop=lambda: next(calls) >= 3)
    assert stats.stopped and stats.emitted == 4 * CHUNK


def test_generate_to_a_file_from_the_cli(tmp_path: Path) -> None:
    from app.cli import cli

    out, truth = tmp_path / "ev.jsonl.gz", tmp_path / "truth.json"
    result = CliRunner().invoke(
        cli,
        [
            "ingest",
            "generate",
            "--start",
            "2025-11-22T00:00:00Z",
            "--end",
            "2025-11-22T00:10:00Z",
            "--event-rate",
            "20",
            "--burst",
            "@30:6:2:4",
            "-o",
            str(out),
            "--truth",
            str(truth),
        ],
    )
    assert result.exit_code == 0, result.output
    import gzip

    lines = gzip.decompress(out.read_bytes()).splitlines()
    assert len(lines) == 10 * 60 * 20
    assert json.loads(truth.read_text())["bursts"][0]["item"] == "#t30"
