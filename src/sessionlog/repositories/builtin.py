"""The built-in repositories, registered through the same hook as a third party's: `file` (a
directory: also any location without `://`), `sqlite` and `postgresql` (or `postgres`).
Imported with the registry, so the openers import their modules (sqlite3, psycopg) only when a
repository is opened."""

from __future__ import annotations

from typing import Any

from ..plugins.hookspecs import hookimpl


def open_directory(location: str, **options: Any) -> Any:
    """A path, or what follows `file://`: an empty host or `localhost`, then the absolute path
    (`file:///srv/sessions`). A location without `://` (even `file:name`) is a path as it is."""
    from .directory import DirectoryRepository

    return DirectoryRepository(location, **options)


def open_file_url(location: str, **options: Any) -> Any:
    """What follows `file://`: the host (empty or `localhost`: a file URL of another host is
    refused, never read as a relative path), then the absolute path, percent-decoded."""
    from urllib.parse import unquote

    from ..core.errors import shown

    host, slash, path = location.partition("/")
    if host not in ("", "localhost") or not slash:
        raise ValueError(
            "a file URL is file:///absolute/path (or file://localhost/absolute/path); "
            f"no other host: not file://{shown(location)}"
        )
    return open_directory(unquote(f"/{path}", errors="strict"), **options)


SQLITE_KEYS = ("durability",)
"""What a SQLite URL's query may set (`?durability=process`); every other option is a keyword."""


def open_sqlite(location: str, **options: Any) -> Any:
    """SQLAlchemy's form: `sqlite:///relative/path.db` (from the current directory),
    `sqlite:////absolute/path.db`; `?durability=process` for the process class, as `durability=`.
    `location` is what follows `sqlite://`: an empty host, then `/`, then the path.

    The path is percent-decoded: a `#` or `?` in a file's name is written `%23`, `%3F`. A raw
    `#` is refused: `DB#SESSION_ID` is the command line's way to name a session, which Python
    opens with `repo.open(SESSION_ID)`. `:memory:` is refused: a repository persists. The query
    takes only `SQLITE_KEYS`, each once, with a value (lower case, as the keywords)."""
    from urllib.parse import parse_qsl, unquote

    from ..core.errors import shown
    from .base import keyword_shown
    from .sqlite import SQLiteRepository

    path, hashed, fragment = location.partition("#")
    if hashed:
        raise ValueError(
            f"a SQLite URL names a database, not a session (#{shown(fragment)}): open the "
            "repository, then the session with repo.open(SESSION_ID) (a '#' in a file's name is %23)"
        )
    path, _, query = path.partition("?")
    if not path.startswith("/") or path == "/":
        raise ValueError(
            "a SQLite URL is sqlite:///relative/path.db or sqlite:////absolute/path.db, "
            f"not sqlite://{shown(path)}"
        )
    path = unquote(path[1:], errors="strict")
    if path == ":memory:" or path.startswith("file:"):
        raise ValueError(
            "a repository must persist: sqlite:///:memory: (or a SQLite URI filename) is no place "
            "for one; name a file, sqlite:///sessions.db"
        )
    taken: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        if key not in SQLITE_KEYS:
            raise ValueError(f"a SQLite URL's query takes {', '.join(SQLITE_KEYS)}, not {keyword_shown(key)}")
        if key in taken:
            raise ValueError(f"{key} is given twice in the SQLite URL's query; give it once")
        if not value:
            raise ValueError(
                f"{key} has no value in the SQLite URL's query (the known keys: {', '.join(SQLITE_KEYS)})"
            )
        taken[key] = value
    return SQLiteRepository(path, **{**taken, **options})


def open_postgres(location: str, **options: Any) -> Any:
    """`postgresql://user@host/db?sslmode=...`: the URL goes to libpq whole (`durability=` and
    the other options are keywords)."""
    from .postgres import PostgresRepository

    return PostgresRepository(f"postgresql://{location}", **options)


@hookimpl
def register_repositories(register: Any) -> None:
    register("file", open_file_url)
    register("sqlite", open_sqlite)
    register("postgresql", open_postgres)
    register("postgres", open_postgres)
