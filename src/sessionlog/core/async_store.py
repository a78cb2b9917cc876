"""The asyncio store: one writer task per store, a FIFO queue, group commit.

A commit is prepared (seq, ids, timestamp, validation on the live reducer) synchronously, in the
caller's task, the moment it runs: a bad transaction raises ValidationError there and never
enters the queue, and seq follows call order. The prepared line then waits in a FIFO queue. One
writer task drains it: everything queued while a write is in flight goes out as one
`backend.append_batch(lines)` (each transaction still its own line, in queue order), so many
committers share one thread hop and, in the power class, one fdatasync. A caller's await returns
after the write (and sync) covering its line returned.

Cancellation. A caller cancelled while awaiting `commit` must assume its commit LANDED. The
commit was prepared before the first suspension point, and a prepared commit is never dropped:
later commits were validated against a state that includes it. Cancelling only stops the caller
from waiting (its future is the notification, not the work); the line is written whole, in
order, unless the store is poisoned (then the commit fails for everyone, as below). To know for
certain, `await store.flush()` (or any later commit returning: the queue is FIFO); then `load()`
tells (the transaction's effects, `last_seq`). A commit wrapped in its own task and cancelled
before that task ran was never prepared and never lands. docs/async-stores.md has more.

Failure. A failed write or sync poisons the store: the batch and everything queued behind it
fail with StorePoisonedError (the failed batch may or may not be on disk; reopening tells), and
every later call fails, `load()` included: memory is never read again, so the pipeline keeps no
undo journal for queued transactions (`CommitPipeline.undoable`).
The write is never retried (after a failed fsync the kernel may have dropped the data).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from .commit import CommitPipeline, Prepared
from .errors import SessionChangedError, StoreClosedError, shown
from .framing import DEFAULT_MAX_LINE_BYTES, NUL_WINDOW
from .snapshot import worth_writing
from .state import SessionState
from .store import (
    AsyncBackend,
    BackendInfo,
    StoreStatus,
    check_max_line_bytes,
    log_snapshot_failure,
    reduce_stored_from,
    snapshot_of,
)

DEFAULT_MAX_BATCH_BYTES = NUL_WINDOW
DEFAULT_MAX_BATCH_COMMITS = 1024
STORE_OPTIONS = ("max_batch_bytes", "max_batch_commits", "max_wait_us")
# Reducing a large log blocks the event loop for a while: do it in a worker thread instead.
_REDUCE_IN_THREAD_BYTES = 1 << 20

_Queued = tuple[Prepared, asyncio.Future[list[dict[str, Any]]]]


def _check_options(
    max_batch_bytes: int, max_batch_commits: int, max_wait_us: float | None
) -> tuple[int, int, float | None]:
    for name, value in (("max_batch_bytes", max_batch_bytes), ("max_batch_commits", max_batch_commits)):
        if type(value) is not int or value < 1:
            raise ValueError(f"{name} must be a positive integer, not {shown(value)}")
    if max_batch_bytes > NUL_WINDOW:  # a reader after power loss looks no further back than that
        raise ValueError(
            f"max_batch_bytes is at most {NUL_WINDOW} (framing.NUL_WINDOW), not {max_batch_bytes}"
        )
    if max_wait_us is None:
        return max_batch_bytes, max_batch_commits, None
    if isinstance(max_wait_us, bool) or not isinstance(max_wait_us, int | float) or not max_wait_us >= 0:
        raise ValueError(f"max_wait_us must be None or a number >= 0, not {shown(max_wait_us)}")
    return max_batch_bytes, max_batch_commits, max_wait_us / 1e6


class AsyncSessionStore(StoreStatus):
    """A session open for writing through an asynchronous backend (see the module docstring).

    Batch bounds: a batch holds at most `max_batch_commits` transactions and `max_batch_bytes`
    bytes (a single larger transaction goes alone). `max_wait_us` (default None: no wait) lets the
    writer wait that long for more commits before it writes a batch that is not full; asyncio's
    timers are millisecond-grained, so small values round up. Use the store from one event loop.
    """

    def __init__(
        self,
        backend: AsyncBackend,
        pipeline: CommitPipeline,
        path: Path,
        info: BackendInfo,
        *,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        max_batch_commits: int = DEFAULT_MAX_BATCH_COMMITS,
        max_wait_us: float | None = None,
    ) -> None:
        super().__init__(path, info)
        self._max_bytes, self._max_commits, self._max_wait = _check_options(
            max_batch_bytes, max_batch_commits, max_wait_us
        )
        self._backend = backend
        self._pipeline = pipeline
        pipeline.line_facts = getattr(backend, "line_facts", False)  # lines that carry their facts
        # A failed write ends the store (poisoned, or closed as the loop goes away) and memory is
        # never read again, so queued transactions need no undo journal. Kept, it holds ~17
        # GC-tracked objects per queued commit: with 64 committers the collector then ran 5x as
        # often and cost 5-12 us per commit (measured; ~1 us without it).
        pipeline.undoable = False
        self._queue: deque[_Queued] = deque()
        self._queued_bytes = 0
        self._tail_commits = 0  # the last batch in the queue: commits and bytes
        self._tail_bytes = 0
        self._writer: asyncio.Task[None] | None = None
        self._gathering: asyncio.Future[None] | None = None  # the writer waiting for a fuller batch
        self._flushers: list[tuple[int, asyncio.Future[None]]] = []
        self._closer: asyncio.Task[None] | None = None

    @staticmethod
    def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Split keyword options into (store options: the batch bounds, backend options)."""
        store = {key: value for key, value in options.items() if key in STORE_OPTIONS}
        backend = {key: value for key, value in options.items() if key not in STORE_OPTIONS}
        return store, backend

    @staticmethod
    def check_options(store_options: Mapping[str, Any]) -> None:
        """TypeError or ValueError for store options this store does not take."""
        unknown = set(store_options) - set(STORE_OPTIONS)
        if unknown:
            raise TypeError(f"unknown store options: {', '.join(sorted(unknown))}")
        _check_options(
            store_options.get("max_batch_bytes", DEFAULT_MAX_BATCH_BYTES),
            store_options.get("max_batch_commits", DEFAULT_MAX_BATCH_COMMITS),
            store_options.get("max_wait_us"),
        )

    @classmethod
    async def open_backend(
        cls,
        backend: AsyncBackend,
        path: Path,
        info: BackendInfo,
        *,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        **store_options: Any,
    ) -> AsyncSessionStore:
        """Reduce what `backend` holds (repairing a torn tail, and in the power class a
        NUL-bearing last line) and wrap it; closes it on error. `store_options`: the batch bounds."""
        try:
            check_max_line_bytes(max_line_bytes)
            cls.check_options(store_options)
            data = await backend.read()
            snapshot = None
            read_snapshot = getattr(backend, "read_snapshot", None)
            if read_snapshot is not None:
                try:
                    snapshot = await read_snapshot()
                except Exception as error:  # a cache: never the user's error
                    log_snapshot_failure(path, "read", error)
            reduce = functools.partial(
                reduce_stored_from,
                data,
                snapshot,
                path,
                **info.nul_rule(),
                max_line_bytes=max_line_bytes,
                known=hasattr(backend, "write_snapshot"),  # what a snapshot will be checked against
            )
            if len(data) > _REDUCE_IN_THREAD_BYTES:
                pipeline, end, covered = await asyncio.to_thread(reduce)
            else:
                pipeline, end, covered = reduce()
            if end < len(data):
                await backend.truncate(end)
        except BaseException:
            await backend.close()
            raise
        store = cls(backend, pipeline, path, info, **store_options)
        store.torn_bytes = len(data) - end
        store.snapshot_lines = covered
        return store

    # -- the three methods -------------------------------------------------------------------

    async def commit(self, facts: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Commit one transaction; return its facts with seq, id and timestamp, once durable per
        the backend's class. ValidationError: rejected at once, nothing queued or written.
        A caller cancelled while waiting must assume the commit landed: it is written whole
        unless the store is poisoned (see the module docstring)."""
        if self._closed or self._poisoned is not None or self._pid != os.getpid():
            self._check()
        prepared = self._pipeline.prepare(facts, keep_state=self._starts_batch)
        size = len(prepared.line)
        if prepared.state_before is not None:
            self._tail_commits, self._tail_bytes = 1, size
        else:
            self._tail_commits += 1
            self._tail_bytes += size
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[dict[str, Any]]] = loop.create_future()
        self._queue.append((prepared, future))
        self._queued_bytes += size
        if self._writer is None:
            self._writer = loop.create_task(self._drain())
        elif self._gathering is not None and self._batch_full():
            self._release(self._gathering)
        # Cancelling the caller cancels only this future; the writer still lands the line.
        return await future

    @property
    def header(self) -> dict[str, Any]:
        """The session's header (id, createdAt, cwd, provider, model, environmentIdentity)."""
        return dict(self._pipeline.reducer.header)

    async def load(self) -> SessionState:
        """The acknowledged state: every commit whose await returned (or could have), nothing
        still queued. Reads no file."""
        self._check()
        return self._pipeline.state()

    async def flush(self) -> None:
        """Wait until every commit queued before this call has landed (or raise the
        StorePoisonedError that stopped it). Then `load()` tells what a cancelled caller got."""
        self._check()
        pipeline = self._pipeline
        target = pipeline.lines + pipeline.pending
        if pipeline.lines >= target:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flushers.append((target, waiter))
        await waiter

    async def close(self) -> None:
        """Drain the queue, then close the backend. Every queued commit lands (or fails with
        StorePoisonedError if a write fails meanwhile); none is dropped. New calls fail with
        StoreClosedError. Idempotent; cancelling close() does not stop the drain."""
        if self._pid != os.getpid():  # a fork's copy: the parent's file is not this process's
            self._closed = True
            return
        if self._closer is None:
            self._closed = True
            if self._gathering is not None:  # no more company is coming: write now
                self._release(self._gathering)
            self._closer = asyncio.get_running_loop().create_task(self._finish())
        await asyncio.shield(self._closer)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.close()

    # -- the writer --------------------------------------------------------------------------

    def _starts_batch(self, size: int) -> bool:
        """Whether a line of `size` bytes begins a new batch. The batches are decided here, as
        commits are queued, and only a batch's first commit keeps a snapshot of the state before
        it: that is what `load()` returns while the batch is in flight (`CommitPipeline.state`)."""
        return (
            not self._queue
            or self._tail_commits >= self._max_commits
            or self._tail_bytes + size > self._max_bytes
        )

    def _batch_full(self) -> bool:
        return len(self._queue) >= self._max_commits or self._queued_bytes >= self._max_bytes

    @staticmethod
    def _release(waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            waiter.set_result(None)

    async def _drain(self) -> None:
        """The writer: runs while anything is queued, then ends (the next commit starts another)."""
        batch: list[_Queued] = []
        try:
            while self._queue:
                if self._max_wait is not None and not self._closed and not self._batch_full():
                    await self._gather(self._max_wait)
                batch = self._take()
                await self._backend.append_batch([prepared.line for prepared, _ in batch])
                landed, batch = batch, []
                self._landed(landed)
        except BaseException as error:
            # A cancelled writer means an event loop shutting down (nothing else can reach this
            # private task); a worker thread may still finish the write it was waiting for.
            self._fail(batch, error)
            if not isinstance(error, Exception):
                raise
        finally:
            self._writer = None

    async def _gather(self, delay: float) -> None:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._gathering = waiter
        timer = loop.call_later(delay, self._release, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._gathering = None

    def _take(self) -> list[_Queued]:
        """The first batch of the queue: its first commit and every one that joined it."""
        queue = self._queue
        first = queue.popleft()
        batch = [first]
        size = len(first[0].line)
        while queue and queue[0][0].state_before is None:
            item = queue.popleft()
            batch.append(item)
            size += len(item[0].line)
        self._queued_bytes -= size
        return batch

    def _landed(self, batch: list[_Queued]) -> None:
        self._pipeline.acknowledge(*[prepared for prepared, _ in batch])
        for prepared, future in batch:
            if not future.done():  # a cancelled caller's future is done already
                future.set_result(prepared.facts)
        if self._flushers:
            lines = self._pipeline.lines
            waiting = []
            for target, waiter in self._flushers:
                if target <= lines:
                    self._release(waiter)
                else:
                    waiting.append((target, waiter))
            self._flushers = waiting

    def _fail(self, batch: list[_Queued], error: BaseException) -> None:
        """Fail `batch` (its write failed or was interrupted: poisoned) and everything queued
        behind it (never written). Every later call raises, so the pipeline, which holds them
        and cannot undo them (`undoable=False`), is never read again."""
        queued = list(self._queue)
        self._queue.clear()
        self._queued_bytes = 0
        cancelled = isinstance(error, asyncio.CancelledError)
        if batch or not cancelled:
            self._poisoned = error
        else:
            self._closed = True  # the loop is going away; the file holds exactly what was acknowledged
        # Refused before anything was sent (the hold was lost, the repository closed): known.
        unwritten = isinstance(error, SessionChangedError | StoreClosedError)
        outcome = "was not written" if unwritten else "may or may not be on disk (reopen to find out)"
        for prepared, future in batch:
            if not future.done():
                what = "the writer was cancelled during this write" if cancelled else "this write failed"
                future.set_exception(
                    self._poison_error(
                        f"seq {prepared.facts[0]['seq']}: {what} ({error!r}); the store is poisoned and "
                        f"this commit {outcome}"
                    )
                )
        for prepared, future in queued:
            if not future.done():
                seq = prepared.facts[0]["seq"]
                future.set_exception(
                    StoreClosedError(
                        f"{self.path}: seq {seq}: the store's writer was cancelled (is the event loop "
                        "closing?) before this commit was written; it is not on disk"
                    )
                    if cancelled
                    else self._poison_error(
                        f"seq {seq}: an earlier write failed ({error!r}); this commit was not written"
                    )
                )
        for _, waiter in self._flushers:
            if not waiter.done():
                waiter.set_exception(
                    self._poison_error(f"a write failed ({error!r}); the store is poisoned")
                    if self._poisoned is not None
                    else StoreClosedError(f"{self.path}: the store's writer was cancelled")
                )
        self._flushers = []

    async def _finish(self) -> None:
        try:
            while (writer := self._writer) is not None:
                await asyncio.wait((writer,))
            if self._poisoned is None and worth_writing(self._pipeline.lines, self.snapshot_lines):
                await self._write_snapshot()
        finally:
            await self._backend.close()

    async def _write_snapshot(self) -> bool:
        """The sync store's `write_snapshot` at close (`core.snapshot`): encoded in a thread (the
        store takes no more commits), failures logged and counted, never raised."""
        backend, pipeline = self._backend, self._pipeline
        write, read_prefix = getattr(backend, "write_snapshot", None), getattr(backend, "read_prefix", None)
        if write is None or read_prefix is None:
            return False
        try:
            blob = await asyncio.to_thread(snapshot_of, pipeline, await read_prefix(pipeline.length))
            if blob is None:
                return False
            await write(blob)
        except Exception as error:  # a cache: the log and the store stay as they were
            self.snapshot_failures += 1
            log_snapshot_failure(self.path, "written", error)
            return False
        self.snapshot_lines = pipeline.lines
        return True
