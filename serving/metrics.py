"""The API's Prometheus metrics: requests and latency by route, Cassandra up, the caches, gap minutes by reason."""

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from serving.reader import ViewReader

logger = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # set by `trends serve --workers N` (N > 1) to a fresh directory


def multiprocess() -> bool:
    """Tell whether this process is one of several workers whose metrics prometheus_client adds up in files."""
    return bool(os.environ.get(MULTIPROC_ENV))


def forget_dead_workers(directory: str | None = None) -> list[int]:
    """Remove the live-gauge files of workers that died, and return their process ids.

    A ``livesum`` gauge (the caches' bytes) adds every file in the directory, so a worker killed by a signal or the
    OOM killer would be counted at its last value for as long as the server runs, beside the worker uvicorn started
    in its place. prometheus_client leaves this to the server's exit hook (gunicorn's ``child_exit``); uvicorn has
    none, so each scrape does it. Counters keep the dead worker's files: what it counted, it counted.
    """
    directory = directory or os.environ[MULTIPROC_ENV]
    dead: set[int] = set()
    for path in Path(directory).glob("gauge_live*_*.db"):  # prometheus_client: gauge_{mode}_{pid}.db
        digits = path.stem.rsplit("_", 1)[1]
        if digits.isdigit() and not psutil.pid_exists(int(digits)):
            path.unlink(missing_ok=True)  # as mark_process_dead, but two scrapes at once may both find it
            dead.add(int(digits))
    if dead:
        logger.info("metrics: workers %s are gone, their live gauges no longer counted", sorted(dead))
    return sorted(dead)


class CacheMetrics:
    """The caches' sizes and outcomes as Prometheus metrics, brought up to date after each request and on scrape.

    Plain counters and gauges (not a collector reading the caches on scrape): with several workers a scrape is
    answered by one of them, and only metrics written to prometheus_client's files add up across all of them.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.row_bytes = Gauge(
            "trends_api_row_cache_bytes",
            "Bytes of view rows the caches hold (batch rows by run, speed minutes by count; serving.cache_mb).",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.row_hits = Counter(
            "trends_api_row_cache_hits", "View-row reads answered from the cache.", registry=registry
        )
        self.row_misses = Counter("trends_api_row_cache_misses", "View-row reads sent to Cassandra.", registry=registry)
        self.answer_bytes = Gauge(
            "trends_api_answer_cache_bytes",
            "Bytes of merged answers the answer cache holds (serving.answer_cache_mb).",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.answers = Counter(
            "trends_api_answers",
            "Questions by outcome: hit (a lookup), partial (batch part kept, changed speed minutes read), miss.",
            ["outcome"],
            registry=registry,
        )
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def _add(self, name: str, now: int, counter: Any) -> None:
        delta = now - self._seen.get(name, 0)
        if delta > 0:
            counter.inc(delta)
            self._seen[name] = now

    def sync(self, reader: ViewReader | None) -> None:
        """Copy the reader's cache figures into the metrics (counters by what changed since the last call)."""
        if reader is None:
            return
        with self._lock:
            caches = [c for c in (reader.cache, reader.speed_cache) if c is not None]
            self.row_bytes.set(sum(c.bytes for c in caches))
            self._add("row_hits", sum(c.hits for c in caches), self.row_hits)
            self._add("row_misses", sum(c.misses for c in caches), self.row_misses)
            answers = reader.answers
            if answers is not None:
                self.answer_bytes.set(answers.bytes)
                self._add("hit", answers.hits, self.answers.labels("hit"))
                self._add("partial", answers.partial, self.answers.labels("partial"))
                self._add("miss", answers.misses, self.answers.labels("miss"))


@dataclass
class Metrics:
    """Prometheus metrics of one app (own registry, so several apps can live in one process)."""

    registry: CollectorRegistry
    requests: Counter
    latency: Histogram
    cassandra_up: Gauge
    cache: CacheMetrics
    gaps: Gauge

    @classmethod
    def create(cls) -> "Metrics":
        """Register the API's metrics (in this process's files too when several workers serve: :func:`multiprocess`)."""
        reg = CollectorRegistry()
        return cls(
            reg,
            Counter("trends_api_requests", "HTTP requests by route and status.", ["route", "status"], registry=reg),
            Histogram(
                "trends_api_request_seconds",
                "Request latency by route.",
                ["route"],
                buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
                registry=reg,
            ),
            Gauge(
                "trends_api_cassandra_up",
                "1 if the last Cassandra read succeeded.",
                registry=reg,
                multiprocess_mode="mostrecent",
            ),
            CacheMetrics(reg),
            Gauge(
                "trends_api_gap_minutes",
                "Minutes of the last 24 h (slice *) that answers report as gaps, by reason (read on scrape).",
                ["reason"],
                registry=reg,
                multiprocess_mode="mostrecent",
            ),
        )
