"""`jsonl-fsync`: sync, power class. As `jsonl`, then `fdatasync` before the commit returns; the
create fsyncs the file and its directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.store import BackendInfo
from ..plugins.hookspecs import Register, hookimpl
from .jsonl_file import DEFAULT_OPS, FileOps, JsonlFile, open_file

INFO = BackendInfo(
    "jsonl-fsync", "power", "sync", "JSONL file, one write + fdatasync per commit", plain_file=True
)


def open_jsonl_fsync(
    path: Path, *, create: bytes | None = None, ops: FileOps = DEFAULT_OPS, **options: Any
) -> JsonlFile:
    return open_file(path, create, sync=True, ops=ops, options=options)


@hookimpl
def register_backends(register: Register) -> None:
    register(INFO.name, open_jsonl_fsync, INFO)
