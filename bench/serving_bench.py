"""Serving benchmark: trending answers over 1 h, 24 h and 7 d windows, in process and over HTTP, with realistic rows.

Run: ``.venv/bin/python bench/serving_bench.py`` with the stack up. It fills a throw-away keyspace with ``--days`` of
per-minute rows in both views, of the size Spark writes for a busy minute (frequent items of 1024 tracked: 30-36 KB
a row; hourly and daily rollups merged from them), the batch view up to a watermark two hours ago, the speed view
every minute (through the speed layer's sink, so its coverage is recorded). Writes run at a bounded concurrency
(``--write-concurrency``) and are retried when the node is busy: the fill goes at the rate the node takes.

Every ratio compares the same work in the same state, said in the output:

* **uncached answers** — a reader with every cache off (``serving.cache_mb`` and ``serving.answer_cache_mb`` 0), as a
  new question finds it: coverage read, plan, rows read, merge, trending (goal p99 <= 20 / 50 / 100 ms). Baseline:
  the same reads through the driver (the coverage reads and the rows of the same plan, no cache), without planning
  or merging. Both warm (``WARMUP`` runs first).
* **cached answers** — a reader whose answer cache holds the question (nothing moved): the coverage read and a
  lookup. Baseline: the coverage read alone.
* **speed moved** — before each run the speed layer's sink rewrites the newest minute of the window with one more
  event (not timed): the batch part is kept, only the changed minute is read again. Beside the uncached answer.

Then ``trends serve --workers N`` runs over the same keyspace and 8 and 64 concurrent clients (threads, one HTTP
connection each) send trending requests for ``--http-seconds``: requests/s, p50/p99 and errors (any status but
200), beside the same clients against ``/health`` of the same server and the ratio. The answers are cached (the
same few questions, as a dashboard's viewers ask them); ``serving.max_concurrent_requests`` is raised to the clients.
Each HTTP run is repeated per ``--state-max-age-ms``: 0 (the layers' state is read for every request) and 250 (the
default: the state reused for 250 ms by a process's requests, answers at most that much behind the layers).

Last, the cost of the most expensive request the API allows (``--rss``): a second keyspace holds only speed-view
minutes (the batch view lagging: the costly case) with realistic sketches, about ``serving.max_read_mb`` of them in
one window; ``trends serve`` (one worker, answer cache off, so every request does the whole work) answers
``/summary`` over that window to 8 clients at a time while its RSS is sampled. It passes only when every answer is
a 200 and the peak RSS is under 300 MiB; a window reading more than ``serving.max_read_mb`` must be refused (400).
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
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import datasketches as ds
import httpx

from batch_layer.store import BatchStore
from infra import migrations
from infra.cassandra import session
from infra.settings import Settings
from infra.settings_env import to_env
from serving import queries
from serving.merge import Merged
from serving.reader import ViewReader
from serving.window import load_many
from speed_layer.sink import SpeedViewSink
from views.buckets import DAY, HOUR, MINUTE, floor
from views.sketches import merge_all
from views.store.rows import ViewRow

WARMUP = 20
VARIANTS = 24  # distinct realistic minute sketches, cycled (building one costs ~0.1 s of Python)
BENCH_EPOCH = "bench"


def speed_sink(settings: Settings) -> SpeedViewSink:
    """Return the speed layer's sink, to plant speed rows with the coverage that lets serving answer them."""
    return SpeedViewSink(settings, settings.speed.query_name, settings.speed.view_ttl_s, epoch_id=BENCH_EPOCH)


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


def retried(what: str, write: Callable[[], Any], tries: int = 8) -> Any:
    """Run an idempotent write, waiting and retrying while the node is busy (ConnectionBusy, timeouts)."""
    for attempt in range(tries):
        try:
            return write()
        except Exception as exc:  # the driver's busy/timeout errors; the write is an upsert, so retry it whole
            if attempt == tries - 1:
                raise
            pause = 0.5 * 2**attempt
            print(f"  {what}: {type(exc).__name__} ({str(exc)[:80]}); retrying in {pause:.1f} s", file=sys.stderr)
            time.sleep(pause)
    return None


