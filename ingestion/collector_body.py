"""A collector request's body: its size bounded as sent, as read and as inflated, its type, and its records.

All of it runs on bytes a client chose, before any record is validated: a limit is checked as the bytes come (a gzip
bomb stops at ``collector.max_body_bytes`` of output, a JSON array past ``collector.max_records`` elements), and a
refusal past a limit names its setting. :mod:`ingestion.collector` answers a :class:`Refusal` with its status.
"""

from __future__ import annotations

import io
import json
import zlib
from collections.abc import AsyncIterable
from typing import Any, Final, Literal

import msgspec

from ingestion.files import read_lines

JSON_TYPES: Final = frozenset({"application/json"})
NDJSON_TYPES: Final = frozenset({"application/x-ndjson", "application/jsonl", "application/json-lines"})


class Refusal(Exception):  # noqa: N818 - an answer, not a failure of the server
    """A request refused as a whole: its status, the message, and the headers of the answer."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers or {}


def content_length_refusal(value: str | None, limit: int) -> Refusal | None:
    """Return the refusal a ``Content-Length`` header earns before anything is read, or None."""
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        return Refusal(400, f"Content-Length {value[:40]!r} is not a number")
    if length > limit:
        return Refusal(413, f"a body of {length} bytes is over collector.max_body_bytes ({limit})")
    return None


async def read_body(chunks: AsyncIterable[bytes], limit: int) -> bytes:
    """Read the body, refusing it (413) as soon as it passes ``limit`` bytes."""
    out: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            msg = f"the body is over collector.max_body_bytes ({limit} bytes)"
            raise Refusal(413, msg)
        out.append(chunk)
    return b"".join(out)


def inflate(data: bytes, limit: int) -> bytes:
    """Return gzip ``data`` decompressed, never holding more than ``limit`` + 1 bytes of output.

    Several gzip members one after the other (``cat a.gz b.gz``) are one stream, as gzip reads them.

    :raises Refusal: 413 when the output passes ``limit``, 400 when the data is not complete gzip.
    """
    out = bytearray()
    rest = data
    try:
        while rest:
            inflater = zlib.decompressobj(wbits=31)
            out += inflater.decompress(rest, limit + 1 - len(out))
            if len(out) > limit or inflater.unconsumed_tail:
                msg = f"the body inflates to more than collector.max_body_bytes ({limit} bytes)"
                raise Refusal(413, msg)
            if not inflater.eof:
                msg = "the gzip body is truncated"
                raise Refusal(400, msg)
            rest = inflater.unused_data
    except zlib.error as exc:
        msg = f"the body is not gzip: {exc}"
        raise Refusal(400, msg) from exc
    return bytes(out)


BodyFormat = Literal["json", "ndjson"]


def body_format(content_type: str | None) -> BodyFormat:
    """Return the body format a ``Content-Type`` names.

    :raises Refusal: 415 for any other type, or a charset other than UTF-8.
    """
    media, _, params = (content_type or "").partition(";")
    media = media.strip().lower()
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in {"utf-8", "utf8"}:
            msg = f"charset {value.strip()!r}: the collector reads UTF-8 only"
            raise Refusal(415, msg)
    if media in JSON_TYPES:
        return "json"
    if media in NDJSON_TYPES:
        return "ndjson"
    msg = (
        f"Content-Type {media or '(none)'!r} is not supported: send application/json (an array of events) or "
        "application/x-ndjson (one event per line)"
    )
    raise Refusal(415, msg)


_RAW_ARRAY = msgspec.json.Decoder(list[msgspec.Raw])
_JSON = json.JSONDecoder()
_WHITESPACE = " \t\n\r"


def records(body: bytes, fmt: BodyFormat, max_records: int) -> list[tuple[int, bytes, int | None]]:
    """Split a body into its records: (0-based position, original bytes, full size when cut) each.

    JSON lines are read as ``trends ingest file`` reads them (blank lines skipped, over-long lines cut); a line
    that is not JSON is a record like any other (it becomes a reject). A JSON array gives each element's own bytes.
    Either stops at the first record past ``max_records``: a body of tiny records costs no more than its limit.

    :raises Refusal: 400 when a JSON body is not a JSON array, 413 past ``max_records``.
    """
    too_many = Refusal(413, f"more than collector.max_records ({max_records}) records in one request")
    if fmt == "ndjson":
        out: list[tuple[int, bytes, int | None]] = []
        for rec in read_lines(io.BytesIO(body)):
            if len(out) == max_records:
                raise too_many
            out.append((rec.line - 1, rec.raw, rec.size))
        return out
    # The array at once with msgspec when it cannot hold too many elements (each is followed by a comma but the
    # last); else element by element, stopping past the limit.
    if body.count(b",") < max_records:
        try:
            return [(i, bytes(raw), None) for i, raw in enumerate(_RAW_ARRAY.decode(body))]
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            pass  # not JSON, not an array, or what msgspec refuses and json takes (NaN, huge numbers)
    return [(i, raw, None) for i, raw in enumerate(_array_elements(body, max_records, too_many))]


def _array_elements(body: bytes, max_records: int, too_many: Refusal) -> list[bytes]:
    """Return the elements of a JSON array as their own bytes, read one by one by :mod:`json`."""
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        msg = f"the body is not UTF-8 (JSON is): {exc}"
        raise Refusal(400, msg) from exc
    n = len(text)
    pos = _skip(text, 0)
    if pos == n or text[pos] != "[":
        kind = "empty" if pos == n else f"a JSON {type(_value(text)).__name__}"
        msg = f"the body is {kind}, not an array of events"
        raise Refusal(400, msg)
    out: list[bytes] = []
    pos = _skip(text, pos + 1)
    if pos < n and text[pos] == "]":
        return _end(text, pos, out)
    while True:
        if len(out) == max_records:
            raise too_many
        try:
            _, end = _JSON.raw_decode(text, pos)
        except (ValueError, RecursionError) as exc:
            msg = f"the body is not JSON: {exc}"
            raise Refusal(400, msg) from exc
        out.append(text[pos:end].encode())
        pos = _skip(text, end)
        if pos < n and text[pos] == "]":
            return _end(text, pos, out)
        if pos >= n or text[pos] != ",":
            msg = f"the body is not JSON: expected ',' or ']' at character {pos}"
            raise Refusal(400, msg)
        pos = _skip(text, pos + 1)


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WHITESPACE:
        pos += 1
    return pos


def _end(text: str, pos: int, out: list[bytes]) -> list[bytes]:
    if _skip(text, pos + 1) != len(text):
        msg = f"the body is not JSON: extra data after the array at character {pos + 1}"
        raise Refusal(400, msg)
    return out


def _value(text: str) -> Any:
    try:
        return _JSON.decode(text)
    except (ValueError, RecursionError) as exc:
        msg = f"the body is not JSON: {exc}"
        raise Refusal(400, msg) from exc
