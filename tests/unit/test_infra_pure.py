"""Pure parts of infra: jar names, migration discovery, config rendering, port and Java checks."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from infra import jars, migrations
from infra.errors import MigrationError, StackError
from infra.settings import Settings
from stack import control
from stack.process import PidFile, ensure_port_free
from stack.services.base import find_java
from stack.services.cassandra import Cassandra
from stack.services.kafka import Kafka


def test_artifact_names() -> None:
    assert jars.artifact_name("spark-sql-kafka-0-10_2.13-4.2.0.jar") == "spark-sql-kafka-0-10_2.13"
    assert jars.artifact_name("kafka-clients-3.9.2.jar") == "kafka-clients"
    assert jars.artifact_name("scala-library-2.13.15.jar") == "scala-library"
    assert jars.artifact_name("log4j-slf4j2-impl-2.25.4.jar") == "log4j-slf4j2-impl"


def test_bundles_pin_the_verified_versions() -> None:
    assert "<version>4.3.1</version>" in jars.KAFKA.pom.read_text()
    assert "kafka-tools" in jars.KAFKA.pom.read_text()
    assert "<version>5.0.8</version>" in jars.CASSANDRA.pom.read_text()
    assert "spark-sql-kafka-0-10_2.13</artifactId><version>4.2.0" in jars.SPARK_KAFKA.pom.read_text()
    assert "spark-avro_2.13</artifactId><version>4.2.0" in jars.SPARK_AVRO.pom.read_text()
    assert jars.SPARK_AVRO.skip_jars_shipped_by_pyspark  # avro itself comes with pyspark: a second copy would clash


def test_spark_avro_goes_on_the_jobs_jars_only_for_avro_events() -> None:
    base = Settings()
    avro = base.model_copy(update={"kafka": base.kafka.model_copy(update={"events_format": "avro"})})
    assert jars.job_bundles(base) == [jars.SPARK_KAFKA]
    assert jars.job_bundles(avro) == [jars.SPARK_KAFKA, jars.SPARK_AVRO]


def test_shipped_migrations_are_well_formed() -> None:
    found = migrations.discover()
    assert [m.version for m in found] == sorted({m.version for m in found})
    assert found[0].version == 1
    for mig in found:
        assert mig.statements(), mig.path
        for stmt in mig.statements():  # each re-runnable: a migration cut off half-way is applied again
            upper = stmt.upper()
            rerunnable = "IF NOT EXISTS" in upper or (upper.startswith("DROP") and " IF EXISTS " in upper)
            assert rerunnable or upper.startswith(("ALTER", "INSERT")), stmt


def test_migration_discovery_rejects_bad_names_and_duplicates(tmp_path: Path) -> None:
    (tmp_path / "0001_a.cql").write_text("CREATE TABLE IF NOT EXISTS a (k int PRIMARY KEY);")
    (tmp_path / "0002_b.cql").write_text(
        "-- comment; with a semicolon\nCREATE TABLE IF NOT EXISTS b (k int PRIMARY KEY);"
    )
    assert [m.name for m in migrations.discover(tmp_path)] == ["a", "b"]
    assert migrations.discover(tmp_path)[1].statements() == ["CREATE TABLE IF NOT EXISTS b (k int PRIMARY KEY)"]
    (tmp_path / "0002_c.cql").write_text("")
    with pytest.raises(MigrationError, match="two migrations with version 2"):
        migrations.discover(tmp_path)
    (tmp_path / "0002_c.cql").unlink()
    (tmp_path / "3_bad.cql").write_text("")
    with pytest.raises(MigrationError, match="NNNN_snake_case"):
        migrations.discover(tmp_path)


def test_kafka_config_renders_kraft_single_node(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path, kafka={"bootstrap_servers": "127.0.0.1:19092"}, stack={"kafka_controller_port": 9093}
    )
    kafka = Kafka(settings)
    kafka.conf_dir.mkdir(parents=True)
    text = kafka.render_config().read_text()
    assert "listeners=PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:9093" in text
    assert "process.roles=broker,controller" in text
    assert f"log.dirs={tmp_path / 'kafka' / 'data'}" in text
    assert "$" not in text


def test_cassandra_config_renders_commitlog_mode(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, cassandra={"port": 19042}, stack={"cassandra_commitlog_sync": "group"})
    cas = Cassandra(settings)
    cas.conf_dir.mkdir(parents=True)
    text = cas.render_config().read_text()
    assert "native_transport_port: 19042" in text
    assert "commitlog_sync: group" in text and "commitlog_sync_group_window: 15ms" in text
    assert "$" not in text.replace("${", "")


def test_cassandra_start_clears_only_the_compaction_log(tmp_path: Path) -> None:
    """Cassandra 5.0 rewrites all of ``system.compaction_history`` at each start: the stack starts it empty."""
    cas = Cassandra(Settings(data_dir=tmp_path))
    system = cas.home / "data" / "data" / "system"
    history = system / "compaction_history-b4dbb7b4dc493fb5b3bfce6e434832ca"
    peers = system / "peers_v2-c4325fbb8e5e3bafbd070f9250ed818e"
    for table in (history, peers):
        (table / "backups").mkdir(parents=True)
        (table / "nb-1-big-Data.db").write_bytes(b"x" * 1000)
        (table / "nb-1-big-TOC.txt").write_bytes(b"x" * 24)
    assert cas.clear_compaction_history() == 1024
    assert [p.name for p in history.iterdir()] == ["backups"]
    assert sorted(p.name for p in peers.iterdir()) == ["backups", "nb-1-big-Data.db", "nb-1-big-TOC.txt"]
    assert cas.clear_compaction_history() == 0


def test_taken_port_gives_a_clear_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(StackError, match=rf"port 127.0.0.1:{port} is already taken .*TRENDS_X"):
            ensure_port_free("127.0.0.1", port, "kafka (clients)", "TRENDS_X")


def test_missing_java_gives_a_clear_error(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, stack={"java_home": tmp_path / "no-jdk"})
    with pytest.raises(StackError, match="Java was not found"):
        find_java(settings)


def test_status_of_a_never_started_stack(tmp_path: Path) -> None:
    for st in control.status(Settings(data_dir=tmp_path)):
        assert st.state == "stopped" and st.pid is None


def test_stale_pid_file_is_ignored(tmp_path: Path) -> None:
    kafka = Kafka(Settings(data_dir=tmp_path))
    kafka.home.mkdir(parents=True)
    kafka.pid_file.write_text("1\n")  # pid 1 runs, but not with our config on its command line
    assert kafka.pid() is None
    assert not kafka.pid_file.exists()
    assert kafka.stop() is False


def test_kafka_cluster_renders_one_node_per_bootstrap_address(tmp_path: Path) -> None:
    servers = "127.0.0.11:9092,127.0.0.12:9092,127.0.0.13:9092"
    settings = Settings(data_dir=tmp_path, kafka={"bootstrap_servers": servers}, stack={"kafka_controller_port": 9093})
    nodes = control.nodes(settings, "kafka")
    assert [n.name for n in nodes] == ["kafka-1", "kafka-2", "kafka-3"]
    third = nodes[2]
    third.conf_dir.mkdir(parents=True)
    text = third.render_config().read_text()
    assert "node.id=3" in text
    assert "controller.quorum.voters=1@127.0.0.11:9093,2@127.0.0.12:9094,3@127.0.0.13:9095" in text
    assert "listeners=PLAINTEXT://127.0.0.13:9092,CONTROLLER://127.0.0.13:9095" in text
    assert "offsets.topic.replication.factor=3" in text and "transaction.state.log.min.isr=2" in text
    assert f"log.dirs={tmp_path / 'kafka-3' / 'data'}" in text


def test_cassandra_cluster_nodes_share_ports_and_the_seed(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        cassandra={"contact_points": ["127.0.0.21", "127.0.0.22"], "port": 9042},
        stack={"cassandra_jmx_port": 7299, "cassandra_storage_port": 7000},
    )
    first, second = control.nodes(settings, "cassandra")
    assert (first.name, second.name) == ("cassandra-1", "cassandra-2")
    second.conf_dir.mkdir(parents=True)
    text = second.render_config().read_text()
    assert 'seeds: "127.0.0.21:7000"' in text and "listen_address: 127.0.0.22" in text
    assert [p for p, *_ in second.ports()] == [9042, 7000, 7300]
    assert "-Dcassandra.jmx.local.port=7300" in " ".join(second.command("java", second.conf_dir / "cassandra.yaml"))


def test_services_name_a_whole_cluster_or_one_node(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, kafka={"bootstrap_servers": "127.0.0.11:9092,127.0.0.12:9092"})
    assert [s.name for s in control.services(settings)] == ["kafka-1", "kafka-2", "cassandra"]
    assert [s.name for s in control.services(settings, ["kafka-2", "api"])] == ["kafka-2", "api"]
    with pytest.raises(StackError, match=r"unknown service.*kafka-3.*choose from kafka-1, kafka-2, cassandra"):
        control.services(settings, ["kafka-3"])


def test_pid_file_trusts_only_the_process_it_recorded(tmp_path: Path) -> None:
    pid_file = PidFile(tmp_path / "x.pid")
    pid_file.path.write_text(f"{os.getpid()} 1\n")  # a running pid, but not the process that started at tick 1
    assert pid_file.running() is None
    assert not pid_file.path.exists()
    pid_file.write(os.getpid())
    assert pid_file.running() == os.getpid()
    assert pid_file.running(lambda _pid: False) is None  # alive, but its command line is not ours


def test_a_port_held_by_a_connection_is_waited_for_not_refused() -> None:
    """A just-stopped server's sockets, or a client that took the port, free it within seconds: start then."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client = socket.socket()
        client.bind(("127.0.0.1", 0))
        held = client.getsockname()[1]
        client.connect(server.getsockname())
        accepted, _ = server.accept()
        accepted.close()  # the peer hangs up first: the client's socket waits in CLOSE_WAIT, holding its port
        with pytest.raises(StackError, match=rf"port 127.0.0.1:{held} is already taken by another process"):
            ensure_port_free("127.0.0.1", held, "cassandra (JMX)", "TRENDS_X", settle_s=1.0)
        threading.Timer(1.0, client.close).start()
        began = time.monotonic()
        ensure_port_free("127.0.0.1", held, "cassandra (JMX)", "TRENDS_X", settle_s=10.0)
        assert 0.9 < time.monotonic() - began < 9
