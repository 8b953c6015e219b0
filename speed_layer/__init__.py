"""Speed layer: the Spark Structured Streaming job that keeps per-minute sketches in the Cassandra speed view.

``job`` (Kafka -> parse -> watermark and dedupe -> the shared aggregation -> the sink), ``sink`` (``foreachBatch``
upserts of every changed bucket's full state), ``start`` (where a new checkpoint starts: the batch watermark),
``checkpoint_definition`` (the view definition and dedupe a checkpoint was started with), ``guard`` (a checkpoint lost
under the running query), ``exclusions`` (erased subjects left out: a new one restarts the query), ``promote``
(blue/green view definitions), ``metrics`` (per-micro-batch health), ``cli`` (``trends speed``).
"""
