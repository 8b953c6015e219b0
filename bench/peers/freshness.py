"""Freshness side by side: produce at one rate, time each sampled event until Cassandra counts it.

A sample is an event time and how many events its minute held when it was produced; it is visible once the
system's global row of that minute counts at least as many. That fits every kind of output: the speed layer
rewrites a minute's row each micro-batch (update mode), the peers write it once, when the window closes (for an
exactly-once sink, at the checkpoint after). The first ``warmup_s`` are not sampled (the system starts and reads
what came before); production goes on after the sampled span, so the last windows close, until every sample is
visible or ``drain_s`` passes (the rest count as lost, ranked after every visible one).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from confluent_kafka import Producer

from bench.speed_bench import event_json
from infra.settings import Settings
from views.event import format_ts

logger = logging.getLogger(__name__)


@dataclass
class Freshness:
    """A freshness run's outcome."""

    latencies: list[float]
    lost: int
    achieved: float

    def pct(self, q: float) -> str:
        """Return a percentile over every sample, a lost one counting as never visible."""
        ranked = sorted(self.latencies) + [float("inf")] * self.lost
        if not ranked:
            return "n/a"
        value = ranked[min(len(ranked) - 1, int(len(ranked) * q))]
        return "lost" if value == float("inf") else f"{value:.2f} s"

    def line(self) -> str:
        """Return the one-line summary printed beside the system."""
        total = len(self.latencies) + self.lost
        return (
            f"p50 {self.pct(0.5)}, p99 {self.pct(0.99)} over {total} samples ({self.lost} lost); "
            f"producer achieved {self.achieved:,.0f} events/s"
        )


def measure(
    settings: Settings,
    topic: str,
    rate: float,
    seconds: float,
    read_counts: Callable[[], dict[int, int]],
    warmup_s: float = 30.0,
    drain_s: float = 120.0,
) -> Freshness:
    """Produce ``rate`` events/s into ``topic`` and time samples until ``read_counts`` (minute -> events) shows them."""
    rng = random.Random(3)
    items = [f"#item{i}" for i in range(2000)]
    weights = [1 / (i + 1) for i in range(len(items))]
    tails = []
    for _ in range(20_000):  # payloads made before the clock starts, as in speed_bench.latency
        body = event_json(rng, 0, datetime.now(UTC), items, weights)
        tails.append(body[body.index(b'","item"') :])
    producer = Producer({**settings.kafka.client_config(), "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    per_minute: dict[int, int] = {}
    samples: list[tuple[float, int, int]] = []  # (wall time produced, minute, events of the minute by then)
    visible: dict[int, float] = {}
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            try:
                counts = read_counts()
            except Exception:
                logger.warning("freshness poll failed", exc_info=True)
                time.sleep(1)
                continue
            now = time.time()
            for n, (_, minute, needed) in enumerate(list(samples)):
                if n not in visible and counts.get(minute, 0) >= needed:
                    visible[n] = now
            time.sleep(0.25)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    t_start = time.monotonic()
    sent, next_sample = 0, warmup_s
    sampled_until = warmup_s + seconds
    sampled_sent, sampled_t = 0, 0.0
    try:
        while True:
            elapsed = time.monotonic() - t_start
            if elapsed > sampled_until and (len(visible) == len(samples) or elapsed > sampled_until + drain_s):
                break
            now = datetime.now(UTC)
            stamp, millis = format_ts(now).encode(), int(now.timestamp() * 1000)
            minute = millis // 60_000 * 60
            due = int(elapsed * rate)
            before = sent
            while sent < due:
                value = b'{"v":1,"id":"f%d","ts":"%s' % (sent, stamp) + tails[sent % len(tails)]
                try:
                    producer.produce(topic, value=value, timestamp=millis)
                except BufferError:
                    producer.poll(0.01)
                    continue
                sent += 1
            per_minute[minute] = per_minute.get(minute, 0) + (sent - before)
            if warmup_s <= elapsed < sampled_until:
                sampled_sent += sent - before
                sampled_t = elapsed - warmup_s
                if sent > before and elapsed >= next_sample:
                    producer.flush(5)  # the sample counts from when the broker has it
                    samples.append((millis / 1000, minute, per_minute[minute]))
                    next_sample += 0.1
            producer.poll(0)
            time.sleep(0.005)
    finally:
        stop.set()
        poller.join(5)
        producer.flush(30)
    latencies = [visible[n] - samples[n][0] for n in range(len(samples)) if n in visible]
    return Freshness(latencies, len(samples) - len(latencies), sampled_sent / sampled_t if sampled_t else 0.0)
