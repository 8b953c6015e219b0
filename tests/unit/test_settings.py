from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from infra.migrations import replication_map
from infra.settings import Settings
from infra.spark import kafka_options


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("TRENDS_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)  # no stray .env file


def test_defaults_describe_the_local_stack() -> None:
    s = Settings()
    assert s.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert s.kafka.events_retention_ms == -1
    assert s.cassandra.contact_points == ["127.0.0.1"]
    assert s.spark.master == "local[2]"
    assert s.data_dir.is_absolute()
    assert s.checkpoint_root == str(s.data_dir / "checkpoints")


def test_nested_env_vars_configure_clusters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRENDS_KAFKA__BOOTSTRAP_SERVERS", "k1:9092,k2:9092,k3:9092")
    monkeypatch.setenv("TRENDS_KAFKA__REPLICATION_FACTOR", "3")
    monkeypatch.setenv("TRENDS_CASSANDRA__CONTACT_POINTS", '["10.1.0.1", "10.1.0.2"]')
    monkeypatch.setenv("TRENDS_CASSANDRA__REPLICATION_STRATEGY", "NetworkTopologyStrategy")
    monkeypatch.setenv("TRENDS_CASSANDRA__DATACENTER_REPLICATION", '{"dc1": 3, "dc2": 2}')
    monkeypatch.setenv("TRENDS_SPARK__MASTER", "spark://master:7077")
    monkeypatch.setenv("TRENDS_SPARK__CHECKPOINT_ROOT", "s3a://bucket/checkpoints")
    s = Settings()
    assert s.kafka.first_broker == ("k1", 9092)
    assert s.kafka.client_config()["bootstrap.servers"] == "k1:9092,k2:9092,k3:9092"
    assert s.cassandra.contact_points == ["10.1.0.1", "10.1.0.2"]
    assert replication_map(s.cassandra) == {"class": "NetworkTopologyStrategy", "dc1": 3, "dc2": 2}
    assert s.spark.master == "spark://master:7077"
    assert s.checkpoint_root == "s3a://bucket/checkpoints"


def test_env_file_is_read(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("TRENDS_KAFKA__EVENTS_TOPIC=clicks\nTRENDS_LOG_LEVEL=DEBUG\n")
    s = Settings()
    assert s.kafka.events_topic == "clicks"
    assert s.log_level == "DEBUG"


def test_secrets_are_masked_unless_revealed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRENDS_KAFKA__SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("TRENDS_KAFKA__SASL_USERNAME", "svc")
    monkeypatch.setenv("TRENDS_KAFKA__SASL_PASSWORD", "hunter2")
    monkeypatch.setenv("TRENDS_CASSANDRA__PASSWORD", "s3cret")
    s = Settings()
    assert "hunter2" not in repr(s) and "s3cret" not in repr(s)
    assert s.kafka.client_config(reveal_secrets=False)["sasl.password"] == "**********"
    assert s.kafka.client_config()["sasl.password"] == "hunter2"
    assert 'password="hunter2"' in kafka_options(s.kafka)["kafka.sasl.jaas.config"]


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("TRENDS_KAFKA__PARTITIONS", "0"),
        ("TRENDS_CASSANDRA__KEYSPACE", "Bad-Name"),
        ("TRENDS_CASSANDRA__READ_CONSISTENCY", "SOMETIMES"),
        ("TRENDS_STACK__KAFKA_CLUSTER_ID", "short"),
    ],
)
def test_bad_values_are_rejected(monkeypatch: pytest.MonkeyPatch, var: str, value: str) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ValidationError):
        Settings()


