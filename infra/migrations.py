"""Versioned CQL migrations: ``infra/cql/NNNN_name.cql`` applied in order, each once, recorded in a table.

The keyspace itself is created from settings (its replication differs per deployment), then every file whose
version is not yet in ``schema_migrations`` runs statement by statement. Statements are written re-runnable
(``IF NOT EXISTS``), so a migration cut off half-way is simply applied again. An applied file whose text has
changed since is refused: migrations are append-only, fix forward with a new file.

Two deployments (two ``trends stack init``, an init beside a job's start) must not apply them at once: the run
takes a lock first, a lightweight-transaction row (``INSERT ... IF NOT EXISTS USING TTL``) naming its owner,
renewed between statements and deleted (``IF owner = ...``) when done. A second run waits for it, then finds the
migrations applied. The TTL frees the lock of a run that was killed. The lock table is created with a fixed table
id, because concurrent ``CREATE TABLE IF NOT EXISTS`` of one table by two clients would otherwise give it two ids.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from infra.cassandra import session, table
from infra.errors import MigrationError
from infra.service_settings import CassandraSettings
from infra.settings import Settings

if TYPE_CHECKING:
    from cassandra.cluster import Session

logger = logging.getLogger(__name__)

CQL_DIR = Path(__file__).parent / "cql"
_NAME_RE = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.cql$")

CREATE_LEDGER = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version int PRIMARY KEY,
    name text,
    checksum text,
    applied_at timestamp
)"""


LOCK_TABLE = "schema_migration_lock"
LOCK_NAME = "migrations"
LOCK_TTL_S = 600  # a killed run's lock expires; a live run renews it between statements
LOCK_WAIT_S = 900.0  # how long a run waits for another one's lock before giving up
LOCK_POLL_S = 0.5
LOCK_RENEW_S = 30.0  # renewed between statements once this old (a renewal is a lightweight transaction: ~60 ms)


@dataclass(frozen=True)
class Migration:
    """One CQL file."""

    version: int
    name: str
    path: Path

    @property
    def text(self) -> str:
        """Return the file's CQL."""
        return self.path.read_text(encoding="utf-8")

    @property
    def checksum(self) -> str:
        """Return the hash that detects edits after apply."""
        return hashlib.sha256(self.text.encode()).hexdigest()

    def statements(self) -> list[str]:
        """Return the file's statements without comments."""
        body = "\n".join(line.split("--", 1)[0] for line in self.text.splitlines())
        return [stmt.strip() for stmt in body.split(";") if stmt.strip()]


def discover(folder: Path = CQL_DIR) -> list[Migration]:
    """Return the migration files in version order.

    :raises MigrationError: on a misnamed file or a duplicate version.
    """
    found: dict[int, Migration] = {}
    for path in sorted(folder.glob("*.cql")):
        match = _NAME_RE.match(path.name)
        if not match:
            msg = f"{path.name}: migration files are named NNNN_snake_case.cql"
            raise MigrationError(msg)
        version = int(match.group("version"))
        if version in found:
            msg = f"two migrations with version {version}: {found[version].path.name}, {path.name}"
            raise MigrationError(msg)
        found[version] = Migration(version, match.group("name"), path)
    return [found[v] for v in sorted(found)]


def replication_map(cfg: CassandraSettings) -> dict[str, str | int]:
    """Return the keyspace replication map for ``CREATE KEYSPACE``."""
    if cfg.replication_strategy == "NetworkTopologyStrategy":
        dcs = cfg.datacenter_replication or {cfg.local_datacenter: cfg.replication_factor}
        return {"class": "NetworkTopologyStrategy", **dcs}
    return {"class": "SimpleStrategy", "replication_factor": cfg.replication_factor}


def create_keyspace(sess: Session, settings: Settings) -> None:
    """Create the keyspace with the configured replication if it does not exist."""
    replication = replication_map(settings.cassandra)
    rendered = ", ".join(f"'{k}': {v!r}" if isinstance(v, str) else f"'{k}': {v}" for k, v in replication.items())
    sess.execute(f"CREATE KEYSPACE IF NOT EXISTS {settings.cassandra.keyspace} WITH replication = {{{rendered}}}")


