"""The settings of ingestion: how records are validated and produced, the HTTP collector, and the Kafka bridge.

Sections of :class:`infra.settings.Settings` for the ways records come in (``trends ingest``, ``trends collect``);
the other parts of the pipeline are configured in :mod:`infra.pipeline_settings`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class IngestSettings(BaseModel):
    """How ingestion validates and produces: allowed clock skew, record key and producer tuning."""

    max_future_skew_s: float = Field(
        300.0,
        ge=0,
        le=3600,
        description="Events whose time is more than this many seconds in the future are dead-lettered "
        "(reason future_time). At most 3600: the broker rejects timestamps over 1 h ahead by default.",
    )
    key_field: Literal["item", "user", "id", "none"] = Field(
        "item",
        description="Event field that keys records in the events topic (`none`: no key, sticky partitioning). "
        "Keying by item keeps an item's events in one partition.",
    )
    compression_type: Literal["none", "gzip", "snappy", "lz4", "zstd"] = Field(
        "lz4", description="compression.type of the producer (lz4: cheap on CPU, good on JSON)."
    )
    linger_ms: float = Field(
        5.0, ge=0, description="linger.ms: how long the producer waits to fill a batch (throughput vs latency)."
    )
    batch_size: int = Field(131072, ge=1024, description="batch.size in bytes of one partition's record batch.")
    queue_max_messages: int = Field(
        500000,
        ge=1000,
        description="queue.buffering.max.messages: records the producer buffers locally before it applies "
        "back-pressure (poll and retry).",
    )
    queue_max_kbytes: int = Field(262144, ge=1024, description="queue.buffering.max.kbytes: local buffer bound in KiB.")
    message_timeout_ms: int = Field(
        300000,
        ge=1000,
        description="message.timeout.ms: how long a record may wait for an acknowledgement (retries included, e.g. "
        "across a broker restart) before it counts as failed.",
    )
    progress_interval_s: float = Field(
        2.0, gt=0, description="Seconds between progress lines of `trends ingest` (rate, sent, rejected)."
    )


class CollectorSettings(BaseModel):
    """The HTTP collector of ``trends collect``: where it listens and the limits that keep one client from the rest.

    Requests need the API token of ``serving.api_token`` when it is set (one token for the HTTP endpoints).
    """

    host: str = Field(
        "127.0.0.1",
        description="Address the collector binds to (loopback by default; off loopback it needs "
        "`serving.api_token`, at least 16 characters).",
    )
    port: int = Field(8010, ge=0, le=65535, description="Port of the collector (`POST /api/v1/events`).")
    max_body_bytes: int = Field(
        10 * 1024 * 1024,
        ge=1024,
        description="Largest request body, in bytes, counted both as sent and after gzip decompression (a 413 "
        "past it): `Content-Length` is checked first, then the bytes as they are read and inflated.",
    )
    max_records: int = Field(
        10_000, ge=1, le=1_000_000, description="Most records (events) one request may carry (a 413 past it)."
    )
    rate_limit_events_s: float = Field(
        0.0,
        ge=0,
        description="Events per second the collector accepts (a token bucket over all clients; 0: no limit). A "
        "request that would overdraw it is refused whole with a 429 and `Retry-After`.",
    )
    rate_limit_burst: int = Field(
        20_000,
        ge=1,
        description="Events the token bucket holds when full: a burst after a quiet spell. A request of more "
        "records than this is refused while a rate limit is set (keep it at least `max_records`).",
    )
    delivery_timeout_s: float = Field(
        10.0,
        gt=0,
        le=300,
        description="How long a request waits for Kafka to acknowledge all its records (acks=all) before it is "
        "answered 503 with `Retry-After`. It is also the producer's message.timeout.ms, so a refused request "
        "leaves nothing queued behind it.",
    )
    retry_after_s: int = Field(
        5, ge=1, le=3600, description="`Retry-After` (seconds) of a 503 while Kafka does not acknowledge in time."
    )


class BridgeSettings(BaseModel):
    """The Kafka bridge (`trends ingest kafka`): a consumer group on other topics, transactions into `events`."""

    sources: list[str] = Field(
        default_factory=list,
        description="Source topics of `trends ingest kafka` when no --from is given, and of the stack's `bridge` "
        'service (JSON list, e.g. \'["clicks", "orders"]\').',
    )
    format: Literal["json", "avro", "protobuf"] = Field(
        "json", description="Format of the source topics when no --format is given (and of the `bridge` service)."
    )
    mapping: list[str] = Field(
        default_factory=list,
        description="FIELD=COLUMN words of the mapping when no -m is given (JSON list, e.g. '[\"item=page\"]').",
    )
    dims: list[str] = Field(
        default_factory=list, description="NAME[=COLUMN] dimensions when no --dim is given (JSON list)."
    )
    group_id: str = Field(
        "trends-bridge",
        min_length=1,
        description="Consumer group of the bridge on its source topics (`--group`); its committed offsets are "
        "where a restarted bridge resumes.",
    )
    transactional_id: str | None = Field(
        None,
        description="transactional.id of the bridge's producer (`--transactional-id`). Unset: `<group>.bridge`. "
        "Stable across restarts, so a restarted bridge fences its killed predecessor and aborts its open "
        "transaction at once; each bridge running in the same group needs its own.",
    )
    transaction_records: int = Field(
        5000, ge=1, description="Most source records per transaction (one offset commit each)."
    )
    transaction_ms: float = Field(
        250.0,
        gt=0,
        description="Longest a transaction collects records before it commits, milliseconds: the added latency, "
        "and how long read_committed readers of the events topic wait behind an open transaction.",
    )
    transaction_timeout_ms: int = Field(
        60000,
        ge=1000,
        description="transaction.timeout.ms: a transaction of a bridge that died and never came back is aborted "
        "by the broker after this long (a restarted bridge aborts it at once).",
    )
    session_timeout_ms: int = Field(
        10000,
        ge=6000,
        description="session.timeout.ms of the bridge's consumer: how long the partitions of a bridge that died "
        "stay assigned to it before the group hands them to another (or to its restart).",
    )
    max_commit_attempts: int = Field(
        5,
        ge=1,
        description="Attempts at one batch whose transaction aborts (a broker error): after each the batch is "
        "re-read from the committed offsets; then the bridge stops with the error.",
    )
