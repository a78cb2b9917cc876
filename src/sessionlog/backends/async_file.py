"""The JSONL writer core for asyncio: `AsyncJsonlFile` adapts a `JsonlFile` (atomic create,
O_NOFOLLOW, 0600, the writer lock, the `FileOps` seam) so that every method is one hop to
aiofiles' executor, and `append_batch` writes a whole batch of lines with one write loop in that
one hop (plus one fdatasync in the power class). Imported only when an async backend opens a
session, so that a sync user never loads asyncio or aiofiles.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import aiofiles.os

from .jsonl_file import FileOps, JsonlFile, open_file

_T = TypeVar("_T")


class AsyncJsonlFile:
    """A `JsonlFile` for asyncio: one executor hop per call, one write (+ one sync) per batch."""

    def __init__(self, file: JsonlFile) -> None:
        self.file = file
        # Normally the store never overlaps calls; if an event loop dies mid-write, `close`
        # must still not pull the descriptor from under the worker thread.
        self._lock = threading.Lock()
        self._read = aiofiles.os.wrap(self._locked(file.read))
        self._truncate = aiofiles.os.wrap(self._locked(file.truncate))
        self._append_many = aiofiles.os.wrap(self._locked(file.append_many))
        self._read_prefix = aiofiles.os.wrap(self._locked(file.read_prefix))
        self._read_snapshot = aiofiles.os.wrap(file.read_snapshot)
        self._write_snapshot = aiofiles.os.wrap(file.write_snapshot)

    @classmethod
    async def open(
        cls, path: Path, *, create: bytes | None, sync: bool, ops: FileOps, options: dict[str, Any]
    ) -> AsyncJsonlFile:
        """Open (`create=None`) or atomically create the session, in one hop."""
        opening = aiofiles.os.wrap(open_file)(path, create, sync=sync, ops=ops, options=options)
        task: asyncio.Future[JsonlFile] = asyncio.ensure_future(opening)
        try:
            return cls(await asyncio.shield(task))
        except asyncio.CancelledError:
            # The worker thread goes on opening: close what it opens, or the file would stay
            # claimed by this process. (A create may still have made the session file.)
            task.add_done_callback(_close_opened)
            raise

    def _locked(self, method: Callable[..., _T]) -> Callable[..., _T]:
        lock = self._lock

        def call(*args: Any) -> _T:
            with lock:
                return method(*args)

        return call

    async def read(self) -> bytes:
        return await self._read()

    async def truncate(self, length: int) -> None:
        await self._truncate(length)

    async def append_batch(self, lines: list[bytes]) -> None:
        await self._append_many(lines)

    # -- the snapshot seam (`core.store.SyncBackend`), one hop each --

    async def read_prefix(self, length: int) -> bytes:
        return await self._read_prefix(length)

    async def read_snapshot(self) -> bytes | None:
        return await self._read_snapshot()

    async def write_snapshot(self, blob: bytes) -> None:
        await self._write_snapshot(blob)

    async def close(self) -> None:
        # os.close only: no hop. The lock waits for a write a dying event loop left running.
        with self._lock:
            self.file.close()


def _close_opened(task: asyncio.Future[JsonlFile]) -> None:
    if not task.cancelled() and task.exception() is None:
        task.result().close()
