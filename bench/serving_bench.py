"""Serving benchmark: trending-query latency over 1 h, 24 h and 7 d windows with 7 days of minute buckets stored.

Run: ``.venv/bin/python bench/serving_bench.py`` with the stack up. It fills a throw-away keyspace with 7 days of
per-minute sketches in both views (batch: minutes, hourly and daily rollups up to a watermark two hours ago; speed:
every minute), then times the trending query (recent window vs the window of the same length before it) through
the library, as the API runs it, and prints p50/p99 per window (goal p99 <= 20 / 50 / 100 ms). Beside it, the bare
baseline: the same Cassandra reads of the same rows without planning or merging, and the ratio of the two.

Then ``trends serve`` runs in its own process over the same keyspace and 8 concurrent clients (threads, one HTTP
connection each) send trending requests for ``--http-seconds``: requests/s and p50/p99 over HTTP are printed, beside
the same clients against ``/health`` of the same server (the bare HTTP round trip) and the ratio.

Last, the cost of the most expensive request the API allows (``--rss``): a second keyspace holds only speed-view
minutes (the batch view lagging: the costly case) with realistic sketches, about ``serving.max_read_mb`` of them in
one window; ``trends serve`` answers ``/summary`` over that window to 8 clients at a time while its RSS is sampled.
It prints the process's peak RSS (goal < 300 MiB) beside its RSS at rest, the requests' times, and that a window
reading more than ``serving.max_read_mb`` is refused (400).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import datasketches as ds
import httpx

from batch_layer.store import BatchStore
from infra import migrations
from infra.cassandra import session
from infra.settings import Settings
from serving import queries
from serving.store import ViewReader
from speed_layer.sink import SpeedViewSink
from views.buckets import DAY, HOUR, MINUTE, floor
from views.store.rows import ViewRow
from views.store.speed import SpeedRows

WARMUP = 20
ITEMS = [f"#item{i}" for i in range(500)]
WEIGHTS = [1 / (i + 1) for i in range(len(ITEMS))]


def speed_sink(settings: Settings) -> SpeedViewSink:
    """Return the speed layer's sink, to plant speed rows with the coverage that lets serving answer them."""
    return SpeedViewSink(settings, settings.speed.query_name, settings.speed.view_ttl_s, epoch_id="bench")


def minute_sketches(rng: random.Random, events: int) -> tuple[bytes, bytes, bytes]:
    hll = ds.hll_sketch(12, ds.tgt_hll_type.HLL_8)
    kll = ds.kll_doubles_sketch(200)
    fi = ds.frequent_strings_sketch(10)
    for item in rng.choices(ITEMS, WEIGHTS, k=events):
        hll.update(f"u{rng.randrange(20_000)}")
        kll.update(rng.lognormvariate(3, 1))
        fi.update(item)
    return bytes(hll.serialize_compact()), bytes(kll.serialize()), bytes(fi.serialize())


def fill(settings: Settings, end: datetime, days: int, per_minute: int) -> datetime:
    """Write ``days`` of minute buckets ending at ``end``; return the batch watermark."""
    from views.sketches import merge_all

    rng = random.Random(5)
    start = end - days * DAY
    watermark = floor(end, HOUR) - 2 * HOUR
    minutes = []
    t = start
    while t < end:
        minutes.append((t, *minute_sketches(rng, per_minute)))
        t += MINUTE
    print(f"built {len(minutes):,} minute sketches")
    with session(settings) as sess:
        store, speed = BatchStore(settings, sess), SpeedRows(settings, sess)
        last_ms = MINUTE - timedelta(milliseconds=1)
        speed_sink(settings).write_rows(
            [ViewRow("*", m, per_minute, h, k, f, m, m + last_ms) for m, h, k, f in minutes], 0
        )
        by_hour: dict[datetime, list[tuple[datetime, bytes, bytes, bytes]]] = {}
        for m in minutes:
            by_hour.setdefault(floor(m[0], HOUR), []).append(m)
        for hour, ms in sorted(by_hour.items()):
            if hour >= watermark:
                continue
            run = uuid.uuid1()
            minute_rows = [ViewRow("*", m, per_minute, h, k, f, m, m) for m, h, k, f in ms]
            hh, hk, hf = merge_all((h, k, f) for _m, h, k, f in ms)
            hour_row = ViewRow("*", hour, per_minute * len(ms), hh, hk, hf, hour, hour)
            store.rows.write_versions({hour: run}, {hour: minute_rows}, {hour: [hour_row]})
            store.pointers.swap([(hour, run, None)])
        for d in range(days + 1):
            store.remerge_day((start + d * DAY).date())
        store.pointers.write_watermark(floor(start, HOUR) + HOUR, watermark)
        speed.write_progress(settings.speed.query_name, end - timedelta(seconds=1), None, 0, 0)
    return watermark


