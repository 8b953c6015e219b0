"""Records removed before they were indexed, and verify, against real Kafka, Spark, Cassandra and Airflow.

DeleteRecords (what retention does to a partition's oldest segments) removes records the index has not read: the
index records the loss with its offsets and time bound, status shows it, the hours it may touch are incomplete,
their recompute is refused naming the offsets, and ``--accept-loss`` runs them, records it in the lineage, and
clears the mark. The watermark never advances over an incomplete hour. A speed view holding more than the batch
view (the speed layer saw the lost records) fails the hourly DAG's verify task.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from batch_layer import job, offsets, tasks
from infra import migrations
from infra.cassandra import session, table
from infra.dag_contract import dags_folder
from infra.settings import Settings
from stack.airflow.service import Airflow
from tests.helpers import (
    VENV,
    call_trends,
    chromium,
    drop_keyspace,
    free_port,
    iso,
    produce_events,
    serve,
    speed_drain,
)
from views.event import Event
from views.indexing import indexer
from views.store.checks import Checks
from views.store.losses import LossStore
from views.store.pointers import PointerStore

pytestmark = [pytest.mark.spark, pytest.mark.faults]  # make test-faults (slow: TTLs, restarts, a browser)

H0 = datetime(2025, 11, 23, 10, tzinfo=UTC)  # a year ago: historical events
HOUR = timedelta(hours=1)
MS = timedelta(milliseconds=1)


def produce(settings: Settings, partition: int, hour: datetime, n: int, tag: str) -> None:
    events = [
        Event(id=f"{tag}-{i}", ts=hour + timedelta(seconds=i * 53 % 3600), item=f"#i{i % 4}", user=f"u{i % 30}")
        for i in range(n)
    ]
    produce_events(settings, events, partition=partition)


def delete_before(settings: Settings, partition: int, offset: int) -> None:
    """Remove a partition's records before ``offset``, as retention removes its oldest segments."""
    admin = AdminClient(settings.kafka.client_config())
    tp = TopicPartition(settings.kafka.events_topic, partition, offset)
    for future in admin.delete_records([tp]).values():
        future.result(timeout=30)


def timestamp_at(settings: Settings, partition: int, offset: int) -> datetime:
    consumer = Consumer({**settings.kafka.client_config(), "group.id": uuid.uuid4().hex})
    try:
        consumer.assign([TopicPartition(settings.kafka.events_topic, partition, offset)])
        msg = consumer.poll(30)
        assert msg is not None and msg.error() is None and msg.offset() == offset
        return datetime.fromtimestamp(msg.timestamp()[1] / 1000, UTC)
    finally:
        consumer.close()


def env_of(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "TRENDS_KAFKA__EVENTS_TOPIC": settings.kafka.events_topic,
        "TRENDS_CASSANDRA__KEYSPACE": settings.cassandra.keyspace,
        "TRENDS_BATCH__LATENESS_S": str(settings.batch.lateness_s),
        "TRENDS_BATCH__GRACE_S": str(settings.batch.grace_s),
    }


def trends(settings: Settings, *args: str) -> tuple[int, str]:
    """Run the ``trends`` console command as an operator does; return its exit status and output (both streams)."""
    proc = call_trends(VENV, env_of(settings), *args)
    return proc.returncode, proc.stdout + proc.stderr


def runs(settings: Settings, hour: datetime) -> list[Any]:
    with session(settings) as sess:
        return list(sess.execute(f"SELECT * FROM {table(settings, 'batch_runs')} WHERE hour = %s", (hour,)))


@pytest.fixture
def loss_env(keyspace_settings: Settings, new_topic: Callable[..., str]) -> Iterator[Settings]:
    migrations.migrate(keyspace_settings)
    topic = new_topic(partitions=2)
    yield keyspace_settings.model_copy(
        update={
            "kafka": keyspace_settings.kafka.model_copy(update={"events_topic": topic}),
            "batch": keyspace_settings.batch.model_copy(update={"lateness_s": 600, "grace_s": 600}),
        }
    )


