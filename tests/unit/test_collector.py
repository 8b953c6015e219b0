"""The HTTP collector without Kafka: body formats, limits, gzip bombs, the token, the rate limit, refusals.

The app tests run the real app (``fastapi.testclient``) with its producer pointed at a loopback port where nothing
listens: every refusal before Kafka is exercised for real, and a request that reaches the producer gets the 503 of
an unreachable Kafka (no mock stands in for the broker).
"""

from __future__ import annotations

import gzip
import json
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from infra.security import bearer_refusal
from infra.settings import Settings
from ingestion.collector import TokenBucket, create_app
from ingestion.collector_body import Refusal, body_format, content_length_refusal, inflate, records
from ingestion.collector_delivery import Batch, DeliveryFailedError
from ingestion.producer import Delivery
from tests.helpers import free_port

TOKEN = "collector-unit-token-0123456789"  # noqa: S105 - a throw-away test token
EVENT = {"id": "e1", "ts": "2026-01-01T00:00:00Z", "item": "#a", "user": "u1"}


def test_content_types() -> None:
    assert body_format("application/json") == "json"
    assert body_format("Application/JSON; charset=utf-8") == "json"
    assert body_format("application/x-ndjson") == "ndjson"
    assert body_format("application/jsonl") == "ndjson"
    for bad in (None, "", "text/plain", "application/xml", "application/json; charset=latin-1"):
        with pytest.raises(Refusal) as info:
            body_format(bad)
        assert info.value.status == 415


def test_content_length_is_checked_before_reading() -> None:
    assert content_length_refusal(None, 100) is None
    assert content_length_refusal("100", 100) is None
    over = content_length_refusal("101", 100)
    assert over is not None and over.status == 413 and "collector.max_body_bytes" in over.detail
    bad = content_length_refusal("ten", 100)
    assert bad is not None and bad.status == 400


def test_inflate_within_the_limit_and_several_members() -> None:
    assert inflate(gzip.compress(b"abc"), 10) == b"abc"
    assert inflate(gzip.compress(b"ab") + gzip.compress(b"cd"), 10) == b"abcd"


def test_a_gzip_bomb_is_stopped_at_the_limit() -> None:
    bomb = gzip.compress(b"\0" * 50_000_000, 9)  # ~50 KB that inflate to 50 MB
    assert len(bomb) < 100_000
    with pytest.raises(Refusal) as info:
        inflate(bomb, 1_000_000)
    assert info.value.status == 413
    with pytest.raises(Refusal) as info:  # several members, each under the limit, over it together
        inflate(gzip.compress(b"x" * 600) + gzip.compress(b"y" * 600), 1000)
    assert info.value.status == 413


@pytest.mark.parametrize("data", [b"not gzip at all", gzip.compress(b"abc" * 100)[:20], zlib.compress(b"abc")])
def test_bad_gzip_is_a_400(data: bytes) -> None:
    with pytest.raises(Refusal) as info:
        inflate(data, 1000)
    assert info.value.status == 400


def test_array_elements_keep_their_own_bytes() -> None:
    body = b'[ {"a": 1,  "b": [1, 2]}, 3 ,"x", null ]'
    assert records(body, "json", 10) == [
        (0, b'{"a": 1,  "b": [1, 2]}', None),
        (1, b"3", None),
        (2, b'"x"', None),
        (3, b"null", None),
    ]
    assert records(b"[]", "json", 10) == []


def test_what_msgspec_refuses_json_reads() -> None:
    got = records(b'[{"value": NaN}]', "json", 10)
    ((_, raw, _),) = got
    assert json.loads(raw)["value"] != 0  # NaN survives, for validation to judge


@pytest.mark.parametrize("body", [b"{not json", b'{"a": 1}', b"42", b"", b'[{"a": 1}'])
def test_a_json_body_that_is_not_an_array_is_a_400(body: bytes) -> None:
    with pytest.raises(Refusal) as info:
        records(body, "json", 10)
    assert info.value.status == 400


def test_json_lines_count_blank_lines_in_the_index() -> None:
    body = b'{"a": 1}\n\n  \nnot json\r\n{"b": 2}'
    assert [(i, raw) for i, raw, _ in records(body, "ndjson", 10)] == [
        (0, b'{"a": 1}'),
        (3, b"not json"),
        (4, b'{"b": 2}'),
    ]


def test_an_overlong_line_keeps_its_start_and_size() -> None:
    ((index, raw, size),) = records(b"x" * 100_000, "ndjson", 10)
    assert index == 0 and size == 100_000 and len(raw) < 100_000


def test_more_records_than_the_limit_is_a_413() -> None:
    with pytest.raises(Refusal) as info:
        records(b"[1, 2, 3]", "json", 2)
    assert info.value.status == 413
    with pytest.raises(Refusal):
        records(b"1\n2\n3\n", "ndjson", 2)
    assert len(records(b"1\n2\n", "ndjson", 2)) == 2


