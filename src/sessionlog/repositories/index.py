"""The index of a directory repository: what `list` needs of each session, kept in one SQLite file
inside the directory (`.sessionlog-index.db`) and refreshed only for the files whose size, mtime
or inode changed since it was last read. Listing 10,000 unchanged sessions is then one directory
scan and one query, never 10,000 reductions. Labels, which only the caller knows, live here too.

The index is a cache of the logs (but for the labels): deleting it loses nothing else, the next
`list` rebuilds it. So a damaged index (not a database, truncated, another schema) is set aside
as `.sessionlog-index.db.damaged` (then `.damaged.2`, ...: never over an earlier one; its
labels can still be read from there) and a new one is
made; an index of a newer sessionlog is refused, unchanged. Every write is one short
transaction; readers never block the writers of the sessions themselves.

* Private from its first byte: the file is created 0600 before SQLite opens it, and SQLite gives
  its -wal and -shm the mode of the database (it holds the first words of every prompt).
* One connection, shared by the threads of the repository under one lock (a sqlite3 connection
  is one transaction at a time).
* Nothing is created where the caller asked for nothing (`create=False`) or cannot write (a
  read-only directory, an index of another user): reads then use the index as it is, read-only,
  or go without it (every file reduced, no labels), and only a write of labels makes it.
* Every failure of the database is a `RepositoryError` naming the operation (a full disk, a
  lock held too long by another process), with the driver's error as its cause.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import RepositoryError
from .schema import migrate, version_of

if TYPE_CHECKING:
    import sqlite3

INDEX_NAME = ".sessionlog-index.db"
DAMAGED_SUFFIX = ".damaged"
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
_COLUMNS = {
    "sessions": ["session_id", "size", "mtime_ns", "inode", "info"],
    "labels": ["session_id", "label"],
}
_DAMAGED = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB: the file is no (sound) database
_FULL = 13  # SQLITE_FULL
_MODE = 0o600
_SUMMARY_KEYS = {"session_id", "updated_at", "bytes", "rule"}  # what every summary row holds


class Damaged(Exception):
    """The index file is not the index (damaged, or another schema): set it aside, make anew."""


class Index:
    """Cached summaries by session id, with the file signature they were computed from."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / INDEX_NAME
        self._lock = threading.RLock()
        self._connection: sqlite3.Connection | None = None
        self._read_only = False  # opened as it is in a read-only directory: no writes

    def open(self, *, create: bool) -> bool:
        """Open the index (made when missing only if `create`); whether there is one now. An
        index that cannot be made (a read-only directory) is no error here: reads go without."""
        with self._lock:
            if self._connection is not None:
                return True
            if not create and not self.path.exists():
                return False
            try:
                self._connect()
            except RepositoryError:
                if _writable(self.path.parent) and os.access(self.path, os.R_OK | os.W_OK):
                    raise
                return self._connect_read_only()  # a label then says why it cannot be kept
            return True

    def _connect_read_only(self) -> bool:
        """The index of a read-only directory, as it is (no migration, no -shm made): for reads."""
        import sqlite3

        if not self.path.exists():
            return False
        try:
            connection = sqlite3.connect(
                f"{self.path.absolute().as_uri()}?mode=ro&immutable=1", uri=True, check_same_thread=False
            )
            _check_shape(connection)
            connection.execute("select 1 from sessions, labels limit 1").fetchall()
        except (sqlite3.Error, Damaged):
            return False  # no index for the reads: each file is reduced, no labels
        self._connection = connection
        self._read_only = True
        return True

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
                self._read_only = False

    # -- reads (nothing without an index) -------------------------------------------------------

    def cached(self) -> dict[str, tuple[tuple[int, int, int], dict[str, Any]]]:
        rows = self._read("list", "select session_id, size, mtime_ns, inode, info from sessions")
        found = {}
        for session_id, size, mtime_ns, inode, text in rows:
            try:
                info = json.loads(text)
            except (TypeError, ValueError):
                continue  # a row damaged in place: not cached, the file is reduced again
            if type(info) is dict and info.keys() >= _SUMMARY_KEYS:
                found[session_id] = ((size, mtime_ns, inode), info)
        return found

    def labels(self) -> dict[str, tuple[str, ...]]:
        found: dict[str, list[str]] = {}
        for session_id, label in self._read("list", "select session_id, label from labels order by label"):
            found.setdefault(session_id, []).append(label)
        return {session_id: tuple(labels) for session_id, labels in found.items()}

    # -- writes ---------------------------------------------------------------------------------

    def store(
        self, entries: Iterable[tuple[str, tuple[int, int, int], dict[str, Any]]], gone: Iterable[str]
    ) -> None:
        rows = [(session_id, *signature, json.dumps(info)) for session_id, signature, info in entries]
        names = [(name,) for name in gone]

        def work(connection: sqlite3.Connection) -> None:
            connection.executemany("insert or replace into sessions values (?, ?, ?, ?, ?)", rows)
            connection.executemany("delete from sessions where session_id = ?", names)

        with self._lock:  # a cache: never the reason an index is made (create=False reads)
            if self._connection is None and not self.open(create=False):
                return
            self._write("list", None, work)

    def forget(self, session_id: str) -> None:
        with self._lock:  # no index: nothing to forget, and no reason to make one
            if self._connection is None and not self.open(create=False):
                return
        self._forget(session_id)

    def _forget(self, session_id: str) -> None:
        def work(connection: sqlite3.Connection) -> None:
            connection.execute("delete from sessions where session_id = ?", (session_id,))
            connection.execute("delete from labels where session_id = ?", (session_id,))

        self._write("delete", session_id, work)

    def set_labels(self, session_id: str, labels: Iterable[str], operation: str = "label") -> None:
        rows = [(session_id, label) for label in labels]
        with self._lock:  # no labels and no index: nothing to forget, no reason to make one
            if not rows and self._connection is None and not self.open(create=False):
                return

        def work(connection: sqlite3.Connection) -> None:
            connection.execute("delete from labels where session_id = ?", (session_id,))
            connection.executemany("insert into labels values (?, ?)", rows)

        self._write(operation, session_id, work)

    # -- the connection -------------------------------------------------------------------------

    def _read(self, operation: str, query: str) -> list[Any]:
        with self._lock:
            if self._connection is None and not self.open(create=False):
                return []
            try:
                rows: list[Any] = self._run(
                    operation, None, lambda connection: connection.execute(query).fetchall()
                )
                return rows
            except Damaged:
                self._rebuild(operation)
                return []

    def _write(self, operation: str, session_id: str | None, work: Any) -> None:
        with self._lock:
            if not self.open(create=True) or self._read_only:
                raise RepositoryError(
                    operation,
                    str(self.path.parent),
                    "the directory is read-only: the index (which keeps the labels) cannot be made",
                    session_id,
                )
            try:
                self._run(operation, session_id, lambda connection: self._in_transaction(connection, work))
            except Damaged:
                self._rebuild(operation)
                self._run(operation, session_id, lambda connection: self._in_transaction(connection, work))

    def _run(self, operation: str, session_id: str | None, work: Any) -> Any:
        import sqlite3

        assert self._connection is not None
        try:
            return work(self._connection)
        except sqlite3.Error as error:
            raise _mapped(error, operation, self.path, session_id) from error

    @staticmethod
    def _in_transaction(connection: sqlite3.Connection, work: Any) -> None:
        connection.execute("begin immediate")
        try:
            work(connection)
        except BaseException:
            with contextlib.suppress(Exception):
                connection.execute("rollback")
            raise
        connection.execute("commit")

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """For `schema.migrate`."""
        assert self._connection is not None
        connection = self._connection
        connection.execute("begin immediate")
        try:
            yield connection
        except BaseException:
            with contextlib.suppress(Exception):
                connection.execute("rollback")
            raise
        connection.execute("commit")

    def _connect(self) -> None:
        """Open (making it 0600 first when missing), check its shape, migrate; a damaged one is
        set aside and made anew."""
        try:
            self._connect_once()
        except Damaged:
            self._rebuild("open")

    def _connect_once(self) -> None:
        import sqlite3

        try:
            _private_file(self.path)
            self._connection = sqlite3.connect(  # absolute: SQLite reads a name `file:...` as a URI
                self.path.absolute(), isolation_level=None, timeout=5.0, check_same_thread=False
            )
        except OSError as error:
            raise RepositoryError("open", str(self.path.parent), _problem(error)) from error
        except sqlite3.Error as error:
            raise _mapped(error, "open", self.path, None) from error
        try:
            self._run("open", None, _check_shape)  # before anything changes a foreign file
            try:
                if self._run("open", None, version_of) is None:
                    raise Damaged("its schema_version table is not one sessionlog wrote")
                self._run("open", None, lambda connection: connection.execute("pragma journal_mode=wal"))
                migrate(self._transaction, STEPS, self.path)
            except ValueError as error:  # another application's schema_version ('1.0.3')
                raise Damaged(str(error)) from error
            except sqlite3.Error as error:
                raise _mapped(error, "open", self.path, None) from error
            self._run("open", None, _check_shape)
        except BaseException:
            self.close()
            raise

    def _rebuild(self, operation: str) -> None:
        """Set the damaged index aside (with its -wal and -shm) and make a new, empty one."""
        self.close()
        aside = _free_name(self.path.with_name(INDEX_NAME + DAMAGED_SUFFIX))
        try:
            for suffix in ("", "-wal", "-shm", "-journal"):
                with contextlib.suppress(FileNotFoundError):
                    os.replace(f"{self.path}{suffix}", f"{aside}{suffix}")
        except OSError as error:
            raise RepositoryError(
                operation,
                str(self.path.parent),
                f"the index is damaged and cannot be set aside: {_problem(error)}",
            ) from error
        try:
            self._connect_once()
        except Damaged as error:  # a new file is no database: the filesystem itself fails
            raise RepositoryError(
                operation, str(self.path.parent), f"the index is damaged: {error}"
            ) from None


