"""Peers bench: the speed layer beside what a data engineer would pick instead, on the same events, checked first.

Run: ``make bench-peers`` (builds .venv-peers and the peers' jars, then runs this), or with both in place
``.venv/bin/python bench/peers/peers_bench.py [--events 1000000] [--systems speed,quix]`` with the stack up.

One topic of the speed bench's events (``bench.speed_bench.event_json``, the same seed and hour of event time), plus
1 % duplicates (a copy of a recent event, same id and time, so the dedupe has work to do). The generator's truth
per (minute, slice) is kept while producing.

Every system computes, per 1-minute event-time bucket and slice (global, origin): the exact count, distinct users,
value quantiles and top items, after an exact dedupe by event id, exactly once. A time counts only with its output
checked against the truth (:mod:`check`): every minute's count, the global total, users and quantiles within the
sketches' bounds, top items within theirs. A system that loses events is printed as not exact, with the number.

Systems: the bare read (Spark Kafka -> noop, the baseline) and the speed layer, both by ``bench.speed_bench``'s
``throughput`` in one warm SparkSession (Cassandra sink, and a null sink collecting the rows to the driver);
Flink SQL (:mod:`flink_peer`, built-ins and our sketches as UDFs); quixstreams (:mod:`quix_peer`) with one process
per core in one consumer group; each peer with a null sink (rows to the client or a file) and a Cassandra sink.

``--smoke`` (CI, the main venv: no ``.venv-peers``, Flink or quixstreams, which take their own venv, jars and half an
hour) runs the bench's own machinery on 3,000 events without warm-up: the topic with its duplicates and truth, the
bare read and the speed layer on both sinks, each output checked exact against the truth, the table with the ratios
to the bare read. It exits 1 unless every system measured is exact. Any run that measured no system exits 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT)]

import check  # noqa: E402
import freshness  # noqa: E402
import summary  # noqa: E402

from bench.speed_bench import BARE, CollectSink, bench_producer, event_json, throughput  # noqa: E402
from infra import migrations, topics  # noqa: E402
from infra.cassandra import session  # noqa: E402
from infra.settings import Settings  # noqa: E402
from views.event import format_ts  # noqa: E402

logger = logging.getLogger(__name__)

PEERS_VENV = ROOT / ".venv-peers"
PEER_VIEW_CQL = """
CREATE TABLE IF NOT EXISTS {keyspace}.peer_view (
    system text, slice text, bucket_start timestamp, events bigint,
    users_hll blob, values_kll blob, items_fi blob, exact text,
    PRIMARY KEY ((system), slice, bucket_start)
)"""
CLOSING_EVENTS = 30
CLOSING_PAST_GRACE = timedelta(minutes=2)  # closing records come this far past the grace + the window
STALL_S = 90.0
SMOKE = {"events": 3000, "systems": "speed", "freshness_seconds": 0.0}  # --smoke: no peer venv needed
FLINK_TIMEOUT_S = 900


def load() -> str:
    """Return the load average, printed beside every figure: the machine is shared."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f}"


def fill(settings: Settings, topic: str, count: int, duplicates: float) -> tuple[check.Truth, int]:
    """Produce the speed bench's events (+ duplicates, + closing events); return the truth and the records sent."""
    rng, dup_rng = random.Random(7), random.Random(11)
    items = [f"#item{i}" for i in range(2000)]
    weights = [1 / (i + 1) for i in range(len(items))]
    producer = bench_producer(settings)
    truth = check.Truth()
    recent: deque[tuple[bytes, int]] = deque(maxlen=5000)
    sent = 0

    def send(value: bytes, millis: int) -> None:
        nonlocal sent
        while True:
            try:
                producer.produce(topic, value=value, timestamp=millis)
                break
            except BufferError:
                producer.poll(0.05)
        sent += 1
        if sent % 10_000 == 0:
            producer.poll(0)

    start = datetime.now(UTC) - timedelta(hours=2)
    step = timedelta(hours=1) / count
    t0 = time.monotonic()
    for i in range(count):
        ts = start + step * i
        value, millis = event_json(rng, i, ts, items, weights), int(ts.timestamp() * 1000)
        truth.add(json.loads(value))
        send(value, millis)
        recent.append((value, millis))
        if dup_rng.random() < duplicates:
            send(*recent[dup_rng.randrange(len(recent))])
    assert producer.flush(120) == 0
    print(f"filled {topic}: {count:,} events + {sent - count:,} duplicates")
    print(f"  in {time.monotonic() - t0:.1f} s; truth: {len(truth.cells):,} (minute, slice) cells")
    return truth, sent


