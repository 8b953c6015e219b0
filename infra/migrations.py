"""Versioned CQL migrations: ``infra/cql/NNNN_name.cql`` applied in order, each once, recorded in a table.

The keyspace itself is created from settings (its replication differs per deployment), then every file whose
version is not yet in ``schema_migrations`` runs statement by statement. Statements are written re-runnable
(``IF NOT EXISTS``), so a migration cut off half-way is simply applied again. An applied file whose text has
changed since is refused: migrations are append-only, fix forward with a new file.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from infra.cassandra import session, table
from infra.errors import MigrationError
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


def create_keyspace(sess: Session, settings: Settings) -> None:
    """Create the keyspace with the configured replication if it does not exist."""
    replication = settings.cassandra.replication_map()
    rendered = ", ".join(f"'{k}': {v!r}" if isinstance(v, str) else f"'{k}': {v}" for k, v in replication.items())
    sess.execute(f"CREATE KEYSPACE IF NOT EXISTS {settings.cassandra.keyspace} WITH replication = {{{rendered}}}")


def applied(sess: Session) -> dict[int, str]:
    """Return version -> checksum of the applied migrations."""
    return {row.version: row.checksum for row in sess.execute("SELECT version, checksum FROM schema_migrations")}


def migrate(settings: Settings, folder: Path = CQL_DIR) -> list[Migration]:
    """Create the keyspace, then apply the pending migrations in order; return the ones applied now."""
    migrations = discover(folder)
    with session(settings) as sess:
        create_keyspace(sess, settings)
        sess.set_keyspace(settings.cassandra.keyspace)
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
                try:
                    sess.execute(stmt)
                except Exception as exc:
                    msg = f"{mig.path.name} failed: {exc}\nstatement: {stmt[:300]}"
                    raise MigrationError(msg) from exc
            sess.execute(record, (mig.version, mig.name, mig.checksum))
            newly.append(mig)
    return newly
