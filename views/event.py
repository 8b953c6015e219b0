"""The event contract: the one event model, its limits, its wire JSON and time format, and its Spark schema.

Every record on the events topic is an :class:`Event` serialized by :meth:`Event.to_json`: compact JSON with the
schema version ``v``, the event time ``ts`` as ISO-8601 UTC with milliseconds (:func:`format_ts`), and only the
optional fields that are present; with ``kafka.events_format`` ``avro``, that JSON transcoded to framed Avro of
:func:`avro_schema` (:mod:`views.event_avro`). Both Spark layers parse it with a schema that walks this model
(:func:`views.event_frames.spark_schema`, :func:`avro_schema`), so a field added here reaches them without a second
schema to keep in step; this module imports no Spark (the privacy export and the API read events through it). The
model's own validation (the time forms it accepts, text normalisation, bounded sizes) is part of the
contract; turning source records into events and rejects (column mappings, dead letters) is ingestion's.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import types
import typing
import unicodedata
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Annotated, Any, Final

import msgspec
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, model_validator
from pydantic_core import PydanticCustomError

EVENT_SCHEMA_VERSION: Final = 1

# Limits of the fields: with them the normalized event always stays far below Kafka's 1 MB message limit.
MAX_ID_CHARS: Final = 128
MAX_ITEM_CHARS: Final = 256
MAX_USER_CHARS: Final = 128
MAX_DIMS: Final = 16
MAX_DIM_KEY_CHARS: Final = 64
MAX_DIM_VALUE_CHARS: Final = 256
# Dimension names become slice names in the views, so they are plain identifiers.
DIM_KEY_PATTERN: Final = r"^[A-Za-z_][A-Za-z0-9_.\-]*$"
# Kafka record timestamps are non-negative milliseconds; years past 9999 do not fit ISO-8601.
MIN_TS: Final = datetime(1970, 1, 1, tzinfo=UTC)
MAX_TS: Final = datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)
# Epoch numbers at least this large are milliseconds, smaller ones seconds: 1e11 s is the year 5138, while 1e11 ms
# is March 1973, so real event times of either unit fall on the right side.
EPOCH_MS_THRESHOLD: Final = 100_000_000_000

TIME_FORMATS: Final = ("auto", "iso", "epoch_s", "epoch_ms", "epoch_us")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
_NUMBER_RE = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


class _TimeError(ValueError):
    """An event time that does not parse; its message is the detail of the ``bad_time`` reject."""


def _from_epoch(number: float, unit: str) -> datetime:
    if isinstance(number, float) and not math.isfinite(number):
        msg = f"{number} is not a finite number"
        raise _TimeError(msg)
    if unit == "auto":
        unit = "epoch_ms" if abs(number) >= EPOCH_MS_THRESHOLD else "epoch_s"
    try:
        if isinstance(number, int):  # exact integer arithmetic, no float rounding of large epochs
            millis = {"epoch_s": number * 1000, "epoch_ms": number, "epoch_us": number // 1000}[unit]
        else:
            millis = math.floor(number * {"epoch_s": 1000.0, "epoch_ms": 1.0, "epoch_us": 0.001}[unit])
        return _EPOCH + timedelta(milliseconds=millis)
    except (OverflowError, ValueError) as exc:
        msg = f"{number} is out of range as {unit}"
        raise _TimeError(msg) from exc


def _from_text(text: str, time_format: str) -> datetime:
    if not text:
        msg = "empty"
        raise _TimeError(msg)
    if time_format.startswith("epoch_") or (time_format == "auto" and _NUMBER_RE.match(text)):
        if not _NUMBER_RE.match(text):
            msg = f"{text[:40]!r} is not a number"
            raise _TimeError(msg)
        return _from_epoch(float(text) if any(c in text for c in ".eE") else int(text), time_format)
    try:
        if time_format in ("auto", "iso"):
            return datetime.fromisoformat(text)
        return datetime.strptime(text, time_format)  # noqa: DTZ007 - the zone is checked by the caller
    except ValueError as exc:
        msg = f"{text[:40]!r} is not ISO-8601" if time_format in ("auto", "iso") else f"{text[:40]!r} {exc}"
        raise _TimeError(msg) from exc


def _to_datetime(value: Any, time_format: str) -> datetime:
    if isinstance(value, datetime):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        if time_format not in ("auto", "epoch_s", "epoch_ms", "epoch_us"):
            msg = f"a number is not a {time_format} time"
            raise _TimeError(msg)
        return _from_epoch(value, time_format)
    if isinstance(value, str):
        return _from_text(value.strip(), time_format)
    msg = f"a {type(value).__name__} is not a time"
    raise _TimeError(msg)


def parse_time(value: Any, time_format: str = "auto", assume_tz: tzinfo | None = None) -> datetime:
    """Turn an event time into an aware UTC datetime truncated to milliseconds.

    Accepted: ISO-8601 strings with an offset or ``Z``; epoch seconds or milliseconds as numbers or numeric
    strings (``auto`` tells them apart by magnitude, see :data:`EPOCH_MS_THRESHOLD`); aware datetimes; and, with
    a ``strptime`` pattern as ``time_format``, any text layout.

    :arg time_format: ``auto``, ``iso``, ``epoch_s``, ``epoch_ms``, ``epoch_us`` or a ``strptime`` pattern.
    :arg assume_tz: zone of times written without an offset; without it such times are rejected, because
        guessing a zone silently shifts every event.
    :raises PydanticCustomError: of type ``bad_time`` when the value is not a time in range.
    """
    try:
        parsed = _to_datetime(value, time_format)
        if parsed.tzinfo is None or parsed.utcoffset() is None:
            if assume_tz is None:
                msg = "no UTC offset (add Z or +hh:mm, or give the zone of the source)"
                raise _TimeError(msg)
            parsed = parsed.replace(tzinfo=assume_tz)
        parsed = parsed.astimezone(UTC)
        parsed = parsed.replace(microsecond=parsed.microsecond // 1000 * 1000)
        if not MIN_TS <= parsed <= MAX_TS:
            msg = f"{parsed.isoformat()} is outside {MIN_TS.year}..{MAX_TS.year}"
            raise _TimeError(msg)
    except (_TimeError, OverflowError) as exc:
        kind, template = "bad_time", "unparseable event time: {detail}"
        raise PydanticCustomError(kind, template, {"detail": str(exc)}) from exc
    return parsed


def format_ts(ts: datetime) -> str:
    """Return the normalized text of an event time: ISO-8601 UTC with milliseconds and ``Z``."""
    if ts.tzinfo is not UTC:
        ts = ts.astimezone(UTC)
    return ts.replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"


def ts_millis(ts: datetime) -> int:
    """Return an aware datetime as epoch milliseconds (the Kafka record timestamp), exactly."""
    return (ts - _EPOCH) // _ONE_MS


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        kind, msg = "float_type", "a boolean is not a number"
        raise PydanticCustomError(kind, msg)
    return value


def _time(value: Any) -> datetime:
    # Fast path for the normalized form ("…T…Z"), which most records use; everything else goes the long way.
    if type(value) is str and len(value) >= 20 and value[-1] == "Z":
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return parse_time(value)
        if parsed.year >= MIN_TS.year:
            micro = parsed.microsecond
            return parsed.replace(microsecond=micro - micro % 1000) if micro % 1000 else parsed
    return parse_time(value)


CONTENT_ID_PREFIX: Final = "c-"


def content_id(ts: datetime, item: str, user: str | None, value: float | None, dims: dict[str, str]) -> str:
    """Return a deterministic event id from the content, for sources without ids.

    Replaying the same source twice gives the same ids, so the batch layer's dedupe drops the second copy. Two
    genuinely distinct events with identical content (same millisecond, item, user, value, dims) share an id.
    """
    return content_id_ms(ts_millis(ts), item, user, value, dims)


def content_id_ms(ts_ms: int, item: str, user: str | None, value: float | None, dims: dict[str, str]) -> str:
    """Return :func:`content_id` of an event whose time is given as epoch milliseconds."""
    canonical = json.dumps([ts_ms, item, user, value, sorted(dims.items())], ensure_ascii=False, separators=(",", ":"))
    return CONTENT_ID_PREFIX + hashlib.blake2b(canonical.encode(), digest_size=16).hexdigest()


# C0 controls (NUL, ESC, tab, line breaks…), DEL and C1 controls (0x9B is a one-byte CSI): no event text needs
# them, and printed raw they drive the operator's terminal. Rejected with their own reason (control_character).
CONTROL_CHARS: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _clean_text(value: Any) -> Any:
    """Normalise text to Unicode NFC and refuse control characters (one call per field: this is the hot path).

    NFC makes the same item typed in composed or decomposed form one item; ASCII is already NFC.
    """
    if type(value) is not str:
        return value
    if not value.isascii():
        value = unicodedata.normalize("NFC", value)
    match = CONTROL_CHARS.search(value)
    if match is not None:
        kind = "control_character"
        template = "control character U+{code} at position {position} (control characters are not allowed)"
        raise PydanticCustomError(kind, template, {"code": f"{ord(match.group()):04X}", "position": match.start()})
    return value


# Event text: NFC-normalised and free of control characters before the length limits apply (the constraints come
# first in each Annotated so that pydantic applies them natively to the str; the BeforeValidator runs before them).
_TEXT = BeforeValidator(_clean_text)
EventId = Annotated[str, StringConstraints(max_length=MAX_ID_CHARS), _TEXT]
Item = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ITEM_CHARS), _TEXT]
Actor = Annotated[str, StringConstraints(min_length=1, max_length=MAX_USER_CHARS), _TEXT]
DimName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_DIM_KEY_CHARS, pattern=DIM_KEY_PATTERN)]
# An empty dimension value would make a slice (`origin=`) that no query can name: rejected.
DimValue = Annotated[str, StringConstraints(min_length=1, max_length=MAX_DIM_VALUE_CHARS), _TEXT]


class Event(BaseModel):
    """One event: something (``item``) happened at ``ts``, optionally by ``user``, with a ``value`` and ``dims``.

    Input is lenient where it is unambiguous (numbers for string fields, numeric strings for ``value``, epoch
    or ISO times) and strict elsewhere (no booleans as numbers, no NaN/Inf, no naive times, bounded sizes).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", coerce_numbers_to_str=True)

    v: int = Field(EVENT_SCHEMA_VERSION, ge=1, le=EVENT_SCHEMA_VERSION, description="Schema version.")
    id: EventId = Field(
        "",
        description="Unique event id, for dedupe; derived from the content when the source has none.",
    )
    ts: Annotated[datetime, BeforeValidator(_time)] = Field(description="Event time (UTC, millisecond precision).")
    item: Item = Field(description="What may trend.")
    user: Actor | None = Field(None, description="The actor.")
    value: Annotated[float | None, BeforeValidator(_no_bool)] = Field(
        None, allow_inf_nan=False, description="A measurement (latency, amount, delay…)."
    )
    dims: dict[DimName, DimValue] = Field(
        default_factory=dict, max_length=MAX_DIMS, description="Dimensions to slice by (name -> value)."
    )

    @model_validator(mode="after")
    def _fill_id(self) -> Event:
        if not self.id:
            object.__setattr__(self, "id", content_id(self.ts, self.item, self.user, self.value, self.dims))
        return self

    @property
    def ts_ms(self) -> int:
        """Return the event time as epoch milliseconds (the Kafka record timestamp)."""
        return ts_millis(self.ts)

    def to_dict(self) -> dict[str, Any]:
        """Return the normalized event as plain JSON types (absent optional fields left out)."""
        return _wire_fields(self.v, self.id, format_ts(self.ts), self.item, self.user, self.value, self.dims)

    def to_json(self) -> bytes:
        """Return the normalized event as the UTF-8 JSON written to Kafka."""
        return _ENCODER.encode(self.to_dict()).encode()

    def key(self, field: str) -> bytes | None:
        """Return the record key: the named field's value (``none`` or an absent user: no key)."""
        if field == "none":
            return None
        value = getattr(self, field)
        return None if value is None else str(value).encode()


