"""Forget, proven on the bytes: after ``trends privacy forget --exclude`` and the Privacy page's operator steps, no
file the stack keeps holds the subject's raw id or the link from it to its pseudonym.

A private Cassandra + Airflow (under the test's tmp folder, so the whole of it can be scanned, drained and restarted)
with the session's Kafka. Events of a few hundred users, a subject X among them, enter through ``trends ingest
file`` (pseudonymised at the first hop); the speed layer, the batch layer through an Airflow backfill and the
erasure's own DAG run over them. Every file of the private stack, the topic's segment files, the speed checkpoint
and the commands' logs are scanned for X's raw id (as text, hex and base64) and for the link: a file holding both
the key the subject store's row is found by (the keyed hash of the id, raw, hex and base64) and the pseudonym. The
link is found before the forget and nowhere after, nor is the key alone (the store's lightweight transactions are
keyed by bucket, so Cassandra's Paxos tracker lists bucket numbers). A control user ingested with pseudonymisation
off is found as text by the same scan (the scan sees raw ids).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import datasketches as ds
import pytest

from infra.airflow.client import AirflowClient
from infra.cassandra import session, table
from infra.dag_contract import ERASURE_DAG
from infra.privacy.subjects import SubjectStore, ensure_key_file
from infra.settings import Settings
from infra.settings_env import to_env
from stack import control
from stack.services.cassandra import Cassandra
from tests.airflow_stack import private_backfill
from tests.helpers import iso

pytestmark = [pytest.mark.spark, pytest.mark.privacy, pytest.mark.timeout(2400)]

TRENDS = str(Path(sys.executable).parent / "trends")
START = datetime(2025, 11, 20, tzinfo=UTC)  # one day, a year ago: closed
HOUR = timedelta(hours=1)
SUBJECT_HOURS = (START + 3 * HOUR, START + 17 * HOUR)
USERS = 300
# the subject store's tables that hold keyed hashes (the months' list holds none)
STORE_TABLES = ("subject_pseudonyms", "subjects", "subject_hours_by_month", "subject_hours")
SKETCH_TABLES = ("batch_minutes", "batch_hours", "batch_days", "speed_minutes")


def forms(raw: bytes) -> dict[str, bytes]:
    """The ways a value may sit in a file: as is, as hex (either case) and as base64 (standard and URL-safe)."""
    b64 = base64.b64encode(raw).rstrip(b"=")
    return {
        "text": raw,
        "hex": raw.hex().encode(),
        "HEX": raw.hex().upper().encode(),
        "base64": b64,
        "base64url": base64.urlsafe_b64encode(raw).rstrip(b"="),
    }


@dataclass
class Scan:
    """What a scan read and found: files, bytes, and hits per (needle, form) with the files that hold them."""

    files: int = 0
    bytes: int = 0
    hits: Counter[str] = field(default_factory=Counter)
    where: dict[str, set[str]] = field(default_factory=dict)

    def found(self, needle: str) -> int:
        return sum(n for k, n in self.hits.items() if k.startswith(needle + ":"))

    def files_with(self, *needles: str) -> set[str]:
        """Return the files holding every one of the needles (in any of their forms)."""
        sets = [{p for k, ps in self.where.items() if k.startswith(n + ":") for p in ps} for n in needles]
        return set.intersection(*sets)

    def line(self) -> str:
        return f"{self.files} files, {self.bytes / 1e6:.1f} MB: hits {dict(self.hits) or 'none'}"


def dump_topics(settings: Settings, topic_names: list[str], out: Path) -> Path:
    """Write every record of the topics, decompressed (keys, values, headers), into one file for the scan.

    The broker's segment files hold producer batches compressed (lz4): a raw id inside one would not show as text
    there, so the scan reads the topics' records as a consumer gets them too.
    """
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {**settings.kafka.client_config(), "group.id": f"bytes-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
    )
    with out.open("wb") as dump:
        for topic in topic_names:
            parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            for p in parts:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                if high <= low:
                    continue
                consumer.assign([TopicPartition(topic, p, low)])
                seen = low
                while seen < high:
                    for m in consumer.consume(1000, 5):
                        if m.error() is None:
                            headers = [h[1] if isinstance(h[1], bytes) else b"" for h in m.headers() or []]
                            dump.write(b"\n".join([m.key() or b"", m.value() or b"", *headers, b""]))
                        seen = max(seen, (m.offset() or 0) + 1)
    consumer.close()
    return out


def scan(roots: list[Path], needles: dict[str, bytes]) -> Scan:
    """Read every regular file under the roots and count the files holding each needle in each of its forms."""
    patterns = {f"{name}:{form}": value for name, raw in needles.items() for form, value in forms(raw).items()}
    longest = max(len(p) for p in patterns.values())
    out = Scan()
    for root in roots:
        for path in [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()):
            try:
                handle = path.open("rb")
            except OSError:  # a file removed while walking (a compaction, a log roll)
                continue
            out.files += 1
            seen: set[str] = set()
            with handle:
                tail = b""
                while chunk := handle.read(1 << 22):
                    out.bytes += len(chunk)
                    window = tail + chunk
                    seen.update(k for k, p in patterns.items() if k not in seen and p in window)
                    tail = window[-(longest - 1) :]
            for key in seen:
                out.hits[key] += 1
                out.where.setdefault(key, set()).add(str(path))
    return out


def run(env: dict[str, str], *args: str, stdin: str | None = None, timeout: float = 600) -> str:
    """Run ``trends <args>``; return its stdout. Its stderr (the log lines) goes to ``$TEST_LOGS/trends.log``,
    which the scan reads with the rest: a command that logged the subject's id would be found."""
    proc = subprocess.run(
        [TRENDS, *args], env=env, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    with Path(env["TEST_LOGS"], "trends.log").open("a") as log:
        log.write(f"$ trends {args[0]} {args[1] if len(args) > 1 else ''}\n{proc.stdout}{proc.stderr}")
    assert proc.returncode == 0, f"trends {' '.join(args[:2])}: {proc.stderr[-3000:]}"
    return proc.stdout


def sketch_tables(sess: Any, keyspace: str) -> set[str]:
    """Return every table of the keyspace holding users' sketches (a new one is scanned without naming it here)."""
    rows = sess.execute(
        "SELECT table_name, column_name FROM system_schema.columns WHERE keyspace_name = %s", (keyspace,)
    )
    return {r.table_name for r in rows if r.column_name == "users_hll"}


def members(settings: Settings, user: str) -> tuple[Counter[str], int]:
    """Count, per table, the stored users' sketches that hold ``user``; return them and the sketches tested.

    Membership is exact only in LIST and SET mode (the sketch keeps each user's 26-bit coupon): adding a member
    leaves the estimate as it was, a non-member raises it. A sketch in HLL mode keeps no user, so it is not tested.
    """
    found: Counter[str] = Counter()
    tested = 0
    with session(settings) as sess:
        names = sketch_tables(sess, settings.cassandra.keyspace)
        assert set(SKETCH_TABLES) <= names, names
        for name in sorted(names):
            for row in sess.execute(f"SELECT users_hll FROM {table(settings, name)}"):
                if row.users_hll is None:
                    continue
                sketch = ds.hll_sketch.deserialize(row.users_hll)
                if "Current Mode   : HLL" in sketch.to_string():
                    continue
                tested += 1
                union = ds.hll_union(12)
                union.update(sketch)
                before = union.get_result().get_estimate()
                union.update(user)
                found[name] += union.get_result().get_estimate() == before
    return found, tested


def test_forget_leaves_no_byte_of_the_subject_or_its_link(stack_up: Settings, tmp_path: Path) -> None:
    subject, control_user = f"subject-{uuid.uuid4().hex}", f"control-{uuid.uuid4().hex}"
    with private_backfill(
        stack_up,
        tmp_path / "stack",
        start=START,
        days=1,
        batch={"chunk_hours": 12, "lateness_s": 600, "grace_s": 600},
        airflow_config={},
        rate=0.002,
    ) as bf:
        settings = bf.settings
        ensure_key_file(settings.subject_key_path)
        env = {
            **os.environ, **to_env(settings), "TRENDS_SPARK__CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
            "TRENDS_METRICS__SPEED_PORT": "0", "TEST_LOGS": str(tmp_path / "logs"),
        }  # fmt: skip
        logs = tmp_path / "logs"
        logs.mkdir()

        # Events of USERS users, the subject's in two hours, through the first hop (pseudonymised).
        lines = [
            {"ts": iso(START + timedelta(seconds=(i * 131) % 86_000)), "item": f"#i{i % 9}",
             "user": f"user-{i % USERS}", "value": i % 50, "dims": {"origin": "JFK" if i % 3 else "LAX"}}
            for i in range(3000)
        ]  # fmt: skip
        lines += [
            {"ts": iso(h + timedelta(minutes=7 * k)), "item": "#secret", "user": subject, "value": 999}
            for h in SUBJECT_HOURS
            for k in range(6)
        ]
        (tmp_path / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        run(env, "ingest", "file", str(tmp_path / "events.jsonl"), "--no-progress")
        control_line = {"ts": iso(START + 5 * HOUR), "item": "#c", "user": control_user}
        run({**env, "TRENDS_PRIVACY__PSEUDONYMISE": "false"}, "ingest", "file", "-", stdin=json.dumps(control_line))
        run(env, "speed", "run", "--available-now", "--no-from-watermark")
        backfill = bf.cli("--start", iso(START), "--end", iso(START + 24 * HOUR), "--wait")
        assert backfill.returncode == 0, backfill.stderr[-3000:]
        (logs / "backfill.log").write_text(backfill.stdout + backfill.stderr)

        with session(settings) as sess:
            store = SubjectStore(settings, sess)
            pseudonym, link_key = store.lookup(subject), store.subject_key(subject)
            assert pseudonym is not None and store.hours(subject) == list(SUBJECT_HOURS)
        exported = run(env, "privacy", "export", subject)
        assert exported.count('"#secret"') == 12, exported[-2000:]
        counted, tested = members(settings, pseudonym)
        assert tested > 100 and sum(counted.values()) > 0  # counted, under its pseudonym

        kafka_dir = stack_up.data_dir / "kafka" / "data"
        roots = [
            settings.data_dir,  # the private Cassandra (data, commit log, hints), Airflow (metadata DB, task logs)
            *kafka_dir.glob(f"{settings.kafka.events_topic}-*"),
            *kafka_dir.glob(f"{settings.kafka.dlq_topic}-*"),
            tmp_path / "checkpoints",
            logs,
        ]
        needles = {
            "subject": subject.encode(), "link": link_key, "pseudonym": pseudonym.encode(),
            "control": control_user.encode(),
        }  # fmt: skip
        topics_now = [settings.kafka.events_topic, settings.kafka.dlq_topic]
        before = scan([*roots, dump_topics(settings, topics_now, tmp_path / "topics-before.bin")], needles)
        print(f"before the forget: {before.line()}")
        assert before.found("subject") == 0, before.where  # never stored raw: pseudonymised at the first hop
        assert before.files_with("link", "pseudonym")  # the subject store's row: key and pseudonym together
        assert before.found("control") > 0  # the scan finds a raw id where one was written
        assert tmp_path / "topics-before.bin" in {Path(p) for p in before.where["pseudonym:text"]}  # records read

        # The forget, in exclusion mode: unlinked at once, the hours recomputed through Airflow, then purged.
        answer = json.loads(run(env, "privacy", "forget", subject, "--exclude", "--json"))
        assert answer["outcome"] == "pending_recompute" and answer["hours"] == 2 and len(answer["runs"]) == 1
        airflow = AirflowClient(settings)
        airflow.wait_run(airflow.token(), ERASURE_DAG, answer["runs"][0], timeout_s=900)
        status = json.loads(run(env, "privacy", "status", "--json"))
        assert status["pending"] == 0 and status["done"] >= 1, status
        assert '"#secret"' not in run(env, "privacy", "export", subject)
        assert sum(members(settings, pseudonym)[0].values()) == 0  # excluded from every stored sketch
        assert sum(members(settings, subject)[0].values()) == 0  # the raw id never was a member
        run(env, "privacy", "ledger", "--verify")

        # The operator's steps of the Privacy page on this one-node stack: flush, drop the deleted data and its
        # tombstones (gc_grace_seconds 0: one node, nothing to repair) and the Paxos state of the store's lightweight
        # transactions, then drain and restart (the commit log).
        node = Cassandra(settings, 0)
        with session(settings) as sess:
            for name in STORE_TABLES:
                sess.execute(f"ALTER TABLE {table(settings, name)} WITH gc_grace_seconds = 0")
        keyspace = settings.cassandra.keyspace
        node.nodetool("flush", keyspace)
        node.nodetool("garbagecollect", "-g", "CELL", keyspace, *STORE_TABLES)
        node.nodetool("repair", "--paxos-only", keyspace, "subject_pseudonyms")  # settles the Paxos tracker
        node.nodetool("flush", "system", "paxos")  # the lightweight transactions' state, keyed by the bucket
        node.nodetool("compact", "system", "paxos")
        node.nodetool("drain")
        control.down(settings, ["cassandra"])
        control.up(settings, ["cassandra"])

        after = scan([*roots, dump_topics(settings, topics_now, tmp_path / "topics-after.bin")], needles)
        print(f"after the forget and the operator's steps: {after.line()}")
        for key, paths in sorted(after.where.items()):
            print(f"  {key}: {sorted(paths)}")
        assert after.found("subject") == 0, after.where
        assert not after.files_with("link", "pseudonym"), after.where  # no file links the key to the pseudonym
        # Not even the key alone (a keyed hash of the id): the Paxos state is keyed by the bucket, not by the subject.
        residue = {p for k, ps in after.where.items() if k.startswith("link:") for p in ps}
        assert not residue, residue
        assert after.found("control") > 0  # the same scan still sees what is there
        with session(settings) as sess:
            assert SubjectStore(settings, sess).lookup(subject) is None
        assert "ledger ok" in run(env, "privacy", "ledger", "--verify")
