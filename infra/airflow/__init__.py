"""The local Airflow: its configuration (``config``), its processes as a server of the stack (``service``), a client."""
