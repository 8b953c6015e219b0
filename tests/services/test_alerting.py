"""A real Prometheus scrapes the real batch exporter and fires the watermark-lag alert when the batch layer lags.

Everything is the shipped code: the exporter runs as the stack's ``batch-exporter`` service (``trends batch
exporter``) reading a fresh keyspace, the index is built by the real indexer from real records, and Prometheus is the
stack's ``prometheus`` service (the cached binary) evaluating the shipped rules file. Only the rules' ``for:``
durations are shortened (to 2 s, with 1 s scrape and evaluation intervals) so the test takes seconds, not the 15
minutes an operator waits; the expressions and thresholds are the shipped ones. The batch layer first keeps up
(watermark at the newest closed hour: no alert), then falls three days behind: the alert must fire, through
Prometheus's HTTP API.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from batch_layer import horizon
from infra import migrations
from infra.cassandra import session
from infra.settings import Settings
from stack.services.prometheus import RULES_FILE, BatchExporterService, PrometheusService
from tests.helpers import free_port, produce_events
from views.buckets import HOUR, closed_until
from views.event import Event
from views.indexing import indexer
from views.store.pointers import PointerStore

pytestmark = [pytest.mark.alerting]  # 2.5 min: make test-alerting, kept out of make test

SHORT_FOR = "2s"


@pytest.fixture
def monitored(keyspace_settings: Settings, new_topic: Callable[..., str], tmp_path: Path) -> Settings:
    """Return settings of a fresh keyspace and topic, with the monitoring processes on free loopback ports."""
    migrations.migrate(keyspace_settings)
    base = keyspace_settings
    return base.model_copy(
        update={
            "data_dir": tmp_path / "data",
            "kafka": base.kafka.model_copy(update={"events_topic": new_topic(partitions=2)}),
            "serving": base.serving.model_copy(update={"port": free_port()}),
            "metrics": base.metrics.model_copy(
                update={
                    "host": "127.0.0.1",
                    "speed_port": free_port(),  # nothing listens: a down target
                    "batch_exporter_port": free_port(),
                    "prometheus_port": free_port(),
                    "scrape_interval_s": 1.0,
                    "evaluation_interval_s": 1.0,
                    "batch_read_timeout_s": 5.0,
                    "airflow_enabled": False,  # no Airflow in this test: the batch state is what it is about
                }
            ),
        }
    )


def _produce_recent_records(settings: Settings, at: datetime, per_partition: int = 5) -> None:
    """Write records with event time ``at`` into every partition (the indexer reads only their timestamps)."""
    events = [Event(id=f"{i % 2}-{i // 2}", ts=at, item="x", user="u") for i in range(2 * per_partition)]
    produce_events(settings, events, partitions=2)


def _api(prom: PrometheusService, path: str, **query: str) -> Any:
    url = f"{prom.url}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - our loopback Prometheus
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]


def _value(prom: PrometheusService, expr: str) -> float | None:
    result = _api(prom, "/api/v1/query", query=expr)["result"]
    return float(result[0]["value"][1]) if result else None


def _alerts(prom: PrometheusService, name: str) -> list[dict[str, Any]]:
    return [a for a in _api(prom, "/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == name]


def _until(what: str, check: Callable[[], Any], timeout_s: float, logs: list[Path]) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    tails = "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
    pytest.fail(f"{what} not seen within {timeout_s:.0f} s\n{tails}")


@pytest.fixture
def short_rules(tmp_path: Path) -> Path:
    """Return a copy of the shipped rules with every ``for:`` shortened (expressions and thresholds unchanged)."""
    doc = yaml.safe_load(RULES_FILE.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["for"] = SHORT_FOR
    target = tmp_path / "trends.rules.yml"
    target.write_text(yaml.safe_dump(doc, sort_keys=False))
    return target


@contextmanager
def monitoring(settings: Settings, rules: Path) -> Iterator[tuple[PrometheusService, list[Path]]]:
    """Run the stack's batch exporter and Prometheus (the given rules) for these settings."""
    exporter = BatchExporterService(settings)
    prom = PrometheusService(settings, rules_file=rules)
    started: list[Any] = []
    try:
        for svc in (exporter, prom):
            pid = svc.start("")
            started.append(svc)
            svc.wait_ready(pid)
        yield prom, [exporter.stdout_file, prom.stdout_file]
    finally:
        for svc in reversed(started):
            svc.stop()


@pytest.fixture
def running(monitored: Settings, short_rules: Path) -> Iterator[tuple[PrometheusService, list[Path]]]:
    with monitoring(monitored, short_rules) as got:
        yield got


