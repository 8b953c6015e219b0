"""An ingest process exports delivered events and dead letters by reason, read from the producer's summary."""

from __future__ import annotations

import socket
import urllib.request

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from infra.settings import Settings
from ingestion import metrics
from ingestion.producer import IngestSummary
from ingestion.validate import Reason


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_dead_letters_are_counted_by_reason_from_zero() -> None:
    summary = IngestSummary(sent=990, failed=1, dlq_failed=2)
    summary.invalid["bad_time"] = 7
    summary.invalid["malformed_json"] = 3
    registry = CollectorRegistry()
    registry.register(metrics.IngestCollector(lambda: summary, "file"))
    got = _samples(generate_latest(registry).decode())
    dead = {
        dict(labels)["reason"]: v for (name, labels), v in got.items() if name == "trends_ingest_dead_letters_total"
    }
    assert dead["bad_time"] == 7 and dead["malformed_json"] == 3
    assert set(dead) == {str(r) for r in Reason}  # every reason has a series, at 0 until it happens
    assert dead["future_time"] == 0
    assert got[("trends_ingest_events_sent_total", (("source", "file"),))] == 990
    assert got[("trends_ingest_delivery_failures_total", (("source", "file"), ("topic", "dead_letters")))] == 2
    summary.invalid["bad_time"] += 1  # read on scrape: the next scrape sees the new count
    again = _samples(generate_latest(registry).decode())
    assert again[("trends_ingest_dead_letters_total", (("reason", "bad_time"), ("source", "file")))] == 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_endpoint_serves_while_the_command_runs_and_only_if_asked() -> None:
    summary = IngestSummary(sent=5)
    with metrics.serving(Settings(), lambda: summary, "generate") as port:
        assert port is None  # metrics.ingest_port 0: no endpoint
    wanted = _free_port()
    settings = Settings().model_copy(
        update={"metrics": Settings().metrics.model_copy(update={"ingest_port": wanted, "host": "127.0.0.1"})}
    )
    with metrics.serving(settings, lambda: summary, "generate") as port:
        assert port == wanted
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'trends_ingest_events_sent_total{source="generate"} 5.0' in text
    with socket.socket() as s:  # closed afterwards: nothing listens there any more
        assert s.connect_ex(("127.0.0.1", wanted)) != 0
