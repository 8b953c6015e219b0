"""Records lost from the events topic before the batch layer indexed them, and the hours they make incomplete.

Kafka deletes records (time or size retention, ``DeleteRecords``) without saying what they held; the event-time
index only learns that a partition's offsets ``[first, last]`` are gone. What it can say is a bound: every lost
record is older than :attr:`Loss.older_than`. Nothing bounds them from below — history replayed into a live topic
is exactly what a time retention deletes at once — so **every hour before the bound's end is incomplete** for
the loss, until a recompute accepts the loss for it (``trends batch run --accept-loss``): then the hour is whole
again as far as anybody will ever know, and its lineage says what was accepted. The rule, in one place:
:func:`incomplete_hours`. Reads here are plain reads of Cassandra (serving calls them for status and provenance).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from infra.cassandra import READ_PROFILE, write_many
from infra.settings import Settings
from views.buckets import HOUR, floor, utc
from views.store import cql

if TYPE_CHECKING:
    from cassandra.cluster import Session

MS = timedelta(milliseconds=1)


@dataclass(frozen=True)
class Loss:
    """Offsets ``[first_offset, last_offset]`` of a partition were removed before they were indexed.

    :arg older_than: every lost record's timestamp is before this (the later of the bounds the possible causes give).
    :arg retention_ms: the topic's ``retention.ms`` when the loss was noticed (-1: no time retention; None: unknown).
    :arg oldest_surviving: the timestamp of the first record kept after the gap (None: the partition is empty).
    """

    topic: str
    partition: int
    first_offset: int
    last_offset: int
    records: int
    noticed_at: datetime
    older_than: datetime
    retention_ms: int | None = None
    oldest_surviving: datetime | None = None

    @property
    def key(self) -> tuple[str, int, int]:
        """Return what identifies the loss: topic, partition, first offset."""
        return self.topic, self.partition, self.first_offset

    @property
    def hours_end(self) -> datetime:
        """Return the end of the hours the lost records may belong to: the hour holding the bound's last instant."""
        return floor(self.older_than - MS, HOUR) + HOUR

    def describe(self) -> str:
        """Return the loss as an operator reads it."""
        return (
            f"{self.topic} partition {self.partition} offsets {self.first_offset}..{self.last_offset} "
            f"({self.records} records, noticed {self.noticed_at:%Y-%m-%dT%H:%MZ}, all older than "
            f"{self.older_than:%Y-%m-%dT%H:%M:%SZ})"
        )

    def to_json(self) -> dict[str, Any]:
        """Return the loss as a JSON-able dict (lineage, status output)."""
        out = asdict(self)
        for name in ("noticed_at", "older_than", "oldest_surviving"):
            out[name] = out[name].isoformat() if out[name] else None
        out["hours_before"] = self.hours_end.isoformat()
        return out


def loss_bound(noticed_at: datetime, retention_ms: int | None, oldest_surviving: datetime | None) -> datetime:
    """Return the bound on the lost records' time: the later of what each possible cause of the deletion gives.

    Time retention deletes a segment only once its newest record is older than ``retention.ms`` before the deletion
    (so before ``noticed_at - retention.ms``); a size-bound deletion or ``DeleteRecords`` removes the oldest
    offsets, older than the first record kept when the log is in time order. Which cause it was is not known, so
    the later bound (the one true under both) is taken; with neither (or the topic's config unknown), the time it
    was noticed.
    """
    if retention_ms is None:  # the topic's config could not be read: nothing bounds the time a deletion had
        return noticed_at
    candidates = []
    if retention_ms >= 0:
        candidates.append(noticed_at - timedelta(milliseconds=retention_ms))
    if oldest_surviving is not None:
        candidates.append(oldest_surviving + MS)  # records at the surviving record's own millisecond too
    return max(candidates) if candidates else noticed_at


def plain(ts: datetime) -> datetime:
    """Return an aware time as a plain UTC ``datetime``.

    Airflow hands tasks pendulum times, whose ``//`` with a ``timedelta`` fails.
    """
    t = ts.astimezone(UTC)
    return datetime(t.year, t.month, t.day, t.hour, t.minute, t.second, t.microsecond, tzinfo=UTC)


def hours_of(start: datetime, end: datetime) -> list[datetime]:
    """Return the hours of ``[start, end)`` (start floored to its hour)."""
    out, hour = [], floor(plain(start), HOUR)
    while hour < end:
        out.append(hour)
        hour += HOUR
    return out


