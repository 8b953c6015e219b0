"""What every deployment role imports, and nothing above it; the local stack (``stack/``) builds on it.

Settings: ``settings`` (the one typed tree), ``service_settings`` (Kafka, Cassandra, Spark, Airflow),
``ingest_settings`` (ingestion, the collector, the bridge), ``pipeline_settings`` (the local stack, views, both layers,
serving, metrics, privacy), ``settings_env`` (the settings as ``TRENDS_*`` for a child process, and the variable of each
setting for messages), ``security`` (loopback, secrets, masking), ``errors`` (what the CLI turns into a message and an
exit status). Clients and resources: ``cassandra`` (driver sessions), ``spark`` (the one SparkSession factory),
``registry`` (the schema registry's client: register a subject's schema, list its versions, look an id up),
``topics`` (the Kafka topics), ``migrations`` (the CQL migrations of ``infra/cql``), ``jars`` (Maven fetches into the
jar cache), ``dlq_reasons`` (the dead-letter topic's headers and a count by reason), ``speed_checkpoint`` (where the
speed query's checkpoint lives, and its state seen without Spark), ``privacy`` (personal data's contracts: the subject
store of pseudonyms), ``dag_contract`` (the DAGs' ids, params and folder), ``user_time`` (the times a user types: the
one parser and the command line's type), ``dashboards`` (the Grafana dashboards of ``infra/grafana``, declared in code;
``dashboard_model`` renders them). Commands: ``admin_cli`` (``trends admin``: topics and schema, connector jars, DAG
folder on real clusters) and ``config_cli`` (``trends config``). ``airflow`` holds the REST API's client; ``privacy``
the subject store (pseudonyms), the erasure ledger and the erased subjects, contracts every layer may import.
"""
