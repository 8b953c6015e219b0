"""The HTTP collector (``trends collect``) against the real Kafka: answers, dead letters, retries, Kafka away.

Each case runs ``trends collect`` in its own process, as an operator would, on its own topics. What a 200 says is
checked against the topics read back from the broker; the same batch posted twice is counted once by the real
speed and batch layers (Spark, Cassandra); Kafka made unreachable mid-request (a private broker behind a Toxiproxy
proxy, the shared one untouched) gives a 503 with ``Retry-After``, and every event answered 200 is on the topic.
Schemathesis runs the collector's OpenAPI document with every check. Marked ``sources`` (``make test-sources``).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from batch_layer import job
from infra import migrations, topics
from infra.cassandra import session, table
from infra.settings import Settings
from infra.settings_env import to_env
from ingestion.dlq import read_dead_letters
from stack.services.base import find_java
from stack.services.toxiproxy import ToxiproxyService
from tests.helpers import free_port, speed_drain
from tests.network.proxies import ProxiedKafka, Proxies
from tests.pipeline import read_topic

pytestmark = [pytest.mark.sources, pytest.mark.services]

TOKEN = "collector-test-token-0123456789"  # noqa: S105 - a throw-away test token
AUTH = {"Authorization": f"Bearer {TOKEN}"}
H0 = datetime(2025, 11, 23, 10, tzinfo=UTC)  # a year ago: a closed hour the batch layer may recompute
HOUR = timedelta(hours=1)


def event(i: int, tag: str = "e", hour: datetime = H0, **extra: Any) -> dict[str, Any]:
    return {
        "id": f"{tag}-{i}",
        "ts": (hour + timedelta(seconds=(i * 37) % 3600)).isoformat(),
        "item": f"#i{i % 7}",
        "user": f"u{i % 50}",
        "value": float(i % 13),
        **extra,
    }


@dataclass
class Running:
    url: str
    settings: Settings
    log: Path

    def post(self, body: Any, ctype: str = "application/json", **headers: str) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.post(
            f"{self.url}/api/v1/events",
            content=content,
            headers={**AUTH, "Content-Type": ctype, **headers},
            timeout=60,
        )

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(r.value()) for r in read_topic(self.settings, self.settings.kafka.events_topic)]


@contextmanager
def collect(settings: Settings, log: Path, **env: str) -> Iterator[Running]:
    """Run ``trends collect`` in its own process; yield it once /health answers."""
    port = free_port()
    full = {
        **os.environ,
        **to_env(settings),
        "TRENDS_COLLECTOR__PORT": str(port),
        "TRENDS_SERVING__API_TOKEN": TOKEN,
        **env,
    }
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "trends"), "collect"], env=full, stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        yield Running(url, settings, log)
    finally:
        proc.terminate()
        assert proc.wait(30) in (0, -15), log.read_text()[-3000:]  # uvicorn re-raises the SIGTERM it handled
        assert "Application shutdown complete" in log.read_text(), log.read_text()[-3000:]  # the producer flushed


@pytest.fixture
def topics_settings(stack_up: Settings, new_topic: Callable[..., str]) -> Settings:
    """Settings with a fresh events topic (one partition) and dead-letter topic."""
    kafka = stack_up.kafka.model_copy(update={"events_topic": new_topic(1), "dlq_topic": new_topic(1)})
    return stack_up.model_copy(update={"kafka": kafka})


@pytest.fixture
def running(topics_settings: Settings, tmp_path: Path) -> Iterator[Running]:
    with collect(topics_settings, tmp_path / "collect.log", TRENDS_COLLECTOR__MAX_BODY_BYTES="200000") as r:
        yield r


def test_valid_invalid_and_mixed_batches(running: Running) -> None:
    valid = [event(i, "v") for i in range(200)]
    r = running.post(valid)
    assert r.status_code == 200, r.text
    assert r.json() == {"accepted": 200, "rejected": 0, "rejects": []}

    invalid = [
        {"ts": "2026-01-01T00:00:00Z"},  # no item
        {"id": "x", "ts": "yesterday", "item": "#a"},
        {"id": "y", "ts": "2999-01-01T00:00:00Z", "item": "#a"},
        "not an object",
        {"id": "z", "ts": "2026-01-01T00:00:00Z", "item": "#a\u001b[31m"},
        {"v": 2, "id": "w", "ts": "2026-01-01T00:00:00Z", "item": "#a"},
    ]
    expected = [
        "missing_field",
        "bad_time",
        "future_time",
        "malformed_json",
        "control_character",
        "unsupported_version",
    ]
    r = running.post(invalid)
    assert r.status_code == 200, r.text
    got = r.json()
    assert (got["accepted"], got["rejected"]) == (0, 6)
    assert [(x["index"], x["reason"]) for x in got["rejects"]] == list(enumerate(expected))
    assert all(x["detail"] for x in got["rejects"])

    mixed = [event(i, "m") for i in range(10)]
    mixed[3] = {"id": "m-bad", "ts": "2026-01-01T00:00:00Z", "item": "", "user": "u"}
    mixed[7] = {"id": "m-nan", "ts": "2026-01-01T00:00:00Z", "item": "#a", "value": float("nan")}
    r = running.post(json.dumps(mixed).encode())  # json.dumps writes NaN: json reads what msgspec refuses
    assert r.status_code == 200, r.text
    got = r.json()
    assert (got["accepted"], got["rejected"]) == (8, 2)
    assert [(x["index"], x["reason"]) for x in got["rejects"]] == [(3, "invalid_field"), (7, "non_finite")]

    # JSON lines: a malformed line is a record like the others (its line is its index + 1).
    lines = b"\n".join([json.dumps(event(0, "n")).encode(), b"", b"{not json", json.dumps(event(1, "n")).encode()])
    r = running.post(lines, "application/x-ndjson")
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == 2 and [(x["index"], x["reason"]) for x in r.json()["rejects"]] == [
        (2, "malformed_json")
    ]

    ids = Counter(e["id"] for e in running.events())
    assert set(ids) == {f"v-{i}" for i in range(200)} | {f"m-{i}" for i in range(10) if i not in (3, 7)} | {
        "n-0",
        "n-1",
    }
    assert set(ids.values()) == {1}
    letters = list(read_dead_letters(running.settings, running.settings.kafka.dlq_topic, timeout_s=30))
    assert sorted((d.line, d.reason) for d in letters if d.raw != b"{not json") == sorted(
        [(i + 1, reason) for i, reason in enumerate(expected)] + [(4, "invalid_field"), (8, "non_finite")]
    )
    assert {d.source for d in letters} == {"collector"}
    assert [d.reason for d in letters if d.raw == b"{not json"] == ["malformed_json"]
    assert any(d.raw == b'"not an object"' for d in letters)  # the element's own bytes

    metrics = httpx.get(f"{running.url}/metrics", timeout=10).text
    assert 'trends_collector_requests_total{status="200"} 4.0' in metrics
    assert 'trends_collector_events_total{outcome="accepted"} 210.0' in metrics
    assert 'trends_collector_events_total{outcome="rejected"} 9.0' in metrics


def test_gzip_bodies_and_the_size_limit(running: Running) -> None:
    batch = [event(i, "g") for i in range(1000)]
    lines = b"\n".join(json.dumps(e).encode() for e in batch)
    r = running.post(gzip.compress(lines), "application/x-ndjson", **{"Content-Encoding": "gzip"})
    assert r.status_code == 200 and r.json()["accepted"] == 1000, r.text
    r = running.post(
        gzip.compress(json.dumps([event(i, "gj") for i in range(5)]).encode()), **{"Content-Encoding": "gzip"}
    )
    assert r.status_code == 200 and r.json()["accepted"] == 5, r.text

    too_big = json.dumps([event(i, "big") for i in range(3000)]).encode()  # ~360 KB > 200,000 bytes
    r = running.post(too_big)
    assert r.status_code == 413 and "collector.max_body_bytes" in r.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as read
        for i in range(0, len(too_big), 8192):
            yield too_big[i : i + 8192]

    r = httpx.post(
        f"{running.url}/api/v1/events", content=chunks(), headers={**AUTH, "Content-Type": "application/json"}
    )
    assert r.status_code == 413, r.text
    r = running.post(gzip.compress(too_big), **{"Content-Encoding": "gzip"})  # small on the wire, too big inflated
    assert r.status_code == 413 and "inflates" in r.json()["detail"]
    assert running.post(batch[:1], Authorization="").status_code == 401
    assert running.post(batch[:1], Authorization="Bearer wrong-token").status_code == 403
    assert running.post(b"a,b\n1,2", "text/csv").status_code == 415
    assert running.post(b"{nope").status_code == 400

    ids = Counter(e["id"] for e in running.events())
    expected = {f"g-{i}" for i in range(1000)} | {f"gj-{i}" for i in range(5)}
    assert set(ids) == expected and set(ids.values()) == {1}  # nothing of the refusals


@pytest.mark.spark
def test_the_same_batch_twice_is_counted_once(
    keyspace_settings: Settings, new_topic: Callable[..., str], tmp_path: Path, spark: Any
) -> None:
    """A client that retries (say after a 503 whose records were in fact written) sends the same ids again.

    Both copies are acknowledged and both are on the topic (Kafka's idempotence is per producer session, not per
    id); the speed layer drops the second copy as it reads it, the batch layer keeps one per id: each layer counts
    each event once.
    """
    migrations.migrate(keyspace_settings)
    s = keyspace_settings
    settings = s.model_copy(
        update={
            "kafka": s.kafka.model_copy(update={"events_topic": new_topic(1), "dlq_topic": new_topic(1)}),
            "batch": s.batch.model_copy(update={"lateness_s": 600, "grace_s": 600}),
        }
    )
    batch = [event(i, "r") for i in range(300)]
    no_ids = [{k: v for k, v in event(i, "c", item="#noid").items() if k != "id"} for i in range(50)]
    with collect(settings, tmp_path / "collect.log") as running:
        for _ in range(2):
            r = running.post(batch + no_ids)
            assert r.json() == {"accepted": 350, "rejected": 0, "rejects": []}, r.text
        closer = running.post([event(0, "closer", H0 + 4 * HOUR)])  # moves the partition past the hour + grace
        assert closer.json()["accepted"] == 1
        on_topic = Counter(e["id"] for e in running.events())
    assert sum(on_topic.values()) == 701 and len(on_topic) == 351  # every event twice (and the closer once)
    assert sum(1 for i in on_topic if i.startswith("c-")) == 50  # ids derived from the content: the same twice

    # The speed layer drops each second copy (same id and event time) as it reads it.
    speed_drain(settings, tmp_path, lateness_s=6 * 3600)
    with session(settings) as sess:
        rows = sess.execute(
            f"SELECT bucket_start, events FROM {table(settings, 'speed_minutes')} "
            "WHERE query = %s AND slice = '*' AND day = %s",
            (settings.speed.query_name, H0.date()),
        )
        speed = sum(r.events for r in rows if H0 <= r.bucket_start.replace(tzinfo=UTC) < H0 + HOUR)
    assert speed == 350

    # The batch layer keeps one copy per id when it recomputes the hour.
    (result,) = job.run(settings, H0, H0 + HOUR, spark=spark)
    assert result.counts["kept"] == 350, result.line()
    assert result.counts["deduped"] == 350, result.line()


# -- Kafka away ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def proxied_broker(
    settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Settings, Settings, Any]]:
    """A private broker (own ports and data) whose clients all go through a Toxiproxy proxy; the shared one untouched.

    Yields the settings through the proxy, the settings straight to the broker, and the proxies' API.
    """
    own_proxy = settings.model_copy(update={"data_dir": tmp_path_factory.mktemp("toxiproxy")})
    service = ToxiproxyService(own_proxy, free_port())
    service.wait_ready(service.start(""))
    try:
        proxies = Proxies(service.api())
        direct, proxied, controller = free_port(), free_port(), free_port()
        port = proxies.front("kafka", f"127.0.0.1:{proxied}")
        own = settings.model_copy(
            update={
                "data_dir": tmp_path_factory.mktemp("kafka-collector") / "data",
                "kafka": settings.kafka.model_copy(
                    update={"bootstrap_servers": f"127.0.0.1:{direct}", "partitions": 2, "replication_factor": 1}
                ),
                "stack": settings.stack.model_copy(update={"kafka_controller_port": controller, "kafka_heap": "384m"}),
            }
        )
        broker = ProxiedKafka(own, proxied, port)
        broker.wait_ready(broker.start(find_java(own)))
        try:
            topics.ensure_topics(own.kafka)
            via = own.model_copy(
                update={"kafka": own.kafka.model_copy(update={"bootstrap_servers": f"127.0.0.1:{port}"})}
            )
            yield via, own, proxies.api
        finally:
            broker.stop()
    finally:
        service.stop()


def test_kafka_unreachable_mid_request_is_a_503_and_nothing_answered_200_is_lost(
    proxied_broker: tuple[Settings, Settings, Any], tmp_path: Path
) -> None:
    via, direct, api = proxied_broker
    with collect(via, tmp_path / "collect.log", TRENDS_COLLECTOR__DELIVERY_TIMEOUT_S="4") as running:
        first = [event(i, "before") for i in range(500)]
        assert running.post(first).json()["accepted"] == 500

        # A slow link puts the next request in flight; the link then goes away under it.
        api.latency("kafka", 1500)
        answers: dict[str, httpx.Response] = {}
        during = [event(i, "during") for i in range(500)]
        thread = threading.Thread(target=lambda: answers.setdefault("r", running.post(during)))
        began = time.monotonic()
        thread.start()
        time.sleep(0.5)
        api.set_enabled("kafka", False)
        thread.join(60)
        r = answers["r"]
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "5"
        assert time.monotonic() - began < 4 + 3  # bounded by collector.delivery_timeout_s
        assert running.post(during[:10]).status_code == 503  # still away: refused, not hanging

        api.clear("kafka")
        api.set_enabled("kafka", True)
        deadline = time.monotonic() + 60
        while (again := running.post(during)).status_code != 200:  # the client's retry, as Retry-After says
            assert again.status_code == 503 and time.monotonic() < deadline, again.text
            time.sleep(1)
        assert again.json()["accepted"] == 500
    on_topic = Counter(e["id"] for e in (json.loads(r.value()) for r in read_topic(direct, via.kafka.events_topic)))
    assert {f"before-{i}" for i in range(500)} <= set(on_topic)  # every 200 is there
    assert {f"during-{i}" for i in range(500)} <= set(on_topic)  # the retry answered 200: there
    assert all(n == 1 for i, n in on_topic.items() if i.startswith("before-"))
    assert "503 for a request of 500 records" in running.log.read_text()


# -- the contract ----------------------------------------------------------------------------------------------


def test_schemathesis_finds_nothing_on_the_collector(
    topics_settings: Settings, tmp_path: Path, artifacts_dir: Path
) -> None:
    from tests.services.test_serving_api import CONTRACT_TOKEN, schemathesis

    # Every check; 413 (more records than collector.max_records, the schema's maxItems) counts as a refusal.
    config = tmp_path / "schemathesis.toml"
    config.write_text(
        '[checks.negative_data_rejection]\nexpected-statuses = ["400", "401", "403", "413", "415", "422"]\n'
    )
    with collect(topics_settings, tmp_path / "collect.log", TRENDS_SERVING__API_TOKEN=CONTRACT_TOKEN) as running:
        got = schemathesis(running.url, tmp_path / "report.json", config=config, max_time_s=90)
        text = httpx.get(f"{running.url}/metrics", timeout=10).text
    answered = {
        status: float(n) for status, n in re.findall(r'trends_collector_requests_total\{status="(\d+)"\} (\S+)', text)
    }
    cases = got["test_cases"]
    summary = (
        f"Schemathesis {got['schemathesis_version']} on the collector, checks all, no hooks: "
        f"{got['operations']['tested']} operations, {cases['generated']} cases, {cases['unique_failures']} failures, "
        f"{len(got['errors'])} errors; answers by status {answered}"
    )
    (artifacts_dir / "schemathesis-collector.txt").write_text(summary + "\n\n" + got["stdout"][-20000:])
    assert got["operations"]["tested"] == got["operations"]["total"] >= 3, summary
    assert cases["unique_failures"] == 0 and not got["errors"], got["stdout"][-8000:]
    assert answered["200"] > 50 and answered["401"] > 0 and answered["400"] > 0, summary  # real, probed, refused
    assert answered["503"] == 0, summary
