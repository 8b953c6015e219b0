"""The batch layer's recompute: closed hours from exactly the Kafka offsets that hold them, many hours per Spark pass.

Orchestration only; each step is a module it calls down into, and data flows one way:
index (:mod:`views.indexing.indexer`: bring the event-time index up to date; :mod:`batch_layer.horizon`: is the range
closed) -> plan (:mod:`batch_layer.offsets`: refuse incomplete hours, the hours' indexed spans as offset ranges;
:mod:`batch_layer.hours`: passes bounded by events and hours) -> per pass: compute (:mod:`batch_layer.compute`:
the Kafka batch source over the ranges with ``failOnDataLoss``, :mod:`batch_layer.transform`, the hourly and daily
rollups) -> load (:mod:`batch_layer.load`: a new version per hour, pointer swaps, daily rollups, lineage) -> report
(:mod:`batch_layer.report`). An hour with no records completes with an empty version. The same code serves
``trends batch run``, the hourly DAG and the backfill DAG; running it again for an hour replaces the hour's version
and gives the same numbers, whatever the chunking.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from typing import TYPE_CHECKING

from batch_layer import compute, horizon, load, offsets
from batch_layer.code_version import code_version
from batch_layer.compute import Computed
from batch_layer.hours import chunks, hours_of, taper
from batch_layer.publish import BatchStore
from batch_layer.report import RunProgress, RunResult
from infra.cassandra import session
from infra.privacy.exclusions import excluded_users
from infra.settings import Settings
from views.buckets import HOUR
from views.definition import with_definition
from views.indexing.indexer import run_index
from views.store.definitions import DefinitionStore
from views.store.index import IndexStore
from views.store.losses import Loss

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)


def run(
    settings: Settings,
    start: datetime | None = None,
    end: datetime | None = None,
    *,
    hours: Sequence[datetime] | None = None,
    force: bool = False,
    spark: SparkSession | None = None,
    progress: Callable[[RunProgress], None] | None = None,
    index_first: bool = True,
    accept_loss: bool = False,
) -> list[RunResult]:
    """Recompute hours (``[start, end)`` or the given ones) in chunked Spark passes, then advance the watermark.

    :arg accept_loss: compute hours that records lost before indexing may belong to, recording the accepted loss
        in their lineage (which makes them whole again).
    :raises offsets.IntervalNotClosedError: when the last hour may still receive events (unless ``force``).
    :raises offsets.LossNotAcceptedError: when some hour is incomplete (unless ``accept_loss``); nothing is run.
    :raises offsets.DataLossError: when Kafka no longer holds a chunk's offsets (earlier chunks stay done).
    """
    hours = hours_of(start, end, hours)
    if not hours:
        return []
    topic = settings.kafka.events_topic
    t0 = time.monotonic()
    results: list[RunResult] = []
    with session(settings) as sess:  # one session for indexing, planning and loading
        # New runs compute with the serving view definition (read now, not at import: a promote may have changed
        # it), the settings' one when none is recorded; each run records it on its lineage and pointer.
        definitions = DefinitionStore(settings, sess)
        definition = definitions.serving_definition()
        settings = with_definition(settings, definition)
        definition_fp = definitions.register(definition, "batch")
        idx, store = IndexStore(settings, sess), BatchStore(settings, sess)
        # Erased subjects (exclusion mode) are read at every run, so no recompute, backfill or reprocess counts them.
        excluded = excluded_users(settings, sess)
        if index_first:
            run_index(settings, store=idx)
        if not force:
            offsets.check_closed(horizon.horizon(settings, store=idx), hours[-1] + HOUR, settings)
        incomplete = offsets.accepted_or_refused(store.losses, topic, hours, accept_loss)
        totals = idx.hour_totals(topic, {h.date() for h in hours})
        records = {h: totals.get(h, (0, 0))[0] for h in hours}
        passes = taper(chunks(hours, records, settings.batch.chunk_events, settings.batch.chunk_hours))
        runner = _Passes(
            settings, idx, store, force=force, spark=spark, accepted=incomplete, definition=definition_fp,
            excluded=excluded,
        )  # fmt: skip
        # Pass i's Cassandra writes run while Spark computes pass i + 1 (the driver and the JVM take turns).
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-load") as loader:
            pending: Future[list[RunResult]] | None = None
            try:
                for i, chunk in enumerate(passes, 1):
                    plan, done = runner.compute(chunk)
                    if pending is not None:
                        results += pending.result()
                    pending = loader.submit(runner.load, plan, done)
                    if progress is not None and results:
                        progress(
                            RunProgress(
                                i - 1, len(passes), len(results), len(hours), runner.events, time.monotonic() - t0
                            )
                        )
                if pending is not None:
                    results += pending.result()
                    pending = None
                if progress is not None:
                    progress(
                        RunProgress(
                            len(passes), len(passes), len(results), len(hours), runner.events, time.monotonic() - t0
                        )
                    )
            finally:
                if pending is not None:
                    pending.cancel()
                    with contextlib.suppress(BaseException):
                        pending.result()
                runner.close()
        _low, mark = store.pointers.advance(hours[0])
    for r in results:
        r.watermark = mark
    return results


class _Passes:
    """The passes of one :func:`run`: Spark's side (in the caller's thread) and Cassandra's (in the loader's)."""

    def __init__(
        self,
        settings: Settings,
        idx: IndexStore,
        store: BatchStore,
        *,
        force: bool,
        spark: SparkSession | None,
        accepted: dict[datetime, list[Loss]] | None = None,
        definition: str | None = None,
        excluded: frozenset[str] = frozenset(),
    ) -> None:
        self.definition = definition
        self.excluded = excluded
        self.accepted = accepted or {}
        self.settings = settings
        self.idx = idx
        self.store = store
        self.force = force
        self.spark = spark
        self.own = False
        self.code = code_version(settings)
        self.events = 0

    def compute(self, chunk: list[datetime]) -> tuple[offsets.Plan, Computed | None]:
        """Plan a pass from the index and run its Spark side (nothing to run for hours without records)."""
        c0 = time.monotonic()
        plan = offsets.plan(self.settings, self.idx, chunk)
        done = None
        if plan.records:
            if self.spark is None:
                from infra.spark import get_spark  # noqa: PLC0415

                self.spark, self.own = get_spark(self.settings, "batch"), True
            done = compute.compute(self.spark, self.settings, plan, self.excluded)
        logger.info(
            "pass of %s hours from %s: %s records in %s ranges, Spark %.1f s",
            len(chunk), chunk[0].isoformat(), plan.records, len(plan.ranges), time.monotonic() - c0,
        )  # fmt: skip
        return plan, done

    def load(self, plan: offsets.Plan, done: Computed | None) -> list[RunResult]:
        """Write a pass (versions, swaps, rollups, lineage) and notice hours that grew meanwhile."""
        c0 = time.monotonic()
        out = load.load(
            self.store, plan, done, force=self.force, code=self.code, accepted=self.accepted, definition=self.definition
        )
        load.recheck_stale(self.idx, plan)
        seconds = time.monotonic() - c0
        for r in out:
            r.seconds = seconds / len(out)
            logger.debug("%s", r.line())
        self.events += plan.records
        logger.info("pass of %s hours from %s written in %.1f s", len(out), plan.hours[0].hour.isoformat(), seconds)
        return out

    def close(self) -> None:
        """Stop the Spark session if this run started it."""
        if self.own and self.spark is not None:
            self.spark.stop()