def bench_settings(base: Settings, keyspace: str, write_concurrency: int) -> Settings:
    """Return the settings of a throw-away keyspace whose bulk writes go at most ``write_concurrency`` at once."""
    cassandra = base.cassandra.model_copy(update={"keyspace": keyspace, "write_concurrency": write_concurrency})
    speed = base.speed.model_copy(update={"starting_offsets": "earliest"})
    return base.model_copy(update={"cassandra": cassandra, "speed": speed})


def fill(settings: Settings, end: datetime, days: int, events: int, items: int) -> tuple[datetime, float]:
    """Write ``days`` of realistic minute rows ending at ``end`` in both views; return the watermark and row KB."""
    rng = random.Random(5)
    variants = [big_sketches(rng, events, items) for _ in range(VARIANTS)]
    row_kb = statistics.mean(sum(map(len, v)) for v in variants) / 1024
    start = end - days * DAY
    watermark = floor(end, HOUR) - 2 * HOUR
    minutes = [(start + i * MINUTE, variants[i % VARIANTS]) for i in range(int((end - start) / MINUTE))]
    at_once = settings.cassandra.write_concurrency
    print(f"filling {len(minutes):,} minutes of {row_kb:.1f} KB rows per view (writes {at_once} at once)")
    last_ms = MINUTE - timedelta(milliseconds=1)
    sink = speed_sink(settings)
    try:
        chunk = 240
        for i in range(0, len(minutes), chunk):
            rows = [ViewRow("*", m, events, *sk, m, m + last_ms) for m, sk in minutes[i : i + chunk]]
            retried("speed rows", lambda rows=rows, i=i: sink.write_rows(rows, i // chunk))
    finally:
        sink.close()
    with session(settings) as sess:
        store = BatchStore(settings, sess)
        by_hour: dict[datetime, list[tuple[datetime, tuple[bytes, bytes, bytes]]]] = {}
        for m in minutes:
            by_hour.setdefault(floor(m[0], HOUR), []).append(m)
        for hour, ms in sorted(by_hour.items()):
            if hour >= watermark:
                continue
            run = uuid.uuid1()
            minute_rows = [ViewRow("*", m, events, *sk, m, m) for m, sk in ms]
            hour_row = ViewRow("*", hour, events * len(ms), *merge_all(sk for _m, sk in ms), hour, hour)
            versions = ({hour: run}, {hour: minute_rows}, {hour: [hour_row]})
            retried("batch rows", lambda versions=versions: store.rows.write_versions(*versions))
            retried("pointer", lambda swap=(hour, run, None): store.pointers.swap([swap]))
        for d in range(days + 1):
            retried("daily rollup", lambda d=d: store.remerge_day((start + d * DAY).date()))
        store.pointers.write_watermark(floor(start, HOUR) + HOUR, watermark)
    return watermark, row_kb


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def no_caches(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"serving": settings.serving.model_copy(update={"cache_mb": 0, "answer_cache_mb": 0})}
    )


def state_per_answer(settings: Settings) -> Settings:
    return settings.model_copy(update={"serving": settings.serving.model_copy(update={"state_max_age_ms": 0})})


def trending_once(reader: ViewReader, end: datetime, window: timedelta) -> int:
    """Answer trending over [end - window, end) against the window before it, as the API does; return rows merged."""
    windows = [(end - window, end), (end - 2 * window, end - window)]
    recent, base = load_many(reader, windows, "*", fields=queries.NEEDS["trending"], keep_rows=False)
    queries.trending(recent, base, limit=10, min_support=5)
    return recent.merged.rows + base.merged.rows


def bare_reads(reader: ViewReader, end: datetime, window: timedelta) -> None:
    """The same reads as an uncached answer (the coverage, the rows of its plan), without planning or merging."""
    cov = reader.coverage(end - 2 * window, end, "*")
    spans = [s for a, b in ((end - window, end), (end - 2 * window, end - window)) for s in cov.plan(a, b)]
    for _ in reader.stream(spans, "*", queries.NEEDS["trending"], runs=cov.runs):
        pass


def merge_alone(reader: ViewReader, end: datetime, window: timedelta) -> Callable[[], None]:
    """Return a call that merges the rows of an uncached answer already in memory, as the answer does (no reads)."""
    cov = reader.coverage(end - 2 * window, end, "*")
    windows = [(end - window, end), (end - 2 * window, end - window)]
    rows = [
        reader.read(
            cov.plan(a, b),
            "*",
            queries.NEEDS["trending"],
            runs=cov.runs,
        )
        for a, b in windows
    ]

    def merge() -> None:
        merged = [Merged(MINUTE) for _ in windows]
        for m, buckets in zip(merged, rows, strict=True):
            for b in buckets:
                m.add(b)  # SketchUnion merges as rows are added

    return merge


def timed(fn: Callable[[], Any], runs: int, before: Callable[[], Any] | None = None) -> list[float]:
    """Return the times (ms) of ``runs`` calls after ``WARMUP`` untimed ones; ``before`` runs untimed before each."""
    out = []
    for i in range(runs + WARMUP):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        if i >= WARMUP:
            out.append((time.perf_counter() - t0) * 1000)
    return out


def in_process(settings: Settings, end: datetime, window: timedelta, label: str, runs: int, goal: float) -> None:
    """Print uncached, cached and speed-moved trending answers beside their baselines (all warm)."""
    with session(settings) as sess:
        cold = ViewReader(no_caches(settings), sess)  # statements prepared once, nothing kept between answers
        assert cold.answers is None and cold.cache is None
        rows = trending_once(cold, end, window)
        subject = timed(lambda: trending_once(cold, end, window), runs)
        bare = timed(lambda: bare_reads(cold, end, window), runs)
        alone = timed(merge_alone(cold, end, window), runs)
        p50, p99, b50, b99 = (pct(subject, 0.5), pct(subject, 0.99), pct(bare, 0.5), pct(bare, 0.99))
        verdict = "✔" if p99 <= goal else "✘"
        print(
            f"trending {label:>3} uncached: p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  | same reads, no merge: p50 "
            f"{b50:6.1f} p99 {b99:6.1f} ms  ratio p50 {b50 / p50:4.2f}  ({rows} rows of both windows; goal p99 <= "
            f"{goal:.0f} ms {verdict})"
        )
        print(
            f"trending {label:>3} bound: the same rows merged alone (in memory, no reads) p50 {pct(alone, 0.5):6.1f} "
            f"p99 {pct(alone, 0.99):6.1f} ms; reads + merge alone p50 {b50 + pct(alone, 0.5):6.1f} ms"
        )
        # the state read for every answer, so that a move is seen by the very next one (the reuse is below)
        warm = ViewReader(state_per_answer(settings), sess)
        assert warm.answers is not None
        trending_once(warm, end, window)
        hits = warm.answers.hits
        cached = timed(lambda: trending_once(warm, end, window), runs)
        assert warm.answers.hits == hits + runs + WARMUP, "every cached run must be a lookup"
        state = timed(lambda: warm.coverage(end - 2 * window, end, "*"), runs)
        print(
            f"trending {label:>3} cached:   p50 {pct(cached, 0.5):6.1f} ms  p99 {pct(cached, 0.99):6.1f} ms  | "
            f"the state read alone: p50 {pct(state, 0.5):6.1f} ms  ratio p50 {pct(state, 0.5) / pct(cached, 0.5):4.2f}"
        )
        reusing = ViewReader(settings, sess)
        trending_once(reusing, end, window)
        reused = timed(lambda: trending_once(reusing, end, window), runs)
        print(
            f"trending {label:>3} cached, the state reused (serving.state_max_age_ms "
            f"{settings.serving.state_max_age_ms}): p50 {pct(reused, 0.5):6.2f} ms  p99 {pct(reused, 0.99):6.2f} ms"
        )
        sink = speed_sink(settings)
        newest = end - MINUTE
        bumped = [0]
        variant = big_sketches(random.Random(9), 3000, 5000)

        def move() -> None:  # the speed layer rewrites its newest minute with one more event
            bumped[0] += 1
            row = ViewRow("*", newest, 3000 + bumped[0], *variant, newest, newest + MINUTE - timedelta(seconds=1))
            sink.write_rows([row], 1_000_000 + bumped[0])

        try:
            partial = warm.answers.partial
            moved = timed(lambda: trending_once(warm, end, window), max(runs // 4, 10), before=move)
            assert warm.answers.partial > partial, "a speed move must keep the batch part"
        finally:
            sink.close()
        print(
            f"trending {label:>3} speed moved one minute: p50 {pct(moved, 0.5):6.1f} ms  p99 {pct(moved, 0.99):6.1f} "
            f"ms  | uncached p50 {p50:6.1f} ms  ratio {p50 / pct(moved, 0.5):4.2f}x faster"
        )


def hammer(url: str, clients: int, seconds: float) -> tuple[int, list[float], int]:
    """Send GETs of ``url`` from ``clients`` threads for ``seconds``; return requests, latencies (ms), errors."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        with httpx.Client(timeout=30) as http:
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                try:
                    ok = http.get(url).status_code == 200
                except httpx.HTTPError:
                    ok = False
                latencies[i].append((time.perf_counter() - t0) * 1000)
                errors[i] += not ok

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [x for per in latencies for x in per]
    return len(flat), flat, sum(errors)


def start_server(settings: Settings, workers: int = 1, **extra: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``trends serve`` on the settings' keyspace; return the process and its URL once ready."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, **to_env(settings), "TRENDS_SERVING__PORT": str(port), "TRENDS_LOG_LEVEL": "WARNING", **extra}
    trends = str(Path(sys.executable).parent / "trends")
    proc = subprocess.Popen([trends, "serve", "--workers", str(workers)], env=env, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
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


def http_bench(
    settings: Settings, end: datetime, clients: Sequence[int], seconds: float, workers: int, state_age_ms: int
) -> None:
    """Run ``trends serve --workers N`` on the bench keyspace and load it with concurrent clients."""
    most = max(clients)
    proc, base = start_server(
        settings,
        workers,
        TRENDS_SERVING__MAX_CONCURRENT_REQUESTS=str(most),
        TRENDS_SERVING__STATE_MAX_AGE_MS=str(state_age_ms),
    )
    print(
        f"http: trends serve --workers {workers}, serving.max_concurrent_requests {most}, answers cached, "
        f"serving.state_max_age_ms {state_age_ms} ({'state read per request' if not state_age_ms else 'state reused'})"
    )
    try:
        for n in clients:
            bare_n, bare_lat, bare_errors = hammer(f"{base}/health", n, seconds)
            print(
                f"http /health     {n:2d} clients: {bare_n / seconds:7.0f} req/s  p50 {pct(bare_lat, 0.5):6.1f} ms  "
                f"p99 {pct(bare_lat, 0.99):6.1f} ms  errors {bare_errors}"
            )
            for label in ("1h", "24h"):
                start = (end - (HOUR if label == "1h" else DAY)).strftime("%Y-%m-%dT%H:%MZ")
                url = f"{base}/api/v1/trending?start={start}&end={end:%Y-%m-%dT%H:%MZ}&baseline={label}&limit=10"
                httpx.get(url, timeout=120)  # the first asker of a question pays for it; the others read it
                count, lat, errors = hammer(url, n, seconds)
                print(
                    f"http trending {label:>3} {n:2d} clients: {count / seconds:7.0f} req/s  p50 {pct(lat, 0.5):6.1f} "
                    f"ms  p99 {pct(lat, 0.99):6.1f} ms  errors {errors}  | ratio to /health {count / bare_n:4.2f}"
                )
    finally:
        proc.terminate()
        proc.wait(30)


def rss_bench(base: Settings, clients: int, rounds: int, write_concurrency: int) -> bool:
    """Peak RSS of ``trends serve`` under the most expensive request it allows, ``clients`` at a time."""
    import psutil

    settings = bench_settings(base, f"bench_rss_{uuid.uuid4().hex[:6]}", write_concurrency)
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
        last_ms = MINUTE - timedelta(milliseconds=1)
        minutes = [(start + i * MINUTE, variants[i % len(variants)]) for i in range(-extra, rows)]
        sink = speed_sink(settings)
        began = time.perf_counter()
        try:
            chunk = 240
            for i in range(0, len(minutes), chunk):
                part = [ViewRow("*", m, 3000, *sk, m, m + last_ms) for m, sk in minutes[i : i + chunk]]
                retried("speed rows", lambda part=part, i=i: sink.write_rows(part, i // chunk))
        finally:
            sink.close()
        took = time.perf_counter() - began
        print(
            f"rss: {rows:,} speed minutes ({rows / 1440:.1f} days) of {row_bytes / 1024:.1f} KB sketches each = "
            f"{rows * row_bytes / 2**20:.0f} MiB, under serving.max_read_mb {settings.serving.max_read_mb:g}; "
            f"written in {took:.0f} s ({len(minutes) * row_bytes / 2**20 / took:.1f} MiB/s, "
            f"{write_concurrency} at once)"
        )
        proc, url = start_server(settings, 1, TRENDS_SERVING__ANSWER_CACHE_MB="0")
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
            passed = peak[0] < 300 * mib and set(codes) == {200} and over.status_code == 400
            statuses = {c: codes.count(c) for c in sorted(set(codes))}
            print(
                f"rss of trends serve (answer cache off): at rest {at_rest / mib:.0f} MiB, peak "
                f"{peak[0] / mib:.0f} MiB under {clients} x {rounds} /summary over {rows:,} speed minutes at once; "
                f"statuses {statuses}, request p50 {statistics.median(times):.1f} s, "
                f"max {max(times):.1f} s, wall {wall:.1f} s; a window 20% longer: {over.status_code} "
                f"({over.json().get('detail', '')[:60]}...) -> goal < 300 MiB with every answer 200 "
                f"{'✔' if passed else '✘'}"
            )
            return passed
        finally:
            proc.terminate()
            proc.wait(30)
    finally:
        with session(base) as sess:
            sess.execute(f"DROP KEYSPACE IF EXISTS {settings.cassandra.keyspace}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=int, default=14, help="days filled (trending over W needs 2 W)")
    parser.add_argument("--events", type=int, default=3000, help="events per minute of the sketches")
    parser.add_argument("--items", type=int, default=5000, help="distinct items the events draw from")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--workers", type=int, default=2, help="worker processes of trends serve")
    parser.add_argument("--http-seconds", type=float, default=20.0)
    parser.add_argument(
        "--state-max-age-ms", type=int, nargs="+", default=[0, 250], help="serving.state_max_age_ms of HTTP runs"
    )
    parser.add_argument("--write-concurrency", type=int, default=8, help="concurrent writes of the fill")
    parser.add_argument("--rss", action=argparse.BooleanOptionalAction, default=True, help="the RSS measurement")
    parser.add_argument("--rss-only", action="store_true", help="only the RSS measurement")
    parser.add_argument("--rss-rounds", type=int, default=2, help="expensive requests per client")
    args = parser.parse_args()
    base = Settings()
    print(f"serving bench at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {os.cpu_count()} cores")
    if args.rss_only:
        sys.exit(0 if rss_bench(base, 8, args.rss_rounds, args.write_concurrency) else 1)
    settings = bench_settings(base, f"bench_serving_{uuid.uuid4().hex[:6]}", args.write_concurrency)
    migrations.migrate(settings)
    end = floor(datetime.now(UTC), MINUTE)
    try:
        t0 = time.monotonic()
        fill(settings, end, args.days, args.events, args.items)
        print(f"filled {args.days} days in {time.monotonic() - t0:.0f} s")
        goals = {"1h": 20.0, "24h": 50.0, "7d": 100.0}
        for label, window in (("1h", HOUR), ("24h", DAY), ("7d", 7 * DAY)):
            if 2 * window > args.days * DAY:
                print(f"trending {label:>3}: skipped (needs --days >= {2 * window / DAY:g})")
                continue
            in_process(settings, end, window, label, args.runs, goals[label])
        for age in args.state_max_age_ms:
            http_bench(settings, end, args.clients, args.http_seconds, args.workers, age)
    finally:
        with session(base) as sess:
            sess.execute(f"DROP KEYSPACE IF EXISTS {settings.cassandra.keyspace}")
    if args.rss and not rss_bench(base, 8, args.rss_rounds, args.write_concurrency):
        sys.exit(1)


if __name__ == "__main__":
    main()
