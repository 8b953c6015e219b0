"""Turn raw input records into valid events or rejects — never an exception.

Invalid input is data (bytewax's ``oks``/``errs`` split): each record becomes either an :class:`~views.event.Event`
or a :class:`Reject` that keeps the original bytes, a :class:`Reason` code, a human detail and where the record
came from, for the dead-letter topic. Everything here is pure: the current time is an argument.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import cached_property
from typing import Any, Final

import msgspec
from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from ingestion.mapping import DEFAULT_MAPPING, ColumnMapping
from views.event import EVENT_SCHEMA_VERSION, Event, encode_fast, encode_raw_fast, format_ts, ts_millis

logger = logging.getLogger(__name__)

# A raw input record (a JSON line, a CSV row) larger than this is rejected before parsing.
MAX_RECORD_BYTES: Final = 16 * 1024
MAX_DETAIL_CHARS = 500


class Reason(StrEnum):
    """Why a record was dead-lettered (stable codes: operators filter and count by them)."""

    NOT_UTF8 = "not_utf8"
    OVERSIZE_RECORD = "oversize_record"
    MALFORMED_JSON = "malformed_json"
    MALFORMED_CSV = "malformed_csv"
    MISSING_FIELD = "missing_field"
    INVALID_FIELD = "invalid_field"
    OVERSIZE_FIELD = "oversize_field"
    BAD_TIME = "bad_time"
    FUTURE_TIME = "future_time"
    NON_FINITE = "non_finite"
    CONTROL_CHARACTER = "control_character"
    UNSUPPORTED_VERSION = "unsupported_version"
    BROKER_REJECTED = "broker_rejected"
    INTERNAL_ERROR = "internal_error"
    UNKNOWN_SCHEMA = "unknown_schema"  # a framed record whose schema id the registry does not know
    UNDECODABLE = "undecodable"  # not framed, or a payload that does not match its schema


# pydantic error type -> reason; anything else is INVALID_FIELD.
_ERROR_REASONS = {
    "missing": Reason.MISSING_FIELD,
    "bad_time": Reason.BAD_TIME,
    "finite_number": Reason.NON_FINITE,
    "control_character": Reason.CONTROL_CHARACTER,
    "string_too_long": Reason.OVERSIZE_FIELD,
    "too_long": Reason.OVERSIZE_FIELD,
}


@dataclass(frozen=True, slots=True)
class Reject:
    """A record that cannot become an event, with what an operator needs to fix and replay it.

    :arg raw: the original bytes of the record (a JSON line without its newline, a CSV row).
    :arg reason: the machine-readable cause.
    :arg detail: the human-readable cause (truncated to :data:`MAX_DETAIL_CHARS`).
    :arg source: where it came from (a file path, ``-`` for stdin, ``generator``…).
    :arg line: the 1-based line number in the source where the record starts, if any.
    :arg rejected_at: when it was rejected (UTC).
    :arg raw_size: the size of the whole original record when ``raw`` holds only its start.
    :arg partition: the source topic's partition, for a record read from Kafka (``source`` is then the topic).
    :arg offset: its offset in that partition.
    """

    raw: bytes
    reason: Reason
    detail: str
    source: str
    line: int | None
    rejected_at: datetime
    raw_size: int | None = None
    partition: int | None = None
    offset: int | None = None


@dataclass(frozen=True)
class Context:
    """What validation needs besides the record: the mapping, the clock and the allowed future skew."""

    source: str
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    max_future_skew: timedelta = timedelta(minutes=5)
    mapping: ColumnMapping = DEFAULT_MAPPING

    @property
    def latest_allowed(self) -> datetime:
        """Return the latest event time accepted now."""
        return self.now + self.max_future_skew

    @cached_property
    def latest_allowed_ms(self) -> int:
        """Return :attr:`latest_allowed` as epoch ms (the fast paths compare record timestamps with it)."""
        return ts_millis(self.latest_allowed)


Outcome = Event | Reject


def _reject(raw: bytes, reason: Reason, detail: str, ctx: Context, line: int | None, size: int | None = None) -> Reject:
    return Reject(raw, reason, detail[:MAX_DETAIL_CHARS], ctx.source, line, ctx.now, size)


def _from_validation_error(exc: ValidationError) -> tuple[Reason, str]:
    errors = exc.errors(include_url=False, include_input=False)
    first = errors[0]
    reason = _ERROR_REASONS.get(first["type"], Reason.INVALID_FIELD)
    detail = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'record'}: {e['msg']}" for e in errors)
    return reason, detail


def validate_fields(fields: Mapping[str, Any], raw: bytes, ctx: Context, line: int | None) -> Outcome:
    """Validate a record already split into source columns (a parsed JSON object, a CSV row as a dict)."""
    try:
        version = fields.get("v", EVENT_SCHEMA_VERSION) if not isinstance(fields, _CsvRow) else EVENT_SCHEMA_VERSION
        if type(version) is not int or version != EVENT_SCHEMA_VERSION:  # a newer writer: never read it as v1
            detail = f"v: schema version {version!r}; this ingester reads version {EVENT_SCHEMA_VERSION}"
            return _reject(raw, Reason.UNSUPPORTED_VERSION, detail, ctx, line)
        try:
            mapped = ctx.mapping.apply(fields, empty_is_missing=isinstance(fields, _CsvRow))
            event = Event.model_validate(mapped)
        except PydanticCustomError as exc:  # an explicit time format did not parse
            return _reject(raw, Reason.BAD_TIME, f"ts: {exc.message()}", ctx, line)
        except ValidationError as exc:
            reason, detail = _from_validation_error(exc)
            return _reject(raw, reason, detail, ctx, line)
        if event.ts > ctx.latest_allowed:
            detail = (
                f"event time {format_ts(event.ts)} is more than {ctx.max_future_skew.total_seconds():.0f} s "
                f"after now ({format_ts(ctx.now)})"
            )
            return _reject(raw, Reason.FUTURE_TIME, detail, ctx, line)
    except Exception as exc:  # noqa: BLE001 - the last guard: one bad record must never stop ingestion
        # The exception's message may quote the record (a user id): the log gets its type and frames only; the
        # message goes with the raw record to the dead-letter topic, which holds raw records anyway.
        logger.error(
            "validation failed unexpectedly on %s line %s: %s\n%s",
            ctx.source, line, type(exc).__name__, "".join(traceback.format_tb(exc.__traceback__)),
        )  # fmt: skip
        return _reject(raw, Reason.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}", ctx, line)
    return event


def _decode(raw: bytes, ctx: Context, line: int | None, size: int | None) -> str | Reject:
    if (size is not None and size > MAX_RECORD_BYTES) or len(raw) > MAX_RECORD_BYTES:
        total = size if size is not None else len(raw)
        detail = f"record of {total} bytes exceeds {MAX_RECORD_BYTES} bytes"
        return _reject(raw[:MAX_RECORD_BYTES], Reason.OVERSIZE_RECORD, detail, ctx, line, total)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _reject(raw, Reason.NOT_UTF8, f"invalid UTF-8 at byte {exc.start}: {exc.reason}", ctx, line)


_MSGSPEC = msgspec.json.Decoder()


def loads(text: str) -> Any:
    """Parse JSON text exactly as :func:`json.loads` does, ~1.7x faster on the records that msgspec takes.

    msgspec refuses some texts that ``json`` takes (NaN and Infinity tokens, numbers beyond a double, lone
    surrogate escapes) and gives the same value as ``json`` on every text it takes; on any refusal the text goes
    to ``json``, so values, errors and their messages (the dead letters' details) stay those of ``json``.
    """
    try:
        return _MSGSPEC.decode(text)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return json.loads(text)


def _parse_json(raw: bytes, ctx: Context, line: int | None, size: int | None) -> dict[str, Any] | Reject:
    text = _decode(raw, ctx, line, size)
    if isinstance(text, Reject):
        return text
    try:
        obj = loads(text)
    except (ValueError, RecursionError) as exc:
        return _reject(raw, Reason.MALFORMED_JSON, f"not JSON: {exc}", ctx, line)
    if not isinstance(obj, dict):
        return _reject(raw, Reason.MALFORMED_JSON, f"a JSON {type(obj).__name__} is not an object", ctx, line)
    return obj


def validate_json(raw: bytes, ctx: Context, line: int | None = None, *, size: int | None = None) -> Outcome:
    """Validate one JSON record (a JSONL line without its line break).

    :arg size: the full size of the record when ``raw`` is only its start (a reader cut an overlong line).
    """
    obj = _parse_json(raw, ctx, line, size)
    return obj if isinstance(obj, Reject) else validate_fields(obj, raw, ctx, line)


# An event as a replay produces it: its JSON, key and record timestamp (epoch ms).
Encoded = tuple[bytes, bytes | None, int]


def encode_json(
    raw: bytes, ctx: Context, key_field: str, line: int | None = None, *, size: int | None = None
) -> Encoded | Reject:
    """Validate one JSON record and return it as it goes to Kafka (or its reject), as :func:`validate_json` does.

    The same bytes, key and timestamp as ``Event.to_json``/``key``/``ts_ms`` of :func:`validate_json`'s event, and
    the same rejects, without building the event when the record is plainly valid (the replay's hot path: a
    record in the event's own form is checked in C by :func:`views.event.encode_raw_fast`, others field by field
    by :func:`views.event.encode_fast`); every other record, and every error, goes through the model.
    """
    if size is None:
        done = encode_json_fast(raw, ctx, key_field)
        if done is not None:
            return done
    obj = _parse_json(raw, ctx, line, size)
    if isinstance(obj, Reject):
        return obj
    version = obj.get("v", EVENT_SCHEMA_VERSION)  # a mapping drops "v": checked here, as validate_fields does
    if type(version) is int and version == EVENT_SCHEMA_VERSION:
        try:
            # the fast path defers on what the default mapping would drop (other keys, nulls where text is due)
            fast = encode_fast(obj if ctx.mapping.is_identity else ctx.mapping.apply(obj), key_field)
        except Exception:  # noqa: BLE001 - the model's path below gives the exact error
            fast = None
        if fast is not None and fast[2] <= ctx.latest_allowed_ms:
            return fast
    return encoded(validate_fields(obj, raw, ctx, line), key_field)


def encode_json_fast(
    raw: bytes, ctx: Context, key_field: str, user_as: Callable[[str, int], str | None] | None = None
) -> Encoded | None:
    """Return a plainly valid record in the event's own form as it goes to Kafka, or None for the full path.

    :func:`encode_json`'s first step: :func:`views.event.encode_raw_fast` on a record within the size limit, read
    without a mapping, and not too far in the future. ``user_as`` replaces its user (see there).
    """
    if len(raw) <= MAX_RECORD_BYTES and ctx.mapping.is_identity:
        done = encode_raw_fast(raw, key_field, user_as)
        if done is not None and done[2] <= ctx.latest_allowed_ms:
            return done
    return None


def encode_fields(fields: Mapping[str, Any], raw: bytes, ctx: Context, key_field: str) -> Encoded | Reject:
    """Validate a record already decoded into fields (Avro, Protobuf) and return it as it goes to Kafka.

    The same bytes, key and timestamp as ``encoded(validate_fields(...))``, and the same rejects, with the fast
    path of :func:`encode_json` for plainly valid records: an aware ``datetime`` (Avro's timestamp types,
    Protobuf's ``Timestamp``) is written as the canonical time text first, which the model would make of it too.
    """
    version = fields.get("v", EVENT_SCHEMA_VERSION)
    if type(version) is int and version == EVENT_SCHEMA_VERSION:
        try:
            mapped = ctx.mapping.apply(fields)
            ts = mapped.get("ts")
            if isinstance(ts, datetime) and ts.utcoffset() is not None:
                mapped["ts"] = format_ts(ts)
            fast = encode_fast(mapped, key_field)
        except Exception:  # noqa: BLE001 - the model's path below gives the exact error
            fast = None
        if fast is not None and fast[2] <= ctx.latest_allowed_ms:
            return fast
    return encoded(validate_fields(fields, raw, ctx, None), key_field)


def encoded(outcome: Outcome, key_field: str) -> Encoded | Reject:
    """Return a validated event as it goes to Kafka (JSON, key, record timestamp); a reject as it is."""
    return outcome if isinstance(outcome, Reject) else (outcome.to_json(), outcome.key(key_field), outcome.ts_ms)


def validate_csv(
    raw: bytes,
    header: Sequence[str],
    ctx: Context,
    line: int | None = None,
    *,
    size: int | None = None,
    dialect: type[csv.Dialect] | csv.Dialect | str = "excel",
) -> Outcome:
    """Validate one CSV record (one row, possibly spanning lines inside quotes) against the file's header."""
    text = _decode(raw, ctx, line, size)
    if isinstance(text, Reject):
        return text
    try:
        rows = list(csv.reader(io.StringIO(text, newline=""), dialect, strict=True))
    except csv.Error as exc:
        return _reject(raw, Reason.MALFORMED_CSV, f"not CSV: {exc}", ctx, line)
    if len(rows) != 1:
        return _reject(raw, Reason.MALFORMED_CSV, f"{len(rows)} rows in one record", ctx, line)
    row = rows[0]
    if len(row) != len(header):
        detail = f"{len(row)} columns, the header has {len(header)}"
        return _reject(raw, Reason.MALFORMED_CSV, detail, ctx, line)
    return validate_fields(_CsvRow(zip(header, row, strict=True)), raw, ctx, line)


class _CsvRow(dict[str, str]):
    """A CSV row as a dict; its type tells the mapping that empty cells mean "absent"."""


def split(outcomes: Sequence[Outcome]) -> tuple[list[Event], list[Reject]]:
    """Split outcomes into the valid events and the rejects."""
    oks = [o for o in outcomes if isinstance(o, Event)]
    errs = [o for o in outcomes if isinstance(o, Reject)]
    return oks, errs
