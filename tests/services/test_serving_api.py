"""The HTTP API and dashboard over both real layers, after a generated stream with planted bursts.

The stream (``ingestion.generator``, three historical hours, three planted bursts in the last hour) goes through
Kafka into the real speed layer and, for the first two hours, the real batch layer. The API runs as ``trends
serve`` in its own process; the dashboard is opened in Debian's headless Chromium through Selenium.
"""

from __future__ import annotations

import bisect
import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer
from fastapi.testclient import TestClient
from pydantic import SecretStr

from batch_layer import job
from infra import migrations, topics
from infra.settings import Settings
from ingestion.generator import SyntheticStream
from ingestion.generator_config import Burst, GeneratorConfig
from serving.api import create_app
from tests.helpers import BAD_REQUESTS, chromium, drop_keyspace, free_port, iso, serve, speed_drain

pytestmark = pytest.mark.spark

H0 = datetime(2025, 10, 5, 8, tzinfo=UTC)
HOUR = timedelta(hours=1)
MIN = timedelta(minutes=1)
BURSTS = ("#t30:12:140:20", "#t60:12:140:20", "#t90:10:140:20")  # minutes 140-160 of the stream: the 3rd hour
RECENT = (H0 + 140 * MIN, H0 + 160 * MIN)


@dataclass
class Served:
    settings: Settings
    events: list[dict[str, Any]]
    bursts: set[str]

    def exact(self, start: datetime, end: datetime) -> list[dict[str, Any]]:
        lo, hi = iso(start), iso(end)
        return [e for e in self.events if lo <= e["ts"][:19] + "Z" < hi]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, stack_up: Settings, spark: Any) -> Iterator[Served]:
    run = random.randrange(1 << 30)
    topic, keyspace = f"test.api.{run}", f"test_api_{run}"
    topics.ensure_topics(stack_up.kafka, [topics.TopicSpec(topic, 3, 1, {"retention.ms": "-1"})])
    settings = stack_up.model_copy(
        update={
            "kafka": stack_up.kafka.model_copy(update={"events_topic": topic}),
            "cassandra": stack_up.cassandra.model_copy(update={"keyspace": keyspace}),
            "batch": stack_up.batch.model_copy(update={"lateness_s": 300, "grace_s": 300}),
            "views": stack_up.views.model_copy(update={"slice_dims": ["country"]}),
        }
    )
    migrations.migrate(settings)
    config = GeneratorConfig(
        seed=run,
        start=H0,
        end=H0 + 3 * HOUR,
        event_rate=4.0,
        rate=None,
        items=300,
        users=5000,
        bursts=tuple(Burst.parse(b) for b in BURSTS),
    )
    stream = SyntheticStream(config)
    producer = Producer({**settings.kafka.client_config(), "enable.idempotence": True, "acks": "all"})
    events = []
    for chunk in stream.chunks():
        for value, key, ts in zip(chunk.values, chunk.keys, chunk.ts_ms, strict=True):
            producer.produce(topic, key=key, value=value, timestamp=ts)
            events.append(json.loads(value))
        producer.poll(0)
    assert producer.flush(30) == 0
    speed_drain(settings, tmp_path_factory.mktemp("speed"), lateness_s=3600)
    job.run(settings, H0, H0 + 2 * HOUR, spark=spark)
    yield Served(settings, events, {b.split(":")[0] for b in BURSTS})
    drop_keyspace(stack_up, keyspace)
    topics.delete_topics(stack_up.kafka, [topic])