@pytest.mark.parametrize(
    ("var", "value", "secret"),
    [
        ("TRENDS_AIRFLOW__DATABASE_URL", "postgres://airflow:hunter2@db:5432/airflow", "hunter2"),
        ("TRENDS_AIRFLOW__DATABASE_URL", "airflow:hunter2@db", "hunter2"),  # not even a URL
        ("TRENDS_AIRFLOW__CONFIG", '{"AIRFLOW_CONN_X": 5, "AIRFLOW__CORE__FERNET_KEY": ["k3y-hunter2"]}', "hunter2"),
        ("TRENDS_SPARK__CONF", '{"spark.hadoop.fs.s3a.secret.key": {"v": "hunter2"}}', "hunter2"),
        ("TRENDS_AIRFLOW__CONFIG", '{"MY_PASSWORD": "hunter2"}', "hunter2"),  # refused by our own validator
    ],
)
def test_validation_errors_never_echo_a_secret(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str, secret: str
) -> None:
    monkeypatch.setenv(var, value)
    monkeypatch.setenv("TRENDS_SERVING__PORT", "not-a-port")  # a non-secret error keeps its input, for contrast
    with pytest.raises(ValidationError) as err:
        Settings()
    text = str(err.value)
    assert secret not in text and secret not in repr(err.value.errors())
    assert "**********" in text
    assert "'not-a-port'" in text
    assert err.value.__suppress_context__  # the original error (with the input) is not chained into tracebacks


def test_invalid_settings_on_the_command_line_hide_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from app.cli import cli
    from infra.settings import get_settings

    monkeypatch.setenv("TRENDS_AIRFLOW__DATABASE_URL", "oracle://airflow:hunter2@db/airflow")
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(cli, ["config"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 2
    assert "invalid settings" in result.output and "database_url" in result.output
    assert "hunter2" not in result.output


def test_a_renamed_setting_keeps_its_old_name_with_a_deprecation_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRENDS_SPEED__METRICS_PORT", "9333")
    with pytest.warns(DeprecationWarning, match=r"speed\.metrics_port is deprecated: use metrics\.speed_port"):
        assert Settings().metrics.speed_port == 9333
    monkeypatch.setenv("TRENDS_METRICS__SPEED_PORT", "9444")  # the new name wins over the old one
    with pytest.warns(DeprecationWarning):
        assert Settings().metrics.speed_port == 9444
    monkeypatch.delenv("TRENDS_SPEED__METRICS_PORT")
    monkeypatch.delenv("TRENDS_METRICS__SPEED_PORT")
    assert Settings().metrics.speed_port == 9108


def test_a_local_checkpoint_root_uses_the_file_system_api_without_forking(tmp_path: Path) -> None:
    """Hadoop's local file system forks `readlink`/`chmod` per checkpoint file unless told otherwise (the soak)."""
    from infra.spark import LOCAL_CHECKPOINT_CONF, is_local_path, spark_conf

    assert is_local_path("/var/lib/trends/checkpoints") and is_local_path("file:///tmp/c")
    assert not is_local_path("hdfs://nn:8020/trends") and not is_local_path("s3a://bucket/trends")
    local = spark_conf(Settings(data_dir=tmp_path), "speed")
    assert LOCAL_CHECKPOINT_CONF.items() <= local.items()
    remote = spark_conf(Settings(data_dir=tmp_path, spark={"checkpoint_root": "hdfs://nn:8020/trends"}), "speed")
    assert not set(LOCAL_CHECKPOINT_CONF) & set(remote)


def test_jobs_unload_their_generated_classes_every_5_minutes_unless_told_otherwise(tmp_path: Path) -> None:
    """A query with a watermark compiles classes every batch; only a GC that unloads classes frees them (the soak)."""
    from infra.spark import JVM_GC_OPTIONS, spark_conf

    conf = spark_conf(Settings(data_dir=tmp_path), "speed")
    assert conf["spark.cleaner.periodicGC.interval"] == "5min"
    assert JVM_GC_OPTIONS in conf["spark.driver.extraJavaOptions"] and "log4j2" in conf["spark.driver.extraJavaOptions"]
    assert JVM_GC_OPTIONS in conf["spark.executor.extraJavaOptions"]
    own = spark_conf(Settings(data_dir=tmp_path, spark={"conf": {"spark.cleaner.periodicGC.interval": "1min"}}), "x")
    assert own["spark.cleaner.periodicGC.interval"] == "1min"
