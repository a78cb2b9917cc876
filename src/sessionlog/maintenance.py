"""What an operator does to a session file besides committing: set a corrupt tail aside, and
write a whole copy into place atomically. Both hold the session's writer lock while they work,
and both leave either the old state or the new one after a crash, never a mix.

Quarantine (`sessionlog repair --quarantine`, never a default): a log refused as corrupt is cut
at its first bad line; everything from there moves into a side file next to the session
(`NAME.quarantine.<offset>`, created and synced before the session is truncated), so that the
session opens again and nothing is destroyed. A kill between the two steps leaves the side file
and the intact session: running it again finds the same cut and a side file already there.

Copy into place (`sessionlog convert` to a file backend or a new SQLite database, `export -o`):
the copy is written to a temporary file next to the destination, synced, and linked to its name
only when complete, as `create` does; a failure removes its temporary, and a kill leaves no
destination and a temporary that the next copy to that destination removes
(`remove_stale_copies`), as the next create or open of a session removes a dead create's.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .backends.jsonl_file import DEFAULT_OPS, JsonlFile, read_session_file
from .backends.side_files import process_alive, remove_stale_temporaries, temporary_path
from .core.errors import CorruptionError, SessionExistsError
from .core.framing import lines
from .core.loading import valid_prefix


@dataclass(frozen=True)
class Quarantine:
    """What `quarantine` moved (or would move): bytes from `offset` on, `lines` lines (the last
    one possibly without LF), the seqs found in them, into `side_file`, because of `error`."""

    path: Path
    side_file: Path
    offset: int
    moved_bytes: int
    lines: int
    first_line: int
    seqs: tuple[int, int] | None
    error: CorruptionError


def quarantine(path: Path, rule: dict[str, Any], *, dry_run: bool = False) -> Quarantine | None:
    """Set aside everything from the first bad line of the session at `path` (see the module
    docstring); None when the log is valid. CorruptionError when the header itself is bad (there
    is nothing left that would open). Takes the writer lock: SessionLockedError while in use;
    a `dry_run` only reads (no lock, nothing written or removed) and says what it would do."""
    if dry_run:
        return _planned(path, read_session_file(path), rule)
    file = JsonlFile.open(path, sync=True)
    try:
        data = file.read()
        remove_stale_temporaries(path)  # of an earlier quarantine killed while it wrote
        report = _planned(path, data, rule)
        if report is not None:
            _write_side_file(report.side_file, data[report.offset :])
            file.truncate(report.offset)  # synced: the session opens from here on
        return report
    finally:
        file.close()


def _planned(path: Path, data: bytes, rule: dict[str, Any]) -> Quarantine | None:
    """What a quarantine of `data` (the bytes of `path`) moves; None when it is valid."""
    offset, error = valid_prefix(data, **rule)
    if error is None:
        return None
    if offset == 0:
        raise error.located(path)
    moved = data[offset:]
    return Quarantine(
        path,
        path.with_name(f"{path.name}.quarantine.{offset}"),
        offset,
        len(moved),
        moved.count(b"\n") + (not moved.endswith(b"\n")),
        data.count(b"\n", 0, offset) + 1,
        _seqs(moved),
        error.located(path),
    )


def _seqs(moved: bytes) -> tuple[int, int] | None:
    """The first and last seq of the moved lines that still parse (best effort: they are bad)."""
    found: list[int] = []
    for _, _, raw in lines(moved, len(moved)):
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        for fact in value if type(value) is list else [value]:
            if type(fact) is dict and type(fact.get("seq")) is int:
                found.append(fact["seq"])
    return (min(found), max(found)) if found else None


def _write_side_file(side: Path, data: bytes) -> None:
    """Create `side` holding `data`, synced with its directory entry; an identical one from an
    interrupted earlier run is kept, a different one is never overwritten."""
    try:
        existing = side.read_bytes()
    except FileNotFoundError:
        existing = None
    if existing is not None:
        if existing == data:
            return
        raise SessionExistsError(
            errno.EEXIST, f"a different quarantine file is already there: {side}", str(side)
        )
    write_into_place(side, data)


def remove_stale_copies(destination: Path) -> None:
    """Remove what copies into `destination` killed earlier left next to it: their temporaries
    (`remove_stale_temporaries`: `.NAME.PID.RANDOM.converting`) and, of a SQLite copy, its
    `-wal`, `-shm` and `-journal`. Those of a live process are its work in progress and stay."""
    remove_stale_temporaries(destination)
    marker = f".{destination.name}."
    try:
        names = [entry.name for entry in os.scandir(destination.parent) if entry.name.startswith(marker)]
    except OSError:
        return
    for name in names:
        base, _, suffix = name.rpartition("-")
        parts = base.split(".")
        if suffix not in ("wal", "shm", "journal") or parts[-1] != "converting" or len(parts) < 5:
            continue
        if parts[-3].isdigit() and not process_alive(int(parts[-3])):
            with contextlib.suppress(OSError):
                os.unlink(destination.parent / name)


def remove_copy(temp: Path) -> None:
    """Remove a copy's temporary and, when it is a SQLite database, its -wal, -shm, -journal."""
    for path in (temp, *(temp.with_name(f"{temp.name}-{suffix}") for suffix in ("wal", "shm", "journal"))):
        with contextlib.suppress(OSError):
            path.unlink()


def write_into_place(destination: Path, data: bytes) -> None:
    """Write a new file atomically: a temporary next to it, synced, linked to its name (which
    must not exist: SessionExistsError), the directory synced."""
    temp = temporary_path(destination, "converting")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:  # a full disk: the partial copy must not stay behind
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    finally:
        os.close(fd)
    link_into_place(temp, destination)


def link_into_place(temp: Path, destination: Path) -> None:
    """Give the complete, synced file `temp` its final name; the temporary name goes either way."""
    try:
        os.link(temp, destination)
    except FileExistsError:
        raise SessionExistsError(errno.EEXIST, f"already exists: {destination}", str(destination)) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)
    DEFAULT_OPS.fsync_directory(destination.parent)


def sync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
