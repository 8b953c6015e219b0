"""Prometheus metrics of a long-running ingest command: events delivered, dead letters by reason, failures.

The producer already counts everything in its :class:`~ingestion.producer.IngestSummary`; the collector reads
that summary on each scrape, so nothing is counted twice. A command serves it on ``metrics.host`` and
``metrics.ingest_port`` when that port is set (0, the default, serves nothing: short runs need no endpoint, and
concurrent ingest processes each need their own port).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from infra.settings import Settings
from ingestion.validate import Reason

if TYPE_CHECKING:
    from ingestion.producer import IngestSummary

logger = logging.getLogger(__name__)

# name -> help of every metric an ingest process exports (the alert rules' unit test checks they exist).
COUNTERS = {
    "trends_ingest_events_sent_total": "Events acknowledged by the broker on the events topic (acks=all).",
    "trends_ingest_dead_letters_total": "Records handed to the dead-letter topic, by reason (invalid, refused).",
    "trends_ingest_delivery_failures_total": "Records whose delivery failed, by topic (events, dead letters).",
}


class IngestCollector(Collector):
    """Reads the producer's running summary on every scrape."""

    def __init__(self, summary: Callable[[], IngestSummary], source: str) -> None:
        self.summary = summary
        self.source = source  # the command (generate, file, kafka): a label, so two processes' series never mix

    def collect(self) -> Iterator[Metric]:
        """Yield the counters of the summary so far."""
        s = self.summary()
        sent = CounterMetricFamily(
            "trends_ingest_events_sent", COUNTERS["trends_ingest_events_sent_total"], labels=["source"]
        )
        sent.add_metric([self.source], s.sent)
        yield sent
        dead = CounterMetricFamily(
            "trends_ingest_dead_letters", COUNTERS["trends_ingest_dead_letters_total"], labels=["source", "reason"]
        )
        # Every known reason from 0, so the first dead letter of a kind shows in rate() instead of starting a series.
        counts = {str(r): 0 for r in Reason} | dict(s.invalid)
        for reason, count in sorted(counts.items()):
            dead.add_metric([self.source, reason], count)
        yield dead
        failed = CounterMetricFamily(
            "trends_ingest_delivery_failures",
            COUNTERS["trends_ingest_delivery_failures_total"],
            labels=["source", "topic"],
        )
        failed.add_metric([self.source, "events"], s.failed)
        failed.add_metric([self.source, "dead_letters"], s.dlq_failed)
        yield failed


@contextmanager
def serving(settings: Settings, summary: Callable[[], IngestSummary], source: str) -> Iterator[int | None]:
    """Serve the ingest metrics while the block runs (when ``metrics.ingest_port`` is set); yield the port."""
    port = settings.metrics.ingest_port
    if not port:
        yield None
        return
    registry = CollectorRegistry()
    registry.register(IngestCollector(summary, source))
    server, thread = start_http_server(port, addr=settings.metrics.host, registry=registry)
    logger.info("ingest metrics on http://%s:%s/metrics", settings.metrics.host, port)
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