def test_token_bucket() -> None:
    now = [0.0]
    bucket = TokenBucket(10, 20, clock=lambda: now[0])
    assert bucket.take(15) == 0
    assert bucket.take(10) == pytest.approx(0.5)  # 5 left: 5 more in 0.5 s
    now[0] = 0.5
    assert bucket.take(10) == 0
    assert bucket.take(21) == float("inf")  # can never fit
    assert TokenBucket(0, 1).take(10**9) == 0  # no limit


def test_bearer_refusal() -> None:
    assert bearer_refusal(None, None) is None
    assert bearer_refusal("Bearer x", None) is None
    assert bearer_refusal(None, TOKEN) == 401
    assert bearer_refusal("Basic abc", TOKEN) == 401
    assert bearer_refusal("Bearer ", TOKEN) == 401
    assert bearer_refusal("Bearer wrong", TOKEN) == 403
    assert bearer_refusal(f"bearer {TOKEN}", TOKEN) is None


def _settings(**collector: object) -> Settings:
    base = Settings()
    return base.model_copy(
        update={
            "kafka": base.kafka.model_copy(update={"bootstrap_servers": f"127.0.0.1:{free_port()}"}),  # nothing there
            "collector": base.collector.model_copy(update={"delivery_timeout_s": 1.0, **collector}),
            "serving": base.serving.model_copy(update={"api_token": SecretStr(TOKEN)}),
            "privacy": base.privacy.model_copy(update={"pseudonymise": False}),  # no Cassandra in unit tests
        }
    )


@pytest.fixture
def client() -> Iterator[TestClient]:
    app = create_app(_settings(max_body_bytes=2048, max_records=5))
    with TestClient(app) as c:
        c.headers["Authorization"] = f"Bearer {TOKEN}"
        yield c


def post(c: TestClient, body: bytes, ctype: str = "application/json", **headers: str) -> tuple[int, dict, dict]:
    r = c.post("/api/v1/events", content=body, headers={"Content-Type": ctype, **headers})
    return r.status_code, r.json(), dict(r.headers)


def test_refusals_before_kafka(client: TestClient) -> None:
    body = json.dumps([EVENT]).encode()
    assert post(client, body, Authorization="")[0] == 401
    assert post(client, body, Authorization="Bearer nope")[0] == 403
    assert post(client, body, "text/csv")[0] == 415
    assert post(client, body, **{"Content-Encoding": "br"})[0] == 415
    assert post(client, b"{nope")[0] == 400
    assert post(client, b'{"a": 1}')[0] == 400
    assert post(client, b"not gzip", **{"Content-Encoding": "gzip"})[0] == 400
    status, answer, _ = post(client, b"[" + b" " * 3000 + b"]")
    assert status == 413 and "collector.max_body_bytes" in answer["detail"]
    status, answer, _ = post(client, gzip.compress(b"[" + b" " * 100_000 + b"]"), **{"Content-Encoding": "gzip"})
    assert status == 413 and "inflates" in answer["detail"]
    assert post(client, json.dumps([EVENT] * 6).encode())[0] == 413
    assert post(client, b"[]") == (200, {"accepted": 0, "rejected": 0, "rejects": []}, post(client, b"[]")[2])


def test_kafka_unreachable_is_a_503_with_retry_after(client: TestClient) -> None:
    status, answer, headers = post(client, json.dumps([EVENT]).encode())
    assert status == 503, answer
    assert headers["retry-after"] == "5"
    metrics = client.get("/metrics").text
    assert 'trends_collector_requests_total{status="503"} 1.0' in metrics
    assert 'trends_collector_events_total{outcome="accepted"} 0.0' in metrics


def test_a_subject_store_that_does_not_answer_is_a_503_and_nothing_is_produced(tmp_path: Path) -> None:
    """Users are pseudonymised on the request's thread: a store failure refuses the request before the producer."""
    base = _settings()
    settings = base.model_copy(
        update={
            "privacy": base.privacy.model_copy(
                update={"pseudonymise": True, "subject_key_file": tmp_path / "missing.key"}
            )
        }
    )
    with TestClient(create_app(settings)) as c:
        c.headers["Authorization"] = f"Bearer {TOKEN}"
        status, answer, headers = post(c, json.dumps([EVENT]).encode())
        assert status == 503 and "subject store" in answer["detail"], answer
        assert headers["retry-after"] == "5"
        assert c.app.state.collector.loop.producer.summary.produced == 0  # type: ignore[attr-defined]
        assert post(c, json.dumps([{k: v for k, v in EVENT.items() if k != "user"}]).encode())[0] == 503  # Kafka


def test_over_the_rate_limit_is_a_429_with_retry_after() -> None:
    app = create_app(_settings(rate_limit_events_s=1.0, rate_limit_burst=3))
    with TestClient(app) as c:
        c.headers["Authorization"] = f"Bearer {TOKEN}"
        assert post(c, json.dumps([EVENT] * 3).encode())[0] == 503  # admitted (then Kafka is not there)
        status, answer, headers = post(c, json.dumps([EVENT] * 2).encode())
        assert status == 429 and "collector.rate_limit_events_s" in answer["detail"]
        assert int(headers["retry-after"]) >= 1
        assert post(c, json.dumps([EVENT] * 4).encode())[0] == 413  # more than a full bucket: never admitted


