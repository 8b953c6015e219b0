"""Forget, export and the erasure ledger against the real Cassandra and Kafka.

Marked ``privacy`` (``make test-privacy``). Each test has its own keyspace and subject key; the export test its own
topic, indexed by the batch layer's indexer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from pydantic import SecretStr

from infra import migrations
from infra.cassandra import session
from infra.errors import AirflowError
from infra.privacy.ledger import Ledger
from infra.privacy.subjects import SubjectStore, ensure_key_file
from infra.settings import Settings
from privacy.cli import privacy
from privacy.erasure import forget, record_recompute, status
from privacy.export import export
from tests.helpers import produce_events
from views.event import Event
from views.indexing.indexer import run_index

pytestmark = [pytest.mark.privacy]

T0 = datetime(2025, 6, 1, tzinfo=UTC)


@pytest.fixture
def psettings(keyspace_settings: Settings, tmp_path: Path) -> Iterator[Settings]:
    """Settings with a fresh keyspace (migrated) and a subject key of this test's own."""
    key = tmp_path / "subject.key"
    ensure_key_file(key)
    s = keyspace_settings.model_copy(
        update={"privacy": keyspace_settings.privacy.model_copy(update={"subject_key_file": key})}
    )
    migrations.migrate(s)
    yield s


def ledger_text(settings: Settings) -> str:
    with session(settings) as sess:
        rows = sess.execute(f"SELECT * FROM {settings.cassandra.keyspace}.privacy_ledger")
        return json.dumps([list(r) for r in rows], default=str)


def entries(settings: Settings) -> int:
    with session(settings) as sess:
        return len(Ledger(settings, sess).entries())


def test_forget_unlinks_at_once_and_answers_repeats(psettings: Settings) -> None:
    with SubjectStore(psettings) as store:
        made = store.pseudonyms(["alice", "bob"])
        store.note_hours([("alice", T0), ("alice", T0 + timedelta(hours=3)), ("bob", T0)])
        first = forget(psettings, "alice", store=store)
        assert first.outcome == "forgotten" and first.request is not None
        assert (first.request.mode, first.request.state, len(first.request.hours)) == ("unlink", "done", 2)
        assert first.entries == [1, 2, 3]
        assert store.lookup("alice") is None and store.hours("alice") == []
        assert store.lookup("bob") == made["bob"]  # nobody else's link is touched

        again = forget(psettings, "alice", store=store)
        assert again.outcome == "already_forgotten" and again.entries == [] and entries(psettings) == 3

        never = forget(psettings, "carol", store=store)  # never seen: answered, and recorded as done
        assert never.outcome == "no_data" and never.request is not None and never.request.state == "done"
        assert never.request.reason == "no_data" and len(never.entries) == 2
        assert forget(psettings, "carol", store=store).outcome == "already_forgotten"

        back = store.pseudonyms(["alice"])["alice"]  # seen again after the forget: a new, unlinked pseudonym
        assert back != made["alice"]
        later = forget(psettings, "alice", store=store)
        assert later.outcome == "forgotten" and later.request is not None
        assert later.request.request_id != first.request.request_id

    with session(psettings) as sess:
        got = Ledger(psettings, sess).verify()
    assert got.ok and got.entries == 8, got
    text = ledger_text(psettings)
    for secret in ("alice", "carol", made["alice"], made["bob"], back):
        assert secret not in text, "the ledger holds an id or a pseudonym"
    assert status(psettings).pending == 0


