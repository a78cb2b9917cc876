"""What is SQLite's own in the holds of its sessions: the lease in SQL, and which sessions this
process holds.

A session's row names its writer (`host:pid`) and, from schema version 3, when its lease ends
(`lease_expires_at`, ms since the epoch, on SQLite's clock). A holder is live while its lease
runs; one of this host is also known gone at once when its process ended; a row without a lease
(written by an older sessionlog) is held until taken over (`open(..., take_over=True)`). So a
writer in another container, or on this host under another name before a restart, holds its
sessions only for `LEASE_MS` after it stopped renewing.

Leases are renewed by each commit (in the commit's own update of the summary row) and by the
heartbeat of the repository holding them (`leases.Heartbeat`, every third of the lease), with
`RENEW`: fenced on the writer epoch and the writer, it never extends a hold another writer has
taken since (that writer's hold is lost, and its next commit refused before anything is written).

A row naming this process is held only if one of its repositories of that database holds the
session (`held_here`): a store whose release could not be written (a full disk) or that was
dropped leaves a row naming a live process, but no hold. A fork's child holds none of its
parent's sessions (`leases` marks them lost in the child, which renews none of them).
"""

from __future__ import annotations

import os
import socket
import threading
import weakref
from collections import defaultdict

from .leases import Heartbeat

LEASE_MS = 30_000
NOW_MS = "cast((julianday('now') - 2440587.5) * 86400000 as integer)"  # SQLite's clock, every version
LEASE_END = f"{NOW_MS} + {LEASE_MS}"
# The writer of a row while its lease runs (NULL once it ran out): the `held` of `sql.statements`.
LIVE_WRITER = (
    "case when writer is not null and (lease_expires_at is null "
    f"or lease_expires_at > {NOW_MS}) then writer end"
)
RENEW = (
    f"update sessions set lease_expires_at = {LEASE_END} "
    "where session_id = ? and writer_epoch = ? and writer = ?"
)

# The heartbeats of this process's repositories, by database (its resolved path).
_HEARTBEATS: defaultdict[str, weakref.WeakSet[Heartbeat]] = defaultdict(weakref.WeakSet)
_guard = threading.Lock()


def me() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def register(database: str, heartbeat: Heartbeat) -> None:
    """`heartbeat` holds sessions of `database` for this process."""
    with _guard:
        _HEARTBEATS[database].add(heartbeat)


def held_here(database: str, session_id: str) -> bool:
    """Whether a repository of this process holds the session (its hold not lost)."""
    with _guard:
        heartbeats = list(_HEARTBEATS.get(database, ()))
    return any(key[0] == session_id for heartbeat in heartbeats for key in heartbeat.held())


def _in_a_fork() -> None:
    global _guard
    _guard = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_in_a_fork)
