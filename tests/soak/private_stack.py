"""The settings of a soak's private stack: a data dir of its own and free ports, so faults never touch the shared one.

The soak (``conftest.py``), the outage test and ``python -m tests.soak.outage`` each add their own sections.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infra.settings import Settings
from tests.helpers import free_port


def private_settings(root: Path, **sections: dict[str, Any]) -> Settings:
    """Return settings for a stack under ``root`` on free ports; ``sections`` are merged into the defaults below."""
    base: dict[str, dict[str, Any]] = {
        "kafka": {"bootstrap_servers": f"127.0.0.1:{free_port()}"},
        "cassandra": {"port": free_port(), "keyspace": "trends"},
        "stack": {
            "kafka_controller_port": free_port(),
            "cassandra_storage_port": free_port(),
            "cassandra_jmx_port": free_port(),
        },
        "views": {"slice_dims": ["origin"]},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return Settings(data_dir=root / "data", **base)
