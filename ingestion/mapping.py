"""Map the columns of other shapes (CSV headers, JSON fields) onto the event model.

A :class:`ColumnMapping` says which column holds each event field and how times are written. Sources keep their
own names (``event_id``, ``timestamp``, ``page``, ``uid``…); only the mapping changes, never the model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import tzinfo
from functools import cached_property
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from views.event import TIME_FORMATS, parse_time

EVENT_FIELDS = ("id", "ts", "item", "user", "value")
_MISSING = object()


class MappingError(ValueError):
    """A column mapping given by the user is not valid."""


@dataclass(frozen=True)
class ColumnMapping:
    """Which source column feeds each event field, and how times are written.

    :arg columns: event field (``id``, ``ts``, ``item``, ``user``, ``value``) -> source column. A field left out
        maps to the column of the same name. JSON columns may be dotted paths into nested objects
        (``actor.id``) when no top-level key has that name.
    :arg dims: dimension name -> source column, each becoming one entry of ``dims``.
    :arg dims_column: a column holding a whole JSON object of dimensions (``dims`` by default, ``None`` for none);
        named ``dims`` columns are added on top.
    :arg time_format: ``auto`` (ISO-8601 with offset, or epoch seconds/milliseconds told apart by magnitude),
        ``iso``, ``epoch_s``, ``epoch_ms``, ``epoch_us`` or a ``strptime`` pattern.
    :arg assume_tz: IANA zone of times written without an offset (e.g. ``UTC``); without it they are rejected.
    """

    columns: Mapping[str, str] = field(default_factory=dict)
    dims: Mapping[str, str] = field(default_factory=dict)
    dims_column: str | None = "dims"
    time_format: str = "auto"
    assume_tz: str | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.columns) - set(EVENT_FIELDS))
        if unknown:
            msg = f"unknown event field(s) {', '.join(unknown)} in the mapping; map from {', '.join(EVENT_FIELDS)}"
            raise MappingError(msg)
        if self.time_format not in TIME_FORMATS and "%" not in self.time_format:
            msg = f"time format {self.time_format!r} is none of {', '.join(TIME_FORMATS)} nor a strptime pattern"
            raise MappingError(msg)
        _ = self.zone  # fail early on an unknown zone

    @cached_property
    def zone(self) -> tzinfo | None:
        """Return the zone of offset-less times, or None to reject them."""
        if self.assume_tz is None:
            return None
        try:
            return ZoneInfo(self.assume_tz)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            msg = f"unknown time zone {self.assume_tz!r}"
            raise MappingError(msg) from exc

    @cached_property
    def is_identity(self) -> bool:
        """Tell whether records already have the event's own fields (so the replay's fast path reads them as is)."""
        return (
            all(self.column(name) == name for name in EVENT_FIELDS)
            and not self.dims
            and self.dims_column == "dims"
            and self.time_format == "auto"
            and self.assume_tz is None
        )

    @cached_property
    def _plan(self) -> tuple[tuple[str, str], ...]:
        return tuple((name, self.column(name)) for name in EVENT_FIELDS)

    def column(self, event_field: str) -> str:
        """Return the source column of an event field."""
        return self.columns.get(event_field, event_field)

    @classmethod
    def parse(
        cls,
        pairs: Iterable[str] = (),
        dims: Iterable[str] = (),
        *,
        dims_column: str | None = "dims",
        time_format: str = "auto",
        assume_tz: str | None = None,
    ) -> ColumnMapping:
        """Build a mapping from CLI words: ``field=column`` pairs and ``name[=column]`` dimensions.

        :raises MappingError: on a malformed word or an unknown field.
        """
        columns: dict[str, str] = {}
        for pair in pairs:
            name, sep, column = pair.partition("=")
            if not sep or not name.strip() or not column.strip():
                msg = f"mapping {pair!r} is not field=column"
                raise MappingError(msg)
            columns[name.strip()] = column.strip()
        dim_columns: dict[str, str] = {}
        for word in dims:
            name, _, column = word.partition("=")
            if not name.strip():
                msg = f"dimension {word!r} is not name[=column]"
                raise MappingError(msg)
            dim_columns[name.strip()] = (column or name).strip()
        return cls(columns, dim_columns, dims_column, time_format, assume_tz)

    def with_columns(self, **columns: str) -> ColumnMapping:
        """Return a copy with more field -> column entries."""
        return replace(self, columns={**self.columns, **columns})

    def apply(self, record: Mapping[str, Any], *, empty_is_missing: bool = False) -> dict[str, Any]:
        """Return the event-field dict of a source record, ready for ``Event.model_validate``.

        Missing columns are left out, so the model reports them (required) or defaults them (optional).

        :arg empty_is_missing: treat empty strings as absent (CSV has no null).
        :raises pydantic_core.PydanticCustomError: of type ``bad_time`` when a time in an explicit format does
            not parse.
        """
        out: dict[str, Any] = {}
        for name, column in self._plan:
            value = record.get(column, _MISSING) if "." not in column else _lookup(record, column)
            if value is _MISSING or value is None or (empty_is_missing and value == ""):
                continue
            out[name] = value
        if "ts" in out and (self.time_format != "auto" or self.assume_tz is not None):
            out["ts"] = parse_time(out["ts"], self.time_format, self.zone)
        dims: dict[str, Any] = {}
        if self.dims_column is not None:
            nested = _lookup(record, self.dims_column)
            if nested is not _MISSING and nested is not None and not (empty_is_missing and nested == ""):
                if not isinstance(nested, Mapping):
                    out["dims"] = nested  # let the model report the type error
                    return out
                dims.update(nested)
        for name, column in self.dims.items():
            value = _lookup(record, column)
            if value is _MISSING or value is None or (empty_is_missing and value == ""):
                continue
            dims[name] = value
        if dims:
            out["dims"] = dims
        return out


def _lookup(record: Mapping[str, Any], column: str) -> Any:
    if column in record:
        return record[column]
    if "." not in column:
        return _MISSING
    node: Any = record
    for part in column.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


DEFAULT_MAPPING = ColumnMapping()
