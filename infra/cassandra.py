"""Cassandra connections: one place that turns settings into a driver ``Cluster`` and ``Session``.

Consistency levels come from settings through execution profiles (reads and writes separately), so nothing else
names a level; the load-balancing policy prefers the configured local datacenter, which is what a multi-DC
deployment needs and is harmless on one node.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from ssl import Purpose, SSLContext, TLSVersion, create_default_context
from typing import TYPE_CHECKING, Any

from infra.service_settings import CassandraSettings
from infra.settings import Settings

if TYPE_CHECKING:
    from cassandra.cluster import Cluster, Session
    from cassandra.query import PreparedStatement

logger = logging.getLogger(__name__)

READ_PROFILE = "read"
WRITE_PROFILE = "write"


@functools.lru_cache(maxsize=512)
def _row_type(columns: tuple[str, ...]) -> Any:
    from cassandra.query import named_tuple_factory  # noqa: PLC0415

    return type(named_tuple_factory(list(columns), [(None,) * len(columns)])[0])


def named_rows(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[Any]:
    """Return rows as the driver's default factory does (named tuples), building the row type once per column list.

    The driver's own factory builds a new ``namedtuple`` class for every response, which costs more than decoding
    a small response: the subject store's thousands of lightweight transactions spent a quarter of the driver's
    I/O thread on it.
    """
    row = _row_type(tuple(columns))
    return [row(*values) for values in rows]


def make_cluster(settings: Settings, *, connect_timeout: float | None = None) -> Cluster:
    """Build a driver ``Cluster`` for the configured contact points, credentials, TLS and consistency levels.

    :raises OSError: when a configured certificate or key file cannot be read.
    """
    from cassandra import ConsistencyLevel  # noqa: PLC0415
    from cassandra.auth import PlainTextAuthProvider  # noqa: PLC0415
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile  # noqa: PLC0415
    from cassandra.policies import (  # noqa: PLC0415
        DCAwareRoundRobinPolicy,
        ExponentialReconnectionPolicy,
        TokenAwarePolicy,
    )

    cfg = settings.cassandra

    def profile(level: str) -> ExecutionProfile:
        return ExecutionProfile(
            load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=cfg.local_datacenter)),
            consistency_level=getattr(ConsistencyLevel, level),
            request_timeout=cfg.request_timeout_s,
            row_factory=named_rows,
        )

    auth = None
    if cfg.username:
        password = cfg.password.get_secret_value() if cfg.password else ""
        auth = PlainTextAuthProvider(username=cfg.username, password=password)
    kwargs: dict[str, Any] = {
        "contact_points": cfg.contact_points,
        "port": cfg.port,
        "auth_provider": auth,
        # TLS (client_encryption_options on the nodes): the CA, an optional client certificate, the hostname check;
        # with check_hostname the driver verifies each node's certificate against the address it connects to.
        "ssl_context": ssl_context(cfg),
        "connect_timeout": connect_timeout or cfg.connect_timeout_s,
        "protocol_version": cfg.protocol_version,
        "reconnection_policy": ExponentialReconnectionPolicy(1.0, cfg.reconnect_max_s),
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


BATCH_MAX_BYTES = 40_000  # under Cassandra's default batch_size_fail_threshold (50 KiB)
BATCH_MAX_ROWS = 100


def _size(params: Sequence[Any]) -> int:
    return sum(len(v) if isinstance(v, bytes | str) else 16 for v in params)


def write_many(
    settings: Settings,
    sess: Session,
    stmt: PreparedStatement,
    params: Sequence[Sequence[Any]],
    partition_key: Callable[[Sequence[Any]], Hashable] | None = None,
) -> None:
    """Write many rows concurrently; rows of one partition go together in unlogged batches when a key is given.

    A single-partition unlogged batch is one mutation on one replica set: with the group commitlog (an fsync
    before the acknowledgement) it costs about what one row costs, so a year of small hourly rows is written
    with tens of times fewer round trips. Batches stay under Cassandra's default size limits; larger rows go alone.
    Every statement is idempotent (upserts of full rows), so the driver may retry them.
    """
    from cassandra.concurrent import execute_concurrent  # noqa: PLC0415
    from cassandra.query import BatchStatement, BatchType  # noqa: PLC0415

    if not params:
        return
    statements: list[tuple[Any, Any]] = []
    if partition_key is None:
        statements = [(stmt, p) for p in params]
    else:
        groups: dict[Hashable, list[Sequence[Any]]] = {}
        for p in params:
            groups.setdefault(partition_key(p), []).append(p)
        for rows in groups.values():
            batch: Any = None
            used = 0
            for row in rows:
                size = _size(row)
                if batch is not None and (used + size > BATCH_MAX_BYTES or len(batch) >= BATCH_MAX_ROWS):
                    statements.append((batch, None))
                    batch = None
                if batch is None:
                    batch, used = BatchStatement(batch_type=BatchType.UNLOGGED), 0
                    batch.is_idempotent = True
                batch.add(stmt, row)
                used += size
            if batch is not None:
                statements.append((batch, None) if len(batch) > 1 else (stmt, rows[-1]))
    execute_concurrent(
        sess,
        statements,
        concurrency=settings.cassandra.write_concurrency,
        raise_on_first_error=True,
        execution_profile=WRITE_PROFILE,
    )


def ssl_context(cfg: CassandraSettings) -> SSLContext | None:
    """Return the driver's TLS context (CA, optional client certificate, hostname check), or None without TLS.

    :raises OSError: when a configured certificate or key file cannot be read.
    :raises ssl.SSLError: when a file is not a PEM certificate or key (or the key password is wrong).
    """
    if not cfg.ssl:
        return None
    ca = str(cfg.ssl_ca_file) if cfg.ssl_ca_file is not None else None
    ctx = create_default_context(Purpose.SERVER_AUTH, cafile=ca)
    ctx.minimum_version = TLSVersion.TLSv1_2
    ctx.check_hostname = cfg.ssl_check_hostname
    if cfg.ssl_certificate_file is not None and cfg.ssl_key_file is not None:
        password = cfg.ssl_key_password.get_secret_value() if cfg.ssl_key_password is not None else None
        ctx.load_cert_chain(str(cfg.ssl_certificate_file), str(cfg.ssl_key_file), password=password)
    return ctx
