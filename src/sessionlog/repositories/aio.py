"""Repositories for asyncio: `await sessionlog.repository_async(location)` has the methods of
`repository(location)`, awaited; `create` and `open` give `AsyncSessionStore`s.

Everything but the commits runs on one worker thread per repository (its connection is used by
that thread only). Commits:

* a directory's sessions are `jsonl-group` files (or `jsonl-async` for a `jsonl` repository):
  group commit per session, as `open_async` gives them; with `backend="jsonl-syncfs"` the
  commits of all its sessions share one `syncfs` a round (Linux; `backends.syncfs_file`);
* a SQLite or PostgreSQL repository funnels the commits of **all** its sessions through one
  writer thread (`BatchWriter`): every batch queued while the previous transaction was being
  written goes into one transaction, so one sync covers many sessions. A session's batch starts
  with the fenced update of its summary row, so one that is fenced has written nothing and fails
  alone, never its neighbours (no savepoint is needed). A commit is acknowledged only after the
  transaction holding it committed.

The writer's connection is checked before each batch (`SQLRepository.usable`: one the server
closed or spoke on while idle, after a restart or `pg_terminate_backend`, is replaced), and a
batch whose driver error came before COMMIT was sent (nothing written) is tried once more on a
new connection: a connection dropped while idle costs no commit. A transaction that still fails
poisons the stores of its batch (typed: CommitOutcomeUnknownError when the connection broke
during COMMIT) and the connection is replaced: the next batch, of any session, goes through a new
one. Once the repository is closed its stores' commits are refused at once (StoreClosedError) and
their `close()` returns; the sessions they held are released. A store dropped without `close()`
gives its session back once collected (the writer thread writes the release).
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import contextlib
import functools
import queue
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..core.async_store import AsyncSessionStore
from ..core.errors import RepositoryError, SessionLogError, StoreClosedError
from ..core.state import SessionState
from ..opening import create_async, open_async
from .base import CREATE_KEYWORDS, AsyncRepositoryBase, checked_create, checked_labels
from .directory import DirectoryRepository
from .info import SessionInfo
from .keys import checked_key
from .locations import masked
from .rows import SessionRows
from .sql import SQLRepository

_T = TypeVar("_T")
_ASYNC_TWIN = {"jsonl-fsync": "jsonl-group", "jsonl": "jsonl-async"}
# An async file backend named for a directory: the sync repository reads with its twin.
_SYNC_TWIN = {"jsonl-group": "jsonl-fsync", "jsonl-syncfs": "jsonl-fsync", "jsonl-async": "jsonl"}


class AsyncRepository(AsyncRepositoryBase):
    """The methods every async repository shares: the sync repository's, on its own thread."""

    def __init__(self, sync: Any, *, owns_sync: bool = True) -> None:
        self.sync = sync
        self.owns_sync = owns_sync  # close the sync repository at close (it is this one's)
        self.closed = False
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sessionlog-repository")

    def _refuse_closed(self, operation: str, session_id: str | None = None) -> None:
        if self.closed:
            where = getattr(self.sync, "directory", None) or self.sync.path  # a directory's path is a method
            raise RepositoryError(operation, masked(str(where)), "the repository is closed", session_id)

    async def _call(self, function: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        self._refuse_closed(getattr(function, "__name__", "call").strip("_"))
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(function, *args, **kwargs))

    async def create(self, **header: Any) -> AsyncSessionStore:
        """A new session (`provider`, `model`, `cwd`, `environment_identity`, `labels`), open."""
        raise NotImplementedError

    async def open(self, session_id: str | None = None, *, key: str | None = None) -> AsyncSessionStore:
        """The session for writing; SessionLockedError while a live writer holds it. `key=`: the
        key's current session (`keys`)."""
        raise NotImplementedError

    async def load(self, session_id: str) -> SessionState:
        return await self._call(self.sync.load, session_id)

    async def export(self, session_id: str) -> bytes:
        return await self._call(self.sync.export, session_id)

    async def import_(self, data: bytes, **options: Any) -> str:
        return await self._call(self.sync.import_, data, **options)

    async def fork(self, session_id: str, at_seq: int) -> str:
        return await self._call(self.sync.fork, session_id, at_seq)

    async def delete(self, session_id: str) -> None:
        await self._call(self.sync.delete, session_id)

    async def label(self, session_id: str, labels: Any) -> None:
        await self._call(self.sync.label, session_id, labels)

    async def list(self, **filters: Any) -> builtins.list[SessionInfo]:
        return await self._call(self.sync.list, **filters)

    async def latest(self, **filters: Any) -> SessionInfo | None:
        return await self._call(self.sync.latest, **filters)

    async def unfinished(self) -> builtins.list[SessionInfo]:
        return await self._call(self.sync.unfinished)

    async def close(self) -> None:
        """Idempotent. Calls after it raise RepositoryError (a store's: StoreClosedError)."""
        if self.closed:
            return
        if self.owns_sync:
            await self._call(self.sync.close)
        self.closed = True
        self._executor.shutdown()

    async def __aenter__(self) -> AsyncRepository:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncDirectoryRepository(AsyncRepository):
    sync: DirectoryRepository

    def __init__(self, sync: DirectoryRepository, backend: str | None = None) -> None:
        super().__init__(sync)
        self.backend = backend or _ASYNC_TWIN.get(sync.backend, sync.backend)
        sync.read_as(self.backend)  # the sessions are this backend's files: read with its rule

    async def create(self, *, key: str | None = None, **header: Any) -> AsyncSessionStore:
        self._refuse_closed("create")
        checked_create(header, (*CREATE_KEYWORDS, "max_line_bytes"))
        if key is not None:  # made by the sync repository (a key record linked), opened here
            key = checked_key(key)
            options = {"max_line_bytes": header.pop("max_line_bytes")} if "max_line_bytes" in header else {}
            return await self.open_key(key, await self._call(self.sync.bind_key, key, **header), **options)
        labels = checked_labels(header.pop("labels", ()))  # refused before a session is made
        from ..core.ids import new_id

        session_id = new_id()
        store = await create_async(
            self.sync.path(session_id),
            self.backend,
            session_id=session_id,
            registry=self.sync.registry,
            **header,
        )
        if labels:
            await self._call(self.sync.label, session_id, labels)
        return store

    async def open(
        self, session_id: str | None = None, *, key: str | None = None, **options: Any
    ) -> AsyncSessionStore:
        self._refuse_closed("open", session_id)
        if key is not None or session_id is None:
            return await self.open_keyed(session_id, key, **options)
        return await open_async(
            self.sync.path(session_id), self.backend, registry=self.sync.registry, **options
        )


