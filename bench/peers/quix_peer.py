"""The speed layer's work in quixstreams, one process of a consumer group (run in .venv-peers by peers_bench).

Per 1-minute event-time bucket and slice (global, origin): exact count, HLL users (lg_k 12), KLL values (k 200),
frequent items (the speed layer's size), after an exact dedupe by event id, exactly once (Kafka transactions).

How, and why so: the topic is not keyed, so a duplicate may sit in another partition than its original. The
events are re-keyed by their minute (``group_by``, one repartition topic), which puts every copy of an id in one
window of one partition; a tumbling window of one minute collects the minute's events (``collect()``) and closes
by partition time, after a grace the bench sets to the topic's event-time span: the processes write the
repartition topic each at its own pace, and a record later than the grace is lost (:func:`count_lost_records`).
At close, duplicates are dropped by id and the sketches are built with the Python ``datasketches`` package — the
same binaries as Spark's. quixstreams has no end of input: once the source is
committed, the bench appends closing records (ids ``flush-*``, past the grace) to every partition of the
repartition topic, which close the last windows and count nowhere.

Sinks: ``cassandra`` upserts each row (blobs) with the DataStax driver at checkpoint commit; ``null`` appends
each row's summary (no blobs) to a file, so the output can still be checked.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import summary
from quixstreams import Application
from quixstreams.dataframe.windows import time_based
from quixstreams.sinks.base import BatchingSink, SinkBatch

logger = logging.getLogger(__name__)

UPSERT = (
    "INSERT INTO {table} (system, slice, bucket_start, events, users_hll, values_kll, items_fi) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def count_lost_records(stats: Path) -> None:
    """Count the records quixstreams puts into windows it has already closed: they are lost without a warning.

    Closing by partition, quixstreams 3.28.1 stores the end of the last window it closed (E, at most partition time
    minus the grace) and treats a record as late only when its window ended a grace before E
    (``FixedTimeWindow.process_window`` subtracts the grace from ``max(timestamp, E)``, from E a second time). A
    record whose window ended in (E - grace, E] re-creates that window, which is never closed again: its values are
    neither emitted nor logged. With two processes writing one repartition topic this happens whenever one runs more
    than a grace of event time ahead of the other. Counted per minute and written to ``stats`` at exit.
    """
    lost: Counter[int] = Counter()
    original = time_based.FixedTimeWindow.process_window

    def process_window(self: Any, value: Any, key: Any, timestamp_ms: int, headers: Any, transaction: Any) -> Any:
        closed_until = transaction.get_latest_expired(prefix=b"")
        end = timestamp_ms - timestamp_ms % self._duration_ms + self._duration_ms
        into_closed = closed_until and closed_until - self._grace_ms < end <= closed_until
        if into_closed and not str(value[1]).startswith("flush-"):
            lost[end - self._duration_ms] += 1
        return original(self, value, key, timestamp_ms, headers, transaction)

    time_based.FixedTimeWindow.process_window = process_window  # type: ignore[method-assign]
    atexit.register(lambda: stats.write_text(json.dumps({"into_closed": {str(k): v for k, v in lost.items()}})))


def compact(event: dict[str, Any]) -> list[Any]:
    """Keep what the view needs of an event, the event time (text, for the minute key) first."""
    return [
        event["ts"],
        event["id"],
        event["user"],
        event.get("value"),
        event["item"],
        (event.get("dims") or {}).get("origin"),
    ]


def minute_rows(window: dict[str, Any]) -> list[dict[str, Any]]:
    """Turn one closed minute (its collected events) into a row per slice, duplicates dropped by id."""
    seen: dict[str, tuple[str, float | None, str, str | None]] = {}
    for _ts, event_id, user, value, item, origin in window["value"]:
        if not event_id.startswith("flush-"):
            seen.setdefault(event_id, (user, value, item, origin))
    per_slice: dict[str, tuple[list[int], Any, Any, Any]] = {}
    for user, value, item, origin in seen.values():
        for name in summary.slices(origin):
            entry = per_slice.get(name)
            if entry is None:
                entry = per_slice[name] = ([0], *summary.new_sketches())
            entry[0][0] += 1
            entry[1].update(user)
            if value is not None:
                entry[2].update(value)
            entry[3].update(item)
    bucket = window["start"] // 1000
    return [
        {"bucket": bucket, "slice": name, "events": count[0], "hll": hll, "kll": kll, "fi": fi}
        for name, (count, hll, kll, fi) in per_slice.items()
    ]


class NullSink(BatchingSink):
    """Append each row's summary to a file at checkpoint commit: no database, but checkable output."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._path = path

    def write(self, batch: SinkBatch) -> None:
        """Write the batch's summaries (one JSON line each)."""
        with self._path.open("a") as out:
            for item in batch:
                row = item.value
                out.write(
                    json.dumps(
                        summary.of_sketches(
                            row["bucket"], row["slice"], row["events"], row["hll"], row["kll"], row["fi"]
                        )
                    )
                    + "\n"
                )


