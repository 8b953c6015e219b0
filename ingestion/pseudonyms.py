"""Pseudonymous user ids from the first hop: every event's ``user`` is replaced before it is encoded for Kafka.

Each ingestion path hands its users to a :class:`Pseudonymiser` (the subject store of
:mod:`infra.privacy.subjects` with the ingestion-side rules) before anything is produced: the record key, the
JSON and a content-derived event id (:func:`views.event.content_id`, computed from the pseudonym, so an id cannot
be recomputed from a candidate user) then hold only the pseudonym. The hours that hold each subject's events are
written to the store before the events are produced, so an erasure finds every hour without reading the log.

With ``privacy.pseudonymise`` off, :meth:`Pseudonymiser.from_settings` returns None and nothing changes. A
pseudonymiser reads the subject key and connects to Cassandra at its first user: events without users need
neither.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from typing import Any, Final, cast

import msgspec

from infra.privacy.subjects import StoreStats, SubjectStore
from infra.settings import Settings
from views.event import CONTENT_ID_PREFIX, EVENT_SCHEMA_VERSION, Event, content_id, content_id_ms, encode_wire

logger = logging.getLogger(__name__)

_DECODE: Final = msgspec.json.Decoder()
_HOUR_MS: Final = 3_600_000
# Batches table_async resolves at once at most (a caller decides how many it keeps ahead: the generator
# GROUPS_AHEAD + 1). Each has up to privacy.lookup_concurrency requests in flight, and a process's reads and writes
# are group-committed.
PIPELINE_DEPTH: Final = 8

# An event as it goes to Kafka: its JSON, key and record timestamp (epoch ms).
Encoded = tuple[bytes, bytes | None, int]


def hour_ms(ts_ms: int) -> int:
    """Return the start of the UTC hour of an epoch-ms time: the hour a subject's event is recorded under."""
    return ts_ms - ts_ms % _HOUR_MS


class KnownPairs:
    """A producer's copy of the (user, hour) pairs it had recorded, with their pseudonyms.

    An event of a known pair can be encoded with its pseudonym at once: its hour is durable and its pseudonym is
    what the store answered. The copy is dropped whenever the store's memory turns (its TTL, an early turn, a
    forget), so a forgotten user leaves it within ``privacy.pseudonym_cache_ttl_s`` as it leaves the store's, and
    when it reaches ``max_pairs``.
    """

    def __init__(self, max_pairs: int) -> None:
        self._max = max_pairs
        self._pairs: dict[tuple[str, int], str] = {}
        self._turns: int | None = None

    def __len__(self) -> int:
        return len(self._pairs)

    def lookup(self) -> Callable[[str, int], str | None] | None:
        """Return ``(user, epoch ms) -> pseudonym or None`` over the copy as it is now (None: it is empty)."""
        pairs = self._pairs  # a caller reading a batch keeps this one even if the copy is dropped meanwhile

        def pseudonym(user: str, ts_ms: int) -> str | None:
            return pairs.get((user, ts_ms - ts_ms % _HOUR_MS))  # hour_ms, inlined: this runs for every record

        return pseudonym if pairs else None

    def refresh(self, pseudonymiser: Pseudonymiser) -> None:
        """Drop the copy if the store's memory turned since it was taken, or the copy is full."""
        turns = pseudonymiser.memory_turns()
        if turns != self._turns or len(self._pairs) >= self._max:
            self._pairs = {}  # a new dict: a lookup handed out before keeps the old one
            self._turns = turns

    def learn(self, learned: dict[tuple[str, int], str]) -> None:
        """Add the pairs :meth:`Pseudonymiser.encoded` recorded (its ``learned``)."""
        self._pairs.update(learned)


class Pseudonymiser:
    """Replace users by their pseudonyms and record the hours of their events; use as a context manager.

    :arg store: the subject store (owned: :meth:`close` closes it), or the settings to open one from at the first
        user (so a producer that never sees a user needs neither the key nor Cassandra).
    """

    def __init__(self, store: SubjectStore | Settings) -> None:
        self._settings = store if isinstance(store, Settings) else None
        self._store = None if isinstance(store, Settings) else store
        self._elsewhere = StoreStats()  # what validation workers did with their own stores
        self._pool: ThreadPoolExecutor | None = None  # resolves the batches of table_async
        self._opening = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> Pseudonymiser | None:
        """Return a pseudonymiser for these settings, or None when ``privacy.pseudonymise`` is off.

        The subject key is read, and Cassandra connected, at the first user.
        """
        if not settings.privacy.pseudonymise:
            return None
        return cls(settings)

    @property
    def store(self) -> SubjectStore:
        """Return the subject store, opened now if it is not yet.

        :raises SubjectKeyError: when the subject key file is missing or unusable.
        """
        with self._opening:  # request threads (the collector's) may ask at once: one store
            if self._store is None:
                self._store = SubjectStore(cast("Settings", self._settings))
        return self._store

    @property
    def stats(self) -> StoreStats:
        """Return what the store (and the workers reported with :meth:`add_stats`) did so far."""
        total = StoreStats(**asdict(self._elsewhere))
        if self._store is not None:
            total.add(asdict(self._store.stats))
        return total

    def add_stats(self, counts: dict[str, int]) -> None:
        """Count what another process's store did for this run (a validation worker's)."""
        self._elsewhere.add(counts)

    def table(self, users: Iterable[str], hours: Iterable[tuple[str, int]] = ()) -> dict[str, str]:
        """Return user -> pseudonym for these users (created where missing), after recording their hours.

        :arg hours: (user, event time in epoch ms) of the events about to be produced: the hours they fall in are
            recorded in the subject store (durably) when this returns. An hour recorded for an event that then
            fails is harmless; an event in the log whose hour is missing would escape an erasure.
        """
        pairs = {(user, hour_ms(ts)) for user, ts in hours}
        return self.store.resolve(users, pairs)

    def table_async(self, users: Iterable[str], hours: Iterable[tuple[str, int]] = ()) -> Future[dict[str, str]]:
        """Return the future of :meth:`table` for these users and hours, resolved on a thread of this pseudonymiser.

        Up to :data:`PIPELINE_DEPTH` batches are resolved at once, so a producer can prepare the next batches
        while the store answers for the first; the store asks once for a user or an hour that several of them
        need. Take each result before producing its batch: until then its pseudonyms and hours may not be durable.
        """
        if self._pool is None:
            self._pool = ThreadPoolExecutor(PIPELINE_DEPTH, thread_name_prefix="pseudonyms")
        return self._pool.submit(self.table, list(users), list(hours))

    def memory_turns(self) -> int | None:
        """Return the store's :meth:`~infra.privacy.subjects.SubjectStore.memory_turns` (a copy follows it)."""
        return self.store.memory_turns()

    def event(self, event: Event) -> Event:
        """Return the event with its user pseudonymised (and its content-derived id recomputed from the pseudonym)."""
        if event.user is None:
            return event
        pseudonym = self.table([event.user], [(event.user, event.ts_ms)])[event.user]
        update: dict[str, Any] = {"user": pseudonym}
        if event.id == content_id(event.ts, event.item, event.user, event.value, event.dims):
            update["id"] = content_id(event.ts, event.item, pseudonym, event.value, event.dims)
        return event.model_copy(update=update)

    def encoded(
        self, events: list[Encoded], key_field: str, learned: dict[tuple[str, int], str] | None = None
    ) -> list[Encoded]:
        """Return validated events (JSON, key, timestamp) with their users pseudonymised, in the same order.

        The JSON is the canonical wire form (validated already), so the bytes are what the model path would write
        for the pseudonymised event. Where the user's text needs no escape and the id is not content-derived, the
        pseudonym is put in place of the user's bytes (:func:`_user_span`); otherwise the JSON is read back, its
        user and a content-derived id replaced, and written again by the event's own wire encoder.

        :arg learned: filled with ``(user, hour start in epoch ms) -> pseudonym`` of these events, every hour
            recorded when this returns (a caller's memory of what needs no store next time).
        """
        found: list[tuple[int, int] | dict[str, Any]] = []  # per event: its user's span, or its decoded fields
        users: list[str | None] = []
        for value, _key, _ts in events:
            span = _user_span(value)
            if span is None:
                fields = _DECODE.decode(value)
                found.append(fields)
                users.append(fields.get("user"))
            else:
                found.append(span)
                users.append(None if span[0] < 0 else value[span[0] : span[1]].decode())
        hours = [(user, ts) for user, (_v, _k, ts) in zip(users, events, strict=True) if user is not None]
        if not hours:
            return events
        table = self.table({user for user, _ts in hours}, hours)
        if learned is not None:
            for who, ts in hours:
                learned[(who, hour_ms(ts))] = table[who]
        out: list[Encoded] = []
        for where, user, original in zip(found, users, events, strict=True):
            if user is None:
                out.append(original)
            elif isinstance(where, dict):
                out.append(_rewrite(where, user, table[user], key_field, original[2]))
            else:
                value, key, ts_ms = original
                pseudonym = table[user].encode()
                start, end = where
                out.append((value[:start] + pseudonym + value[end:], pseudonym if key_field == "user" else key, ts_ms))
        return out

    def close(self) -> None:
        """Wait for the batches being resolved and close the store (if it was opened)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._store is not None:
            self._store.close()

    def __enter__(self) -> Pseudonymiser:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


_HEAD: Final = b'{"v":%d,"id":"' % EVENT_SCHEMA_VERSION
_CONTENT_HEAD: Final = _HEAD + CONTENT_ID_PREFIX.encode()
_USER: Final = b',"user":"'
_DIMS: Final = b',"dims":{'


def _user_span(wire: bytes) -> tuple[int, int] | None:
    """Return where the user's text lies in a canonical wire JSON, (-1, -1) when it has none, or None to decode it.

    In JSON text a quote inside a string is escaped, so ``,"user":"`` before the dims is the user field's own
    (the fields before it, id, time and item, are strings; the value a number), and dims, written last, may hold a
    key "user" of their own. The span is exact when no backslash lies inside it; an escaped user, and an id
    derived from the content (which must be derived again), are decoded instead.
    """
    if not wire.startswith(_HEAD) or wire.startswith(_CONTENT_HEAD):
        return None
    dims = wire.find(_DIMS)
    start = wire.find(_USER, 0, len(wire) if dims < 0 else dims)
    if start < 0:
        return (-1, -1)
    start += len(_USER)
    end = wire.find(b'"', start)
    if end < 0 or wire.find(b"\\", start, end) >= 0:
        return None
    return start, end


def _rewrite(fields: dict[str, Any], user: str, pseudonym: str, key_field: str, ts_ms: int) -> Encoded:
    """Encode a canonical event's wire fields again with the pseudonym in place of the user.

    The other fields were validated on the way in and are written as they are; a content-derived id is derived
    again from the pseudonym (checked only for ids that look derived: computing one costs more than the rest).
    """
    event_id = fields["id"]
    if event_id.startswith(CONTENT_ID_PREFIX):
        item, value, dims = fields["item"], fields.get("value"), fields.get("dims", {})
        if event_id == content_id_ms(ts_ms, item, user, value, dims):
            fields["id"] = content_id_ms(ts_ms, item, pseudonym, value, dims)
    fields["user"] = pseudonym
    return encode_wire(fields, ts_ms, key_field)