def test_records_removed_before_indexing_make_hours_incomplete_until_the_loss_is_accepted(
    loss_env: Settings, spark: Any, tmp_path: Path, artifacts_dir: Path
) -> None:
    settings = loss_env
    topic = settings.kafka.events_topic
    # Hours -3 and -1 are indexed and computed while whole (hour -2 has no run yet: the watermark stops below it).
    produce(settings, 1, H0 - 3 * HOUR, 5, "a")
    produce(settings, 1, H0 - HOUR, 5, "b")
    job.run(settings, hours=[H0 - 3 * HOUR, H0 - HOUR], force=True, spark=spark)
    with session(settings) as sess:
        assert PointerStore(settings, sess).watermark()[:2] == (H0 - 3 * HOUR, H0 - 2 * HOUR)

    # Hour 0 arrives (partition 0: offsets 0..59), then the stream moves on; retention removes partition 0's
    # offsets before 20 before the index has read them.
    produce(settings, 0, H0, 60, "c0")
    produce(settings, 1, H0, 40, "c1")
    for p in (0, 1):
        produce(settings, p, H0 + 3 * HOUR, 1, f"closer{p}")
    survivor = timestamp_at(settings, 0, 20)
    delete_before(settings, 0, 20)

    result = indexer.run_index(settings)
    (loss,) = result.losses
    assert (loss.topic, loss.partition, loss.first_offset, loss.last_offset, loss.records) == (topic, 0, 0, 19, 20)
    assert loss.retention_ms == -1 and loss.oldest_surviving == survivor  # the topic keeps records forever
    assert loss.older_than == survivor + MS and loss.hours_end == H0 + HOUR
    assert "LOST" in result.line() and "offsets 0..19" in result.line()
    with session(settings) as sess:
        (stored,) = LossStore(settings, sess).losses(topic)
        assert stored == loss
        state = sess.execute(
            f"SELECT lost, skipped FROM {table(settings, 'batch_index_state')} WHERE topic = %s AND partition = 0",
            (topic,),
        ).one()
        assert (state.lost, state.skipped) == (20, 0)
        incomplete = LossStore(settings, sess).incomplete(topic, H0 - 4 * HOUR, H0 + 4 * HOUR)
    assert list(incomplete) == [H0 + i * HOUR for i in range(-4, 1)]  # every hour up to the bound's; none after

    code, out = trends(settings, "batch", "status")
    assert code == 0, out
    assert f"{topic} partition 0 offsets 0..19 (20 records" in out
    assert "incomplete" in out and f"{H0 - 2 * HOUR:%Y-%m-%dT%HZ}" in out and f"{H0:%Y-%m-%dT%HZ}" in out
    seen_by_operators(settings)
    seen_on_the_console(settings, tmp_path, artifacts_dir)

    # Its recompute is refused, naming the offsets and the flag; nothing runs.
    start, end = (H0 - 2 * HOUR).isoformat(), (H0 - HOUR).isoformat()
    code, out = trends(settings, "batch", "run", "--start", start, "--end", end)
    assert code == 1, out
    assert "partition 0 offsets 0..19" in out and "--accept-loss" in out, out
    assert runs(settings, H0 - 2 * HOUR) == []
    with pytest.raises(offsets.LossNotAcceptedError):
        tasks.backfill_chunks(settings, H0 - 2 * HOUR, H0 + HOUR)
    # An hour after the bound is whole: it runs.
    (after,) = job.run(settings, H0 + HOUR, H0 + 2 * HOUR, spark=spark)
    assert after.counts["kept"] == 0

    # Accepted for hour -2 (empty): computed, lineage records it; the watermark passes it but stops at hour -1,
    # which completed before the loss was noticed and is incomplete now.
    (accepted,) = job.run(settings, H0 - 2 * HOUR, H0 - HOUR, accept_loss=True, spark=spark)
    (run,) = runs(settings, H0 - 2 * HOUR)
    assert run.status == "completed"
    assert [(x["partition"], x["first_offset"], x["last_offset"]) for x in json.loads(run.accepted_loss)] == [
        (0, 0, 19)
    ]
    assert accepted.watermark == H0 - HOUR
    with session(settings) as sess:
        assert PointerStore(settings, sess).watermark()[:2] == (H0 - 3 * HOUR, H0 - HOUR)

    # `trends batch run --accept-loss` (its own process and Spark session) computes hours -1 and 0 from what is left.
    code, out = trends(
        settings, "batch", "run", "--start", (H0 - HOUR).isoformat(), "--end", (H0 + HOUR).isoformat(), "--accept-loss"
    )
    assert code == 0, out[-4000:]
    (run,) = [r for r in runs(settings, H0) if r.status == "completed"]
    assert run.rows_kept == 80  # 40 of partition 0's 60 survived, and partition 1's 40
    assert json.loads(run.accepted_loss)[0]["first_offset"] == 0
    with session(settings) as sess:
        incomplete = LossStore(settings, sess).incomplete(topic, H0 - 4 * HOUR, H0 + 4 * HOUR)
        assert PointerStore(settings, sess).watermark()[:2] == (H0 - 3 * HOUR, H0 + 2 * HOUR)
    assert list(incomplete) == [H0 - 4 * HOUR, H0 - 3 * HOUR]  # accepted hours are whole again
    code, out = trends(settings, "batch", "status", "--hours", "4")
    assert code == 0 and "accepted loss" in out, out

    # The pin: only a whole hour at or below the watermark; status shows what it moves to the speed view.
    code, out = trends(settings, "batch", "pin", "--at", (H0 + 3 * HOUR).isoformat())
    assert code == 2 and "above the batch watermark" in out, out
    code, out = trends(settings, "batch", "pin", "--at", (H0 + timedelta(minutes=30)).isoformat())
    assert code == 2 and "not a whole hour" in out, out
    code, out = trends(settings, "batch", "pin", "--at", H0.isoformat())
    assert code == 0 and "2 hour(s)" in out, out
    code, out = trends(settings, "batch", "status")
    assert f"the pin serves 2 hour(s) [{H0:%Y-%m-%dT%H:%MZ}, {H0 + 2 * HOUR:%Y-%m-%dT%H:%MZ})" in out, out


