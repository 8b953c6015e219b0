"""Faults against the whole pipeline; each case ends exact after the batch layer, with nothing lost.

Run with ``make test-reliability`` (not part of ``make test``). Bounded: every wait has a deadline, every case a few
tens of thousands of events; loopback only.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from app.cli import cli
from infra import topics
from infra.settings_env import to_env
from ingestion.dlq import read_dead_letters
from serving.api import create_app
from stack import control
from tests.helpers import BAD_REQUESTS
from tests.pipeline import HOUR, Pipeline, read_topic
from tests.reliability.table import record
from views.event import Event

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]

N = 30_000


def test_kafka_broker_restart_during_ingest_and_stream(pipeline: Pipeline, spark: Any) -> None:
    rng = random.Random(1)
    events = pipeline.make_events(N, "k", rng)
    pipeline.start_speed()
    restarted = []

    def bounce(sent: int) -> None:
        if sent >= N // 3 and not restarted:
            restarted.append(sent)
            try:
                control.down(pipeline.settings, ["kafka"])
                time.sleep(5)
            finally:
                control.up(pipeline.settings, ["kafka"])

    pipeline.produce(events, rate=2_000, during=bounce)
    pipeline.close_window()
    assert restarted, "the broker was not restarted mid-run"
    speed_count = pipeline.wait_speed(N)
    note = f"speed {speed_count:,} before batch, {pipeline.speed.restarts if pipeline.speed else 0} supervisor restarts"
    pipeline.final(spark, "Kafka broker restart during ingest + stream", events, note)
    assert speed_count == N  # the speed layer alone was exact too


def test_cassandra_down_30s_during_the_stream(pipeline: Pipeline, spark: Any) -> None:
    rng = random.Random(2)
    events = pipeline.make_events(N, "c", rng)
    speed = pipeline.start_speed()
    pipeline.produce(events[: N // 2], rate=3_000)
    control.down(pipeline.settings, ["cassandra"])
    try:
        pipeline.produce(events[N // 2 :], rate=3_000)  # the stream goes on while Cassandra is away
        time.sleep(max(0.0, 30 - N / 2 / 3_000))
    finally:
        control.up(pipeline.settings, ["cassandra"])
    pipeline.close_window()
    speed_count = pipeline.wait_speed(N, timeout_s=420)
    note = f"speed {speed_count:,} before batch, job exits {speed.exits}, supervisor restarts {speed.restarts}"
    pipeline.final(spark, "Cassandra down 30 s during the stream", events, note)
    assert speed_count == N  # no bucket lost or double counted by the speed layer either
    speed.running_job()  # the supervisor kept the job coming back


def test_speed_layer_sigkills(pipeline: Pipeline, spark: Any) -> None:
    """SIGKILL the running job three times while events arrive, each time after it made progress since its restart;
    the shipped supervisor restarts it each time and counts it, and the job exports that count."""
    rng = random.Random(3)
    events = pipeline.make_events(N, "s", rng)
    speed = pipeline.start_speed()
    kills: list[int] = []
    counted = [pipeline.served_count()]  # what the speed view counted at each kill

    def kill(sent: int) -> None:
        if sent >= (len(kills) + 1) * N // 4 and len(kills) < 3:
            # a kill mid-work, not during start-up: the run being killed has written something new
            deadline = time.monotonic() + 240
            while pipeline.served_count() <= counted[-1] and time.monotonic() < deadline:
                time.sleep(1)
            time.sleep(rng.uniform(0, 2))
            speed.kill()
            kills.append(sent)
            counted.append(pipeline.served_count())

    pipeline.produce(events, rate=1_500, during=kill)
    pipeline.close_window()
    assert len(kills) == 3
    speed_count = pipeline.wait_speed(N, timeout_s=420)
    restarts, exits, exported = speed.restarts, speed.exits, speed.exported_restarts()
    note = (
        f"3 SIGKILLs (speed view at {counted[1]:,}, {counted[2]:,}, {counted[3]:,}); supervisor restarts {restarts}, "
        f"exits {exits}, trends_speed_restarts_total {exported}; speed {speed_count:,} before batch"
    )
    pipeline.final(spark, "speed layer SIGKILL x3", events, note)
    assert speed_count == N
    assert counted[1] < counted[2] < counted[3]  # every kill hit a run that had made progress
    assert restarts == 3 and exits == [-9, -9, -9]  # restarted by the shipped supervisor, once per kill
    assert exported == 3  # what an operator sees on the job's /metrics


def test_duplicates_and_late_events(pipeline: Pipeline, spark: Any) -> None:
    rng = random.Random(4)
    events = pipeline.make_events(N, "d", rng)
    pipeline.start_speed()
    dupes = events[::10]  # re-sent by a retrying client: same ids, within the watermark
    late = pipeline.make_events(500, "late", rng)[:500]  # spread over the window, sent after it: too late for speed
    pipeline.produce(events + dupes, rate=3_000)
    speed_count = pipeline.wait_speed(N)
    pipeline.produce(late)
    pipeline.close_window()
    time.sleep(5)
    speed_after = pipeline.served_count()
    pipeline.events = []
    note = f"{len(dupes):,} duplicates, {len(late)} late; speed {speed_after:,} (late dropped), batch adds them"
    pipeline.final(spark, "duplicates and late events", events + late, note)
    assert speed_count == N and speed_after < N + len(late)


BAD_INPUTS: list[tuple[bytes, str]] = [
    (b'{"id": "x", "ts": "2025-11-22T10:00:00Z", "item": "#x"', "malformed_json"),
    (b"[1, 2]", "malformed_json"),
    (b"null", "malformed_json"),
    (b'"a string"', "malformed_json"),
    (b"42", "malformed_json"),
    (b"{}", "missing_field"),
    (b'{"id": "no-item", "ts": "2025-11-22T10:00:00Z"}', "missing_field"),
    (b'{"id": "no-ts", "item": "#x"}', "missing_field"),
    (b'{"id": "null-item", "ts": "2025-11-22T10:00:00Z", "item": null}', "missing_field"),
    (b'{"id": "typed", "ts": "2025-11-22T10:00:00Z", "item": "#x", "value": "fast"}', "invalid_field"),
    (b'{"id": "bool", "ts": "2025-11-22T10:00:00Z", "item": "#x", "value": true}', "invalid_field"),
    (b'{"id": "empty", "ts": "2025-11-22T10:00:00Z", "item": ""}', "invalid_field"),
    (b'{"id": "dims", "ts": "2025-11-22T10:00:00Z", "item": "#x", "dims": [1]}', "invalid_field"),
    (b'{"id": "nest", "ts": "2025-11-22T10:00:00Z", "item": "#x", "dims": {"a": {"b": 1}}}', "invalid_field"),
    (b'{"id": "when", "ts": "around noon", "item": "#x"}', "bad_time"),
    (b'{"id": "naive", "ts": "2025-11-22T10:00:00", "item": "#x"}', "bad_time"),
    (b'{"id": "year1", "ts": "0001-01-01T00:00:00Z", "item": "#x"}', "bad_time"),
    (b'{"id": "future", "ts": "2099-01-01T00:00:00Z", "item": "#x"}', "future_time"),
    (b'{"id": "nan", "ts": "2025-11-22T10:00:00Z", "item": "#x", "value": NaN}', "non_finite"),
    (b'{"id": "inf", "ts": "2025-11-22T10:00:00Z", "item": "#x", "value": Infinity}', "non_finite"),
    (b'{"id": "e400", "ts": "2025-11-22T10:00:00Z", "item": "#x", "value": 1e400}', "non_finite"),
    (b'{"id": "long", "ts": "2025-11-22T10:00:00Z", "item": "' + b"i" * 1000 + b'"}', "oversize_field"),
    (b'{"id": "' + b"i" * 1000 + b'", "ts": "2025-11-22T10:00:00Z", "item": "#x"}', "oversize_field"),
    (b'{"id": "latin1", "ts": "2025-11-22T10:00:00Z", "item": "caf\xe9"}', "not_utf8"),
    ('{"id": "u16", "ts": "2025-11-22T10:00:00Z", "item": "#x"}'.encode("utf-16"), "not_utf8"),
    (b'{"v": 2, "id": "v2", "ts": "2025-11-22T10:00:00Z", "item": "#x"}', "unsupported_version"),
]


def test_bad_input_corpus_through_ingestion_and_the_api(pipeline: Pipeline, tmp_path: Path) -> None:
    """Every good line of a file interleaved with bad ones reaches the events topic, exactly and once, and every bad
    line reaches the dead-letter topic with its reason, its line number and its original bytes; ``trends ingest
    file`` exits 0 (1 would mean "not all delivered")."""
    s = pipeline.settings
    good: list[Event] = []
    bad: dict[int, tuple[bytes, str]] = {}  # line number -> (raw bytes, reason)
    lines: list[bytes] = []
    for i, (raw, reason) in enumerate(BAD_INPUTS):
        ts = datetime(2025, 11, 22, 10, i, tzinfo=UTC)
        e = Event(id=f"good-{i}", ts=ts, item=f"#ok{i % 3}", user=f"u{i}", value=i)
        good.append(e)
        lines.append(json.dumps(e.to_dict()).encode())
        lines.append(raw)
        bad[len(lines)] = (raw, reason)
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    dlq = f"{s.kafka.events_topic}.dlq"
    topics.ensure_topics(s.kafka, [topics.TopicSpec(dlq, 1, 1, {"retention.ms": "-1"})])
    try:
        result = CliRunner().invoke(
            cli,
            ["ingest", "file", str(path), "--topic", s.kafka.events_topic, "--dlq-topic", dlq],
            env=to_env(s),
            catch_exceptions=False,
        )
        records = read_topic(s, s.kafka.events_topic)
        letters = list(read_dead_letters(s, dlq, timeout_s=30))
    finally:
        topics.delete_topics(s.kafka, [dlq])
    # the events topic holds exactly the good events, as ingestion normalizes them, keyed and timestamped
    key_field = s.ingest.key_field
    want_events = Counter((e.key(key_field), e.to_json(), e.ts_ms) for e in good)
    got_events = Counter((r.key(), r.value(), r.timestamp()[1]) for r in records)
    delivered = sum(1 for rec, n in got_events.items() if n == 1 and rec in want_events)
    # the dead-letter topic holds each bad line once, with its reason and its exact bytes
    want_letters = Counter((line, raw, reason) for line, (raw, reason) in bad.items())
    got_letters = Counter((x.line, x.raw, x.reason) for x in letters)
    dead_lettered = sum(1 for rec, n in got_letters.items() if n == 1 and rec in want_letters)
    ok = result.exit_code == 0 and got_events == want_events and got_letters == want_letters
    note = (
        f"{len(BAD_INPUTS)} kinds, exit {result.exit_code}: {delivered}/{len(good)} good events read back from the "
        f"topic, {dead_lettered}/{len(bad)} bad lines in the DLQ with their reason"
    )
    record("bad inputs through ingestion", len(lines), delivered + dead_lettered, ok, note)
    assert result.exit_code == 0, result.output
    assert len(records) == len(good), (len(records), result.output)
    assert got_events == want_events
    assert Counter(x.reason for x in letters) == Counter(r for _, r in BAD_INPUTS)
    assert got_letters == want_letters

    statuses = []
    with TestClient(create_app(s)) as client:
        for path_, status, fragment in BAD_REQUESTS:
            r = client.get(path_)
            statuses.append(r.status_code == status and fragment in json.dumps(r.json()["detail"]))
    record("bad requests through the API", len(BAD_REQUESTS), sum(statuses), all(statuses), "each a 4xx + message")
    assert all(statuses)


def cassandra_tasks(af: Any, token: str) -> list[dict[str, Any]]:
    """Return the task instances of the backfill runs that need Cassandra (the sensor indexes into it)."""
    out = []
    for r in af.get(token, "/api/v2/dags/trends_batch/dagRuns?limit=100")["dag_runs"]:
        if not r["dag_run_id"].startswith("backfill"):
            continue
        try:
            tis = af.get(token, f"/api/v2/dags/trends_batch/dagRuns/{quote(r['dag_run_id'], safe='')}/taskInstances")
        except OSError:
            continue
        out += [ti for ti in tis["task_instances"] if ti["task_id"] in {"wait_until_closed", "plan", "recompute"}]
    return out


def test_airflow_task_failure_and_retry(pipeline: Pipeline, tmp_path: Path) -> None:
    """Cassandra is down when the DAG's runs start: the first task needing it (the sensor's indexing) fails, Airflow
    retries it, the retry succeeds and the hours are exact."""
    from serving import queries, window
    from serving.reader import ViewReader
    from stack.airflow.config import AirflowConfig
    from tests.helpers import free_port

    rng = random.Random(6)
    events = pipeline.make_events(N // 3, "a", rng)
    pipeline.produce(events)
    pipeline.close_window()
    dags = Path(__file__).resolve().parents[2] / "dags"
    s = pipeline.settings
    af_settings = s.model_copy(
        update={
            "data_dir": tmp_path / "airflow-data",
            "airflow": s.airflow.model_copy(update={"api_port": free_port(), "dags_folder": dags}),
        }
    )
    af = AirflowConfig(af_settings).client()
    starts = [pipeline.window[0], pipeline.window[0] + HOUR]
    control.up(af_settings, ["airflow"])
    try:
        token = af.token()
        af.wait_dag(token, "trends_batch")
        control.down(s, ["cassandra"])
        try:
            AirflowConfig(af_settings).backfill("trends_batch", starts[0], starts[-1])
            deadline, failed_tries = time.monotonic() + 300, False
            while not failed_tries and time.monotonic() < deadline:
                failed_tries = any(ti["state"] == "up_for_retry" for ti in cassandra_tasks(af, token))
                time.sleep(3)
            assert failed_tries, "no task failed while Cassandra was down"
        finally:
            control.up(s, ["cassandra"])
        af.wait_runs(token, "trends_batch", starts, timeout_s=900)
        tries = [ti["try_number"] for ti in cassandra_tasks(af, token)]
    finally:
        control.down(af_settings, ["airflow"])
    from infra.cassandra import session

    with session(s) as sess:
        w = window.load(ViewReader(s, sess), *pipeline.window, "*")
    got = queries.summary(w)
    batch_only = all(p["layer"] == "batch" for p in got.provenance.spans) and not got.provenance.gaps
    ok = got.events == len(events) and batch_only and max(tries) >= 2
    record("Airflow task failure and retry", len(events), got.events, ok, f"task tries {sorted(tries)}")
    assert max(tries) >= 2 and got.events == len(events) and batch_only
