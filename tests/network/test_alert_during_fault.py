"""Speed job -> Cassandra black-holed until a real Prometheus fires the alert an operator would get.

The other cases check what the component does during a fault (its exit, its log line, ``trends stack status``,
/metrics); this one checks that someone is told. A Prometheus server (the stack's service, the cached binary)
scrapes the private speed job and evaluates the shipped rules with every ``for:`` cut to a tenth (15 m -> 90 s;
expressions and thresholds unchanged), while the link between the speed job and Cassandra is a black hole and events
keep flowing. One of the speed layer's alerts (stalled, restarting, or its target down) must fire before
the fault has lasted ``ALERT_LIMIT_S``; after the link heals the speed view catches up with every event once, the
stalled and target-down alerts resolve, and the batch layer's answer is exact.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.settings import Settings
from stack.services.prometheus import RULES_FILE, PrometheusService
from tests.helpers import free_port
from tests.network.proxies import SPEED_CASSANDRA_PROXY, Proxies, five_faults, wait_until
from tests.network.table import record
from tests.pipeline import Pipeline

pytestmark = [pytest.mark.network, pytest.mark.services, pytest.mark.spark, pytest.mark.timeout(1500)]

N = 6_000
ALERT_LIMIT_S = 480.0  # TrendsSpeedStalled: 5 min without progress, then its for: (30 s here)
CATCH_UP_LIMIT_S = 420.0
# TrendsSpeedNotFresh is left out: the private pipeline's events are hours old, so it would fire on any lag.
SPEED_ALERTS = {"TrendsSpeedStalled", "TrendsSpeedRestarting"}
RESOLVING = {"TrendsSpeedStalled", "TrendsTargetDown"}  # TrendsSpeedRestarting counts an hour of restarts
SCALE = 10
UNITS = {"s": 1, "m": 60, "h": 3600}


def scaled(duration: str) -> str:
    """Return a Prometheus duration (``15m``, ``2h``, ``0m``) divided by :data:`SCALE`, in seconds."""
    match = re.fullmatch(r"(\d+)([smh])", duration)
    assert match, duration
    return f"{int(match[1]) * UNITS[match[2]] // SCALE}s"


def scaled_rules(target: Path) -> Path:
    doc = yaml.safe_load(RULES_FILE.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["for"] = scaled(rule.get("for", "0s"))
    target.write_text(yaml.safe_dump(doc, sort_keys=False))
    return target


def firing(prom: PrometheusService) -> set[str]:
    """Return the speed layer's firing alerts (its target down included)."""
    url = f"{prom.url}/api/v1/alerts"
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - our loopback Prometheus
        alerts = json.load(resp)["data"]["alerts"]
    out = set()
    for a in alerts:
        name, job = a["labels"]["alertname"], a["labels"].get("job", "")
        if a["state"] == "firing" and (name in SPEED_ALERTS or (name == "TrendsTargetDown" and job == "trends-speed")):
            out.add(name)
    return out


def speed_up(prom: PrometheusService) -> bool:
    query = urllib.parse.urlencode({"query": 'up{job="trends-speed"}'})
    with urllib.request.urlopen(f"{prom.url}/api/v1/query?{query}", timeout=5) as resp:  # noqa: S310
        result = json.load(resp)["data"]["result"]
    return bool(result) and result[0]["value"][1] == "1"


def test_a_black_holed_cassandra_fires_a_speed_alert_on_a_real_prometheus(
    speed_via_proxy: Pipeline, proxies: Proxies, spark: Any, tmp_path: Path
) -> None:
    p = speed_via_proxy
    link, fault = "speed job -> Cassandra", "black hole until an alert fires (Prometheus, for: / 10)"
    (black_hole,) = [inject for name, inject, _ in five_faults(SPEED_CASSANDRA_PROXY, "upstream") if "black" in name]
    watched: Settings = p.speed_settings.model_copy(
        update={
            "data_dir": tmp_path / "prometheus",
            "metrics": p.speed_settings.metrics.model_copy(
                update={
                    "prometheus_port": free_port(),
                    "batch_exporter_port": free_port(),  # not running: only the speed job's alerts are looked at
                    "scrape_interval_s": 1.0,
                    "evaluation_interval_s": 1.0,
                }
            ),
        }
    )
    prom = PrometheusService(watched, rules_file=scaled_rules(tmp_path / "trends.rules.yml"))
    prom.wait_ready(prom.start(""))
    try:
        events = p.make_events(N, "a", random.Random(7))
        speed = p.start_speed()
        p.produce(events[: N // 2], rate=1_000)
        assert wait_until(lambda: speed_up(prom), 120), "Prometheus never scraped the speed job"
        assert p.wait_speed(N // 2) == N // 2
        time.sleep(5)
        assert firing(prom) == set(), "a speed alert fires before any fault"

        black_hole(proxies.api)
        began = time.monotonic()
        flow = threading.Thread(target=p.produce, args=(events[N // 2 :],), kwargs={"rate": 10.0})
        flow.start()  # events keep coming during the fault (300 s of them)
        fired_after = wait_until(lambda: firing(prom), ALERT_LIMIT_S, poll_s=2)
        fired = firing(prom)
        proxies.api.clear(SPEED_CASSANDRA_PROXY)
        fault_s = time.monotonic() - began
        flow.join(timeout=600)

        recovery = wait_until(lambda: p.served_count() >= N, CATCH_UP_LIMIT_S, poll_s=2)
        speed_count = p.served_count()
        resolved_after = wait_until(lambda: not (firing(prom) & RESOLVING), 180, poll_s=2)
        still = firing(prom)
        p.close_window()
        try:
            p.final(spark, f"{link}: {fault}", events)
            batch_ok = True
        except AssertionError:
            batch_ok = False
        behaviour = (
            (
                f"{', '.join(sorted(fired))} fired after {fired_after:.0f} s of the fault"
                if fired_after is not None
                else f"NO speed alert fired in {ALERT_LIMIT_S:.0f} s"
            )
            + f"; job exits {len(speed.exits)}, restarts {speed.restarts}; healed after {fault_s:.0f} s; "
            + (
                f"stalled/target-down resolved {resolved_after:.0f} s after catching up"
                if resolved_after is not None
                else "stalled/target-down still firing 180 s after catching up"
            )
            + (f" (still firing: {', '.join(sorted(still))})" if still else "")
        )
        ok = fired_after is not None and speed_count == N and resolved_after is not None and batch_ok
        counts = f"speed {speed_count:,} of {N:,}; batch {'exact' if batch_ok else 'NOT exact'}"
        record(link, fault, behaviour, recovery, counts, ok)
        assert fired_after is not None, f"no speed alert fired during {ALERT_LIMIT_S:.0f} s of a black hole"
        assert speed_count == N, f"the speed view counts {speed_count} of {N} (more: counted twice)"
        assert resolved_after is not None, f"alerts still firing after the link healed: {still}"
        assert batch_ok, "the batch layer's answer is not exact"
    finally:
        prom.stop()
