"""A collector request's records on their way to Kafka: one producer thread, and the answer built from the acks.

The one :class:`~ingestion.producer.EventProducer` is driven by one thread (:class:`ProducerLoop`): requests hand it
their validated records as a :class:`Batch` and wait for its answer, so the producer's callbacks and counters stay on
one thread, as in a replay. A batch is answered only once Kafka acknowledged every record of it (acks=all), with the
accepted and rejected counts; a record not acknowledged fails the whole request (:class:`DeliveryFailedError`).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

from pydantic import BaseModel, Field

from infra.settings import Settings
from ingestion.producer import Ack, Delivery, EventProducer
from ingestion.validate import Encoded, Reason, Reject

logger = logging.getLogger(__name__)

POLL_S: Final = 0.005  # the longest a new batch waits for the producer thread to take it


class RejectOut(BaseModel):
    """One rejected record: where it was in the request, why, and the detail (also in its dead-letter record)."""

    index: int = Field(
        description="0-based position in the request: the array element, or the line (blank lines count)."
    )
    reason: str = Field(description="The dead-letter reason code (`ingestion.validate.Reason`).")
    detail: str = Field(description="What is wrong with it, for a person.")


class Answer(BaseModel):
    """What happened to a request's records, once Kafka acknowledged every one of them."""

    accepted: int = Field(description="Events acknowledged on the events topic.")
    rejected: int = Field(description="Records acknowledged on the dead-letter topic, with their reason.")
    rejects: list[RejectOut] = Field(description="Each rejected record, in request order.")


@dataclass
class Batch:
    """A request's validated records on their way to Kafka, and the answer being assembled from their acks."""

    outcomes: list[tuple[int, Encoded | Reject]]
    answer: Future[Answer] = field(default_factory=Future)
    pending: int = 0
    accepted: int = 0
    rejects: list[RejectOut] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    events: set[int] = field(default_factory=set)  # positions of the records that are events

    def __post_init__(self) -> None:
        self.pending = len(self.outcomes)
        for index, outcome in self.outcomes:
            if isinstance(outcome, Reject):
                self.rejects.append(RejectOut(index=index, reason=str(outcome.reason), detail=outcome.detail))
            else:
                self.events.add(index)
        if not self.pending:
            self.settle()

    def ack(self, index: int, delivery: Delivery) -> None:
        """Take one record's delivery report; settle the answer after the last one (on the producer's thread)."""
        self.pending -= 1
        if delivery.error is not None:
            self.failed.append(delivery.error)
        elif delivery.rerouted is not None:  # an event the broker refused: its dead-letter copy is acknowledged
            self.rejects.append(RejectOut(index=index, reason=str(Reason.BROKER_REJECTED), detail=delivery.rerouted))
        elif index in self.events:
            self.accepted += 1
        if self.pending == 0:
            self.settle(DeliveryFailedError(self.failed) if self.failed else None)

    def settle(self, error: Exception | None = None) -> None:
        """Give the request its answer (or its error), unless it already has one or stopped waiting."""
        # The request may time out (cancelling the future) on the event loop's thread at any moment.
        with contextlib.suppress(InvalidStateError):
            if error is not None:
                self.answer.set_exception(error)
            else:
                self.answer.set_result(self._answer())

    def _answer(self) -> Answer:
        rejects = sorted(self.rejects, key=lambda r: r.index)
        return Answer(accepted=self.accepted, rejected=len(rejects), rejects=rejects)


class DeliveryFailedError(Exception):
    """Some records of a request were not acknowledged (the request is answered 503)."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__(f"{len(errors)} record(s) not acknowledged; first: {errors[0]}")
        self.errors = errors


class ProducerLoop:
    """Run the one :class:`EventProducer` on its own thread: produce the batches handed to it, serve the acks."""

    def __init__(self, settings: Settings, config: dict[str, Any] | None = None) -> None:
        timeout_ms = int(settings.collector.delivery_timeout_s * 1000)
        # A record not acknowledged by the time its request gives up fails in the producer too: nothing is left
        # queued behind a 503 to pile up while Kafka is away.
        self.producer = EventProducer(settings, config={"message.timeout.ms": timeout_ms, **(config or {})})
        self.queue_limit = settings.ingest.queue_max_messages
        self._todo: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="collector-producer", daemon=True)
        self._stopped = threading.Event()

    def start(self) -> None:
        """Start the producer's thread."""
        self._thread.start()

    def submit(self, batch: Batch) -> None:
        """Hand a batch to the producer's thread."""
        self._todo.put(batch)

    def queued(self) -> int:
        """Return the records queued locally or in flight (thread-safe)."""
        return len(self.producer)

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                if not self._step():
                    break
            except Exception:  # the thread must outlive any one failure, or every later request would hang
                logger.exception("the collector's producer thread failed; carrying on")
                time.sleep(POLL_S)

    def _step(self) -> bool:
        """Produce the next batch, or serve delivery reports; return False when asked to stop."""
        producer = self.producer
        try:
            batch = self._todo.get(timeout=POLL_S) if not len(producer) else self._todo.get_nowait()
        except queue.Empty:
            producer.poll(POLL_S if len(producer) else 0)
            return True
        if batch is None:
            return False
        try:
            self._produce(batch)
        except Exception as exc:  # a fatal producer error: this request fails, the server says so
            logger.exception("the producer failed on a batch")
            batch.settle(DeliveryFailedError([f"{type(exc).__name__}: {exc}"]))
        producer.poll(0)
        return True

    def _produce(self, batch: Batch) -> None:
        producer = self.producer
        events: list[tuple[bytes, bytes | None, int, Ack]] = []
        for index, outcome in batch.outcomes:
            if isinstance(outcome, Reject):
                producer.produce_reject(outcome, ack=partial(batch.ack, index))
            else:
                events.append((*outcome, partial(batch.ack, index)))
        producer.produce_acked(events)

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the thread and flush what is queued (at most ``timeout_s``)."""
        self._todo.put(None)
        self._thread.join(timeout_s)
        self._stopped.set()
        summary = self.producer.close(timeout_s, raise_on_failure=False)
        if not summary.ok:
            logger.warning("collector stopped with undelivered records: %s", "; ".join(summary.lines()))
