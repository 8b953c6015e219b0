"""Infrastructure: settings, the local Kafka/Cassandra stack, CQL migrations, topics and the Spark session factory."""