def seen_on_the_console(settings: Settings, tmp_path: Path, artifacts_dir: Path) -> None:
    """The console page (``trends serve``, headless Chromium) shows the loss, its bound, and the incomplete hours."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    start, end = H0 - 4 * HOUR, H0 + 2 * HOUR
    with serve(settings, tmp_path / "serve.log") as url:
        driver = chromium()
        try:
            driver.get(f"{url}/console?start={start:%Y-%m-%dT%H:%MZ}&end={end:%Y-%m-%dT%H:%MZ}")
            WebDriverWait(driver, 60).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded"))
            assert not driver.find_element(By.ID, "error").is_displayed()
            losses = str(driver.find_element(By.ID, "losses").text)
            assert losses.startswith("1 loss\n"), losses
            (loss,) = driver.find_elements(By.CSS_SELECTOR, "#losses [data-partition]")
            assert loss.get_attribute("data-partition") == "0"
            assert f"{settings.kafka.events_topic} partition 0 offsets 0..19 (20 records" in loss.text, loss.text
            assert f"the hours before {H0 + HOUR:%Y-%m-%dT%H:%MZ} may miss them" in loss.text, loss.text
            strips = {
                datetime.fromisoformat(e.get_attribute("data-hour")): e
                for e in driver.find_elements(By.CSS_SELECTOR, "#hours .strip")
            }
            assert sorted(strips) == [start + i * HOUR for i in range(6)]
            # the hours computed whole before the loss was noticed are incomplete now; so is the one nothing ran
            for hour in (H0 - 3 * HOUR, H0 - 2 * HOUR, H0 - HOUR, H0):
                assert strips[hour].get_attribute("data-batch") == "incomplete", strips[hour].text
                assert "partition 0 offsets 0..19" in str(strips[hour].get_attribute("title")), hour
            assert strips[H0 + HOUR].get_attribute("data-batch") != "incomplete"  # after the bound: whole
            shot = artifacts_dir / "console-index-loss.png"
            assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 20_000
        finally:
            driver.quit()


def seen_by_operators(settings: Settings) -> None:
    """The loss and its bound in the API's status, the provenance of answers, the console and the metrics."""
    from fastapi.testclient import TestClient

    from batch_layer.exporter import BatchReader
    from serving.api import create_app

    with TestClient(create_app(settings)) as client:
        status = client.get("/api/v1/status").json()
        count = client.get("/api/v1/count", params={"start": iso(H0 - 3 * HOUR), "end": iso(H0 - 2 * HOUR)}).json()
        console = client.get("/api/v1/console", params={"start": iso(H0 - 4 * HOUR), "end": iso(H0 + HOUR)}).json()
    (loss,) = status["losses"]
    assert (loss["partition"], loss["first_offset"], loss["last_offset"], loss["records"]) == (0, 0, 19, 20)
    assert loss["older_than"] and loss["hours_before"] == (H0 + HOUR).isoformat()
    assert any(r["start"] <= iso(H0 - 2 * HOUR) < r["end"] for r in status["incomplete_hours"]), status
    # the hour that completed before the loss was noticed is answered, and said to be incomplete
    (incomplete,) = count["provenance"]["incomplete"]
    assert "partition 0 offsets 0..19" in incomplete["losses"][0], count
    assert len(console["losses"]) == 1
    strips = {h["hour"]: h for h in console["hours"]}
    assert strips[iso(H0 - 3 * HOUR)]["batch"]["state"] == "incomplete", strips[iso(H0 - 3 * HOUR)]
    state = BatchReader(settings).read()
    assert state.lost == {0: 20, 1: 0} or state.lost.get(0) == 20
    assert state.incomplete_hours is not None and state.incomplete_hours >= 2


