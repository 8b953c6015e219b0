"""The Kafka bridge: records of other topics, exactly once, into the events topic (and rejects into the dead letters).

A consume-transform-produce loop on Kafka transactions (KIP-98, with KIP-447's group metadata): the bridge reads
its source topics as a consumer group (``isolation.level=read_committed``, no auto-commit), decodes each record
(:mod:`ingestion.wire`), maps and validates it exactly as a file replay does (:mod:`ingestion.validate`), and in one
transaction produces the batch's events and dead letters *and* commits the batch's source offsets
(``send_offsets_to_transaction`` with the consumer's group metadata). Either all of that becomes visible to
``read_committed`` readers or none of it does, so a kill at any point neither loses nor duplicates an event: the
next bridge (same ``transactional.id``) aborts the open transaction and resumes at the committed offsets.

Decoding runs before the transaction begins: a schema registry that does not answer is waited for (bounded,
with back-off) with no transaction open, and when it stays away the bridge stops with an error, having
committed nothing past the record it could not decode. A transaction that fails (a broker error) is aborted, the
consumer rewound to the batch's first offsets, and the batch read again; after ``bridge.max_commit_attempts``
failures in a row the bridge stops with the error.

With ``kafka.events_format`` ``avro`` the events go out as framed Avro of the contract (:mod:`views.event_avro`),
transcoded from their wire JSON as the transaction produces them; dead letters keep the source record's bytes.

Readers of the events topic must read with ``read_committed`` (librdkafka's default; Spark's Kafka source needs
``kafka.isolation.level``, which :func:`infra.spark.kafka_options` sets), or they see aborted records too.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, cast

from infra.errors import TrendsError
from infra.settings import Settings
from infra.settings_env import env_var
from ingestion.mapping import DEFAULT_MAPPING, ColumnMapping
from ingestion.producer import IngestSummary, producer_config
from ingestion.pseudonyms import KnownPairs, Pseudonymiser
from ingestion.validate import Context, Encoded, Reason, Reject, encode_fields, encode_json, encode_json_fast
from ingestion.wire import Decoder, Format, RegistryUnavailable, Undecodable, decoder
from views.event_avro import events_writer

if TYPE_CHECKING:
    from confluent_kafka import Message

logger = logging.getLogger(__name__)

TIMEOUT_S: Final = 30.0
QUEUE_FULL_POLL_S: Final = 0.05


class BridgeError(TrendsError):
    """The bridge stopped on an error it cannot get past (the message says where it stopped and why)."""


@dataclass
class BridgeStats:
    """What a bridge run did; ``summary`` holds the events and dead letters committed, as other ingest runs."""

    records: int = 0  # source records committed (events + dead letters)
    transactions: int = 0
    aborted: int = 0  # transactions aborted and their batch read again
    registry_waits: int = 0  # records that waited for the schema registry
    by_topic: Counter[str] = field(default_factory=Counter)
    first_record_at: float | None = None  # time.monotonic() when the first record arrived (rates exclude start-up)
    summary: IngestSummary = field(default_factory=IngestSummary)
    stopped: bool = False

    def lines(self) -> list[str]:
        """Return the human summary printed at the end of a run."""
        topics = ", ".join(f"{t} {n:,}" for t, n in sorted(self.by_topic.items())) or "none"
        out = [
            f"read      {self.records:>12,} records ({topics}) in {self.transactions:,} transactions",
            *self.summary.lines(),
        ]
        if self.aborted:
            out.append(f"aborted   {self.aborted:>12,} transactions (their records were read again)")
        if self.registry_waits:
            out.append(f"registry waits {self.registry_waits:,}")
        return out


Outcome = tuple["Message", Encoded | Reject]


def transform(
    value: bytes | None, where: tuple[str, int, int], decode: Decoder, ctx: Context, key: str
) -> Encoded | Reject:
    """Decode, map and validate one source record: its event as it goes to Kafka, or its reject with its position.

    :raises RegistryUnavailable: the registry did not answer (no verdict on the record: the caller retries).
    """
    topic, partition, offset = where
    raw = value or b""
    try:
        decoded = decode(value)
        done = encode_json(decoded, ctx, key) if isinstance(decoded, bytes) else encode_fields(decoded, raw, ctx, key)
    except Undecodable as exc:
        return Reject(raw, exc.reason, exc.detail[:500], topic, None, ctx.now, None, partition, offset)
    except RegistryUnavailable:
        raise
    except Exception as exc:  # the last guard: one bad record never stops the bridge
        logger.exception("validation failed unexpectedly at %s partition %s offset %s", topic, partition, offset)
        detail = f"{type(exc).__name__}: {exc}"[:500]
        return Reject(raw, Reason.INTERNAL_ERROR, detail, topic, None, ctx.now, None, partition, offset)
    if isinstance(done, Reject):
        return dataclasses.replace(done, raw=raw, partition=partition, offset=offset)
    return done


class Bridge:
    """Consume source topics and produce their events exactly once; :meth:`run` until asked to stop.

    :arg settings: Kafka, topics, ``bridge`` (group, transactions), ``registry`` and ``ingest`` (key, skew).
    :arg sources: the topics to read.
    :arg fmt: ``json``, ``avro`` or ``protobuf`` (the last two Confluent-framed, schemas from the registry).
    :arg mapping: source fields onto event fields, as for file replay.
    :arg consumer_config: extra librdkafka properties of the consumer, applied last (tests, benchmarks).
    :arg producer_config_extra: the same for the producer.
    """

    def __init__(
        self,
        settings: Settings,
        sources: Sequence[str],
        fmt: Format,
        mapping: ColumnMapping = DEFAULT_MAPPING,
        *,
        consumer_config: dict[str, Any] | None = None,
        producer_config_extra: dict[str, Any] | None = None,
    ) -> None:
        from confluent_kafka import Consumer, Producer  # noqa: PLC0415

        if not sources:
            msg = "the bridge needs at least one source topic"
            raise BridgeError(msg)
        self.settings = settings
        self.sources = list(dict.fromkeys(sources))
        clash = {settings.kafka.events_topic, settings.kafka.dlq_topic} & set(self.sources)
        if clash:
            msg = f"the bridge cannot read the topic it writes: {', '.join(sorted(clash))}"
            raise BridgeError(msg)
        self.fmt = fmt
        self.mapping = mapping
        self.cfg = settings.bridge
        self.key_field = settings.ingest.key_field
        self.events_topic = settings.kafka.events_topic
        self.dlq_topic = settings.kafka.dlq_topic
        self.transactional_id = self.cfg.transactional_id or f"{self.cfg.group_id}.bridge"
        self.stats = BridgeStats()
        self._decode: Decoder = decoder(fmt, settings.registry)
        self._events_avro = events_writer(settings)  # None: the events topic takes the wire JSON as it is
        self._pseudonymiser = Pseudonymiser.from_settings(settings)  # None with privacy.pseudonymise off
        # a JSON record of a (user, hour) this bridge had recorded, in the event's own form, is encoded with its
        # pseudonym at once rather than pseudonymised after
        fuse = fmt == "json" and self._pseudonymiser is not None and mapping.is_identity
        cache = settings.privacy.pseudonym_cache_size
        self._known = KnownPairs(cache) if fuse and cache > 0 else None
        self._skew = timedelta(seconds=settings.ingest.max_future_skew_s)
        self._consumer = Consumer(
            {
                **settings.kafka.client_config(),
                "group.id": self.cfg.group_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": "read_committed",  # a transactional source's aborted records are not events
                "auto.offset.reset": "earliest",
                "enable.partition.eof": False,
                "session.timeout.ms": self.cfg.session_timeout_ms,
                # a batch may wait for the registry that long without polling, and must not lose its partitions
                "max.poll.interval.ms": max(300_000, int((settings.registry.max_wait_s + 60) * 1000)),
                "logger": logging.getLogger(f"{__name__}.consumer"),
                **(consumer_config or {}),
            }
        )
        base = producer_config(settings)
        self._producer = Producer(
            {
                **base,
                "transactional.id": self.transactional_id,
                "transaction.timeout.ms": self.cfg.transaction_timeout_ms,
                "message.timeout.ms": min(base["message.timeout.ms"], self.cfg.transaction_timeout_ms),
                "logger": logging.getLogger(f"{__name__}.producer"),
                **(producer_config_extra or {}),
            }
        )
        self._started = time.monotonic()
        self._closed = False
        self._failures = 0  # transactions failed in a row

    # -- set-up ----------------------------------------------------------------------------------------------
    def check_topics(self) -> None:
        """Make sure the source topics and both target topics exist.

        :raises BridgeError: when Kafka does not answer or a topic is missing.
        """
        from confluent_kafka import KafkaException  # noqa: PLC0415

        try:
            topics = self._consumer.list_topics(timeout=TIMEOUT_S).topics
        except KafkaException as exc:
            msg = f"cannot reach Kafka at {self.settings.kafka.bootstrap_servers}: {exc}"
            raise BridgeError(msg) from exc
        missing_targets = [
            t for t in (self.events_topic, self.dlq_topic) if t not in topics or topics[t].error is not None
        ]
        if missing_targets:
            msg = f"topic(s) {', '.join(missing_targets)} do not exist; create them with `trends stack up`"
            raise BridgeError(msg)
        missing = [t for t in self.sources if t not in topics or topics[t].error is not None]
        if missing:
            msg = f"source topic(s) {', '.join(missing)} do not exist"
            raise BridgeError(msg)

    def start(self) -> None:
        """Fence any predecessor with our transactional id (aborting its open transaction), then subscribe."""
        from confluent_kafka import KafkaException  # noqa: PLC0415

        try:
            self._producer.init_transactions(TIMEOUT_S * 2)
        except KafkaException as exc:
            msg = f"cannot start transactions as {self.transactional_id}: {exc.args[0]}"
            raise BridgeError(msg) from exc
        self._consumer.subscribe(self.sources)
        logger.info(
            "bridge %s: reading %s (%s) as group %s into %s",
            self.transactional_id,
            ", ".join(self.sources),
            self.fmt,
            self.cfg.group_id,
            self.events_topic,
        )

    # -- the loop ----------------------------------------------------------------------------------------------
    def run(
        self,
        should_stop: Callable[[], bool] = lambda: False,
        *,
        idle_exit_s: float | None = None,
        on_batch: Callable[[BridgeStats], None] | None = None,
    ) -> BridgeStats:
        """Bridge batches until asked to stop (or idle for ``idle_exit_s``); each batch is one transaction.

        A batch's transaction commits on a thread of its own while the next batch is read and validated, so the
        wait for the broker's acknowledgements and transaction markers overlaps the next batch's Python work.
        Transactions still run one at a time, in order: the next begins only once the previous one committed.

        :raises BridgeError: when the registry stays away, a batch keeps failing, or the producer is fenced.
        """
        self.check_topics()
        self.start()
        idle_since = time.monotonic()
        self._failures = 0
        committing: tuple[Future[bool], list[Message]] | None = None
        with ThreadPoolExecutor(1, thread_name_prefix="bridge-commit") as pool:
            try:
                while not should_stop():
                    batch = self._consumer.consume(self.cfg.transaction_records, self.cfg.transaction_ms / 1000)
                    records = [m for m in batch if self._usable(m)]
                    if not records:
                        self._settled(committing, [], on_batch)
                        committing = None
                        if idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                            break
                        continue
                    idle_since = time.monotonic()
                    if self.stats.first_record_at is None:
                        self.stats.first_record_at = idle_since
                    outcomes, fused = self._outcomes(records, should_stop)
                    if outcomes is None:  # asked to stop while waiting for the registry: nothing was produced
                        self._settled(committing, [], on_batch)
                        committing = None
                        self._rewind(records)
                        break
                    if not self._settled(committing, records, on_batch):
                        committing = None  # the previous batch was aborted: both are read again
                        continue
                    # the group's generation as these records were read: a rebalance while the transaction commits
                    # (the next consume takes part in it) fences the commit, and the batch is read again
                    group = self._consumer.consumer_group_metadata()
                    committing = (pool.submit(self._transact, outcomes, group, fused), records)
            finally:
                self._settled(committing, [], on_batch)
        self.stats.stopped = should_stop()
        return self.stats

    def _settled(
        self,
        committing: tuple[Future[bool], list[Message]] | None,
        read_since: list[Message],
        on_batch: Callable[[BridgeStats], None] | None,
    ) -> bool:
        """Wait for the committing batch's transaction; tell whether it committed (True when none was in flight).

        An aborted transaction rewinds the consumer to that batch's first offsets, and also over the records read
        since (``read_since``), which the caller drops: all of them are read again, in order.

        :raises BridgeError: when the transaction cannot go on, or transactions failed too often in a row.
        """
        if committing is None:
            return True
        future, records = committing
        if future.result():
            self._failures = 0
            if on_batch is not None:
                on_batch(self.stats)
            return True
        self._rewind([*records, *read_since])
        self._failures += 1
        if self._failures >= self.cfg.max_commit_attempts:
            msg = (
                f"{self._failures} transactions in a row failed; stopped with nothing committed past "
                f"{self._where(records[0])}"
            )
            raise BridgeError(msg)
        return False

    def _usable(self, message: Message) -> bool:
        err = message.error()
        if err is None:
            return True
        from confluent_kafka import KafkaError  # noqa: PLC0415 - only for an error: this runs for every record

        if err.fatal() or err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.TOPIC_AUTHORIZATION_FAILED):
            msg = f"reading {message.topic()}: {err.str()}"
            raise BridgeError(msg)
        logger.warning("consumer: %s", err.str())
        return False

    def _outcomes(
        self, records: list[Message], should_stop: Callable[[], bool]
    ) -> tuple[list[Outcome] | None, frozenset[int]]:
        """Decode, map and validate a batch (no transaction open); None when asked to stop meanwhile.

        :returns: the outcomes, and the positions of events already encoded with their pseudonyms.
        """
        now = datetime.now(UTC)
        contexts: dict[str | None, Context] = {}
        out: list[Outcome] = []
        fused: set[int] = set()
        decode, key = self._decode, self.key_field
        fuse = self._known.lookup() if self._known is not None else None
        for message in records:
            topic = message.topic()
            ctx = contexts.get(topic)
            if ctx is None:
                ctx = contexts[topic] = Context(topic or "?", now, self._skew, self.mapping)
            if fuse is not None:
                value = message.value()
                raw = decode(value) if value else None  # JSON: its bytes, unframed
                done = encode_json_fast(raw, ctx, key, fuse) if isinstance(raw, bytes) else None
                if done is not None:
                    fused.add(len(out))
                    out.append((message, done))
                    continue
            where = (ctx.source, message.partition() or 0, message.offset() or 0)
            try:
                result = transform(message.value(), where, decode, ctx, key)
            except RegistryUnavailable:
                waited = self._outcome(message, where, ctx, should_stop)
                if waited is None:
                    return None, frozenset()
                result = waited
            out.append((message, result))
        return out, frozenset(fused)

    def _outcome(
        self, message: Message, where: tuple[str, int, int], ctx: Context, should_stop: Callable[[], bool]
    ) -> Encoded | Reject | None:
        """Transform a record the registry did not answer for, waiting for it (bounded, with back-off)."""
        started = time.monotonic()
        wait = self.settings.registry.backoff_s
        waited = False
        while True:
            try:
                return transform(message.value(), where, self._decode, ctx, self.key_field)
            except RegistryUnavailable as exc:
                if not waited:
                    waited = True
                    self.stats.registry_waits += 1
                elapsed = time.monotonic() - started
                if elapsed >= self.settings.registry.max_wait_s:
                    msg = (
                        f"the schema registry at {self.settings.registry.url} did not answer for {elapsed:.0f} s "
                        f"({env_var('registry.max_wait_s')}): stopped with nothing committed past "
                        f"{self._where(message)}; start the bridge again when the registry is back ({exc})"
                    )
                    raise BridgeError(msg) from exc
                logger.warning("%s; retrying in %.1f s", exc, wait)
                deadline = time.monotonic() + wait
                while time.monotonic() < deadline:  # no poll meanwhile: it would hand over records past this one
                    if should_stop():
                        return None
                    time.sleep(min(0.2, wait))
                wait = min(wait * 2, self.settings.registry.backoff_max_s)

    @staticmethod
    def _where(message: Message) -> str:
        return f"{message.topic()} partition {message.partition()} offset {message.offset()}"

    def _pseudonymised(self, outcomes: list[Outcome], fused: frozenset[int] = frozenset()) -> list[Outcome]:
        """Replace the events' users by their pseudonyms (their hours recorded first), as every path into Kafka does.

        The events at ``fused`` carry theirs already. The pairs recorded here are remembered for the next batches.
        """
        pseudonymiser = self._pseudonymiser
        if pseudonymiser is None:
            return outcomes
        at = [i for i, (_m, done) in enumerate(outcomes) if i not in fused and not isinstance(done, Reject)]
        known = self._known
        learned: dict[tuple[str, int], str] | None = None
        if known is not None and (at or known):  # every batch: a fused batch asks the store nothing else
            known.refresh(pseudonymiser)
            learned = {}
        if not at:
            return outcomes
        events = pseudonymiser.encoded([cast("Encoded", outcomes[i][1]) for i in at], self.key_field, learned)
        if known is not None and learned:
            known.learn(learned)
        out = list(outcomes)
        for i, event in zip(at, events, strict=True):
            out[i] = (out[i][0], event)
        return out

    def _transact(self, outcomes: list[Outcome], group: Any, fused: frozenset[int] = frozenset()) -> bool:
        """Produce a batch's outcomes and commit its offsets in one transaction; False when it was aborted."""
        from confluent_kafka import KafkaException  # noqa: PLC0415

        from ingestion.dlq import encode_reject  # noqa: PLC0415

        producer = self._producer
        events = 0
        rejects: Counter[str] = Counter()
        outcomes = self._pseudonymised(outcomes, fused)
        avro = self._events_avro
        try:
            producer.begin_transaction()
            produce, events_topic = producer.produce, self.events_topic
            for _message, done in outcomes:
                if isinstance(done, Reject):
                    value, headers, ts_ms = encode_reject(done)
                    self._produce(self.dlq_topic, value, None, ts_ms, headers)
                    rejects[str(done.reason)] += 1
                else:
                    value = done[0] if avro is None else avro(done[0])
                    try:
                        produce(events_topic, value, done[1], timestamp=done[2])
                    except BufferError:  # a full queue: the slow path waits for room (and counts the waits)
                        self._produce(events_topic, value, done[1], done[2], None)
                    events += 1
            producer.send_offsets_to_transaction(_next_offsets(outcomes), group, TIMEOUT_S)
            producer.commit_transaction(TIMEOUT_S * 2)
        except KafkaException as exc:
            err = exc.args[0]
            if err.fatal() or not (err.txn_requires_abort() or err.retriable()):
                msg = f"the transaction failed and the bridge cannot go on: {err.str()}"
                raise BridgeError(msg) from exc
            logger.warning("transaction aborted (%s); reading the batch again", err.str())
            self._abort()
            self.stats.aborted += 1
            return False  # the caller rewinds the consumer (on its own thread)
        stats = self.stats
        stats.transactions += 1
        stats.records += len(outcomes)
        stats.by_topic.update(message.topic() or "?" for message, _ in outcomes)
        s = stats.summary
        s.produced += events
        s.sent += events
        s.invalid.update(rejects)
        s.dlq_sent += rejects.total()
        s.elapsed_s = time.monotonic() - self._started
        return True

    def _produce(self, topic: str, value: bytes, key: bytes | None, ts_ms: int, headers: Any) -> None:
        while True:
            try:
                self._producer.produce(topic, value, key, timestamp=ts_ms, headers=headers)
                return
            except BufferError:
                self.stats.summary.queue_full_waits += 1
                self._producer.poll(QUEUE_FULL_POLL_S)

    def _abort(self) -> None:
        from confluent_kafka import KafkaException  # noqa: PLC0415

        try:
            self._producer.abort_transaction(TIMEOUT_S * 2)
        except KafkaException as exc:
            msg = f"aborting the transaction failed: {exc.args[0]}"
            raise BridgeError(msg) from exc

    def _rewind(self, records: list[Message]) -> None:
        """Seek each partition of a batch back to the batch's first offset there (its committed offset)."""
        from confluent_kafka import KafkaException, TopicPartition  # noqa: PLC0415

        firsts: dict[tuple[str, int], int] = {}
        for m in records:
            key = (m.topic() or "", m.partition() or 0)
            firsts[key] = min(firsts.get(key, m.offset() or 0), m.offset() or 0)
        for (topic, partition), offset in firsts.items():
            try:
                self._consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException as exc:  # no longer ours after a rebalance: its new owner reads from the commit
                logger.info("not rewinding %s/%s: %s", topic, partition, exc.args[0])

    def close(self) -> None:
        """Leave the group and close the clients (no transaction is open between batches)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._consumer.close()
        finally:
            self._producer.flush(TIMEOUT_S)
            if self._pseudonymiser is not None:
                self._pseudonymiser.close()
        self.stats.summary.elapsed_s = time.monotonic() - self._started


def _next_offsets(outcomes: list[Outcome]) -> list[Any]:
    """Return the offsets to commit for a batch: per source partition, one past its last record."""
    from confluent_kafka import TopicPartition  # noqa: PLC0415

    ends: dict[tuple[str, int], int] = {}
    for message, _ in outcomes:
        at = (message.topic() or "", message.partition() or 0)
        end = (message.offset() or 0) + 1
        if end > ends.get(at, -1):
            ends[at] = end
    return [TopicPartition(t, p, o) for (t, p), o in sorted(ends.items())]