@pytest.fixture(scope="module")
def server(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Run ``trends serve`` over the served views."""
    with serve(served.settings, tmp_path_factory.mktemp("serve") / "serve.log") as url:
        yield url


def test_answers_are_exact_or_within_their_bounds(served: Served, server: str) -> None:
    start, end = H0 + 30 * MIN, H0 + 170 * MIN
    truth = served.exact(start, end)
    window = {"start": iso(start), "end": iso(end)}
    ranks = [0.1, 0.5, 0.9, 0.99]
    got = httpx.get(f"{server}/api/v1/summary", params={**window, "rank": ranks, "top": 5}, timeout=30).json()
    assert got["events"] == len(truth)
    assert got["users_lower"] <= len({e["user"] for e in truth}) <= got["users_upper"]
    values = sorted(e["value"] for e in truth)
    for r in ranks:
        q = got["quantiles"][str(r)]
        lo, hi = bisect.bisect_left(values, q) / len(values), bisect.bisect_right(values, q) / len(values)
        assert lo - got["quantile_rank_error"] <= r <= hi + got["quantile_rank_error"], (r, q, lo, hi)
    counts = Counter(e["item"] for e in truth)
    for t in got["top_items"]:
        assert t["lower"] <= counts[t["item"]] <= t["upper"]
    spans = [(s["layer"], s["resolution"]) for s in got["provenance"]["spans"]]
    assert spans == [("batch", "minute"), ("batch", "hour"), ("speed", "minute")]
    assert got["provenance"]["boundary"] == iso(H0 + 2 * HOUR)
    # the separate endpoints agree with the summary
    assert httpx.get(f"{server}/api/v1/count", params=window).json()["events"] == len(truth)
    users = httpx.get(f"{server}/api/v1/users", params=window).json()
    assert users["users"] == pytest.approx(got["users"]) and users["users_rse"] > 0
    top = httpx.get(f"{server}/api/v1/top", params={**window, "limit": 5}).json()
    assert [t["item"] for t in top["items"]] == [t["item"] for t in got["top_items"]]
    slice_ = httpx.get(f"{server}/api/v1/count", params={**window, "slice": "country=US"}).json()
    assert slice_["events"] == sum(1 for e in truth if e["dims"]["country"] == "US")


def test_planted_bursts_trend_first_on_the_api(served: Served, server: str) -> None:
    params = {"start": iso(RECENT[0]), "end": iso(RECENT[1]), "baseline": "2h", "limit": 10}
    got = httpx.get(f"{server}/api/v1/trending", params=params, timeout=30).json()
    top10 = [t["item"] for t in got["items"]]
    assert served.bursts <= set(top10), top10  # recall@10 of the planted bursts: 100%
    assert set(top10[:3]) == served.bursts
    assert got["provenance"]["recent"]["gaps"] == []
    assert {s["layer"] for s in got["provenance"]["baseline"]["spans"]} == {"batch", "speed"}


def test_series_per_hour_and_per_item(served: Served, server: str) -> None:
    window = {"start": iso(H0), "end": iso(H0 + 3 * HOUR)}
    got = httpx.get(f"{server}/api/v1/series", params={**window, "resolution": "hour"}).json()
    per_hour = Counter(e["ts"][:13] for e in served.events)
    assert [p["count"] for p in got["points"]] == [per_hour[iso(H0 + i * HOUR)[:13]] for i in range(3)]
    burst = sorted(served.bursts)[0]
    mins = httpx.get(
        f"{server}/api/v1/series",
        params={"start": iso(RECENT[0]), "end": iso(RECENT[1]), "resolution": "minute", "item": burst},
    ).json()
    exact = sum(1 for e in served.exact(*RECENT) if e["item"] == burst)
    assert len(mins["points"]) == 20 and sum(p["count"] for p in mins["points"]) == exact


def test_ops_endpoints(server: str, served: Served) -> None:
    assert httpx.get(f"{server}/health").json() == {"status": "ok"}
    status = httpx.get(f"{server}/api/v1/status").json()
    assert status["boundary"] == iso(H0 + 2 * HOUR) and status["speed_newest_event"] is not None
    assert status["speed_lag_s"] > 0
    spec = httpx.get(f"{server}/openapi.json").json()
    assert {"/api/v1/trending", "/api/v1/top", "/api/v1/users", "/api/v1/quantiles", "/api/v1/series"} <= set(
        spec["paths"]
    )
    assert httpx.get(f"{server}/docs").status_code == 200
    metrics = httpx.get(f"{server}/metrics").text
    assert 'trends_api_requests_total{route="/api/v1/status",status="200"}' in metrics
    assert "trends_api_cassandra_up 1.0" in metrics
    # a batch window asked twice: the second answer is a lookup in the process's answer cache
    hits = r'^trends_api_answers_total\{outcome="hit"\} (\S+)$'
    before = float((re.findall(hits, httpx.get(f"{server}/metrics").text, re.M) or ["0"])[0])
    window = f"start={iso(H0)}&end={iso(H0 + HOUR)}"
    first, again = (httpx.get(f"{server}/api/v1/count?{window}").json() for _ in range(2))
    assert first["events"] == len(served.exact(H0, H0 + HOUR)) > 0  # the count the data holds, not just itself
    assert again == first
    text = httpx.get(f"{server}/metrics").text
    assert float(re.findall(hits, text, re.M)[0]) >= before + 1
    cache = dict(re.findall(r"^trends_api_(row|answer)_cache_bytes (\S+)$", text, re.M))
    assert float(cache["row"]) > 0 and float(cache["answer"]) > 0, cache


@pytest.mark.parametrize(("path", "status", "fragment"), BAD_REQUESTS)
def test_bad_requests_get_a_4xx_with_a_message(served: Served, path: str, status: int, fragment: str) -> None:
    with TestClient(create_app(served.settings)) as client:
        r = client.get(path)
    assert r.status_code == status, r.text
    assert fragment in json.dumps(r.json()["detail"]), r.text


def test_the_api_token_protects_queries_not_health(served: Served) -> None:
    s = served.settings
    locked = s.model_copy(update={"serving": s.serving.model_copy(update={"api_token": SecretStr("s3cret")})})
    with TestClient(create_app(locked)) as client:
        assert client.get("/api/v1/count?last=1h").status_code == 401
        assert client.get("/api/v1/count?last=1h", headers={"Authorization": "Bearer nope"}).status_code == 401
        ok = client.get("/api/v1/count?last=1h", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["events"] == 0
        assert client.get("/health").status_code == 200 and client.get("/ready").status_code == 200


def test_the_default_window_is_the_last_hour(served: Served) -> None:
    with TestClient(create_app(served.settings)) as client:
        got = client.get("/api/v1/count").json()
    assert datetime.fromisoformat(got["end"]) - datetime.fromisoformat(got["start"]) == HOUR


WINDOWS = [  # every combination of last, start and end has one meaning (issue 29); the answer names its window
    ("last=2h&end=2026-01-01T10:00Z", "2026-01-01T08:00Z", "2026-01-01T10:00Z"),
    ("last=30m&start=2026-01-01T10:00Z", "2026-01-01T10:00Z", "2026-01-01T10:30Z"),
    ("last=30m&start=2026-01-01T08:00Z&end=2026-01-01T10:00Z", "2026-01-01T09:30Z", "2026-01-01T10:00Z"),
    ("start=2026-01-01T10:00Z", "2026-01-01T10:00Z", "2026-01-01T11:00Z"),
    ("end=2026-01-01T10:00Z", "2026-01-01T09:00Z", "2026-01-01T10:00Z"),
    ("start=2026-01-02T00:00Z&end=2026-01-01T00:00Z", "2026-01-01T00:00Z", "2026-01-02T00:00Z"),
    ("start=2026-01-01T00:00Z&end=2026-03-01T00:00Z", "2026-01-29T00:00Z", "2026-03-01T00:00Z"),
]


@pytest.mark.parametrize(("query", "start", "end"), WINDOWS)
def test_every_window_combination_is_answered(served: Served, query: str, start: str, end: str) -> None:
    with TestClient(create_app(served.settings)) as client:
        got = client.get(f"/api/v1/count?{query}")
    assert got.status_code == 200, got.text
    answered = datetime.fromisoformat(got.json()["start"]), datetime.fromisoformat(got.json()["end"])
    assert answered == (
        datetime.fromisoformat(start.replace("Z", "+00:00")),
        datetime.fromisoformat(end.replace("Z", "+00:00")),
    )


def test_a_series_too_fine_for_its_window_is_answered_coarser(served: Served) -> None:
    with TestClient(create_app(served.settings)) as client:
        got = client.get("/api/v1/series?last=30d&resolution=minute")
    assert got.status_code == 200 and got.json()["resolution"] == "hour", got.text


def test_cassandra_unreachable_is_a_503_with_a_generic_reason(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    s = served.settings
    port = free_port()
    nowhere = s.model_copy(update={"cassandra": s.cassandra.model_copy(update={"port": port})})
    with (
        caplog.at_level("WARNING", "serving.api"),
        TestClient(create_app(nowhere), raise_server_exceptions=False) as client,
    ):
        assert client.get("/health").status_code == 200
        ready = client.get("/ready")
        assert ready.status_code == 503 and ready.headers["retry-after"] == "5"
        r = client.get("/api/v1/trending?last=1h")
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        for answer in (ready, r):  # the contact points and the driver's error stay in the log
            assert answer.json() == {
                "detail": "the views are unavailable right now (the server log has the reason); retry later"
            }
            assert "127.0.0.1" not in answer.text and str(port) not in answer.text and "Traceback" not in answer.text
        assert "trends_api_cassandra_up 0.0" in client.get("/metrics").text
    assert f"Cassandra at 127.0.0.1:{port}" in caplog.text


def test_a_request_over_the_read_budget_is_a_400_naming_the_setting(served: Served) -> None:
    s = served.settings
    window = f"start={iso(H0)}&end={iso(H0 + 3 * HOUR)}"
    tight = s.model_copy(update={"serving": s.serving.model_copy(update={"max_read_mb": 0.01})})
    with TestClient(create_app(tight)) as client:
        r = client.get(f"/api/v1/summary?{window}")
        assert r.status_code == 400 and "serving.max_read_mb" in r.json()["detail"], r.text
        assert client.get(f"/api/v1/count?{window}").status_code == 200  # no sketch read: within any budget
    with TestClient(create_app(s)) as client:
        assert client.get(f"/api/v1/summary?{window}").json()["events"] == len(served.events)


CONTRACT_TOKEN = "contract-test-token-0123456789"  # noqa: S105 - a throw-away test token
CONTRACT_EXAMPLES = 60  # per operation and phase
CONTRACT_SEED = int(os.environ.get("TRENDS_CONTRACT_SEED", "16"))  # any seed must find nothing


def schemathesis(
    url: str, report: Path, *extra: str, config: Path | None = None, max_time_s: int = 45
) -> dict[str, Any]:
    """Run Schemathesis' CLI against a server; return its JSON report.

    Seeded, and bounded: ``CONTRACT_EXAMPLES`` cases per operation and phase, fuzzing repeated with new seeds
    derived from the first until ``max_time_s`` is spent.
    """
    cmd = [
        str(Path(sys.executable).parent / "st"),
        *(["--config-file", str(config)] if config else []),
        "run",
        f"{url}/openapi.json",
        "--checks",
        "all",
        "-H",
        f"Authorization: Bearer {CONTRACT_TOKEN}",
        "--seed",
        str(CONTRACT_SEED),
        "--max-examples",
        str(CONTRACT_EXAMPLES),
        "--phases",
        "examples,coverage,fuzzing",
        "--workers",
        "1",
        "--generation-database",
        "none",  # each run from its seed alone, nothing replayed from an earlier one
        "--max-time",
        str(max_time_s),
        "--request-timeout",
        "30",
        "--report",
        "json",
        "--report-json-path",
        str(report),
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(Path.cwd())}  # no hooks: the schema alone says what is valid
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=max_time_s + 180, check=False)
    assert report.exists(), proc.stdout[-5000:] + proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(report.read_text())
    out["stdout"] = proc.stdout
    return out


def statuses(url: str) -> Counter[tuple[str, str]]:
    """Return the server's own count of answers by route and status (its Prometheus metrics)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.findall(r'trends_api_requests_total\{route="([^"]*)",status="(\d+)"\} (\S+)', text)
    return Counter({(route, status): int(float(n)) for route, status, n in found})


