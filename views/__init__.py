"""Views: the one definition both layers import — the event, time buckets, slices, the sketch aggregation, storage.

``event`` (the event contract: model, limits, wire JSON, Avro schema; no Spark), ``event_avro`` (the events topic in
Avro: the wire JSON framed and registered, and read back by id), ``event_frames`` (the Spark schema, Kafka records of
the events topic, JSON or Avro, parsed into the event frame, and the frame's filters), ``buckets`` (time units,
flooring, when an hour closes), ``definition`` (the view definition as a version, and its fingerprint), ``aggregation``
(the sketch aggregation: pure Spark, run by both layers), ``sketches`` (reading and merging the sketches in Python, with
their error bounds).
``store`` holds the views' tables and rows, ``indexing`` the event-time index of the log.
"""
