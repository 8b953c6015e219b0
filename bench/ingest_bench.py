"""Ingestion throughput against Kafka's own ProducerPerformance on the same broker, in the same run.

Run with the stack up: ``.venv/bin/python bench/ingest_bench.py [--records N]``. It measures

The subject's payloads are the lines of a generated N-line JSONL file (``trends ingest generate -o``); both
baselines send exactly those bytes, so every ratio compares the same payloads:

1. ``org.apache.kafka.tools.ProducerPerformance`` (kafka-tools jars of the stack) with ``--payload-file`` (the
   file's lines as payloads), acks=all, lz4, linger.ms=5, batch.size=131072. It cannot send keys: unkeyed.
2. A bare confluent-kafka producer (idempotent, the same settings) sending the same lines **keyed by their item**
   with their event time as record timestamp: what ``trends ingest`` sends, with no parsing or validation. This is
   the baseline of the ratios below.
3. ``trends ingest generate --fast -n N`` (the same generator, events built in memory) into another topic, with
   its users pseudonymised (``privacy.pseudonymise``, the default) on a cold subject store (every user new: created
   a bucket at a time), again on the warm store (users known, the new process's cache empty: one read each), on the
   warm store for 4x the records in one process (a long-running producer, whose users are cached after the first
   pass), and with pseudonymisation off;
4. ``trends ingest file`` of the file (read, parse, validate, serialize every line; ``--workers`` as given),
   pseudonymised (warm store) and not.
5. ``trends collect``, the HTTP collector, in its own process: ``--clients`` threads post the file's lines as JSON
   lines, ``--batch`` per request (1000 by default), each request answered once Kafka acknowledged all of them;
   beside it the same requests to a bare HTTP forwarder (``bench/http_forward.py``: the same server and producer,
   the lines produced as they are and answered after their acks, nothing validated), its baseline.
6. The Kafka bridge (``trends ingest kafka``'s :class:`ingestion.bridge.Bridge`, in this process) reading the same
   events from a source topic -- as JSON lines, and as Confluent-framed Avro with the schema in the registry
   (``--bridge-formats``; Avro needs the registry: ``trends stack up registry``) -- beside a bare consume-produce
   loop of the same records (read_committed consumer, idempotent producer, the values forwarded as they are, no
   decoding, no validation, no transactions). Both are timed from their first record to their last acknowledgement.

Prints the rates and the ratios of (3), (4) and (5) to (2) and to (1), pseudonymised to not, of (5) to its bare
forwarder and of (6) to its bare loop (goal >= 0.5). The subject store runs on a keyspace and a subject key of the
bench's own (dropped afterwards), and its costs are measured alone too: creating pseudonyms, reading them, the
cache, and writing subject hours. Timing is not asserted (it is not a test), but every measurement must have sent
every record: a run that sent fewer (or none) exits 1. ``--smoke`` runs every step on a few thousand records (CI: a
bench that measures nothing fails). All topics are created for the run and deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from infra import jars, migrations, topics
from infra.cassandra import session
from infra.settings import Settings
from stack.services.base import find_java

ROOT = Path(__file__).resolve().parent.parent
TRENDS = ROOT / ".venv" / "bin" / "trends"
PRODUCER_PROPS = {"acks": "all", "compression.type": "lz4", "linger.ms": "5", "batch.size": "131072"}
SMOKE = 3000  # --smoke: records per measurement
LONG_RUN = 4  # the long-running producer's lane generates this many times the records, in one process
PROGRESS_RE = re.compile(r"([\d,]+) records\s+([\d,]+)/s")  # a progress line: events handed out, their mean rate
SUMMARY_RE = re.compile(r"sent\s+([\d,]+) events in ([\d.]+) s \(([\d,]+) events/s\)")
PERF_RE = re.compile(r"(\d+) records sent, ([\d.]+) records/sec")


def producer_performance(settings: Settings, topic: str, records: int, payload_file: Path) -> float:
    """Run Kafka's ProducerPerformance with the file's lines as payloads (unkeyed); return its records/s."""
    java = find_java(settings)
    classpath = str(jars.bundle_dir(settings, jars.KAFKA) / "*")
    props = [f"bootstrap.servers={settings.kafka.bootstrap_servers}", *(f"{k}={v}" for k, v in PRODUCER_PROPS.items())]
    cmd = [
        java,
        "-Xmx512m",
        "-cp",
        classpath,
        "org.apache.kafka.tools.ProducerPerformance",
        "--topic",
        topic,
        "--num-records",
        str(records),
        "--payload-file",
        str(payload_file),
        "--throughput",
        "-1",
        "--producer-props",
        *props,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=True)
    matches = PERF_RE.findall(proc.stdout)
    if not matches:
        sys.exit(f"could not read ProducerPerformance's result:\n{proc.stdout}\n{proc.stderr}")
    sent, rate = matches[-1]
    if int(sent) != records:
        sys.exit(f"ProducerPerformance sent {sent} records, not {records}")
    print(f"ProducerPerformance (the file's lines as payloads, unkeyed): {int(sent):,} records -> {float(rate):,.0f}/s")
    return float(rate)


def bare_keyed(settings: Settings, topic: str, path: Path) -> float:
    """Send the file's lines keyed by item, with their event time, from a bare producer; return records/s."""
    from confluent_kafka import Producer

    from views.event import Event

    lines = [line for line in path.read_bytes().splitlines() if line]
    keyed = []
    for line in lines:  # prepared before the clock starts: the baseline parses nothing
        event = Event.model_validate(json.loads(line))
        keyed.append((line, event.key("item"), event.ts_ms))
    producer = Producer(
        {
            **settings.kafka.client_config(),
            "enable.idempotence": True,
            **PRODUCER_PROPS,
            "queue.buffering.max.messages": settings.ingest.queue_max_messages,
            "queue.buffering.max.kbytes": settings.ingest.queue_max_kbytes,
        }
    )
    produce = producer.produce
    t0 = time.monotonic()
    for i, (value, key, ts_ms) in enumerate(keyed):
        while True:
            try:
                produce(topic, value, key, timestamp=ts_ms)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    left = producer.flush(300)
    seconds = time.monotonic() - t0
    if left:
        sys.exit(f"bare producer: {left} records not delivered")
    if not keyed:
        sys.exit(f"bare producer: {path} holds no lines")
    mean = sum(len(v) for v, _k, _t in keyed) / len(keyed)
    rate = len(keyed) / seconds
    print(
        f"bare keyed producer (the same lines, keyed by item, event-time timestamps): {len(keyed):,} records "
        f"of ~{mean:.0f} B in {seconds:.1f} s -> {rate:,.0f}/s"
    )
    return rate


