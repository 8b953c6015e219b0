"""The operator console in headless Chromium, over the real speed layer, batch layer and Cassandra, with faults.

One private topic and keyspace: a historical hour recomputed by the real batch job (and an empty one after it), an
hour before them that nothing computed, then the speed layer's faults injected as ``test_speed_coverage.py`` does —
speed rows expired by a short TTL, speed rows deleted from the view (a lost write), then the checkpoint lost and the
job restarted at ``latest`` on a topic holding history while events arrive. Records removed before indexing are
shown on the console by ``test_batch_loss.py``.
``trends serve`` serves the page; the assertions read the page's DOM text (what an operator reads), and the
screenshots go to ``artifacts/``. Airflow is pointed at a port where nothing listens: the page must say so, not fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer

from batch_layer import job
from infra import migrations
from infra.cassandra import session, table
from infra.settings import Settings
from ingestion.dlq import encode_reject
from ingestion.validate import Reason, Reject
from serving import window
from serving.plan import NO_BATCH_RUN, SPEED_ROWS_GONE, STARTED_AFTER
from serving.reader import ViewReader
from tests.helpers import chromium, free_port, iso, produce_events, serve, speed_drain
from views.buckets import HOUR, MINUTE, floor
from views.event import Event
from views.store.pointers import PointerStore

pytestmark = [pytest.mark.spark, pytest.mark.faults]  # make test-faults (slow: TTLs, restarts, a browser)

TRENDS = str(Path(sys.executable).parent / "trends")
TTL_S = 60  # the speed rows' TTL of the expiry case (the least the setting takes)


def events(start: datetime, minutes: int, per_minute: int, prefix: str) -> list[Event]:
    return [
        Event(id=f"{prefix}{m}-{i}", ts=start + m * MINUTE + timedelta(seconds=i % 60), item=f"#{prefix}{i % 7}",
              user=f"u{i % 40}")
        for m in range(minutes)
        for i in range(per_minute)
    ]  # fmt: skip


def covers(note: str, m: datetime) -> bool:
    """Tell whether a speed note ("HH:MM-HH:MM: why") covers minute ``m`` (of the note's hour)."""
    a, b = (int(t[:2]) * 60 + int(t[3:5]) for t in (note[:5], note[6:11]))
    return a <= m.hour * 60 + m.minute < (b if b > a else b + 24 * 60)


def test_the_console_explains_each_hour_with_the_faults_visible(
    stack_up: Settings,
    new_topic: Callable[..., str],
    keyspace_settings: Settings,
    spark: Any,
    tmp_path: Path,
    artifacts_dir: Path,
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    began = time.monotonic()
    migrations.migrate(keyspace_settings)
    topic, dlq = new_topic(partitions=2), new_topic(partitions=1)
    s = keyspace_settings
    settings = s.model_copy(
        update={
            "kafka": s.kafka.model_copy(update={"events_topic": topic, "dlq_topic": dlq}),
            "speed": s.speed.model_copy(update={"query_name": f"console_{uuid.uuid4().hex[:8]}"}),
            "batch": s.batch.model_copy(update={"lateness_s": 300, "grace_s": 300}),
            "airflow": s.airflow.model_copy(update={"api_port": free_port()}),  # nothing listens there
        }
    )
    checkpoints = tmp_path / "checkpoints"
    env = {
        **os.environ,
        "TRENDS_KAFKA__EVENTS_TOPIC": topic,
        "TRENDS_CASSANDRA__KEYSPACE": settings.cassandra.keyspace,
        "TRENDS_SPEED__QUERY_NAME": settings.speed.query_name,
        "TRENDS_METRICS__SPEED_PORT": "0",
        "TRENDS_SPEED__TRIGGER_SECONDS": "1",
        "TRENDS_SPEED__ALLOWED_LATENESS_S": "3600",
        "TRENDS_SPARK__CHECKPOINT_ROOT": str(checkpoints),
    }
    now = datetime.now(UTC)
    h0 = floor(now, HOUR)
    batch_hour = h0 - 4 * HOUR  # recomputed by the batch job; the hour after it is recomputed empty
    produce_events(settings, events(batch_hour + 10 * MINUTE, 3, 40, "h"))  # 120 events
    # Fault 0: speed rows that expire (a 60 s TTL) in the first hour above the watermark
    e0 = h0 - 2 * HOUR + 20 * MINUTE
    produce_events(settings, events(e0, 3, 30, "e"))
    speed_drain(settings, tmp_path, lateness_s=4 * 3600, TRENDS_SPEED__VIEW_TTL_S=str(TTL_S))
    expired_at = time.monotonic() + TTL_S
    a0 = floor(now, MINUTE) - 30 * MINUTE
    # counted by the speed layer's first epoch, kept for the default TTL
    produce_events(settings, events(a0, 8, 50, "a"))
    speed_drain(settings, tmp_path, lateness_s=3600)
    job.run(settings, batch_hour, batch_hour + 2 * HOUR, spark=spark)

    # Fault 1: three minutes of speed rows gone from the view (what an expired TTL or a lost write leaves)
    lost = [a0 + (2 + i) * MINUTE for i in range(3)]
    with session(settings) as sess:
        for m in lost:
            sess.execute(
                f"DELETE FROM {table(settings, 'speed_minutes')} WHERE query = %s AND slice = '*' AND day = %s "
                "AND bucket_start = %s",
                (settings.speed.query_name, m.date(), m),
            )
    # Fault 2: the checkpoint is lost; events arrive while no job runs; the job restarts at latest
    shutil.rmtree(checkpoints)
    b0 = floor(now, MINUTE) - 12 * MINUTE
    produce_events(settings, events(b0, 4, 50, "b"))  # never read by anyone: a gap, not a zero
    proc = subprocess.Popen(
        [TRENDS, "speed", "run"],
        env={**env, "TRENDS_SPEED__STARTING_OFFSETS": "latest"},
        stdout=(tmp_path / "speed.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 180
        while (initial := next(checkpoints.glob("*/sources/0/0"), None)) is None and time.monotonic() < deadline:
            time.sleep(1)
        assert initial is not None, (tmp_path / "speed.log").read_text()[-3000:]
        c0 = floor(datetime.fromtimestamp(initial.stat().st_mtime, UTC), MINUTE) + MINUTE
        produce_events(settings, events(c0, 2, 50, "c"))
        with session(settings) as sess:
            reader = ViewReader(settings, sess)
            while window.load(reader, c0, c0 + 2 * MINUTE, "*").merged.events < 100:
                assert time.monotonic() < deadline, (tmp_path / "speed.log").read_text()[-3000:]
                time.sleep(2)
            # the job runs on until it has read the whole topic past both minutes: stopped before, what it had
            # read of a minute not yet over would be a gap ("stopped or fell behind"), not the minute
            deadline = time.monotonic() + 240
            while (read_all(reader, settings.speed.query_name) or c0) < c0 + 2 * MINUTE:
                assert time.monotonic() < deadline, (tmp_path / "speed.log").read_text()[-3000:]
                time.sleep(2)
    finally:
        proc.terminate()
        proc.wait(120)
    # Dead letters: two bad times and one malformed line, with the headers ingestion writes
    producer = Producer(settings.kafka.client_config())
    for reason in (Reason.BAD_TIME, Reason.BAD_TIME, Reason.MALFORMED_JSON):
        value, headers, ts = encode_reject(Reject(b"{oops", reason, "test", "console.jsonl", 1, now))
        producer.produce(dlq, value, headers=headers, timestamp=ts)
    assert producer.flush(30) == 0
    time.sleep(max(0.0, expired_at + 2 - time.monotonic()))  # the first run's rows and their hour's keep are past
    setup_s = time.monotonic() - began

    # up to the end of the hour the restarted job's minutes fall in (a run that crosses an hour has one strip more)
    start, end = batch_hour - HOUR, floor(c0 + 2 * MINUTE, HOUR) + HOUR
    with serve(settings, tmp_path / "serve.log") as url:
        answer = httpx.get(f"{url}/api/v1/console", params={"start": iso(start), "end": iso(end)}, timeout=60).json()
        # a range longer than the console's 48 hours has one meaning: its last 48 (issue 29: no schema-valid 400)
        longer = httpx.get(f"{url}/api/v1/console", params={"start": iso(start), "end": iso(start + 49 * HOUR)})
        assert longer.status_code == 200, longer.text
        clamped = longer.json()
        assert len(clamped["hours"]) == 48, len(clamped["hours"])
        assert datetime.fromisoformat(clamped["start"].replace("Z", "+00:00")) == start + HOUR, clamped["start"]
        driver = chromium()
        try:
            driver.get(f"{url}/console?start={iso(start)}&end={iso(end)}")
            WebDriverWait(driver, 60).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded"))
            assert not driver.find_element(By.ID, "error").is_displayed()
            strips = {
                datetime.fromisoformat(e.get_attribute("data-hour")): e
                for e in driver.find_elements(By.CSS_SELECTOR, "#hours .strip")
            }
            assert sorted(strips) == [start + i * HOUR for i in range(int((end - start) / HOUR))]

            def text(hour: datetime) -> str:
                return str(strips[hour].text)

            def speed_notes(m: datetime, state: str) -> list[str]:
                notes = strips[floor(m, HOUR)].find_elements(By.CSS_SELECTOR, f"li[data-state={state}]")
                return [str(n.text) for n in notes]

            # batch: the hour nothing computed is missing and a gap below the boundary; the recomputed ones say so
            assert strips[start].get_attribute("data-batch") == "missing"
            assert f"gap {start:%H:%M}-{start + HOUR:%H:%M}: {NO_BATCH_RUN}" in text(start)
            run_id = answer["hours"][1]["batch"]["run_id"]
            assert strips[batch_hour].get_attribute("data-batch") == "completed"
            assert f"run {run_id[:8]} · 120 events" in text(batch_hour) and "120 events answered" in text(batch_hour)
            assert strips[batch_hour + HOUR].get_attribute("data-batch") == "empty"
            assert "completed with no events" in text(batch_hour + HOUR)
            assert driver.find_element(By.ID, "boundary").text == f"watermark {batch_hour + 2 * HOUR:%Y-%m-%d %H:%M}"
            # speed fault 0: the hour whose rows expired with their TTL is a gap, not the zero its rows now hold
            for m in (e0, e0 + 2 * MINUTE):
                notes = speed_notes(m, "expired")
                assert any(covers(n, m) and SPEED_ROWS_GONE in n for n in notes), (m, notes)
            assert f"gap {e0 - 20 * MINUTE:%H:%M}-{e0 + 40 * MINUTE:%H:%M}: {SPEED_ROWS_GONE}" in text(floor(e0, HOUR))
            assert "0 events answered" in text(floor(e0, HOUR))
            # speed fault 1: the deleted minutes are expired on their strip and gaps of the answer
            for m in lost:
                notes = speed_notes(m, "expired")
                assert any(covers(n, m) and SPEED_ROWS_GONE in n for n in notes), (m, notes)
                assert SPEED_ROWS_GONE in text(floor(m, HOUR))
            # speed fault 2: the minutes nobody read after the checkpoint was lost
            for m in (b0, b0 + 3 * MINUTE):
                notes = speed_notes(m, "started_after")
                assert any(covers(n, m) and STARTED_AFTER in n for n in notes), (m, notes)
                assert f"{STARTED_AFTER}" in text(floor(m, HOUR))
            assert any(n.startswith(f"{c0:%H:%M}-") for n in speed_notes(c0, "covered")), speed_notes(c0, "covered")
            # the answer per hour is the truth of what was served: the lost and unread events are not in it
            served = sum(h["events"] for h in answer["hours"])
            assert served == answer["answer"]["events"] == 120 + 400 - 150 + 100, answer["answer"]
            # around the strips
            assert driver.find_element(By.ID, "airflow").text.startswith("Airflow unreachable")
            reasons = {r.get_attribute("data-reason"): r.text for r in driver.find_elements(By.CSS_SELECTOR, "#dlq tr")}
            assert reasons == {"bad_time": "bad_time 2", "malformed_json": "malformed_json 1"}, reasons
            horizon = answer["horizon"]
            assert len(driver.find_elements(By.CSS_SELECTOR, "#partitions tr")) == 1 + 2
            assert driver.find_element(By.ID, "horizon").text.startswith(horizon["closed_at"].replace("T", " ")[:16])
            assert driver.find_element(By.ID, "losses").text.startswith("none")  # nothing lost on this topic
            assert "reconciliation: none" in text(batch_hour)  # verify has not judged this hour
            assert len(driver.find_elements(By.CSS_SELECTOR, "#epochs tr")) == 1 + 2
            shot = artifacts_dir / "console.png"
            assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 20_000

            # A pin below the watermark: the page says what it moves to the speed view and what is covered there
            with session(settings) as sess:
                PointerStore(settings, sess).pin(batch_hour + HOUR)
            driver.refresh()
            WebDriverWait(driver, 60).until(
                lambda d: (
                    d.find_elements(By.CSS_SELECTOR, f'#hours .strip[data-hour="{iso(batch_hour)}"]')
                    and "pinned" in d.find_element(By.ID, "boundary").text
                )
            )
            pin = str(driver.find_element(By.ID, "pin").text)
            moved = httpx.get(f"{url}/api/v1/console", params={"start": iso(start), "end": iso(end)}).json()
            covered = moved["boundary"]["pin"]["moves_to_speed"]["covered"]
            assert f"60 minutes move to the speed view; {covered} of them are covered there" in pin, pin
            assert (covered == 60) == ("gaps" not in pin)
            empty = driver.find_element(By.CSS_SELECTOR, f'#hours .strip[data-hour="{iso(batch_hour + HOUR)}"]')
            assert "below" not in str(empty.get_attribute("class"))  # the speed view answers it now
            driver.save_screenshot(str(artifacts_dir / "console-pinned.png"))
        finally:
            driver.quit()
    (artifacts_dir / "console.json").write_text(json.dumps(answer, indent=1, default=str))
    print(f"console test: setup {setup_s:.0f} s, total {time.monotonic() - began:.0f} s")


def read_all(reader: ViewReader, query: str) -> datetime | None:
    """Return when the query's newest epoch last read the whole topic (None: not yet)."""
    newest = max(reader.speed_rows.epochs(query), key=lambda e: e.started_at, default=None)
    return newest.read_all_at if newest is not None else None
