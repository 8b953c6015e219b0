"""The Cassandra backend of the API: one session for the app's lifetime, connected lazily and retried with a pause.

While Cassandra is unreachable a request is refused with :class:`~serving.errors.CassandraUnavailableError` (a 503)
and a new connection is tried at most every ``serving.cassandra_retry_s``.
"""

import logging
import threading
import time
from typing import Any

from infra.cassandra import make_cluster
from infra.settings import Settings
from serving.errors import CassandraUnavailableError, driver_errors, reason
from serving.reader import ViewReader

logger = logging.getLogger(__name__)


class Backend:
    """One Cassandra session for the app, connected on first use and retried with a pause while it fails."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._cluster: Any = None
        self._reader: ViewReader | None = None
        self._next_attempt = 0.0
        self.last_error: str | None = None

    @property
    def current(self) -> ViewReader | None:
        """Return the process's reader (its caches) if connected, without connecting."""
        return self._reader

    def reader(self) -> ViewReader:
        """Return the process's reader (shared by every request: it holds no state of a request).

        :raises CassandraUnavailableError: Cassandra is unreachable or the views are not migrated.
        """
        reader = self._reader
        if reader is not None:
            return reader
        with self._lock:
            return self._reader or self._connect()

    def _connect(self) -> ViewReader:
        now = time.monotonic()
        if now < self._next_attempt:
            raise CassandraUnavailableError(self.last_error or "Cassandra is unreachable")
        cluster = make_cluster(self.settings, connect_timeout=min(5.0, self.settings.cassandra.connect_timeout_s))
        try:
            self._reader = ViewReader(self.settings, cluster.connect())
        except Exception as exc:
            cluster.shutdown()
            self._next_attempt = now + self.settings.serving.cassandra_retry_s
            self.last_error = f"Cassandra at {self._where()}: {reason(exc)}"
            logger.warning("cannot open the views: %s", self.last_error)
            raise CassandraUnavailableError(self.last_error) from exc
        self._cluster, self.last_error = cluster, None
        logger.info("serving the views of keyspace %s from %s", self.settings.cassandra.keyspace, self._where())
        return self._reader

    def ping(self) -> None:
        """Read one row of the watermark table (readiness).

        :raises CassandraUnavailableError: the read failed.
        """
        reader = self.reader()
        try:
            reader.ping(timeout=3.0)
        except driver_errors() as exc:
            raise CassandraUnavailableError(reason(exc)) from exc

    def _where(self) -> str:
        c = self.settings.cassandra
        return f"{','.join(c.contact_points)}:{c.port}"

    def close(self) -> None:
        """Shut the driver down."""
        with self._lock:
            if self._cluster is not None:
                self._cluster.shutdown()
            self._cluster, self._reader = None, None
