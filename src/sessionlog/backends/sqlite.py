"""`sqlite` and `sqlite-normal` (sync), `sqlite-async` and `sqlite-normal-async`: one session of a
SQLite repository's database (`repositories.sqlite`), opened by path like a file backend.

    store = sessionlog.create("agent.db", backend="sqlite", provider="p", model="m")
    store = sessionlog.open("agent.db", backend="sqlite")              # the database's only session
    store = sessionlog.open(f"sessions.db#{session_id}", backend="sqlite")   # one of many

A path is the database and, after `#`, a session id: without one it names the database's only
session (`open`) or a database holding none yet (`create`); with one, `create` adds that session
(its `session_id=` must be the same id). The rows, the single-writer rule and the fencing are the
repository's: `sessionlog.repository("sqlite:///sessions.db")` (./sessions.db) lists and opens
the same sessions.
`sqlite` is the power class (WAL, `synchronous=FULL`), `sqlite-normal` the process class
(`synchronous=NORMAL`). An async store's commits go through a writer thread of its own.
"""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import SessionNotFoundError, SessionPathError
from ..plugins.hookspecs import Register, hookimpl
from .sqlite_info import INFOS

if TYPE_CHECKING:
    from ..repositories.sqlite import SQLiteRepository


def split(path: Path) -> tuple[Path, str | None]:
    """`DATABASE#SESSION_ID` -> (database, session id); a path without `#`, or one that names an
    existing file as it is (`d#b.db`), -> (path, None)."""
    database, separator, session_id = str(path).rpartition("#")
    return (Path(database), session_id) if separator and not Path(path).is_file() else (Path(path), None)


def claimed(path: Path, create: bytes | None, durability: str, options: dict[str, Any]) -> Any:
    """The repository holding the session at `path`, its id, and the writer epoch of a new hold
    (or 0 with `read_only=True`: nothing is held, nothing may be written)."""
    import orjson

    from ..repositories.sqlite import SQLiteRepository

    read_only = options.pop("read_only", False)
    take_over = options.pop("take_over", False)  # the repository's rule: a holder not known gone
    if options.pop("lock", True) is not True:
        raise TypeError("a SQLite session always has one writer; its hold cannot be skipped")
    if options:
        raise TypeError(f"unknown option(s) for a SQLite session: {', '.join(sorted(options))}")
    database, session_id = split(path)
    if create is None and not database.exists():
        raise SessionNotFoundError(errno.ENOENT, f"no SQLite database at {database}", str(database))
    # Only `create` makes a database (or its schema): opening, above all read-only, changes nothing.
    repository = SQLiteRepository(database, durability=durability, create=create is not None)  # type: ignore[arg-type]
    try:
        if create is not None:
            header_id = orjson.loads(create)["id"]
            if session_id not in (None, header_id):
                raise ValueError(f"{path} names session {session_id}, and the new header is {header_id}")
            repository.insert_header(create, alone=session_id is None)
            session_id = header_id
        elif session_id is None:
            session_id = only_session(repository)
        epoch = 0 if read_only else repository.claim(session_id, take_over=take_over)
    except BaseException:
        repository.close()
        raise
    return repository, session_id, epoch


def only_session(repository: SQLiteRepository) -> str:
    with repository.reading() as connection:
        ids = [row[0] for row in connection.execute("select session_id from sessions limit 2")]
    if not ids:
        raise SessionNotFoundError(errno.ENOENT, f"no session in {repository.path}", str(repository.path))
    if len(ids) > 1:
        raise SessionPathError(
            0,
            f"{repository.path} holds many sessions: name one as {repository.path}#SESSION_ID",
            str(repository.path),
        )
    return str(ids[0])


def opener(durability: str) -> Any:
    def open_sqlite(path: Path, *, create: bytes | None = None, **options: Any) -> Any:
        from ..repositories.sqlite import SQLiteSession

        return SQLiteSession.owning(*claimed(path, create, durability, options))

    return open_sqlite


def async_opener(durability: str) -> Any:
    async def open_sqlite_async(path: Path, *, create: bytes | None = None, **options: Any) -> Any:
        from ..repositories.aio import AsyncRowsSession, AsyncSQLRepository

        repository, session_id, epoch = await asyncio.to_thread(claimed, path, create, durability, options)
        return AsyncRowsSession(AsyncSQLRepository(repository), session_id, epoch, owner_closes=True)

    return open_sqlite_async


@hookimpl
def register_backends(register: Register) -> None:
    for (durability, api), info in INFOS.items():
        register(info.name, (opener if api == "sync" else async_opener)(durability), info)