def _free_name(aside: Path) -> Path:
    """Where to set a damaged index aside: `.damaged`, then `.damaged.2`, `.damaged.3`... so that
    an earlier one (whose labels may still be read) is never overwritten."""
    number = 1
    found = aside
    while any(os.path.lexists(f"{found}{suffix}") for suffix in ("", "-wal", "-shm", "-journal")):
        number += 1
        found = aside.with_name(f"{aside.name}.{number}")
    return found


def _all(connection: sqlite3.Connection, query: str) -> list[Any]:
    return connection.execute(query).fetchall()


def _check_shape(connection: sqlite3.Connection) -> None:
    """The tables of the index, if there, have its columns (else another schema is in the way)."""
    for table, columns in _COLUMNS.items():
        found = [row[1] for row in connection.execute(f"pragma table_info({table})")]
        if found and found != columns:
            raise Damaged(f"the table {table} of {INDEX_NAME} has other columns: {', '.join(found)}")


def _mapped(error: Exception, operation: str, path: Path, session_id: str | None) -> Exception:
    code = getattr(error, "sqlite_errorcode", 0) & 0xFF
    if code in _DAMAGED:
        return Damaged(str(error))
    if code == _FULL:
        problem = "the disk is full (nothing was changed)"
    else:
        problem = f"the index {path.name}: {error}"
    return RepositoryError(operation, str(path.parent), problem, session_id)


def _private_file(path: Path) -> None:
    """Create the index 0600 if missing (SQLite would make it 0644 under the usual umask, and its
    -wal and -shm after it); an existing one made by an older sessionlog becomes 0600 too."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, _MODE)
    try:
        if os.fstat(fd).st_mode & 0o077:
            with contextlib.suppress(OSError):  # not ours to change: leave it
                os.fchmod(fd, _MODE)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm", "-journal"):
        with contextlib.suppress(OSError):
            if os.stat(f"{path}{suffix}", follow_symlinks=False).st_mode & 0o077:
                os.chmod(f"{path}{suffix}", _MODE, follow_symlinks=False)


def _writable(directory: Path) -> bool:
    """Whether files can be made in `directory` (a read-only mount says no even to root)."""
    return os.access(directory, os.W_OK)


def _problem(error: OSError) -> str:
    return f"{error.strerror or error} ({errno.errorcode.get(error.errno or 0, error.errno)})"


def signature(info: os.stat_result) -> tuple[int, int, int]:
    return (info.st_size, info.st_mtime_ns, info.st_ino)
