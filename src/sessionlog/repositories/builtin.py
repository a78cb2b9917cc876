"""The built-in repositories, registered through the same hook as a third party's: `file` (a
directory: also any location without `://`), `sqlite` and `postgresql` (or `postgres`).
Imported with the registry, so the openers import their modules (sqlite3, psycopg) only when a
repository is opened."""

from __future__ import annotations

from typing import Any

from ..plugins.hookspecs import hookimpl


def open_directory(location: str, **options: Any) -> Any:
    from .directory import DirectoryRepository

    return DirectoryRepository(location, **options)


def open_sqlite(location: str, **options: Any) -> Any:
    """SQLAlchemy's form: `sqlite:///relative/path.db` (from the current directory),
    `sqlite:////absolute/path.db`; `?durability=process` for the process class, as `durability=`.
    `location` is what follows `sqlite://`: an empty host, then `/`, then the path."""
    from urllib.parse import parse_qsl

    from ..core.errors import shown
    from .sqlite import SQLiteRepository

    path, _, query = location.partition("?")
    if not path.startswith("/") or path == "/":
        raise ValueError(
            "a SQLite URL is sqlite:///relative/path.db or sqlite:////absolute/path.db, "
            f"not sqlite://{shown(path)}"
        )
    return SQLiteRepository(path[1:], **{**dict(parse_qsl(query, strict_parsing=bool(query))), **options})


def open_postgres(location: str, **options: Any) -> Any:
    """`postgresql://user@host/db?sslmode=...`: the URL goes to libpq whole (`durability=` and
    the other options are keywords)."""
    from .postgres import PostgresRepository

    return PostgresRepository(f"postgresql://{location}", **options)


@hookimpl
def register_repositories(register: Any) -> None:
    register("file", open_directory)
    register("sqlite", open_sqlite)
    register("postgresql", open_postgres)
    register("postgres", open_postgres)
