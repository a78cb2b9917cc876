"""The store contract's byte hooks for the SQL backends: a session's stored bytes are its rows,
joined; replacing them rewrites the rows (a line a row, a tail without LF its own row) and the
summary row's head, as a program editing the database would."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from ..core.errors import ContractError
from ..core.ids import new_id
from ..core.loading import reduce_bytes
from ..core.reducer import is_uuid7
from ..repositories.rows import summary_row


def stored_rows(repository: Any, session_id: str) -> bytes:
    return bytes(repository.read(session_id))


def replace_rows(repository: Any, session_id: str | None, data: bytes) -> str:
    """Make `data` the rows of session `session_id` (None: a new one, named by the header's id
    when it has a valid one); its id. The row's summary is kept, or made from what reduces."""
    lines = data.splitlines(keepends=True)
    sql = repository.sql
    with repository.transaction() as connection:
        summary = None
        if session_id is not None:
            found = connection.execute(sql["summary"], (session_id,)).fetchone()
            summary = found[0] if found else None
            row = connection.execute(sql["holder"], (session_id,)).fetchone()
            if row is not None:  # `delete` checks the row as read (writer epoch and head)
                connection.execute(sql["delete"], (session_id, row[1], row[2]))
        session_id = session_id or _header_id(lines)
        connection.execute(
            sql["insert_session"],
            (
                session_id,
                0,
                0,
                data.count(b"\n"),
                len(data),
                summary or json.dumps(_summary(data)),
                "[]",
                True,
            ),
        )
        connection.cursor().executemany(
            sql["insert"], [(session_id, number, line) for number, line in enumerate(lines, 1)]
        )
    return session_id


class SQLiteRows:
    """Mixin for a `StoreContract` / `AsyncStoreContract` class of a SQLite backend (the
    database at the path holds the test's one session)."""

    unsupported: ClassVar[Mapping[str, str]] = {
        "files": "a session is rows in a database; and a second name (hard link) of a WAL database is unsafe",
        "file_ops": "SQLite does its own I/O; a full disk is tested on a small tmpfs instead",
    }

    def raw_bytes(self, path: Path) -> bytes:
        from ..backends.sqlite import only_session
        from ..repositories.sqlite import SQLiteRepository

        with SQLiteRepository(path) as repository:
            return stored_rows(repository, only_session(repository))

    def write_raw(self, path: Path, data: bytes) -> None:
        from ..repositories.sqlite import SQLiteRepository

        with SQLiteRepository(path) as repository:
            row = repository.connection.execute("select session_id from sessions").fetchone()
            replace_rows(repository, row[0] if row else None, data)


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