def _wire_fields(
    v: int, event_id: str, ts: str, item: str, user: str | None, value: float | None, dims: dict[str, str]
) -> dict[str, Any]:
    """Lay out the wire JSON's fields: in this order, absent optional fields (and empty dims) left out."""
    out: dict[str, Any] = {"v": v, "id": event_id, "ts": ts, "item": item}
    if user is not None:
        out["user"] = user
    if value is not None:
        out["value"] = value
    if dims:
        out["dims"] = dims
    return out


_DIM_NAME = re.compile(DIM_KEY_PATTERN.removeprefix("^").removesuffix("$"))  # used with fullmatch, as pydantic's
_FAST_FIELDS: Final = frozenset(("v", "id", "ts", "item", "user", "value", "dims"))
_EXACT_FLOAT: Final = 2**53  # ints up to this are floats exactly, as pydantic turns them


def _fast_text(value: Any, low: int, high: int) -> str | None:
    if type(value) is not str:
        return None
    try:
        if not value.isascii():
            value.encode()  # lone surrogates: pydantic refuses them (string_unicode)
        value = _clean_text(value)
    except (PydanticCustomError, UnicodeEncodeError):
        return None
    return value if low <= len(value) <= high else None


_CANONICAL_TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")  # format_ts's layout
_WIRE = msgspec.json.Encoder()


