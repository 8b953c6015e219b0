"""Ingestion: raw records in, valid events to the events topic and rejects with a reason to the dead-letter topic.

``validate`` (records to events or rejects, never an exception), ``mapping`` (other shapes' columns onto the event),
``pseudonyms`` (users replaced by their pseudonyms before anything is encoded), ``producer`` (the one idempotent Kafka
producer), ``generator`` (a seeded synthetic stream with planted bursts, and its ground truth), ``generator_config``
(what a stream is to be: its size, pace, bursts and clock), ``files`` (replay JSONL or CSV files), ``collector`` (the
HTTP collector of ``trends collect``, answering once Kafka acknowledged a batch; ``collector_body`` reads and splits a
request's body, ``collector_delivery`` produces its records on one thread and awaits their acks), ``bridge``
(``trends ingest kafka``: other topics into the events topic in Kafka transactions, exactly once), ``wire`` (the
Confluent wire format of Avro and Protobuf records, and the schema registry's client), ``dlq`` (the dead-letter record
format, read back), ``metrics`` (Prometheus metrics of a long-running ingest), ``progress`` (progress lines and a
graceful stop). The event model itself is the views' (:mod:`views.event`).

Commands: ``cli`` (``trends ingest``, the group) and a module per command: ``generate_cli``, ``file_cli``,
``bridge_cli`` (``trends ingest kafka``), ``collect_cli`` (``trends collect``) and ``dlq_cli``; ``cli_options`` (the
options they share).
"""
