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

from ..backends.side_files import temporary_path
from ..core.errors import SessionExistsError, SessionLogError
from ..core.framing import lines
from ..maintenance import link_into_place, remove_copy, remove_stale_copies
from ..plugins.registry import Registry
from .new_database import settle, writing_into
from .output import Progress, out
from .sessions import Mismatch, UsageError, load_session, stored_by

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
    # A new file of its own (a session file, a new SQLite database) is written under a temporary
    # name and linked into place when complete and synced: a failure or a kill leaves nothing
    # under the destination's name. Into an existing database (or `DB#SESSION_ID`), a failure
    # deletes the session it began.
    aside = info.plain_file or (info.single_file and "#" not in args.dst and not os.path.lexists(destination))
    if aside:
        remove_stale_copies(destination)  # of a convert killed earlier
    if info.plain_file and os.path.lexists(destination):
        raise SessionExistsError(errno.EEXIST, f"a session already exists: {destination}", str(destination))
    data, state = load_session(args.src, args.backend, registry, args.progress)  # all valid from here on
    end = state.repaired_length
    header_end = data.index(b"\n") + 1
    body = [data[start : start + len(raw) + 1] for _, start, raw in lines(data, end)][1:]
    target = temporary_path(destination, "converting") if aside else destination
    database = Path(args.dst.rpartition("#")[0] or args.dst)
    made_database = not os.path.lexists(database)
    created: list[bool] = []  # the session was made: from here on a failure undoes it
    progress = Progress(args.progress, f"writing {args.dst}", end - header_end)
    try:
        _copy(registry, args.to, target, data[:header_end], body, progress, created)
        progress.close()
        converted = load_session(str(target), args.to, registry, args.progress)[1]
        if converted != state:
            raise Mismatch(f"{args.dst}: the converted session does not reduce to the state of {args.src}")
        if aside:
            settle(target)
            link_into_place(target, destination)
    except BaseException:
        progress.close()
        if aside:
            remove_copy(target)
        elif info.single_file and (created or made_database):  # what it began, or the file it made
            _undo_session(database, state.session_id, made_database)
        raise
    torn = len(data) - end
    note = f"; dropped a torn tail of {torn:,} bytes (uncommitted)" if torn else ""
    out(
        f"converted {args.src} ({stored_by(args.src, args.backend, registry)}) -> {args.dst} ({args.to}): "
        f"{len(body):,} transactions, last seq {state.last_seq}, {end:,} bytes{note}"
    )
    return 0


def _undo_session(database: Path, session_id: str, made_database: bool) -> None:
    """Delete the session a failed convert began in a SQLite database (the whole database when
    the convert made it): a retry finds nothing in its way."""
    if made_database:
        remove_copy(database)
        return
    from ..repositories.sqlite import SQLiteRepository

    with contextlib.suppress(SessionLogError, OSError):
        repository = SQLiteRepository(database, create=False)
        try:
            repository.delete(session_id)
        finally:
            repository.close()


def _copy(
    registry: Registry,
    backend: str,
    path: Path,
    header: bytes,
    body: list[bytes],
    progress: Progress,
    created: list[bool],
) -> None:
    """Create the session at `path` with the source's header line, then store the source's
    committed lines unchanged: seq, ids and timestamps stay exactly."""
    factory = registry.factory(backend)
    if registry.info(backend).api == "sync":
        opened = factory(path, create=header)
        created.append(True)
        try:
            _write_sync(opened, body, progress)
        finally:
            opened.close()
        return

    async def copy_async() -> None:
        opened = await factory(path, create=header)
        created.append(True)
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
    with writing_into(args.dst, registry) as repository:
        session_id = repository.import_(data[: state.repaired_length])
        if repository.load(session_id) != state:
            repository.delete(session_id)  # all or nothing: a copy that reads back wrong goes
            raise Mismatch(f"{args.dst}#{session_id} does not reduce to the state of {args.src}")
    out(
        f"converted {args.src} -> {args.dst}#{session_id}: last seq {state.last_seq}, "
        f"{state.repaired_length:,} bytes"
    )
    return 0
