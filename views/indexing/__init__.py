"""The event-time index of the events topic, built by one incremental pass over the log (shared by both layers).

The batch layer plans its recomputes from it; the speed layer starts a new checkpoint at the batch watermark from
it. ``spans`` is the pure span algorithm, ``indexer`` the pass (Kafka in, :mod:`views.store.index` out),
``kafka_topic`` what the pass and the planner ask Kafka of the topic.
"""