def speed_rows(settings: Settings) -> list[dict[str, Any]]:
    """Read the speed layer's view back and summarize every row."""
    with session(settings) as sess:
        rows = sess.execute(
            f"SELECT slice, bucket_start, events, users_hll, values_kll, items_fi "
            f"FROM {settings.cassandra.keyspace}.speed_minutes"
        )
        return [
            summary.of_blobs(
                int(r.bucket_start.replace(tzinfo=UTC).timestamp()),
                r.slice,
                r.events,
                r.users_hll,
                r.values_kll,
                r.items_fi,
            )
            for r in rows
        ]


def collected_rows(sink: CollectSink) -> list[dict[str, Any]]:
    """Summarize the rows the speed layer's null sink kept (Spark hands out local, naive timestamps)."""
    return [
        summary.of_blobs(int(r.bucket_start.timestamp()), r.slice, r.events, r.users_hll, r.values_kll, r.items_fi)
        for r in sink.rows.values()
    ]


def peer_rows(settings: Settings, system: str, *, counts_only: bool = False) -> list[dict[str, Any]]:
    """Read a peer's rows from ``peer_view``: the counts only while polling, summaries for the check."""
    table = f"{settings.cassandra.keyspace}.peer_view"
    with session(settings) as sess:
        if counts_only:
            rows = sess.execute(f"SELECT slice, bucket_start, events FROM {table} WHERE system = %s", (system,))
            return [
                {"bucket": int(r.bucket_start.replace(tzinfo=UTC).timestamp()), "slice": r.slice, "events": r.events}
                for r in rows
            ]
        rows = sess.execute(f"SELECT * FROM {table} WHERE system = %s", (system,))
        out = []
        for r in rows:
            bucket = int(r.bucket_start.replace(tzinfo=UTC).timestamp())
            if r.exact is not None:
                out.append({"bucket": bucket, "slice": r.slice, "events": r.events, **json.loads(r.exact)})
            else:
                out.append(summary.of_blobs(bucket, r.slice, r.events, r.users_hll, r.values_kll, r.items_fi))
        return out


def file_rows(paths: list[Path]) -> list[dict[str, Any]]:
    """Read the null sinks' summaries (a row may be written again after a replay: the last one wins)."""
    latest: dict[tuple[int, str], dict[str, Any]] = {}
    for path in paths:
        if path.exists():
            for line in path.read_text().splitlines():
                row = json.loads(line)
                latest[row["bucket"], row["slice"]] = row
    return list(latest.values())


def wait_for_output(
    read: Any,
    truth: check.Truth,
    procs: list[subprocess.Popen[bytes]],
    t0: float,
    closed: threading.Event | None = None,
) -> tuple[float, list[dict[str, Any]]]:
    """Poll a peer's output until the global slice holds every event, or it stalls; return (seconds, rows).

    The time is that of the last change seen (polling every 0.5 s), so a stall does not count against the peer.
    :arg closed: set once the closing records are sent: before that, a peer whose windows close only on them
        (quixstreams with a grace spanning the topic) writes nothing, and no stall is counted.
    """
    last_total, last_change = -1, time.monotonic()
    while True:
        rows = read()
        total = check.global_total(rows, truth)
        now = time.monotonic()
        if total != last_total or (closed is not None and not closed.is_set()):
            last_total, last_change = total, now
        if total >= truth.total:
            return now - t0, rows
        if now - last_change > STALL_S or any(p.poll() is not None for p in procs):
            return last_change - t0, rows
        time.sleep(0.5)