def test_schemathesis_finds_nothing_on_the_real_api(served: Served, tmp_path: Path, artifacts_dir: Path) -> None:
    with serve(served.settings, tmp_path / "serve.log", TRENDS_SERVING__API_TOKEN=CONTRACT_TOKEN) as url:
        got = schemathesis(url, tmp_path / "report.json")
        answered = statuses(url)
    cases = got["test_cases"]
    server_errors = sum(n for (_, status), n in answered.items() if status.startswith("5"))
    summary = (
        f"Schemathesis {got['schemathesis_version']}, checks all, no hooks, seed {CONTRACT_SEED}, "
        f"{CONTRACT_EXAMPLES} examples per operation and phase: {got['operations']['tested']} operations, "
        f"{cases['generated']} cases, {cases['unique_failures']} failures, {len(got['errors'])} errors, "
        f"{server_errors} answers 5xx of {sum(answered.values())} (server metrics)"
    )
    (artifacts_dir / "schemathesis.txt").write_text(summary + "\n\n" + got["stdout"][-20000:])
    assert got["operations"]["tested"] == got["operations"]["total"] >= 11, summary
    assert cases["generated"] >= 500, summary  # bounded, and still a real run
    assert cases["unique_failures"] == 0 and not got["errors"], got["stdout"][-8000:]
    assert server_errors == 0, answered
    assert answered[("/api/v1/count", "200")] > 0 and answered[("/api/v1/trending", "400")] > 0, answered
    assert answered[("/api/v1/summary", "401")] > 0, answered  # Schemathesis checked the token is not ignored


