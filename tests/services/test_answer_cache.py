"""The answer cache against real Cassandra: a repeated question is a lookup until a layer moves, and then never stale.

Rows are planted with the layers' own writers (the speed layer's sink, the batch layer's store) into a private
keyspace; one process-wide reader answers as the API does. Each layer is moved in turn — speed progress, a new batch
run of an hour, the watermark, a pin, speed rows expiring — and the next answer must follow at once. Last, ``trends
serve --workers 2`` answers the same questions and its ``/metrics`` adds up both workers.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import datasketches as ds
import httpx
import psutil
import pytest

from batch_layer.publish import BatchStore
from infra import migrations
from infra.cassandra import session
from infra.settings import Settings
from infra.settings_env import to_env
from serving import queries, window
from serving.plan import SPEED_ROWS_GONE
from serving.reader import ViewReader
from speed_layer.sink import SpeedViewSink
from views.buckets import HOUR, MINUTE, floor
from views.sketches import merge_all
from views.store.rows import ViewRow

TRENDS = str(Path(sys.executable).parent / "trends")
PORTS = range(19400, 19500)  # this suite's private servers (loopback)


def sketches_of(rng: random.Random, events: int) -> tuple[bytes, bytes, bytes]:
    hll = ds.hll_sketch(12, ds.tgt_hll_type.HLL_8)
    kll = ds.kll_doubles_sketch(200)
    fi = ds.frequent_strings_sketch(8)
    for _ in range(events):
        hll.update(f"u{rng.randrange(1000)}")
        kll.update(rng.random())
        fi.update(f"#i{rng.randrange(30)}")
    return bytes(hll.serialize_compact()), bytes(kll.serialize()), bytes(fi.serialize())


@dataclass
class Planted:
    settings: Settings
    h0: datetime
    speed: dict[datetime, int]  # events per minute in the speed view
    batch: dict[datetime, int]  # events per minute in the batch view's current runs
    rng: random.Random

    def speed_rows(self, sink: SpeedViewSink, minutes: dict[datetime, int], batch_id: int) -> None:
        last = MINUTE - timedelta(milliseconds=1)
        rows = [ViewRow("*", m, n, *sketches_of(self.rng, n), m, m + last) for m, n in sorted(minutes.items())]
        sink.write_rows(rows, batch_id)
        sink.read_all(datetime.now(UTC))  # as the job records after a batch that read the whole topic
        self.speed.update(minutes)

    def batch_run(self, store: BatchStore, hour: datetime, per_minute: int) -> uuid.UUID:
        minutes = [hour + i * MINUTE for i in range(60)]
        rows = [ViewRow("*", m, per_minute, *sketches_of(self.rng, per_minute), m, m) for m in minutes]
        merged = merge_all((r.users_hll, r.values_kll, r.items_fi) for r in rows)
        run = uuid.uuid1()
        store.rows.write_versions({hour: run}, {hour: rows}, {hour: [ViewRow("*", hour, 60 * per_minute, *merged,
                                                                            hour, hour)]})  # fmt: skip
        store.pointers.swap([(hour, run, None)])
        store.remerge_day(hour.date())
        self.batch.update(dict.fromkeys(minutes, per_minute))
        return run

    def truth(self, start: datetime, end: datetime, boundary: datetime) -> int:
        """Return the events an answer over [start, end) must count: batch below the boundary, speed from it."""
        return sum(n for m, n in self.batch.items() if start <= m < min(end, boundary)) + sum(
            n for m, n in self.speed.items() if max(start, boundary) <= m < end
        )


def sink_of(settings: Settings, ttl_s: int) -> SpeedViewSink:
    return SpeedViewSink(settings, settings.speed.query_name, ttl_s, epoch_id=f"test-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def planted(keyspace_settings: Settings) -> Iterator[Planted]:
    """Three hours: speed rows for all of them (3 events a minute), batch runs of the first two (2 a minute)."""
    settings = keyspace_settings.model_copy(
        update={
            "speed": keyspace_settings.speed.model_copy(update={"starting_offsets": "earliest"}),
            # the layers' state read for every answer: a layer's move shows in the very next answer
            "serving": keyspace_settings.serving.model_copy(update={"state_max_age_ms": 0}),
        }
    )
    migrations.migrate(settings)
    h0 = floor(datetime.now(UTC), HOUR) - 3 * HOUR
    p = Planted(settings, h0, {}, {}, random.Random(23))
    sink = sink_of(settings, 24 * 3600)
    try:
        p.speed_rows(sink, {h0 + i * MINUTE: 3 for i in range(180)}, 0)
        with session(settings) as sess:
            store = BatchStore(settings, sess)
            for hour in (h0, h0 + HOUR):
                p.batch_run(store, hour, 2)
            store.pointers.write_watermark(h0, h0 + 2 * HOUR)
        yield p
    finally:
        sink.close()


def test_each_layer_moving_invalidates_the_answer_and_a_speed_move_reads_only_its_minutes(planted: Planted) -> None:
    p, h0 = planted, planted.h0
    start, end = h0 + 30 * MINUTE, h0 + 2 * HOUR + 30 * MINUTE  # batch minutes, a batch hour, speed minutes
    with session(p.settings) as sess:
        reader = ViewReader(p.settings, sess)
        answers, speed_cache = reader.answers, reader.speed_cache
        assert answers is not None and speed_cache is not None

        def ask() -> queries.Summary:
            return queries.summary(window.load(reader, start, end, "*", keep_rows=False))

        first = ask()
        assert first.events == p.truth(start, end, h0 + 2 * HOUR) == 30 * 2 + 60 * 2 + 30 * 3
        assert (answers.misses, answers.hits) == (1, 0)
        reads = speed_cache.misses
        again = ask()  # nothing moved: a lookup
        assert (answers.hits, speed_cache.misses) == (1, reads)
        assert (again.events, again.users, again.top_items) == (first.events, first.users, first.top_items)

        # the speed layer moves: one minute of the window gets 4 more events; only that minute is read again
        sink = sink_of(p.settings, 24 * 3600)
        sink.epoch_id = reader.speed_rows.epochs(p.settings.speed.query_name)[0].id  # the same epoch continues
        try:
            p.speed_rows(sink, {h0 + 2 * HOUR + 10 * MINUTE: 7}, 1)
        finally:
            sink.close()
        moved = ask()
        assert moved.events == first.events + 4
        assert answers.partial == 1 and speed_cache.misses == reads + 1  # the changed minute alone
        assert ask().events == moved.events and answers.hits == 2

        # a new batch run of hour h0+1 (3 a minute instead of 2): the batch part is read again
        with session(p.settings) as s2:
            store = BatchStore(p.settings, s2)
            p.batch_run(store, h0 + HOUR, 3)
            rerun = ask()
            assert rerun.events == moved.events + 60 and answers.misses == 2

            # the watermark moves over h0+2 (batch 1 a minute): its minutes leave the speed view for the batch view
            p.batch_run(store, h0 + 2 * HOUR, 1)
            store.pointers.write_watermark(h0, h0 + 3 * HOUR)
            advanced = ask()
            assert advanced.provenance.boundary == h0 + 3 * HOUR
            assert advanced.events == p.truth(start, end, h0 + 3 * HOUR) == rerun.events - 30 * 3 - 4 + 30 * 1

            # a pin at h0+1 hands [h0+1, end) back to the speed view
            store.pointers.pin(h0 + HOUR)
            try:
                pinned = ask()
                assert pinned.provenance.boundary == h0 + HOUR and pinned.provenance.boundary_pinned
                assert pinned.events == p.truth(start, end, h0 + HOUR)
                assert [s["layer"] for s in pinned.provenance.spans] == ["batch", "speed"]
            finally:
                store.pointers.pin(None)
            assert ask().events == advanced.events  # unpinned: the batch view again
        assert answers.hits == 2  # every move above was answered anew, never from the cache


def test_speed_rows_expiring_turn_a_cached_answer_into_a_gap(keyspace_settings: Settings) -> None:
    """Even with the layers' state reused for a minute, a speed hour whose rows' TTL passed is a gap at once."""
    ttl = 12
    base = keyspace_settings.model_copy(
        update={"speed": keyspace_settings.speed.model_copy(update={"starting_offsets": "earliest"})}
    )
    settings = base.model_copy(update={"serving": base.serving.model_copy(update={"state_max_age_ms": 60_000})})
    migrations.migrate(settings)
    now = floor(datetime.now(UTC), MINUTE)
    start, end = now - 20 * MINUTE, now - 5 * MINUTE
    p = Planted(settings, floor(start, HOUR), {}, {}, random.Random(5))
    sink = sink_of(settings, ttl)
    written = time.monotonic()
    try:
        p.speed_rows(sink, {start + i * MINUTE: 2 for i in range(15)}, 0)
    finally:
        sink.close()
    with session(settings) as sess:
        reader = ViewReader(settings, sess)
        assert reader.answers is not None
        w = window.load(reader, start, end, "*", fields=(), keep_rows=False)
        assert queries.count(w).events == 30 and w.provenance.gaps == []
        assert window.load(reader, start, end, "*", fields=(), keep_rows=False).merged.events == 30
        assert reader.answers.hits == 1
        time.sleep(max(0.0, written + ttl + 1 - time.monotonic()))
        expired = window.load(reader, start, end, "*", fields=(), keep_rows=False)
        assert expired.merged.events == 0
        assert [(g["start"], g["end"], g["reason"]) for g in expired.provenance.gaps] == [(start, end, SPEED_ROWS_GONE)]
        assert reader.answers.hits == 1  # the gap was not hidden behind the cached answer


def _metric(text: str, name: str, labels: str = "") -> float:
    pattern = rf"^{re.escape(name)}{re.escape(labels)} (\S+)$"
    return sum(float(v) for v in re.findall(pattern, text, re.M))


def test_several_workers_answer_alike_and_metrics_add_up(planted: Planted) -> None:
    p, h0 = planted, planted.h0
    port = random.choice(PORTS)
    env = {**os.environ, **to_env(p.settings), "TRENDS_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen(
        [TRENDS, "serve", "--workers", "2", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-2000:]
            time.sleep(0.3)
        children = psutil.Process(proc.pid).children(recursive=True)
        workers = [c for c in children if "resource_tracker" not in " ".join(c.cmdline())]
        assert len(workers) == 2, [c.cmdline() for c in children]
        metrics_dir = Path(workers[0].environ()["PROMETHEUS_MULTIPROC_DIR"])
        start, end = h0 + 30 * MINUTE, h0 + 2 * HOUR + 30 * MINUTE
        url = f"{base}/api/v1/count?start={start:%Y-%m-%dT%H:%MZ}&end={end:%Y-%m-%dT%H:%MZ}"
        asked = 40
        answers = []
        for _ in range(asked):  # a new connection each: the kernel spreads them over the workers
            r = httpx.get(url, timeout=30, headers={"Connection": "close"})
            assert r.status_code == 200, r.text
            answers.append(r.json()["events"])
        assert set(answers) == {p.truth(start, end, h0 + 2 * HOUR)}
        pids = {f.stem.rsplit("_", 1)[-1] for f in metrics_dir.glob("counter_*.db")}
        assert len(pids) >= 2, pids  # both workers answered (and wrote their counts)
        for scrape in range(1, 4):  # whichever worker answers the scrape, the figures are every worker's
            text = httpx.get(f"{base}/metrics", timeout=30).text
            assert _metric(text, "trends_api_requests_total", '{route="/api/v1/count",status="200"}') == asked
            outcomes = sum(
                _metric(text, "trends_api_answers_total", f'{{outcome="{o}"}}') for o in ("hit", "partial", "miss")
            )
            assert outcomes == asked + scrape  # each scrape answers one question too (the gap minutes)
            assert _metric(text, "trends_api_answers_total", '{outcome="hit"}') >= asked - 2 * len(pids)
    finally:
        proc.terminate()
        proc.wait(30)
    assert not metrics_dir.exists()  # a fresh directory per start, removed at the end


def test_a_move_of_the_newest_minute_keeps_the_settled_speed_part(planted: Planted) -> None:
    """Minutes older than the speed layer's lateness stay merged; only the newer ones are merged (and read) again."""
    p, h0 = planted, planted.h0
    start, end = h0 + 2 * HOUR, h0 + 3 * HOUR  # all speed minutes; the newest is end - 1 min
    question = (((start, end),), "*", "day", frozenset(queries.NEEDS["top"]), None)
    with session(p.settings) as sess:
        reader = ViewReader(p.settings, sess)
        assert reader.answers is not None and reader.speed_cache is not None
        first = window.load(reader, start, end, "*", fields=queries.NEEDS["top"], keep_rows=False)
        before = reader.answers.peek(question)
        assert before is not None and first.merged.events == 180
        settled = before.speed_parts[0]
        assert len(settled.versions) == 60 - 11  # lateness 600 s: the last 11 minutes may still change
        reads = reader.speed_cache.misses
        sink = sink_of(p.settings, 24 * 3600)
        sink.epoch_id = reader.speed_rows.epochs(p.settings.speed.query_name)[0].id
        try:
            p.speed_rows(sink, {end - MINUTE: 5}, 1)
        finally:
            sink.close()
        moved = window.load(reader, start, end, "*", fields=queries.NEEDS["top"], keep_rows=False)
        after = reader.answers.peek(question)
        assert moved.merged.events == 182 and reader.answers.partial == 1
        assert after is not None and after.speed_parts[0] is settled  # kept as it was, not merged again
        assert reader.speed_cache.misses == reads + 1  # the moved minute alone was read
        items = moved.merged.sketches.items
        assert items is not None and items.total_weight == 182  # the kept part and the newer minutes, each once