def test_the_watermark_lag_alert_fires_on_a_real_prometheus(
    monitored: Settings, running: tuple[PrometheusService, list[Path]]
) -> None:
    prom, logs = running
    settings = monitored
    # The batch layer keeps up: records up to 5 minutes ago indexed, the watermark at the newest closed hour.
    _produce_recent_records(settings, datetime.now(UTC) - timedelta(minutes=5))
    assert indexer.run_index(settings).records == 10
    closed = closed_until(horizon.horizon(settings).closed_at, settings)
    assert closed is not None
    with session(settings) as sess:
        PointerStore(settings, sess).write_watermark(closed - 2 * HOUR, closed)

    def scraped(lag: float) -> bool:
        return _value(prom, "trends_batch_up") == 1 and _value(prom, "trends_batch_watermark_lag_seconds") == lag

    _until("the exporter scraped with no lag", lambda: scraped(0.0), 60, logs)
    time.sleep(4)  # several evaluations with the state in place: a 2 s `for:` would have fired by now
    assert _alerts(prom, "TrendsBatchWatermarkLag") == []
    assert _value(prom, 'ALERTS{alertname="TrendsBatchWatermarkLag"}') is None
    # the speed and API targets of the config do not run here: the shipped down-target alert sees it
    down = _until("the down-target alert", lambda: _alerts(prom, "TrendsTargetDown"), 30, logs)
    assert {a["labels"]["job"] for a in down} == {"trends-speed", "trends-api"}  # the exporter is up

    # The batch layer falls three days behind (e.g. two weeks of failing hourly runs, seen after three days).
    behind = closed - timedelta(days=3)
    with session(settings) as sess:
        PointerStore(settings, sess).write_watermark(behind - 2 * HOUR, behind)
    lag = (closed - behind).total_seconds()
    _until("the lag scraped", lambda: scraped(lag), 30, logs)

    def firing(name: str) -> list[dict[str, Any]]:
        return [a for a in _alerts(prom, name) if a["state"] == "firing"]

    fired = _until("TrendsBatchWatermarkLag firing", lambda: firing("TrendsBatchWatermarkLag"), 30, logs)
    (alert,) = fired
    assert alert["labels"]["severity"] == "warning" and alert["labels"]["job"] == "trends-batch"
    assert float(alert["value"]) == lag == 3 * 24 * 3600
    assert alert["annotations"]["summary"] == "The batch watermark is 3d 0h 0m 0s behind the newest closed hour"
    assert alert["annotations"]["runbook_url"] == "docs/alerts.md#trendsbatchwatermarklag"
    # three days is past batch.heal_max_hours (48 h): the critical one fires too
    critical = _until("the critical lag alert", lambda: firing("TrendsBatchWatermarkLagCritical"), 30, logs)
    assert critical[0]["labels"]["severity"] == "critical"


def test_an_erasure_pending_past_its_deadline_fires_on_a_real_prometheus(
    monitored: Settings, short_rules: Path, tmp_path: Path
) -> None:
    """A forget in exclusion mode waits for its recompute; once older than the deadline, the alert fires.

    The deadline is the smallest the setting takes (2 days); the requests are made with their times set back
    (``forget(now=...)``), as an operator would meet them after days without the recompute.
    """
    from infra.privacy.subjects import SubjectStore, ensure_key_file
    from privacy.erasure import forget, record_recompute

    key = tmp_path / "subject.key"
    ensure_key_file(key)
    settings = monitored.model_copy(
        update={"privacy": monitored.privacy.model_copy(update={"erasure_deadline_days": 2, "subject_key_file": key})}
    )
    now = datetime.now(UTC)
    with SubjectStore(settings) as store:
        store.pseudonyms(["olga", "pete"])
        young = forget(settings, "olga", exclude=True, store=store, now=lambda: now - timedelta(days=1))
    assert young.outcome == "pending_recompute" and young.request is not None
    with monitoring(settings, short_rules) as (prom, logs):

        def age() -> float | None:
            return _value(prom, "trends_privacy_erasure_oldest_pending_age_seconds")

        _until("one pending erasure scraped", lambda: (age() or 0) > 86400, 60, logs)
        assert _value(prom, 'trends_privacy_erasure_requests{state="pending"}') == 1
        assert _value(prom, "trends_privacy_erasure_deadline_seconds") == 2 * 86400
        time.sleep(4)  # evaluations with a day-old request: a 2 s `for:` would have fired by now
        assert _alerts(prom, "TrendsErasureOverdue") == []

        with SubjectStore(settings) as store:  # a request left three days without its recompute
            old = forget(settings, "pete", exclude=True, store=store, now=lambda: now - timedelta(days=3))
        assert old.request is not None
        fired = _until(
            "TrendsErasureOverdue firing",
            lambda: [a for a in _alerts(prom, "TrendsErasureOverdue") if a["state"] == "firing"],
            60,
            logs,
        )
        (alert,) = fired
        assert alert["labels"]["severity"] == "critical" and alert["labels"]["job"] == "trends-batch"
        assert alert["annotations"]["summary"].startswith("An erasure request has been pending for 3d 0h")
        assert "olga" not in json.dumps(alert) and "pete" not in json.dumps(alert)
        assert _value(prom, 'trends_privacy_erasure_requests{state="pending"}') == 2

        for req in (young.request, old.request):  # both recomputed: nothing pending, the alert resolves
            for state in ("recompute_started", "recomputed", "done"):
                record_recompute(settings, req.request_id, state)  # type: ignore[arg-type]
        _until("the alert resolved", lambda: _alerts(prom, "TrendsErasureOverdue") == [], 60, logs)
        assert age() is None and _value(prom, 'trends_privacy_erasure_requests{state="done"}') == 2