def trends(args: list[str], env: dict[str, str]) -> tuple[str, float]:
    """Run a ``trends`` command; return its output and wall-clock seconds."""
    t0 = time.monotonic()
    proc = subprocess.run([str(TRENDS), *args], capture_output=True, text=True, timeout=1800, check=False, env=env)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"trends {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout + proc.stderr, wall


def summary_rate(output: str, expected: int) -> tuple[int, float, float]:
    """Return (events, seconds, events/s) of a ``trends ingest`` summary; exit unless it sent ``expected`` events."""
    match = SUMMARY_RE.search(output)
    if not match:
        sys.exit(f"no summary in:\n{output}")
    sent = int(match[1].replace(",", ""))
    if sent != expected:
        sys.exit(f"trends ingest sent {sent:,} events, not {expected:,}:\n{output[-2000:]}")
    return sent, float(match[2]), float(match[3].replace(",", ""))


def steady_rate(output: str, after: int) -> float | None:
    """Return the events/s between the first progress line past ``after`` events and the last (None: too few).

    A producer that keeps running has read its users once: this is its rate from then on, without the start.
    """
    points = [
        (events, events / mean)
        for events, mean in ((int(r.replace(",", "")), int(m.replace(",", ""))) for r, m in PROGRESS_RE.findall(output))
        if mean > 0
    ]
    past = [p for p in points if p[0] >= after]
    if len(past) < 2 or past[-1][1] <= past[0][1]:
        return None
    (first, t_first), (last, t_last) = past[0], past[-1]
    return (last - first) / (t_last - t_first)


