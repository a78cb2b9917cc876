"""The connections of a PostgreSQL repository: its pool, and lending a sound one.

The connections a server restart, a failover or `pg_terminate_backend` broke are replaced, not
lent to fail one call each: a connection of the repository's own pool is checked with a round
trip before it is lent when the server spoke on it while it was idle (its socket is readable: the
FATAL notice or end of a terminated backend) or it sat idle a while. One lent again at once, with
nothing to read, is used as it is (the hot path: one round trip a commit).

Two behaviours of psycopg_pool are worked around here, both found by the fault harness
(`testing.nemesis`): it sleeps a doubling delay (1, 2, 4, 8, 16 s) after each connection its
`check` callback refused, so a burst of terminated connections left calls waiting 30 s beside
fresh ones (so the check is made in `lent`, and a refused connection goes back closed, to be
replaced); and it retries a failed connection attempt with a doubling delay for its
reconnect_timeout (5 minutes by default), one attempt at a time, so a server down a few seconds
left calls waiting although it was back (so an attempt gives up after 2 s and a fresh one starts
at once: a call is served within about a second of the server's return, and a server that stays
down costs one connection attempt a second).

Held connections: a session's store may keep one connection from its first commit until it
closes (`hold`, `give_back`), saving the pool's lending and return on every commit; at most
`max_held` at once (past that a store borrows one per commit), and only from the repository's own
pool. A held connection is checked before each commit exactly as a lent one (`check`), and one
that failed the check, or anything in a commit, goes back to the pool (closed if it broke), the
next commit holding a fresh one.

A pool the caller passed is the caller's: its connections are lent as it lends them.
"""

from __future__ import annotations

import contextlib
import select
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

IDLE_CHECKED = 1.0  # seconds a pooled connection may sit idle and still be lent unchecked
RECONNECT_SECONDS = 2.0  # how long one connection attempt is retried before a fresh one


def readable(connection: Any) -> bool:
    """Whether the server sent something on an idle connection (or closed it)."""
    try:
        return bool(select.select([connection.fileno()], [], [], 0)[0])
    except Exception:  # closed, no socket: let the check say
        return True


def _reconnect_afresh(pool: Any) -> None:
    with contextlib.suppress(Exception):  # a closed pool: nothing to grow
        if not pool.closed:
            pool.check()  # grows the pool again: a new attempt, its delays from the start


class Lender:
    """Lends the connections of `pool`; `owned`: the repository's own (checked as lent)."""

    def __init__(self, pool: Any, *, owned: bool, max_held: int = 0) -> None:
        self.pool = pool
        self.owned = owned
        self.max_held = max_held if owned else 0
        self.held = 0  # connections held by stores now
        self._returned: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        # Re-entrant: a store collected without close() gives its connection back from the
        # garbage collector, which may run in a thread inside `hold`.
        self._held_lock = threading.RLock()

    @classmethod
    def own(cls, location: str, max_connections: int, max_held: int = 0) -> Lender:
        """A new pool of autocommit connections to `location` (checked reachable by the caller)."""
        from psycopg_pool import ConnectionPool

        def configure(connection: Any) -> None:
            connection.autocommit = True

        lender = cls(None, owned=True, max_held=max_held)
        lender.pool = ConnectionPool(
            location,
            min_size=1,
            max_size=max_connections,
            configure=configure,
            reset=lender._returned_now,
            open=True,
            name="sessionlog",
            reconnect_timeout=RECONNECT_SECONDS,
            reconnect_failed=_reconnect_afresh,
        )
        return lender

    def _returned_now(self, connection: Any) -> None:
        with self._lock:
            self._returned[connection] = time.monotonic()

    @contextlib.contextmanager
    def lent(self, timeout: float | None = None) -> Iterator[Any]:
        """A sound connection for the `with` block, given back after it."""
        if not self.owned:
            with self.pool.connection(timeout=timeout) as connection:
                yield connection
            return
        connection = self._sound(timeout)
        try:
            yield connection
        finally:
            self.pool.putconn(connection)

    def _sound(self, timeout: float | None) -> Any:
        """A connection of the own pool, checked: one that fails its check is closed and given
        back (the pool replaces it), and the next one is tried."""
        deadline = time.monotonic() + (self.pool.timeout if timeout is None else timeout)
        while True:
            connection = self.pool.getconn(timeout=max(0.0, deadline - time.monotonic()))
            with self._lock:
                since = self._returned.pop(connection, None)
            if self.check(connection, since):
                return connection

    def check(self, connection: Any, since: float | None) -> bool:
        """Whether `connection`, idle since `since` (monotonic; None: unknown), is sound: used as
        it is when it was idle at most IDLE_CHECKED and the server sent nothing on it, else
        checked with a round trip. False: it failed the check and went back to the pool closed.
        Interrupted mid-check it goes back too (not leaked), and the interruption is raised."""
        try:
            if since is not None and time.monotonic() - since <= IDLE_CHECKED and not readable(connection):
                return True
            self.pool.check_connection(connection)
            return True
        except Exception:
            connection.close()
            self.pool.putconn(connection)  # closed: the pool replaces it
            return False
        except BaseException:  # interrupted mid-check: given back, not leaked
            self.pool.putconn(connection)
            raise

    def hold(self, timeout: float | None = None) -> Any:
        """A sound connection for a store to keep between its commits (`give_back` it), or None
        when `max_held` are held already or the pool is the caller's: that store borrows one
        per commit (`lent`) until a held one is given back."""
        with self._held_lock:
            if self.held >= self.max_held:
                return None
            self.held += 1
        try:
            return self._sound(timeout)
        except BaseException:
            with self._held_lock:
                self.held -= 1
            raise

    def give_back(self, connection: Any, *, checked_out: bool = True) -> None:
        """The end of a hold: the connection goes back to the pool (which discards it if it
        broke or the pool closed). `checked_out=False`: it went back already (a failed check)."""
        with self._held_lock:
            self.held -= 1
        if checked_out:
            self.pool.putconn(connection)