def lock_table_id(keyspace: str) -> uuid.UUID:
    """Return the lock table's id: the same in every client, so racing creations of it agree."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"trends:{keyspace}.{LOCK_TABLE}")


class MigrationLock:
    """The lightweight-transaction row that lets one run apply migrations at a time."""

    def __init__(self, sess: Session, keyspace: str, owner: str | None = None, ttl_s: int = LOCK_TTL_S) -> None:
        self.sess = sess
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.ttl_s = ttl_s
        self._renewed = 0.0  # monotonic time of the last take or renewal
        sess.execute(
            f"CREATE TABLE IF NOT EXISTS {keyspace}.{LOCK_TABLE} (name text PRIMARY KEY, owner text, "
            f"acquired_at timestamp) WITH ID = {lock_table_id(keyspace)} "
            "AND comment = 'one migration run at a time (lightweight transactions)'"
        )
        t = f"{keyspace}.{LOCK_TABLE}"
        self._take = sess.prepare(
            f"INSERT INTO {t} (name, owner, acquired_at) VALUES (?, ?, toTimestamp(now())) IF NOT EXISTS USING TTL ?"
        )
        self._renew = sess.prepare(
            f"UPDATE {t} USING TTL ? SET owner = ?, acquired_at = toTimestamp(now()) WHERE name = ? IF owner = ?"
        )
        self._release = sess.prepare(f"DELETE FROM {t} WHERE name = ? IF owner = ?")

    def try_acquire(self) -> tuple[bool, str | None]:
        """Take the lock if free; return (taken, the holder's owner when not)."""
        row = self.sess.execute(self._take, (LOCK_NAME, self.owner, self.ttl_s)).one()
        taken = bool(row[0])
        return taken, None if taken else getattr(row, "owner", None)

    def acquire(self, wait_s: float = LOCK_WAIT_S) -> None:
        """Take the lock, waiting for another run's to go.

        :raises MigrationError: when it is still held after ``wait_s``.
        """
        deadline = time.monotonic() + wait_s
        logged = None
        while True:
            taken, holder = self.try_acquire()
            if taken:
                self._renewed = time.monotonic()
                logger.debug("migration lock taken by %s", self.owner)
                return
            if holder != logged:
                logger.info("waiting for the migration lock held by %s", holder)
                logged = holder
            if time.monotonic() > deadline:
                msg = (
                    f"the migration lock is held by {holder} for more than {wait_s:.0f} s; if that run is dead, the "
                    f"lock expires {self.ttl_s} s after its last renewal (or delete the row of {LOCK_TABLE})"
                )
                raise MigrationError(msg)
            time.sleep(LOCK_POLL_S)

    def renew(self) -> None:
        """Extend the lock's TTL; raise if another run holds it now (ours expired)."""
        row = self.sess.execute(self._renew, (self.ttl_s, self.owner, LOCK_NAME, self.owner)).one()
        if not row[0]:
            msg = f"lost the migration lock (now held by {getattr(row, 'owner', None)}): migrations stopped"
            raise MigrationError(msg)
        self._renewed = time.monotonic()

    def renew_if_due(self, every_s: float = LOCK_RENEW_S) -> None:
        """Renew once taken or renewed ``every_s`` ago (a quarter of a short TTL): not a transaction per statement."""
        if time.monotonic() - self._renewed >= min(every_s, self.ttl_s / 4):
            self.renew()

    def release(self) -> None:
        """Delete the lock row if it is still ours."""
        self.sess.execute(self._release, (LOCK_NAME, self.owner))


@contextmanager
def locked(sess: Session, keyspace: str, wait_s: float = LOCK_WAIT_S) -> Iterator[MigrationLock]:
    """Hold the migration lock for the block."""
    lock = MigrationLock(sess, keyspace)
    lock.acquire(wait_s)
    try:
        yield lock
    finally:
        try:
            lock.release()
        except Exception:  # the block's own error matters more; the TTL frees the lock
            logger.warning("could not release the migration lock (it expires in %s s)", lock.ttl_s, exc_info=True)


def applied(sess: Session) -> dict[int, str]:
    """Return version -> checksum of the applied migrations."""
    return {row.version: row.checksum for row in sess.execute("SELECT version, checksum FROM schema_migrations")}


def migrate(settings: Settings, folder: Path = CQL_DIR, *, lock_wait_s: float = LOCK_WAIT_S) -> list[Migration]:
    """Create the keyspace, then apply the pending migrations in order under the lock; return the ones applied now."""
    migrations = discover(folder)
    keyspace = settings.cassandra.keyspace
    with session(settings) as sess:
        create_keyspace(sess, settings)
        with locked(sess, keyspace, lock_wait_s) as lock:
            sess.set_keyspace(keyspace)
            sess.execute(CREATE_LEDGER)
            done = applied(sess)
            ledger = table(settings, "schema_migrations")  # keyspace name validated by settings
            record = sess.prepare(
                f"INSERT INTO {ledger} (version, name, checksum, applied_at) VALUES (?, ?, ?, toTimestamp(now()))"
            )
            newly = []
            for mig in migrations:
                if mig.version in done:
                    if done[mig.version] != mig.checksum:
                        msg = (
                            f"migration {mig.path.name} was changed after it was applied; "
                            "migrations are append-only — add a new file instead"
                        )
                        raise MigrationError(msg)
                    continue
                logger.info("applying migration %s", mig.path.name)
                for stmt in mig.statements():
                    lock.renew_if_due()
                    try:
                        sess.execute(stmt)
                    except Exception as exc:
                        msg = f"{mig.path.name} failed: {exc}\nstatement: {stmt[:300]}"
                        raise MigrationError(msg) from exc
                sess.execute(record, (mig.version, mig.name, mig.checksum))
                newly.append(mig)
    return newly
