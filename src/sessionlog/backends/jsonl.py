"""`jsonl`: sync, process class. One write of the whole line per commit, no sync: an acknowledged
commit is in the kernel and survives kill -9, not power loss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.store import BackendInfo
from ..plugins.hookspecs import Register, hookimpl
from .jsonl_file import DEFAULT_OPS, FileOps, JsonlFile, open_file

INFO = BackendInfo("jsonl", "process", "sync", "JSONL file, one write per commit, no fsync", plain_file=True)


def open_jsonl(
    path: Path, *, create: bytes | None = None, ops: FileOps = DEFAULT_OPS, **options: Any
) -> JsonlFile:
    return open_file(path, create, sync=False, ops=ops, options=options)


@hookimpl
def register_backends(register: Register) -> None:
    register(INFO.name, open_jsonl, INFO)
