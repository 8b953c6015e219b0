"""The Confluent wire format, the Avro and Protobuf decoders, and dead letters that say where a record came from.

The decoders are run on real Avro (fastavro) and Protobuf (protoc-compiled) payloads; the registry is a stand-in
object that answers ``get_schema`` like confluent-kafka's client does (the real registry is in tests/services).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from confluent_kafka.schema_registry.error import SchemaRegistryError
from hypothesis import given
from hypothesis import strategies as st

from ingestion.dlq import DeadLetter, encode_reject
from ingestion.mapping import ColumnMapping
from ingestion.validate import Context, Reason, Reject, encode_fields, encoded, validate_fields
from ingestion.wire import (
    AvroDecoder,
    AvroEncoder,
    JsonDecoder,
    ProtobufDecoder,
    RegistryUnavailable,
    Undecodable,
    compile_proto,
    frame,
    parse_frame,
)


@given(st.integers(0, 2**32 - 1), st.binary(max_size=64))
def test_avro_frames_round_trip(schema_id: int, payload: bytes) -> None:
    framed = frame(schema_id, payload)
    assert framed[:5] == b"\x00" + struct.pack(">I", schema_id)
    parsed = parse_frame(framed)
    assert (parsed.schema_id, parsed.indexes, parsed.payload) == (schema_id, (), payload)


@given(st.integers(0, 2**31), st.lists(st.integers(0, 10_000), max_size=5), st.binary(max_size=32))
def test_protobuf_frames_round_trip_with_their_message_indexes(schema_id: int, idx: list[int], payload: bytes) -> None:
    parsed = parse_frame(frame(schema_id, payload, tuple(idx)), protobuf=True)
    assert (parsed.schema_id, parsed.indexes, parsed.payload) == (schema_id, tuple(idx), payload)


def test_the_first_message_is_a_single_zero_byte() -> None:
    # Confluent's optimisation: [0] is written as one 0 byte, not as the array length 1 and the index 0.
    assert frame(7, b"P", ()) == b"\x00\x00\x00\x00\x07\x00P"
    assert frame(7, b"P", (1,)) == b"\x00\x00\x00\x00\x07\x02\x02P"
    assert parse_frame(b"\x00\x00\x00\x00\x07\x00P", protobuf=True).indexes == ()


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (None, "no value"),
        (b"", "0 bytes"),
        (b"\x00\x00\x00", "3 bytes"),
        (b'{"id": 1}', "0x7b"),
        (b"\x01\x00\x00\x00\x01payload", "0x01"),
    ],
)
def test_values_not_framed_are_undecodable(value: bytes | None, words: str) -> None:
    with pytest.raises(Undecodable) as caught:
        parse_frame(value)
    assert caught.value.reason is Reason.UNDECODABLE
    assert words in caught.value.detail


def test_a_message_index_array_cut_short_is_undecodable() -> None:
    with pytest.raises(Undecodable, match="ends inside a varint"):
        parse_frame(b"\x00\x00\x00\x00\x01\x04\x80", protobuf=True)


@dataclass
class Registered:
    schema_str: str
    schema_type: str
    references: list[Any]


class Registry:
    """Answers ``get_schema(id)`` as confluent-kafka's client does: a schema, a 404, or no answer at all."""

    def __init__(self, schemas: dict[int, tuple[str, str]], *, down: bool = False) -> None:
        self.schemas = schemas
        self.down = down
        self.asked: list[int] = []

    def register_schema(self, subject: str, schema: Any) -> int:
        """Register a schema (confluent-kafka's ``Schema``) as the registry does: the same one keeps its id."""
        del subject
        entry = (schema.schema_str, schema.schema_type)
        found = [i for i, known in self.schemas.items() if known == entry]
        if found:
            return found[0]
        schema_id = max(self.schemas, default=0) + 1
        self.schemas[schema_id] = entry
        return schema_id

    def get_schema(self, schema_id: int) -> Registered:
        self.asked.append(schema_id)
        if self.down:
            raise ConnectionRefusedError(111, "Connection refused")
        if schema_id not in self.schemas:
            raise SchemaRegistryError(404, 40403, f"Schema {schema_id} not found.")
        text, kind = self.schemas[schema_id]
        return Registered(text, kind, [])


