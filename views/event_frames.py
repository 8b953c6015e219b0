"""Parse Kafka records of the events topic into the event frame both layers aggregate.

The schema is derived from :class:`views.event.Event` here (:func:`spark_schema`, never a second copy), beside
the Spark code that uses it, so the contract's own module imports no Spark. A record that does not
parse — or lacks an id, time or item — is kept and flagged rather than dropped, so each layer can count it.
Records are JSON, or, given the writer schemas of ``kafka.events_format`` ``avro``, JSON and framed Avro side by
side (:mod:`views.event_avro`): the same columns either way.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Annotated, Any, Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from views.event import Event
from views.event_avro import HEADER_BYTES, MAGIC, header, reader_schema_text

EVENT_COLUMNS = ("id", "ts", "item", "user", "value", "dims")
# Up to this many excluded users are a literal set in the plan; more are a broadcast anti-join (a plan holding
# thousands of literals is slow to build and to compile on every micro-batch).
EXCLUDE_LITERALS: Final = 256
_TO_THE_END: Final = 2**31 - 1  # substring's length that reaches the value's end (Spark's own default)


def _spark_type(annotation: Any) -> tuple[T.DataType, bool]:
    """Map a model field's annotation to a Spark type; return it and whether it is nullable."""
    nullable = False
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _spark_type(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            msg = f"cannot map union {annotation!r} to a Spark type"
            raise TypeError(msg)
        return _spark_type(args[0])[0], True
    if origin is dict:
        key, val = typing.get_args(annotation)
        return T.MapType(_spark_type(key)[0], _spark_type(val)[0], valueContainsNull=False), nullable
    simple: dict[Any, T.DataType] = {
        str: T.StringType(),
        int: T.IntegerType(),
        float: T.DoubleType(),
        bool: T.BooleanType(),
        datetime: T.TimestampType(),
    }
    if annotation in simple:
        return simple[annotation], nullable
    msg = f"cannot map {annotation!r} to a Spark type"
    raise TypeError(msg)


def spark_schema() -> T.StructType:
    """Return the Spark schema of the normalized event JSON, derived field by field from :class:`Event`.

    Parse with ``from_json(col("value").cast("string"), spark_schema(), SPARK_JSON_OPTIONS)``; ``ts`` comes out
    as a ``TimestampType`` (Spark's default JSON timestamp pattern reads our ``…T…[.SSS]Z`` text).
    """
    fields = []
    for name, info in Event.model_fields.items():
        spark_type, nullable = _spark_type(info.annotation)
        # "dims" defaults to {} in Python but is left out of the JSON when empty, so Spark sees null.
        fields.append(T.StructField(name, spark_type, nullable or not info.is_required()))
    return T.StructType(fields)


SPARK_JSON_OPTIONS: Final = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss[.SSS]XXX", "mode": "PERMISSIVE"}


def _wire_schema() -> T.StructType:
    """Return the event schema with ``ts`` read as text.

    Casting the ISO-8601 text afterwards uses Spark's hand-written timestamp parser, which is much faster than
    from_json's pattern-based one (figures in docs/benchmarks.md); it accepts our ``…Z`` times.
    """
    fields = spark_schema().fields
    return T.StructType([T.StructField(f.name, T.StringType(), True) if f.name == "ts" else f for f in fields])


def parse_events(
    records: DataFrame, keep: tuple[str, ...] = ("partition", "offset"), avro: Mapping[int, str] | None = None
) -> DataFrame:
    """Turn Kafka rows (``value`` and the ``keep`` columns) into events plus a ``parsed_ok`` flag.

    :arg avro: writer schemas by id (:func:`views.event_avro.writer_schemas`): framed Avro records are decoded
        too. None or empty: JSON only, a framed record is unparseable.
    :returns: columns :data:`EVENT_COLUMNS` + ``parsed_ok`` + ``keep``.
    """
    if avro:
        return _parse_mixed(records, keep, avro)
    parsed = F.from_json(F.col("value").cast("string"), _wire_schema())
    # The optimizer substitutes a projection's expressions into the filters above it, and each copy is evaluated
    # again: every filter on an event field (parsed_ok, the batch interval) parsed each record once more
    # (SPARK-47672; five parses a record, docs/benchmarks.md). It moves no filter below a non-deterministic
    # expression, so the parse is guarded by a condition that is always true but not deterministic to Spark
    # (partition ids are >= 0). The explode(array(...)) used before stopped it too, but a Generate runs outside
    # the generated code and copies every row: the guard costs ~15 % less CPU per record (docs/benchmarks.md).
    decoded = records.select(F.when(F.spark_partition_id() >= 0, parsed).alias("e"), *keep)
    # try_cast: a text that is not a time makes the record unparseable (ANSI cast would fail the whole query)
    ts = F.col("e.ts").try_cast("timestamp")
    ok = F.col("e").isNotNull() & F.col("e.id").isNotNull() & ts.isNotNull() & F.col("e.item").isNotNull()
    return decoded.select(
        *(ts.alias(n) if n == "ts" else F.col(f"e.{n}").alias(n) for n in EVENT_COLUMNS),
        F.coalesce(ok, F.lit(False)).alias("parsed_ok"),
        *keep,
    )


def _avro_struct(avro: Mapping[int, str]) -> Column:
    """Return a framed Avro record decoded with the writer schema its id names, in the current contract's shape.

    ``avro`` is not empty. One ``from_avro`` per known id, chosen by the frame's 5 bytes (only the chosen branch
    runs); each reads with its writer schema and resolves into :func:`views.event_avro.reader_schema_text`
    (``avroSchema``), so every branch has one type. An unknown id gives a null record; bytes that do not decode
    give a record of nulls (PERMISSIVE): neither has an id, so neither parses.
    """
    from pyspark.sql.avro.functions import from_avro  # noqa: PLC0415 - spark-avro, on the jars only for Avro

    frame = F.substring(F.col("value"), 1, HEADER_BYTES)
    payload = F.substring(F.col("value"), HEADER_BYTES + 1, _TO_THE_END)
    options = {"mode": "PERMISSIVE", "avroSchema": reader_schema_text()}
    branches = [
        (frame == F.lit(bytearray(header(schema_id))), from_avro(payload, writer, options))
        for schema_id, writer in sorted(avro.items())
    ]
    decoded = F.when(*branches[0])
    for is_id, branch in branches[1:]:
        decoded = decoded.when(is_id, branch)
    return decoded


def _parse_mixed(records: DataFrame, keep: tuple[str, ...], avro: Mapping[int, str]) -> DataFrame:
    """Parse a topic of JSON and framed Avro records alike (first byte 0: Avro): :func:`parse_events`' columns.

    Each record runs one decode: ``from_json`` (``e``) or ``from_avro`` (``a``), the other null, both under the
    same non-deterministic guard as the JSON path. The columns take whichever is set; Avro's ``ts`` is a timestamp
    already, and its empty ``dims`` map is null, as JSON's absent ``dims`` is.
    """
    framed = F.substring(F.col("value"), 1, 1) == F.lit(bytearray([MAGIC]))
    guard = F.spark_partition_id() >= 0
    parsed = F.from_json(F.col("value").cast("string"), _wire_schema())
    decoded = records.select(
        F.when(guard & ~framed, parsed).alias("e"), F.when(guard & framed, _avro_struct(avro)).alias("a"), *keep
    )
    json_ts = F.col("e.ts").try_cast("timestamp")
    json_ok = F.col("e").isNotNull() & F.col("e.id").isNotNull() & json_ts.isNotNull() & F.col("e.item").isNotNull()
    avro_ok = F.col("a").isNotNull() & F.col("a.id").isNotNull() & F.col("a.ts").isNotNull()
    avro_ok = avro_ok & F.col("a.item").isNotNull()
    avro_columns = {n: F.col(f"a.{n}") for n in EVENT_COLUMNS}
    json_columns = {n: F.col(f"e.{n}") for n in EVENT_COLUMNS}
    avro_columns["dims"] = F.when(F.size(avro_columns["dims"]) > 0, avro_columns["dims"])
    json_columns["ts"] = json_ts
    return decoded.select(
        *(F.coalesce(avro_columns[n], json_columns[n]).alias(n) for n in EVENT_COLUMNS),
        (F.coalesce(avro_ok, F.lit(False)) | F.coalesce(json_ok, F.lit(False))).alias("parsed_ok"),
        *keep,
    )


def valid_events(parsed: DataFrame) -> DataFrame:
    """Keep the events that parsed, with only the event columns."""
    return parsed.where(F.col("parsed_ok")).select(*EVENT_COLUMNS)


def without_users(events: DataFrame, users: Collection[str]) -> DataFrame:
    """Leave out the events of the given users (erased subjects' pseudonyms) before anything counts them.

    Both layers call it on their event frame, streaming or batch, so an erased subject is left out of every view
    the same way. Events without a user are kept.
    """
    if not users:
        return events
    wanted = sorted(users)
    if len(wanted) <= EXCLUDE_LITERALS:
        return events.where(F.col("user").isNull() | ~F.col("user").isin(wanted))
    erased = events.sparkSession.createDataFrame([(u,) for u in wanted], "user string")
    return events.join(F.broadcast(erased), "user", "left_anti").select(*events.columns)
