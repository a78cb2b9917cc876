"""A PostgreSQL session as a sync store's backend (`PostgresRepository.open`): each commit one
transaction, on the connection the store holds or on one lent for it; closing gives the
connection back and releases the writer's hold at best effort."""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from .postgres_pool import Lender
from .rows import SessionRows


class PostgresSession(SessionRows):
    """One session as a sync store's backend: each commit one transaction, on the connection the
    store holds (`PostgresRepository.commit_alone`) or on one lent for it."""

    repository: Any  # a PostgresRepository (typed loosely: that module imports this one)

    def __init__(self, repository: Any, session_id: str, epoch: int) -> None:
        super().__init__(repository, session_id, epoch)
        self._connection: list[Any] = []  # [held connection, last used], or nothing held
        if epoch:
            repository.heartbeat.attach((session_id, epoch), self)
        # A store dropped without close() gives its held connection back once collected.
        self._dropped = weakref.finalize(self, _give_back, repository.lender, self._connection)

    def read(self) -> bytes:
        with self.repository.failing_as("open", self.session_id), self.repository.reading() as connection:
            return self.load(connection)

    def truncate(self, length: int) -> None:
        with self.repository.failing_as("open", self.session_id), self.repository.reading() as connection:
            self.cut(connection, length)

    def append(self, line: bytes) -> None:
        # First, so a store of a closed repository is told its commit was not written (its hold
        # ended with the repository), not the unknown outcome of a failed write.
        self.repository.check_hold(self)
        with self.repository.failing_as("commit", self.session_id):
            self.repository.commit_alone(self, (line,), self._connection)

    def close(self) -> None:
        """Give the held connection back, and release the hold at best effort, never waiting
        long: a release that cannot be written leaves a lease that runs out (the heartbeat
        stopped renewing it)."""
        self._dropped()
        repository = self.repository
        if self.epoch:
            repository.forget_hold(self.session_id, self.epoch)
            if not repository.closed:
                with (
                    contextlib.suppress(Exception),
                    repository.lent(timeout=repository.lease_seconds / 3) as connection,
                ):
                    self.release(connection)


def _give_back(lender: Lender, held: list[Any]) -> None:
    if held:
        connection = held[0]
        held.clear()
        with contextlib.suppress(Exception):  # a pool gone already
            lender.give_back(connection)