def closing_time(last_bucket: int, grace_minutes: float, k: int) -> datetime:
    """Return the event time of the ``k``-th closing record: past the last minute's end + the grace.

    The topic's events end an hour before it was filled, and Kafka refuses records over an hour ahead of its clock.
    """
    return datetime.fromtimestamp(last_bucket, UTC) + timedelta(minutes=grace_minutes + k) + CLOSING_PAST_GRACE


def close_windows(
    settings: Settings,
    topic: str,
    group: str,
    truth: check.Truth,
    deadline: float,
    grace_minutes: float,
    closed: threading.Event,
) -> bool:
    """Once the group has committed the whole topic, close quixstreams' last windows; tell whether it did.

    quixstreams has no end of input and closes a window only when a later record's time passes its end + grace.
    So closing records (ids ``flush-*``, a minute each, past the grace) go to every partition of its repartition
    topic, after all the data: the peer drops them from the rows.
    """
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**settings.kafka.client_config(), "group.id": group, "enable.auto.commit": False})
    try:
        parts = [TopicPartition(topic, p) for p in range(settings.kafka.partitions)]
        ends = [consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts]
        while time.monotonic() < deadline:
            committed = consumer.committed(parts, timeout=10)
            if all(c.offset >= e for c, e in zip(committed, ends, strict=True)):
                break
            time.sleep(0.2)
        else:
            return False
    finally:
        consumer.close()
    repartition = f"repartition__{group}--{topic}--minute"
    producer = Producer(settings.kafka.client_config())
    failed: list[str] = []  # flush() reports only what was not sent; the broker's refusals come here
    last = max(bucket for bucket, _ in truth.cells)
    for k in range(CLOSING_EVENTS):
        ts = closing_time(last, grace_minutes, k)
        value = [format_ts(ts), f"flush-{k}", "flush", 0.0, "#flush", None]
        for p in range(settings.kafka.partitions):
            producer.produce(
                repartition,
                key=json.dumps(format_ts(ts)[:16]).encode(),
                value=json.dumps(value).encode(),
                partition=p,
                timestamp=int(ts.timestamp() * 1000),
                on_delivery=lambda err, _msg: err is None or failed.append(str(err)),
            )
    assert producer.flush(30) == 0
    assert not failed, f"closing records refused: {failed[:3]}"
    closed.set()
    return True


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Stop peer processes gently (quixstreams commits on SIGTERM), then for good."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_quix(
    settings: Settings,
    topic: str,
    run: str,
    sink: str,
    truth: check.Truth,
    processes: int,
    work: Path,
    fetch_bytes: int = 0,
    grace: float | None = None,
    loglevel: str = "WARNING",
) -> tuple[float, list[dict[str, Any]]]:
    """Run quixstreams with ``processes`` processes in one consumer group; return (seconds, checked rows).

    ``grace`` (minutes) defaults to the topic's event-time span: the processes write one repartition topic each at
    its own pace, so one may run any part of the span ahead of the other, and a record later than the grace is lost
    (silently, see :func:`quix_peer.count_lost_records`). With the span, windows close only at the closing records.
    """
    system = f"quixstreams-{sink}"
    buckets = [b for b, _ in truth.cells]
    if grace is None:
        grace = (max(buckets) - min(buckets)) / 60 + 1
    if closing_time(max(buckets), grace, CLOSING_EVENTS) > datetime.now(UTC) + timedelta(hours=1):
        raise ValueError(f"a grace of {grace} minutes puts the closing records over an hour ahead: at most about 85")
    outs = [work / f"{system}-{n}.jsonl" for n in range(processes)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    procs = []
    for n in range(processes):
        cmd = [
            str(PEERS_VENV / "bin" / "python"),
            str(HERE / "quix_peer.py"),
            "--bootstrap",
            settings.kafka.bootstrap_servers,
            "--topic",
            topic,
            "--group",
            f"bench-peers-{run}-{sink}",
            "--state-dir",
            str(work / f"quix-state-{sink}-{n}"),
            "--sink",
            sink,
            "--out",
            str(outs[n]),
            "--cassandra",
            f"{settings.cassandra.contact_points[0]}:{settings.cassandra.port}",
            "--keyspace",
            settings.cassandra.keyspace,
            "--system",
            system,
            "--max-partition-fetch-bytes",
            str(fetch_bytes),
            "--grace-minutes",
            str(grace),
            "--loglevel",
            loglevel,
            "--stats",
            str(work / f"{system}-{n}.stats.json"),
        ]
        log = (work / f"{system}-{n}.log").open("wb")
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=log))
    for p in procs:  # imports and set-up are not timed: the Spark queries are timed warm too
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line.strip() == b"ready", (line, (work / f"{system}-0.log").read_text()[-2000:])
    t0 = time.monotonic()
    try:
        group = f"bench-peers-{run}-{sink}"
        closed = threading.Event()
        closing = (settings, topic, group, truth, t0 + 1800, grace, closed)
        threading.Thread(target=close_windows, args=closing, daemon=True).start()
        if sink == "null":
            seconds, rows = wait_for_output(lambda: file_rows(outs), truth, procs, t0, closed)
        else:
            read = lambda: peer_rows(settings, system, counts_only=True)  # noqa: E731
            seconds, _ = wait_for_output(read, truth, procs, t0, closed)
    finally:
        stop(procs)
    if sink == "cassandra":
        rows = peer_rows(settings, system)
    lost = lost_into_closed(work, system, processes)
    if lost:
        minutes = ", ".join(f"{format_ts(datetime.fromtimestamp(m / 1000, UTC))[11:16]} {n:,}" for m, n in lost.items())
        print(f"  quixstreams {sink}: {sum(lost.values()):,} records went into windows already closed ({minutes})")
    return seconds, rows


