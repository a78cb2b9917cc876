"""The SQLite repository: many sessions in one database file, one row per transaction line.

    repo = sessionlog.repository("sqlite:////var/lib/agent/sessions.db")            # absolute path
    repo = sessionlog.repository("sqlite:///sessions.db", durability="process")  # ./sessions.db

URLs in SQLAlchemy's form: `sqlite:///relative.db` (from the current directory),
`sqlite:////absolute.db`. Schema (in `schema_version`): `sessions` (one summary row per
session, updated in the same transaction as each commit) and `lines` (`(session_id, line_no)`
primary key, each line byte for byte as the JSONL file would hold it, the header as line 1)
and `session_keys` (the sessions of each caller key: `keys`).
WAL; `synchronous=FULL` for the power class, `NORMAL` for the process class; `foreign_keys=ON`.
The database is created 0600 before SQLite opens it (its -wal and -shm take its mode);
`create=False` creates nothing and raises RepositoryNotFoundError for a missing database. A
database with tables sessionlog did not make is refused, unchanged.

One writer per session: opening for writing takes the session's row (`writer` names the holder,
`host:pid`, `writer_epoch` is bumped, `lease_expires_at` set) unless a live writer holds it
(SessionLockedError naming it). A holder is live while its lease runs (30 s, renewed by every
commit and by the repository's heartbeat while held: `sqlite_holds`, `leases`); a process of
this host that ended is known gone at once. So a holder recorded under another host name
(another container, this one before a restart) holds the session until its lease runs out;
`open(session_id, take_over=True)` takes it at once (also a hold an older sessionlog wrote,
without a lease), and that writer, if it lives, is fenced at its next commit. A writer knows
before each commit whether its hold was lost (taken over, as a renewal found, or its lease ran
out unrenewed): that commit is refused before anything is written (SessionChangedError, the
store poisoned). A store dropped without `close()` gives its hold back when it is
garbage-collected (or at exit); closing the repository releases the sessions its stores still
hold (their commits are refused from then on). Every commit is `BEGIN IMMEDIATE`, an update of
the summary row `WHERE session_id = ? AND writer_epoch = ? AND head_line = ?` (no row: the
writer was fenced, nothing is written) and the insert of the line, then `COMMIT`. A busy
database is retried with jitter while other writers commit, and reported as SessionLockedError
once no writer committed for a few seconds; a raw sqlite3 error never escapes (SessionPathError
for the file's failures, else RepositoryError).

One repository object may be shared by threads: its own connection is used under a lock (one
transaction at a time); each store has a connection of its own. A `-wal` file removed or
replaced under a live repository (by another program: SQLite never does while a connection is
open) is seen before the next write: the commits it held are copied into the database through
the connection that still has it open, and every later write is refused (reopen the
repository); without that, they would be lost when the process ends.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import sqlite3
import threading
import time
import urllib.parse
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from ..backends.sqlite_info import INFOS
from ..core.errors import (
    RepositoryError,
    RepositoryNotFoundError,
    SessionLockedError,
    SessionLogError,
    SessionPathError,
    shown,
)
from ..core.store import SessionStore
from . import sqlite_holds
from .leases import Heartbeat, Key
from .rows import SessionRows
from .schema import migrate, version_of
from .sql import SQLRepository, gone, statements

# The tables of a sessionlog database (and the columns of `sessions` every version has): a file
# with any other table, or a `schema_version` sessionlog did not write, is another application's.
_TABLES = {"sessions", "lines", "schema_version", "session_keys"}
_COLUMNS = {"session_id", "head_line", "head_bytes", "summary", "writer", "writer_epoch"}

STEPS = (
    # 1: the summary row of each session and its lines, byte for byte
    """
    create table if not exists sessions (
        session_id text primary key,
        created_at integer not null,
        updated_at integer not null,
        head_line integer not null,
        head_bytes integer not null,
        summary text not null,
        labels text not null default '[]',
        writer text,
        writer_epoch integer not null default 0
    ) without rowid;
    create index if not exists sessions_by_update on sessions (updated_at, session_id);
    create table if not exists lines (
        session_id text not null references sessions (session_id) on delete cascade,
        line_no integer not null,
        line blob not null,
        primary key (session_id, line_no)
    ) without rowid
    """,
    # 2: whether a session is idle as a column, with an index of the others: `unfinished()` and
    # `list(status=...)` read the open sessions only, however many idle ones there are
    """
    alter table sessions add column idle integer not null default 1;
    update sessions set idle = coalesce(json_extract(summary, '$.idle'), 1);
    create index sessions_open on sessions (updated_at, session_id) where idle = 0
    """,
    # 3: the writer's lease (`sqlite_holds`)
    lambda connection: _add_column(connection, "lease_expires_at integer"),
    # 4: caller keys (`keys`): the sessions of each key, at most one of them current
    """
    create table if not exists session_keys (
        session_id text primary key references sessions (session_id) on delete cascade,
        caller_key text not null,
        generation integer not null,
        replaced_at integer,
        unique (caller_key, generation)
    ) without rowid;
    create unique index if not exists session_keys_current on session_keys (caller_key)
        where replaced_at is null
    """,
)
SCHEMA_VERSION = len(STEPS)
_SQL = statements(held=sqlite_holds.LIVE_WRITER)
# a commit renews its writer's lease in its own update of the summary row
_ROW_SQL = {
    **_SQL,
    "update": _SQL["update"].replace(" where ", f", lease_expires_at = {sqlite_holds.LEASE_END} where ", 1),
}
_BUSY_SECONDS = 5.0


def _data_version(connection: sqlite3.Connection) -> int | None:
    """`PRAGMA data_version`: it changes when another connection commits to the database (None
    when it cannot be read just now)."""
    try:
        row = connection.execute("pragma data_version").fetchone()
    except sqlite3.OperationalError:
        return None
    return int(row[0])


def _add_column(connection: sqlite3.Connection, column: str) -> None:
    """`alter table sessions add column`, unless it is there (a file an older step left so)."""
    if column.split()[0] not in {row[1] for row in connection.execute("pragma table_info(sessions)")}:
        connection.execute(f"alter table sessions add column {column}")


def _held(holder: str | None, database: str, session_id: str) -> bool:
    """Whether the writer named `holder` (host:pid; None: none, or its lease ran out) may still
    hold the session."""
    if holder is None:
        return False
    if holder == sqlite_holds.me():
        return sqlite_holds.held_here(database, session_id)
    return not gone(holder)


def _ours(connection: sqlite3.Connection, tables: set[str]) -> bool:
    """Whether a database with these tables is one sessionlog made."""
    if not tables <= _TABLES or "sessions" not in tables or not version_of(connection):
        return False
    columns = {row[1] for row in connection.execute("pragma table_info(sessions)")}
    return columns >= _COLUMNS


def _create_private(path: Path) -> bool:
    """Create the database file empty and 0600 (if missing) before SQLite opens it: its -wal and
    -shm take their mode from it, so none of the three is ever readable by others. Whether it
    was created here."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        return True
    except FileExistsError:
        return False
    except OSError as error:
        problem = f"{path}: cannot create the database: {error.strerror}"
        raise SessionPathError(error.errno, problem, str(path)) from None


