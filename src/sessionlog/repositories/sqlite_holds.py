"""The holds of SQLite sessions: which ones this process holds, and their leases.

A session's row names its writer (`host:pid`) and, from schema version 3, when its lease ends
(`lease_expires_at`, ms since the epoch). A holder is live while its lease runs; one of this
host is also known gone at once when its process ended; a row without a lease (written by an
older sessionlog) is held until taken over (`open(..., take_over=True)`). So a writer in
another container, or on this host under another name before a restart, holds its sessions
only for `LEASE_MS` after it stopped renewing.

Leases are renewed by each commit (in the commit's own update of the summary row) and by a
heartbeat: one daemon thread per process, running while the process holds any SQLite session,
renews every held session's lease every `RENEW_SECONDS` (a third of the lease), so a writer
waiting minutes on a model call keeps its sessions. A renewal is fenced on the writer epoch: it
never extends a hold another writer has taken since. A writer stopped past its lease (a paused
process) may be taken over; its next commit is then fenced by the epoch, writing nothing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import threading
import time
import urllib.parse
from collections import defaultdict

LEASE_MS = 30_000
RENEW_SECONDS = LEASE_MS / 3000
NOW_MS = "cast((julianday('now') - 2440587.5) * 86400000 as integer)"  # SQLite's clock, every version
LEASE_END = f"{NOW_MS} + {LEASE_MS}"
# The writer of a row while its lease runs (NULL once it ran out): the `held` of `sql.statements`.
LIVE_WRITER = (
    "case when writer is not null and (lease_expires_at is null "
    f"or lease_expires_at > {NOW_MS}) then writer end"
)
_RENEW = (
    f"update sessions set lease_expires_at = {LEASE_END} "
    "where session_id = ? and writer_epoch = ? and writer = ?"
)

# The sessions this process holds open for writing: (database, session id) -> writer epoch. A row
# naming this process as its writer is held only if it is here: a store whose release could not
# be written (a full disk) or that was dropped leaves a row naming a live process, but no hold.
HELD: dict[tuple[str, str], int] = {}
_guard = threading.Lock()
_heartbeat: threading.Thread | None = None


def me() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def hold(key: tuple[str, str], epoch: int) -> None:
    """This process holds session `key` at `epoch`: renew its lease until `forget`."""
    global _heartbeat
    with _guard:
        HELD[key] = epoch
        if _heartbeat is None:
            _heartbeat = threading.Thread(target=_beat, name="sessionlog-sqlite-leases", daemon=True)
            _heartbeat.start()


def forget(key: tuple[str, str], epoch: int) -> None:
    """This process no longer holds the session (its row may still name it)."""
    with _guard:
        if HELD.get(key) == epoch:
            del HELD[key]


def renew() -> None:
    """One heartbeat: every held session's lease renewed, one transaction per database; a
    database busy for a few seconds or failing is tried again at the next beat."""
    with _guard:
        by_database: dict[str, list[tuple[str, int, str]]] = defaultdict(list)
        for (database, session_id), epoch in HELD.items():
            by_database[database].append((session_id, epoch, me()))
    for database, rows in by_database.items():
        uri = f"file:{urllib.parse.quote(database)}?mode=rw"  # never creates a database removed meanwhile
        with (
            contextlib.suppress(sqlite3.Error),
            contextlib.closing(
                sqlite3.connect(uri, uri=True, isolation_level=None, timeout=5.0)
            ) as connection,
        ):
            connection.execute("begin immediate")
            connection.executemany(_RENEW, rows)
            connection.execute("commit")


def _beat() -> None:
    global _heartbeat
    pid = os.getpid()
    while True:
        time.sleep(RENEW_SECONDS)
        with _guard:
            if not HELD or pid != os.getpid():
                _heartbeat = None
                return
        renew()


def _in_a_fork() -> None:
    """A fork's child holds none of its parent's sessions, and has no heartbeat thread."""
    global _heartbeat, _guard
    _guard = threading.Lock()
    HELD.clear()
    _heartbeat = None


os.register_at_fork(after_in_child=_in_a_fork)
