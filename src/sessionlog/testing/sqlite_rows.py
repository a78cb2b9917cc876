"""The store contract's byte hooks for the SQLite backends: a session's stored bytes are its rows,
joined; replacing them rewrites the rows (a line a row, a tail without LF its own row) and the
summary row's head, as a program editing the database would."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from ..core.errors import ContractError
from ..core.ids import new_id
from ..core.loading import reduce_bytes
from ..core.reducer import is_uuid7
from ..repositories.rows import summary_row
from ..repositories.sqlite import SQLiteRepository


class SQLiteRows:
    """Mixin for a `StoreContract` / `AsyncStoreContract` class of a SQLite backend."""

    unsupported: ClassVar[Mapping[str, str]] = {
        "files": "a session is rows in a database; and a second name (hard link) of a WAL database is unsafe",
        "file_ops": "SQLite does its own I/O; a full disk is tested on a small tmpfs instead",
    }

    def raw_bytes(self, path: Path) -> bytes:
        with contextlib.closing(sqlite3.connect(path)) as connection:
            return b"".join(row[0] for row in connection.execute("select line from lines order by line_no"))

    def write_raw(self, path: Path, data: bytes) -> None:
        SQLiteRepository(path).close()  # the schema, in a new database
        lines = data.splitlines(keepends=True)
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as connection:
            connection.execute("pragma foreign_keys=on")
            connection.execute("begin immediate")
            row = connection.execute("select session_id, summary from sessions").fetchone()
            session_id, summary = row if row else (_header_id(lines), json.dumps(_summary(data)))
            connection.execute("delete from sessions")
            connection.execute(
                "insert into sessions (session_id, created_at, updated_at, head_line, head_bytes, summary) "
                "values (?, 0, 0, ?, ?, ?)",
                (session_id, data.count(b"\n"), len(data), summary),
            )
            connection.executemany(
                "insert into lines values (?, ?, ?)",
                [(session_id, number, line) for number, line in enumerate(lines, 1)],
            )
            connection.execute("commit")


def _header_id(lines: list[bytes]) -> str:
    with contextlib.suppress(ValueError, TypeError, KeyError, IndexError):
        found = json.loads(lines[0])["id"]
        if is_uuid7(found):
            return str(found)
    return new_id()


def _summary(data: bytes) -> dict[str, object]:
    try:
        return summary_row(reduce_bytes(data))
    except (ContractError, ValueError):
        usage = [0, 0, 0, 0]
        return {"provider": "", "model": "", "idle": True, "last_seq": 0, "title": None, "usage": usage}
