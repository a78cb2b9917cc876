"""Repositories: many sessions in one place (`../shared/design/repositories.md`).

    repo = sessionlog.repository("sessions/")                  # a directory, jsonl-fsync files
    store = repo.create(provider="openrouter", model="m", labels=["support"])
    repo.list(status="needs-recovery")                          # summaries, never every log
    for info in repo.unfinished():                              # crashed runs, no live writer
        with repo.open(info.session_id) as store: ...           # recover each

Here: the directory repository (`directory`) and the SQLite repository (`sqlite`), with the same
methods; PostgreSQL follows on them.
"""

from __future__ import annotations

import os
from typing import Any

from .directory import DirectoryRepository
from .info import Filters, SessionInfo
from .sqlite import SQLiteRepository

__all__ = ["DirectoryRepository", "Filters", "SQLiteRepository", "SessionInfo", "repository"]


def repository(location: str | os.PathLike[str], **options: Any) -> DirectoryRepository | SQLiteRepository:
    """The repository at `location`: a directory path (or a `file://` URL) holding one session
    file per session (`backend=` names the file backend, default `jsonl-fsync`), or
    `sqlite:///path.db`, one SQLite file holding many sessions (`durability=` `power`, the
    default, or `process`)."""
    text = os.fspath(location)
    if "://" not in text:
        return DirectoryRepository(text, **options)
    scheme, _, rest = text.partition("://")
    if scheme == "file":
        return DirectoryRepository(rest, **options)
    if scheme == "sqlite":
        return SQLiteRepository(rest, **options)
    raise ValueError(f"no repository for {scheme}:// URLs in this build (a directory or sqlite:/// works)")