def test_an_exclusion_whose_recompute_could_not_be_triggered_is_triggered_by_the_next_forget(
    psettings: Settings,
) -> None:
    def airflow_away(_s: Settings, _r: Any) -> list[str]:
        msg = "cannot reach Airflow"
        raise AirflowError(msg)

    with SubjectStore(psettings) as store:
        store.pseudonyms(["fay"])
        store.note_hours([("fay", T0)])
        with pytest.raises(AirflowError):
            forget(psettings, "fay", exclude=True, store=store, trigger=airflow_away)
        (stalled,) = [r for r in status(psettings).requests if r.pending]
        assert (stalled.state, stalled.runs) == ("unlinked", ())  # unlinked and excluded; its recompute waits
        again = forget(psettings, "fay", exclude=True, store=store, trigger=lambda _s, r: [f"manual__{len(r.hours)}"])
        assert again.outcome == "resumed" and again.runs == ["manual__1"]
        assert again.request is not None and again.request.state == "recompute_started"
        assert again.request.request_id == stalled.request_id  # the same request goes on, nothing new
    with session(psettings) as sess:
        assert Ledger(psettings, sess).verify().ok


def test_exclusion_stays_pending_until_recomputed_and_a_second_forget_waits(psettings: Settings) -> None:
    with SubjectStore(psettings) as store:
        pseudonym = store.pseudonyms(["dave"])["dave"]
        store.note_hours([("dave", T0), ("dave", T0 + timedelta(hours=1))])
        asked: list[Any] = []
        result = forget(psettings, "dave", exclude=True, store=store, trigger=lambda _s, r: asked.append(r) or [])
        assert result.outcome == "pending_recompute" and result.request is not None
        assert result.request.state == "unlinked" and result.request.pending
        assert [len(r.hours) for r in asked] == [2]  # the recompute's entry point got the hours, no id
        with session(psettings) as sess:
            assert Ledger(psettings, sess).erased_pseudonyms() == {pseudonym}
        st = status(psettings)
        assert st.pending == 1 and st.oldest_pending_age_s is not None and st.oldest_pending_age_s < 60
        assert "recompute" in (st.requests[0].waiting_for or "")

        record_recompute(psettings, result.request.request_id, "recompute_started", runs=["manual__r1"])
        busy = forget(psettings, "dave", exclude=True, store=store)  # while the recompute runs
        assert busy.outcome == "in_progress" and busy.entries == [] and busy.request is not None
        assert busy.request.runs == ("manual__r1",)
        record_recompute(psettings, result.request.request_id, "recomputed")
        record_recompute(psettings, result.request.request_id, "done")
        assert status(psettings).pending == 0

    with session(psettings) as sess:
        ledger = Ledger(psettings, sess)
        assert ledger.verify().ok
        # an interrupted forget (its first entry written, the process gone) is finished by the next one
        with SubjectStore(psettings) as store:
            store.pseudonyms(["erin"])
            subject = store.subject_hash("erin")
            ledger.append("cut0ff", subject, "unlink", "requested")
            resumed = forget(psettings, "erin", store=store, session=sess)
        assert resumed.outcome == "resumed" and resumed.request is not None
        assert resumed.request.request_id == "cut0ff" and resumed.request.state == "done"
        assert ledger.verify().ok


def test_concurrent_writers_cannot_fork_the_chain(psettings: Settings) -> None:
    def write(n: int) -> list[int]:
        with session(psettings) as sess:
            ledger = Ledger(psettings, sess)
            return [ledger.append(f"w{n}-{i}", "ab" * 32, "unlink", "requested").seq for i in range(8)]

    with ThreadPoolExecutor(4) as pool:
        seqs = [s for got in pool.map(write, range(4)) for s in got]
    assert sorted(seqs) == list(range(1, 33))
    with session(psettings) as sess:
        got = Ledger(psettings, sess).verify()
    assert got.ok and got.entries == 32


