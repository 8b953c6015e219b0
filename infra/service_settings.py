"""The settings of the services the pipeline runs on: Kafka, a schema registry, Cassandra, Spark and Airflow.

These sections of :class:`infra.settings.Settings` say where each service is and how to reach it (addresses,
security, consistency, timeouts); the clients built from them live beside their users (:mod:`infra.cassandra`,
:mod:`infra.spark`, :mod:`infra.airflow.client`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

from infra.settings_env import env_var

Consistency = Literal["ONE", "TWO", "THREE", "QUORUM", "ALL", "LOCAL_QUORUM", "EACH_QUORUM", "LOCAL_ONE", "ANY"]


class KafkaSettings(BaseModel):
    """Where the events live: brokers, topics and client security."""

    bootstrap_servers: str = Field(
        "127.0.0.1:9092",
        description="Comma-separated host:port list of brokers. The local stack starts one KRaft node per entry "
        "(e.g. 127.0.0.11:9092,127.0.0.12:9092,127.0.0.13:9092 for a 3-broker cluster on loopback).",
    )
    events_topic: str = Field("events", description="Topic of validated events, keyed by item.")
    events_format: Literal["json", "avro"] = Field(
        "json",
        description="Wire format of the events topic's records. json: the event's compact JSON. avro: Confluent-"
        "framed Avro of the event schema, registered in the schema registry (registry.url) under "
        "<events_topic>-value; the layers then decode JSON and Avro records alike (a topic switched mid-life), need "
        "the registry at start and put spark-avro on Spark's jars. Needs the trends[sources] install.",
    )
    dlq_topic: str = Field("events.dlq", description="Dead-letter topic: rejected records with a reason.")
    partitions: int = Field(4, ge=1, description="Partitions of the events and dead-letter topics at creation.")
    replication_factor: int = Field(
        1, ge=1, description="Replication factor of the topics at creation (3 on a real cluster)."
    )
    min_insync_replicas: int = Field(
        1, ge=1, description="min.insync.replicas of the topics (2 with replication factor 3)."
    )
    events_retention_ms: int = Field(
        -1,
        ge=-1,
        description="retention.ms of the events topic. -1 keeps events forever: Kafka's retention is by record "
        "timestamp (= event time), so a finite value deletes historical events at once.",
    )
    events_retention_bytes: int = Field(
        -1, ge=-1, description="retention.bytes per partition of the events topic (-1: no size bound)."
    )
    dlq_retention_ms: int = Field(
        30 * 24 * 3600 * 1000,
        ge=-1,
        description="retention.ms of the dead-letter topic (-1: as long as allowed). Dead letters keep raw records, "
        "user ids included: the topic is created with at most the erasure deadline (privacy.erasure_deadline_days) "
        "minus two days, and daily segments, so a record is gone before the deadline (28 days by default).",
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="security.protocol of every client (SSL and SASL_SSL encrypt with TLS)."
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None, description="sasl.mechanism when SASL is used: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512."
    )
    sasl_username: str | None = Field(None, description="SASL user name.")
    sasl_password: SecretStr | None = Field(None, description="SASL password (secret).")
    client_id: str = Field("trends", description="client.id prefix of every Kafka client.")
    # -- TLS (security_protocol SSL or SASL_SSL) ------------------------------------------------------------------
    ssl_ca_file: Path | None = Field(
        None,
        description="PEM file of the CA(s) that signed the brokers' certificates. Unset: the system's CAs (enough "
        "for managed Kafka with public certificates). With stack.tls: the local stack's CA.",
    )
    ssl_certificate_file: Path | None = Field(
        None, description="PEM client certificate (chain) for mutual TLS; needs ssl_key_file."
    )
    ssl_key_file: Path | None = Field(
        None, description="PEM private key of the client certificate (PKCS#8 or PKCS#1; Spark needs it as PKCS#8)."
    )
    ssl_key_password: SecretStr | None = Field(None, description="Password of an encrypted ssl_key_file (secret).")
    ssl_check_hostname: bool = Field(
        True,
        description="Check that a broker's certificate names the host connected to (ssl.endpoint.identification."
        "algorithm=https). Turn off only for brokers whose certificates cannot name their addresses.",
    )

    @model_validator(mode="after")
    def _consistent_security(self) -> KafkaSettings:
        if self.security_protocol.startswith("SASL_"):
            missing = [
                env_var(f"kafka.{name}")
                for name in ("sasl_mechanism", "sasl_username", "sasl_password")
                if getattr(self, name) is None
            ]
            if missing:
                msg = f"security_protocol {self.security_protocol} needs {', '.join(missing)}"
                raise ValueError(msg)
        if (self.ssl_certificate_file is None) != (self.ssl_key_file is None):
            msg = (
                f"a client certificate needs both {env_var('kafka.ssl_certificate_file')} and "
                f"{env_var('kafka.ssl_key_file')}"
            )
            raise ValueError(msg)
        return self

    @property
    def uses_tls(self) -> bool:
        """Tell whether clients speak TLS to the brokers (SSL or SASL_SSL)."""
        return self.security_protocol in ("SSL", "SASL_SSL")

    def client_config(self, *, reveal_secrets: bool = True) -> dict[str, Any]:
        """Return the librdkafka configuration shared by producers, consumers and the admin client.

        :arg reveal_secrets: put the real passwords in (``False`` masks them for logging).
        """

        def secret(value: SecretStr) -> str:
            return value.get_secret_value() if reveal_secrets else str(value)

        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
            "client.id": self.client_id,
        }
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            conf["sasl.password"] = secret(self.sasl_password)
        if self.uses_tls:
            conf["ssl.endpoint.identification.algorithm"] = "https" if self.ssl_check_hostname else "none"
            if self.ssl_ca_file is not None:
                conf["ssl.ca.location"] = str(self.ssl_ca_file)
            if self.ssl_certificate_file is not None and self.ssl_key_file is not None:
                conf["ssl.certificate.location"] = str(self.ssl_certificate_file)
                conf["ssl.key.location"] = str(self.ssl_key_file)
            if self.ssl_key_password is not None:
                conf["ssl.key.password"] = secret(self.ssl_key_password)
        return conf

    @property
    def brokers(self) -> list[tuple[str, int]]:
        """Return host and port of every bootstrap server, in order."""
        out = []
        for entry in self.bootstrap_servers.split(","):
            host, _, port = entry.strip().rpartition(":")
            out.append((host, int(port)))
        return out

    @property
    def first_broker(self) -> tuple[str, int]:
        """Return host and port of the first bootstrap server."""
        return self.brokers[0]


class SchemaRegistrySettings(BaseModel):
    """The schema registry of Avro and Protobuf sources (`trends ingest kafka`) and of the events topic in Avro."""

    url: str = Field(
        "http://127.0.0.1:8081/apis/ccompat/v7",
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="Base URL of the Confluent-compatible REST API (Confluent Schema Registry: http://host:8081; "
        "Apicurio Registry: http://host:port/apis/ccompat/v7). The local stack's `registry` service listens on "
        "this URL's host and port.",
    )
    username: str | None = Field(None, description="User for HTTP basic authentication, if the registry wants one.")
    password: SecretStr | None = Field(None, description="Password for HTTP basic authentication (secret).")
    ssl_ca_file: Path | None = Field(
        None, description="PEM file of the CA(s) that signed an https registry's certificate. Unset: the system's CAs."
    )
    timeout_s: float = Field(10.0, gt=0, description="Timeout of one request to the registry, seconds.")
    max_wait_s: float = Field(
        120.0,
        gt=0,
        description="How long a record whose schema must be fetched waits for a registry that does not answer "
        "(retried with back-off) before the bridge stops with an error, committing nothing past that record.",
    )
    backoff_s: float = Field(
        0.5, gt=0, description="First wait between attempts to reach the registry, doubling up to backoff_max_s."
    )
    backoff_max_s: float = Field(10.0, gt=0, description="Longest wait between attempts to reach the registry.")
    cache_capacity: int = Field(1000, ge=10, description="Schemas kept by id in the client's cache.")

    @model_validator(mode="after")
    def _consistent_auth(self) -> SchemaRegistrySettings:
        if (self.username is None) != (self.password is None):
            msg = f"registry basic auth needs both {env_var('registry.username')} and {env_var('registry.password')}"
            raise ValueError(msg)
        return self

    @property
    def host_port(self) -> tuple[str, int]:
        """Return the host and port of the URL (the local stack's registry binds them)."""
        from urllib.parse import urlsplit  # noqa: PLC0415

        parts = urlsplit(self.url)
        return parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)

    def client_config(self, *, reveal_secrets: bool = True) -> dict[str, Any]:
        """Return the configuration of confluent-kafka's ``SchemaRegistryClient`` (retries are the bridge's own).

        :arg reveal_secrets: put the real password in (``False`` masks it for logging).
        """
        conf: dict[str, Any] = {
            "url": self.url,
            "timeout": self.timeout_s,
            "cache.capacity": self.cache_capacity,
            "max.retries": 0,
        }
        if self.username is not None and self.password is not None:
            password = self.password.get_secret_value() if reveal_secrets else str(self.password)
            conf["basic.auth.user.info"] = f"{self.username}:{password}"
        if self.ssl_ca_file is not None:
            conf["ssl.ca.location"] = str(self.ssl_ca_file)
        return conf