def test_the_exporter_reads_missing_pending_and_stale_hours_and_the_horizon(monitored: Settings) -> None:
    from batch_layer.exporter import BatchReader

    settings = monitored
    _produce_recent_records(settings, datetime.now(UTC) - timedelta(minutes=5))
    indexer.run_index(settings)
    closed = closed_until(horizon.horizon(settings).closed_at, settings)
    assert closed is not None
    run = uuid.uuid1()
    low, mark = closed - 10 * HOUR, closed - 4 * HOUR
    done = [h for h in (low + i * HOUR for i in range(8)) if h != low + 3 * HOUR]  # one hole below the watermark
    with session(settings) as sess:
        pointers = PointerStore(settings, sess)
        pointers.swap([(h, run, 0) for h in done])
        pointers.write_watermark(low, mark)
    reader = BatchReader(settings)
    try:
        state = reader.read()
    finally:
        reader.close()
    assert state.watermark.mark == mark and state.closed_until == closed
    assert state.missing_hours == 1  # low + 3 h: below the watermark, no run
    assert state.pending_hours == 2  # [mark, closed): 4 hours, 2 of them completed ahead of the watermark
    assert state.stale_hours == 0
    assert state.horizon.held_by in {0, 1} and state.horizon.idle == ()
    assert state.skipped == {0: 0, 1: 0}
    assert state.incomplete_hours == 0 and state.lost == {0: 0, 1: 0}  # nothing lost
    assert state.reconciliation_beyond_bound is None and state.reconciliation_at is None  # never reconciled


PROBE_DAG_ID = "probe_exporter"
PROBE_DAG = '''
"""One task that fails when its run's conf says so (no retries): a success and a failure to count."""
from __future__ import annotations

from datetime import UTC, datetime

from airflow.sdk import dag, task


@dag(dag_id={dag_id!r}, schedule=None, start_date=datetime(2026, 5, 1, tzinfo=UTC), catchup=False)
def probe_exporter():
    @task(retries=0)
    def work(params=None, dag_run=None):
        if (dag_run.conf or {{}}).get("fail"):
            raise RuntimeError("failing on purpose")

    work()


probe_exporter()
'''


def test_the_exporter_reads_last_successes_and_failed_tasks_from_a_real_airflow(tmp_path: Path) -> None:
    from batch_layer.exporter import AirflowReader
    from infra.airflow.client import AirflowClient
    from infra.errors import AirflowError
    from stack import control

    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / f"{PROBE_DAG_ID}.py").write_text(PROBE_DAG.format(dag_id=PROBE_DAG_ID))
    settings = Settings(
        data_dir=tmp_path / "data",
        airflow={"api_port": free_port(), "dags_folder": dags},
        metrics={"airflow_dags": [PROBE_DAG_ID, "no_such_dag"]},
    )
    try:
        control.up(settings, ["airflow"])
        client = AirflowClient(settings)
        token = client.token()
        client.wait_dag(token, PROBE_DAG_ID)
        reader = AirflowReader(settings)
        before = reader.read()
        assert before.last_success == {PROBE_DAG_ID: None} and before.failed_task_instances == {PROBE_DAG_ID: 0}
        ok_run = client.trigger(token, PROBE_DAG_ID, {})
        client.wait_run(token, PROBE_DAG_ID, ok_run, timeout_s=300)
        bad_run = client.trigger(token, PROBE_DAG_ID, {"fail": True})
        with pytest.raises(AirflowError, match="failed"):
            client.wait_run(token, PROBE_DAG_ID, bad_run, timeout_s=300)
        quoted = urllib.parse.quote(ok_run, safe="")
        ended = client.get(token, f"/api/v2/dags/{PROBE_DAG_ID}/dagRuns/{quoted}")["end_date"]
        after = reader.read()
        assert after.last_success == {PROBE_DAG_ID: datetime.fromisoformat(ended)}  # the success, not the failure
        assert after.failed_task_instances == {PROBE_DAG_ID: 1}  # "no_such_dag" is skipped, not an error
    finally:
        control.down(settings, ["airflow"])
