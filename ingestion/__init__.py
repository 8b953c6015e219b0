"""Ingestion: the event model, validation, the Kafka producer, generators, file replay and the dead-letter topic."""