@pytest.mark.faults  # a minute of generated requests: make test-faults; make test keeps the 503 test above
def test_schemathesis_with_cassandra_unreachable_gets_only_503_with_retry_after(
    served: Served, tmp_path: Path, artifacts_dir: Path
) -> None:
    """Nothing shared is stopped: this server's contact point is a loopback port where nothing listens."""
    s = served.settings
    nowhere = s.model_copy(update={"cassandra": s.cassandra.model_copy(update={"port": free_port()})})
    config = tmp_path / "schemathesis.toml"
    config.write_text('[checks.not_a_server_error]\nexpected-statuses = ["2xx", "3xx", "4xx", "503"]\n')
    log = tmp_path / "serve.log"
    with serve(nowhere, log, ready_status=503, TRENDS_SERVING__API_TOKEN=CONTRACT_TOKEN) as url:
        got = schemathesis(url, tmp_path / "report.json", "--mode", "positive", config=config, max_time_s=60)
        answered = statuses(url)
        probe = httpx.get(f"{url}/api/v1/summary?last=1h", headers={"Authorization": f"Bearer {CONTRACT_TOKEN}"})
    cases = got["test_cases"]
    (artifacts_dir / "schemathesis-cassandra-down.txt").write_text(
        f"{cases['generated']} positive cases, {cases['unique_failures']} failures; answers by route and status: "
        f"{dict(answered)}\n\n{got['stdout'][-20000:]}"
    )
    assert cases["unique_failures"] == 0 and not got["errors"], got["stdout"][-8000:]
    views = {k: n for k, n in answered.items() if k[0].startswith("/api/v1/") or k[0] == "/ready"}
    assert views and {status for _, status in views} <= {"503", "401"}, answered  # 401: the ignored_auth probes
    assert sum(n for (_, status), n in views.items() if status == "503") >= 200, answered
    documented = {k: n for k, n in answered.items() if k[0] != "unmatched"}  # Schemathesis probes a 404 too
    assert all(status in {"200", "503", "401"} for _, status in documented), answered
    assert probe.status_code == 503 and probe.headers["retry-after"] == "5"
    assert "Connection refused" in log.read_text() or "NoHostAvailable" in log.read_text()