class AsyncSQLRepository(AsyncRepository):
    """SQLite or PostgreSQL: the commits of every session go through one `BatchWriter`."""

    sync: SQLRepository

    def __init__(self, sync: SQLRepository, *, owns_sync: bool = True) -> None:
        super().__init__(sync, owns_sync=owns_sync)
        self.writer = BatchWriter(sync)

    async def create(self, *, key: str | None = None, **header: Any) -> AsyncSessionStore:
        self._refuse_closed("create")
        if key is not None:
            key = checked_key(key)
            return await self.open_key(key, await self._call(self.sync.bind_key, key, **header))
        return await self.open(await self._call(self.sync.create_row, **header))

    async def open(
        self, session_id: str | None = None, *, key: str | None = None, **options: Any
    ) -> AsyncSessionStore:
        self._refuse_closed("open", session_id)
        if key is not None or session_id is None:
            return await self.open_keyed(session_id, key, **options)
        epoch = await self._call(self.sync.claim, session_id, **options)
        session = AsyncRowsSession(self, session_id, epoch)
        return await AsyncSessionStore.open_backend(
            session, self.sync.store_path(session_id), self.sync.async_info
        )

    async def close(self) -> None:
        await asyncio.to_thread(self.writer.close)  # what was queued before lands first
        await super().close()


