"""`convert`: copy a session into another backend, every committed line byte for byte."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..backends.jsonl_file import remove_stale_temporaries, temporary_path
from ..core.errors import (
    SessionExistsError,
)
from ..core.framing import lines
from ..maintenance import link_into_place, sync_file
from ..plugins.registry import Registry
from .output import Progress, out
from .sessions import Mismatch, UsageError, load_session, open_repository

_CHUNK_BYTES = 4 << 20


_CHUNK_LINES = 1024


def _chunks(body: list[bytes]) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    size = 0
    for line in body:
        if chunk and (size + len(line) > _CHUNK_BYTES or len(chunk) >= _CHUNK_LINES):
            yield chunk
            chunk, size = [], 0
        chunk.append(line)
        size += len(line)
    if chunk:
        yield chunk


def _write_sync(backend: Any, body: list[bytes], progress: Progress) -> None:
    written = 0
    many = getattr(backend, "append_many", None)  # the file backends write many lines at once
    for chunk in _chunks(body):
        if many is not None:
            many(chunk)
        else:
            for line in chunk:
                backend.append(line)
        written += sum(len(line) for line in chunk)
        progress.update(written)


async def _write_async(backend: Any, body: list[bytes], progress: Progress) -> None:
    written = 0
    for chunk in _chunks(body):
        await backend.append_batch(chunk)
        written += sum(len(line) for line in chunk)
        progress.update(written)


def is_repository(location: str) -> bool:
    """A URL (`sqlite:///...`) or an existing directory: a place of many sessions."""
    return "://" in location or os.path.isdir(location)


def cmd_convert(args: argparse.Namespace, registry: Registry) -> int:
    if is_repository(args.dst):
        return _into_repository(args, registry)
    if args.to is None:
        raise UsageError(f"--to BACKEND is needed: {args.dst} is not a repository (a directory or a URL)")
    info = registry.info(args.to)  # an unknown target is a usage error before anything is read
    destination = Path(args.dst)
    if info.plain_file:
        remove_stale_temporaries(destination)  # of a convert killed earlier
        if os.path.lexists(destination):
            raise SessionExistsError(
                errno.EEXIST, f"a session already exists: {destination}", str(destination)
            )
    data, state = load_session(args.src, args.backend, registry, args.progress)  # all valid from here on
    end = state.repaired_length
    header_end = data.index(b"\n") + 1
    body = [data[start : start + len(raw) + 1] for _, start, raw in lines(data, end)][1:]
    # A file target is written under a temporary name and linked into place when complete and
    # synced: a kill leaves no partial copy under the destination's name.
    target = temporary_path(destination, "converting") if info.plain_file else destination
    progress = Progress(args.progress, f"writing {args.dst}", end - header_end)
    try:
        _copy(registry, args.to, target, data[:header_end], body, progress)
        progress.close()
        if info.plain_file:
            sync_file(target)
        converted = load_session(str(target), args.to, registry, args.progress)[1]
        if converted != state:
            raise Mismatch(f"{args.dst}: the converted session does not reduce to the state of {args.src}")
        if info.plain_file:
            link_into_place(target, destination)
    except BaseException:
        progress.close()
        if info.plain_file:
            with contextlib.suppress(OSError):
                target.unlink()
        raise
    torn = len(data) - end
    note = f"; dropped a torn tail of {torn:,} bytes (uncommitted)" if torn else ""
    out(
        f"converted {args.src} ({args.backend}) -> {args.dst} ({args.to}): "
        f"{len(body):,} transactions, last seq {state.last_seq}, {end:,} bytes{note}"
    )
    return 0


def _copy(
    registry: Registry, backend: str, path: Path, header: bytes, body: list[bytes], progress: Progress
) -> None:
    """Create the session at `path` with the source's header line, then store the source's
    committed lines unchanged: seq, ids and timestamps stay exactly."""
    factory = registry.factory(backend)
    if registry.info(backend).api == "sync":
        opened = factory(path, create=header)
        try:
            _write_sync(opened, body, progress)
        finally:
            opened.close()
        return

    async def copy_async() -> None:
        opened = await factory(path, create=header)
        try:
            await _write_async(opened, body, progress)
        finally:
            await opened.close()

    asyncio.run(copy_async())


def _into_repository(args: argparse.Namespace, registry: Registry) -> int:
    """Import the committed bytes of SRC into the repository DST, under the session's own id: the
    repository validates them and refuses an id it holds already; nothing is stored partly."""
    if args.to is not None:
        raise UsageError(f"{args.dst} is a repository: it chooses how it stores sessions (drop --to)")
    data, state = load_session(args.src, args.backend, registry, args.progress)
    with open_repository(args.dst, registry, create=True) as repository:
        session_id = repository.import_(data[: state.repaired_length])
        if repository.load(session_id) != state:
            raise Mismatch(f"{args.dst}#{session_id} does not reduce to the state of {args.src}")
    out(
        f"converted {args.src} -> {args.dst}#{session_id}: last seq {state.last_seq}, "
        f"{state.repaired_length:,} bytes"
    )
    return 0
