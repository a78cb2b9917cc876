"""`jsonl-group`: asyncio, power class. Group commit on the JSONL writer core.

The store's writer takes every commit queued while the previous batch was being written and
hands them over as one batch; here that batch is one write loop and one `fdatasync`, in one
executor hop. A commit is acknowledged only after the fdatasync covering its line returned, so
every acknowledged commit survives power loss (assuming the drive honours flushes); the create
fsyncs the file and its directory. A failed write or sync poisons the store, which never calls
again: the fsync is not retried. The batch bounds (`max_batch_bytes`, `max_batch_commits`,
`max_wait_us`) are store options, see `core.async_store`.
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
    "jsonl-group",
    "power",
    "async",
    "JSONL file, group commit: one write + fdatasync per batch",
    group_commit=True,
    plain_file=True,
)


async def open_jsonl_group(
    path: Path, *, create: bytes | None = None, ops: FileOps = DEFAULT_OPS, **options: Any
) -> AsyncJsonlFile:
    from .async_file import AsyncJsonlFile  # asyncio and aiofiles only for async users

    return await AsyncJsonlFile.open(path, create=create, sync=True, ops=ops, options=options)


@hookimpl
def register_backends(register: Register) -> None:
    register(INFO.name, open_jsonl_group, INFO)