class CassandraSettings(BaseModel):
    """Where the views live: contact points, keyspace, replication and consistency."""

    contact_points: list[str] = Field(
        ["127.0.0.1"],
        description='Cassandra nodes to contact first (JSON list in env, e.g. \'["10.0.0.1","10.0.0.2"]\'). '
        'The local stack starts one node per entry (e.g. ["127.0.0.21","127.0.0.22"]), the first being the seed.',
    )
    port: int = Field(9042, description="CQL native transport port.")
    protocol_version: int = Field(
        4,
        ge=3,
        le=6,
        description="CQL native protocol version. 4, not 5: the Python driver (3.30.1) reading v5's checksummed "
        'segments in pieces sometimes drops the connection with "CRC mismatch on header" (PYTHON-1337): seen '
        "on a plain loopback connect of the speed job's sink under load, and on every slow link (docs/tests.md).",
    )
    keyspace: str = Field("trends", pattern=r"^[a-z][a-z0-9_]{0,47}$", description="Keyspace of all tables.")
    replication_strategy: Literal["SimpleStrategy", "NetworkTopologyStrategy"] = Field(
        "SimpleStrategy", description="Replication class of the keyspace at creation."
    )
    replication_factor: int = Field(1, ge=1, description="Replicas per row (SimpleStrategy).")
    datacenter_replication: dict[str, int] = Field(
        default_factory=dict,
        description="Replicas per datacenter for NetworkTopologyStrategy (JSON map, e.g. '{\"dc1\": 3}').",
    )
    local_datacenter: str = Field("datacenter1", description="Datacenter the driver's load-balancing policy prefers.")
    read_consistency: Consistency = Field("LOCAL_QUORUM", description="Consistency level of reads.")
    write_consistency: Consistency = Field("LOCAL_QUORUM", description="Consistency level of writes.")
    username: str | None = Field(None, description="User for PasswordAuthenticator, if enabled.")
    password: SecretStr | None = Field(None, description="Password for PasswordAuthenticator (secret).")
    ssl: bool = Field(
        False,
        description="Encrypt client connections with TLS (the nodes' client_encryption_options). On with stack.tls.",
    )
    ssl_ca_file: Path | None = Field(
        None,
        description="PEM file of the CA(s) that signed the nodes' certificates. Unset: the system's CAs. With "
        "stack.tls: the local stack's CA.",
    )
    ssl_certificate_file: Path | None = Field(
        None, description="PEM client certificate for nodes that require client auth (mutual TLS); needs ssl_key_file."
    )
    ssl_key_file: Path | None = Field(None, description="PEM private key of the client certificate.")
    ssl_key_password: SecretStr | None = Field(None, description="Password of an encrypted ssl_key_file (secret).")
    ssl_check_hostname: bool = Field(
        True, description="Check that a node's certificate names the address connected to (contact point or peer)."
    )
    connect_timeout_s: float = Field(10.0, gt=0, description="Driver connect timeout, seconds.")
    request_timeout_s: float = Field(20.0, gt=0, description="Default per-request timeout, seconds.")
    reconnect_max_s: float = Field(
        30.0,
        gt=0,
        description="Longest wait between the driver's attempts to reconnect to a node it lost (exponential from "
        "1 s up to this). The driver's own default, 600 s, leaves a client that lost a node for a long outage "
        "waiting up to 10 minutes after the node is back.",
    )
    write_concurrency: int = Field(
        128, ge=1, description="Concurrent requests of bulk writes (each waits for its commitlog group)."
    )
    read_concurrency: int = Field(32, ge=1, description="Concurrent requests of bulk reads (the batch index).")

    @model_validator(mode="after")
    def _consistent_tls(self) -> CassandraSettings:
        if (self.ssl_certificate_file is None) != (self.ssl_key_file is None):
            msg = (
                f"a client certificate needs both {env_var('cassandra.ssl_certificate_file')} and "
                f"{env_var('cassandra.ssl_key_file')}"
            )
            raise ValueError(msg)
        return self