def bench(settings: Settings, end: datetime, window: timedelta, runs: int) -> tuple[list[float], list[float], int]:
    """Return the query times, the bare read times (ms) and the rows read per query."""
    from serving.merge import plan

    times, bare = [], []
    rows = 0
    with session(settings) as sess:
        prepared = ViewReader(settings, sess)
        for i in range(runs + WARMUP):
            reader = (
                prepared.request_reader()
            )  # as the API: statements prepared once per process, pointers read per request
            t0 = time.perf_counter()
            windows = [(end - window, end), (end - 2 * window, end - window)]
            recent, base = queries.load_many(reader, windows, "*", fields=queries.NEEDS["trending"])
            queries.trending(recent, base, limit=10, min_support=5)
            t1 = time.perf_counter()
            # bare baseline: the same row reads, planned in advance, no coverage look-ups, no merging
            cov = reader.coverage(end - 2 * window, end, "*")
            spans = [
                plan(a, b, cov.boundary, cov.batch_hours, cov.current_days, cov.speed)
                for a, b in ((end - window, end), (end - 2 * window, end - window))
            ]
            bare_reader = prepared.request_reader()
            bare_reader.cache = None  # the bare reads go to Cassandra every time
            t2 = time.perf_counter()
            for sp in spans:
                bare_reader.read(sp, "*", queries.NEEDS["trending"])
            t3 = time.perf_counter()
            if i >= WARMUP:  # the first runs prepare statements and warm the driver and Cassandra after the fill
                times.append((t1 - t0) * 1000)
                bare.append((t3 - t2) * 1000)
            rows = recent.merged.rows + base.merged.rows
    return times, bare, rows


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def hammer(url: str, clients: int, seconds: float) -> tuple[int, list[float], int]:
    """Send GETs of ``url`` from ``clients`` threads for ``seconds``; return requests, latencies (ms), errors."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        with httpx.Client(timeout=30) as http:
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                r = http.get(url)
                latencies[i].append((time.perf_counter() - t0) * 1000)
                errors[i] += r.status_code != 200

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [x for per in latencies for x in per]
    return len(flat), flat, sum(errors)


def start_server(settings: Settings) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``trends serve`` on the settings' keyspace; return the process and its URL once ready."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, **settings.to_env(), "TRENDS_SERVING__PORT": str(port), "TRENDS_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen([str(Path(sys.executable).parent / "trends"), "serve"], env=env, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise SystemExit("trends serve did not become ready")
        time.sleep(0.3)


def http_bench(settings: Settings, end: datetime, clients: int, seconds: float) -> None:
    """Run ``trends serve`` on the bench keyspace and load it with concurrent clients."""
    proc, base = start_server(settings)
    try:
        bare_n, bare_lat, _ = hammer(f"{base}/health", clients, seconds)
        print(f"http /health     {clients} clients: {bare_n / seconds:7.0f} req/s  p50 {pct(bare_lat, 0.5):6.1f} ms")
        for label in ("1h", "24h"):
            start = (end - (HOUR if label == "1h" else DAY)).strftime("%Y-%m-%dT%H:%MZ")
            url = f"{base}/api/v1/trending?start={start}&end={end:%Y-%m-%dT%H:%MZ}&baseline={label}&limit=10"
            n, lat, errors = hammer(url, clients, seconds)
            print(
                f"http trending {label:>3} {clients} clients: {n / seconds:7.0f} req/s  p50 {pct(lat, 0.5):6.1f} ms  "
                f"p99 {pct(lat, 0.99):6.1f} ms  errors {errors}  | ratio to /health {n / bare_n:4.2f}"
            )
    finally:
        proc.terminate()
        proc.wait(20)


def big_sketches(rng: random.Random, events: int, items: int) -> tuple[bytes, bytes, bytes]:
    """Return a minute's sketches as Spark writes them for a busy minute (frequent items of 1024 tracked: ~30 KB)."""
    hll = ds.hll_sketch(12, ds.tgt_hll_type.HLL_8)
    kll = ds.kll_doubles_sketch(200)
    fi = ds.frequent_strings_sketch(11)  # approx_top_k_accumulate(item, 1024) keeps a map of 2048
    for _ in range(events):
        hll.update(f"u{rng.randrange(200_000)}")
        kll.update(rng.lognormvariate(3, 1))
        fi.update(f"#item-{rng.randrange(items):06d}")
    return bytes(hll.serialize_compact()), bytes(kll.serialize()), bytes(fi.serialize())