def lost_into_closed(work: Path, system: str, processes: int) -> dict[int, int]:
    """Sum the processes' counts of records put into already closed windows (:func:`quix_peer.count_lost_records`)."""
    lost: dict[int, int] = {}
    for n in range(processes):
        path = work / f"{system}-{n}.stats.json"
        if not path.exists():
            print(f"  (no stats from quixstreams process {n}: it crashed, or was killed after ignoring SIGTERM)")
            continue
        for minute, count in json.loads(path.read_text())["into_closed"].items():
            lost[int(minute)] = lost.get(int(minute), 0) + count
    return dict(sorted(lost.items()))


def run_flink(
    settings: Settings, topic: str, run: str, variant: str, sink: str, work: Path, parallelism: int
) -> tuple[float, list[dict[str, Any]]]:
    """Run the Flink peer (a bounded read of the topic); return (its job's seconds, checked rows)."""
    from peer_jars import flink_jars, udf_jar

    system = f"flink-{variant}-{sink}"
    out = work / f"{system}.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = [
        str(PEERS_VENV / "bin" / "python"),
        str(HERE / "flink_peer.py"),
        "--bootstrap",
        settings.kafka.bootstrap_servers,
        "--topic",
        topic,
        "--group",
        f"bench-peers-{run}-{system}",
        "--jars",
        ";".join(str(j) for j in [*flink_jars(settings), udf_jar(settings)]),
        "--variant",
        variant,
        "--sink",
        sink,
        "--out",
        str(out),
        "--cassandra",
        f"{settings.cassandra.contact_points[0]}:{settings.cassandra.port}",
        "--keyspace",
        settings.cassandra.keyspace,
        "--system",
        system,
        "--parallelism",
        str(parallelism),
        "--partitions",
        str(settings.kafka.partitions),
        "--checkpoint-dir",
        str(work / f"{system}-checkpoints"),
    ]
    with (work / f"{system}.log").open("wb") as log:
        proc = subprocess.run(
            cmd, env=env, stdout=subprocess.PIPE, stderr=log, timeout=FLINK_TIMEOUT_S, check=False, cwd=HERE
        )
    lines = proc.stdout.decode().splitlines()
    if proc.returncode != 0 or not lines or not lines[-1].startswith("{"):
        tail = (work / f"{system}.log").read_text()[-3000:]
        msg = f"{system} failed ({proc.returncode}): {tail}"
        raise RuntimeError(msg)
    seconds = float(json.loads(lines[-1])["seconds"])
    rows = peer_rows(settings, system) if sink == "cassandra" else file_rows([out])
    return seconds, rows


