"""Speed layer: the Spark Structured Streaming job that keeps per-bucket sketches in the Cassandra speed view."""