def validate_alone(path: Path) -> float:
    """Return records/s of the replay's own work without Kafka, in this one process: read every line and parse,
    validate and encode it with the code the replay's workers run (``ingestion.files``) -- its CPU bound per core."""
    from datetime import timedelta

    from ingestion import files
    from ingestion.validate import Context

    ctx = Context(source=str(path), max_future_skew=timedelta(minutes=5))
    records = 0
    t0 = time.perf_counter()
    with path.open("rb") as stream:
        for batch in files._batches(files.read_lines(stream), None):
            records += len(files._validate_batch(*files._columns(batch), None, ctx, "item"))
    return records / (time.perf_counter() - t0)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def collector(
    path: Path, env: dict[str, str], topic: str, dlq: str, clients: int, batch: int
) -> tuple[int, list[float]]:
    """Post the file's lines twice to ``trends collect`` from ``clients`` threads, ``batch`` lines per request.

    Returns (events per pass, seconds of each pass): the second pass is a long-running collector's, whose users
    the subject store's cache holds.
    """
    port = free_port()
    run_env = {
        **env,
        "TRENDS_KAFKA__EVENTS_TOPIC": topic,
        "TRENDS_KAFKA__DLQ_TOPIC": dlq,
        "TRENDS_COLLECTOR__PORT": str(port),
        "TRENDS_COLLECTOR__MAX_RECORDS": str(max(batch, 10_000)),
        "TRENDS_COLLECTOR__DELIVERY_TIMEOUT_S": "120",
    }
    return post_lines([str(TRENDS), "collect"], port, run_env, path, clients, batch, passes=2)


def post_pass(url: str, bodies: list[bytes], clients: int, name: str) -> float:
    """Post every body once from ``clients`` threads; return the seconds from the first request to the last answer.

    Exits unless every request got a 200 accepting all its lines.
    """
    import httpx

    todo = list(reversed(bodies))
    lock = threading.Lock()
    accepted = [0]
    problems: list[str] = []

    def client() -> None:
        with httpx.Client(timeout=180, headers={"Content-Type": "application/x-ndjson"}) as http:
            while True:
                with lock:
                    if not todo or problems:
                        return
                    body = todo.pop()
                r = http.post(f"{url}/api/v1/events", content=body)
                with lock:
                    if r.status_code != 200 or r.json()["rejected"]:
                        problems.append(f"{r.status_code} {r.text[:300]}")
                    else:
                        accepted[0] += r.json()["accepted"]

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - t0
    if problems:
        sys.exit(f"{name} refused requests: {problems[:3]}")
    expected = sum(body.count(b"\n") + 1 for body in bodies)
    if accepted[0] != expected:
        sys.exit(f"{name} accepted {accepted[0]:,} events, not {expected:,}")
    return seconds


def http_forward(path: Path, env: dict[str, str], topic: str, clients: int, batch: int) -> tuple[int, list[float]]:
    """Post the same requests twice to the bare HTTP forwarder (``bench/http_forward.py``): the collector's baseline.

    Its first pass is beside a new collector's, its second beside a long-running collector's.
    """
    port = free_port()
    command = [sys.executable, str(ROOT / "bench" / "http_forward.py"), str(port), topic]
    return post_lines(command, port, env, path, clients, batch, passes=2)


def post_lines(
    command: list[str], port: int, run_env: dict[str, str], path: Path, clients: int, batch: int, passes: int = 1
) -> tuple[int, list[float]]:
    """Start an HTTP ingest process, post it the file's lines ``passes`` times from ``clients`` threads.

    Returns (events per pass, seconds of each pass).
    """
    import httpx

    lines = [line for line in path.read_bytes().splitlines() if line]
    bodies = [b"\n".join(lines[i : i + batch]) for i in range(0, len(lines), batch)]
    url = f"http://127.0.0.1:{port}"
    log = path.with_name(f"{Path(command[-1]).stem}.log")
    name = " ".join(Path(c).name for c in command[-2:])
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=run_env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                sys.exit(f"{name} ended ({proc.returncode}):\n{log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                sys.exit(f"{name} did not answer within 60 s")
            time.sleep(0.2)
        times = [post_pass(url, bodies, clients, name) for _ in range(passes)]
        return len(lines), times
    finally:
        proc.terminate()
        proc.wait(60)


AVRO_EVENT = {
    "type": "record",
    "name": "Event",
    "namespace": "bench",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "item", "type": "string"},
        {"name": "user", "type": ["null", "string"], "default": None},
        {"name": "value", "type": ["null", "double"], "default": None},
        {"name": "dims", "type": {"type": "map", "values": "string"}, "default": {}},
    ],
}