def _float_text_agrees(value: float) -> bool:
    """Tell whether msgspec writes this float as ``json`` does (both positional: no exponent either way)."""
    return value == 0 or 1e-4 <= abs(value) < 1e16


def encode_fast(fields: dict[str, Any], key_field: str) -> tuple[bytes, bytes | None, int] | None:  # noqa: PLR0911
    """Return what ``Event.model_validate(fields)`` would put on the wire — JSON, key, timestamp — or None.

    The hot path of a replay: a plainly valid record (strings where the model wants text, a number or nothing
    for ``value``, an ISO time) is checked and written without building the model, about twice as fast. Any
    coercion or error returns None: the model then decides and gives the exact event or error.
    ``tests/unit/test_view_event.py`` checks with hypothesis that both give the same bytes, key and timestamp.
    """
    if not fields.keys() <= _FAST_FIELDS or key_field not in ("item", "user", "id", "none"):
        return None
    v = fields.get("v", EVENT_SCHEMA_VERSION)
    item = _fast_text(fields.get("item"), 1, MAX_ITEM_CHARS)
    event_id = _fast_text(fields.get("id", ""), 0, MAX_ID_CHARS)
    raw_ts = fields.get("ts")
    if v != EVENT_SCHEMA_VERSION or type(v) is not int or item is None or event_id is None:
        return None
    if type(raw_ts) is not str or not raw_ts.isascii():
        return None
    user = fields.get("user")
    if user is not None and (user := _fast_text(user, 1, MAX_USER_CHARS)) is None:
        return None
    value = fields.get("value")
    if type(value) is int and -_EXACT_FLOAT <= value <= _EXACT_FLOAT:
        value = float(value)
    elif value is not None and (type(value) is not float or not math.isfinite(value)):
        return None
    raw_dims = fields.get("dims", {})
    if type(raw_dims) is not dict or len(raw_dims) > MAX_DIMS:
        return None
    dims: dict[str, str] = {}
    for name, text in raw_dims.items():
        if type(name) is not str or len(name) > MAX_DIM_KEY_CHARS or not _DIM_NAME.fullmatch(name):
            return None
        clean = _fast_text(text, 1, MAX_DIM_VALUE_CHARS)
        if clean is None:
            return None
        dims[name] = clean
    try:
        ts = _time(raw_ts)
    except PydanticCustomError:
        return None
    if not event_id:
        event_id = content_id(ts, item, user, value, dims)
    ts_text = raw_ts if _CANONICAL_TS.fullmatch(raw_ts) else format_ts(ts)
    return encode_wire(_wire_fields(v, event_id, ts_text, item, user, value, dims), ts_millis(ts), key_field)