def _remove_if_empty(path: Path, created: bool) -> None:
    """A repository that failed to open leaves no empty database file it made (a full disk)."""
    with contextlib.suppress(OSError):
        if created and path.stat().st_size == 0:
            path.unlink()


class SQLiteRepository(SQLRepository):
    """Sessions in one SQLite file (made if missing). `durability`: `power` or `process`."""

    sql = _SQL
    row_sql = _ROW_SQL

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Literal["power", "process"] = "power",
        create: bool = True,
    ) -> None:
        if durability not in ("power", "process"):
            raise ValueError(f"durability is power or process, not {shown(durability)}")
        if type(create) is not bool:  # `?create=false` in a URL is the text "false"
            raise TypeError(f"create is True or False, not {shown(create)}")
        self.path = Path(path)
        created = create and _create_private(self.path)
        if not create and not self.path.is_file():
            raise RepositoryNotFoundError(errno.ENOENT, f"no SQLite database at {self.path}", str(self.path))
        self.key = str(self.path.resolve())  # the database, whatever the path's spelling
        self.info = INFOS[durability, "sync"]
        self.async_info = INFOS[durability, "async"]
        self._synchronous = "full" if durability == "power" else "normal"
        # One connection of the repository's, shared by the threads that call it: one of them at
        # a time in it (SQLite has one transaction per connection). A store has a connection of its own.
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._inherited: list[sqlite3.Connection] = []
        self._closed = False
        where = str(self.path.absolute())
        where = "/" + where.lstrip("/")  # `//x` would name a URI's host
        self._uri = f"file:{urllib.parse.quote(where)}?mode={'rwc' if create else 'rw'}"
        self._renew_uri = f"file:{urllib.parse.quote(where)}?mode=rw"  # never creates a removed database
        self.heartbeat = Heartbeat(self._renew, sqlite_holds.LEASE_MS / 1000, str(self.path))
        sqlite_holds.register(self.key, self.heartbeat)
        self._wal_path = f"{self.path}-wal"
        self._wal: tuple[int, int] | None = None
        try:
            self.connection = self.connect(empty_is_missing=not create)
        except BaseException:
            _remove_if_empty(self.path, created)
            raise
        try:
            migrate(self.transaction, STEPS, self.path)
        except BaseException:
            self.connection.close()
            _remove_if_empty(self.path, created)
            raise
        self._wal = _inode(self._wal_path)  # there from the first transaction while a connection is open

    def connect(self, *, empty_is_missing: bool = False) -> sqlite3.Connection:
        """A connection with this repository's settings; SessionPathError for a file that is not
        a database this repository can use (checked before anything is written to it);
        `empty_is_missing`: RepositoryNotFoundError for a database without sessionlog's tables."""
        try:
            connection = sqlite3.connect(
                self._uri, uri=True, isolation_level=None, timeout=0.05, check_same_thread=False
            )
        except sqlite3.Error as error:
            raise self._unusable(error) from error
        try:
            self._check(connection, empty_is_missing)
            connection.execute("pragma journal_mode=wal")
            connection.execute(f"pragma synchronous={self._synchronous}")
            connection.execute("pragma foreign_keys=on")
        except BaseException as error:
            connection.close()
            if isinstance(error, sqlite3.Error):
                raise self._unusable(error) from error
            raise
        return connection

    def _check(self, connection: sqlite3.Connection, empty_is_missing: bool) -> None:
        """Refuse a database that is not sessionlog's, before anything is written to it."""
        tables = {
            row[0]
            for row in connection.execute("select name from sqlite_master where type = 'table'")
            if not row[0].startswith("sqlite_")
        }
        if not tables and empty_is_missing:
            raise RepositoryNotFoundError(
                errno.ENOENT, f"{self.path} holds no sessionlog database (it is empty)", str(self.path)
            )
        if tables and not _ours(connection, tables):
            raise SessionPathError(
                0,
                f"{self.path} is another application's SQLite database (tables {sorted(tables)[:5]}); "
                "it was not changed",
                str(self.path),
            )

    def _unusable(self, error: sqlite3.Error) -> SessionPathError:
        code = getattr(error, "sqlite_errorcode", None)
        number = _ERRNO.get(code & 0xFF, 0) if code is not None else 0
        return SessionPathError(number, f"{self.path}: not a usable SQLite database: {error}", str(self.path))

    def close(self) -> None:
        """Stop renewing leases and release the sessions still held (their stores are refused
        from now on), at best effort; close the connection."""
        self._closed = True
        held = self.heartbeat.close()
        if held:
            with contextlib.suppress(SessionLogError, sqlite3.Error), self.transaction() as connection:
                connection.executemany(self.row_sql["release"], held)
        self.connection.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def _shared(self) -> threading.RLock:
        """The lock of the repository's connection. In a fork's child, a new lock and connection:
        a lock another thread held at the fork stays held in the child, and a SQLite connection
        must not cross a fork (the parent's is kept, never used nor closed here)."""
        if self._pid != os.getpid():
            self._inherited.append(self.connection)
            self._pid, self._lock = os.getpid(), threading.RLock()
            self.connection = self.connect()
        return self._lock

    @contextlib.contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        with self._shared():
            yield self.connection

    @contextlib.contextmanager
    def transaction(self, connection: sqlite3.Connection | None = None) -> Iterator[sqlite3.Connection]:
        """`BEGIN IMMEDIATE` ... `COMMIT`, retried with jitter while the database is busy."""
        lock = self._shared()
        connection = connection or self.connection
        shared = lock if connection is self.connection else contextlib.nullcontext()
        with shared, self._transaction(connection):
            yield connection

    @contextlib.contextmanager
    def _transaction(self, connection: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        self.begin(connection)
        try:
            yield connection
            connection.execute("commit")  # not in a finally: a failed transaction is rolled back
        except BaseException as error:
            with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled it back already
                connection.execute("rollback")
            if isinstance(error, sqlite3.Error):
                raise os_error(error, self.path) from error
            raise

    def begin(self, connection: sqlite3.Connection) -> None:
        """`BEGIN IMMEDIATE` (the write lock), retried with jitter while the database is busy;
        SessionLockedError once it stayed busy for a few seconds in which no writer committed.
        While other writers commit (to other sessions of the file) it waits on: SQLite's lock is
        not fair, and on a busy disk their commits can hold it for longer than that in all."""
        if self._wal is not None and _inode(self._wal_path) != self._wal:
            self._wal_removed(connection)
        try:
            connection.execute("begin immediate")
            return
        except sqlite3.OperationalError as error:
            self._check_busy(error)
        deadline = time.monotonic() + _BUSY_SECONDS
        seen = _data_version(connection)
        while True:
            time.sleep(random.uniform(0.001, 0.01))
            try:
                connection.execute("begin immediate")
                return
            except sqlite3.OperationalError as error:
                self._check_busy(error)
            version = _data_version(connection)
            if version is not None and version != seen:  # another writer committed: busy, not stuck
                seen, deadline = version, time.monotonic() + _BUSY_SECONDS
            elif time.monotonic() > deadline:
                raise SessionLockedError(
                    f"{self.path}: the database stayed busy for {_BUSY_SECONDS:.0f} s with no commit by "
                    "any writer"
                ) from None

    def _wal_removed(self, connection: sqlite3.Connection) -> None:
        """The -wal file is not the one this repository opened (it was removed or replaced): the
        commits it holds that are not yet in the database would be lost when this process ends.
        Copy them in through `connection`, which still has the removed file open, and refuse
        every write from now on (a store is poisoned; reopen the repository to go on)."""
        self._wal = (-1, -1)  # no file's: every later write comes here
        try:
            connection.execute("pragma wal_checkpoint(full)")
        except sqlite3.Error as error:
            raise os_error(error, self.path) from error
        raise SessionPathError(
            errno.EIO,
            f"{self._wal_path} was removed or replaced under a live writer: the commits it held were "
            "copied into the database; nothing more is written through this repository: reopen it",
            self._wal_path,
        )

    def _renew(self, keys: list[Key]) -> tuple[set[Key], set[Key]]:
        """The heartbeat's round: renew the leases of `keys` still this writer's (`RENEW`, fenced
        on the epoch and the writer), in one transaction on a connection of its own; which were
        renewed, which are lost (another writer's now). A database busy past a few seconds or
        failing raises: those holds lapse unless a later round gets through."""
        with contextlib.closing(
            sqlite3.connect(self._renew_uri, uri=True, isolation_level=None, timeout=_BUSY_SECONDS)
        ) as connection:
            connection.execute("begin immediate")
            writer = sqlite_holds.me()
            kept = {key for key in keys if connection.execute(sqlite_holds.RENEW, (*key, writer)).rowcount}
            connection.execute("commit")
        return kept, set(keys) - kept

    def _check_busy(self, error: sqlite3.OperationalError) -> None:
        if error.sqlite_errorcode & 0xFF not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            raise os_error(error, self.path) from error

    def open(
        self, session_id: str | None = None, *, key: str | None = None, take_over: bool = False
    ) -> SessionStore:
        """The session for writing; SessionLockedError while a live writer holds it. `key=`: the
        key's current session (KeyNotFoundError when it has none; `keys`).

        `take_over=True`: take it from a holder not known to be gone, which is fenced at its next
        commit (nothing it writes lands). A holder is known gone only when it was a process of
        this host that ended; one recorded under another host name (another machine, or this
        container before a restart) is never known gone: whoever knows it is gone takes over."""
        if key is not None or session_id is None:
            return self.open_keyed(session_id, key, take_over=take_over)
        with self.failing_as("open", session_id):
            connection = self.connect()
            try:
                epoch = self.claim(session_id, connection, take_over=take_over)
                backend = SQLiteSession(self, connection, session_id, epoch)
            except BaseException:
                connection.close()
                raise
            return SessionStore.open_backend(backend, self.store_path(session_id), self.info)

    def typed_error(self, error: Exception, operation: str, session_id: str | None) -> SessionLogError | None:
        """A sqlite3 error as SessionPathError when it is the file's (a full disk, a read-only or
        unreadable file, an I/O error: the OSError it is), else as RepositoryError."""
        if not isinstance(error, sqlite3.Error):
            return None
        code = getattr(error, "sqlite_errorcode", None)
        if code is not None and code & 0xFF in _ERRNO:
            where = f" of session {session_id}" if session_id else ""
            return SessionPathError(
                _ERRNO[code & 0xFF], f"{operation}{where} in {self.path} failed: {error}", str(self.path)
            )
        return RepositoryError(operation, str(self.path), str(error), session_id)

    def claim(
        self, session_id: str, connection: sqlite3.Connection | None = None, *, take_over: bool = False
    ) -> int:
        """Hold the session for a writer (SessionLockedError while a live writer holds it, unless
        `take_over`); the new writer epoch, which every commit of this writer checks."""
        with self.failing_as("open", session_id):
            return self._claim(self._id(session_id), connection, take_over)

    def _claim(self, session_id: str, connection: sqlite3.Connection | None, take_over: bool) -> int:
        epoch = 0
        try:
            with self.transaction(connection) as open_connection:
                row = open_connection.execute(
                    f"select {sqlite_holds.LIVE_WRITER}, writer_epoch from sessions where session_id = ?",
                    (session_id,),
                ).fetchone()
                if row is None:
                    raise self._missing(session_id)
                holder, epoch = row[0], int(row[1]) + 1
                if not take_over and self.holds(holder, session_id):
                    raise SessionLockedError(
                        f"session {session_id} in {self.path} is held by {holder}; if that writer is "
                        "gone (another host, a restarted container), open(session_id, take_over=True) "
                        "takes the session and fences it"
                    )
                since = time.monotonic()  # the lease is counted from before the statement was sent
                open_connection.execute(
                    "update sessions set writer = ?, writer_epoch = ?, "
                    f"lease_expires_at = {sqlite_holds.LEASE_END} where session_id = ?",
                    (sqlite_holds.me(), epoch, session_id),
                )
                # Known held here before COMMIT: a claim of another thread of this process waits on
                # BEGIN IMMEDIATE until then, and must find it held, not a dead hold of this pid;
                # renewed once committed.
                self.heartbeat.hold((session_id, epoch), since, pending=True)
        except BaseException:
            self.forget_hold(session_id, epoch)
            raise
        self.heartbeat.confirm((session_id, epoch))
        return epoch

    def holds(self, holder: Any, session_id: str) -> bool:
        return _held(holder, self.key, session_id)


_ERRNO = {
    sqlite3.SQLITE_FULL: errno.ENOSPC,
    sqlite3.SQLITE_READONLY: errno.EROFS,
    sqlite3.SQLITE_PERM: errno.EACCES,
    sqlite3.SQLITE_CANTOPEN: errno.ENOENT,
    sqlite3.SQLITE_IOERR: errno.EIO,
    sqlite3.SQLITE_CORRUPT: errno.EBADMSG,  # damaged: "the session is bad" to the CLI (exit 1)
    sqlite3.SQLITE_NOTADB: errno.EBADMSG,
}


def os_error(error: sqlite3.Error, path: Path) -> SessionPathError:
    """A SQLite error as the OSError it is (ENOSPC for a full disk, EIO for I/O and the rest),
    naming the database: a raw `sqlite3` error never escapes a repository."""
    code = getattr(error, "sqlite_errorcode", None)
    number = _ERRNO.get(code & 0xFF, errno.EIO) if code is not None else errno.EIO
    return SessionPathError(number, f"{path}: {error}", str(path))


def _inode(path: str) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


def _drop(
    connection: sqlite3.Connection, release: str, heartbeat: Heartbeat, session_id: str, epoch: int, pid: int
) -> None:
    """Give up the hold of a store that was dropped without close(), at best effort; in a fork's
    child, nothing (the hold and the connection are the parent's)."""
    if os.getpid() != pid:
        return
    heartbeat.forget((session_id, epoch))
    with contextlib.suppress(sqlite3.Error):
        if epoch:
            connection.execute("begin immediate")
            connection.execute(release, (session_id, epoch))
            connection.execute("commit")
    connection.close()


class SQLiteSession(SessionRows):
    """One session of a SQLite repository as a sync store's backend: one transaction a commit."""

    def __init__(
        self,
        repository: SQLiteRepository,
        connection: sqlite3.Connection,
        session_id: str,
        epoch: int,
        *,
        owns_repository: bool = False,
    ) -> None:
        super().__init__(repository, session_id, epoch)
        self.connection = connection
        self.owns_repository = owns_repository
        # A store dropped without close() gives its hold back when it is collected (or at exit):
        # otherwise its row names a live process, and every other process sees it held.
        self._dropped = weakref.finalize(
            self,
            _drop,
            connection,
            repository.row_sql["release"],
            repository.heartbeat,
            session_id,
            epoch,
            os.getpid(),
        )

    @classmethod
    def owning(cls, repository: SQLiteRepository, session_id: str, epoch: int) -> SQLiteSession:
        """A session on the repository's own connection; closing it closes the repository."""
        return cls(repository, repository.connection, session_id, epoch, owns_repository=True)

    def read(self) -> bytes:
        return self.load(self.connection)

    def truncate(self, length: int) -> None:
        self.cut(self.connection, length)

    def append(self, line: bytes) -> None:
        connection = self.connection  # the hot path: `transaction()` without its generator
        repository = self.repository
        repository.check_hold(self)  # a lost hold is refused before anything is written
        repository.begin(connection)
        since = time.monotonic()
        try:
            written = self.write(connection, (line,))
            connection.execute("commit")
        except BaseException as error:
            with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled it back already
                connection.execute("rollback")
            if isinstance(error, sqlite3.Error):
                raise os_error(error, repository.path) from error
            raise
        self.advance(written)
        repository.heartbeat.renewed((self.session_id, self.epoch), since)  # its update renewed the lease

    def close(self) -> None:
        self._dropped.detach()
        if self.epoch:
            self.release(self.connection)
        self.connection.close()
        if self.owns_repository:
            self.repository.close()