def fill_source(settings: Settings, topic: str, path: Path, fmt: str, passes: int = 1) -> int:
    """Write the file's events ``passes`` times into a source topic as JSON lines or framed Avro (untimed).

    Returns the records written.
    """
    from confluent_kafka import Producer

    from views.event import Event

    values: list[tuple[bytes, bytes | None, int]] = []
    lines = [line for line in path.read_bytes().splitlines() if line]
    if fmt == "json":
        for line in lines:
            event = Event.model_validate(json.loads(line))
            values.append((line, event.key("item"), event.ts_ms))
    else:
        from infra.registry import registry_client
        from ingestion.wire import AvroEncoder

        encode = AvroEncoder(registry_client(settings.registry), topic, AVRO_EVENT)
        for line in lines:
            event = Event.model_validate(json.loads(line))
            record = {"id": event.id, "ts": event.ts_ms, "item": event.item, "user": event.user, "value": event.value}
            values.append((encode({**record, "dims": dict(event.dims)}), event.key("item"), event.ts_ms))
    values *= passes
    producer = Producer({**settings.kafka.client_config(), "enable.idempotence": True, **PRODUCER_PROPS})
    for i, (value, key, ts) in enumerate(values):
        while True:
            try:
                producer.produce(topic, value, key, timestamp=ts)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    if producer.flush(300):
        sys.exit(f"could not fill {topic}")
    return len(values)


