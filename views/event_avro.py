"""The events topic in Avro: the event contract's binary form, Confluent-framed, its schema one subject of the registry.

With ``kafka.events_format`` ``avro`` every writer of the events topic still builds the canonical wire JSON first
(:meth:`views.event.Event.to_json`, ingestion's fast encoders) and turns it into Avro at that one edge
(:class:`EventAvro`): magic byte 0, the schema id as 4 big-endian bytes, the Avro binary of
:func:`views.event.avro_schema`. The schema is registered under ``<events_topic>-value`` (Confluent's
TopicNameStrategy) once per process (:func:`events_writer`).

Readers tell the forms apart by the first byte — JSON text never starts with a zero byte — so a topic switched
mid-life reads whole: the Spark layers through :func:`views.event_frames.parse_events` with every registered
version of the subject (:func:`writer_schemas`), Python readers through :class:`EventValues`. A record is decoded
with the writer schema its id names, resolved into the current contract; an id the registry does not know makes
the record unreadable, never a guessed event. fastavro and the registry client come with ``trends[sources]``.
"""

from __future__ import annotations

import io
import json
import logging
import struct
import threading
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any, Final

import msgspec

from infra.registry import register, registry_client, schema_text, subject_schemas, value_subject
from infra.service_settings import SchemaRegistrySettings
from infra.settings import Settings
from views.event import Event, avro_schema, encode_wire, format_ts, wire_ts_ms

logger = logging.getLogger(__name__)

MAGIC: Final = 0
HEADER_BYTES: Final = 5
_JSON = msgspec.json.Decoder()
_WRITERS: dict[tuple[str, str], EventAvro] = {}
_WRITERS_LOCK = threading.Lock()


class UnreadableEventError(ValueError):
    """An events-topic value that is no event: the message says why (not JSON, an unknown schema id, bad bytes)."""


def header(schema_id: int) -> bytes:
    """Return the Confluent frame's 5 bytes for a schema id: magic byte 0, then the id big-endian."""
    return struct.pack(">bI", MAGIC, schema_id)


def is_framed(value: bytes | None) -> bool:
    """Tell whether a value is Confluent-framed (first byte 0) rather than JSON."""
    return value is not None and len(value) > 0 and value[0] == MAGIC


@cache
def reader_schema_text() -> str:
    """Return the current contract's Avro schema as registered (JSON text); Spark's reader schema of every version."""
    return json.dumps(avro_schema())


@cache
def _defaults() -> dict[str, Any]:
    """Return each field's value when the wire JSON leaves it out (``user``, ``value``: None; ``dims``: empty)."""
    return {
        name: info.get_default(call_default_factory=True)
        for name, info in Event.model_fields.items()
        if not info.is_required()
    }


def avro_record(wire: bytes) -> dict[str, Any]:
    """Return the Avro record of an event's canonical wire JSON (``ts`` as epoch milliseconds, absent fields filled).

    :raises UnreadableEventError: when the bytes are not an event's wire JSON (a caller's bug: writers validate).
    """
    try:
        fields = _JSON.decode(wire)
        record = {**_defaults(), **fields}
        record["ts"] = wire_ts_ms(fields["ts"])
    except (msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
        msg = f"not an event's wire JSON: {type(exc).__name__}: {exc}"
        raise UnreadableEventError(msg) from exc
    return record


def wire_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    """Return the wire JSON's fields of a decoded Avro record, laid out as :meth:`Event.to_dict` does.

    Field order is the model's; None and empty ``dims`` are left out, as the JSON leaves them out.
    """
    out: dict[str, Any] = {}
    for name in Event.model_fields:
        value = format_ts(record[name]) if name == "ts" else record.get(name)
        if value is None or (name == "dims" and not value):
            continue
        out[name] = value
    return out


def wire_json(fields: dict[str, Any]) -> bytes:
    """Return the canonical wire JSON of :func:`wire_fields` (the bytes :meth:`Event.to_json` writes)."""
    return encode_wire(fields, 0, "none")[0]


class EventAvro:
    """Transcode canonical wire JSON into Confluent-framed Avro of the contract, with its registered schema id.

    :arg schema_id: the id of :func:`reader_schema_text` under the events topic's subject.
    """

    def __init__(self, schema_id: int) -> None:
        import fastavro  # noqa: PLC0415 - trends[sources]

        self.schema_id = schema_id
        self._header = header(schema_id)
        self._parsed = fastavro.parse_schema(avro_schema())
        self._write = fastavro.schemaless_writer
        self._read = fastavro.schemaless_reader

    def __call__(self, wire: bytes) -> bytes:
        """Return the framed Avro of one event's wire JSON."""
        out = io.BytesIO()
        out.write(self._header)
        self._write(out, self._parsed, avro_record(wire))
        return out.getvalue()

    def many(self, values: Sequence[bytes]) -> list[bytes]:
        """Return the framed Avro of many events' wire JSON, in order."""
        return [self(value) for value in values]

    def wire(self, framed: bytes) -> bytes:
        """Return the wire JSON of a value this transcoder wrote (its dead-letter copy keeps JSON, as JSON's does).

        :raises UnreadableEventError: when the value is not framed with this schema id, or its payload does not decode.
        """
        if framed[:HEADER_BYTES] != self._header:
            msg = f"not framed with schema id {self.schema_id}"
            raise UnreadableEventError(msg)
        try:
            record = self._read(io.BytesIO(framed[HEADER_BYTES:]), self._parsed, None)
        except Exception as exc:  # fastavro raises EOFError, ValueError, IndexError… on bad bytes
            msg = f"the payload does not match schema id {self.schema_id}: {type(exc).__name__}: {exc}"
            raise UnreadableEventError(msg) from exc
        if not isinstance(record, dict):
            msg = f"schema id {self.schema_id} is not a record schema"
            raise UnreadableEventError(msg)
        return wire_json(wire_fields(record))


def events_writer(settings: Settings) -> EventAvro | None:
    """Return the events topic's transcoder (None with ``kafka.events_format`` ``json``: values stay JSON).

    The contract's schema is registered under ``<events_topic>-value`` at the first call of a process, which keeps
    the id (registering a schema the subject already has returns its id).

    :raises infra.registry.RegistryError: when the registry refuses the schema or does not answer.
    """
    if settings.kafka.events_format != "avro":
        return None
    subject = value_subject(settings.kafka.events_topic)
    key = (settings.registry.url, subject)
    with _WRITERS_LOCK:
        writer = _WRITERS.get(key)
        if writer is None:
            schema_id = register(registry_client(settings.registry), subject, avro_schema())
            writer = _WRITERS[key] = EventAvro(schema_id)
            logger.info("events topic in Avro: subject %s, schema id %s", subject, schema_id)
    return writer


def writer_schemas(settings: Settings) -> dict[int, str]:
    """Return the writer schemas a reader of the events topic decodes Avro records with: schema id -> schema text.

    Every version registered under ``<events_topic>-value`` now, and the current contract's (registered here if no
    writer has yet, so a job started before its writers knows their id). Empty with ``kafka.events_format``
    ``json``: the readers then decode JSON only. A version registered after this call is unknown to the caller
    (its records are unparseable until the reader starts again).

    :raises infra.registry.RegistryError: when the registry does not answer.
    """
    if settings.kafka.events_format != "avro":
        return {}
    client = registry_client(settings.registry)
    subject = value_subject(settings.kafka.events_topic)
    current = register(client, subject, avro_schema())
    schemas = subject_schemas(client, subject)
    schemas.setdefault(current, reader_schema_text())
    logger.info(
        "events topic %s: JSON and Avro records, writer schema ids %s", settings.kafka.events_topic, sorted(schemas)
    )
    return schemas


class EventValues:
    """Decode values of the events topic, JSON or framed Avro, for Python readers (the privacy export).

    The registry is asked only when a framed record comes: a topic that holds JSON alone needs none. Each schema
    id is fetched and parsed once, and its records resolved into the current contract.

    :arg registry: the registry's settings.
    """

    def __init__(self, registry: SchemaRegistrySettings) -> None:
        self._settings = registry
        self._client: Any = None
        self._parsed: dict[int, Any] = {}
        self._reader: Any = None

    def decode(self, value: bytes) -> tuple[dict[str, Any], bytes]:
        """Return an event value's wire JSON fields and its JSON (the value itself when it is JSON).

        :raises UnreadableEventError: a value that is not a JSON object, not framed Avro of a known id, or whose
            payload does not decode.
        :raises infra.registry.RegistryError: when the registry does not answer.
        """
        if not is_framed(value):
            try:
                fields = json.loads(value)
            except ValueError as exc:
                msg = f"not JSON: {exc}"
                raise UnreadableEventError(msg) from exc
            if not isinstance(fields, dict):
                msg = f"a JSON {type(fields).__name__}, not an object"
                raise UnreadableEventError(msg)
            return fields, value
        fields = wire_fields(self._record(value))
        return fields, wire_json(fields)

    def _record(self, value: bytes) -> dict[str, Any]:
        import fastavro  # noqa: PLC0415 - trends[sources]

        if len(value) < HEADER_BYTES:
            msg = f"a framed value of {len(value)} bytes has no schema id"
            raise UnreadableEventError(msg)
        (schema_id,) = struct.unpack_from(">I", value, 1)
        writer = self._parsed.get(schema_id)
        if writer is None:
            if self._client is None:
                self._client = registry_client(self._settings)
                self._reader = fastavro.parse_schema(avro_schema())
            text = schema_text(self._client, schema_id)
            if text is None:
                msg = f"schema id {schema_id} is not in the registry"
                raise UnreadableEventError(msg)
            writer = self._parsed[schema_id] = fastavro.parse_schema(json.loads(text))
        try:
            record = fastavro.schemaless_reader(io.BytesIO(value[HEADER_BYTES:]), writer, self._reader)
        except Exception as exc:  # bad bytes, or a writer version that does not resolve into the contract
            msg = f"the payload does not decode with schema id {schema_id}: {type(exc).__name__}: {exc}"
            raise UnreadableEventError(msg) from exc
        if not isinstance(record, dict):
            msg = f"schema id {schema_id} is not a record schema"
            raise UnreadableEventError(msg)
        return record
