"""What the SQL repositories (SQLite, PostgreSQL) share: the statements of the design's schema
and every method that is only those statements. A subclass brings the connection, the
transaction, how a writer takes its hold (`claim`) and how to tell a live holder.

The statements are written once, with `?` placeholders and `{s}` before each table name;
`statements(prefix, placeholder, held)` makes a database's dialect of them (PostgreSQL: `%s` and
its schema). `held` is the SQL expression of a session row's live writer, or NULL.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import json
import socket
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from ..backends.side_files import process_alive
from ..core.errors import (
    RepositoryError,
    SessionChangedError,
    SessionExistsError,
    SessionLockedError,
    SessionLogError,
    SessionNotFoundError,
    shown,
)
from ..core.ids import new_id
from ..core.loading import reduce_bytes
from ..core.reducer import is_uuid7
from ..core.state import SessionState
from ..core.store import BackendInfo, SessionStore
from ..opening import new_header
from .base import RepositoryBase, checked_create, checked_data, checked_labels, fork_bytes
from .info import Candidate, Filters, SessionInfo, page
from .keys import KeySessions, checked_key
from .leases import Heartbeat
from .locations import masked
from .rows import ROW_SQL, SessionRows, summary_row

SQL = {
    **ROW_SQL,
    "any_session": "select session_id from {s}sessions limit 1",
    "insert_session": "insert into {s}sessions (session_id, created_at, updated_at, head_line, head_bytes, "
    "summary, labels, idle) values (?, ?, ?, ?, ?, ?, ?, ?)",
    "lines": "select line from {s}lines where session_id = ? order by line_no",
    "exists": "select 1 from {s}sessions where session_id = ?",
    "holder": "select {held}, writer_epoch, head_line from {s}sessions where session_id = ?",
    # the row as checked: a writer that opened (a new epoch) or committed (a new head) since the
    # check keeps it, and what it was acknowledged stays
    "delete": "delete from {s}sessions where session_id = ? and writer_epoch = ? and head_line = ?",
    "label": "update {s}sessions set labels = ? where session_id = ?",
    "list": "select session_id, created_at, updated_at, head_line, head_bytes, summary, labels, {held}, "
    "(select k.caller_key from {s}session_keys k where k.session_id = {s}sessions.session_id), "
    "(select k.replaced_at from {s}session_keys k where k.session_id = {s}sessions.session_id) "
    "from {s}sessions {where} order by updated_at desc, session_id desc",
    # caller keys (`keys`): one row per keyed session; the current one has no replaced_at
    "key_current": "select session_id from {s}session_keys where caller_key = ? and replaced_at is null",
    "key_sessions": "select session_id, replaced_at from {s}session_keys where caller_key = ? "
    "order by generation",
    "key_next": "select coalesce(max(generation), 0) + 1 from {s}session_keys where caller_key = ?",
    "key_replace": "update {s}session_keys set replaced_at = ? where caller_key = ? and replaced_at is null",
    "key_insert": "insert into {s}session_keys (session_id, caller_key, generation) values (?, ?, ?)",
    "key_filter": "session_id in (select k.session_id from {s}session_keys k where k.caller_key = ?)",
}


def gone(holder: str | None) -> bool:
    """Whether the writer named `holder` (`host:pid`, maybe `:token` after) was a process of this
    host that has ended. Another host's writer is never known gone (only its lease can tell); no
    holder (None: released meanwhile) is no writer that ended."""
    if not isinstance(holder, str):
        return False
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    return host == socket.gethostname() and pid.isdigit() and not process_alive(int(pid))


def lf_lines(data: bytes) -> builtins.list[bytes]:
    """The lines of `data` (which ends with LF), each with its LF: split at LF only (a lone CR is
    JSON whitespace inside a line, and `splitlines` would split there)."""
    return [line + b"\n" for line in data.split(b"\n")[:-1]]


# SQL's integers are 64-bit: a filter beyond them is clamped to the range, where it selects the
# same rows (no time of a session is near either end), so sqlite3 never sees an int it cannot bind.
_INT64 = (-(2**63), 2**63 - 1)


def int64(value: int) -> int:
    return min(max(int(value), _INT64[0]), _INT64[1])


def statements(prefix: str = "", placeholder: str = "?", held: str = "writer") -> dict[str, str]:
    """The statements for one database: `prefix` before table names, its placeholder."""
    return {
        name: text.replace("{s}", prefix).replace("{held}", held).replace("?", placeholder)
        for name, text in SQL.items()
    }


class SQLRepository(RepositoryBase):
    """Sessions as rows: a summary row each in `sessions`, their lines in `lines`."""

    path: Any  # what messages call the database (never with a password)
    info: BackendInfo
    async_info: BackendInfo
    sql: dict[str, str]
    row_sql: dict[str, str]
    placeholder = "?"

    # -- what a database brings ------------------------------------------------------------------

    def transaction(self, connection: Any = None) -> Any:
        """A context manager: a write transaction on `connection` (or one of the repository's)."""
        raise NotImplementedError

    def claim(self, session_id: str, connection: Any = None) -> int:
        """Hold the session for a writer; the new writer epoch its commits check."""
        raise NotImplementedError

    def open(self, session_id: str) -> SessionStore:
        raise NotImplementedError

    def holds(self, holder: Any, session_id: str) -> bool:
        """Whether `holder` (the `held` expression of the session's row) is a live writer."""
        return holder is not None

    # Holds are leases, renewed by the repository's heartbeat (`leases.Heartbeat`) while held.
    heartbeat: Heartbeat

    def forget_hold(self, session_id: str, epoch: int) -> None:
        """This process no longer holds the session (its row may still name it)."""
        self.heartbeat.forget((session_id, epoch))

    # Commits refused because their writer no longer held the session: its hold seen lost
    # before anything was sent (`check_hold`), or fenced by the writer epoch in the database.
    fenced = 0

    def check_hold(self, rows: SessionRows) -> None:
        """SessionChangedError, before anything is written, unless the writer of `rows` still
        holds the session with a running lease (`leases`)."""
        if rows.epoch:
            try:
                self.heartbeat.check((rows.session_id, rows.epoch))
            except SessionChangedError:
                self.fenced += 1
                raise

    def write_batch(self, connection: Any, batch: Sequence[tuple[SessionRows, Sequence[bytes]]]) -> list[Any]:
        """Write the lines of several sessions inside the caller's transaction; for each, what
        it wrote (to `advance` to once committed) or the SessionChangedError that refused or
        fenced it (having written nothing: its hold is checked, its summary row's update comes
        first)."""
        outcomes: list[Any] = []
        for rows, lines in batch:
            try:
                self.check_hold(rows)
                outcomes.append(rows.write(connection, lines))
            except SessionChangedError as error:
                outcomes.append(error)
        return outcomes

    def reading(self) -> Any:
        """A context manager giving a connection to read with."""
        raise NotImplementedError

    def connect(self) -> Any:
        """A new connection of its own, with this repository's settings (the async repository's
        writer thread keeps one)."""
        raise NotImplementedError

    def usable(self, connection: Any) -> bool:
        """Whether a connection kept idle may be used as it is (PostgreSQL: not one the server
        closed or spoke on meanwhile); one that is not is replaced before anything is sent."""
        return True

    def close(self) -> None:
        raise NotImplementedError

    @property
    def closed(self) -> bool:
        """Whether the repository was closed: every operation is then refused, typed (a
        RepositoryError), before it reaches the driver."""
        return False

    def typed_error(self, error: Exception, operation: str, session_id: str | None) -> SessionLogError | None:
        """The typed error a driver's `error` during `operation` is (a RepositoryError naming
        the operation and the session, say), or None for one that is not the driver's (a
        ValueError of the caller's input): it is raised unchanged."""
        return None

    @contextlib.contextmanager
    def failing_as(self, operation: str, session_id: str | None = None) -> Iterator[None]:
        """Run one public operation: a SessionLogError passes as it is, a driver's error leaves
        as the typed error `typed_error` makes of it (the driver's as its `__cause__`)."""
        if self.closed:
            raise RepositoryError(operation, masked(str(self.path)), "the repository is closed", session_id)
        try:
            yield
        except SessionLogError:
            raise
        except Exception as error:
            typed = self.typed_error(error, operation, session_id)
            if typed is None:
                raise
            raise typed from error

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.path} ({self.info.durability})>"

    def _id(self, session_id: str) -> str:
        if not is_uuid7(session_id):
            raise ValueError(f"not a session id (a UUIDv7): {shown(session_id)}")
        return session_id

    def _new_session(self, header: dict[str, Any]) -> tuple[str, bytes]:
        """A new session's id and header line (`provider`, `model`, `cwd`,
        `environment_identity`), checked first (`checked_create`)."""
        checked_create(header)
        session_id = new_id()
        made = new_header(
            header["provider"],
            header["model"],
            header.get("cwd"),
            header.get("environment_identity"),
            session_id,
        )
        return session_id, made

    def _missing(self, session_id: str) -> SessionNotFoundError:
        return SessionNotFoundError(errno.ENOENT, f"no session {session_id} in {self.path}", str(self.path))

    # -- one session -----------------------------------------------------------------------------

    def create(self, *, key: str | None = None, **header: Any) -> SessionStore:
        """A new session (`provider`, `model`, `cwd`, `environment_identity`, `labels`), open for
        writing; `key=`: the key's current session, made with them when it has none (`keys`)."""
        with self.failing_as("create"):
            checked_create(header)
            if key is None:
                return self.open(self.create_row(**header))
            key = checked_key(key)
            return self.open_key(key, self.bind_key(key, **header))

    def lock_key(self, connection: Any, key: str) -> None:
        """Serialise the transactions that bind `key` (SQLite's BEGIN IMMEDIATE already does);
        the unique index on each key's current session is the backstop."""

    def bind_key(self, key: str, *, replace: bool = False, labels: Iterable[str] = (), **header: Any) -> str:
        """The id of the key's current session, made (with the `header` given: `provider`,
        `model`, `cwd`, `environment_identity`) when it has none or when `replace`: in one
        transaction with the key's row, the one before it marked replaced."""
        with self.failing_as("replace" if replace else "create"):
            key = checked_key(key)
            session_id, line = self._new_session(header)
            wanted = checked_labels(labels)
            state = reduce_bytes(line)
            with self.transaction() as connection:
                self.lock_key(connection, key)
                if not replace and (row := connection.execute(self.sql["key_current"], (key,)).fetchone()):
                    return str(row[0])
                generation = connection.execute(self.sql["key_next"], (key,)).fetchone()[0]
                connection.execute(self.sql["key_replace"], (time.time_ns() // 1_000_000, key))
                self._insert_in(connection, session_id, [line], wanted, state)
                connection.execute(self.sql["key_insert"], (session_id, key, int(generation)))
            return session_id

    def current_of(self, key: str) -> str | None:
        """The key's current session, or None."""
        with self.failing_as("open"), self.reading() as connection:
            row = connection.execute(self.sql["key_current"], (checked_key(key),)).fetchone()
            return None if row is None else str(row[0])

    def key_sessions(self, key: str) -> KeySessions | None:
        """The key's current session and those it replaced (None: the key names none)."""
        with self.failing_as("key_sessions"), self.reading() as connection:
            rows = connection.execute(self.sql["key_sessions"], (checked_key(key),)).fetchall()
        if not rows:
            return None
        current = next((str(row[0]) for row in rows if row[1] is None), None)
        return KeySessions(key, current, tuple(str(row[0]) for row in rows if row[1] is not None))

    def store_path(self, session_id: str) -> Path:
        """What a store of this session calls itself in messages: `DATABASE#SESSION_ID`."""
        return Path(f"{self.path}#{session_id}")

    def create_row(self, *, labels: Iterable[str] = (), **header: Any) -> str:
        """A new session's rows (its header line: `provider`, `model`, `cwd`,
        `environment_identity`); its id."""
        with self.failing_as("create"):
            session_id, line = self._new_session(header)
            self._insert(session_id, [line], checked_labels(labels))
            return session_id

    def insert_header(self, header: bytes, *, alone: bool = False) -> None:
        """A new session whose header line (validated) is `header`; `alone`: only into a
        database holding no session yet."""
        with self.failing_as("create"):
            self._insert(self._id(orjson.loads(header)["id"]), [header], [], alone=alone)

    def _insert(
        self, session_id: str, lines: builtins.list[bytes], labels: builtins.list[str], *, alone: bool = False
    ) -> None:
        """Store a new session's lines, validated by the reducer first."""
        state = reduce_bytes(b"".join(lines))  # before the transaction: never under its lock
        with self.transaction() as connection:
            if alone and (other := connection.execute(self.sql["any_session"]).fetchone()):
                raise SessionExistsError(
                    0,
                    f"{self.path} holds session {other[0]} already; name a new one as "
                    f"{self.path}#SESSION_ID (with that session_id)",
                    str(self.path),
                )
            self._insert_in(connection, session_id, lines, labels, state)

    def _insert_in(
        self,
        connection: Any,
        session_id: str,
        lines: builtins.list[bytes],
        labels: builtins.list[str],
        state: SessionState,
    ) -> None:
        """Insert a new session's rows (`state`: its lines reduced) in the caller's transaction."""
        data = b"".join(lines)
        if connection.execute(self.sql["exists"], (session_id,)).fetchone():
            raise SessionExistsError(0, f"session {session_id} is already in {self.path}", str(self.path))
        connection.execute(
            self.sql["insert_session"],
            (
                session_id,
                state.header["createdAt"],
                time.time_ns() // 1_000_000,
                len(lines),
                len(data),
                json.dumps(summary_row(state)),
                json.dumps(labels),
                state.is_idle,
            ),
        )
        connection.cursor().executemany(
            self.sql["insert"], [(session_id, number, line) for number, line in enumerate(lines, 1)]
        )

    def read(self, session_id: str, connection: Any = None) -> bytes:
        """Every stored byte of a session (its lines, joined)."""
        with self.failing_as("read", session_id):
            if connection is None:
                with self.reading() as reader:
                    return self.read(session_id, reader)
            rows = connection.execute(self.sql["lines"], (self._id(session_id),)).fetchall()
            if not rows and not connection.execute(self.sql["exists"], (session_id,)).fetchone():
                raise self._missing(session_id)
            return b"".join(row[0] for row in rows)

    def load(self, session_id: str) -> SessionState:
        with self.failing_as("load", session_id):
            return reduce_bytes(self.read(session_id), **self.info.nul_rule())

    def export(self, session_id: str) -> bytes:
        with self.failing_as("export", session_id):
            return self.read(session_id)

    def import_(self, data: bytes, *, labels: Iterable[str] = ()) -> str:
        with self.failing_as("import"):
            data = checked_data(data)
            state = reduce_bytes(data)
            if state.repaired_length != len(data):
                raise ValueError("an imported session ends with its last LF (this one has a torn tail)")
            self._insert(state.session_id, lf_lines(data), checked_labels(labels))
            return state.session_id

    def fork(self, session_id: str, at_seq: int) -> str:
        with self.failing_as("fork", session_id):
            forked, data = fork_bytes(self.read(session_id), session_id, at_seq)
            self._insert(forked, lf_lines(data), [])
            return forked

    def delete(self, session_id: str) -> None:
        """The session's lines and summary row, in one transaction (refused while held)."""
        with self.failing_as("delete", session_id):
            session_id = self._id(session_id)
            with self.transaction() as connection:
                row = connection.execute(self.sql["holder"], (session_id,)).fetchone()
                if row is None:
                    raise self._missing(session_id)
                if self.holds(row[0], session_id):
                    raise SessionLockedError(f"session {session_id} is held by {row[0]}; nothing was deleted")
                if not connection.execute(self.sql["delete"], (session_id, row[1], row[2])).rowcount:
                    raise SessionLockedError(
                        f"session {session_id} was opened or written while it was being deleted; "
                        "nothing was deleted"
                    )

    def label(self, session_id: str, labels: Iterable[str]) -> None:
        with self.failing_as("label", session_id):
            with self.transaction() as connection:
                changed = connection.execute(
                    self.sql["label"], (json.dumps(checked_labels(labels)), self._id(session_id))
                ).rowcount
            if not changed:
                raise self._missing(session_id)

    # -- many sessions ---------------------------------------------------------------------------

    def list(self, **filters: Any) -> builtins.list[SessionInfo]:
        """From the summary rows alone, newest first in SQL (an index on the last write): a page
        reads about as many rows as it shows, whatever the repository's size."""
        with self.failing_as("list"):
            return self._list(Filters(**filters))

    def _list(self, wanted: Filters) -> builtins.list[SessionInfo]:
        clauses: builtins.list[str] = []
        values: builtins.list[Any] = []
        if wanted.updated_before is not None:
            clauses.append("updated_at < ?")
            values.append(int64(wanted.updated_before))
        if wanted.updated_after is not None:
            clauses.append("updated_at > ?")
            values.append(int64(wanted.updated_after))
        if wanted.cursor is not None:
            updated, _, session_id = wanted.cursor.partition(":")
            clauses.append("(updated_at < ? or (updated_at = ? and session_id < ?))")
            values += [int64(int(updated)), int64(int(updated)), session_id]
        if wanted.key is not None:
            clauses.append(self.sql["key_filter"])
            values.append(wanted.key)
        statuses = {wanted.status} if isinstance(wanted.status, str) else set(wanted.status or ())
        if statuses and "corrupt" not in statuses and ("idle" in statuses) != bool(statuses - {"idle"}):
            clauses.append("idle = ?")  # only idle, or only unfinished (an index of these)
            values.append("idle" in statuses)
        where = f"where {' and '.join(clauses)}" if clauses else ""
        query = self.sql["list"].replace("{where}", where.replace("?", self.placeholder))
        if wanted.limit is not None and not wanted.labels and statuses <= {"idle"}:
            query += f" limit {int64(wanted.limit)}"  # every filter is in SQL: a page is its rows
        with self.reading() as connection:  # rows are made into infos only as the page needs
            return page(map(self._candidate, connection.execute(query, values)), wanted)

    def _candidate(self, row: tuple[Any, ...]) -> Candidate:
        session_id, created, updated, lines, size, summary, labels, holder, key, replaced_at = row
        fields = orjson.loads(summary)
        fields.update(session_id=session_id, created_at=created, updated_at=updated, lines=lines, bytes=size)
        return Candidate(
            fields,
            tuple(json.loads(labels)),
            lambda: self.holds(holder, session_id),
            caller_key=key,
            replaced=replaced_at is not None,
        )

    def latest(self, **filters: Any) -> SessionInfo | None:
        with self.failing_as("latest"):
            found = self._list(Filters(**{**filters, "limit": 1}))  # errors named `latest`
            return found[0] if found else None

    def unfinished(self) -> builtins.list[SessionInfo]:
        with self.failing_as("unfinished"):
            return self._list(Filters(status="needs-recovery", limit=None))  # errors named `unfinished`