class _RawEvent(msgspec.Struct, forbid_unknown_fields=True):
    """The event's JSON as msgspec checks it in C: the types and limits of :class:`Event` for ASCII text.

    Only :func:`encode_raw_fast` uses it, on records whose bytes are ASCII without escapes or DEL: their text needs
    no NFC, holds no control character, and its length in characters is its length in bytes.
    """

    ts: str
    item: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ITEM_CHARS)]
    v: int = EVENT_SCHEMA_VERSION
    id: Annotated[str, msgspec.Meta(max_length=MAX_ID_CHARS)] = ""
    user: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_USER_CHARS)] | None = None
    value: float | int | None = None
    dims: Annotated[
        dict[
            Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_DIM_KEY_CHARS, pattern=DIM_KEY_PATTERN)],
            Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_DIM_VALUE_CHARS)],
        ],
        msgspec.Meta(max_length=MAX_DIMS),
    ] = {}  # msgspec copies an empty mutable default per instance


_RAW_DECODER = msgspec.json.Decoder(_RawEvent)
_SECONDS: dict[str, int] = {}  # "YYYY-MM-DDTHH:MM:SS" -> epoch seconds, of canonical times seen lately
_SECONDS_KEPT: Final = 4096


def _canonical_ms(ts: str) -> int | None:
    """Return the epoch ms of a canonical time text (``format_ts``'s layout), or None for any other text."""
    if len(ts) != 24 or not _CANONICAL_TS.fullmatch(ts):
        return None
    head = ts[:19]
    seconds = _SECONDS.get(head)
    if seconds is None:
        try:
            parsed = datetime.fromisoformat(head).replace(tzinfo=UTC)
        except ValueError:
            return None
        if parsed < MIN_TS:
            return None
        if len(_SECONDS) >= _SECONDS_KEPT:
            _SECONDS.clear()
        seconds = _SECONDS[head] = (parsed - _EPOCH) // timedelta(seconds=1)
    return seconds * 1000 + int(ts[20:23])


