"""The local single-machine stack: servers from jars, the supervisor, the local Airflow, Go tools, certificates.

Nothing a deployment runs imports this package (an import-linter contract): deployments point the same settings at
their own Kafka, Cassandra and Airflow.
"""