def test_a_speed_view_beyond_the_bounds_fails_the_hourly_verify(
    stack_up: Settings, new_topic: Callable[..., str], tmp_path: Path, spark: Any
) -> None:
    """The speed layer counted 60 events of an hour; 20 of them were removed before the batch layer indexed them
    and the loss was accepted: the hourly DAG's verify finds the speed view holding more than the batch view, and
    the run fails (``airflow dags test``: the hourly DAG in-process, its recompute through spark-submit)."""
    keyspace = f"test_verify_{uuid.uuid4().hex[:8]}"
    settings = Settings(
        data_dir=tmp_path / "data",
        kafka={"events_topic": new_topic(partitions=1)},
        cassandra={"keyspace": keyspace},
        batch={"lateness_s": 300, "grace_s": 300},
        airflow={"api_port": free_port(), "dags_folder": dags_folder()},
    )
    migrations.migrate(settings)
    try:
        produce(settings, 0, H0, 60, "v")
        speed_drain(settings, tmp_path)
        produce(settings, 0, H0 + 3 * HOUR, 1, "closer")
        delete_before(settings, 0, 20)
        (loss,) = indexer.run_index(settings).losses
        assert (loss.first_offset, loss.last_offset) == (0, 19)
        (accepted,) = job.run(settings, H0, H0 + HOUR, accept_loss=True, spark=spark)
        assert accepted.counts["kept"] == 40

        af = Airflow(settings)
        af.init_db()
        proc = af.cli("dags", "test", "trends_batch", (H0 + HOUR).isoformat(), timeout=600)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 or "state=failed" in out, out[-4000:]
        assert "BEYOND BOUNDS" in out, out[-4000:]
        with session(settings) as sess:
            checks = Checks(settings, sess)
            check, last = checks.of_hour(H0), checks.last()
        assert check is not None and last == check
        assert check.beyond_bound > 0 and check.details["what"] == "events", check
        code, status = trends(settings, "batch", "status")
        assert code == 0 and f"{H0:%Y-%m-%dT%H:%MZ} reconciled" in status and "BEYOND BOUNDS" in status, status
    finally:
        drop_keyspace(stack_up, keyspace)
