"""Batch layer: recompute closed hours from exactly the Kafka offsets that hold them, with lineage and the watermark.

The recompute, one module per step: ``job`` (the run: closed hours, many per Spark pass), ``hours`` (which hours,
split into passes), ``offsets`` (the offsets that hold them, from the event-time index, and whether they may be
computed), ``horizon`` (whether an interval is closed yet), ``compute`` (the Spark side of a pass), ``transform``
(Kafka records in, the minute view out: pure Spark), ``load`` (new versions, pointer swaps, rollups, lineage, into
Cassandra), ``publish`` (a run's sequence over the views' storage: versioned writes, the
pointer swap, re-merge, pruning), ``report`` (each hour's counts and a run's
progress), ``code_version`` (the code a run records).

Around it: ``submit`` (the ``spark-submit`` entry point of the DAGs' recompute), ``tasks`` (what the DAGs' other
tasks call), ``erasure`` (the ``trends_erasure`` DAG's recompute and purge of an erased subject's hours),
``reconcile`` (an hour of the batch view against the speed view), ``backfill`` (``trends batch backfill`` through
Airflow's REST API), ``exporter`` (the batch layer's state as Prometheus metrics), ``cli`` (``trends batch``).
"""