def fresh_counts(settings: Settings, system: str, query: str = "") -> Callable[[], dict[int, int]]:
    """Return a reader of the global slice's minute counts of one system (the speed layer's view or peer_view).

    :arg query: the speed layer's streaming query (its rows are keyed by it).
    """
    from infra.cassandra import make_cluster

    sess = make_cluster(settings).connect()
    ks = settings.cassandra.keyspace
    if system == "speed":
        stmt = sess.prepare(
            f"SELECT bucket_start, events FROM {ks}.speed_minutes WHERE query = ? AND slice = '*' AND day IN ?"
        )

        def read() -> dict[int, int]:
            today = datetime.now(UTC).date()
            days = [today - timedelta(days=1), today, today + timedelta(days=1)]
            rows = sess.execute(stmt, (query, days))
            return {int(r.bucket_start.replace(tzinfo=UTC).timestamp()): r.events for r in rows}

        return read
    stmt = sess.prepare(f"SELECT bucket_start, events FROM {ks}.peer_view WHERE system = ? AND slice = '*'")

    def read_peer() -> dict[int, int]:
        rows = sess.execute(stmt, (system,))
        return {int(r.bucket_start.replace(tzinfo=UTC).timestamp()): r.events for r in rows}

    return read_peer


def run_freshness(
    settings: Settings, run: str, work: Path, systems: list[str], rate: float, seconds: float, processes: int
) -> dict[str, tuple[str, freshness.Freshness]]:
    """Measure each system's freshness in turn on a topic of its own; return its interval and the outcome."""
    from peer_jars import flink_jars, udf_jar

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    peer_python = str(PEERS_VENV / "bin" / "python")
    cassandra = f"{settings.cassandra.contact_points[0]}:{settings.cassandra.port}"
    out: dict[str, tuple[str, freshness.Freshness]] = {}
    for system in systems:
        topic = f"bench.peers.fresh.{system}.{run}"
        topics.ensure_topics(settings.kafka, [topics.TopicSpec(topic, settings.kafka.partitions, 1, {})])
        name = f"fresh-{system}"
        common = ["--bootstrap", settings.kafka.bootstrap_servers, "--topic", topic, "--group", f"{name}-{run}"]
        cassandra_args = ["--cassandra", cassandra, "--keyspace", settings.cassandra.keyspace, "--system", name]
        if system == "speed":
            interval, query = "trigger 1 s", f"bench_fresh_{run}"
            cmds = [[str(ROOT / ".venv" / "bin" / "trends"), "speed", "run", "--trigger", "1"]]
            cmds[0] += ["--starting-offsets", "earliest"]
            speed_env = {
                **os.environ,
                "TRENDS_KAFKA__EVENTS_TOPIC": topic,
                "TRENDS_CASSANDRA__KEYSPACE": settings.cassandra.keyspace,
                "TRENDS_SPEED__QUERY_NAME": query,
                "TRENDS_METRICS__SPEED_PORT": "0",
                "TRENDS_VIEWS__SLICE_DIMS": '["origin"]',
                "TRENDS_SPARK__CHECKPOINT_ROOT": str(work / "fresh-checkpoints"),
            }
            envs = [speed_env]
            reader = fresh_counts(settings, "speed", query)
        elif system.startswith("flink"):
            variant = system.removeprefix("flink-")
            interval = "checkpoint 1 s, watermark 2 s behind"
            jar_list = ";".join(str(j) for j in [*flink_jars(settings), udf_jar(settings)])
            cmd = [peer_python, str(HERE / "flink_peer.py"), *common, "--jars", jar_list, "--variant", variant]
            cmd += ["--sink", "cassandra", "--out", str(work / f"{name}.jsonl"), *cassandra_args]
            cmd += ["--live", "--watermark-delay-s", "2", "--checkpoint-s", "1", "--parallelism", str(processes)]
            cmd += ["--partitions", str(settings.kafka.partitions)]
            cmd += ["--checkpoint-dir", str(work / f"{name}-checkpoints")]
            cmds, envs = [cmd], [env]
            reader = fresh_counts(settings, name)
        else:
            interval = "commit 1 s, grace 2 s"
            cmds, envs = [], []
            for n in range(processes):
                cmd = [peer_python, str(HERE / "quix_peer.py"), *common, "--sink", "cassandra", *cassandra_args]
                cmd += ["--state-dir", str(work / f"fresh-quix-{n}"), "--commit-interval", "1"]
                cmd += ["--grace-minutes", str(2 / 60)]
                cmds.append(cmd)
                envs.append(env)
            reader = fresh_counts(settings, name)
        procs = []
        for n, (cmd, cmd_env) in enumerate(zip(cmds, envs, strict=True)):
            log = (work / f"{name}-{n}.log").open("wb")
            procs.append(subprocess.Popen(cmd, env=cmd_env, stdout=log, stderr=subprocess.STDOUT, cwd=HERE))
        try:
            print(f"freshness of {system} ({interval}), {load()}")
            result = freshness.measure(settings, topic, rate, seconds, reader)
        except Exception as exc:  # noqa: BLE001 - one system's failure is printed, the others still run
            print(f"  {system} FAILED: {exc}")
            continue
        finally:
            stop(procs)
        print(f"  {system}: {result.line()}, {load()}")
        out[system] = (interval, result)
    return out


