"""What a session of a SQLite repository is as a backend (`backends.sqlite` opens one by path,
`repositories.sqlite` names them): the four SQLite backends' infos, by durability and API."""

from __future__ import annotations

from ..core.store import BackendInfo

INFOS = {
    ("power", "sync"): BackendInfo(
        "sqlite",
        "power",
        "sync",
        "SQLite WAL, synchronous=FULL, one row per transaction",
        opens_read_only=True,
        single_file=True,
    ),
    ("process", "sync"): BackendInfo(
        "sqlite-normal",
        "process",
        "sync",
        "SQLite WAL, synchronous=NORMAL, one row per transaction",
        opens_read_only=True,
        single_file=True,
    ),
    ("power", "async"): BackendInfo(
        "sqlite-async",
        "power",
        "async",
        "SQLite WAL, synchronous=FULL, commits batched by a writer thread",
        opens_read_only=True,
        single_file=True,
    ),
    ("process", "async"): BackendInfo(
        "sqlite-normal-async",
        "process",
        "async",
        "SQLite WAL, synchronous=NORMAL, commits batched by a writer thread",
        opens_read_only=True,
        single_file=True,
    ),
}