class AsyncRowsSession(SessionRows):
    """One session of an async SQL repository: an `AsyncBackend` whose batches go through the
    repository's `BatchWriter`."""

    def __init__(
        self, owner: AsyncSQLRepository, session_id: str, epoch: int, *, owner_closes: bool = False
    ) -> None:
        super().__init__(owner.sync, session_id, epoch)
        self.owner = owner
        self.owner_closes = owner_closes  # the store owns its repository (the `sqlite-async` backend)
        # A store dropped without close() gives its hold back once collected: the writer thread
        # releases it (as a sync store's finalizer does), in order with the commits queued before.
        self._dropped = weakref.finalize(self, owner.writer.dropped, session_id, epoch) if epoch else None

    def _with_connection(self, work: Callable[..., _T], *args: Any) -> _T:
        """`work` on a connection of the repository: reading the session as its store opens (a
        driver's error typed, as the sync store's are)."""
        with self.repository.failing_as("open", self.session_id), self.repository.reading() as connection:
            return work(connection, *args)

    async def read(self) -> bytes:
        return await self.owner._call(self._with_connection, self.load)

    async def truncate(self, length: int) -> None:
        await self.owner._call(self._with_connection, self.cut, length)

    async def append_batch(self, lines: list[bytes]) -> None:
        await asyncio.wrap_future(self.owner.writer.submit(self, lines))

    async def close(self) -> None:
        if self._dropped is not None:
            self._dropped.detach()
        if self.owner.closed:  # the repository released its holds as it closed
            self.repository.forget_hold(self.session_id, self.epoch)
            return
        if self.epoch:
            with contextlib.suppress(SessionLogError):  # at best effort, as `release` itself
                await self.owner._call(self._with_connection, self.release)
        if self.owner_closes:
            await self.owner.close()


_Batch = tuple[SessionRows, list[bytes], "concurrent.futures.Future[None]"]
_Dropped = tuple[str, int]  # (session id, writer epoch) of a store collected without close()


