"""Helpers shared by tests: the stack's clients and processes, the API's refused requests, a batch history."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer

from infra.settings import Settings
from infra.settings_env import to_env
from ingestion.generator import SyntheticStream
from ingestion.generator_config import GeneratorConfig
from views.event import Event


def chromium(width: int = 1400, height: int = 2600) -> Any:
    """Return a Selenium driver of Debian's headless Chromium (``make test`` installs it), for the pages' tests."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_bin = shutil.which("chromium"), shutil.which("chromedriver")
    assert browser and driver_bin, "Debian's chromium and chromium-driver are needed (`make test` installs them)"
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(driver_bin))


def iso(t: datetime) -> str:
    """Return a UTC time as the CLI and the API take it (``2025-09-14T06:00:00Z``)."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


VENV = Path(sys.executable).parent.parent  # the venv running the tests, whose ``trends`` the suites run


def call_trends(
    venv: Path, env: dict[str, str], *args: str, timeout: float = 600, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a venv's ``trends`` as an operator does; return the finished process, whatever its status."""
    return subprocess.run(
        [str(venv / "bin" / "trends"), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_trends(
    venv: Path,
    env: dict[str, str],
    *args: str,
    timeout: float = 600,
    cwd: Path | None = None,
    stdout_only: bool = False,
) -> str:
    """Run a venv's ``trends``; return its output, failing the test with it when the command fails.

    :arg stdout_only: return standard output alone (an answer to parse, without the logs of standard error).
    """
    proc = call_trends(venv, env, *args, timeout=timeout, cwd=cwd)
    assert proc.returncode == 0, f"trends {' '.join(args)}: {proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout if stdout_only else proc.stdout + proc.stderr


def drop_keyspace(settings: Settings, keyspace: str) -> None:
    """Drop a test's keyspace (its teardown), through the given settings' Cassandra."""
    from infra.cassandra import session

    with session(settings) as sess:
        sess.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")


def wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path, *, status: int = 200, timeout_s: float = 90) -> None:
    """Wait until a ``trends serve`` child answers ``/ready`` with ``status``; fail with its log if it dies first."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/ready", timeout=5).status_code == status:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.3)


def free_port() -> int:
    """Return a loopback port that is free right now, for a server a test starts.

    It is taken below Linux's ephemeral range (32768-60999), where no client connection's local port can land on
    it between the test's choice and a restart of the server (a Cassandra restart once met its JMX port taken so).
    """
    for _ in range(500):
        port = random.randrange(20000, 32768)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    msg = "no free loopback port in 20000-32767"
    raise RuntimeError(msg)


def consume_all(settings: Settings, topic: str, expect: int, timeout_s: float = 30) -> list[str]:
    consumer = Consumer(
        {**settings.kafka.client_config(), "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    values: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(values) < expect and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                values.append(msg.value().decode())
    finally:
        consumer.close()
    return values


def speed_drain(settings: Settings, tmp_path: Path, lateness_s: int = 600, **extra: str) -> str:
    """Run the real speed layer over what the topic holds now (same checkpoint each call); ``extra``: more env."""
    overrides = {
        "TRENDS_KAFKA__EVENTS_TOPIC": settings.kafka.events_topic,
        "TRENDS_CASSANDRA__KEYSPACE": settings.cassandra.keyspace,
        "TRENDS_SPEED__QUERY_NAME": settings.speed.query_name,
        "TRENDS_METRICS__SPEED_PORT": "0",
        "TRENDS_SPEED__ALLOWED_LATENESS_S": str(lateness_s),
        "TRENDS_SPARK__CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
        "TRENDS_VIEWS__SLICE_DIMS": json.dumps(settings.views.slice_dims),
        **extra,
    }
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "trends"), "speed", "run", "--available-now"],
        env={**os.environ, **overrides},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


@contextmanager
def serve(settings: Settings, log: Path, ready_status: int = 200, **env: str) -> Iterator[str]:
    """Run ``trends serve`` in its own process, as an operator would; yield its URL once /ready answers."""
    port = free_port()
    full_env = {**os.environ, **to_env(settings), "TRENDS_SERVING__PORT": str(port), **env}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "trends"), "serve"], env=full_env, stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url, log, status=ready_status, timeout_s=60)
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


# Requests the API must refuse with a 4xx and a message naming the problem (the API tests and the reliability suite).
BAD_REQUESTS = [
    ("/api/v1/count?slice=carrier%3DAA&last=1h", 400, "unknown slice dimension 'carrier'"),
    ("/api/v1/count?slice=JFK&last=1h", 400, "is not `*` or a slice"),
    ("/api/v1/count?last=90d", 400, "longer than 31 days"),
    ("/api/v1/count?start=2026-01-01T00:00&end=2026-01-02T00:00Z", 400, "no time zone"),
    ("/api/v1/count?start=yesterday&end=2026-01-02T00:00Z", 400, "not an ISO-8601 time"),
    ("/api/v1/count?last=1y", 400, "not a duration"),
    ("/api/v1/users?last=&end=", 400, "not an ISO-8601 time"),  # Schemathesis' first find: now outside the schema
    ("/api/v1/users?last=", 400, "not a duration"),
    ("/api/v1/trending?last=1h&baseline=", 400, "not a duration"),
    # the four HTTP 500s (OverflowError) of issue 16, now refused with the reason
    ("/api/v1/trending?last=999999999d", 400, "longer than any window"),
    ("/api/v1/trending?last=1h&baseline=99999999999d", 400, "not a duration"),
    ("/api/v1/trending?start=0001-01-01T00:00%2B14:00&end=0001-01-02T00:00Z", 400, "years 1970-2999"),
    ("/api/v1/series?start=9999-12-31T00:00Z&end=9999-12-31T23:59Z", 400, "years 1970-2999"),
    ("/api/v1/top?last=1h&limit=201", 400, "between 1 and 200"),
    ("/api/v1/top?last=1h&limit=0", 400, "between 1 and 200"),
    ("/api/v1/trending?last=1h&limit=5000", 400, "between 1 and 200"),
    ("/api/v1/trending?last=1h&baseline=60d", 400, "baseline"),
    ("/api/v1/trending?last=1h&min_support=0", 422, "greater than or equal to 1"),
    ("/api/v1/quantiles?last=1h&rank=1.5", 400, "between 0 and 1"),
    ("/api/v1/quantiles?last=1h&rank=median", 422, "valid number"),
    ("/api/v1/series?last=1h&resolution=week", 422, "minute"),
    ("/api/v1/top?last=1h&limit=ten", 422, "valid integer"),
]


# A batch history as the batch tests produce it (test_batch_history, test_batch_dag, test_batch_backfill_cli).
NIGHT = tuple(range(8))  # 00:00-07:59 UTC: no events
GAP_EVERY = 5  # every 5th day (counted from 1970-01-01) has no event at all


@dataclass
class Truth:
    """What was produced, per UTC day and hour (event time), from the JSON the generator wrote."""

    count: Counter[datetime] = field(default_factory=Counter)  # per hour
    users: dict[date, set[str]] = field(default_factory=lambda: defaultdict(set))
    values: dict[date, list[float]] = field(default_factory=lambda: defaultdict(list))
    items: dict[date, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    dups: Counter[datetime] = field(default_factory=Counter)  # re-sent copies per hour

    def add(self, value: bytes) -> None:
        e = json.loads(value)
        ts = datetime.fromisoformat(e["ts"])
        self.count[ts.replace(minute=0, second=0, microsecond=0)] += 1
        self.users[ts.date()].add(e["user"])
        self.values[ts.date()].append(float(e["value"]))
        self.items[ts.date()][e["item"]] += 1

    def day_count(self, day: date) -> int:
        return sum(n for h, n in self.count.items() if h.date() == day)


def producer(settings: Settings) -> Producer:
    return Producer({**settings.kafka.client_config(), "enable.idempotence": True, "acks": "all", "linger.ms": 5})


def produce_history(settings: Settings, config: GeneratorConfig, truth: Truth, resend_every: int = 97) -> int:
    """Produce a generated stream as ingestion does (record timestamp = event time); re-send some: duplicates.

    :returns: how many events were produced (duplicates not counted; ``truth.dups`` has them per hour).
    """
    p = producer(settings)
    n = 0
    for chunk in SyntheticStream(config).chunks():
        for i, (value, key, ts) in enumerate(zip(chunk.values, chunk.keys, chunk.ts_ms, strict=True)):
            p.produce(settings.kafka.events_topic, value=value, key=key, timestamp=ts)
            truth.add(value)
            n += 1
            if i % resend_every == 0:
                p.produce(settings.kafka.events_topic, value=value, key=key, timestamp=ts)
                truth.dups[datetime.fromtimestamp(ts // 3_600_000 * 3600, UTC)] += 1
        p.poll(0)
    assert p.flush(60) == 0
    return n


def produce_events(
    settings: Settings,
    events: list[Event],
    partitions: int | None = None,
    *,
    partition: int | None = None,
    topic: str | None = None,
    duplicate_every: int = 0,
) -> None:
    """Produce events as ingestion does (keyed by item, record timestamp = event time), idempotently; all delivered.

    :arg partitions: round-robin over this many partitions, so every one moves on (default: by key).
    :arg partition: all into this one partition.
    :arg topic: another topic than ``kafka.events_topic``.
    :arg duplicate_every: send every n-th event twice (duplicates the layers must drop).
    """
    p = producer(settings)
    for i, e in enumerate(events):
        where = (
            {"partition": i % partitions} if partitions else {"partition": partition} if partition is not None else {}
        )
        for _ in range(2 if duplicate_every and i % duplicate_every == 0 else 1):
            p.produce(topic or settings.kafka.events_topic, key=e.item, value=e.to_json(), timestamp=e.ts_ms, **where)
        if i % 5000 == 0:
            p.poll(0)
    assert p.flush(60) == 0


def history_config(start: datetime, days: int, rate: float = 0.006) -> GeneratorConfig:
    """Return a sparse generated history of ``days`` days from ``start``: empty nights, and every 5th day empty."""
    return GeneratorConfig(
        seed=7,
        start=start,
        end=start + timedelta(days=days),
        event_rate=rate,
        rate=None,
        items=300,
        users=2_000,
        quiet_hours=NIGHT,
        gap_every_days=GAP_EVERY,
    )


# The shipped monitoring: the metric names the processes export, the docs' sections, the Grafana dashboards.
REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
RUNBOOK = DOCS / "runbook.md"  # the operators' procedures
ALERTS = DOCS / "alerts.md"  # one section per alert: the rules' runbook_url and the panels of alerted series
METRICS = DOCS / "metrics.md"  # every exported metric: the panels of series without an alert


def doc_anchors(path: Path) -> set[str]:
    """Return the ids MkDocs gives the headings of a page (Python-Markdown's toc slugify; code blocks skipped)."""
    import unicodedata

    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+?)#*$", text, re.M):
        plain = unicodedata.normalize("NFKD", heading.replace("`", "")).encode("ascii", "ignore").decode()
        anchors.add(re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", plain).strip().lower()))
    return anchors


def exported_metric_names() -> set[str]:
    """Return the sample names the pipeline's processes export (counters with ``_total``, histograms' series)."""
    from batch_layer.exporter import METRICS as BATCH
    from ingestion.collector import METRICS as COLLECTOR
    from ingestion.metrics import COUNTERS as INGEST
    from serving.metrics import Metrics
    from speed_layer.metrics import COUNTERS as SPEED_COUNTERS
    from speed_layer.metrics import GAUGES as SPEED_GAUGES

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    api = {f.name + s for f in Metrics.create().registry.collect() for s in suffixes[f.type]}
    collector = {n for n in COLLECTOR if not n.endswith("_seconds")} | {
        n + sfx for n in COLLECTOR if n.endswith("_seconds") for sfx in suffixes["histogram"]
    }
    return {*BATCH, *INGEST, *SPEED_COUNTERS, *SPEED_GAUGES, *api, *collector}


def metric_names(expr: str) -> set[str]:
    """Return the pipeline's metric names a PromQL expression selects (label values are not names)."""
    return set(re.findall(r"\btrends_[A-Za-z0-9_:]+", re.sub(r'"[^"]*"', '""', expr)))


@dataclass(frozen=True)
class DashboardPanel:
    """One panel of a shipped Grafana dashboard, read from its JSON (what an operator imports)."""

    dashboard: str
    title: str
    exprs: tuple[str, ...]
    links: tuple[str, ...]
    all_values: dict[str, str]  # the dashboard's label variables and the value "All" stands for

    @property
    def name(self) -> str:
        return f"{self.dashboard} / {self.title}"

    def queries(self, rate_interval: str) -> list[str]:
        """Return the expressions as Grafana sends them with every variable at "All"."""
        out = []
        for expr in self.exprs:
            text = expr.replace("$__rate_interval", rate_interval)
            for name, value in self.all_values.items():
                text = re.sub(rf"\$(?:\{{{name}\}}|{name}\b)", value, text)
            assert "$" not in text, f"{self.name}: a variable left in {text}"
            out.append(text)
        return out


def dashboard_files() -> list[Path]:
    from infra.dashboards import GRAFANA_DIR

    return sorted(GRAFANA_DIR.glob("*.json"))


def dashboard_panels() -> list[DashboardPanel]:
    """Return every panel (not the rows) of the dashboards in ``infra/grafana/``."""
    panels = []
    for path in dashboard_files():
        doc = json.loads(path.read_text())
        variables = doc["templating"]["list"]
        all_values = {v["name"]: v["allValue"] for v in variables if v["type"] == "query"}
        panels.extend(
            DashboardPanel(
                dashboard=doc["title"],
                title=p["title"],
                exprs=tuple(t["expr"] for t in p["targets"]),
                links=tuple(link["url"] for link in p.get("links", [])),
                all_values=all_values,
            )
            for p in doc["panels"]
            if p["type"] != "row"
        )
    return panels


def dashboard_metrics() -> dict[str, set[str]]:
    """Return each metric name the dashboards use -> where (panels, and the label variables' queries)."""
    used: dict[str, set[str]] = defaultdict(set)
    for panel in dashboard_panels():
        for expr in panel.exprs:
            for name in metric_names(expr):
                used[name].add(panel.name)
    for path in dashboard_files():
        doc = json.loads(path.read_text())
        for v in doc["templating"]["list"]:
            if v["type"] == "query":
                for name in metric_names(v["definition"]):
                    used[name].add(f"{doc['title']} / variable {v['name']}")
    return dict(used)
