"""Small helpers shared by service tests."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer

from infra.settings import Settings


def chromium(width: int = 1400, height: int = 2600) -> Any:
    """Return a Selenium driver of Debian's headless Chromium (``make test`` installs it), for the pages' tests."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_bin = shutil.which("chromium"), shutil.which("chromedriver")
    assert browser and driver_bin, "Debian's chromium and chromium-driver are needed (`make test` installs them)"
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(driver_bin))


def wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path, *, status: int = 200, timeout_s: float = 90) -> None:
    """Wait until a ``trends serve`` child answers ``/ready`` with ``status``; fail with its log if it dies first."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/ready", timeout=5).status_code == status:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.3)


def free_port() -> int:
    """Return a loopback port that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def consume_all(settings: Settings, topic: str, expect: int, timeout_s: float = 30) -> list[str]:
    consumer = Consumer(
        {**settings.kafka.client_config(), "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    values: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(values) < expect and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                values.append(msg.value().decode())
    finally:
        consumer.close()
    return values


def speed_drain(settings: Settings, tmp_path: Path, lateness_s: int = 600, **extra: str) -> str:
    """Run the real speed layer over what the topic holds now (same checkpoint each call); ``extra``: more env."""
    overrides = {
        "TRENDS_KAFKA__EVENTS_TOPIC": settings.kafka.events_topic,
        "TRENDS_CASSANDRA__KEYSPACE": settings.cassandra.keyspace,
        "TRENDS_SPEED__QUERY_NAME": settings.speed.query_name,
        "TRENDS_METRICS__SPEED_PORT": "0",
        "TRENDS_SPEED__ALLOWED_LATENESS_S": str(lateness_s),
        "TRENDS_SPARK__CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
        "TRENDS_VIEWS__SLICE_DIMS": json.dumps(settings.views.slice_dims),
        **extra,
    }
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "trends"), "speed", "run", "--available-now"],
        env={**os.environ, **overrides},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr
