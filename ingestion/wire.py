"""Decode records of other Kafka topics: plain JSON, or Avro and Protobuf in the Confluent wire format.

The Confluent framing is a magic byte 0, the writer schema's id as 4 big-endian bytes, then the payload; Protobuf
adds, between id and payload, the index path of the message type in its ``.proto`` file (zigzag varints, a single
0 for the first message). Schemas are resolved by id through the Confluent-compatible REST API of a schema
registry (confluent-kafka's :class:`~confluent_kafka.schema_registry.SchemaRegistryClient`, which caches them), so
a writer that moves to a new schema version mid-stream is decoded with that version at once: no reader schema is
imposed, the mapping picks fields by name, and a field added (with a default) or removed changes no event.

A decoder turns a record's value into a field dict for :func:`ingestion.validate.validate_fields`, or raises
:class:`Undecodable` with a :class:`~ingestion.validate.Reason` (``unknown_schema``, ``undecodable``) for the
dead-letter topic; a registry that does not answer raises :class:`RegistryUnavailable`, which is no verdict on
the record: the caller retries, and never skips it.
"""

from __future__ import annotations

import io
import json
import logging
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any, Final, Literal

from infra.registry import registry_client
from infra.service_settings import SchemaRegistrySettings
from ingestion.validate import Reason

logger = logging.getLogger(__name__)

MAGIC: Final = 0
HEADER_BYTES: Final = 5
MAX_MESSAGE_INDEXES: Final = 64
Format = Literal["json", "avro", "protobuf"]
FORMATS: Final = ("json", "avro", "protobuf")


class Undecodable(Exception):  # noqa: N818 - a verdict on a record, not a failure of the program
    """A record that cannot be decoded; ``reason`` says why, for its dead letter."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class RegistryUnavailable(Exception):  # noqa: N818 - raised to be retried
    """The schema registry did not answer (connection refused, timeout, 5xx): retry, never skip the record."""


@dataclass(frozen=True, slots=True)
class Frame:
    """The parts of a Confluent-framed value."""

    schema_id: int
    indexes: tuple[int, ...]  # Protobuf only: the message type's index path (empty = the first message)
    payload: bytes


def _zigzag_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            msg = "the message-index array ends inside a varint"
            raise Undecodable(Reason.UNDECODABLE, msg)
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), pos
        if shift > 63:
            msg = "a varint of the message-index array is longer than 64 bits"
            raise Undecodable(Reason.UNDECODABLE, msg)


def parse_frame(value: bytes | None, *, protobuf: bool = False) -> Frame:
    """Split a Confluent-framed value into schema id, message indexes (Protobuf) and payload.

    :raises Undecodable: when the value is not framed (no value, too short, another magic byte, bad indexes).
    """
    if value is None:
        raise Undecodable(Reason.UNDECODABLE, "the record has no value (a tombstone)")
    if len(value) < HEADER_BYTES or value[0] != MAGIC:
        first = f"0x{value[0]:02x}" if value else "nothing"
        detail = f"not in the Confluent wire format: {len(value)} bytes starting with {first} (needs magic byte 0x00)"
        raise Undecodable(Reason.UNDECODABLE, detail)
    (schema_id,) = struct.unpack_from(">I", value, 1)
    if not protobuf:
        return Frame(schema_id, (), value[HEADER_BYTES:])
    count, pos = _zigzag_varint(value, HEADER_BYTES)
    if count < 0 or count > MAX_MESSAGE_INDEXES:
        raise Undecodable(Reason.UNDECODABLE, f"message-index array of length {count}")
    indexes = []
    for _ in range(count):
        index, pos = _zigzag_varint(value, pos)
        if index < 0:
            raise Undecodable(Reason.UNDECODABLE, f"negative message index {index}")
        indexes.append(index)
    return Frame(schema_id, tuple(indexes), value[pos:])


def frame(schema_id: int, payload: bytes, indexes: tuple[int, ...] | None = None) -> bytes:
    """Return a Confluent-framed value (the inverse of :func:`parse_frame`; tests and benchmarks write with it)."""
    out = io.BytesIO()
    out.write(struct.pack(">bI", MAGIC, schema_id))
    if indexes is not None:
        for number in (len(indexes), *indexes) if indexes else (0,):
            zz = (number << 1) ^ (number >> 63)
            while True:
                byte = zz & 0x7F
                zz >>= 7
                out.write(bytes([byte | (0x80 if zz else 0)]))
                if not zz:
                    break
    out.write(payload)
    return out.getvalue()


class AvroEncoder:
    """Encode records as Confluent-framed Avro with a schema registered for a topic's values (``<topic>-value``).

    The inverse of :class:`AvroDecoder`: what a Confluent producer writes, for the tests and benchmarks that fill
    source topics. Registering a schema the subject already has returns its id.

    :arg client: a registry client (:func:`infra.registry.registry_client`).
    :arg schema: the Avro schema (parsed JSON).
    """

    def __init__(self, client: Any, topic: str, schema: dict[str, Any]) -> None:
        import fastavro  # noqa: PLC0415
        from confluent_kafka.schema_registry import Schema  # noqa: PLC0415

        self.schema_id: int = client.register_schema(f"{topic}-value", Schema(json.dumps(schema), "AVRO"))
        self._parsed = fastavro.parse_schema(schema)

    def payload(self, record: Mapping[str, Any]) -> bytes:
        """Return the record's Avro binary, unframed."""
        import fastavro  # noqa: PLC0415

        out = io.BytesIO()
        fastavro.schemaless_writer(out, self._parsed, record)
        return out.getvalue()

    def __call__(self, record: Mapping[str, Any]) -> bytes:
        """Return the record framed: magic byte, schema id, Avro binary."""
        return frame(self.schema_id, self.payload(record))


