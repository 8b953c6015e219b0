"""The one Kafka producer of ingestion: idempotent, acks=all, back-pressured, counted, flushed on close.

:class:`EventProducer` writes events (keyed by the configured field, record timestamp = event time) to the
events topic and rejects to the dead-letter topic. Delivery reports are counted per topic; a record the broker
refuses for its content (too large, bad timestamp…) is re-routed to the dead-letter topic with reason
``broker_rejected`` instead of vanishing. Other delivery errors are gathered and raised by :meth:`close` after
the last flush (Airflow's produce operator does the same), so a caller sees every failure, once. A caller that
answers for each record (the HTTP collector) passes an ``ack`` callback, told where each record ended up.

Every path builds the event's canonical wire JSON; with ``kafka.events_format`` ``avro`` it is transcoded into
framed Avro (:mod:`views.event_avro`) just before it is queued, and a refused record's dead letter keeps its JSON.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from infra.errors import TrendsError
from infra.settings import Settings
from ingestion.dlq import encode_reject
from ingestion.pseudonyms import Pseudonymiser
from ingestion.validate import Reason, Reject
from views.event import Event
from views.event_avro import UnreadableEventError, events_writer

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message

logger = logging.getLogger(__name__)

POLL_EVERY: Final = 1000  # serve delivery callbacks after this many produce calls
QUEUE_FULL_POLL_S: Final = 0.1
MAX_ERROR_SAMPLES: Final = 20
# Errors by which the broker refuses a record for what it is; retrying cannot help, the dead-letter topic can.
_CONTENT_ERRORS: Final = (
    "MSG_SIZE_TOO_LARGE",
    "INVALID_TIMESTAMP",
    "INVALID_RECORD",
    "INVALID_MSG",
    "RECORD_LIST_TOO_LARGE",
    "POLICY_VIOLATION",
)


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where one record ended up, as its ``ack`` callback is told (from inside :meth:`EventProducer.poll`).

    :arg topic: the topic it was acknowledged on (or failed on).
    :arg error: None when the broker acknowledged it (acks=all), else the delivery error.
    :arg rerouted: set when the broker refused the event for its content and its dead-letter copy was
        acknowledged instead: the refusal's text.
    """

    topic: str
    error: str | None = None
    rerouted: str | None = None


Ack = Callable[[Delivery], None]


class DeliveryError(TrendsError):
    """Some records were not acknowledged; the summary says how many and why."""

    def __init__(self, message: str, summary: IngestSummary) -> None:
        super().__init__(message)
        self.summary = summary


@dataclass
class IngestSummary:
    """What a produce run did: the counts an operator checks at the end, and the rate."""

    produced: int = 0  # events handed to the producer
    sent: int = 0  # events acknowledged by the broker (acks=all)
    failed: int = 0  # events whose delivery failed
    refused: int = 0  # events the broker refused for their content, re-routed to the dead-letter topic
    invalid: Counter[str] = field(default_factory=Counter)  # rejects handed to the dead-letter topic, by reason
    dlq_sent: int = 0  # dead-letter records acknowledged
    dlq_failed: int = 0  # dead-letter records whose delivery failed
    undelivered: int = 0  # records still unacknowledged when close() gave up waiting
    queue_full_waits: int = 0  # back-pressure pauses on a full local queue
    elapsed_s: float = 0.0
    interrupted: bool = False
    errors: list[str] = field(default_factory=list)  # the first delivery errors

    @property
    def invalid_total(self) -> int:
        """Return the number of rejected records."""
        return sum(self.invalid.values())

    @property
    def events_per_s(self) -> float:
        """Return acknowledged events per second of the run."""
        return self.sent / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def ok(self) -> bool:
        """Tell whether every record reached its topic."""
        return not (self.failed or self.dlq_failed or self.undelivered)

    def lines(self) -> list[str]:
        """Return the human summary printed at the end of a run."""
        out = [
            f"sent      {self.sent:>12,} events in {self.elapsed_s:.1f} s ({self.events_per_s:,.0f} events/s)",
            f"failed    {self.failed:>12,}",
            f"invalid   {self.invalid_total:>12,} (dead-letter records acknowledged: {self.dlq_sent:,}, "
            f"failed: {self.dlq_failed:,})",
        ]
        out += [f"  {reason:<20} {count:>8,}" for reason, count in sorted(self.invalid.items())]
        if self.refused:
            out.append(f"refused   {self.refused:>12,} by the broker (re-routed to the dead-letter topic)")
        if self.undelivered:
            out.append(f"undelivered {self.undelivered:>10,} (still queued when the flush timed out)")
        if self.queue_full_waits:
            out.append(f"back-pressure waits {self.queue_full_waits:,}")
        if self.interrupted:
            out.append("interrupted: stopped reading, flushed what was queued")
        out += [f"error: {e}" for e in self.errors[:5]]
        return out


