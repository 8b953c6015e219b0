"""The local Airflow: its configuration and its processes."""
