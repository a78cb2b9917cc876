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

from ..plugins.registry import Registry, default_registry
from .directory import DirectoryRepository
from .info import Filters, SessionInfo

__all__ = ["DirectoryRepository", "Filters", "SQLiteRepository", "SessionInfo", "repository"]


def __getattr__(name: str) -> Any:
    if name == "SQLiteRepository":  # sqlite3 only for those who use it
        from .sqlite import SQLiteRepository

        return SQLiteRepository
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def repository(location: str | os.PathLike[str], *, registry: Registry | None = None, **options: Any) -> Any:
    """The repository at `location`: a directory path (or `file://` URL) holding one session
    file per session (`backend=` names the file backend, default `jsonl-fsync`); a SQLite URL,
    one SQLite file holding many sessions, in SQLAlchemy's form (`sqlite:///relative/path.db`
    from the current directory, `sqlite:////absolute/path.db`; `durability=` `power`, the
    default, or `process`); or a scheme a plugin registered (`register_repositories`).
    `create=False`: a missing location raises RepositoryNotFoundError and nothing is created."""
    text = os.fspath(location)
    scheme, separator, rest = text.partition("://")
    if not separator:  # a path as it is (`file:name` too): never read as a URL
        from .builtin import open_directory

        return open_directory(text, **options)
    registry = registry if registry is not None else default_registry()
    return registry.repository_factory(scheme)(rest, **options)
