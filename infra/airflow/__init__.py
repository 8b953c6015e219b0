"""Airflow as the pipeline reaches it: ``client``, a client of its REST API (log in, trigger, follow runs)."""
