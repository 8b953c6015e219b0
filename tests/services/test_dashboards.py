"""No dead panel: the shipped Grafana dashboards' queries return data on a real Prometheus scraping a running pipeline.

Grafana does not install here, so the dashboards are proved by what Grafana would send: every panel's queries, with
the dashboard variables at "All" and ``$__rate_interval`` at a window of a few scrapes, through Prometheus's HTTP
query API. The pipeline is the shipped code on a fresh topic and keyspace, each process as the stack runs it:
``trends ingest file -`` fed valid events (two closed hours in the past, then a live stream) and invalid lines
(dead letters by reason), the supervised speed job, the ``trends_backfill`` DAG on a private Airflow (the batch
run, and the runs the exporter reports), ``trends batch exporter``, ``trends serve`` answering queries (a few
refused), and the stack's Prometheus scraping all five every second. Then (a) every metric name a panel uses is
among the names Prometheus scraped, and (b) every query of every panel has a finite value; a panel that has
none fails the test by its title.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from infra import migrations
from infra.dag_contract import dags_folder
from infra.settings import Settings
from infra.settings_env import to_env
from stack import control
from stack.airflow.config import AirflowConfig
from stack.process import http_ok, tail
from stack.services.pipeline import ApiService
from stack.services.prometheus import BatchExporterService, PrometheusService
from tests.helpers import BAD_REQUESTS, dashboard_metrics, dashboard_panels, free_port
from tests.pipeline import SupervisedSpeed
from views.event import Event

pytestmark = [pytest.mark.alerting]  # make test-alerting: a few minutes, kept out of make test

HOUR = timedelta(hours=1)
RATE_INTERVAL = "15s"  # $__rate_interval: Grafana's is at least 4 scrape intervals (1 s here)
QUERIES = ["/api/v1/count?last=1h", "/api/v1/summary?last=3h", "/api/v1/top?last=1h", "/api/v1/series?last=1h"]
INVALID = [b"{not json", b'{"id": "no-time", "item": "#a"}', b'{"id": "t", "ts": "yesterday", "item": "#a"}']


def _prom(prom: PrometheusService, path: str, **query: str) -> Any:
    url = f"{prom.url}{path}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - our loopback Prometheus
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]


def _no_data(prom: PrometheusService, expr: str) -> str | None:
    """Return why an instant query has no series with a finite value now (None: it has one)."""
    try:
        result = _prom(prom, "/api/v1/query", query=expr)["result"]
    except urllib.error.HTTPError as exc:  # Prometheus refused the query (400: it does not parse)
        return f"refused: {exc.read().decode()}"
    values = [float(s["value"][1]) for s in result]
    if any(math.isfinite(v) for v in values):
        return None
    return f"only {values}" if values else "no series"


def _dead(prom: PrometheusService) -> list[str]:
    """Return each panel query without a finite value, as "dashboard / title: query: why"."""
    return [
        f"{panel.name}: {query}: {why}"
        for panel in dashboard_panels()
        for query in panel.queries(RATE_INTERVAL)
        if (why := _no_data(prom, query)) is not None
    ]


class Loop:
    """Call ``step`` every ``every_s`` seconds on a thread until stopped; the first error ends it and is re-raised."""

    def __init__(self, step: Callable[[], None], every_s: float) -> None:
        self.step, self.every_s = step, every_s
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.every_s):
                self.step()
        except BaseException as exc:  # noqa: BLE001 - handed to the test by stop()
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        if self.error is not None:
            raise self.error


@pytest.fixture
def pipeline_settings(keyspace_settings: Settings, new_topic: Callable[..., str], tmp_path: Path) -> Settings:
    """Return settings of a fresh keyspace and topic, every process on free loopback ports under tmp_path."""
    migrations.migrate(keyspace_settings)
    base = keyspace_settings
    return base.model_copy(
        update={
            "data_dir": tmp_path / "data",
            "kafka": base.kafka.model_copy(update={"events_topic": new_topic(partitions=2), "partitions": 2}),
            "serving": base.serving.model_copy(update={"port": free_port()}),
            "speed": base.speed.model_copy(
                update={"query_name": f"dash_{uuid.uuid4().hex[:8]}", "trigger_seconds": 1.0, "track_state_rows": True}
            ),
            "spark": base.spark.model_copy(update={"checkpoint_root": str(tmp_path / "checkpoints")}),
            "batch": base.batch.model_copy(update={"lateness_s": 300, "grace_s": 300}),
            "airflow": base.airflow.model_copy(update={"api_port": free_port(), "dags_folder": dags_folder()}),
            "metrics": base.metrics.model_copy(
                update={
                    "host": "127.0.0.1",
                    "speed_port": free_port(),
                    "batch_exporter_port": free_port(),
                    "prometheus_port": free_port(),
                    "ingest_port": free_port(),
                    "scrape_interval_s": 1.0,
                    "evaluation_interval_s": 1.0,
                }
            ),
        }
    )


class Ingest:
    """``trends ingest file -`` in its own process, fed lines on its stdin (the real ingest path, kept running)."""

    def __init__(self, settings: Settings, log: Path) -> None:
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [str(Path(sys.executable).parent / "trends"), "ingest", "file", "-", "--workers", "1", "--no-progress"],
                env={**os.environ, **to_env(settings)},
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.url = f"http://127.0.0.1:{settings.metrics.ingest_port}/metrics"
        self.sent = 0

    def write(self, lines: list[bytes]) -> None:
        assert self.proc.poll() is None and self.proc.stdin is not None, tail([self.log])
        self.proc.stdin.write(b"".join(line + b"\n" for line in lines))
        self.proc.stdin.flush()
        self.sent += len(lines)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def pipeline(pipeline_settings: Settings, tmp_path: Path) -> Iterator[tuple[Settings, PrometheusService, list[Path]]]:
    settings = pipeline_settings
    with ExitStack() as stack:
        began = time.monotonic()

        def lap(what: str) -> None:
            print(f"{time.monotonic() - began:6.1f} s  {what}", flush=True)

        # Ingestion: two closed hours of history, invalid lines, then a live stream on every partition.
        ingest = Ingest(settings, tmp_path / "ingest.log")
        stack.callback(ingest.close)
        past = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - 3 * HOUR
        history = [
            Event(id=f"h{i}", ts=past + i * timedelta(seconds=36), item=f"#i{i % 20}", user=f"u{i % 50}", value=i % 7)
            for i in range(200)  # 100 per hour
        ]
        ingest.write([e.to_json() for e in history] + INVALID)
        counter = iter(range(10**9))

        def live() -> None:
            n = next(counter)
            now = datetime.now(UTC)
            ingest.write(
                [
                    Event(id=f"l{n}-{k}", ts=now, item=f"#i{k}", user=f"u{n % 30}", value=1.5).to_json()
                    for k in range(20)
                ]
            )
            if n % 20 == 0:
                ingest.write(INVALID[:1])

        feeder = Loop(live, 0.5)
        stack.callback(feeder.stop)

        exporter, prom = BatchExporterService(settings), PrometheusService(settings)
        for svc in (exporter, prom):
            stack.callback(svc.stop)
            svc.wait_ready(svc.start(""))
        deadline = time.monotonic() + 30
        while not http_ok(ingest.url):
            assert time.monotonic() < deadline, tail([ingest.log])
            time.sleep(0.5)
        lap("ingest, exporter and Prometheus up")

        stack.callback(control.down, settings, ["airflow"])
        control.up(settings, ["airflow"])
        lap("Airflow up")
        speed = SupervisedSpeed(settings)
        stack.callback(speed.stop)
        speed.start()
        lap("speed job up")

        # The batch layer: the trends_backfill DAG over the two historical hours (index, recompute, watermark).
        airflow = AirflowConfig(settings).client()
        token = airflow.token()
        airflow.wait_dag(token, "trends_backfill")
        run = airflow.trigger(
            token, "trends_backfill", {"start": past.isoformat(), "end": (past + 2 * HOUR).isoformat()}
        )

        api = ApiService(settings)
        stack.callback(api.stop)
        api.wait_ready(api.start(""))
        base = f"http://127.0.0.1:{settings.serving.port}"
        rounds = iter(range(10**9))

        def ask() -> None:
            n = next(rounds)
            for path in QUERIES:
                with urllib.request.urlopen(base + path, timeout=30) as resp:  # noqa: S310 - our loopback API
                    assert resp.status == 200
            bad, status, _ = BAD_REQUESTS[n % len(BAD_REQUESTS)]
            try:
                urllib.request.urlopen(base + bad, timeout=30)  # noqa: S310 - our loopback API
            except urllib.error.HTTPError as exc:
                assert exc.code == status
            else:
                pytest.fail(f"{bad} was answered")

        asking = Loop(ask, 0.5)
        stack.callback(asking.stop)
        lap("API up and asked")
        airflow.wait_run(token, "trends_backfill", run, timeout_s=600)
        lap("trends_backfill succeeded")
        yield (
            settings,
            prom,
            [ingest.log, exporter.stdout_file, prom.stdout_file, speed.service.stdout_file, api.stdout_file],
        )
        lap("checked")


def test_every_panel_shows_data_on_a_real_prometheus(pipeline: tuple[Settings, PrometheusService, list[Path]]) -> None:
    _settings, prom, logs = pipeline
    panels = dashboard_panels()
    # Wait (bounded) until every panel has data: each process has had time to report, and rates have two scrapes.
    deadline, dead = time.monotonic() + 120, ["not checked"]
    while dead and time.monotonic() < deadline:
        dead = _dead(prom)
        if dead:
            time.sleep(2)
    scraped = set(_prom(prom, "/api/v1/label/__name__/values"))
    missing = {name: sorted(where) for name, where in dashboard_metrics().items() if name not in scraped}
    queries = sum(len(p.exprs) for p in panels)
    print(
        f"{len(panels)} panels, {queries} queries: {queries - len(dead)} with data; "
        f"{len(dashboard_metrics())} metric names, {len(dashboard_metrics()) - len(missing)} scraped"
    )
    assert not missing and not dead, (
        f"metrics no target exports: {json.dumps(missing, indent=1)}\npanels without data: {json.dumps(dead, indent=1)}"
        + "\n"
        + tail(logs, 20)
    )
