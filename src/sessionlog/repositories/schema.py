"""Schema versions of the SQLite files a repository keeps (the SQLite repository's database, a
directory's index): a table `schema_version` holding the version, and the steps that bring each
version to the next. Opening runs the missing steps and records the new version in one
`BEGIN IMMEDIATE` transaction (SQLite's DDL is transactional), so of many processes opening an
old file at once the first migrates and the others, waiting for its lock, find it done; a step
that fails leaves the file as it was. A file newer than this sessionlog is refused, unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import SessionPathError

if TYPE_CHECKING:
    import sqlite3

Transaction = Callable[[], "contextlib.AbstractContextManager[sqlite3.Connection]"]


def version_of(connection: sqlite3.Connection) -> int:
    """The schema version of the open database (0: it has no `schema_version` table)."""
    if not connection.execute("select 1 from sqlite_master where name = 'schema_version'").fetchone():
        return 0
    return int(connection.execute("select coalesce(max(version), 0) from schema_version").fetchone()[0])


def migrate(transaction: Transaction, steps: Sequence[str], where: Path) -> int:
    """Bring the database to version `len(steps)` (step N, `;`-separated statements, makes
    version N of N-1); the version it had."""
    with transaction() as connection:
        found = version_of(connection)
        if found > len(steps):
            raise SessionPathError(
                0,
                f"{where}: schema version {found} is newer than this sessionlog knows ({len(steps)}); "
                "it was not changed",
                str(where),
            )
        for step in steps[found:]:
            for statement in filter(str.strip, step.split(";")):
                connection.execute(statement)
        if found < len(steps):
            connection.execute("create table if not exists schema_version (version integer not null)")
            connection.execute("delete from schema_version")
            connection.execute("insert into schema_version values (?)", (len(steps),))
    return found