Results = list[tuple[str, float, check.Result]]


def run_speed(
    settings: Settings, warmup: Settings | None, records: int, truth: check.Truth, results: Results
) -> dict[str, float]:
    """Time the bare reads and the speed layer (both sinks) warm in one session; check it; return the rates."""
    collected = CollectSink()
    rates = throughput(settings, warmup, records, collected)
    for name, rate in rates.items():
        print(f"  {name:34} {rate:>10,.0f} rows/s")
    for label, rate_name, rows in (
        ("speed layer (Cassandra)", "speed layer", speed_rows(settings)),
        ("speed layer (null)", "speed layer (null)", collected_rows(collected)),
    ):
        result = check.check(rows, truth)
        results.append((label, rates[rate_name], result))
        print(f"  {label} {rates[rate_name]:,.0f} rows/s, {result.line()}, {load()}")
    return rates


def print_table(rates: dict[str, float], results: list[tuple[str, float, check.Result]]) -> None:
    """Print each system's rows/s beside the bare read's and the speed layer's with the same sink, and exactness."""
    bare = rates.get(BARE)
    if bare:
        print(f"  {BARE:34} {bare:>10,.0f} rows/s  (baseline)")
    for name, rate, result in results:
        speed = rates.get("speed layer (null)" if name.endswith("(null)") else "speed layer")  # same sink
        ratio = f"{rate / bare:.2f} of bare" if bare else ""
        vs = f"speed layer / it {speed / rate:.2f}" if speed and not name.startswith("speed") else ""
        print(f"  {name:34} {rate:>10,.0f} rows/s  {ratio:12} {vs:24} {result.line()}")
        for note in result.notes[:5]:
            print(f"      {note}")