def wire_ts_ms(text: str) -> int:
    """Return the epoch ms of a wire JSON's time: :func:`format_ts`'s layout on the fast path, other forms parsed.

    :raises PydanticCustomError: of type ``bad_time`` when the text is not a time in range.
    """
    ms = _canonical_ms(text)
    return ms if ms is not None else ts_millis(parse_time(text))


def encode_raw_fast(  # noqa: PLR0911
    raw: bytes, key_field: str, user_as: Callable[[str, int], str | None] | None = None
) -> tuple[bytes, bytes | None, int] | None:
    """Return what the model would put on the wire for a JSON record — JSON, key, timestamp — or None.

    The fast path of records already in the event's own form (another system's export, a replay, the collector's
    clients): ASCII JSON without escapes or DEL, the event's fields with the model's types and limits (checked by
    msgspec in C), a canonical time. About three times as fast as :func:`encode_fast`. Anything else returns None,
    and the caller takes the path that gives the exact event or reject; ``tests/unit/test_view_event.py`` checks
    that both write the same bytes, key and timestamp.

    :arg user_as: the text that replaces a user (its pseudonym), given the user and the event's epoch ms; its None,
        and an explicit id in the form of a content-derived one (whether it was derived from the user is the
        caller's to tell), return None. A derived id is derived from the replacement, as the model path would be.
    """
    if not raw.isascii() or b"\\" in raw or b"\x7f" in raw or key_field not in ("item", "user", "id", "none"):
        return None
    try:
        record = _RAW_DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    value = record.value
    if type(value) is int:
        if not -_EXACT_FLOAT <= value <= _EXACT_FLOAT:
            return None  # the model rounds it
        value = float(value)
    elif value is not None and not math.isfinite(value):
        return None
    if record.v != EVENT_SCHEMA_VERSION:
        return None
    ts_ms = _canonical_ms(record.ts)
    if ts_ms is None:
        return None
    user = record.user
    if user_as is not None and user is not None:
        if record.id.startswith(CONTENT_ID_PREFIX):
            return None
        user = user_as(user, ts_ms)
        if user is None:
            return None
    event_id = record.id or content_id_ms(ts_ms, record.item, user, value, record.dims)
    return encode_wire(
        _wire_fields(record.v, event_id, record.ts, record.item, user, value, record.dims), ts_ms, key_field
    )


