"""`jsonl-async`: asyncio, process class. The JSONL writer core driven through aiofiles.

`backends.async_file.AsyncJsonlFile` moves the bytes (one executor hop per call, one write per
batch); the store in `core.async_store` queues the commits and decides what a batch is.

An acknowledged `jsonl-async` commit is in the kernel: it survives kill -9, not power loss.
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
    "jsonl-async",
    "process",
    "async",
    "JSONL file via aiofiles; concurrent commits share one write",
    plain_file=True,
)


async def open_jsonl_async(
    path: Path, *, create: bytes | None = None, ops: FileOps = DEFAULT_OPS, **options: Any
) -> AsyncJsonlFile:
    from .async_file import AsyncJsonlFile  # asyncio and aiofiles only for async users

    return await AsyncJsonlFile.open(path, create=create, sync=False, ops=ops, options=options)


@hookimpl
def register_backends(register: Register) -> None:
    register(INFO.name, open_jsonl_async, INFO)
