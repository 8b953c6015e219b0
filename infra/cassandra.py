"""Cassandra connections: one place that turns settings into a driver ``Cluster`` and ``Session``.

Consistency levels come from settings through execution profiles (reads and writes separately), so nothing else
names a level; the load-balancing policy prefers the configured local datacenter, which is what a multi-DC
deployment needs and is harmless on one node.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from infra.settings import Settings

if TYPE_CHECKING:
    from cassandra.cluster import Cluster, Session

logger = logging.getLogger(__name__)

READ_PROFILE = "read"
WRITE_PROFILE = "write"


def make_cluster(settings: Settings, *, connect_timeout: float | None = None) -> Cluster:
    """Build a driver ``Cluster`` for the configured contact points, credentials and consistency levels."""
    from cassandra import ConsistencyLevel  # noqa: PLC0415
    from cassandra.auth import PlainTextAuthProvider  # noqa: PLC0415
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile  # noqa: PLC0415
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy  # noqa: PLC0415

    cfg = settings.cassandra

    def profile(level: str) -> ExecutionProfile:
        return ExecutionProfile(
            load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=cfg.local_datacenter)),
            consistency_level=getattr(ConsistencyLevel, level),
            request_timeout=cfg.request_timeout_s,
        )

    auth = None
    if cfg.username:
        password = cfg.password.get_secret_value() if cfg.password else ""
        auth = PlainTextAuthProvider(username=cfg.username, password=password)
    kwargs: dict[str, Any] = {
        "contact_points": cfg.contact_points,
        "port": cfg.port,
        "auth_provider": auth,
        "connect_timeout": connect_timeout or cfg.connect_timeout_s,
        "protocol_version": cfg.protocol_version,
        "execution_profiles": {
            EXEC_PROFILE_DEFAULT: profile(cfg.write_consistency),
            READ_PROFILE: profile(cfg.read_consistency),
            WRITE_PROFILE: profile(cfg.write_consistency),
        },
    }
    return Cluster(**kwargs)


@contextmanager
def session(settings: Settings) -> Iterator[Session]:
    """Open a session and close the cluster afterwards.

    The session is not bound to a keyspace: statements name ``keyspace.table`` (see :func:`table`), which is
    what Cassandra 5 asks of prepared statements.
    """
    cluster = make_cluster(settings)
    try:
        yield cluster.connect()
    finally:
        cluster.shutdown()


def table(settings: Settings, name: str) -> str:
    """Return the keyspace-qualified name of a table."""
    return f"{settings.cassandra.keyspace}.{name}"


def ping(settings: Settings, timeout: float = 3.0) -> bool:
    """Tell whether a CQL query succeeds against the configured cluster right now."""
    try:
        cluster = make_cluster(settings, connect_timeout=timeout)
    except Exception:  # noqa: BLE001
        return False
    try:
        sess = cluster.connect()
        sess.execute("SELECT release_version FROM system.local", timeout=timeout)
    except Exception:
        logger.debug("cassandra not ready", exc_info=True)
        return False
    finally:
        cluster.shutdown()
    return True
