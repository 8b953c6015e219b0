"""Producer -> Kafka through Toxiproxy: ``trends ingest file`` while the link to the broker is degraded.

A private broker advertises the proxy in front of it (``proxied_kafka``), so every connection of the producer goes
through the proxy. Each case replays a file of events paced over a minute of event time (``--speed 1``) into a fresh
topic and puts a toxic on the link 10 s in for a while. The run either ends 0 with every event on the topic exactly
once, or ends non-zero with a summary naming what was not delivered — and even then no event is there twice
(the producer is idempotent). The recovery time is how long the run went on past both the healing and the file's
paced end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from infra import topics
from infra.settings import Settings
from infra.settings_env import to_env
from stack.toxiproxy import Toxiproxy
from tests.network.proxies import KAFKA_PROXY, Proxies, five_faults
from tests.network.table import record
from tests.pipeline import read_topic
from views.event import Event

pytestmark = [pytest.mark.network, pytest.mark.services]

LINK = "producer (trends ingest) -> Kafka"
EVENTS = 6000
SPAN_S = 60  # event time of the file; --speed 1 replays it in about as long
FAULT_AT_S = 10.0


CASES = five_faults(KAFKA_PROXY, "upstream", seconds=20.0, reset="upstream")  # the producer writes to the broker


@pytest.mark.parametrize(("fault", "inject", "duration_s"), CASES, ids=[c[0].split(" ")[0] for c in CASES])
def test_ingest_under_fault(
    proxied_kafka: Settings,
    proxies: Proxies,
    tmp_path: Path,
    fault: str,
    inject: Callable[[Toxiproxy], None],
    duration_s: float,
) -> None:
    topic = f"net.ingest.{uuid.uuid4().hex[:8]}"
    topics.ensure_topics(proxied_kafka.kafka, [topics.TopicSpec(topic, 4, 1, {"retention.ms": "-1"})])
    t0 = datetime(2025, 9, 2, 10, tzinfo=UTC)
    step = timedelta(seconds=SPAN_S) / EVENTS
    path = tmp_path / "events.jsonl"
    with path.open("wb") as out:
        for i in range(EVENTS):
            out.write(Event(id=f"p-{i}", ts=t0 + i * step, item=f"#i{i % 50}", user=f"u{i % 700}").to_json() + b"\n")
    env = {**os.environ, **to_env(proxied_kafka)}
    cmd = [str(Path(sys.executable).parent / "trends"), "ingest", "file", str(path)]
    cmd += ["--speed", "1", "--workers", "1", "--no-progress", "--topic", topic]
    healed_at: list[float] = []

    def fault_window() -> None:
        time.sleep(FAULT_AT_S)
        inject(proxies.api)
        time.sleep(duration_s)
        proxies.api.clear(KAFKA_PROXY)
        healed_at.append(time.monotonic())

    injector = threading.Thread(target=fault_window, daemon=True)
    injector.start()
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    ended = time.monotonic()
    injector.join(timeout=duration_s + FAULT_AT_S + 30)
    ids = Counter(json.loads(m.value())["id"] for m in read_topic(proxied_kafka, topic, timeout_s=120))
    twice = sorted(i for i, n in ids.items() if n > 1)
    missing = EVENTS - len(ids)
    # how long the run went on past both the link's healing and the file's paced end (its own length unharmed)
    recovery = max(0.0, ended - max(healed_at[0], started + SPAN_S)) if healed_at else None
    last_lines = " / ".join(line.strip() for line in proc.stderr.strip().splitlines()[-3:])
    if proc.returncode == 0:
        behaviour = "retried within its settings, exit 0"
    else:
        behaviour = f"exit {proc.returncode}: {last_lines[:200]}"
    counts = f"{len(ids):,} of {EVENTS:,} ids on the topic, {len(twice)} twice"
    ok = not twice and (missing == 0 if proc.returncode == 0 else bool(last_lines))
    record(LINK, fault, behaviour, recovery, counts, ok)
    assert not twice, f"events on the topic twice: {twice[:10]}"
    if proc.returncode == 0:
        assert missing == 0, f"exit 0 but {missing} events are not on the topic:\n{proc.stderr[-2000:]}"
    else:
        assert last_lines, "a failed run must say why"
    topics.delete_topics(proxied_kafka.kafka, [topic])