def test_dashboard_in_headless_chromium(served: Served, server: str, artifacts_dir: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium(1280, 800)
    try:
        driver.get(f"{server}/?start={iso(RECENT[0])}&end={iso(RECENT[1])}&baseline=2h&limit=5000&refresh=0.001")
        body = driver.find_element(By.TAG_NAME, "body")
        assert (body.get_attribute("data-limit"), body.get_attribute("data-refresh")) == ("50", "2")  # clamped
        driver.get(f"{server}/?start={iso(RECENT[0])}&end={iso(RECENT[1])}&baseline=2h&limit=10")
        WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#trending li[data-item]"))
        items = [li.get_attribute("data-item") for li in driver.find_elements(By.CSS_SELECTOR, "#trending li")]
        assert set(items[:3]) == served.bursts, items
        assert len(driver.find_elements(By.CSS_SELECTOR, "#trending svg.spark path")) == len(items)
        assert driver.find_elements(By.CSS_SELECTOR, "#top li[data-item]")
        assert driver.find_element(By.ID, "boundary").text.startswith(iso(H0 + 2 * HOUR)[:10])
        assert driver.find_element(By.ID, "gaps").text == "no gaps"
        assert not driver.find_element(By.ID, "error").is_displayed()
        first = driver.find_element(By.TAG_NAME, "body").get_attribute("data-loaded")
        WebDriverWait(driver, 30).until(
            lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") != first
        )  # it refreshes itself
        shot = artifacts_dir / "dashboard.png"
        assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    finally:
        driver.quit()