def bare_forward(settings: Settings, source: str, target: str, records: int) -> float:
    """Forward a topic's records as they are, consumer to producer; return records/s from the first record on."""
    from confluent_kafka import Consumer, Producer

    consumer = Consumer(
        {
            **settings.kafka.client_config(),
            "group.id": f"bench-bare-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    producer = Producer({**settings.kafka.client_config(), "enable.idempotence": True, **PRODUCER_PROPS})
    consumer.subscribe([source])
    seen = 0
    t0 = None
    deadline = time.monotonic() + 600
    try:
        while seen < records and time.monotonic() < deadline:
            batch = consumer.consume(5000, 0.25)
            for m in batch:
                if m.error() is not None:
                    continue
                if t0 is None:
                    t0 = time.monotonic()
                while True:
                    try:
                        producer.produce(target, m.value(), m.key(), timestamp=m.timestamp()[1])
                        break
                    except BufferError:
                        producer.poll(0.01)
                seen += 1
            producer.poll(0)
        if producer.flush(300) or seen != records or t0 is None:
            sys.exit(f"bare consume-produce loop: forwarded {seen:,} of {records:,} records")
        return records / (time.monotonic() - t0)
    finally:
        consumer.close()


def bridge_rate(settings: Settings, source: str, fmt: str, records: int, first: int) -> tuple[float, float, int]:
    """Run the bridge over a source topic until it committed every record.

    Returns (records/s over the whole run, records/s after its first ``first`` records, events sent): the second
    rate is a long-running bridge's, whose users the subject store's cache holds after the first pass.
    """
    from ingestion.bridge import Bridge, BridgeStats

    bridge = Bridge(settings, [source], fmt)  # type: ignore[arg-type]
    started = time.monotonic()
    commits: list[tuple[float, int]] = []  # (when, records committed) after each transaction

    def committed(stats: BridgeStats) -> None:
        commits.append((time.monotonic(), stats.records))

    try:
        stats = bridge.run(
            lambda: bridge.stats.records >= records or time.monotonic() - started > 900, on_batch=committed
        )
    finally:
        bridge.close()
    ended = time.monotonic()
    if stats.records != records or stats.summary.sent != records or stats.first_record_at is None:
        sys.exit(
            f"the bridge ({fmt}) committed {stats.records:,} records and {stats.summary.sent:,} events of {records:,}"
        )
    at, done = next((t, n) for t, n in commits if n >= first)
    last_at, last = commits[-1]
    steady = (last - done) / (last_at - at) if last > done else float("nan")
    return records / (ended - stats.first_record_at), steady, stats.summary.sent


def bridge_lanes(settings: Settings, path: Path, formats: list[str], run: str, names: dict[str, str]) -> None:
    """Measure the bridge beside a bare consume-produce loop of the same records, per source format.

    The source holds the file twice: the bridge runs over both passes in one process, and its rate after the first
    pass is a long-running bridge's (its users cached), as the long-running generator's above.
    """
    for fmt in formats:
        source, target, bare_target = f"bench.src-{fmt}.{run}", f"bench.bridge-{fmt}.{run}", f"bench.fwd-{fmt}.{run}"
        names.update({f"src-{fmt}": source, f"bridge-{fmt}": target, f"fwd-{fmt}": bare_target})
        events_spec, _ = topics.topic_specs(settings.kafka)
        parts, rf = settings.kafka.partitions, settings.kafka.replication_factor
        topics.ensure_topics(
            settings.kafka, [topics.TopicSpec(t, parts, rf, events_spec.config) for t in (source, target, bare_target)]
        )
        records = fill_source(settings, source, path, fmt, passes=2)
        bare = bare_forward(settings, source, bare_target, records)
        scoped = settings.model_copy(
            update={
                "kafka": settings.kafka.model_copy(update={"events_topic": target, "dlq_topic": names["dlq"]}),
                "bridge": settings.bridge.model_copy(update={"group_id": f"bench-bridge-{fmt}-{run}"}),
            }
        )
        rate, steady, sent = bridge_rate(scoped, source, fmt, records, records // 2)
        print(f"bare consume-produce loop ({fmt} records forwarded as they are): {records:,} records -> {bare:,.0f}/s")
        print(
            f"trends ingest kafka --format {fmt} (one process, pseudonymised, warm store, the file twice): {sent:,} "
            f"events -> {rate:,.0f} events/s (decode, validate, transactions)"
        )
        print(f"  ratio to the bare consume-produce loop {rate / bare:.2f} (goal >= 0.5)")
        print(
            f"  the long-running bridge after its first {records // 2:,} records (its users read): {steady:,.0f} "
            f"events/s = {steady / bare:.2f} of the bare consume-produce loop (goal >= 0.5)"
        )


def generate(
    label: str, n: int, names: dict[str, str], env: dict[str, str], bare: float, perf: float
) -> tuple[float, str]:
    """Run ``trends ingest generate --fast -n N`` into the bench's topic; print its events/s; return it, the output."""
    out, wall = trends(
        ["ingest", "generate", "--fast", "-n", str(n), "--topic", names["gen"], "--dlq-topic", names["dlq"]], env
    )
    sent, seconds, rate = summary_rate(out, n)
    print(
        f"trends ingest generate{label}: {sent:,} events -> {rate:,.0f} events/s "
        f"(producer {seconds:.1f} s; {sent / wall:,.0f}/s over the whole command, {wall:.1f} s with start-up)"
    )
    counts = re.search(r"pseudonyms .*", out)
    if counts:
        print(f"  {counts[0]}")
    print(
        f"  ratio to the bare keyed producer {rate / bare:.2f} (goal >= 0.5); to ProducerPerformance {rate / perf:.2f}"
    )
    return rate, out


def store_costs(settings: Settings, n: int) -> None:
    """Measure the subject store alone: create n pseudonyms (LWTs), read them, hit the cache, write subject hours."""
    import secrets
    from datetime import UTC, datetime, timedelta

    from infra.privacy.subjects import SubjectStore

    key = secrets.token_bytes(32)
    users = [f"bench-user-{i}" for i in range(n)]

    def timed(what: Callable[[], object]) -> float:
        t0 = time.perf_counter()
        what()
        return n / (time.perf_counter() - t0)

    with SubjectStore(settings, key=key) as cold:
        created = timed(lambda: cold.pseudonyms(users))
        cached = timed(lambda: cold.pseudonyms(users))
        hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        pairs = [(u, hour - timedelta(hours=i % 3)) for i, u in enumerate(users)]
        written = timed(lambda: cold.note_hours(pairs))
        deduped = timed(lambda: cold.note_hours(pairs))
    with SubjectStore(settings, key=key) as warm:
        read = timed(lambda: warm.pseudonyms(users))
    concurrency = settings.privacy.lookup_concurrency
    print(
        f"subject store alone ({n:,} users, {concurrency} requests in flight): create (LWT) {created:,.0f}/s, "
        f"read {read:,.0f}/s, cached {cached:,.0f}/s; subject hours: written {written:,.0f}/s, "
        f"already written by this process {deduped:,.0f}/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records per measurement")
    parser.add_argument("--workers", type=int, default=0, help="trends ingest file --workers (0: one per CPU)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent HTTP clients of the collector")
    parser.add_argument("--batch", type=int, default=1000, help="events per collector request")
    parser.add_argument("--smoke", action="store_true", help=f"tiny sizes, every check kept (CI): --records {SMOKE}")
    parser.add_argument(
        "--bridge-formats",
        help="source formats of the bridge lane, comma-separated: json, avro (needs `trends stack up registry`), "
        "none. Default: json,avro; with --smoke json (make test runs no registry)",
    )
    args = parser.parse_args()
    chosen = args.bridge_formats or ("json" if args.smoke else "json,avro")
    bridge_formats = [f for f in chosen.split(",") if f and f != "none"]
    if set(bridge_formats) - {"json", "avro"}:
        sys.exit(f"--bridge-formats {chosen}: json, avro or none")
    n = SMOKE if args.smoke else args.records
    settings = Settings()
    run = uuid.uuid4().hex[:8]
    events_spec, dlq_spec = topics.topic_specs(settings.kafka)
    parts, rf = settings.kafka.partitions, settings.kafka.replication_factor
    names = {
        "perf": f"bench.perf.{run}",
        "bare": f"bench.bare.{run}",
        "gen": f"bench.gen.{run}",
        "file": f"bench.file.{run}",
        "dlq": f"bench.dlq.{run}",
        "coll": f"bench.coll.{run}",
        "fwd-http": f"bench.fwd-http.{run}",
    }
    specs = [
        topics.TopicSpec(names["perf"], parts, rf, {}),
        topics.TopicSpec(names["bare"], parts, rf, events_spec.config),
        topics.TopicSpec(names["gen"], parts, rf, events_spec.config),
        topics.TopicSpec(names["file"], parts, rf, events_spec.config),
        topics.TopicSpec(names["coll"], parts, rf, events_spec.config),
        topics.TopicSpec(names["fwd-http"], parts, rf, events_spec.config),
        topics.TopicSpec(names["dlq"], parts, rf, dlq_spec.config),
    ]
    topics.ensure_topics(settings.kafka, specs)
    # the subject store on a keyspace and key of the run's own: the first pseudonymised run meets only new users
    keyspace = f"bench_ingest_{run}"
    private = settings.model_copy(update={"cassandra": settings.cassandra.model_copy(update={"keyspace": keyspace})})
    migrations.migrate(private)
    env = {
        **os.environ,
        "TRENDS_INGEST__COMPRESSION_TYPE": PRODUCER_PROPS["compression.type"],
        "TRENDS_INGEST__LINGER_MS": PRODUCER_PROPS["linger.ms"],
        "TRENDS_INGEST__BATCH_SIZE": PRODUCER_PROPS["batch.size"],
        "TRENDS_LOG_LEVEL": "WARNING",
        "TRENDS_CASSANDRA__KEYSPACE": keyspace,
    }
    off_env = {**env, "TRENDS_PRIVACY__PSEUDONYMISE": "false"}
    print(
        f"broker {settings.kafka.bootstrap_servers}, {parts} partitions, {n:,} records, acks=all, lz4, linger 5 ms"
        f"{' (smoke: tiny sizes, figures not comparable)' * args.smoke}"
    )
    try:
        with tempfile.TemporaryDirectory(prefix="ingest-bench-") as tmp:
            key_file = Path(tmp) / "subject.key"
            key_file.write_text(os.urandom(32).hex())
            env["TRENDS_PRIVACY__SUBJECT_KEY_FILE"] = str(key_file)
            path = Path(tmp) / "events.jsonl"
            _, gen_wall = trends(["ingest", "generate", "--fast", "-n", str(n), "-o", str(path)], env)
            size_mb = path.stat().st_size / 1e6
            print(f"generated {path.name}: {n:,} lines, {size_mb:.0f} MB in {gen_wall:.1f} s")
            perf = producer_performance(settings, names["perf"], n, path)
            bare = bare_keyed(settings, names["bare"], path)

            cold, _ = generate(", pseudonymised, cold store (every user new)", n, names, env, bare, perf)
            warm, _ = generate(", pseudonymised, warm store (users known)", n, names, env, bare, perf)
            long, long_out = generate(
                f", pseudonymised, warm store, {LONG_RUN}x the records (a long-running producer: its users cached)",
                LONG_RUN * n, names, {**env, "TRENDS_INGEST__PROGRESS_INTERVAL_S": "0.5"}, bare, perf,
            )  # fmt: skip
            off, _ = generate(", not pseudonymised", n, names, off_env, bare, perf)
            print(
                f"  pseudonymised / not: cold store {cold / off:.2f}, warm store {warm / off:.2f}, "
                f"long-running {long / off:.2f}"
            )
            steady = steady_rate(long_out, n)
            if steady is None:
                print("  the long-running producer printed too little progress for its rate after the start")
            else:
                print(
                    f"  the long-running producer after its first {n:,} events (its users read): {steady:,.0f} "
                    f"events/s = {steady / bare:.2f} of the bare keyed producer (goal >= 0.5), "
                    f"{steady / off:.2f} of not pseudonymised"
                )

            file_rates = {}
            for label, file_env in ((", pseudonymised", env), (", not pseudonymised", off_env)):
                out, wall = trends(
                    [
                        "ingest",
                        "file",
                        str(path),
                        "--no-progress",
                        "--workers",
                        str(args.workers),
                        "--topic",
                        names["file"],
                        "--dlq-topic",
                        names["dlq"],
                    ],
                    file_env,
                )
                sent, seconds, rate = summary_rate(out, n)
                file_rates[label] = rate
                print(
                    f"trends ingest file (--workers {args.workers or os.cpu_count()}){label}: {sent:,} events -> "
                    f"{rate:,.0f} events/s (read+validate+produce {seconds:.1f} s; {wall:.1f} s with start-up)"
                )
                print(
                    f"  ratio to the bare keyed producer {rate / bare:.2f} (goal >= 0.5); "
                    f"to ProducerPerformance {rate / perf:.2f}"
                )
            on_file, off_file = file_rates.values()
            print(f"  pseudonymised / not: {on_file / off_file:.2f}")
            store_costs(private, max(n // 50, 2000))
            alone = validate_alone(path)
            workers = args.workers or os.cpu_count() or 1
            print(
                f"  bound: read + parse + validate + encode alone (no Kafka, one process, the workers' code) "
                f"{alone:,.0f} records/s = {alone / bare:.2f} of the bare producer per core; the replay reached "
                f"{rate / (alone * workers):.2f} of {workers} x that, on {os.cpu_count()} cores shared with the "
                f"producer and the broker"
            )
            fwd_sent, (fwd_seconds, fwd_again) = http_forward(path, env, names["fwd-http"], args.clients, args.batch)
            forward, forward_again = fwd_sent / fwd_seconds, fwd_sent / fwd_again
            print(
                f"bare HTTP forwarder (the same requests and clients, each answered after Kafka's acks; no "
                f"validation): {fwd_sent:,} records -> {forward:,.0f}/s; the same requests again {forward_again:,.0f}/s"
            )
            sent, (seconds, again) = collector(path, env, names["coll"], names["dlq"], args.clients, args.batch)
            rate = sent / seconds
            print(
                f"trends collect (HTTP, {args.batch} events per request as JSON lines, {args.clients} clients): "
                f"{sent:,} events -> {rate:,.0f} events/s (every request answered after Kafka's acks)"
            )
            print(
                f"  ratio to the bare HTTP forwarder {rate / forward:.2f} (goal >= 0.5); to the bare keyed producer "
                f"{rate / bare:.2f}; to ProducerPerformance {rate / perf:.2f}"
            )
            print(
                f"  the long-running collector, the same events again (its users read): {sent / again:,.0f} events/s "
                f"= {sent / again / forward_again:.2f} of the bare HTTP forwarder's second pass (goal >= 0.5)"
            )
            print(
                f"  bound: the collector parses and validates in its one process: it reached {rate / alone:.2f} of "
                f"read + parse + validate + encode alone ({alone:,.0f} records/s, above)"
            )

            # the bridge pseudonymises in this process: the run's own keyspace and key, as the commands above
            keyed = private.privacy.model_copy(update={"subject_key_file": key_file})
            bridge_lanes(private.model_copy(update={"privacy": keyed}), path, bridge_formats, run, names)
    finally:
        topics.delete_topics(settings.kafka, list(names.values()))
        with session(settings) as sess:
            sess.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")


if __name__ == "__main__":
    main()
