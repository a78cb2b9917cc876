"""`jsonl-syncfs`: asyncio, power class. Group commit across sessions, for a process running many.

As `jsonl-group`, each store writes every commit queued meanwhile as one batch; but the batch is
written on the event loop and made durable by one `syncfs(2)` of the whole filesystem, shared by
every `jsonl-syncfs` session of that filesystem on that loop (`syncfs_file` has the rounds). A
commit is acknowledged only after a syncfs that started after its line was written returned, so
every acknowledged commit survives power loss (assuming the drive honours flushes); the create
fsyncs the file and its directory. A failed write poisons its store; a failed syncfs poisons every
session of the round and of its filesystem's group, and is never retried.

Linux 5.8 or later only (`DurabilityUnavailableError` elsewhere). syncfs flushes everything dirty
on the filesystem: for predictable commits, keep the sessions where nothing else writes much.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.store import BackendInfo
from ..plugins.hookspecs import Register, hookimpl
from .jsonl_file import DEFAULT_OPS, FileOps

if TYPE_CHECKING:
    from .async_file import AsyncJsonlFile

INFO = BackendInfo(
    "jsonl-syncfs",
    "power",
    "async",
    "JSONL file, group commit across sessions: one syncfs a round for every session of the filesystem",
    group_commit=True,
    plain_file=True,
    syncs_filesystem=True,
)


async def open_jsonl_syncfs(
    path: Path, *, create: bytes | None = None, ops: FileOps = DEFAULT_OPS, **options: Any
) -> AsyncJsonlFile:
    from .syncfs_file import SyncfsFile, check_kernel  # asyncio and aiofiles only for async users

    check_kernel()  # before anything is created
    return await SyncfsFile.open(path, create=create, sync=True, ops=ops, options=options)


@hookimpl
def register_backends(register: Register) -> None:
    register(INFO.name, open_jsonl_syncfs, INFO)