V1 = {
    "type": "record",
    "name": "Click",
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "page", "type": "string"},
        {"name": "referrer", "type": "string"},
    ],
}
# v2: a field added with a default, a field removed
V2 = {**V1, "fields": [*V1["fields"][:3], {"name": "latency", "type": ["null", "double"], "default": None}]}


def avro(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    return AvroEncoder(Registry({}), "t", schema).payload(record)


def test_avro_decodes_each_record_with_its_writer_schema_fetched_once_per_id() -> None:
    registry = Registry({})
    v1, v2 = AvroEncoder(registry, "clicks", V1), AvroEncoder(registry, "clicks", V2)
    assert (v1.schema_id, v2.schema_id, AvroEncoder(registry, "clicks", V1).schema_id) == (1, 2, 1)
    decode = AvroDecoder(registry)
    ts = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
    old = {"event_id": "a", "ts": ts, "page": "/x", "referrer": "r"}
    new = {"event_id": "b", "ts": ts, "page": "/y", "latency": 2.5}
    for _ in range(3):
        assert decode(v1(old)) == old
        assert decode(v2(new)) == new
    assert v1(old) == frame(1, v1.payload(old))
    assert registry.asked == [1, 2]


def test_avro_refusals_carry_their_reason() -> None:
    decode = AvroDecoder(Registry({1: (json.dumps(V1), "AVRO"), 3: ("syntax = 'proto3';", "PROTOBUF")}))
    with pytest.raises(Undecodable) as unknown:
        decode(frame(9, b"\x02a"))
    assert unknown.value.reason is Reason.UNKNOWN_SCHEMA
    with pytest.raises(Undecodable) as wrong_type:
        decode(frame(3, b"\x02a"))
    assert wrong_type.value.reason is Reason.UNDECODABLE
    assert "is a PROTOBUF schema" in wrong_type.value.detail
    payload = avro(V1, {"event_id": "a", "ts": 0, "page": "/x", "referrer": "r"})
    for bad in (payload[:-3], payload + b"\x00\x00"):
        with pytest.raises(Undecodable) as mismatch:
            decode(frame(1, bad))
        assert mismatch.value.reason is Reason.UNDECODABLE
        assert "does not match schema id 1" in mismatch.value.detail


def test_a_registry_that_does_not_answer_is_no_verdict_on_the_record() -> None:
    registry = Registry({1: (json.dumps(V1), "AVRO")}, down=True)
    decode = AvroDecoder(registry)
    record = frame(1, avro(V1, {"event_id": "a", "ts": 0, "page": "/x", "referrer": "r"}))
    with pytest.raises(RegistryUnavailable):
        decode(record)
    registry.down = False
    assert decode(record)["event_id"] == "a"


PROTO = """
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Other { string x = 1; }
message Click {
  message Actor { string id = 1; }
  string id = 1;
  google.protobuf.Timestamp ts = 2;
  string page = 3;
  Actor actor = 4;
  double latency = 5;
  map<string, string> dims = 6;
  repeated int64 tags = 7;
}
"""


def test_protobuf_decodes_the_indexed_message_type_fields_by_name() -> None:
    from google.protobuf.message_factory import GetMessageClass

    file_desc = compile_proto(PROTO, 5)
    click = GetMessageClass(file_desc.message_types_by_name["Click"])()
    click.id = "e1"
    click.ts.FromDatetime(datetime(2026, 11, 1, 12, 0, 0, 123000, tzinfo=UTC))
    click.page = "/p"
    click.actor.id = "u1"
    click.dims["country"] = "FR"
    click.tags.extend([2**40, 3])
    registry = Registry({5: (PROTO, "PROTOBUF")})
    decode = ProtobufDecoder(registry)
    got = decode(frame(5, click.SerializeToString(), (1,)))
    assert got == {
        "id": "e1",
        "ts": datetime(2026, 11, 1, 12, 0, 0, 123000, tzinfo=UTC),
        "page": "/p",
        "actor": {"id": "u1"},
        "dims": {"country": "FR"},
        "tags": [2**40, 3],
    }
    # the first message type of the file (index path [0], written as one 0 byte) reads the same bytes otherwise
    assert decode(frame(5, b"\x0a\x01z", ())) == {"x": "z"}
    with pytest.raises(Undecodable, match="no message at depth 0"):
        decode(frame(5, b"", (7,)))
    with pytest.raises(Undecodable) as bad:
        decode(frame(5, b"\xff\xff\xff", (1,)))
    assert bad.value.reason is Reason.UNDECODABLE
    assert registry.asked == [5]


def test_a_proto_that_does_not_compile_is_undecodable() -> None:
    with pytest.raises(Undecodable, match="does not compile"):
        ProtobufDecoder(Registry({1: ("message {", "PROTOBUF")}))(frame(1, b"", ()))


def test_json_values_are_taken_as_they_are_or_without_their_json_schema_frame() -> None:
    decode = JsonDecoder()
    assert decode(b'{"id": "a"}') == b'{"id": "a"}'
    assert decode(frame(4, b'{"id": "a"}')) == b'{"id": "a"}'
    with pytest.raises(Undecodable):
        decode(None)


def test_a_dead_letter_of_a_kafka_record_says_its_topic_partition_and_offset() -> None:
    now = datetime(2026, 11, 27, tzinfo=UTC)
    reject = Reject(b"\x00\x00\x00\x00\x09zz", Reason.UNKNOWN_SCHEMA, "schema id 9", "orders", None, now, None, 3, 41)
    value, headers, _ts = encode_reject(reject)
    letter = DeadLetter.decode(value)
    assert (letter.source, letter.source_partition, letter.source_offset) == ("orders", 3, 41)
    assert (letter.reason, letter.raw) == ("unknown_schema", reject.raw)
    assert dict(headers)["source"] == b"orders"
    # a file's reject has neither key, and reads back as -1
    plain = Reject(b"x", Reason.MALFORMED_JSON, "not JSON", "a.jsonl", 3, now)
    assert "source_offset" not in json.loads(encode_reject(plain)[0])
    assert DeadLetter.decode(encode_reject(plain)[0]).source_partition == -1


_AWARE = st.datetimes(
    min_value=datetime(1900, 1, 1),  # noqa: DTZ001 - bounds of an aware strategy
    max_value=datetime(2200, 1, 1),  # noqa: DTZ001
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]),
)
_DECODED = st.fixed_dictionaries(
    {
        "event_id": st.text(max_size=6),
        "at": _AWARE | st.datetimes() | st.integers(0, 2**45) | st.text(max_size=5),
        "sku": st.text(min_size=0, max_size=6) | st.integers(),
    },
    optional={
        "actor": st.fixed_dictionaries({"id": st.text(max_size=4) | st.none()}),
        "amount": st.floats() | st.none() | st.integers(-(2**60), 2**60),
        "dims": st.dictionaries(st.sampled_from(["country", "a b"]), st.text(max_size=3) | st.integers()),
    },
)


@given(_DECODED, st.sampled_from(["item", "user", "id", "none"]))
def test_decoded_records_take_the_fast_path_to_the_models_event_or_reject(fields: dict[str, Any], key: str) -> None:
    """encode_fields, the bridge's hot path, gives what the model gives: the same event bytes, or the same reject."""
    mapping = ColumnMapping.parse(["id=event_id", "ts=at", "item=sku", "user=actor.id", "value=amount"])
    now = datetime(2026, 11, 27, tzinfo=UTC)
    ctx = Context(source="t", now=now, max_future_skew=timedelta(minutes=5), mapping=mapping)
    fast = encode_fields(fields, b"raw", ctx, key)
    model = encoded(validate_fields(fields, b"raw", ctx, None), key)
    if isinstance(model, Reject):
        assert isinstance(fast, Reject)
        assert (fast.reason, fast.detail) == (model.reason, model.detail)
    else:
        assert fast == model
