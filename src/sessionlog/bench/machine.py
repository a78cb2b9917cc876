"""What a run ran on and beside: the machine (system, versions, the filesystem under test), its
load average and the share of its CPUs other work took during the run (`other_work`), which the
report weighs before it trusts a figure (`trust`)."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import other_work


def others_share(before: dict[int, Any] | None, ours: Sequence[int], seconds: float) -> float | None:
    """The share of the machine's CPUs other work took during the run (`other_work`), None where
    it cannot be read."""
    after = other_work.processes()
    if before is None or after is None or seconds <= 0:
        return None
    return round(other_work.others_cpu_seconds(before, after, ours) / (seconds * (os.cpu_count() or 1)), 3)


def load_average() -> float | None:
    """The 1-minute load average, None where the system has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


PEER_PACKAGES = (  # the versions a run names, of those installed
    "openai-agents",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres",
    "eventsourcing",
    "sqlalchemy",
    "psycopg",
)


def machine(directory: str | None, postgres: str | None = None) -> dict[str, Any]:
    """Where and with what the run ran: the date, the system, the versions (Python, sessionlog,
    SQLite, the peers installed, the PostgreSQL server of its rows)."""
    import importlib.metadata
    import sqlite3

    libraries = {}
    for package in PEER_PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            libraries[package] = importlib.metadata.version(package)
    if postgres:
        try:
            import psycopg

            with psycopg.connect(postgres, connect_timeout=10) as connection:
                number = connection.info.server_version  # e.g. 150014
            libraries["PostgreSQL server"] = f"{number // 10000}.{number % 10000}"
        except Exception as error:  # the run had its rows; only the version is missing
            libraries["PostgreSQL server"] = f"unknown ({type(error).__name__})"

    where = directory or os.environ.get("TMPDIR", "/tmp")
    filesystem = "?"
    try:
        best = ""
        for line in Path("/proc/mounts").read_text().splitlines():
            _, point, kind, *_ = line.split()
            if Path(where).resolve().as_posix().startswith(point) and len(point) > len(best):
                best, filesystem = point, f"{kind} on {point}"
    except OSError:
        pass
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "sessionlog": importlib.metadata.version("sessionlog"),
        "sqlite": sqlite3.sqlite_version,
        "directory": where,
        "filesystem": filesystem,
        "libraries": libraries,
    }
