"""The PostgreSQL repository: sessions on a database that many hosts share, one writer each.

    repo = sessionlog.repository("postgresql://agent@db/agent")                       # power
    repo = sessionlog.repository("postgresql://agent@db/agent", durability="replicated")
    repo = sessionlog.repositories.postgres.PostgresRepository(pool=pool)   # the caller's pool

Driver: psycopg 3 and psycopg_pool (`pip install 'sessionlog[postgres]'`). A URL passes every
libpq parameter through (`sslmode=...`); a pool the caller passes stays the caller's (never
closed here). Messages and reprs name the database without its password.

Schema `sessionlog` (`sessions`, `lines`, `session_keys`, `schema_version`; version 2), made or
migrated when the repository opens, under `pg_advisory_xact_lock`, so many workers starting at
once migrate it once; or apart, `sessionlog migrate URL`, with `migrate=False` here: the runtime
role then needs only SELECT, INSERT, UPDATE and DELETE on the four tables. Lines are `bytea`: the
bytes a writer committed,
whatever they hold, with no encoding check or normalisation between them and the JSONL file;
`text` would add a UTF-8 validation the reducer does anyway. Loading a session is one
`string_agg` of its lines in key order, fetched in binary: one value, not one row per line.

Classes, checked when the repository opens (DurabilityUnavailableError otherwise): `power`
needs `fsync=on` and `synchronous_commit` at least `local`; `replicated` needs `on` or
`remote_apply` and a synchronous standby configured and connected (`pg_stat_replication`; a role
without `pg_monitor` sees no standby). `synchronous_commit=off` is no class: a crash of the
server loses commits it acknowledged.

One writer per session across hosts: opening for writing takes a lease (`writer`,
`lease_expires_at`, `writer_epoch` bumped) unless a writer holds an unexpired one
(SessionLockedError naming it), or when asked (`take_over=True`). While a writer holds a
session its repository's heartbeat renews the lease every third of it (`leases`), and every
commit renews it too in the fenced update of the summary row; a writer whose hold was lost or
ran out refuses its next commit before sending it. `unfinished()` lists the sessions with an
open operation whose lease expired or whose writer was a process of this host that ended;
`claim_unfinished()` takes one of them with `FOR UPDATE SKIP LOCKED`, so two recovery workers
never take the same. When the connection breaks during COMMIT the store is poisoned with
CommitOutcomeUnknownError; reopening reads the rows back. Every other driver error is a
RepositoryError naming the operation and the session, its message without the password
(`locations.mask_in`); a pooled connection the server broke is replaced before it is lent.
A store keeps the connection of its first commit until it closes (`held_connections` of them at
most, half the pool by default; past that a store borrows one per commit): checked before each
commit as a lent one is, and given back to the pool after anything went wrong in a commit.
With `create=False` a database without the schema is RepositoryNotFoundError, nothing created.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

from ..core.errors import (
    CommitOutcomeUnknownError,
    RepositoryError,
    RepositoryNotFoundError,
    SessionChangedError,
    SessionExistsError,
    SessionLockedError,
    SessionLogError,
    SessionPathError,
    shown,
)
from ..core.store import BackendInfo, SessionStore
from .leases import Heartbeat, Key
from .locations import mask_in, masked
from .postgres_pool import Lender, readable
from .postgres_schema import KEY_LOCK, check_class, migrate_schema
from .postgres_session import PostgresSession
from .rows import SessionRows
from .sql import SQLRepository, gone, statements

INFOS = {
    "power": BackendInfo("postgres", "power", "sync", "PostgreSQL, synchronous_commit=on"),
    "replicated": BackendInfo(
        "postgres-replicated", "replicated", "sync", "PostgreSQL, a synchronous standby has each commit"
    ),
}
ASYNC_INFOS = {
    "power": BackendInfo(
        "postgres-async", "power", "async", "PostgreSQL, commits batched by a writer thread"
    ),
    "replicated": BackendInfo(
        "postgres-replicated-async", "replicated", "async", "PostgreSQL with a synchronous standby, batched"
    ),
}
_LIVE_WRITER = "case when writer is not null and lease_expires_at > now() then writer end"
# The holds of one writer, as two arrays (session ids, epochs), and its rows among the sessions.
_NO_DATABASE = re.compile(r'database "[^"]*" does not exist')
_HELD = "unnest(%s::text[], %s::bigint[]) as h (session_id, epoch)"
_MINE = "s.session_id = h.session_id and s.writer_epoch = h.epoch and s.writer = %s"


def _import_psycopg() -> Any:
    try:
        import psycopg
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "PostgreSQL repositories need psycopg 3: pip install 'sessionlog[postgres]'"
        ) from None
    return psycopg


class PostgresRepository(SQLRepository):
    """Sessions in a PostgreSQL database: `location` (a URL or libpq string) or `pool` (a
    `psycopg_pool.ConnectionPool` the caller owns). `lease_seconds`: how long a writer's hold
    lasts once its process stops renewing it (it is renewed every third of that while held)."""

    placeholder = "%s"

    def __init__(
        self,
        location: str | None = None,
        *,
        pool: Any = None,
        durability: Literal["power", "replicated"] = "power",
        lease_seconds: float = 30.0,
        migrate: bool = True,
        max_connections: int = 16,
        held_connections: int | None = None,
        create: bool = True,
    ) -> None:
        psycopg = _import_psycopg()
        if (location is None) == (pool is None):
            raise ValueError("give the repository a URL or a pool, one of them")
        if durability not in INFOS:
            raise ValueError(
                f"durability is power or replicated, not {shown(durability)} (synchronous_commit=off is no "
                "class: a crash of the server loses commits it acknowledged)"
            )
        if type(lease_seconds) not in (int, float) or not 0.1 <= lease_seconds < 86400:
            raise ValueError(
                f"lease_seconds is a number of seconds from 0.1 to a day, not {shown(lease_seconds)}"
            )
        if held_connections is None:
            held_connections = max_connections // 2
        if type(held_connections) is not int or not 0 <= held_connections < max(max_connections, 1):
            raise ValueError(
                "held_connections is an integer from 0 to max_connections - 1, not "
                f"{shown(held_connections)} (the heartbeat and the reads need a connection of the pool)"
            )
        self.info, self.async_info = INFOS[durability], ASYNC_INFOS[durability]
        self.lease = f"interval '{float(lease_seconds):.3f} seconds'"  # never 1e-05: not SQL's syntax
        self.lease_seconds = float(lease_seconds)
        self.sql = statements("sessionlog.", "%s", _LIVE_WRITER)
        # A commit is one statement: the fenced update and the insert, one round trip and, in
        # autocommit, its own transaction; it inserts nothing when the update matched no row.
        append = (
            "with updated as (update sessionlog.sessions set head_line = %s, head_bytes = %s, "
            f"updated_at = %s, summary = %s, idle = %s, lease_expires_at = now() + {self.lease} "
            "where session_id = %s and writer_epoch = %s and head_line = %s returning session_id) "
            "insert into sessionlog.lines select updated.session_id, "
        )
        self.row_sql = {
            **self.sql,
            "append": append + "added.line_no, added.line from updated, "
            "unnest(%s::integer[], %s::bytea[]) as added (line_no, line)",
            "append_one": append + "%s::integer, %s::bytea from updated",  # no arrays to adapt
            "release": "update sessionlog.sessions set writer = null, lease_expires_at = null "
            "where session_id = %s and writer_epoch = %s",
            "release_all": "update sessionlog.sessions s set writer = null, lease_expires_at = null "
            f"from {_HELD} where {_MINE}",
            # The heartbeat: rows locked by another transaction are skipped (not waited on, so one
            # locked row delays no other renewal), and a lease that ran out is not renewed.
            "renew": f"with held as (select s.session_id from sessionlog.sessions s, {_HELD} where {_MINE} "
            "and s.lease_expires_at > now() for update of s skip locked) "
            f"update sessionlog.sessions s set lease_expires_at = now() + {self.lease} from held "
            "where s.session_id = held.session_id returning s.session_id, s.writer_epoch",
            "lost": f"select h.session_id, h.epoch from {_HELD} where not exists (select 1 from "
            f"sessionlog.sessions s where {_MINE} and s.lease_expires_at > now())",
        }
        self.me = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.psycopg = psycopg
        self.pool, self.owns_pool = pool, pool is None
        self.lender = Lender(pool, owned=False)
        self._closed = False
        # What a driver's message may quote of the location (its password is masked out of it).
        self.location = str(location) if location is not None else str(getattr(pool, "conninfo", ""))
        self.path = masked(self.location) if location is not None else "postgresql:(a pool)"
        if pool is not None:
            with self.failing_as("open the repository"), pool.connection() as connection:
                self.path = _display(connection.info)
        else:
            self.path = self._own_pool(str(location), max_connections, held_connections, create=create)
        self.heartbeat = Heartbeat(self._renew, self.lease_seconds, self.path)
        try:
            with self.failing_as("open the repository"), self.lent() as connection:
                check_class(connection, durability, self.path)
                self.found_version = migrate_schema(
                    self.transaction, connection, self.path, run=migrate, create=create
                )
        except BaseException:
            self.close()
            raise

    def _own_pool(self, location: str, max_connections: int, held: int, *, create: bool = True) -> str:
        """Check the server can be reached (a typed error naming it, never the password), then
        open a pool of autocommit connections with this class's settings; the display name.
        Pooled connections are checked as they are lent, so a pool outlives a server restart."""
        problem = None
        try:
            with self.psycopg.connect(location, connect_timeout=10) as probe:
                display = _display(probe.info)
        except self.psycopg.Error as error:
            problem = self.problem(error)
        if problem is not None:  # raised here, with no context: the driver's error may hold the password
            if not create and _NO_DATABASE.search(problem):
                raise RepositoryNotFoundError(
                    errno.ENOENT, f"no PostgreSQL database at {self.path} ({problem})", self.path
                )
            raise SessionPathError(errno.ECONNREFUSED, f"cannot connect to PostgreSQL: {problem}")

        self.lender = Lender.own(location, max_connections, held)
        self.pool = self.lender.pool
        return display

    def lent(self, timeout: float | None = None) -> Any:
        """A sound connection for a `with` block (`postgres_pool.Lender`)."""
        return self.lender.lent(timeout)

    def close(self) -> None:
        """Stop renewing leases and release the sessions still held (their stores are refused
        from now on, so waiting out their leases would only delay a recovery worker); close the
        pool if it is this repository's."""
        self._closed = True
        heartbeat = getattr(self, "heartbeat", None)
        held = heartbeat.close() if heartbeat is not None else []
        if held and self.pool is not None and not self.pool.closed:
            with (
                contextlib.suppress(Exception),
                self.lent(timeout=self.lease_seconds / 3) as connection,
            ):
                connection.execute(self.row_sql["release_all"], (*_columns(held), self.me))
        if self.owns_pool and self.pool is not None:
            self.pool.close()  # a pool the caller passed stays the caller's, open

    @property
    def closed(self) -> bool:
        return self._closed or self.pool is None or bool(self.pool.closed)

    # -- leases ----------------------------------------------------------------------------------

    def _renew(self, keys: list[Key]) -> tuple[set[Key], set[Key]]:
        """The heartbeat's round trip: renew the leases of `keys` still this writer's, skipping
        rows another transaction has locked; which were renewed, which are lost."""
        with self.lent(timeout=self.lease_seconds / 3) as connection:  # no waiting past a round
            kept = {
                (row[0], int(row[1]))
                for row in connection.execute(self.row_sql["renew"], (*_columns(keys), self.me))
            }
            rest = [key for key in keys if key not in kept]
            lost = set()
            if rest:
                lost = {
                    (row[0], int(row[1]))
                    for row in connection.execute(self.row_sql["lost"], (*_columns(rest), self.me))
                }
        return kept, lost

    @contextlib.contextmanager
    def _holding(self, since: float) -> Iterator[Callable[[str, int], None]]:
        """Around a claim's transaction: `hold(session_id, epoch)` marks the session held here
        before COMMIT (so a claim of another thread of this repository, which waits on the row
        until then, finds it held, not a hold of this writer that ended), renewed once the
        transaction committed, forgotten if it failed."""
        taken: list[Key] = []

        def hold(session_id: str, epoch: int) -> None:
            taken.append((session_id, epoch))
            self.heartbeat.hold((session_id, epoch), since, pending=True)

        try:
            yield hold
        except BaseException:
            for key in taken:
                self.heartbeat.forget(key)
            raise
        for key in taken:  # committed: renewed from now on
            self.heartbeat.confirm(key)

    # -- connections and transactions ------------------------------------------------------------

    @contextlib.contextmanager
    def reading(self) -> Iterator[Any]:
        with self.lent() as connection:
            yield connection

    def usable(self, connection: Any) -> bool:
        """Not closed, and the server sent nothing on it while idle (a terminated backend's or a
        stopping server's FATAL notice, or the end of the stream): such a connection is replaced
        before a commit is sent, so an idle drop costs no commit."""
        return not connection.closed and not readable(connection)

    def connect(self) -> Any:
        """A connection of its own (the async repository's writer thread)."""
        with self.failing_as("connect"):
            return self.psycopg.connect(self.pool.conninfo, autocommit=True, connect_timeout=10)

    # -- errors ------------------------------------------------------------------------------------

    def problem(self, error: BaseException) -> str:
        """A driver's message, first line, without the password whatever the location's shape."""
        text = str(error).strip()
        return mask_in(text.splitlines()[0] if text else type(error).__name__, self.location)

    def typed_error(self, error: Exception, operation: str, session_id: str | None) -> SessionLogError | None:
        """A psycopg error (pool ones included) as RepositoryError naming the operation and the
        session; anything else is not the driver's (None: raised as it is)."""
        if not isinstance(error, self.psycopg.Error):
            return None
        return RepositoryError(operation, self.path, self.problem(error), session_id)

    @contextlib.contextmanager
    def transaction(self, connection: Any = None) -> Iterator[Any]:
        """One transaction; COMMIT is sent once and never retried: a connection that breaks
        during it raises CommitOutcomeUnknownError."""
        if connection is None:
            with self.lent() as pooled, self.transaction(pooled) as open_connection:
                yield open_connection
            return
        psycopg = self.psycopg
        if connection.autocommit:
            connection.execute("begin")
        try:
            yield connection
        except BaseException as error:
            with contextlib.suppress(psycopg.Error):
                connection.rollback()
            if isinstance(error, psycopg.errors.UniqueViolation):
                raise SessionExistsError(0, f"{self.path}: {self.problem(error)}") from None
            raise  # a driver's error: the public method's `failing_as` types it
        with self._committing(connection, "COMMIT"):
            connection.commit()

    @contextlib.contextmanager
    def _committing(self, connection: Any, what: str) -> Iterator[None]:
        """The step that commits: a connection that breaks in it leaves the outcome unknown
        (CommitOutcomeUnknownError, and the connection closed, so a pool discards it rather
        than lend it again); any other database error is typed."""
        try:
            yield
        except self.psycopg.OperationalError as error:
            connection.close()
            raise CommitOutcomeUnknownError(
                f"{self.path}: the connection broke during {what} ({self.problem(error)}); the commit "
                "may or may not have landed: reopen the session to read which"
            ) from error

    def commit_alone(self, rows: SessionRows, lines: Sequence[bytes], held: list[Any] | None = None) -> None:
        """One session's commit: its one `append` statement on an autocommit connection (its
        own transaction, one round trip), else inside a transaction. `held`: the store's held
        connection, if any ([] none yet: one is held if the bound allows), else one is lent."""
        self.check_hold(rows)
        since = time.monotonic()
        connection = None if held is None else self._held(held)
        if held is None or connection is None:
            with self.lent() as connection:
                written = self._commit_on(connection, rows, lines)
        else:
            try:
                written = self._commit_on(connection, rows, lines)
            except BaseException:  # whatever it was, the next commit holds a fresh connection
                held.clear()
                self.lender.give_back(connection)
                raise
            held[1:] = [time.monotonic()]
        rows.advance(written)
        self.heartbeat.renewed((rows.session_id, rows.epoch), since)

    def _held(self, held: list[Any]) -> Any:
        """The store's held connection ([connection, last used] or []), checked as `lent`
        checks one; a new one held when it has none (or its own failed the check), None past
        the bound."""
        if held:
            connection, used = held
            if self.lender.check(connection, used):
                return connection
            held.clear()  # it failed the check and went back to the pool closed
            self.lender.give_back(connection, checked_out=False)
        connection = self.lender.hold()
        if connection is not None:
            held[:] = [connection, None]  # its first use: it was checked as it was taken
        return connection

    def _commit_on(self, connection: Any, rows: SessionRows, lines: Sequence[bytes]) -> Any:
        if not connection.autocommit:  # a pool the caller configured otherwise
            with self.transaction(connection) as open_connection:
                return rows.write(open_connection, lines)
        with self._committing(connection, "the commit's statement"):
            return rows.write(connection, lines)

    def write_batch(self, connection: Any, batch: Sequence[tuple[SessionRows, Sequence[bytes]]]) -> list[Any]:
        """Every session's `append` sent at once (a pipeline: one round trip for the batch);
        the fenced ones inserted nothing and fail alone."""
        refused: dict[int, SessionChangedError] = {}
        for index, (rows, _) in enumerate(batch):
            try:
                self.check_hold(rows)  # a lost hold is refused before anything is sent
            except SessionChangedError as error:
                refused[index] = error
        prepared = [(rows, *rows.next(lines), lines) for rows, lines in batch]
        with connection.pipeline():
            cursors = [
                None
                if index in refused
                else connection.execute(
                    self.row_sql["append_one" if len(lines) == 1 else "append"],
                    rows.append_values(update, lines),
                )
                for index, (rows, _, update, lines) in enumerate(prepared)
            ]
        outcomes: list[Any] = []
        for index, ((rows, written, _, _), cursor) in enumerate(zip(prepared, cursors, strict=True)):
            try:
                if cursor is None:
                    raise refused[index]
                rows.check(cursor.rowcount)
                outcomes.append(written)  # the lease it renewed counts once committed: left to the heartbeat
            except SessionChangedError as error:
                outcomes.append(error)
        return outcomes

    def read(self, session_id: str, connection: Any = None) -> bytes:
        """The session's lines in key order, fetched in binary: the primary key's index scan
        gives that order (the planner is told not to sort instead: a sort of a long session
        can spill to disk), all of it sent in one pipeline. (A driver's error is typed by the
        public method reading: `load`, `export`, `fork`, a store's open.)"""
        if connection is None:
            with self.reading() as reader:
                return self.read(session_id, reader)
        session_id = self._id(session_id)
        with connection.pipeline(), connection.transaction():
            connection.execute("set local enable_sort = off")
            lines = connection.execute(self.sql["lines"], (session_id,), binary=True)
            exists = connection.execute(self.sql["exists"], (session_id,))
        rows = lines.fetchall()
        if not rows and not exists.fetchone():
            raise self._missing(session_id)
        return b"".join(row[0] for row in rows)

    # -- writers -----------------------------------------------------------------------------------

    def open(
        self, session_id: str | None = None, *, key: str | None = None, take_over: bool = False
    ) -> SessionStore:
        """The session for writing; SessionLockedError while another writer's lease runs
        (`take_over=True`: take it anyway; that writer is fenced at its next commit). `key=`:
        the key's current session (KeyNotFoundError when it has none; `keys`)."""
        if key is not None or session_id is None:
            return self.open_keyed(session_id, key, take_over=take_over)
        with self.failing_as("open", session_id):
            backend = PostgresSession(self, session_id, self.claim(session_id, take_over=take_over))
            return SessionStore.open_backend(backend, self.store_path(session_id), self.info)

    def claim(self, session_id: str, connection: Any = None, *, take_over: bool = False) -> int:
        with self.failing_as("open", session_id):
            session_id = self._id(session_id)
            since = time.monotonic()  # the lease is counted from before the statement was sent
            with self._holding(since) as hold, self.transaction(connection) as open_connection:
                take = (
                    "update sessionlog.sessions set writer = %s, writer_epoch = writer_epoch + 1, "
                    f"lease_expires_at = now() + {self.lease} where session_id = %s "
                )
                row = open_connection.execute(
                    take + "and (writer is null or lease_expires_at <= now() or %s) returning writer_epoch",
                    (self.me, session_id, take_over),
                ).fetchone()
                if row is None:
                    holder = open_connection.execute(
                        "select writer, lease_expires_at from sessionlog.sessions where session_id = %s",
                        (session_id,),
                    ).fetchone()
                    if holder is None:
                        raise self._missing(session_id)
                    if not self.holds(holder[0], session_id):  # a writer that ended: no need to wait
                        row = open_connection.execute(
                            take + "and writer = %s returning writer_epoch", (self.me, session_id, holder[0])
                        ).fetchone()
                    if row is None:
                        lease = f"lease until {holder[1]}"
                        raise SessionLockedError(
                            f"session {session_id} in {self.path} is held by {holder[0]} ({lease})"
                        )
                hold(session_id, int(row[0]))
            return int(row[0])

    def lock_key(self, connection: Any, key: str) -> None:
        """The binds of one key wait on each other (an advisory lock until COMMIT): the second
        finds the first's session, never a unique violation."""
        connection.execute("select pg_advisory_xact_lock(%s, hashtext(%s))", (KEY_LOCK, key))

    def holds(self, holder: Any, session_id: str) -> bool:
        """A writer whose lease runs, unless it was a process of this host that ended. (A store
        dropped without `close()` holds its session until its lease runs out: nothing renews it.)"""
        return holder is not None and not gone(holder)

    def claim_unfinished(self) -> SessionStore | None:
        """One session that needs recovery (an open operation, and its lease expired or its
        writer a process of this host that ended, as `open` takes over), opened for writing;
        None when there is none. Two workers calling this never get the same one: the candidates
        are locked `FOR UPDATE SKIP LOCKED` while one is chosen and taken."""
        with self.failing_as("claim_unfinished"):
            since = time.monotonic()
            with self._holding(since) as hold, self.transaction() as connection:
                chosen = self._claimable(connection)
                if chosen is None:
                    return None
                epoch = connection.execute(
                    "update sessionlog.sessions set writer = %s, writer_epoch = writer_epoch + 1, "
                    f"lease_expires_at = now() + {self.lease} where session_id = %s returning writer_epoch",
                    (self.me, chosen),
                ).fetchone()[0]
                hold(chosen, int(epoch))
            backend = PostgresSession(self, chosen, int(epoch))
            return SessionStore.open_backend(backend, self.store_path(chosen), self.info)

    def _claimable(self, connection: Any) -> str | None:
        """The oldest session needing recovery that no live writer holds, locked for this
        transaction: candidates 64 at a time (a writer of this host whose lease runs is asked
        whether its process lives), never this process's own holds, until one is found."""
        after: tuple[Any, str] | None = None
        while True:
            page = "" if after is None else "and (updated_at, session_id) > (%s, %s) "
            candidates = connection.execute(
                "select session_id, writer, writer is null or lease_expires_at <= now(), updated_at "
                "from sessionlog.sessions where not idle and (writer is null or "
                "lease_expires_at <= now() or (split_part(writer, ':', 1) = %s and writer <> %s)) "
                f"{page}order by updated_at, session_id limit 64 for update skip locked",
                (socket.gethostname(), self.me, *(after or ())),
            ).fetchall()
            for session_id, writer, lapsed, _ in candidates:
                if lapsed or not self.holds(writer, session_id):
                    return str(session_id)
            if len(candidates) < 64:
                return None
            after = (candidates[-1][3], candidates[-1][0])


def _columns(keys: Sequence[Key]) -> tuple[list[str], list[int]]:
    return [key[0] for key in keys], [key[1] for key in keys]


def _display(info: Any) -> str:
    """`postgresql:HOST:PORT/DATABASE`: the server, never the password."""
    return f"postgresql:{info.host}:{info.port}/{info.dbname}"