def producer_config(settings: Settings) -> dict[str, Any]:
    """Return the librdkafka configuration of ingestion's producer (without callbacks)."""
    ingest = settings.ingest
    return {
        **settings.kafka.client_config(),
        "enable.idempotence": True,
        "acks": "all",
        "compression.type": ingest.compression_type,
        "linger.ms": ingest.linger_ms,
        "batch.size": ingest.batch_size,
        "queue.buffering.max.messages": ingest.queue_max_messages,
        "queue.buffering.max.kbytes": ingest.queue_max_kbytes,
        "message.timeout.ms": ingest.message_timeout_ms,
    }


class EventProducer:
    """Produce events and rejects with delivery accounting; use as a context manager or call :meth:`close`.

    :arg settings: the settings (Kafka connection, topics, ``ingest`` producer tuning and key field).
    :arg config: extra librdkafka properties, applied last (tests, benchmarks).
    :arg pseudonymise: replace users by pseudonyms in :meth:`produce` (default: ``privacy.pseudonymise``); the
        :attr:`pseudonymiser` is there for the callers that encode events themselves (:meth:`produce_many`).
    :arg success_reports: take a delivery report for every record (needed for per-record acks). Without them the
        broker's failures are still reported, and the acknowledged counts are what was queued less the failures
        and what is still in flight: exact once flushed, never above the truth before. A report per record costs a
        Python call each, about a sixth of fast generation.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        config: dict[str, Any] | None = None,
        pseudonymise: bool | None = None,
        success_reports: bool = True,
    ) -> None:
        from confluent_kafka import KafkaError, Producer  # noqa: PLC0415

        on = settings.privacy.pseudonymise if pseudonymise is None else pseudonymise
        self.pseudonymiser = Pseudonymiser.from_settings(settings) if on else None
        self.events_topic = settings.kafka.events_topic
        self.dlq_topic = settings.kafka.dlq_topic
        self.key_field = settings.ingest.key_field
        # None for JSON: the values are queued as built. Avro: registered once per process (needs the registry).
        self._avro = events_writer(settings)
        self.summary = IngestSummary()
        self._content_errors = {getattr(KafkaError, name) for name in _CONTENT_ERRORS if hasattr(KafkaError, name)}
        self._flush_timeout_s = settings.ingest.message_timeout_ms / 1000 + 30
        self._reroute: list[tuple[bytes, str, Ack | None]] = []
        self._fatal: str | None = None
        self._last_error_log = 0.0
        self._since_poll = 0
        self._closed = False
        self._started = time.monotonic()
        self._success_reports = success_reports
        self._queued = {self.events_topic: 0, self.dlq_topic: 0}  # records queued per topic (counted without reports)
        self._refused_queued = 0  # events the broker refused after they were queued (the client refuses some before)
        conf = {
            **producer_config(settings),
            **({} if success_reports else {"delivery.report.only.error": True}),
            "on_delivery": self._on_delivery,
            "error_cb": self._on_error,
            "logger": logging.getLogger(f"{__name__}.librdkafka"),
            **(config or {}),
        }
        self._producer = Producer(conf)

    def check_topics(self, timeout_s: float = 15.0) -> None:
        """Make sure both topics exist before producing (the broker does not auto-create them).

        Without this, records for a missing topic wait the whole message timeout before failing.

        :raises TrendsError: when the broker cannot be reached or a topic is missing.
        """
        from confluent_kafka import KafkaException  # noqa: PLC0415

        try:
            topics = self._producer.list_topics(timeout=timeout_s).topics
        except KafkaException as exc:
            msg = f"cannot reach Kafka: {exc}"
            raise TrendsError(msg) from exc
        missing = [t for t in (self.events_topic, self.dlq_topic) if t not in topics or topics[t].error is not None]
        if missing:
            msg = f"topic(s) {', '.join(missing)} do not exist; create them with `trends stack up` (or check settings)"
            raise TrendsError(msg)

    # -- callbacks (run inside poll/flush, on the calling thread) ---------------------------------------------
    def _on_delivery(self, err: KafkaError | None, msg: Message, ack: Ack | None = None) -> None:
        summary = self.summary
        topic = msg.topic() or ""
        if err is None:
            if topic == self.events_topic:
                summary.sent += 1
            else:
                summary.dlq_sent += 1
            if ack is not None:
                ack(Delivery(topic))
            return
        if topic == self.events_topic:
            if err.code() in self._content_errors:
                self._reroute.append((msg.value() or b"", f"the broker refused the event: {err.str()}", ack))
                summary.refused += 1
                self._refused_queued += 1
                return
            summary.failed += 1
        else:
            summary.dlq_failed += 1
        if len(summary.errors) < MAX_ERROR_SAMPLES:
            summary.errors.append(f"{topic}: {err.str()}")
        if ack is not None:
            ack(Delivery(topic, err.str()))

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._fatal = err.str()
            logger.error("fatal producer error: %s", err.str())
            return
        now = time.monotonic()
        if now - self._last_error_log > 5:  # a broker restart raises one error per connection attempt
            self._last_error_log = now
            logger.warning("producer: %s (retrying)", err.str())

    # -- producing ---------------------------------------------------------------------------------------------
    def _send(
        self, topic: str, value: bytes, key: bytes | None, ts_ms: int, headers: Any = None, ack: Ack | None = None
    ) -> None:
        from confluent_kafka import KafkaException  # noqa: PLC0415

        # A record with an ack gets its own delivery callback (which still counts it in the summary).
        extra: dict[str, Any] = {} if ack is None else {"on_delivery": partial(self._on_delivery, ack=ack)}
        while True:
            try:
                self._producer.produce(topic, value, key, timestamp=ts_ms, headers=headers, **extra)
                self._queued[topic] += 1
                break
            except BufferError:
                self._wait_for_room()
            except KafkaException as exc:
                self._raise_on_fatal()
                if topic == self.events_topic and exc.args[0].code() in self._content_errors:
                    self._reroute.append((value, f"the client refused the event: {exc.args[0].str()}", ack))
                    self.summary.refused += 1
                    break
                raise
        self._since_poll += 1
        if self._since_poll >= POLL_EVERY:
            self.poll(0)

    def _need_reports(self) -> None:
        """Refuse a record with an ack before anything is counted: its ack needs a report (every path with one asks)."""
        if not self._success_reports:
            msg = "a record with an ack needs a producer with success_reports"
            raise ValueError(msg)

    def _wait_for_room(self) -> None:
        """Apply back-pressure: serve delivery reports until the local queue has room again."""
        self.summary.queue_full_waits += 1
        self._raise_on_fatal()
        self._producer.poll(QUEUE_FULL_POLL_S)

    def _raise_on_fatal(self) -> None:
        if self._fatal is not None:
            msg = f"the producer hit a fatal error and cannot continue: {self._fatal}"
            raise DeliveryError(msg, self.summary)

    def produce(self, event: Event) -> None:
        """Queue an event for the events topic (key per settings, record timestamp = event time).

        With a :attr:`pseudonymiser` the user is replaced by its pseudonym first (and its hour recorded).
        """
        if self.pseudonymiser is not None:
            event = self.pseudonymiser.event(event)
        self.summary.produced += 1
        value = event.to_json() if self._avro is None else self._avro(event.to_json())
        self._send(self.events_topic, value, event.key(self.key_field), event.ts_ms)

    def produce_encoded(self, value: bytes, key: bytes | None, ts_ms: int, *, ack: Ack | None = None) -> None:
        """Queue an already normalized (and, where on, pseudonymised) event: the caller built the JSON itself.

        :arg ack: called once with where the record ended up (acknowledged, failed, or re-routed).
        """
        if ack is not None:
            self._need_reports()
        self.summary.produced += 1
        self._send(self.events_topic, value if self._avro is None else self._avro(value), key, ts_ms, ack=ack)

    def produce_many(self, values: Sequence[bytes], keys: Sequence[bytes | None], ts_ms: Sequence[int]) -> None:
        """Queue many already normalized (and, where on, pseudonymised) events; the tight loop of fast generation."""
        from confluent_kafka import KafkaException  # noqa: PLC0415

        if self._avro is not None:
            values = self._avro.many(values)
        produce = self._producer.produce
        topic = self.events_topic
        since_poll = self._since_poll
        queued = fast = 0
        try:
            for value, key, ts in zip(values, keys, ts_ms, strict=True):
                try:
                    produce(topic, value, key, timestamp=ts)
                    fast += 1
                except (BufferError, KafkaException):
                    self._send(topic, value, key, ts)  # the slow path: waits for room, re-routes, raises fatal errors
                queued += 1
                since_poll += 1
                if since_poll >= POLL_EVERY:
                    self._since_poll = 0
                    self.poll(0)
                    since_poll = 0
        finally:  # a fatal error mid-batch: the events queued before it are counted
            self._since_poll = since_poll
            self.summary.produced += queued
            self._queued[topic] += fast

    def produce_acked(self, records: Sequence[tuple[bytes, bytes | None, int, Ack]]) -> None:
        """Queue already normalized events (value, key, timestamp, ack), each with its ack (the HTTP collector).

        The tight loop of :meth:`produce_many`, with a delivery callback per record; the slow path of
        :meth:`produce_encoded` for a full queue, a refused record or a fatal error.
        """
        from confluent_kafka import KafkaException  # noqa: PLC0415

        self._need_reports()
        if self._avro is not None:
            avro = self._avro
            records = [(avro(value), key, ts, ack) for value, key, ts, ack in records]
        produce = self._producer.produce
        topic = self.events_topic
        on_delivery = self._on_delivery
        since_poll = self._since_poll
        queued = 0
        try:
            for value, key, ts, ack in records:
                try:
                    produce(topic, value, key, timestamp=ts, on_delivery=partial(on_delivery, ack=ack))
                    self._queued[topic] += 1
                except (BufferError, KafkaException):
                    self._send(topic, value, key, ts, ack=ack)
                queued += 1
                since_poll += 1
                if since_poll >= POLL_EVERY:
                    self._since_poll = 0
                    self.poll(0)
                    since_poll = 0
        finally:
            self._since_poll = since_poll
            self.summary.produced += queued

    def produce_reject(self, reject: Reject, *, ack: Ack | None = None) -> None:
        """Queue a rejected record for the dead-letter topic and count it by reason.

        :arg ack: called once with where the record ended up (acknowledged or failed).
        """
        if ack is not None:
            self._need_reports()
        value, headers, ts_ms = encode_reject(reject)
        self.summary.invalid[str(reject.reason)] += 1
        self._send(self.dlq_topic, value, None, ts_ms, headers, ack=ack)

    def produce_outcome(self, outcome: Event | Reject) -> None:
        """Queue a validation outcome where it belongs."""
        if isinstance(outcome, Event):
            self.produce(outcome)
        else:
            self.produce_reject(outcome)

    def poll(self, timeout: float = 0) -> None:
        """Serve delivery reports (and re-route refused events); also a way to wait ``timeout`` seconds."""
        self._since_poll = 0
        self._producer.poll(timeout)
        self._drain_reroutes()
        self._count_unreported()

    def _count_unreported(self) -> None:
        """Without success reports: acknowledged = queued - failed - still in flight (a lower bound until flushed)."""
        if self._success_reports:
            return
        summary, in_flight = self.summary, len(self._producer)
        summary.sent = max(0, self._queued[self.events_topic] - summary.failed - self._refused_queued - in_flight)
        summary.dlq_sent = max(0, self._queued[self.dlq_topic] - summary.dlq_failed - in_flight)

    def _drain_reroutes(self) -> None:
        while self._reroute:
            raw, detail, ack = self._reroute.pop()
            raw = self._dead_letter_value(raw)
            now = datetime.now(UTC)
            # The event's ack now follows its dead-letter copy, told why it went there.
            rerouted = None if ack is None else _rerouted(ack, detail)
            self.produce_reject(Reject(raw, Reason.BROKER_REJECTED, detail, "producer", None, now), ack=rerouted)

    def _dead_letter_value(self, value: bytes) -> bytes:
        """Return a refused event's value as its dead letter keeps it: the wire JSON (Avro transcoded back)."""
        if self._avro is None:
            return value
        try:
            return self._avro.wire(value)
        except UnreadableEventError:  # not one of ours (cannot happen): keep the bytes as they were
            logger.warning("a refused event's value does not decode; its dead letter keeps the Avro bytes")
            return value

    def __len__(self) -> int:
        """Return the records queued locally or in flight."""
        return len(self._producer)

    # -- the end -----------------------------------------------------------------------------------------------
    def close(self, timeout_s: float | None = None, *, raise_on_failure: bool = True) -> IngestSummary:
        """Flush everything, then raise if any record was not delivered (after the last flush, never before).

        :arg timeout_s: longest wait for acknowledgements (default: the message timeout plus 30 s).
        :raises DeliveryError: when records failed or were still undelivered at the deadline.
        """
        if not self._closed:
            self._closed = True
            if self.pseudonymiser is not None:
                self.pseudonymiser.close()
            deadline = time.monotonic() + (timeout_s if timeout_s is not None else self._flush_timeout_s)
            while True:
                self._drain_reroutes()
                remaining = self._producer.flush(max(0.0, min(1.0, deadline - time.monotonic())))
                if (remaining == 0 and not self._reroute) or time.monotonic() >= deadline or self._fatal:
                    break
            self._drain_reroutes()
            self._count_unreported()
            self.summary.undelivered = len(self._producer)
            self.summary.elapsed_s = time.monotonic() - self._started
            logger.info(
                "producer closed: %d sent, %d failed, %d invalid, %d undelivered",
                self.summary.sent,
                self.summary.failed,
                self.summary.invalid_total,
                self.summary.undelivered,
            )
        if raise_on_failure and not self.summary.ok:
            s = self.summary
            msg = (
                f"{s.failed + s.dlq_failed + s.undelivered} record(s) were not delivered "
                f"({s.failed} events failed, {s.dlq_failed} dead-letter records failed, {s.undelivered} undelivered); "
                f"first errors: {s.errors[:3]}"
            )
            raise DeliveryError(msg, s)
        return self.summary

    def __enter__(self) -> EventProducer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Flush in every case; do not let a delivery error hide the exception already in flight.
        self.close(raise_on_failure=exc_type is None)


def _rerouted(ack: Ack, detail: str) -> Ack:
    """Return an ack that tells ``ack`` its record was re-routed to the dead-letter topic, and why."""
    return lambda delivery: ack(replace(delivery, rerouted=detail))
