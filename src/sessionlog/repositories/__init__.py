"""Repositories: many sessions in one place (`../shared/design/repositories.md`).

    repo = sessionlog.repository("sessions/")                  # a directory, jsonl-fsync files
    store = repo.create(provider="openrouter", model="m", labels=["support"])
    repo.list(status="needs-recovery")                          # summaries, never every log
    for info in repo.unfinished():                              # crashed runs, no live writer
        with repo.open(info.session_id) as store: ...           # recover each

This slice has the directory repository (`directory.DirectoryRepository`); SQLite and
PostgreSQL repositories follow on the same methods.
"""

from __future__ import annotations

import os
from typing import Any

from .directory import DirectoryRepository
from .info import Filters, SessionInfo

__all__ = ["DirectoryRepository", "Filters", "SessionInfo", "repository"]


def repository(location: str | os.PathLike[str], **options: Any) -> DirectoryRepository:
    """The repository at `location`: a directory path (or a `file://` URL) holding one session
    file per session; `backend=` names the file backend (default `jsonl-fsync`)."""
    text = os.fspath(location)
    if "://" in text:
        scheme, _, rest = text.partition("://")
        if scheme != "file":
            raise ValueError(f"no repository for {scheme}:// URLs in this build (a directory path works)")
        text = rest
    return DirectoryRepository(text, **options)
