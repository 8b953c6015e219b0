"""The settings of the pipeline's own parts: the local stack, views, both layers, serving, metrics and privacy.

Sections of :class:`infra.settings.Settings`; ingestion's are in :mod:`infra.ingest_settings`, the services they
all run on in :mod:`infra.service_settings`.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator

from infra.dag_contract import DAG_IDS

# How the speed layer drops an event's copies (speed.dedupe_by): by id and event time, or by id alone.
DedupeBy = Literal["id_and_time", "id"]


class StackSettings(BaseModel):
    """The local single-machine stack of ``trends stack``; ignored when you point at real clusters.

    Client ports are not repeated here: the broker listens on ``kafka.bootstrap_servers`` and Cassandra on
    ``cassandra.port``, so the stack and its clients cannot disagree.
    """

    kafka_controller_port: int = Field(
        9093, description="KRaft controller listener port of the local broker; node N of a local cluster uses +N-1."
    )
    kafka_heap: str = Field("512m", description="Heap (-Xms/-Xmx) of each local Kafka broker.")
    tls: bool = Field(
        False,
        description="Run the local Kafka and Cassandra with TLS: a CA and server certificates are generated into "
        "<data_dir>/tls at `stack up`; Kafka listens with kafka.security_protocol SSL or SASL_SSL (SCRAM-SHA-512 or "
        "PLAIN users from kafka.sasl_*), Cassandra with client encryption (and a password when "
        "cassandra.username/password are set). Clients default to that CA and cassandra.ssl (and, with SSL, whose "
        "listeners require client certificates, to the stack's client certificate).",
    )
    kafka_cluster_id: str = Field(
        "tR3nDsLoCaLcLuStEr0001",
        min_length=22,
        max_length=22,
        description="KRaft cluster id used to format the local broker's storage (22-char base64url).",
    )
    cassandra_storage_port: int = Field(
        7000,
        description="Inter-node storage port of the local Cassandra (shared by the nodes of a local cluster, "
        "each on its own address).",
    )
    cassandra_jmx_port: int = Field(
        7199, description="Local-only JMX port of the local Cassandra; node N of a local cluster uses +N-1."
    )
    cassandra_heap: str = Field("1G", description="Heap (-Xms/-Xmx) of each local Cassandra node.")
    cassandra_commitlog_sync: Literal["group", "batch", "periodic"] = Field(
        "group",
        description="Commit log mode of the local Cassandra: `group` (default) fsyncs before acknowledging, in "
        "15 ms groups, so acknowledged lineage/watermark/view writes survive a hard kill; `periodic` (10 s) is "
        "faster but can lose the last seconds of acknowledged writes.",
    )
    kafka_start_timeout_s: float = Field(90.0, gt=0, description="Longest wait for the broker to accept clients.")
    cassandra_start_timeout_s: float = Field(
        180.0, gt=0, description="Longest wait for Cassandra to accept CQL clients."
    )
    spark_start_timeout_s: float = Field(
        90.0, gt=0, description="Longest wait for the local Spark master to be ALIVE, or a worker to register with it."
    )
    pipeline_start_timeout_s: float = Field(
        90.0,
        gt=0,
        description="Longest wait for a background pipeline service (`speed`: its /metrics; `api`: its /health) to "
        "answer.",
    )
    spark_master_port: int = Field(
        7077, description="Port of the local Spark standalone master (`trends stack up spark-master …`)."
    )
    spark_master_webui_port: int = Field(8088, description="Web UI (and /json) port of the local Spark master.")
    spark_worker_webui_port: int = Field(
        8091, description="Web UI port of the first local Spark worker; the second uses the next port."
    )
    spark_worker_cores: int = Field(1, ge=1, description="Cores each local Spark worker offers.")
    spark_worker_memory: str = Field("1g", description="Memory each local Spark worker offers to executors.")
    stop_timeout_s: float = Field(45.0, gt=0, description="Wait after SIGTERM before a server is SIGKILLed.")
    speed_restart_backoff_s: float = Field(
        2.0,
        gt=0,
        description="The stack restarts the speed service when it exits non-zero (a write error, a crash): first "
        "after this many seconds, doubling with each quick failure in a row.",
    )
    speed_restart_backoff_max_s: float = Field(
        60.0, gt=0, description="Longest wait between restarts of the speed service, seconds."
    )
    speed_restart_healthy_s: float = Field(
        60.0,
        gt=0,
        description="A speed service run that lasted this many seconds counts as healthy: the back-off starts over.",
    )
    java_home: Path | None = Field(
        None, description="JDK 17 to run the servers with. Default: $JAVA_HOME, else `java` on PATH."
    )
    registry_java_home: Path | None = Field(
        None,
        description="JDK 21 or newer to run the local schema registry (Apicurio Registry 3 is built for Java 21). "
        "Default: java_home or $JAVA_HOME or `java` on PATH when that is 21+, else the newest JDK 21+ found under "
        "/usr/lib/jvm.",
    )
    registry_heap: str = Field("384m", description="Heap (-Xmx) of the local schema registry.")
    registry_start_timeout_s: float = Field(
        90.0, gt=0, description="Longest wait for the local schema registry to answer its REST API."
    )


class ViewSettings(BaseModel):
    """What the views aggregate, shared by both layers (changing it calls for a batch reprocess)."""

    slice_dims: list[str] = Field(
        default_factory=list,
        description="Event dimensions that get a slice of their own besides the global one "
        '(JSON list, e.g. \'["origin", "carrier"]\'); a slice is named `origin=JFK`.',
    )
    top_k_items: int = Field(
        1024,
        ge=8,
        le=65536,
        description="Items tracked by each frequent-items sketch; its count error is at most about "
        "3.5/that x the bucket's events.",
    )


class SpeedSettings(BaseModel):
    """The streaming job: source, trigger, lateness, TTL and metrics."""

    query_name: str = Field(
        "speed_view",
        pattern=r"^[a-z][a-z0-9_]{0,63}$",
        description="Name of the streaming query; also its checkpoint folder under the checkpoint root.",
    )
    trigger_seconds: float = Field(2.0, gt=0, description="Micro-batch trigger interval in seconds.")
    max_offsets_per_trigger: int = Field(
        200_000, ge=1, description="Most Kafka records one micro-batch reads (bounds catch-up batches)."
    )
    starting_offsets: str = Field(
        "earliest",
        description="Where a query without a checkpoint starts: earliest, latest or a per-partition JSON. "
        "Ignored once a checkpoint exists. Not earliest: the speed layer counts completely only from the minute "
        "after its starting offsets were resolved, earlier minutes above the batch watermark are gaps.",
    )
    from_watermark: bool = Field(
        True,
        description="A query without a checkpoint (a new one, or a lost one) starts from the batch watermark instead "
        "of starting_offsets: per partition at the first offset of any record at or above the watermark's hour (or "
        "the pin's), found in the event-time index (indexed first if behind); records below it are skipped, and "
        "the new epoch counts every minute from that hour, so nothing above the watermark is a gap once it caught "
        "up. Without a watermark yet it starts at starting_offsets. On by default: a lost checkpoint would otherwise "
        "recount the whole topic (a year of history is days of reading). The stack's speed service follows it too.",
    )
    allowed_lateness_s: int = Field(
        600,
        ge=0,
        description="Watermark delay: events up to this many seconds behind the newest event time are still "
        "counted (and deduplicated); later ones are dropped and counted as dropped (the batch layer still counts "
        "them). The dedupe keeps rate x lateness ids and scans them all every micro-batch, the speed job's largest "
        "cost: the rate a core sustains falls as this grows (docs: soak, Capacity).",
    )
    dedupe_by: DedupeBy = Field(
        "id_and_time",
        description="How a new speed checkpoint drops the copies of an event. id_and_time: a re-sent event (same "
        "id and event time), its id kept until the watermark passes it. id: Spark's dropDuplicatesWithinWatermark, "
        "copies with another event time too, each id kept for twice the lateness, so the eviction scans twice the "
        "state every micro-batch. A checkpoint keeps the dedupe its state was started with (Spark refuses another).",
    )
    track_state_rows: bool = Field(
        False,
        description="Count the rows of the job's RocksDB state (the trends_speed_state_rows gauge; Spark's "
        "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows). Counting reads every key before it is "
        "written: off, the exact dedupe's state ran ~25% faster here (docs/benchmarks.md) and the gauge is not "
        "exported (never a made-up zero).",
    )
    view_ttl_s: int = Field(
        14 * 24 * 3600,
        ge=60,
        description="TTL of speed view rows (and of the speed layer's coverage records); must exceed the batch "
        "layer's lag: a minute above the batch watermark whose speed rows may have expired is answered as a gap.",
    )
    write_rollups: bool = Field(
        True,
        description="Merge each closed 10-minute interval of a slice's minutes into a rollup row once the Spark "
        "watermark has passed it (after the batch that passed it), so serving reads a window above the batch "
        "watermark from one row per interval plus its edge minutes. Off: serving reads minutes only.",
    )
    edge_ttl_s: int = Field(
        6 * 3600,
        ge=0,
        description="With `speed.write_rollups`, also merge each closed interval's prefixes and suffixes of two "
        "minutes or more (`speed_edges`, 16 rows) and keep them this long: a window whose edge falls inside an "
        "interval reads that side as one row instead of up to 9 minutes. Windows above the batch watermark are "
        "recent, so a few hours serve them; serving reads edges only this young. 0: none.",
    )
    live_rollups: bool = Field(
        True,
        description="With `speed.write_rollups`, also rewrite the rollup of each interval still open (its minutes may "
        "change) after every micro-batch that changed it, so serving reads a window's newest minutes as one row per "
        "interval too. Each costs the sink a read and a merge of the interval's minute rows per batch and slice "
        "changed (a few milliseconds each): with hundreds of slices, turn it off. Serving reads open intervals' "
        "rollups only when it is on (the same setting for both).",
    )
    stop_timeout_s: float = Field(
        60.0, gt=0, description="On SIGTERM/Ctrl-C, how long to let the running micro-batch finish before stopping."
    )
    serving_check_s: float = Field(
        5.0,
        gt=0,
        description="How often the speed job looks whether `trends speed promote` made another query (view "
        "version) serve answers instead of it; a demoted query stops cleanly (exit 0) and its rows expire by TTL.",
    )


class BatchSettings(BaseModel):
    """The batch layer: interval lateness and grace, versions kept, code version in the lineage."""

    lateness_s: int = Field(
        3600,
        ge=0,
        description="Lateness allowance (seconds): an interval is not computed before every active partition's "
        "newest event time has passed its end + this (see grace_s). Events later still are not lost: the index "
        "finds them wherever they are in the log, and their hour turns stale and is recomputed.",
    )
    grace_s: int = Field(
        3600,
        ge=0,
        description="An interval [start, end) is closed when every active partition's newest event time has passed "
        "end + this many seconds (never less than the lateness).",
    )
    idle_partition_s: int = Field(
        900,
        ge=1,
        description="A partition without a new record for this long (wall time, as the indexer saw it) is idle and "
        "does not hold hours open (like Flink's withIdleness); when all are idle, hours up to now minus this close.",
    )
    index_span_gap: int = Field(
        10_000,
        ge=0,
        description="The index extends an hour's offset span over at most this many records of other hours between "
        "two of its records (larger: fewer spans, more foreign records read by a recompute).",
    )
    index_flush_records: int = Field(
        500_000, ge=1, description="The indexer checkpoints after this many new records (and at the end)."
    )
    index_stall_s: float = Field(
        60.0, gt=0, description="The indexer gives up when Kafka returns no record for this long before the end."
    )
    chunk_events: int = Field(
        2_000_000,
        ge=1,
        description="A multi-hour recompute reads at most about this many indexed records per Spark pass (an hour "
        "is never split).",
    )
    chunk_hours: int = Field(
        2208, ge=1, description="A multi-hour recompute computes at most this many hours per Spark pass (92 days)."
    )
    max_ranges_per_partition: int = Field(
        64,
        ge=1,
        description="A pass reads at most this many offset ranges per partition (closest ranges are merged beyond "
        "it): Spark's Kafka source takes one range per partition per read, so each range is a unioned read.",
    )
    heal_max_hours: int = Field(
        48,
        ge=0,
        description="Each hourly DAG run also computes up to this many closed hours without a current run, and as "
        "many stale hours, oldest first, so the batch view heals itself after an outage or late data.",
    )
    day_parts: bool = Field(
        True,
        description="Write each day's parts beside its rollup: every run of its hours from midnight or to midnight "
        "of two hours or more, merged, so a window whose edge falls inside a day reads one row for the day's whole "
        "hours on that side instead of up to 23 (44 rows per day and slice at most). Serving reads them when on "
        "(the same setting for both).",
    )
    backfill_parallelism: int = Field(
        2, ge=1, description="Chunks of a backfill DAG run computed at the same time (each one spark-submit)."
    )
    task_timeout_s: int = Field(
        3 * 3600, ge=60, description="execution_timeout of the batch DAGs' tasks (a hung task fails and retries)."
    )
    keep_versions: int = Field(
        2, ge=1, le=10, description="Versions of an interval kept after a rerun (the current one included)."
    )
    code_version: str | None = Field(
        None, description="Code version written into the lineage. Default: the package version and git commit."
    )
    spark_conn_id: str = Field(
        "trends_spark", description="Airflow connection of the Spark master that the DAG's recompute task submits to."
    )


class ServingSettings(BaseModel):
    """The query API and dashboard of ``trends serve`` (and the limits that ``trends query`` shares)."""

    host: str = Field("127.0.0.1", description="Address the API and dashboard bind to (loopback by default).")
    port: int = Field(8000, ge=0, le=65535, description="Port of the API and dashboard.")
    api_token: SecretStr | None = Field(
        None,
        description="If set, every /api/ request needs `Authorization: Bearer <token>` (the dashboard takes it as "
        "`?token=`); health, readiness, metrics and docs stay open. Empty means unset. Required (at least 16 "
        "characters) when the API binds a non-loopback address, unless `trends serve --insecure`.",
    )
    max_window_days: int = Field(31, ge=1, le=3660, description="Longest query window, days.")
    max_limit: int = Field(200, ge=1, le=10_000, description="Largest `limit`/`top` a query may ask for.")
    default_baseline: str = Field(
        "24h", pattern=r"^[1-9][0-9]*[mhd]$", description="Baseline window of trending queries when none is given."
    )
    dashboard_refresh_s: float = Field(5.0, gt=0, description="How often the dashboard refreshes itself, seconds.")
    cassandra_retry_s: float = Field(
        5.0, gt=0, description="While Cassandra is unreachable, how long the API waits between connection attempts."
    )
    max_read_mb: float = Field(
        256.0,
        gt=0,
        description="Most sketch bytes (MiB) one API request may read from the views; rows are merged as they "
        "stream in, so this bounds a request's time and I/O, not its memory. A request that would read more is "
        "refused with a 400 naming this setting: long windows over the batch layer's hourly and daily rollups read "
        "little, the same windows over speed-layer minutes (while the batch view lags) read the most.",
    )
    max_concurrent_requests: int = Field(
        8,
        ge=1,
        le=1024,
        description="Query requests (/api/v1/...) one `trends serve` process answers at once; more are refused at "
        "once with a 429 and `Retry-After`, so a burst cannot pile up memory or starve /health and /ready.",
    )
    cache_mb: int = Field(
        256,
        ge=0,
        description="Memory (MiB) a serving process may use to keep batch-view rows it has read (LRU), keyed by "
        "the batch run they belong to, so a rerun is never served stale; 0 disables. Used only when reads see "
        "every acknowledged write (quorum reads and writes, or replication factor 1).",
    )
    # -- answers for many viewers (answer cache, worker processes) --
    answer_cache_mb: int = Field(
        64,
        ge=0,
        description="Memory (MiB) a serving process may use to keep merged answers, keyed by what makes them true "
        "(the question, the plan with its gaps, the batch runs merged, each speed minute's epoch and count): a "
        "repeated question is a lookup until a layer moves; when only the speed layer moved, only the speed "
        "minutes whose count changed are read again. 0 disables. Used under the same condition as `cache_mb`.",
    )
    state_max_age_ms: int = Field(
        250,
        ge=0,
        le=60_000,
        description="How old (ms) the layers' state behind a cached answer may be when a request is answered from "
        "the answer cache without reading the state again (shared by concurrent requests of one process); 0 reads "
        "it for every request. A cached answer is then at most this much behind the layers (a speed hour's rows "
        "expiring is still checked against the clock on every request); anything read is planned on state read "
        "for that request. The age counts from when the state's read began, and a process never goes back to an "
        "older reading; each worker of `trends serve --workers` keeps its own. The default keeps a dashboard's "
        "many viewers off Cassandra (the state is ~11 small reads) while answers stay well inside the speed "
        "layer's own trigger interval.",
    )
    ten_minute_rows: bool = Field(
        True,
        description="Read the whole ten minutes of a window from ten-minute rows instead of their minutes: below "
        "the batch watermark from the batch view's (hours whose run wrote them), above it from the speed layer's "
        "rollups (`speed.write_rollups`) of closed intervals (and of open ones with `speed.live_rollups`), wherever "
        "a rollup matches the minutes its epoch counted there (else its minutes are read, gaps and all). Off: "
        "minutes only. A series by the minute never uses them.",
    )
    speed_live_within_s: float = Field(
        30.0,
        gt=0,
        description="The speed layer's minute under way is answered with what it has read so far only while its "
        "epoch read everything the topic held at most this long ago (each micro-batch that reads to the end, or "
        "each trigger that finds nothing new, records it); a minute ending after that time is otherwise a gap "
        "(the job stopped, fell behind or is catching up) until it is read to its end. Keep it several trigger "
        "intervals plus a batch's duration.",
    )
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="Worker processes of `trends serve` (uvicorn workers on one port). They share nothing but "
        "Cassandra: each holds its own session and caches, and `/metrics` adds up all of them (Prometheus "
        "multiprocess mode in a fresh directory per server start).",
    )

    @field_validator("api_token", mode="before")
    @classmethod
    def _empty_token_is_unset(cls, value: Any) -> Any:
        # TRENDS_SERVING__API_TOKEN= must not turn into a token that `Authorization: Bearer ` matches.
        secret = value.get_secret_value() if isinstance(value, SecretStr) else value
        if isinstance(secret, str) and not secret.strip():
            return None
        return value

    @property
    def speed_live_within(self) -> timedelta:
        """Return :attr:`speed_live_within_s` as the span :class:`serving.plan.SpeedCoverage` takes."""
        return timedelta(seconds=self.speed_live_within_s)


class MetricsSettings(BaseModel):
    """Where each process exposes Prometheus metrics, what the batch exporter reads, and the local Prometheus."""

    host: str = Field(
        "127.0.0.1",
        description="Address the /metrics endpoints of the speed job, the ingest commands and the batch exporter bind "
        "to (`0.0.0.0` to let a Prometheus on another host scrape them; they expose counts and times, no data).",
    )
    speed_port: int = Field(
        9108,
        ge=0,
        le=65535,
        description="Port of the /metrics endpoint of `trends speed run` (0: none). Was `speed.metrics_port`, "
        "which still works with a deprecation warning.",
    )
    batch_exporter_port: int = Field(
        9109, ge=1, le=65535, description="Port of `trends batch exporter`, the batch layer's /metrics endpoint."
    )
    ingest_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Port of the /metrics endpoint of a long-running `trends ingest generate|file` (0: none; give "
        "each concurrent ingest process its own port).",
    )
    batch_read_timeout_s: float = Field(
        5.0,
        gt=0,
        le=60,
        description="The batch exporter reads Cassandra and Airflow when scraped; a read not done within this many "
        "seconds is abandoned and its `_up` gauge says 0 (keep it below Prometheus's scrape timeout).",
    )
    batch_scan_days: int = Field(
        31,
        ge=1,
        le=3660,
        description="The batch exporter counts missing hours (closed, without a current run) over at most this many "
        "days up to the newest closed hour: one pointer read per day and scrape.",
    )
    airflow_enabled: bool = Field(
        True,
        description="The batch exporter also asks Airflow's REST API (as `airflow.admin_user`) for the last "
        "successful run of each DAG and recently failed task instances.",
    )
    airflow_dags: list[str] = Field(list(DAG_IDS), description="The DAGs the batch exporter reports on (JSON list).")
    airflow_failed_window_s: int = Field(
        24 * 3600,
        ge=60,
        description="Failed task instances count while they ended less than this many seconds ago (or until they "
        "are cleared and succeed).",
    )
    prometheus_port: int = Field(
        9090, ge=1, le=65535, description="Port of the local stack's Prometheus server (UI, HTTP API), on loopback."
    )
    scrape_interval_s: float = Field(
        15.0, gt=0, description="How often the local Prometheus scrapes the pipeline's /metrics endpoints, seconds."
    )
    evaluation_interval_s: float = Field(
        15.0, gt=0, description="How often the local Prometheus evaluates the alert rules, seconds."
    )


class PrivacySettings(BaseModel):
    """Personal data: user ids pseudonymised from the first hop, the subject key, and erasure's deadline."""

    pseudonymise: bool = Field(
        True,
        description="Ingestion replaces every event's `user` by a random pseudonym (one per user, kept in "
        "Cassandra's `subjects` table under a keyed hash of the id) before it is encoded, so record keys, the JSON "
        "and content-derived event ids on the events topic hold no raw id. Off only where the ids are pseudonymous "
        "already (or for a replay of events that were pseudonymised before).",
    )
    subject_key_file: Path | None = Field(
        None,
        description="File holding the secret that keys the hash of user ids (at least 32 bytes; the local stack "
        "creates one, mode 0600, at `stack up`/`stack init`). Anyone with this key and a candidate id can find its "
        "row in `subjects`: keep it like a password, and the same on every producer. Never printed. Default: "
        "<data_dir>/privacy/subject.key.",
    )
    erasure_deadline_days: int = Field(
        30,
        ge=2,
        le=3650,
        description="Days within which an erasure request must be done (GDPR Art. 12(3): one month): a request "
        "still pending after them fires the alert TrendsErasureOverdue. The dead-letter "
        "topic, which keeps raw records, is created with a retention (and segment roll) that deletes a record "
        "before this deadline, whatever kafka.dlq_retention_ms says.",
    )
    pseudonym_cache_size: int = Field(
        200_000,
        ge=0,
        description="Pseudonyms a producing process keeps in memory (~200 bytes each; a full memory drops the "
        "oldest half); 0 asks Cassandra for every batch of events.",
    )
    pseudonym_cache_ttl_s: float = Field(
        300.0,
        gt=0,
        description="How long a producing process trusts a pseudonym it has read or created. A forgotten user's "
        "events keep their old pseudonym in running producers for at most this long, then get a new, unlinked one.",
    )
    hours_dedupe_size: int = Field(
        1_000_000,
        ge=0,
        description="(subject, hour) pairs a producing process remembers having recorded in the subject store, so "
        "each is written once per process and `privacy.pseudonym_cache_ttl_s` (a full memory drops the oldest half).",
    )
    lookup_concurrency: int = Field(
        64,
        ge=1,
        le=1024,
        description="Cassandra requests a producing process keeps in flight per batch of events to read or create "
        "pseudonyms and to record subjects' hours; the generator, the collector's requests and a replay's workers "
        "resolve several batches at once (the generator up to 8).",
    )
    exclude_on_forget: bool = Field(
        False,
        description="`trends privacy forget` (and the API's forget) also exclude the subject's events from the "
        "views, as `--exclude` does: the pseudonym goes to `erased_pseudonyms` and the request stays pending until "
        "the hours holding the subject are recomputed. Off: erasure unlinks the pseudonym only (crypto-shredding).",
    )
    export_max_hours: int = Field(
        24 * 366,
        ge=1,
        description="`trends privacy export` refuses a subject with more hours of history than this (a usage "
        "error naming the count): each hour is read from Kafka through the offset index.",
    )
