"""The heartbeat of a repository whose holds are leases (PostgreSQL, SQLite): while a writer holds a
session, one thread of its repository renews the lease every third of it, so an agent waiting
minutes on one model call is never listed as needing recovery nor claimed by a recovery worker.

A writer knows where its hold stands before each commit (`check`): the hold is *lost* when a
renewal found the session's row no longer this writer's (another writer took it over: its
epoch moved on), or when the lease ran out before a renewal reached the server (the connection
broke, the row was locked, the process was stopped). Its deadline is counted on this host's
monotonic clock from the moment the renewing statement was *sent*, so it is never later than
the server's. A lost hold stays lost: the commit is refused with SessionChangedError before
anything is sent, and the store is poisoned. Fencing on `writer_epoch` stays the backstop for
whatever the heartbeat cannot see (a writer stopped between its check and its statement).

A fork's child holds none of its parent's sessions: in it every hold it inherited is lost (its
commits are refused) and nothing is renewed until it takes holds of its own.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..core.errors import SessionChangedError

Key = tuple[str, int]  # (session id, writer epoch)


@dataclass
class Hold:
    valid_until: float  # time.monotonic() past which the lease may have run out on the server
    lost: str | None = None  # why this writer no longer holds the session
    pending: bool = False  # its claim is not committed yet: held here, not renewed


class Heartbeat:
    """The holds of one repository and the thread renewing them. `renew(keys)` renews the
    leases of `keys` in one round trip and returns `(kept, lost)`: the keys renewed, and those
    whose row is another writer's now (a key in neither was skipped this round: its row was
    locked). `where` names the repository in messages."""

    def __init__(
        self, renew: Callable[[list[Key]], tuple[set[Key], set[Key]]], lease: float, where: str
    ) -> None:
        self._renew = renew
        self.lease = lease
        self.where = where
        self._holds: dict[Key, Hold] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        _EVERY.add(self)

    def hold(self, key: Key, since: float, *, pending: bool = False) -> None:
        """`key` was claimed by a statement sent at `since` (monotonic): renew it from now on
        (`pending`: once `confirm`ed, when the claim's transaction committed)."""
        with self._lock:
            self._holds[key] = Hold(since + self.lease, pending=pending)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="sessionlog-lease", daemon=True)
                self._thread.start()

    def attach(self, key: Key, owner: object) -> None:
        """Stop renewing `key` once `owner` (the store's backend) is gone, closed or not: a
        store dropped without `close()` lets its lease run out instead of holding forever."""
        weakref.finalize(owner, self.forget, key)

    def confirm(self, key: Key) -> None:
        with self._lock:
            hold = self._holds.get(key)
            if hold is not None:
                hold.pending = False

    def forget(self, key: Key) -> None:
        with self._lock:
            self._holds.pop(key, None)

    def renewed(self, key: Key, since: float) -> None:
        """A commit sent at `since` renewed the lease (its fenced update sets it)."""
        with self._lock:
            hold = self._holds.get(key)
            if hold is not None and hold.lost is None:
                hold.valid_until = max(hold.valid_until, since + self.lease)

    def check(self, key: Key) -> None:
        """SessionChangedError unless this writer still holds `key` with a running lease."""
        now = time.monotonic()
        with self._lock:
            hold = self._holds.get(key)
            if hold is None:
                why = "its repository was closed or the store was released"
            else:
                if hold.lost is None and now > hold.valid_until:
                    hold.lost = "its lease ran out before it could be renewed"
                why = hold.lost or ""
        if why:
            raise SessionChangedError(
                f"{self.where}: session {key[0]} is no longer held by this writer ({why}); "
                "nothing was written"
            )

    def held(self) -> list[Key]:
        """The keys still held (not lost)."""
        with self._lock:
            return [key for key, hold in self._holds.items() if hold.lost is None]

    def close(self) -> list[Key]:
        """Stop renewing; the keys that were still held (the repository releases them)."""
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.lease)  # a renewal stuck on a dead server is not waited out: its holds lapse
        kept = self.held()
        with self._lock:
            self._holds.clear()
        return kept

    def renew_now(self) -> None:
        """One round: mark the holds whose lease ran out as lost, renew the others."""
        now = time.monotonic()
        with self._lock:
            due = []
            for key, hold in self._holds.items():
                if hold.lost is None and now > hold.valid_until:
                    hold.lost = "its lease ran out before it could be renewed"
                elif hold.lost is None and not hold.pending:
                    due.append(key)
        if not due:
            return
        try:
            kept, lost = self._renew(due)
        except Exception:  # the server is out of reach: the holds lapse unless a later round gets through
            return
        self._settle(due, kept, lost, now)

    def _settle(self, due: Iterable[Key], kept: set[Key], lost: set[Key], since: float) -> None:
        with self._lock:
            for key in due:
                hold = self._holds.get(key)
                if hold is None or hold.lost is not None:
                    continue
                if key in kept:
                    hold.valid_until = max(hold.valid_until, since + self.lease)
                elif key in lost:
                    hold.lost = (
                        "the server says it is no longer this writer's: its lease ran out there "
                        "or another writer took the session over"
                    )

    def _run(self) -> None:
        while True:
            self._wake.wait(self.lease / 3)
            with self._lock:
                if self._closed:
                    return
                if all(hold.lost for hold in self._holds.values()):  # nothing to renew: end; the
                    self._thread = None  # next hold starts another thread
                    return
            self.renew_now()

    def _in_a_fork(self) -> None:
        """In a fork's child: the holds are the parent's (lost here, never renewed), no thread
        runs, and a lock or event another thread held at the fork is not inherited held."""
        self._lock, self._wake, self._thread = threading.Lock(), threading.Event(), None
        for hold in self._holds.values():
            hold.lost = hold.lost or "it is held by the process this one was forked from"


_EVERY: weakref.WeakSet[Heartbeat] = weakref.WeakSet()  # every heartbeat of this process


def _in_a_fork() -> None:
    for heartbeat in list(_EVERY):  # the child has one thread: nothing changes the set meanwhile
        heartbeat._in_a_fork()


os.register_at_fork(after_in_child=_in_a_fork)
