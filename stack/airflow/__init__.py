"""The local Airflow.

``config`` (its components, paths, environment and config files), ``service`` (its processes: metadata DB, API
server, scheduler and DAG processor, from the venv).
"""
