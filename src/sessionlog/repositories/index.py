"""The index of a directory repository: what `list` needs of each session, kept in one SQLite file
inside the directory (`.sessionlog-index.db`) and refreshed only for the files whose size, mtime
or inode changed since it was last read. Listing 10,000 unchanged sessions is then one directory
scan and one query, never 10,000 reductions. Labels, which only the caller knows, live here too.

The index is a cache of the logs (but for the labels): deleting it loses nothing else, the next
`list` rebuilds it. Every write is one short transaction; readers never block the writers of
the sessions themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .schema import migrate

if TYPE_CHECKING:
    import sqlite3

INDEX_NAME = ".sessionlog-index.db"
STEPS = (
    # 1: a summary per session file with the signature it was computed from; the labels
    """
create table if not exists sessions (
    session_id text primary key,
    size integer not null,
    mtime_ns integer not null,
    inode integer not null,
    info text not null
);
create table if not exists labels (
    session_id text not null,
    label text not null,
    primary key (session_id, label)
) without rowid
""",
)


class Index:
    """Cached summaries by session id, with the file signature they were computed from."""

    def __init__(self, directory: Path) -> None:
        import sqlite3  # only for repositories, not for `import sessionlog`

        self._connection = sqlite3.connect(
            directory / INDEX_NAME, isolation_level=None, timeout=5.0, check_same_thread=False
        )
        self._connection.execute("pragma journal_mode=wal")
        migrate(self._transaction, STEPS, directory / INDEX_NAME)

    def close(self) -> None:
        self._connection.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        connection = self._connection
        connection.execute("begin immediate")
        try:
            yield connection
        except BaseException:
            connection.execute("rollback")
            raise
        connection.execute("commit")

    def cached(self) -> dict[str, tuple[tuple[int, int, int], dict[str, Any]]]:
        rows = self._connection.execute("select session_id, size, mtime_ns, inode, info from sessions")
        return {row[0]: ((row[1], row[2], row[3]), json.loads(row[4])) for row in rows}

    def store(
        self, entries: Iterable[tuple[str, tuple[int, int, int], dict[str, Any]]], gone: Iterable[str]
    ) -> None:
        with self._transaction() as connection:
            connection.executemany(
                "insert or replace into sessions values (?, ?, ?, ?, ?)",
                [(session_id, *signature, json.dumps(info)) for session_id, signature, info in entries],
            )
            connection.executemany("delete from sessions where session_id = ?", [(name,) for name in gone])

    def forget(self, session_id: str) -> None:
        with self._transaction() as connection:
            connection.execute("delete from sessions where session_id = ?", (session_id,))
            connection.execute("delete from labels where session_id = ?", (session_id,))

    def labels(self) -> dict[str, tuple[str, ...]]:
        found: dict[str, list[str]] = {}
        for session_id, label in self._connection.execute(
            "select session_id, label from labels order by label"
        ):
            found.setdefault(session_id, []).append(label)
        return {session_id: tuple(labels) for session_id, labels in found.items()}

    def set_labels(self, session_id: str, labels: Iterable[str]) -> None:
        with self._transaction() as connection:
            connection.execute("delete from labels where session_id = ?", (session_id,))
            connection.executemany(
                "insert into labels values (?, ?)", [(session_id, label) for label in labels]
            )


def signature(info: os.stat_result) -> tuple[int, int, int]:
    return (info.st_size, info.st_mtime_ns, info.st_ino)
