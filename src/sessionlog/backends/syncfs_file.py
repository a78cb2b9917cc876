"""The writer of `jsonl-syncfs`: session files whose commits share one `syncfs(2)` a round with
every other `jsonl-syncfs` session of the same filesystem on the same event loop.

A batch's lines are written on the event loop itself (a page-cache write: about a microsecond, no
thread hop; the loop blocks only while the kernel throttles dirty pages). The store then awaits
`FilesystemSync.sync()`: one thread per filesystem runs `syncfs`, which makes every file of that
filesystem durable, in rounds. A waiter is released by the first round that *started after* its
write returned (a round in flight may have passed its pages already), so a late-comer waits for
the next round, which every waiter arriving meanwhile shares: 64 sessions committing at once cost
one sync a round instead of 64.

Errors. Since Linux 5.8, syncfs reports a write-back error of any file of the filesystem to each
descriptor opened before it; the group opens its descriptor before its first session writes an
unsynced byte. A failed round fails its waiters (their stores poison themselves) and poisons the
group: it never calls syncfs again (a retry could report success for pages the kernel dropped),
and every later commit of its sessions fails. Once the last of them closed, sessions opened
afterwards start a new group. An error in another application's file of the same filesystem fails
these commits too: a false alarm, never a lost commit.

Cost to the host: syncfs flushes everything dirty on the filesystem, not only the sessions. Give
the sessions a filesystem where nothing else writes much, or a round waits for the rest.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import os
import re
import threading
import weakref
from pathlib import Path
from typing import Any

from ..core.errors import DurabilityUnavailableError
from .async_file import AsyncJsonlFile
from .jsonl_file import FileOps

_Key = tuple[asyncio.AbstractEventLoop, int, FileOps]
_groups: dict[_Key, FilesystemSync] = {}
_groups_lock = threading.Lock()


def refusal(sysname: str, release: str) -> str | None:
    """Why syncfs cannot be trusted on this system (None: it can): not Linux, or a Linux before
    5.8, whose syncfs reports no write-back error."""
    found = re.match(r"(\d+)\.(\d+)", release)
    if sysname == "Linux" and found and (int(found[1]), int(found[2])) >= (5, 8):
        return None
    return (
        f"jsonl-syncfs needs Linux 5.8 or later (its syncfs reports write-back errors); this is "
        f"{sysname} {release}: use jsonl-group"
    )


def check_kernel() -> None:
    """DurabilityUnavailableError unless this kernel's syncfs can be trusted (`refusal`)."""
    system = os.uname()
    reason = refusal(system.sysname, system.release)
    if reason is not None:
        raise DurabilityUnavailableError(reason)


class FilesystemSync:
    """The syncfs rounds of one filesystem for the sessions of one event loop (see the module
    docstring). `join` and `leave` count its sessions; the last to leave closes it."""

    def __init__(self, key: _Key, directory: Path, ops: FileOps) -> None:
        self._key = key
        self._loop = key[0]
        self._ops = ops
        self._fd = ops.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sessionlog-syncfs")
        self._members = 0
        self._running = False  # a round is in flight
        self._next: asyncio.Future[None] | None = None  # the round after it, its waiters so far
        self._failed: BaseException | None = None

    @classmethod
    def join(cls, directory: Path, device: int, ops: FileOps) -> FilesystemSync:
        """The group of `device` on the running loop (made, with its descriptor, if none)."""
        check_kernel()
        key = (asyncio.get_running_loop(), device, ops)
        with _groups_lock:
            group = _groups.get(key)
            if group is None:
                group = _groups[key] = cls(key, directory, ops)
            group._members += 1
            return group

    def leave(self) -> None:
        with _groups_lock:
            self._members -= 1
            if self._members > 0:
                return
            del _groups[self._key]
        self._thread.submit(_close_quietly, self._fd)  # after a round still in flight
        self._thread.shutdown(wait=False)

    def check(self) -> None:
        """OSError once a syncfs of the group failed: nothing more is written, nothing synced."""
        if self._failed is not None:
            raise OSError(
                errno.EIO,
                f"an earlier syncfs of this filesystem failed ({self._failed}); it is never retried",
            ) from self._failed

    async def sync(self) -> None:
        """Return once a syncfs that started after this call returned; OSError if it failed."""
        self.check()
        round_ = self._next
        if round_ is None:
            round_ = self._next = self._loop.create_future()
            if not self._running:
                self._start()
        await asyncio.shield(round_)  # a cancelled waiter must not cancel the others' round

    def _start(self) -> None:
        waiting, self._next = self._next, None
        assert waiting is not None
        self._running = True
        running = self._loop.run_in_executor(self._thread, self._ops.syncfs, self._fd)
        running.add_done_callback(lambda done: self._finished(done, waiting))

    def _finished(self, done: asyncio.Future[None], waiting: asyncio.Future[None]) -> None:
        self._running = False
        error = done.exception() if not done.cancelled() else OSError(errno.EIO, "syncfs cancelled")
        if error is None:
            waiting.set_result(None)
            if self._next is not None:
                self._start()
            return
        self._failed = error
        waiting.set_exception(error)
        if self._next is not None:
            self._next.set_exception(OSError(errno.EIO, f"syncfs failed ({error}); never retried"))
            self._next = None


def _close_quietly(fd: int) -> None:
    """The group's directory descriptor: it holds no session data, and Linux frees it even when
    close reports an error."""
    with contextlib.suppress(OSError):
        os.close(fd)


class SyncfsFile(AsyncJsonlFile):
    """A `JsonlFile` (created and repaired with fsyncs, as `jsonl-group`) whose batches are written
    on the loop and made durable by its filesystem's shared syncfs rounds."""

    group: FilesystemSync | None = None
    # Leaves the group once: at close, or when the object is dropped unclosed.
    _leave: weakref.finalize[[], SyncfsFile] | None = None

    @classmethod
    async def open(
        cls, path: Path, *, create: bytes | None, sync: bool, ops: FileOps, options: dict[str, Any]
    ) -> AsyncJsonlFile:
        opened = await super().open(path, create=create, sync=sync, ops=ops, options=options)
        assert isinstance(opened, SyncfsFile)
        try:
            group = opened.group = FilesystemSync.join(opened.file.path.parent, opened.file.device, ops)
        except BaseException:
            await opened.close()
            raise
        opened._leave = weakref.finalize(opened, group.leave)
        return opened

    async def append_batch(self, lines: list[bytes]) -> None:
        group = self.group
        assert group is not None
        group.check()
        with self._lock:
            self.file.write_unsynced(lines)
        await group.sync()

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            if self._leave is not None:
                self._leave()