def test_the_ledger_command_prints_hashes_and_verify_finds_an_edited_row(psettings: Settings) -> None:
    runner = CliRunner()
    out = runner.invoke(privacy, ["forget", "-"], obj=psettings, input="frank\n")
    assert out.exit_code == 0 and "no data is held" in out.output, out.output
    with SubjectStore(psettings) as store:
        store.pseudonyms(["gina"])
    out = runner.invoke(privacy, ["forget", "gina", "--exclude", "--json"], obj=psettings)
    assert out.exit_code == 0 and json.loads(out.output)["outcome"] == "pending_recompute", out.output
    assert runner.invoke(privacy, ["forget", ""], obj=psettings).exit_code == 2  # an empty id: a usage error

    printed = runner.invoke(privacy, ["ledger"], obj=psettings).output
    assert printed.count("\n") == 4 and "frank" not in printed and "gina" not in printed
    shown = runner.invoke(privacy, ["status"], obj=psettings).output
    assert "1 pending" in shown and "waiting for a recompute" in shown, shown
    ok = runner.invoke(privacy, ["ledger", "--verify"], obj=psettings)
    assert ok.exit_code == 0 and "ledger ok: 4 entries" in ok.output, ok.output

    table = f"{psettings.cassandra.keyspace}.privacy_ledger"
    with session(psettings) as sess:  # someone edits a row: the reason of the first request
        sess.execute(f"UPDATE {table} SET reason = 'edited' WHERE chain = 'erasure' AND seq = 2")
    broken = runner.invoke(privacy, ["ledger", "--verify"], obj=psettings)
    assert broken.exit_code == 1 and "BROKEN at entry 2" in broken.output, broken.output
    with session(psettings) as sess:  # ... or removes the newest entries' predecessor
        sess.execute(f"UPDATE {table} SET reason = 'no_data' WHERE chain = 'erasure' AND seq = 2")
        assert runner.invoke(privacy, ["ledger", "--verify"], obj=psettings).exit_code == 0
        sess.execute(f"DELETE FROM {table} WHERE chain = 'erasure' AND seq = 3")
    gone = runner.invoke(privacy, ["ledger", "--verify"], obj=psettings)
    assert gone.exit_code == 1 and "entry 4 found where entry 3 belongs" in gone.output, gone.output


def test_export_reads_only_the_subjects_hours_and_finds_nothing_after_a_forget(
    psettings: Settings, new_topic: Any, artifacts_dir: Path
) -> None:
    topic = new_topic(partitions=3)
    hours, per_hour, users = 240, 40, [f"u{i}" for i in range(40)]
    with SubjectStore(psettings) as store:
        pseudo = store.pseudonyms([*users, "hank"])
        events, mine = [], []
        for h in range(hours):
            start = T0 + timedelta(hours=h)
            for i in range(per_hour):
                who = users[i % len(users)]
                events.append(Event(ts=start + timedelta(seconds=i * 60), item=f"#t{i % 7}", user=pseudo[who]))
            if h % 48 == 0:  # hank: one event every other day
                e = Event(ts=start + timedelta(minutes=30, seconds=7), item="#hank", user=pseudo["hank"])
                events.append(e)
                mine.append(e)
        store.note_hours([(e.user or "", e.ts) for e in events])
        produce_events(psettings, events, topic=topic)
        run_index(psettings, topic=topic)
        late = Event(ts=T0 + timedelta(hours=2, minutes=5), item="#late", user=pseudo["hank"])
        produce_events(psettings, [late], topic=topic)  # not indexed yet: the tail past the index's checkpoint
        mine.append(late)

        lines: list[bytes] = []
        began = time.monotonic()
        got = export(psettings, "hank", lines.append, topic=topic, store=store)
        took = time.monotonic() - began
        assert got.linked and got.events == len(mine) == len(lines)
        assert {json.loads(v)["id"] for v in lines} == {e.id for e in mine}
        total = len(events) + 1
        assert got.hours == 5 and got.records_read < total / 10  # the hours of the subject, not the whole log
        everyone = export(psettings, "u1", [].append, topic=topic, store=store)  # a user in every hour
        (artifacts_dir / "privacy_export.md").write_text(
            f"export of one subject: {got.hours} hours of {hours} in the log ({total} records, 3 partitions): "
            f"{got.events} events, {got.records_read} records read in {got.ranges} ranges, {took:.2f} s "
            f"({got.phases_s}); a subject in every hour: {everyone.records_read} records read, "
            f"{everyone.seconds:.2f} s\n"
        )

        assert forget(psettings, "hank", store=store).outcome == "forgotten"
        after = export(psettings, "hank", lines.append, topic=topic, store=store)
        assert not after.linked and after.events == 0


