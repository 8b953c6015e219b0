"""The whole pipeline over TLS: Kafka on SASL_SSL (SCRAM-SHA-512), Cassandra with client encryption and a password.

A private stack of its own (``stack.tls``: a CA and certificates generated at ``stack up``, fixed ports 19110-19122,
a temporary data_dir), started by the same code as ``trends stack up``; the shared stack is used only for the same
run in plaintext. Secrets come from a secrets folder (TRENDS_SECRETS_DIR), and every command runs as an operator
would run it — ``trends ingest generate``, ``trends speed run``, ``trends batch run``, ``trends serve`` — in child
processes whose environments hold no secret. The answers of the API over TLS equal the plaintext stack's for the
same seeded stream. Refusals: a plaintext client, a client without the CA, a wrong password. A second private broker
on SSL alone requires client certificates (mutual TLS), read through librdkafka and Spark's Kafka source; an Airflow
task reaches both services with the settings and secrets files the stack gives Airflow.

Takes several minutes (two stacks' worth of Spark runs): ``make test-tls``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from infra import migrations, topics
from infra.cassandra import ping, ssl_context
from infra.settings import Settings
from infra.settings_env import to_env
from infra.spark import kafka_options
from stack import control
from stack.airflow.config import airflow_executable
from stack.airflow.service import Airflow
from stack.certificates import ensure_stack_tls
from stack.process import child_env
from tests.helpers import VENV, drop_keyspace, iso, run_trends, wait_ready

pytestmark = [pytest.mark.tls, pytest.mark.spark]

TRENDS = str(Path(sys.executable).parent / "trends")
KAFKA_PW = "scram-" + uuid.uuid4().hex
CASSANDRA_PW = "cql-" + uuid.uuid4().hex
TOKEN = "token-" + uuid.uuid4().hex
SECRETS = (KAFKA_PW, CASSANDRA_PW, TOKEN)
H0 = datetime(2025, 9, 14, 6, tzinfo=UTC)
HOUR = timedelta(hours=1)
SEED = 20251
# Ports of the private TLS stack (the range 19100-19199 is this suite's).
KAFKA_PORT, CONTROLLER_PORT, CQL_PORT, STORAGE_PORT, JMX_PORT, API_PORT, PLAIN_API_PORT = range(19110, 19117)
MTLS_KAFKA_PORT, MTLS_CONTROLLER_PORT, AIRFLOW_PORT = 19120, 19121, 19122


@dataclass
class Stack:
    settings: Settings
    env: dict[str, str]  # what the pipeline's commands run with
    api_port: int


@pytest.fixture(scope="module")
def tls_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("tls")
    folder = base / "secrets"
    folder.mkdir(mode=0o700)
    (folder / "TRENDS_KAFKA__SASL_PASSWORD").write_text(KAFKA_PW)
    (folder / "TRENDS_CASSANDRA__PASSWORD").write_text(CASSANDRA_PW + "\n")
    (folder / "TRENDS_SERVING__API_TOKEN").write_text(TOKEN)
    settings = Settings(
        _secrets_dir=folder,
        data_dir=base / "data",
        kafka={
            "bootstrap_servers": f"127.0.0.1:{KAFKA_PORT}",
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "trends",
        },
        cassandra={"port": CQL_PORT, "username": "trends", "keyspace": "trends_tls", "connect_timeout_s": 5.0},
        stack={
            "tls": True,
            "kafka_controller_port": CONTROLLER_PORT,
            "cassandra_storage_port": STORAGE_PORT,
            "cassandra_jmx_port": JMX_PORT,
            "kafka_heap": "384m",
            "cassandra_heap": "512M",
            "cassandra_start_timeout_s": 300.0,
        },
    )
    assert settings.kafka.sasl_password is not None  # read from the folder
    assert settings.cassandra.password is not None and settings.cassandra.password.get_secret_value() == CASSANDRA_PW
    try:
        control.up(settings, ["kafka", "cassandra"])
        topics.ensure_topics(settings.kafka)
        migrations.migrate(settings)
        env = child_env(settings, ("kafka", "cassandra", "serving"), base / "child-secrets")
        yield Stack(settings, env, API_PORT)
    finally:
        control.down(settings, ["kafka", "cassandra"])


@pytest.fixture(scope="module")
def plain_stack(stack_up: Settings) -> Iterator[Stack]:
    run = uuid.uuid4().hex[:10]
    topic, keyspace = f"test.tls.{run}", f"test_tls_{run}"
    settings = stack_up.model_copy(
        update={
            "kafka": stack_up.kafka.model_copy(update={"events_topic": topic}),
            "cassandra": stack_up.cassandra.model_copy(update={"keyspace": keyspace}),
        }
    )
    spec = topics.TopicSpec(topic, settings.kafka.partitions, 1, {"retention.ms": "-1"})
    topics.ensure_topics(settings.kafka, [spec])
    migrations.migrate(settings)
    yield Stack(settings, {**os.environ, **to_env(settings)}, PLAIN_API_PORT)
    drop_keyspace(stack_up, keyspace)
    topics.delete_topics(stack_up.kafka, [topic])


def trends(env: dict[str, str], *args: str, timeout: float = 600) -> str:
    """Run ``trends`` with this environment; return its standard output (the answers compared), failing with both."""
    return run_trends(VENV, env, *args, timeout=timeout, stdout_only=True)


def run_pipeline(target: Stack, work: Path) -> dict[str, Any]:
    """Ingest the seeded stream, drain it through the speed layer, recompute two hours, ask the API."""
    env = {
        **target.env,
        "TRENDS_METRICS__SPEED_PORT": "0",
        "TRENDS_SPEED__ALLOWED_LATENESS_S": "3600",
        "TRENDS_SPARK__CHECKPOINT_ROOT": str(work / "checkpoints"),
        "TRENDS_SERVING__PORT": str(target.api_port),
        "TRENDS_LOG_LEVEL": "WARNING",
    }
    sent = trends(
        env, "ingest", "generate", "--start", iso(H0), "--end", iso(H0 + 3 * HOUR), "--event-rate", "1",
        "--seed", str(SEED), "--items", "300", "--users", "4000", "--fast",
    )  # fmt: skip
    assert "10,800 events" in sent, sent
    trends(env, "speed", "run", "--available-now")
    trends(env, "batch", "run", "--start", iso(H0), "--end", iso(H0 + 2 * HOUR), "--force")
    log = (work / "serve.log").open("w")
    proc = subprocess.Popen([TRENDS, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{target.api_port}"
    token = target.settings.serving.api_token
    headers = {"Authorization": f"Bearer {token.get_secret_value()}"} if token is not None else {}
    try:
        wait_ready(proc, url, work / "serve.log")
        window = {"start": iso(H0 + 30 * timedelta(minutes=1)), "end": iso(H0 + 170 * timedelta(minutes=1))}
        summary = httpx.get(
            f"{url}/api/v1/summary", params={**window, "rank": [0.5, 0.9], "top": 5}, headers=headers, timeout=60
        )
        assert summary.status_code == 200, summary.text
        series = httpx.get(
            f"{url}/api/v1/series",
            params={"start": iso(H0), "end": iso(H0 + 3 * HOUR), "resolution": "hour"},
            headers=headers,
            timeout=60,
        )
        assert series.status_code == 200, series.text
        return {"summary": summary.json(), "series": series.json(), "pid": proc.pid}
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()


def test_pipeline_over_tls_answers_like_plaintext(
    tls_stack: Stack, plain_stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # The commands' environment holds no secret: they read Kafka's and Cassandra's from their secrets folder.
    assert not [k for k, v in tls_stack.env.items() if any(s in v for s in SECRETS)]
    assert Path(tls_stack.env["TRENDS_SECRETS_DIR"]).is_dir()
    tls = run_pipeline(tls_stack, tmp_path_factory.mktemp("tls-run"))
    plain = run_pipeline(plain_stack, tmp_path_factory.mktemp("plain-run"))
    got, want = tls["summary"], plain["summary"]
    assert got["events"] == want["events"] > 0
    assert got["users"] == pytest.approx(want["users"])  # HLL unions are order-independent
    assert [(t["item"], t["lower"], t["upper"]) for t in got["top_items"]] == [
        (t["item"], t["lower"], t["upper"]) for t in want["top_items"]
    ]
    for rank, value in want["quantiles"].items():  # KLL merges may differ by order: within the rank error
        assert got["quantiles"][rank] == pytest.approx(value, rel=0.1), rank
    layers = [(s["layer"], s["resolution"]) for s in got["provenance"]["spans"]]
    assert layers == [(s["layer"], s["resolution"]) for s in want["provenance"]["spans"]]
    assert {layer for layer, _ in layers} == {"batch", "speed"}  # both layers answered over TLS
    assert got["provenance"]["gaps"] == want["provenance"]["gaps"] == []
    assert [p["count"] for p in tls["series"]["points"]] == [p["count"] for p in plain["series"]["points"]]
    assert sum(p["count"] for p in tls["series"]["points"]) == 10_800


class _Kept(logging.Handler):
    """Keep the messages of a logger (librdkafka's, given to a client as its ``logger``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def kafka_refusal(conf: dict[str, Any]) -> str | None:
    """Return what librdkafka reported when a client with ``conf`` could not list the topics (None: it could).

    Its errors come first, as ``NAME: text``, then its log lines.
    """
    kept, log = _Kept(), logging.getLogger(f"tests.tls.refused.{uuid.uuid4().hex}")
    log.addHandler(kept)
    log.setLevel(logging.INFO)  # librdkafka logs a failed connection at level 6 (INFO)
    log.propagate = False
    errors: list[KafkaError] = []
    admin = AdminClient({**conf, "log_level": 6, "logger": log, "error_cb": errors.append})
    try:
        admin.list_topics(timeout=8)
    except KafkaException:
        admin.poll(1)  # serves the error and log callbacks
        return "\n".join([f"{e.name()}: {e.str()}" for e in errors] + kept.lines)
    return None


def test_clients_without_tls_the_ca_or_the_password_are_refused(tls_stack: Stack) -> None:
    settings = tls_stack.settings
    good = {**settings.kafka.client_config(), "socket.timeout.ms": 5000, "log_level": 0}
    assert settings.kafka.events_topic in AdminClient(good).list_topics(timeout=15).topics
    wrong_ca = ensure_stack_tls(settings.data_dir.parent / "another-ca", ["127.0.0.1"]).ca
    # Each client is refused, and for its own reason (as librdkafka reports it), not for a broker that is away.
    unencrypted = r"APIVERSION_QUERY|ApiVersion"  # the TLS listener hangs up on the first, unencrypted, request
    untrusted = r"_SSL: .*SSL handshake failed: .*certificate verify failed"
    refused = {
        "plaintext": ({**good, "security.protocol": "PLAINTEXT"}, unencrypted),
        "SASL without TLS": ({**good, "security.protocol": "SASL_PLAINTEXT"}, unencrypted),
        "no CA": ({k: v for k, v in good.items() if k != "ssl.ca.location"}, untrusted),
        "another CA": ({**good, "ssl.ca.location": str(wrong_ca)}, untrusted),
        "wrong password": (
            {**good, "sasl.password": "not-" + KAFKA_PW},
            r"_AUTHENTICATION: .*SASL authentication error",
        ),
    }
    wrong = {}
    for name, (conf, reason) in refused.items():
        said = kafka_refusal(conf)
        if said is None or not re.search(reason, said):
            wrong[name] = said or "admitted"
    assert wrong == {}

    cas = settings.cassandra
    assert ping(settings, timeout=10)

    def with_cassandra(**update: object) -> Settings:
        return settings.model_copy(update={"cassandra": cas.model_copy(update=update)})

    cases = {
        "plaintext": with_cassandra(ssl=False),  # a plaintext client to the TLS-only port
        "no CA": with_cassandra(ssl_ca_file=None),  # the system's CAs do not know the stack's
        "another CA": with_cassandra(ssl_ca_file=wrong_ca),
        "no password": with_cassandra(password=None),
    }
    assert [name for name, s in cases.items() if ping(s, timeout=5)] == []


def test_trends_config_and_process_environments_never_show_secrets(tls_stack: Stack) -> None:
    shown = trends(tls_stack.env, "config")
    assert json.loads(shown)["kafka"]["sasl_password"] == "**********"  # noqa: S105
    assert not [s for s in SECRETS if s in shown]
    # A running child's environment as the kernel shows it (/proc/<pid>/environ): no secret.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=tls_stack.env)
    try:
        deadline = time.monotonic() + 10
        environ = ""
        while not environ and time.monotonic() < deadline:  # empty until the child has exec'd
            environ = Path(f"/proc/{proc.pid}/environ").read_bytes().decode(errors="replace")
            time.sleep(0.05)
        assert "TRENDS_SECRETS_DIR=" in environ
        assert not [s for s in SECRETS if s in environ]
    finally:
        proc.kill()
        proc.wait()
    files = {p.name: p.read_text() for p in Path(tls_stack.env["TRENDS_SECRETS_DIR"]).iterdir()}
    assert files["TRENDS_KAFKA__SASL_PASSWORD"] == KAFKA_PW
    assert "TRENDS_AIRFLOW__ADMIN_PASSWORD" not in files


def test_hostname_verification_is_on_by_default(tls_stack: Stack) -> None:
    """The nodes' certificate names 127.0.0.1 and localhost: another expected name fails the handshake."""
    ctx = ssl_context(tls_stack.settings.cassandra)
    assert ctx is not None and ctx.check_hostname
    with (
        socket.create_connection(("127.0.0.1", CQL_PORT), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
    with (
        socket.create_connection(("127.0.0.1", CQL_PORT), timeout=10) as raw,
        pytest.raises(ssl.SSLCertVerificationError, match="mismatch"),
    ):
        ctx.wrap_socket(raw, server_hostname="cassandra.example.com")


@pytest.fixture(scope="module")
def mtls_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A private broker on SSL only: clients authenticate with a certificate of the stack's CA (mutual TLS)."""
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("mtls") / "data",
        kafka={"bootstrap_servers": f"127.0.0.1:{MTLS_KAFKA_PORT}", "security_protocol": "SSL", "partitions": 2},
        stack={"tls": True, "kafka_controller_port": MTLS_CONTROLLER_PORT, "kafka_heap": "384m"},
    )
    assert settings.kafka.ssl_certificate_file == settings.tls_dir / "client.pem"
    try:
        control.up(settings, ["kafka"])
        topics.ensure_topics(settings.kafka)
        yield settings
    finally:
        control.down(settings, ["kafka"])


def test_mutual_tls_with_librdkafka_and_spark(mtls_kafka: Settings, spark: Any) -> None:
    settings = mtls_kafka
    topic = settings.kafka.events_topic
    producer = Producer({**settings.kafka.client_config(), "enable.idempotence": True, "acks": "all"})
    for i in range(100):
        producer.produce(topic, key=str(i % 7), value=json.dumps({"n": i}))
    assert producer.flush(30) == 0
    # Without a client certificate the broker refuses the handshake.
    no_cert = {
        k: v
        for k, v in settings.kafka.client_config().items()
        if k not in ("ssl.certificate.location", "ssl.key.location")
    }
    with pytest.raises(KafkaException):
        AdminClient({**no_cert, "socket.timeout.ms": 5000, "log_level": 0}).list_topics(timeout=8)
    # Spark's Kafka source (the Java client) with the certificate, key and CA inline as PEM.
    opts = kafka_options(settings.kafka)
    assert "kafka.ssl.keystore.key" in opts and "kafka.ssl.truststore.certificates" in opts
    frame = (
        spark.read.format("kafka")  # type: ignore[attr-defined]
        .options(**opts)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    values = sorted(json.loads(bytes(r.value))["n"] for r in frame.select("value").collect())
    assert values == list(range(100))
    # The speed job's streaming plan lists the source's options (the UI and explain show it): the key is redacted.
    stream = spark.readStream.format("kafka").options(**opts).option("subscribe", topic).load()  # type: ignore[attr-defined]
    plan = stream._jdf.queryExecution().toString()  # the analyzed plan lists the options
    assert "kafka.ssl.keystore.key=*********(redacted)" in plan
    assert "PRIVATE KEY" not in plan


PROBE_DAG = '''
"""Reach Kafka and Cassandra over TLS from an Airflow task, with the settings of the task's environment."""
from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

from airflow.sdk import dag, task

OUT = Path({out!r})


@dag(dag_id="tls_probe", schedule=None, start_date=datetime(2026, 5, 1, tzinfo=UTC), catchup=False)
def tls_probe():
    @task
    def reach():
        from confluent_kafka.admin import AdminClient

        from infra.cassandra import ping
        from infra.settings import Settings

        settings = Settings()
        topics = AdminClient({{**settings.kafka.client_config(), "log_level": 0}}).list_topics(timeout=20).topics
        doc = {{
            "kafka_protocol": settings.kafka.security_protocol,
            "kafka_topics": sorted(topics),
            "cassandra_ssl": settings.cassandra.ssl,
            "cassandra_ok": ping(settings, timeout=10),
            "secrets_dir": os.environ.get("TRENDS_SECRETS_DIR"),
            "environ": "\\n".join(f"{{k}}={{v}}" for k, v in os.environ.items()),
        }}
        (OUT / "probe.json").write_text(json.dumps(doc))

    reach()


tls_probe()
'''


def test_airflow_tasks_reach_the_tls_services_with_their_secrets_from_files(
    tls_stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("airflow-tls")
    dags, out = root / "dags", root / "out"
    dags.mkdir()
    out.mkdir()
    (dags / "tls_probe.py").write_text(PROBE_DAG.format(out=str(out)))
    base = tls_stack.settings
    settings = base.model_copy(
        update={"airflow": base.airflow.model_copy(update={"api_port": AIRFLOW_PORT, "dags_folder": dags})}
    )
    airflow = Airflow(settings)
    try:
        control.up(settings, ["airflow"])
        env = airflow.process_env()
        assert not [k for k, v in env.items() if any(s in v for s in SECRETS)]
        proc = subprocess.run(
            [str(airflow_executable()), "dags", "test", "tls_probe"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert (out / "probe.json").exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    finally:
        control.down(settings, ["airflow"])
    doc = json.loads((out / "probe.json").read_text())
    assert doc["kafka_protocol"] == "SASL_SSL" and settings.kafka.events_topic in doc["kafka_topics"]
    assert doc["cassandra_ssl"] and doc["cassandra_ok"]
    assert doc["secrets_dir"] == str(airflow.home / "secrets")
    assert not [s for s in SECRETS if s in doc["environ"]]  # the task's environment holds none of them
    held = {p.name for p in (airflow.home / "secrets").iterdir()}
    assert held == {"TRENDS_KAFKA__SASL_PASSWORD", "TRENDS_CASSANDRA__PASSWORD"}  # not the API token