def parse_args() -> argparse.Namespace:
    """Return the options (``--smoke`` sets its sizes)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--duplicates", type=float, default=0.01, help="fraction of events sent twice")
    parser.add_argument(
        "--systems",
        default="speed,flink-sql,flink-sketch,quix",
        help="comma-separated: speed, flink-sql, flink-sketch, quix",
    )
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 2, help="quixstreams processes")
    parser.add_argument("--quix-fetch-bytes", type=int, default=0, help="max.partition.fetch.bytes (0: default)")
    parser.add_argument(
        "--quix-grace-minutes", type=float, default=None, help="default: the topic's event-time span (exact)"
    )
    parser.add_argument("--quix-loglevel", default="WARNING", help="DEBUG logs each process' rebalances")
    parser.add_argument("--quix-sinks", default="null,cassandra")
    parser.add_argument("--flink-sinks", default="null,cassandra")
    parser.add_argument("--freshness-seconds", type=float, default=60, help="sampled span per system (0: skip)")
    parser.add_argument(
        "--freshness-systems", default="speed,flink-sketch,flink-sql,quix", help="comma-separated, as --systems"
    )
    parser.add_argument("--freshness-rate", type=float, default=0, help="events/s (0: half the slowest's rows/s)")
    parser.add_argument("--keep", action="store_true", help="keep the topics and keyspaces")
    parser.add_argument("--smoke", action="store_true", help=f"tiny sizes, the speed layer only (CI): {SMOKE}")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
        print("smoke: 3,000 events, the speed layer only (no .venv-peers), no warm-up, figures not comparable")
    return args


def main() -> None:
    args = parse_args()
    systems = set(args.systems.split(","))
    logging.basicConfig(level=logging.WARNING)

    base = Settings()
    run = uuid.uuid4().hex[:6]
    topic, keyspace = f"bench.peers.{run}", f"bench_peers_{run}"
    work = base.data_dir / "bench-peers" / run
    work.mkdir(parents=True, exist_ok=True)
    settings = base.model_copy(
        update={
            "kafka": base.kafka.model_copy(update={"events_topic": topic}),
            "cassandra": base.cassandra.model_copy(update={"keyspace": keyspace}),
            "speed": base.speed.model_copy(update={"query_name": f"bench_peers_{run}"}),
            "metrics": base.metrics.model_copy(update={"speed_port": 0}),
            "views": base.views.model_copy(update={"slice_dims": ["origin"]}),
            "spark": base.spark.model_copy(update={"checkpoint_root": str(work / "checkpoints")}),
        }
    )
    warm_topic = f"bench.peers.warm.{run}"
    warmup = settings.model_copy(
        update={
            "kafka": settings.kafka.model_copy(update={"events_topic": warm_topic}),
            "cassandra": settings.cassandra.model_copy(update={"keyspace": f"{keyspace}_warm"}),
        }
    )
    parts = base.kafka.partitions
    topics.ensure_topics(settings.kafka, [topics.TopicSpec(topic, parts, 1, {"retention.ms": "-1"})])
    topics.ensure_topics(settings.kafka, [topics.TopicSpec(warm_topic, parts, 1, {"retention.ms": "-1"})])
    migrations.migrate(settings)
    if not args.smoke:
        migrations.migrate(warmup)
    with session(settings) as sess:
        sess.execute(PEER_VIEW_CQL.format(keyspace=keyspace))
    results: list[tuple[str, float, check.Result]] = []
    rates: dict[str, float] = {}
    try:
        print(f"before filling: {load()}")
        truth, records = fill(settings, topic, args.events, args.duplicates)
        if "speed" in systems:
            warm = None if args.smoke else filled(warmup, warm_topic, 50_000, args.duplicates)
            print(f"spark (bare read, speed layer), {load()}")
            rates = run_speed(settings, warm, records, truth, results)
        for variant in ("sql", "sketch"):
            if f"flink-{variant}" not in systems:
                continue
            for sink in args.flink_sinks.split(","):
                print(f"flink {variant} ({sink}), {load()}")
                try:
                    seconds, rows = run_flink(settings, topic, run, variant, sink, work, args.processes)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    print(f"  flink {variant} {sink} FAILED: {str(exc)[-500:]}")
                    continue
                result = check.check(rows, truth)
                label = "built-ins" if variant == "sql" else "sketch UDFs"
                results.append((f"Flink SQL {label} p{args.processes} ({sink})", records / seconds, result))
                print(f"  flink {variant} {sink}: {seconds:.1f} s, {records / seconds:,.0f} rows/s, {result.line()}")
        if "quix" in systems:
            for sink in args.quix_sinks.split(","):
                seconds, rows = run_quix(
                    settings, topic, run, sink, truth, args.processes, work, args.quix_fetch_bytes,
                    args.quix_grace_minutes, args.quix_loglevel,
                )  # fmt: skip
                result = check.check(rows, truth)
                results.append((f"quixstreams x{args.processes} ({sink})", records / seconds, result))
                print(
                    f"  quixstreams {sink}: {seconds:.1f} s, {records / seconds:,.0f} rows/s, {result.line()}, {load()}"
                )
        print(f"\npeers over {records:,} records ({args.events:,} events), {load()}:")
        print_table(rates, results)
        if args.freshness_seconds > 0:
            slowest = min((rate for _, rate, _ in results), default=0.0)
            fresh_rate = args.freshness_rate or slowest / 2
            print(f"\nfreshness at {fresh_rate:,.0f} events/s (half the slowest's {slowest:,.0f} rows/s), {load()}")
            fresh = run_freshness(
                settings,
                run,
                work,
                args.freshness_systems.split(","),
                fresh_rate,
                args.freshness_seconds,
                args.processes,
            )
            for system, (interval, outcome) in fresh.items():
                print(f"  {system:14} {interval:40} {outcome.line()}")
    finally:
        if not args.keep:
            # nothing of a smoke is worth keeping: its work folder (checkpoints) would pile up in CI's data dir
            cleanup(settings, run, [keyspace, f"{keyspace}_warm"], work if args.smoke else None)
    verdict(results, args.smoke)


def filled(settings: Settings, topic: str, count: int, duplicates: float) -> Settings:
    """Fill the warm-up topic (:func:`fill`); return its settings."""
    fill(settings, topic, count, duplicates)
    return settings


def verdict(results: Results, smoke: bool) -> None:
    """Exit 1 when no system was measured, or (``smoke``) when one of them is not exact."""
    if not results:
        raise SystemExit("peers bench: no system was measured")
    if smoke and not all(result.exact for _, _, result in results):
        raise SystemExit("peers bench (smoke): a system's output is not exact (see the table)")


def cleanup(settings: Settings, run: str, keyspaces: list[str], work: Path | None = None) -> None:
    """Delete the run's topics (the bench's and the peers' internal ones), keyspaces and (given) work folder."""
    if work is not None:
        shutil.rmtree(work, ignore_errors=True)
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(settings.kafka.client_config())
    names = [t for t in admin.list_topics(timeout=10).topics if run in t]
    if names:
        for name, fut in admin.delete_topics(names).items():
            try:
                fut.result()
            except Exception as exc:  # noqa: BLE001 - clean-up goes on
                print(f"(topic {name} not deleted: {exc})")
    with session(settings) as sess:
        for ks in keyspaces:
            sess.execute(f"DROP KEYSPACE IF EXISTS {ks}")


if __name__ == "__main__":
    main()