class CassandraSink(BatchingSink):
    """Upsert each row (the view's blobs) with the DataStax driver; an overwrite, so a replayed batch is harmless."""

    def __init__(self, hosts: list[str], port: int, keyspace: str, system: str) -> None:
        super().__init__()
        self._hosts, self._port, self._keyspace, self._system = hosts, port, keyspace, system
        self._session: Any = None
        self._insert: Any = None

    def setup(self) -> None:
        """Connect and prepare the upsert once."""
        from cassandra.cluster import Cluster

        self._session = Cluster(self._hosts, port=self._port).connect()
        self._insert = self._session.prepare(UPSERT.format(table=f"{self._keyspace}.peer_view"))
        self._insert.is_idempotent = True

    def write(self, batch: SinkBatch) -> None:
        """Write the batch's rows, raising on the first failure (the checkpoint is then not committed)."""
        from cassandra.concurrent import execute_concurrent_with_args

        args = [
            (
                self._system,
                r["slice"],
                r["bucket"] * 1000,
                r["events"],
                r["hll"].serialize_compact(),
                r["kll"].serialize(),
                r["fi"].serialize(),
            )
            for r in (item.value for item in batch)
        ]
        execute_concurrent_with_args(self._session, self._insert, args, concurrency=32, raise_on_first_error=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--sink", choices=["null", "cassandra"], required=True)
    parser.add_argument("--out", help="the null sink's file")
    parser.add_argument("--cassandra", default="127.0.0.1:9042")
    parser.add_argument("--keyspace")
    parser.add_argument("--system", default="quixstreams")
    parser.add_argument("--commit-interval", type=float, default=5.0)
    parser.add_argument("--grace-minutes", type=float, default=10.0)
    parser.add_argument("--max-partition-fetch-bytes", type=int, default=0, help="0: librdkafka's default")
    parser.add_argument("--loglevel", default="WARNING", help="quixstreams' (DEBUG logs its rebalances)")
    parser.add_argument("--stats", help="a file for the records put into closed windows, per minute (at exit)")
    args = parser.parse_args()
    if args.stats:
        count_lost_records(Path(args.stats))

    # How much of one partition a fetch takes decides how far partition time runs ahead of the other partitions.
    fetch = {"max.partition.fetch.bytes": args.max_partition_fetch_bytes} if args.max_partition_fetch_bytes else {}
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        commit_interval=args.commit_interval,
        state_dir=args.state_dir,
        loglevel=args.loglevel,
        consumer_extra_config=fetch,
    )
    sdf = app.dataframe(app.topic(args.topic, value_deserializer="json"))
    sdf = sdf.apply(compact)
    # Re-keyed by minute: every copy of an id lands in one window of one partition, so the dedupe is exact.
    sdf = sdf.group_by(key=lambda row: row[0][:16], name="minute")
    window = sdf.tumbling_window(timedelta(minutes=1), grace_ms=timedelta(minutes=args.grace_minutes)).collect()
    sdf = window.final(closing_strategy="partition")
    sdf = sdf.apply(minute_rows, expand=True)
    if args.sink == "null":
        sdf.sink(NullSink(Path(args.out)))
    else:
        host, port = args.cassandra.rsplit(":", 1)
        sdf.sink(CassandraSink([host], int(port), args.keyspace, args.system))
    print("ready", flush=True)
    app.run()


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    main()
