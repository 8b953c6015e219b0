"""Views: the one definition both layers import — the event, time buckets, slices, the sketch aggregation, storage.

``event`` (the event contract: model, limits, wire JSON, Spark schema), ``event_frames`` (Kafka records of the events
topic parsed into the event frame, and the frame's filters), ``buckets`` (time units, flooring, when an hour closes),
``definition`` (the view definition as a version, and its fingerprint), ``aggregation`` (the sketch aggregation: pure
Spark, run by both layers), ``sketches`` (reading and merging the sketches in Python, with their error bounds).
``store`` holds the views' tables and rows, ``indexing`` the event-time index of the log.
"""