# -- the registry (its client: infra.registry.registry_client) ---------------------------------------------------


def _schema_by_id(client: Any, schema_id: int) -> Any:
    """Return the registered schema of an id (cached by the client).

    :raises Undecodable: ``unknown_schema`` when the registry answers that the id does not exist.
    :raises RegistryUnavailable: when it does not answer.
    """
    from confluent_kafka.schema_registry.error import SchemaRegistryError  # noqa: PLC0415

    try:
        return client.get_schema(schema_id)
    except SchemaRegistryError as exc:
        if exc.http_status_code == 404:
            raise Undecodable(Reason.UNKNOWN_SCHEMA, f"schema id {schema_id}: {exc.error_message}") from exc
        if exc.http_status_code >= 500 or exc.http_status_code in (401, 403, 408, 429):
            msg = f"the schema registry answered {exc} for schema id {schema_id}"
            raise RegistryUnavailable(msg) from exc
        raise Undecodable(Reason.UNKNOWN_SCHEMA, f"schema id {schema_id}: {exc}") from exc
    except Exception as exc:  # the HTTP client's connection errors and timeouts: the registry did not answer
        msg = f"the schema registry did not answer for schema id {schema_id}: {type(exc).__name__}: {exc}"
        raise RegistryUnavailable(msg) from exc


def _check_type(schema: Any, schema_id: int, expected: str) -> None:
    kind = (schema.schema_type or "AVRO").upper()
    if kind != expected:
        detail = f"schema id {schema_id} is a {kind} schema; this bridge reads {expected}"
        raise Undecodable(Reason.UNDECODABLE, detail)


# -- decoders -------------------------------------------------------------------------------------------------

Decoder = Callable[[bytes | None], Mapping[str, Any] | bytes]


class AvroDecoder:
    """Decode Confluent-framed Avro with the writer's schema, looked up by id (parsed once per id).

    fastavro's reader straight on the payload: confluent-kafka's ``AvroDeserializer`` decodes the same way but runs
    its data-contract rule machinery per record, and cannot tell an unknown id from a registry outage for us.
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._parsed: dict[int, Any] = {}

    def __call__(self, value: bytes | None) -> Mapping[str, Any]:
        """Return the record as a dict.

        :raises Undecodable: not framed, an unknown id, a non-Avro schema, a payload that does not match.
        :raises RegistryUnavailable: the registry did not answer.
        """
        import fastavro  # noqa: PLC0415

        framed = parse_frame(value)
        parsed = self._parsed.get(framed.schema_id)
        if parsed is None:
            schema = _schema_by_id(self._client, framed.schema_id)
            _check_type(schema, framed.schema_id, "AVRO")
            try:
                parsed = fastavro.parse_schema(json.loads(schema.schema_str))
            except Exception as exc:  # a registered schema fastavro cannot use: the record's verdict
                raise Undecodable(Reason.UNDECODABLE, f"schema id {framed.schema_id}: {exc}") from exc
            self._parsed[framed.schema_id] = parsed
        stream = io.BytesIO(framed.payload)
        try:
            record = fastavro.schemaless_reader(stream, parsed, None)
        except Exception as exc:  # fastavro raises EOFError, ValueError, IndexError… on bad bytes
            detail = f"the payload does not match schema id {framed.schema_id}: {type(exc).__name__}: {exc}"
            raise Undecodable(Reason.UNDECODABLE, detail) from exc
        if stream.tell() != len(framed.payload):
            detail = (
                f"the payload does not match schema id {framed.schema_id}: "
                f"{len(framed.payload) - stream.tell()} bytes left after the record"
            )
            raise Undecodable(Reason.UNDECODABLE, detail)
        if not isinstance(record, dict):
            raise Undecodable(Reason.UNDECODABLE, f"schema id {framed.schema_id} is not a record schema")
        return record


class ProtobufDecoder:
    """Decode Confluent-framed Protobuf: the writer's ``.proto`` (by id) compiled once with protoc, fields by name.

    The registry's text form of the schema is compiled with ``grpc_tools.protoc`` (Google's protoc as a Python
    module): the registries' binary form differs between them (Confluent sends it base64, Apicurio raw).
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._classes: dict[tuple[int, tuple[int, ...]], Any] = {}
        self._files: dict[int, Any] = {}

    def __call__(self, value: bytes | None) -> Mapping[str, Any]:
        """Return the message as a dict of its set fields (nested messages as dicts, timestamps as datetimes).

        :raises Undecodable: not framed, an unknown id, a non-Protobuf schema, bad indexes, a payload that does
            not parse.
        :raises RegistryUnavailable: the registry did not answer.
        """
        from google.protobuf.message import DecodeError  # noqa: PLC0415

        framed = parse_frame(value, protobuf=True)
        cls = self._message_class(framed.schema_id, framed.indexes)
        message = cls()
        try:
            message.ParseFromString(framed.payload)
        except (DecodeError, RuntimeError, ValueError) as exc:
            detail = f"the payload does not match schema id {framed.schema_id}: {exc}"
            raise Undecodable(Reason.UNDECODABLE, detail) from exc
        return message_dict(message)

    def _message_class(self, schema_id: int, indexes: tuple[int, ...]) -> Any:
        key = (schema_id, indexes)
        cls = self._classes.get(key)
        if cls is not None:
            return cls
        from google.protobuf.message_factory import GetMessageClass  # noqa: PLC0415

        file_desc = self._files.get(schema_id)
        if file_desc is None:
            schema = _schema_by_id(self._client, schema_id)
            _check_type(schema, schema_id, "PROTOBUF")
            if schema.references:
                detail = f"schema id {schema_id} imports other registered schemas, which this bridge does not resolve"
                raise Undecodable(Reason.UNDECODABLE, detail)
            file_desc = self._files[schema_id] = compile_proto(schema.schema_str, schema_id)
        desc: Any = None
        scope = list(file_desc.message_types_by_name.values())
        for depth, index in enumerate(indexes or (0,)):
            if index >= len(scope):
                detail = f"message index path {list(indexes)} of schema id {schema_id} has no message at depth {depth}"
                raise Undecodable(Reason.UNDECODABLE, detail)
            desc = scope[index]
            scope = list(desc.nested_types)
        cls = self._classes[key] = GetMessageClass(desc)
        return cls


