"""The speed layer's work in PyFlink 2.3 (Flink SQL), run in .venv-peers by peers_bench.

Per 1-minute event-time bucket and slice (global, origin), after an exact dedupe by event id, exactly once
(checkpoints; the results reach this client through Flink's collect sink, which hands out only checkpointed rows):

* ``--variant sketch``: the speed layer's sketches as Java UDFs on datasketches-java 6.2.0 (``bench/peers/udf``:
  HLL lg_k 12, KLL k 200, frequent strings of Spark's size), so the work equals the speed layer's.
* ``--variant sql``: Flink's built-ins as a user writes them first: ``COUNT(*)``, exact ``COUNT(DISTINCT user)``
  (Flink refuses ``APPROX_COUNT_DISTINCT`` in streaming mode), exact ``PERCENTILE(value, q)`` and a Top-N of the
  items by count. The dedupe is Flink's window deduplication (``ROW_NUMBER() OVER (PARTITION BY window, id)``):
  an id always carries the same event time here, so every copy falls in one window and the dedupe is exact.

The source is the bench topic read from the earliest to the latest offset at start (``scan.bounded.mode``), so the
job ends by itself and its time is clean; the watermark is each partition's event time less a minute. With
``--live`` (the freshness run) the job reads on, its watermark a couple of seconds behind.

The source runs one subtask per partition (``scan.parallelism``), the rest of the job at ``--parallelism``. With two
partitions in one source subtask the first run of the 1M topic lost 9,130 events of its first three minutes as late:
a source reader creates a partition's watermark output when that partition's first records arrive, so until then
the subtask's watermark follows the partition fetched first alone (one fetch spans more than the minute of delay),
and the other partition's first minutes come in behind it. One partition per subtask makes each watermark its own,
and the window operators take the minimum over all of them, as the speed layer's global watermark does.

Sinks: ``null`` keeps the rows in memory and writes their summaries to a file once the job is over (not timed);
``cassandra`` upserts each row with the DataStax driver as it arrives (Flink's Cassandra connector has no build for
Flink 2.x in the Maven repository reached here).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import summary

logger = logging.getLogger(__name__)

SOURCE = """
CREATE TABLE events (
  id STRING, ts STRING, item STRING, `user` STRING, `value` DOUBLE, dims MAP<STRING, STRING>,
  rt TIMESTAMP_LTZ(3) METADATA FROM 'timestamp' VIRTUAL,
  WATERMARK FOR rt AS rt - INTERVAL '{delay_s}' SECOND
) WITH (
  'connector' = 'kafka', 'topic' = '{topic}', 'properties.bootstrap.servers' = '{bootstrap}',
  'properties.group.id' = '{group}', 'scan.startup.mode' = 'earliest-offset', {bounded}
  'scan.parallelism' = '{source_parallelism}', 'format' = 'json', 'json.ignore-parse-errors' = 'true'
)"""
BOUNDED = "'scan.bounded.mode' = 'latest-offset',"

SLICED = """
CREATE VIEW sliced AS
WITH deduped AS (
  SELECT window_start, window_end, window_time, item, `user`, `value`, dims['origin'] AS origin FROM (
    SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end, id ORDER BY rt ASC) AS rn
    FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(rt), INTERVAL '1' MINUTE))
  ) WHERE rn = 1
)
SELECT window_start, window_end, '*' AS slice, item, `user`, `value` FROM deduped
UNION ALL
SELECT window_start, window_end, CONCAT('origin=', origin) AS slice, item, `user`, `value` FROM deduped
WHERE origin IS NOT NULL"""

STATS = """
SELECT 'stats' AS kind, window_start, slice, COUNT(*) AS events, COUNT(DISTINCT `user`) AS users,
  PERCENTILE(`value`, 0.5) AS p50, PERCENTILE(`value`, 0.99) AS p99, CAST(NULL AS STRING) AS item
FROM sliced GROUP BY window_start, window_end, slice"""

TOP = """
SELECT 'top' AS kind, window_start, slice, cnt AS events, CAST(NULL AS BIGINT) AS users,
  CAST(NULL AS DOUBLE) AS p50, CAST(NULL AS DOUBLE) AS p99, item
FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end, slice ORDER BY cnt DESC) AS rk FROM (
    SELECT window_start, window_end, slice, item, COUNT(*) AS cnt FROM sliced
    GROUP BY window_start, window_end, slice, item
  )
) WHERE rk <= {top}"""

SKETCH_FUNCTIONS = {
    "hll_sketch": "trends.bench.peers.HllSketchAgg",
    "kll_sketch": "trends.bench.peers.KllSketchAgg",
    "items_sketch": "trends.bench.peers.ItemsSketchAgg",
}

SKETCHES = """
SELECT window_start, slice, COUNT(*) AS events, hll_sketch(`user`) AS users_hll, kll_sketch(`value`) AS values_kll,
  items_sketch(item) AS items_fi
FROM sliced GROUP BY window_start, window_end, slice"""

UPSERT = "INSERT INTO {table} (system, slice, bucket_start, events, exact) VALUES (?, ?, ?, ?, ?)"
UPSERT_SKETCHES = (
    "INSERT INTO {table} (system, slice, bucket_start, events, users_hll, values_kll, items_fi) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def environment(jars: list[str], parallelism: int, checkpoint_s: float, checkpoint_dir: str) -> Any:
    """Return a streaming TableEnvironment with the Kafka connector, checkpoints and the bench's parallelism."""
    from pyflink.table import EnvironmentSettings, TableEnvironment

    t_env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = t_env.get_config()
    conf.set("pipeline.jars", ";".join(Path(j).resolve().as_uri() for j in jars))
    conf.set("parallelism.default", str(parallelism))
    conf.set("execution.checkpointing.interval", f"{int(checkpoint_s * 1000)} ms")
    conf.set("execution.checkpointing.mode", "EXACTLY_ONCE")
    # Checkpoints in the JobManager's memory are capped at 5 MB: a minute of exact distincts passes that and every
    # checkpoint fails, the job restarting forever. Files, as any deployment would have.
    conf.set("execution.checkpointing.storage", "filesystem")
    conf.set("execution.checkpointing.dir", Path(checkpoint_dir).resolve().as_uri())
    conf.set("table.exec.source.idle-timeout", "5 s")  # a partition without records holds no window back
    return t_env