def encode_wire(fields: dict[str, Any], ts_ms: int, key_field: str) -> tuple[bytes, bytes | None, int]:
    """Return the wire JSON, key and timestamp of an event's wire fields (valid, in :meth:`Event.to_dict`'s layout).

    The same bytes as ``Event.to_json``: msgspec writes them, unless it would write the value's float otherwise
    than ``json`` does. Used by :func:`encode_fast` and to write a pseudonymised event again without validating
    its other fields a second time.
    """
    value = fields.get("value")
    wire = _WIRE.encode(fields) if value is None or _float_text_agrees(value) else _ENCODER.encode(fields).encode()
    key = None if key_field == "none" else fields.get(key_field)
    return wire, None if key is None else str(key).encode(), ts_ms


def _avro_type(annotation: Any) -> tuple[Any, bool]:
    """Map a model field's annotation to an Avro type; return it and whether the field may be None."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _avro_type(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            msg = f"cannot map union {annotation!r} to an Avro type"
            raise TypeError(msg)
        return _avro_type(args[0])[0], True
    if origin is dict:
        key, val = typing.get_args(annotation)
        if _avro_type(key)[0] != "string":
            msg = f"Avro map keys are strings, not {key!r}"
            raise TypeError(msg)
        return {"type": "map", "values": _avro_type(val)[0]}, False
    simple: dict[Any, Any] = {
        str: "string",
        int: "int",
        float: "double",
        bool: "boolean",
        datetime: {"type": "long", "logicalType": "timestamp-millis"},  # the contract's millisecond precision
    }
    if annotation in simple:
        return simple[annotation], False
    msg = f"cannot map {annotation!r} to an Avro type"
    raise TypeError(msg)


def avro_schema() -> dict[str, Any]:
    """Return the Avro schema of an event (plain binary, no framing), derived field by field from :class:`Event`.

    The events topic's records in Avro (``kafka.events_format``, :mod:`views.event_avro`) are this schema, framed;
    Spark's ``from_avro`` decodes them about 4x faster than ``from_json`` the JSON (docs/benchmarks.md). A field
    the model always fills (``v``, ``id``, ``ts``, ``item``, ``dims``, empty or not) is required; one that may be
    None is a union with null, null first, default null. ``ts`` is ``timestamp-millis``, which Spark reads as a
    ``TimestampType``.
    """
    fields = []
    for name, info in Event.model_fields.items():
        avro_type, optional = _avro_type(info.annotation)
        fields.append(
            {"name": name, "type": ["null", avro_type], "default": None}
            if optional
            else {"name": name, "type": avro_type}
        )
    return {"type": "record", "name": "Event", "namespace": "trends.events", "fields": fields}
