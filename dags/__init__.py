"""The batch layer's DAG files, shipped in the package: point the scheduler's DAG folder here (``trends admin dags``).

``trends_batch`` holds the hourly recompute and the range backfill (their names and parameters are in
:mod:`infra.dag_contract`).
"""
