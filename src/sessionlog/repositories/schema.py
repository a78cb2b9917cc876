"""Schema versions of the SQLite files a repository keeps (the SQLite repository's database, a
directory's index): a table `schema_version` holding the version, and the steps that bring each
version to the next. Opening runs the missing steps and records the new version in one
`BEGIN IMMEDIATE` transaction (SQLite's DDL is transactional), so of many processes opening an
old file at once the first migrates and the others, waiting for its lock, find it done; a step
that fails leaves the file as it was. A file newer than this sessionlog is refused, unchanged.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

from ..core.errors import SessionPathError

Transaction = Callable[[], "contextlib.AbstractContextManager[sqlite3.Connection]"]


def version_of(connection: sqlite3.Connection) -> int | None:
    """The schema version of the open database (0: it has no `schema_version` table; None: it
    has one that sessionlog did not write, another application's)."""
    if not connection.execute("select 1 from sqlite_master where name = 'schema_version'").fetchone():
        return 0
    try:
        rows = connection.execute("select version from schema_version").fetchall()
    except sqlite3.DatabaseError:  # a table of that name with other columns
        return None
    if len(rows) != 1 or type(rows[0][0]) is not int or rows[0][0] < 1:
        return None  # sessionlog writes exactly one row, a positive integer
    return int(rows[0][0])


Step = str | Callable[["sqlite3.Connection"], None]


def migrate(transaction: Transaction, steps: Sequence[Step], where: Path) -> int:
    """Bring the database to version `len(steps)` (step N, `;`-separated statements or a function
    of the connection, makes version N of N-1); the version it had."""
    with transaction() as connection:
        found = version_of(connection)
        if found is None:
            raise SessionPathError(
                0,
                f"{where}: its schema_version table is not one sessionlog wrote; it was not changed",
                str(where),
            )
        if found > len(steps):
            raise SessionPathError(
                0,
                f"{where}: schema version {found} is newer than this sessionlog knows ({len(steps)}); "
                "it was not changed",
                str(where),
            )
        for step in steps[found:]:
            if callable(step):
                step(connection)
                continue
            for statement in filter(str.strip, step.split(";")):
                connection.execute(statement)
        if found < len(steps):
            connection.execute("create table if not exists schema_version (version integer not null)")
            connection.execute("delete from schema_version")
            connection.execute("insert into schema_version values (?)", (len(steps),))
    return found
