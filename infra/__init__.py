"""What every deployment role imports, and nothing above it: settings, clients, topics, migrations, jars, errors.

Also ``trends admin`` (:mod:`infra.admin_cli`), which sets up real clusters — topics and schema, Spark's connector
jars, the DAG folder of the installed package — and ``trends config``. The local stack (``stack/``) builds on
these; nothing here imports it.
"""