class SparkSettings(BaseModel):
    """How Spark jobs run: master, parallelism, jars and checkpoints."""

    master: str = Field("local[2]", description="Spark master URL: local[N], spark://host:port, k8s://…, yarn.")
    app_name: str = Field("trends", description="Application name prefix shown in the Spark UI.")
    shuffle_partitions: int = Field(
        2,
        ge=1,
        description="spark.sql.shuffle.partitions: about the executor cores in total. It also fixes the state store "
        "partitions of a new streaming query for the life of its checkpoint.",
    )
    driver_memory: str = Field("1g", description="spark.driver.memory (only effective when Spark starts the JVM).")
    extra_jars: list[str] = Field(
        default_factory=list,
        description="More jars for spark.jars, besides the Kafka connector fetched into the cache (JSON list).",
    )
    checkpoint_root: str | None = Field(
        None,
        description="Root of streaming checkpoints: a path or a URI of durable shared storage on a cluster "
        "(hdfs://, s3a://). Default: <data_dir>/checkpoints.",
    )
    ui_enabled: bool = Field(False, description="Start the Spark web UI (spark.ui.enabled).")
    local_ip: str | None = Field(
        "127.0.0.1",
        description="SPARK_LOCAL_IP of the driver: loopback for a local master; unset it (empty) or give a "
        "reachable address when executors run on other hosts.",
    )
    conf: dict[str, str] = Field(
        default_factory=dict, description="Any further Spark configuration (JSON map), applied last."
    )


WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})  # noqa: S104 - recognised, to reach such a server on loopback
LOCAL_ADMIN_PASSWORD = "admin"  # noqa: S105 - documented default of the loopback-only local stack


class AirflowSettings(BaseModel):
    """The local Airflow of ``trends stack up --with-airflow`` (API server, scheduler, DAG processor)."""

    host: str = Field(
        "127.0.0.1",
        description="Address the Airflow API server (UI, REST API and the tasks' execution API) binds to. "
        "Keep loopback: a non-loopback address is refused while the admin password is the default.",
    )
    api_port: int = Field(8080, ge=1, le=65535, description="Port of the Airflow API server and UI.")
    parallelism: int = Field(
        2,
        ge=1,
        le=32,
        description="[core] parallelism: task instances LocalExecutor runs at once (it forks one worker each); "
        "2-4 on one machine, where each batch task is a Spark driver.",
    )
    database_url: SecretStr | None = Field(
        None,
        description="SQLAlchemy URL of the metadata DB for a deployment, e.g. "
        "postgresql+psycopg2://airflow:PASSWORD@127.0.0.1:5432/airflow (needs the psycopg2 driver installed). "
        "Unset: SQLite in <data_dir>/airflow/data/airflow.db.",
    )
    admin_user: str = Field(
        "admin",
        pattern=r"^[A-Za-z0-9_.@-]{1,64}$",
        description="User of the web UI and REST API (SimpleAuthManager, role admin).",
    )
    admin_password: SecretStr = Field(
        SecretStr(LOCAL_ADMIN_PASSWORD),
        description="Password of that user (secret). The default `admin` is for the loopback-only local stack; "
        "set your own for anything else.",
    )
    dags_folder: Path | None = Field(
        None,
        description="Folder of DAG files the local stack's DAG processor parses. Default: the installed package's "
        "DAG folder (`trends admin dags` prints it).",
    )
    api_workers: int = Field(1, ge=1, le=8, description="Worker processes of the API server.")
    triggerer: bool = Field(
        False,
        description="Also run `airflow triggerer`. Needed only by deferrable operators (the batch DAG has none); "
        "without it a deferred task waits forever.",
    )
    start_timeout_s: float = Field(
        180.0, gt=0, description="Longest wait for `airflow db migrate` and then for the API to report healthy."
    )
    config: dict[str, str] = Field(
        default_factory=dict,
        description="Further Airflow options as environment variables of its processes, applied last (JSON map, "
        'e.g. \'{"AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30"}\').',
    )

    # How `trends batch backfill` reaches Airflow's REST API: the local stack's by default, or a deployment's.
    api_url: str | None = Field(
        None,
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="Base URL of the Airflow REST API that `trends batch backfill` calls (e.g. "
        "https://airflow.example.com). Unset: the local stack's API server, http://<host>:<api_port>.",
    )
    api_user: str | None = Field(
        None,
        description="User `trends` logs in as at the auth manager's token endpoint (POST <api_url>/auth/token: "
        "SimpleAuthManager, tested; FAB's is the same). Unset: admin_user.",
    )
    api_password: SecretStr | None = Field(None, description="Password of api_user (secret). Unset: admin_password.")
    api_token: SecretStr | None = Field(
        None,
        description="A JWT for the REST API issued by the deployment's auth manager (secret; any auth manager). "
        "When set it is sent as is and no login happens; an expired or refused token is an error naming this "
        "setting. Empty means unset.",
    )

    @field_validator("api_url", "api_user", "api_password", "api_token", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        # TRENDS_AIRFLOW__API_TOKEN= must mean "log in", not "send an empty bearer".
        raw = value.get_secret_value() if isinstance(value, SecretStr) else value
        return None if isinstance(raw, str) and not raw.strip() else value

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            url = value.get_secret_value()
            scheme, sep, _ = url.partition("://")
            if not sep or scheme.partition("+")[0] not in {"postgresql", "mysql", "sqlite"}:
                # The URL itself is never repeated: it may hold a password.
                shown = repr(scheme) if sep and scheme.replace("+", "").isalnum() else "not a URL"
                msg = f"database URL scheme {shown}: use postgresql[+driver]://, mysql[+driver]:// or sqlite://"
                raise ValueError(msg)
        return value

    @field_validator("config")
    @classmethod
    def _airflow_variables(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_"))]
        if bad:
            msg = f"not Airflow variables (AIRFLOW__SECTION__KEY, AIRFLOW_CONN_*, AIRFLOW_VAR_*): {', '.join(bad)}"
            raise ValueError(msg)
        return value

    @property
    def bind_host(self) -> str:
        """Return the address the API server binds: ``config`` (``AIRFLOW__API__HOST``) overrides ``host``."""
        return self.config.get("AIRFLOW__API__HOST", self.host)

    @property
    def bind_port(self) -> int:
        """Return the port the API server binds: ``config`` (``AIRFLOW__API__PORT``) overrides ``api_port``."""
        value = self.config.get("AIRFLOW__API__PORT", "")
        return int(value) if value.strip().isdigit() else self.api_port

    @property
    def client_host(self) -> str:
        """Return the address to reach the local API server at (loopback when it binds every interface)."""
        return "127.0.0.1" if self.bind_host in WILDCARD_HOSTS else self.bind_host

    @property
    def base_url(self) -> str:
        """Return the REST API's base URL: ``api_url``, else the local stack's API server."""
        if self.api_url:
            return self.api_url.rstrip("/")
        host = f"[{self.client_host}]" if ":" in self.client_host else self.client_host
        return f"http://{host}:{self.bind_port}"
