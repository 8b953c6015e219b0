"""The local single-machine stack: servers from jars, the supervisor, the local Airflow, Go tools, certificates.

``control`` (which servers there are; up, down, status, reset), ``services`` (one module per server), ``airflow``
(the local Airflow), ``supervisor`` (restart a long-running command with back-off), ``process`` (pid files, signals,
ports, log tails), ``certificates`` (the stack's TLS), ``gotools`` (promtool, Prometheus and Toxiproxy built from Go
modules), ``toxiproxy`` (a client of Toxiproxy's API), ``cli`` (``trends stack``).

Nothing a deployment runs imports this package (an import-linter contract): deployments point the same settings at
their own Kafka, Cassandra and Airflow, and set them up with ``trends admin``.
"""