class BatchWriter:
    """One thread with its own connection: the batches of every session queued meanwhile go into
    one transaction (a fenced one wrote nothing and fails alone). A failed transaction fails its
    batch and ends the connection; the next batch opens a new one."""

    def __init__(self, repository: SQLRepository) -> None:
        self.repository = repository
        self._queue: queue.SimpleQueue[_Batch | _Dropped | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # `closed` and the queue's end marker, together
        self.closed = False
        self.connection: Any = repository.connect()
        self._thread = threading.Thread(target=self._run, name="sessionlog-writer", daemon=True)
        self._thread.start()

    def submit(self, rows: SessionRows, lines: list[bytes]) -> concurrent.futures.Future[None]:
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            if not self.closed:
                self._queue.put((rows, lines, future))
                return future
        future.set_exception(
            StoreClosedError(
                f"{masked(str(self.repository.path))}: the repository was closed; this commit of session "
                f"{rows.session_id} was not written"
            )
        )
        return future

    def dropped(self, session_id: str, epoch: int) -> None:
        """A store of the session was collected without close(): release its hold. Called by a
        finalizer, in any thread, at any point of it: only a put on the SimpleQueue (reentrant);
        queued after the close it is never written, and the repository's close releases it."""
        self._queue.put((session_id, epoch))

    def close(self) -> None:
        """Write what was queued, then end the thread and its connection. Idempotent."""
        with self._lock:
            if not self.closed:
                self.closed = True
                self._queue.put(None)
        self._thread.join()
        self._drop_connection()

    def _drop_connection(self) -> None:
        connection, self.connection = self.connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.close()

    def _run(self) -> None:
        while self._round():
            pass

    def _round(self) -> bool:
        """Take everything queued and write it; False at the end marker. (A function of its own:
        no batch stays referenced while the thread waits, so a dropped store can be collected.)"""
        stopping = False
        batch: list[_Batch] = []
        dropped: list[_Dropped] = []
        item = self._queue.get()
        while True:
            if item is None:
                stopping = True
                break
            if len(item) == 2:
                dropped.append(item)
            else:
                batch.append(item)
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
        for session_id, epoch in dropped:
            self._release(session_id, epoch)
        try:
            if batch:
                self._write(batch)
        except BaseException as error:  # a bug, say: fail this batch, never the thread (every
            for _, _, future in batch:  # later commit would wait forever)
                if not future.done():
                    future.set_exception(error)
        return not stopping

    def _release(self, session_id: str, epoch: int) -> None:
        """At best effort, as `SessionRows.release` (a release that fails leaves a lease that
        runs out: the hold is forgotten, no longer renewed)."""
        try:
            SessionRows(self.repository, session_id, epoch).release(self._usable_connection())
        except Exception:
            self.repository.forget_hold(session_id, epoch)
            self._drop_connection()

    def _usable_connection(self) -> Any:
        """The writer's connection; a new one if there is none, or the server closed or spoke on
        it while idle (restarted, `pg_terminate_backend`): nothing was sent on it yet."""
        if self.connection is not None and not self.repository.usable(self.connection):
            self._drop_connection()
        if self.connection is None:
            self.connection = self.repository.connect()
        return self.connection

    def _write(self, batch: list[_Batch]) -> None:
        for attempt in (1, 2):
            try:
                with self.repository.transaction(self._usable_connection()) as connection:
                    outcomes = self.repository.write_batch(
                        connection, [(rows, lines) for rows, lines, _ in batch]
                    )
                break
            except BaseException as error:  # the transaction failed: none of it was committed, or unknown
                self._drop_connection()  # maybe broken (a restarted server): the next batch connects anew
                # A driver's error before COMMIT was sent (a SessionLogError is the commit's
                # unknown outcome, or a refusal): nothing was written, so the batch is tried once
                # more on a new connection (were it written, its fenced update would match no row).
                if attempt == 1 and isinstance(error, Exception) and not isinstance(error, SessionLogError):
                    continue
                for rows, _, future in batch:
                    future.set_exception(self._typed(error, rows.session_id))
                return
        for (rows, _, future), written in zip(batch, outcomes, strict=True):
            if isinstance(written, BaseException):
                future.set_exception(written)
            else:
                rows.advance(written)
                future.set_result(None)

    def _typed(self, error: BaseException, session_id: str) -> BaseException:
        """What a session of the failed batch is told: a driver's error as the typed one."""
        if isinstance(error, SessionLogError) or not isinstance(error, Exception):
            return error
        typed = self.repository.typed_error(error, "commit", session_id)
        if typed is None:
            return error
        typed.__cause__ = error
        return typed


async def repository_async(location: str | Path, **options: Any) -> AsyncRepository:
    """The async twin of `sessionlog.repository` (a directory or `sqlite:///...`). A directory
    also takes an async file backend (`backend="jsonl-syncfs"`) for its sessions' commits."""
    from . import repository

    backend = options.get("backend")
    writes_with = backend if backend in _SYNC_TWIN else None
    if writes_with is not None:
        options["backend"] = _SYNC_TWIN[writes_with]
    sync = await asyncio.to_thread(functools.partial(repository, location, **options))
    try:
        if isinstance(sync, DirectoryRepository):
            return AsyncDirectoryRepository(sync, writes_with)
        if isinstance(sync, SQLRepository):
            return AsyncSQLRepository(sync)  # its writer connects: that may fail
        raise TypeError(f"no async twin for {type(sync).__name__} repositories")
    except BaseException:
        await asyncio.to_thread(sync.close)
        raise