def test_the_api_forgets_behind_the_token(psettings: Settings) -> None:
    from app.api import create_app

    token = "privacy-test-token-0123456789"  # noqa: S105 - a throw-away test token
    s = psettings.model_copy(update={"serving": psettings.serving.model_copy(update={"api_token": SecretStr(token)})})
    with SubjectStore(s) as store:
        store.pseudonyms(["ivy"])
    auth = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(s)) as client:
        assert client.post("/api/v1/privacy/forget", json={"user": "ivy"}).status_code == 401
        assert client.get("/api/v1/privacy/status").status_code == 401
        assert client.post("/api/v1/privacy/forget", json={"user": ""}, headers=auth).status_code == 422
        long = client.post("/api/v1/privacy/forget", json={"user": "ivy" * 50}, headers=auth)
        assert long.status_code == 422 and "ivy" not in long.text, long.text  # FastAPI would echo the input
        assert long.json()["detail"][0]["loc"] == ["body", "user"]
        other = client.get("/api/v1/trending?last=1h&min_support=0", headers=auth)  # other routes: FastAPI's 422
        assert other.status_code == 422 and other.json()["detail"][0]["input"] == "0", other.text
        assert client.post("/api/v1/privacy/forget", json={"usr": "ivy"}, headers=auth).status_code == 422
        r = client.post("/api/v1/privacy/forget", json={"user": "ivy", "exclude": True}, headers=auth)
        assert r.status_code == 200 and r.json()["outcome"] == "pending_recompute", r.text
        assert "ivy" not in r.text
        again = client.post("/api/v1/privacy/forget", json={"user": "ivy"}, headers=auth).json()
        assert again["outcome"] == "in_progress"
        st = client.get("/api/v1/privacy/status", headers=auth).json()
        assert st["pending"] == 1 and st["requests"][0]["subject_hash"] == r.json()["subject_hash"]
        assert "/api/v1/privacy/forget" in client.get("/openapi.json").json()["paths"]


def test_trends_serve_forgets_and_the_console_shows_the_requests(
    psettings: Settings, tmp_path: Path, artifacts_dir: Path
) -> None:
    import httpx
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.helpers import chromium, free_port, serve

    s = psettings.model_copy(  # Airflow where nothing listens: the console says so and goes on
        update={"airflow": psettings.airflow.model_copy(update={"api_port": free_port()})}
    )
    with SubjectStore(s) as store:
        store.pseudonyms(["jack", "kate"])
    with serve(s, tmp_path / "serve.log") as url:  # the served app is the composed one: it has the privacy routes
        done = httpx.post(f"{url}/api/v1/privacy/forget", json={"user": "jack"}, timeout=30).json()
        pending = httpx.post(f"{url}/api/v1/privacy/forget", json={"user": "kate", "exclude": True}, timeout=30).json()
        assert (done["outcome"], pending["outcome"]) == ("forgotten", "pending_recompute")
        console = httpx.get(f"{url}/api/v1/console", timeout=60).json()["erasures"]
        assert (console["pending"], console["done"], console["overdue"]) == (1, 1, False)
        assert [r["request_id"] for r in console["requests"]] == [pending["request_id"], done["request_id"]]
        driver = chromium()
        try:
            driver.get(f"{url}/console")
            WebDriverWait(driver, 60).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded"))
            box = driver.find_element(By.ID, "erasures")
            text = box.text
            driver.save_screenshot(str(artifacts_dir / "console_erasures.png"))
            rows = box.find_elements(By.CSS_SELECTOR, "tr[data-request]")
            assert [(r.get_attribute("data-state"), r.get_attribute("data-pending")) for r in rows] == [
                ("unlinked", "true"),
                ("done", "false"),
            ]
        finally:
            driver.quit()
        assert text.startswith("1 pending, oldest 0.0 days (deadline 30 days)"), text
        assert "waits for a recompute of its hours" in text and pending["subject_hash"][:12] in text
        assert "jack" not in text and "kate" not in text
    assert "jack" not in (tmp_path / "serve.log").read_text()