def incomplete_hours(
    losses: Iterable[Loss], accepted: Mapping[tuple[str, int, int], set[datetime]], start: datetime, end: datetime
) -> dict[datetime, list[Loss]]:
    """Return the hours of ``[start, end)`` some loss may touch and nobody accepted, with those losses.

    :arg accepted: per loss key, the hours its loss was accepted for (at least those of the range).
    """
    out: dict[datetime, list[Loss]] = {}
    for loss in losses:
        done = accepted.get(loss.key, set())
        for hour in hours_of(start, min(end, loss.hours_end)):
            if hour not in done:
                out.setdefault(hour, []).append(loss)
    return dict(sorted(out.items()))


def decode_loss(topic: str, r: Any) -> Loss:
    """Return a loss row as a :class:`Loss`."""
    return Loss(
        topic,
        int(r.partition),
        int(r.first_offset),
        int(r.last_offset),
        int(r.records),
        utc(r.noticed_at),  # type: ignore[arg-type]
        utc(r.older_than),  # type: ignore[arg-type]
        None if r.retention_ms is None else int(r.retention_ms),
        utc(r.oldest_surviving),
    )


def losses_json(losses: Iterable[Loss]) -> str:
    """Return losses as the lineage records them."""
    keys = ("topic", "partition", "first_offset", "last_offset", "records", "older_than")
    return json.dumps([{k: v for k, v in loss.to_json().items() if k in keys} for loss in losses])


class LossStore:
    """Prepared statements over the loss tables of one session."""

    def __init__(self, settings: Settings, sess: Session) -> None:
        self.settings = settings
        self.sess = sess
        self._stmt = cql.StatusStatements(settings, sess)

    # -- reads ----------------------------------------------------------------------------------------------------
    def losses_request(self, topic: str) -> tuple[Any, tuple[Any, ...]]:
        """Return the read of the topic's losses (decode each row with :func:`decode_loss`)."""
        return self._stmt(cql.SELECT_LOSSES), (topic,)

    def losses(self, topic: str) -> list[Loss]:
        """Return every loss recorded for the topic, by partition and offset."""
        rows = self.sess.execute(*self.losses_request(topic), execution_profile=READ_PROFILE)
        return [decode_loss(topic, r) for r in rows]

    def accepted(self, loss: Loss, start: datetime, end: datetime) -> set[datetime]:
        """Return the hours of ``[start, end)`` the loss was accepted for."""
        rows = self.sess.execute(
            self._stmt(cql.SELECT_LOSS_ACCEPTED),
            (loss.topic, loss.partition, loss.first_offset, start, end),
            execution_profile=READ_PROFILE,
        )
        return {utc(r.hour) for r in rows}  # type: ignore[misc]

    def incomplete(
        self, topic: str, start: datetime, end: datetime, losses: Sequence[Loss] | None = None
    ) -> dict[datetime, list[Loss]]:
        """Return the incomplete hours of ``[start, end)``, each with the unaccepted losses that may touch it.

        :arg losses: the topic's losses if already read (one read fewer).
        """
        start, end = plain(start), plain(end)
        losses = self.losses(topic) if losses is None else losses
        touching = [loss for loss in losses if start < loss.hours_end]
        accepted = {loss.key: self.accepted(loss, start, min(end, loss.hours_end)) for loss in touching}
        return incomplete_hours(touching, accepted, start, end)

    # -- writes ---------------------------------------------------------------------------------------------------
    def record(self, losses: Sequence[Loss]) -> None:
        """Record losses (an upsert per loss: noticing the same gap again writes the same row)."""
        params = [
            (x.topic, x.partition, x.first_offset, x.last_offset, x.records, x.noticed_at, x.older_than,
             x.retention_ms, x.oldest_surviving)
            for x in losses
        ]  # fmt: skip
        write_many(self.settings, self.sess, self._stmt(cql.INSERT_LOSS), params)

    def accept(self, accepted: Sequence[tuple[Loss, datetime, uuid.UUID]]) -> None:
        """Record that runs accepted losses for their hours: (loss, hour, run id) each; the hours are whole again."""
        now = datetime.now(UTC)
        write_many(
            self.settings,
            self.sess,
            self._stmt(cql.INSERT_LOSS_ACCEPTED),
            [(x.topic, x.partition, x.first_offset, hour, run_id, now) for x, hour, run_id in accepted],
            lambda p: tuple(p[:3]),
        )
