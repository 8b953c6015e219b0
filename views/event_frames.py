"""Parse Kafka records of the events topic into the event frame both layers aggregate.

The schema is the one derived from :class:`views.event.Event` (never a second copy). A record that does not
parse — or lacks an id, time or item — is kept and flagged rather than dropped, so each layer can count it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from views.event import spark_schema

EVENT_COLUMNS = ("id", "ts", "item", "user", "value", "dims")
# Up to this many excluded users are a literal set in the plan; more are a broadcast anti-join (a plan holding
# thousands of literals is slow to build and to compile on every micro-batch).
EXCLUDE_LITERALS: Final = 256


def _wire_schema() -> StructType:
    """Return the event schema with ``ts`` read as text.

    Casting the ISO-8601 text afterwards uses Spark's hand-written timestamp parser, which is much faster than
    from_json's pattern-based one (figures in docs/benchmarks.md); it accepts our ``…Z`` times.
    """
    return StructType([StructField(f.name, StringType(), True) if f.name == "ts" else f for f in spark_schema().fields])


def parse_events(records: DataFrame, keep: tuple[str, ...] = ("partition", "offset")) -> DataFrame:
    """Turn Kafka rows (``value`` and the ``keep`` columns) into events plus a ``parsed_ok`` flag.

    :returns: columns :data:`EVENT_COLUMNS` + ``parsed_ok`` + ``keep``.
    """
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
