"""The servers of the local stack, one module each: Kafka, Cassandra, the Spark cluster, the pipeline's commands."""
