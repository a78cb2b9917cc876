"""The files a session file's writers keep beside it, and how their leftovers are found: a
temporary under construction (`.NAME.PID.RANDOM.PURPOSE`: a create, a convert, a snapshot being
written), the snapshot (`.NAME.snapshot`, `core.snapshot`), and whether the process a temporary
names is still alive (its work in progress stays; a killed one's is removed)."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from ..core.regular_files import open_regular


def temporary_path(path: Path, purpose: str) -> Path:
    """A fresh temporary name next to `path`: `.NAME.PID.RANDOM.PURPOSE`, never reused."""
    return path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.{purpose}"


def remove_stale_temporaries(path: Path) -> None:
    """Remove the temporaries of `path` whose process is gone (killed during a create, a convert
    or a quarantine): `.NAME.PID.RANDOM.PURPOSE`, and those nested in them (the create of a
    convert's temporary) or of a side file (`NAME.quarantine.N`). Those of a live process are
    its work in progress and stay."""
    marker = f".{path.name}."
    try:
        names = [entry.name for entry in os.scandir(path.parent) if marker in entry.name]
    except OSError:
        return
    for name in names:
        parts = name.split(".")
        if len(parts) < 5 or not name.startswith(".") or parts[-1] not in _PURPOSES:
            continue
        if not parts[-3].isdigit() or process_alive(int(parts[-3])):
            continue
        with contextlib.suppress(OSError):
            os.unlink(path.parent / name)


_PURPOSES = ("creating", "converting", "snapshotting")
SNAPSHOT_SUFFIX = ".snapshot"


def snapshot_path(path: str | os.PathLike[str]) -> Path:
    """Where the snapshot of the session file `path` is kept: `.NAME.snapshot` beside it (a
    hidden name: no listing takes it for a session, whatever suffix it looks for)."""
    path = Path(path)
    return path.parent / f".{path.name}{SNAPSHOT_SUFFIX}"


def read_snapshot_file(path: str | os.PathLike[str]) -> bytes | None:
    """The snapshot of the session file `path`; None when there is none (or it is no regular
    file: a FIFO or a device there is never waited on, `open_regular`)."""
    opened = open_regular(snapshot_path(path))
    if opened is None:
        return None
    fd = opened[0]
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 24):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def remove_snapshot(path: str | os.PathLike[str]) -> None:
    """Remove the snapshot of the session file `path`, if there is one."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(snapshot_path(path))


def process_alive(pid: int) -> bool:
    """Whether process `pid` of this host may be running (a lingering zombie counts as running)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists, owned by someone else
    return True