class Rows:
    """The latest value of every (minute, slice): its stats and its top items, from a changelog."""

    def __init__(self) -> None:
        self.stats: dict[tuple[int, str], tuple[int, int, float, float]] = {}
        self.top: dict[tuple[int, str], dict[str, int]] = {}

    def apply(self, row: Any) -> tuple[int, str] | None:
        """Fold one changelog row in; return the key it changed (None for a retraction)."""
        from pyflink.common import RowKind

        kind = row.get_row_kind()
        key = (int(row[1].timestamp()) if hasattr(row[1], "timestamp") else int(row[1]) // 1000, row[2])
        if row[0] == "stats":
            if kind in (RowKind.INSERT, RowKind.UPDATE_AFTER):
                self.stats[key] = (row[3], row[4], row[5], row[6])
                return key
            return None
        items = self.top.setdefault(key, {})
        if kind in (RowKind.INSERT, RowKind.UPDATE_AFTER):
            items[row[7]] = row[3]
            return key
        items.pop(row[7], None)
        return key

    def summary(self, key: tuple[int, str]) -> dict[str, Any] | None:
        """Return the summary of one key, or None while its stats are not in."""
        stats = self.stats.get(key)
        if stats is None:
            return None
        events, users, p50, p99 = stats
        top = sorted(self.top.get(key, {}).items(), key=lambda kv: -kv[1])
        return summary.of_exact(key[0], key[1], events, users, {0.5: p50, 0.99: p99}, top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--jars", required=True, help="';'-separated jar files")
    parser.add_argument("--variant", choices=["sql", "sketch"], default="sql")
    parser.add_argument("--sink", choices=["null", "cassandra"], required=True)
    parser.add_argument("--out", required=True, help="the summaries, written after the job (both sinks)")
    parser.add_argument("--cassandra", default="127.0.0.1:9042")
    parser.add_argument("--keyspace")
    parser.add_argument("--system", default="flink-sql")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--partitions", type=int, required=True, help="the topic's partitions (source parallelism)")
    parser.add_argument("--checkpoint-s", type=float, default=5.0)
    parser.add_argument("--top", type=int, default=summary.TOP_LISTED)
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--live", action="store_true", help="read on past the end (the freshness run)")
    parser.add_argument("--watermark-delay-s", type=float, default=60.0)
    args = parser.parse_args()

    t_env = environment(args.jars.split(";"), args.parallelism, args.checkpoint_s, args.checkpoint_dir)
    source = SOURCE.format(
        topic=args.topic,
        bootstrap=args.bootstrap,
        group=args.group,
        delay_s=f"{args.watermark_delay_s:.3f}",
        bounded="" if args.live else BOUNDED,
        source_parallelism=args.partitions,
    )
    t_env.execute_sql(source)
    t_env.execute_sql(SLICED)
    if args.variant == "sketch":
        for name, cls in SKETCH_FUNCTIONS.items():
            t_env.execute_sql(f"CREATE TEMPORARY FUNCTION {name} AS '{cls}' LANGUAGE JAVA")
        table = t_env.sql_query(SKETCHES)
    else:
        table = t_env.sql_query(f"{STATS} UNION ALL {TOP.format(top=int(args.top))}")
    if args.explain:
        print(table.explain(), file=sys.stderr)
    if args.variant == "sketch":
        sketch_job(args, table)
        return
    write: Any = None
    if args.sink == "cassandra":
        from cassandra.cluster import Cluster

        host, port = args.cassandra.rsplit(":", 1)
        sess = Cluster([host], port=int(port)).connect()
        insert = sess.prepare(UPSERT.format(table=f"{args.keyspace}.peer_view"))
        insert.is_idempotent = True

        def write(row: dict[str, Any]) -> None:
            exact = json.dumps({k: row[k] for k in ("users", "quantiles", "top")})
            sess.execute(insert, (args.system, row["slice"], row["bucket"] * 1000, row["events"], exact))

    rows = Rows()
    print("ready", flush=True)
    t0 = time.monotonic()
    with table.execute().collect() as results:
        for row in results:
            key = rows.apply(row)
            if write is not None and key is not None and (done := rows.summary(key)) is not None:
                write(done)
    seconds = time.monotonic() - t0
    with Path(args.out).open("w") as out:
        for key in rows.stats:
            out.write(json.dumps(rows.summary(key)) + "\n")
    print(json.dumps({"seconds": seconds}), flush=True)


def sketch_job(args: argparse.Namespace, table: Any) -> None:
    """Run the sketch variant: rows are final per window (append-only), written as they come."""
    insert: Any = None
    if args.sink == "cassandra":
        from cassandra.cluster import Cluster

        host, port = args.cassandra.rsplit(":", 1)
        sess = Cluster([host], port=int(port)).connect()
        insert = sess.prepare(UPSERT_SKETCHES.format(table=f"{args.keyspace}.peer_view"))
        insert.is_idempotent = True
    kept: list[tuple[int, str, int, bytes, bytes, bytes]] = []
    print("ready", flush=True)
    t0 = time.monotonic()
    with table.execute().collect() as results:
        for row in results:
            bucket = int(row[0].timestamp()) if hasattr(row[0], "timestamp") else int(row[0]) // 1000
            values = (bucket, row[1], row[2], bytes(row[3]), bytes(row[4]), bytes(row[5]))
            if insert is not None:
                sess.execute(insert, (args.system, values[1], bucket * 1000, *values[2:]))
            kept.append(values)
    seconds = time.monotonic() - t0
    with Path(args.out).open("w") as out:
        for bucket, slice_name, events, hll, kll, fi in kept:
            out.write(json.dumps(summary.of_blobs(bucket, slice_name, events, hll, kll, fi)) + "\n")
    print(json.dumps({"seconds": seconds}), flush=True)


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    main()