def compile_proto(text: str, schema_id: int) -> Any:
    """Compile a ``.proto`` text into a file descriptor of a private pool (well-known imports allowed).

    :raises Undecodable: when protoc refuses the text.
    """
    import grpc_tools  # noqa: PLC0415
    from google.protobuf import descriptor_pb2, descriptor_pool  # noqa: PLC0415

    include = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="trends-proto-") as tmp:
        source = Path(tmp) / f"schema_{schema_id}.proto"
        source.write_text(text)
        out = Path(tmp) / "set.pb"
        # protoc in a child process: its C++ code exits the process on some inputs, and prints to stderr
        proc = subprocess.run(  # noqa: S603 - our own interpreter, fixed arguments
            [
                sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp}", f"-I{include}", "--include_imports",
                f"--descriptor_set_out={out}", source.name,
            ],
            cwd=tmp, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if proc.returncode != 0 or not out.exists():
            detail = f"schema id {schema_id} does not compile: {proc.stderr.strip()[:300]}"
            raise Undecodable(Reason.UNDECODABLE, detail)
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:
        pool.Add(proto)
    return pool.FindFileByName(source.name)


def message_dict(message: Any) -> dict[str, Any]:
    """Return a Protobuf message's set fields by name, keeping numbers as numbers (json_format makes int64 text)."""
    out: dict[str, Any] = {}
    for field, value in message.ListFields():
        out[field.name] = _field_value(field, value)
    return out


def _field_value(field: Any, value: Any) -> Any:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        value_field = field.message_type.fields_by_name["value"]
        return {k: _scalar(value_field, v) for k, v in value.items()}
    if field.is_repeated:
        return [_scalar(field, v) for v in value]
    return _scalar(field, value)


def _scalar(field: Any, value: Any) -> Any:
    if field.message_type is None:
        if field.enum_type is not None:
            number = field.enum_type.values_by_number.get(value)
            return number.name if number is not None else value
        return value
    name = field.message_type.full_name
    if name == "google.protobuf.Timestamp":
        return value.ToDatetime(tzinfo=UTC)
    if name.startswith("google.protobuf.") and name.endswith("Value") and "value" in value.DESCRIPTOR.fields_by_name:
        return value.value  # the wrapper types: StringValue, DoubleValue…
    return message_dict(value)


class JsonDecoder:
    """Plain JSON values (validated as file replay validates lines); a JSON Schema frame, if any, is stripped."""

    def __call__(self, value: bytes | None) -> bytes:
        """Return the JSON bytes to validate.

        :raises Undecodable: for a record without a value.
        """
        if value is None:
            raise Undecodable(Reason.UNDECODABLE, "the record has no value (a tombstone)")
        if len(value) >= HEADER_BYTES and value[0] == MAGIC:
            return value[HEADER_BYTES:]  # JSON text never starts with a zero byte: a Confluent JSON Schema frame
        return value


def decoder(fmt: Format, registry: SchemaRegistrySettings) -> Decoder:
    """Return the decoder of a format (Avro and Protobuf with a registry client)."""
    if fmt == "json":
        return JsonDecoder()
    client = registry_client(registry)
    return AvroDecoder(client) if fmt == "avro" else ProtobufDecoder(client)