def rss_bench(base: Settings, clients: int, rounds: int) -> None:
    """Peak RSS of ``trends serve`` under the most expensive request it allows, ``clients`` at a time."""
    import psutil

    keyspace = f"bench_rss_{uuid.uuid4().hex[:6]}"
    settings = base.model_copy(update={"cassandra": base.cassandra.model_copy(update={"keyspace": keyspace})})
    migrations.migrate(settings)
    try:
        rng = random.Random(7)
        variants = [big_sketches(rng, 3000, 5000) for _ in range(16)]
        row_bytes = statistics.mean(sum(map(len, v)) for v in variants)
        budget = settings.serving.max_read_mb * 1024 * 1024
        rows = int(budget * 0.9 / row_bytes)  # the longest window still under serving.max_read_mb
        extra = rows // 5  # minutes before it: a window over them too reads 108% of the budget
        end = floor(datetime.now(UTC), MINUTE)
        start = end - rows * MINUTE
        with session(settings) as sess:
            speed = SpeedRows(settings, sess)
            last_ms = MINUTE - timedelta(milliseconds=1)
            minutes = [(start + i * MINUTE, variants[i % len(variants)]) for i in range(-extra, rows)]
            speed_sink(settings).write_rows(
                [ViewRow("*", m, 3000, *sketches, m, m + last_ms) for m, sketches in minutes], 0
            )
            speed.write_progress(settings.speed.query_name, end - timedelta(seconds=1), None, 0, 0)
        print(
            f"rss: {rows:,} speed minutes ({rows / 1440:.1f} days) of {row_bytes / 1024:.1f} KB sketches each = "
            f"{rows * row_bytes / 2**20:.0f} MiB, under serving.max_read_mb {settings.serving.max_read_mb:g}"
        )
        proc, url = start_server(settings)
        try:
            ps = psutil.Process(proc.pid)
            fmt = "%Y-%m-%dT%H:%MZ"
            ok = httpx.get(f"{url}/api/v1/count?last=1h", timeout=30)
            assert ok.status_code == 200, ok.text
            at_rest = ps.memory_info().rss
            query = f"{url}/api/v1/summary?start={start:{fmt}}&end={end:{fmt}}"
            over = httpx.get(f"{url}/api/v1/summary?start={start - extra * MINUTE:{fmt}}&end={end:{fmt}}", timeout=600)
            peak, stop = [at_rest], threading.Event()

            def sample() -> None:
                while not stop.is_set():
                    peak[0] = max(peak[0], ps.memory_info().rss)
                    time.sleep(0.02)

            sampler = threading.Thread(target=sample)
            sampler.start()
            times: list[float] = []
            codes: list[int] = []

            def client() -> None:
                with httpx.Client(timeout=1200) as http:
                    for _ in range(rounds):
                        t0 = time.perf_counter()
                        r = http.get(query)
                        times.append(time.perf_counter() - t0)
                        codes.append(r.status_code)

            began = time.perf_counter()
            threads = [threading.Thread(target=client) for _ in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - began
            stop.set()
            sampler.join()
            mib = 2**20
            verdict = "✔" if peak[0] < 300 * mib else "✘"
            print(
                f"rss of trends serve: at rest {at_rest / mib:.0f} MiB, peak {peak[0] / mib:.0f} MiB under "
                f"{clients} x {rounds} /summary over {rows:,} speed minutes at once (goal < 300 MiB {verdict}); "
                f"statuses {sorted(set(codes))}, request p50 {statistics.median(times):.1f} s, max "
                f"{max(times):.1f} s, wall {wall:.1f} s; a window 20% longer: {over.status_code} "
                f"({over.json().get('detail', '')[:60]}...)"
            )
        finally:
            proc.terminate()
            proc.wait(20)
    finally:
        with session(base) as sess:
            sess.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--per-minute", type=int, default=100)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--http-seconds", type=float, default=20.0)
    parser.add_argument("--rss", action=argparse.BooleanOptionalAction, default=True, help="the RSS measurement")
    parser.add_argument("--rss-only", action="store_true", help="only the RSS measurement")
    parser.add_argument("--rss-rounds", type=int, default=2, help="expensive requests per client")
    args = parser.parse_args()
    base = Settings()
    if args.rss_only:
        rss_bench(base, args.clients, args.rss_rounds)
        return
    keyspace = f"bench_serving_{uuid.uuid4().hex[:6]}"
    settings = base.model_copy(update={"cassandra": base.cassandra.model_copy(update={"keyspace": keyspace})})
    migrations.migrate(settings)
    end = floor(datetime.now(UTC), MINUTE)
    try:
        t0 = time.monotonic()
        fill(settings, end, args.days, args.per_minute)
        print(f"filled 7 days in {time.monotonic() - t0:.0f} s")
        goals = {"1h": 20, "24h": 50, "7d": 100}
        for label, window in (("1h", HOUR), ("24h", DAY), ("7d", 7 * DAY)):
            times, bare, rows = bench(settings, end, window, args.runs)
            p50, p99 = statistics.median(times), pct(times, 0.99)
            b50 = statistics.median(bare)
            print(
                f"trending {label:>3}: p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  | bare reads p50 {b50:6.1f} ms  "
                f"ratio {p50 / b50:4.2f}  ({rows} rows; goal p99 <= {goals[label]} ms)"
            )
        http_bench(settings, end, args.clients, args.http_seconds)
    finally:
        with session(base) as sess:
            sess.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")
    if args.rss:
        rss_bench(base, args.clients, args.rss_rounds)


if __name__ == "__main__":
    main()