def test_the_openapi_document_declares_both_body_types_and_every_status() -> None:
    doc = create_app(_settings()).openapi()
    op = doc["paths"]["/api/v1/events"]["post"]
    assert set(op["requestBody"]["content"]) == {"application/json", "application/x-ndjson"}
    assert {"200", "400", "401", "403", "413", "415", "429", "503"} <= set(op["responses"])


def test_a_full_producer_queue_is_a_429_with_retry_after() -> None:
    base = _settings(max_records=1000, delivery_timeout_s=3.0)
    settings = base.model_copy(update={"ingest": base.ingest.model_copy(update={"queue_max_messages": 1000})})
    with TestClient(create_app(settings)) as c:
        c.headers["Authorization"] = f"Bearer {TOKEN}"
        first: list[int] = []
        thread = threading.Thread(target=lambda: first.append(post(c, json.dumps([EVENT] * 1000).encode())[0]))
        thread.start()
        loop = c.app.state.collector._loop()  # type: ignore[attr-defined]
        deadline = time.monotonic() + 2.5  # within the delivery timeout: the first request is still waiting
        while loop.queued() < 1000 and time.monotonic() < deadline:
            time.sleep(0.02)  # the first request's 1000 records fill the queue while Kafka does not answer
        status, answer, headers = post(c, json.dumps([EVENT]).encode())
        thread.join()
    assert status == 429 and "queue is full" in answer["detail"] and headers["retry-after"] == "1"
    assert first == [503]


def test_an_ack_after_the_request_gave_up_is_harmless() -> None:
    encoded = (b"{}", b"k", 0)
    batch = Batch([(0, encoded), (1, encoded)])
    batch.ack(0, Delivery("events"))
    assert not batch.answer.done()
    assert batch.answer.cancel()  # the request timed out on the event loop meanwhile
    batch.ack(1, Delivery("events"))  # the last ack settles nothing, raises nothing
    assert batch.answer.cancelled()

    failed = Batch([(0, encoded), (1, encoded)])
    failed.ack(0, Delivery("events"))
    failed.ack(1, Delivery("events", error="Local: Message timed out"))
    with pytest.raises(DeliveryFailedError):
        failed.answer.result(0)
    ok = Batch([(0, encoded)])
    ok.ack(0, Delivery("events"))
    assert ok.answer.result(0).accepted == 1


def test_a_body_of_tiny_records_is_refused_at_the_limit_not_after_reading_all() -> None:
    began = time.perf_counter()
    with pytest.raises(Refusal) as info:
        records(b"[" + b"1," * 5_000_000 + b"1]", "json", 10_000)  # 10 MB: 5 million elements
    assert info.value.status == 413
    with pytest.raises(Refusal) as info:
        records(b"1\n" * 5_000_000, "ndjson", 10_000)
    assert info.value.status == 413
    assert time.perf_counter() - began < 5  # building 5 million elements first took ~25 s and 320 MB here


@pytest.mark.parametrize(
    ("body", "n"),
    [
        (json.dumps([EVENT, {"a": [1, 2, {"b": "c,d"}]}, "x", 3.5, None, [1, 2]]).encode(), 6),
        (b' \n[ {"a": 1} ,\t{"b": [1, 2]} ] \n', 2),
        (b'[{"value": NaN}, {"value": 1e999}]', 2),
    ],
)
def test_element_by_element_gives_the_same_records(body: bytes, n: int) -> None:
    # With exactly n allowed and at least n commas, the element-by-element reader runs; with more, msgspec's.
    by_element = records(body, "json", n)
    assert by_element == records(body, "json", 10_000)
    assert [raw for _, raw, _ in by_element][-1].endswith(b"}") or b"NaN" not in body
    if b"NaN" not in body:
        assert [json.loads(raw) for _, raw, _ in by_element] == json.loads(body)


@pytest.mark.parametrize("body", [b"[1 2]", b"[1,]", b"[,]", b"[1] x", b"[", b"\xff[1]", b"  "])
def test_element_by_element_refuses_what_is_not_an_array(body: bytes) -> None:
    with pytest.raises(Refusal) as info:
        records(body, "json", 10)
    assert info.value.status == 400


def test_trends_collect_refuses_to_listen_off_loopback_without_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from app.cli import cli

    monkeypatch.delenv("TRENDS_SERVING__API_TOKEN", raising=False)
    for args in (["collect", "--host", "0.0.0.0"], ["ingest", "collect", "--host", "0.0.0.0"]):  # noqa: S104
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, result.output
        assert "TRENDS_SERVING__API_TOKEN" in result.output and "--insecure" in result.output
