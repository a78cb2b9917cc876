"""Writing into a repository that import or convert may have to make: a new SQLite database is
made under a temporary name next to it, and linked to its name only when the write succeeded
and the database is closed, synced and whole in its one file. A failure or a kill leaves nothing
under the database's name (no empty database that `ls` would report as "no sessions", no -wal or
-shm); the next run removes a killed run's temporary."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..backends.side_files import temporary_path
from ..core.errors import SessionPathError
from ..maintenance import link_into_place, remove_copy, remove_stale_copies, sync_file
from ..plugins.registry import Registry
from .sessions import open_repository, sqlite_file


@contextlib.contextmanager
def writing_into(location: str, registry: Registry) -> Iterator[Any]:
    """The repository at `location`, made when missing (a new SQLite database aside, as above)."""
    file = sqlite_file(location)
    if file is None or "#" in location or os.path.lexists(file):  # refused or opened as it is
        with open_repository(location, registry, create=True) as repository:
            yield repository
        return
    destination = Path(file)
    remove_stale_copies(destination)  # of an import or a convert killed earlier
    temp = temporary_path(destination.absolute(), "converting")  # the purpose the cleaners know
    query = location.partition("?")[2]
    try:
        with open_repository(f"sqlite:///{temp}{'?' if query else ''}{query}", registry, create=True) as made:
            yield made
        settle(temp)
        link_into_place(temp, destination)
    finally:
        remove_copy(temp)  # gone once linked; after a failure, with its -wal and -shm


def settle(copy: Path) -> None:
    """The closed copy synced, whole in its one file: a SQLite copy's write-ahead log folded back
    when its last connection closed (else the file alone would lack what the log holds)."""
    wal = copy.with_name(f"{copy.name}-wal")
    if os.path.exists(wal) and os.path.getsize(wal):
        raise SessionPathError(errno.EIO, f"the copy's write-ahead log was not folded back: {wal}", str(wal))
    sync_file(copy)
    remove_copy(wal)  # an empty -wal or -shm of the closed copy, if SQLite kept them
    remove_copy(copy.with_name(f"{copy.name}-shm"))
