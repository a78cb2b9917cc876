"""Where a run writes, never into the user's data.

* `check_directory(path)`: a `--dir` that is missing, not a directory or not writable is
  `PlaceError` naming it and why (the command exits 2, no traceback); the run itself writes only
  into a scratch folder it makes under it (`shapes.Scratch`) and removes, also when interrupted.
* `check_outputs({option: path})`: a `--json`, `--markdown` or `--plot` FILE that could not be
  written, or two of them naming one file, is `PlaceError` too, before the run (not after
  minutes of it); nothing is created to find out.
* `ScratchDatabase(url)`: with `--postgres URL` every PostgreSQL row (the repository, the peers,
  shape e's listing; shape h's restart in a second one) runs in a database the
  bench creates on that server for the run (`sessionlog_bench_<random>`) and drops at the end,
  also on Ctrl-C and on failure
  (`DROP DATABASE ... WITH (FORCE)`: connections a failed row left open do not keep it alive).
  A database, not a schema: the repository keeps its tables in the schema `sessionlog`, which a
  search path would not move. The role needs CREATEDB; without it the run is a `PlaceError` (exit
  2) before anything is measured, and nothing is written into the URL's database. A URL that
  cannot be read is a `PlaceError` too, never echoed (it may hold a password). The scratch
  database is `runner.run`'s own, so a caller from Python is isolated as the command line is.
* `check_postgres(url)`: what cannot be isolated is refused before any connection: a query that
  names the database (`dbname=`, its key percent-encoded too: libpq decodes it), which libpq
  lets override the path where the scratch database is named. Accepted: `service=` (a service
  file fills only what the URL leaves unset, and the path is always set), `options=` (settings of
  a session cannot leave its database; the repository names its schema), `host=` and `port=`
  (every connection of the run reads the same URL, so the scratch database is made, used and
  dropped on the one server they name).
* `ScratchDatabase.refusal()`: a server that cannot give the rows their class (`fsync=off`, as
  development and CI servers often run, or a weak `synchronous_commit`) is said, and the run
  skips its PostgreSQL rows with that reason; the rest of the run goes on.
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit, urlunsplit

from ..repositories.locations import mask_in

PREFIX = "sessionlog_bench_"


class PlaceError(ValueError):
    """A `--dir` or `--postgres` the bench cannot use; the message names it and why."""


def check_directory(path: str | None) -> str:
    """The folder scratch files go under: `path`, or the system's temporary directory."""
    if path == "":
        raise PlaceError("--dir: an empty path")
    where = path if path is not None else tempfile.gettempdir()
    try:
        is_dir = Path(where).is_dir()
        exists = is_dir or Path(where).exists()
    except OSError as error:  # a path through a regular file, a name too long
        raise PlaceError(f"--dir {where}: {error.strerror or error}") from None
    if not exists:
        raise PlaceError(f"--dir {where}: no such directory")
    if not is_dir:
        raise PlaceError(f"--dir {where}: not a directory")
    if not os.access(where, os.W_OK | os.X_OK):
        raise PlaceError(f"--dir {where}: not writable (read-only filesystem or no permission)")
    try:  # what access() cannot tell (a read-only mount seen by root, a full disk)
        probe = tempfile.mkdtemp(prefix="sessionlog-bench-probe-", dir=where)
        os.rmdir(probe)
    except OSError as error:
        raise PlaceError(f"--dir {where}: cannot create a folder there: {error.strerror or error}") from None
    return where


def check_outputs(outputs: dict[str, str | None]) -> None:
    """`check_output` of each FILE given (option -> path, None: not given), and two options
    naming one file (the second would replace the first) are PlaceError too."""
    seen: dict[str | tuple[int, int], str] = {}
    for option, path in outputs.items():
        if path is None:
            continue
        check_output(option, path)
        if Path(path).exists() and not Path(path).is_file():
            continue  # /dev/null, /dev/stdout: written twice, nothing is lost
        try:  # a file by its device and inode: a hard link to it is the same file
            status = os.stat(path)
            same: str | tuple[int, int] = (status.st_dev, status.st_ino)
        except FileNotFoundError:
            same = os.path.realpath(path)
        if same in seen:
            raise PlaceError(f"{option} {path}: the same file as {seen[same]}")
        seen[same] = option


def check_output(option: str, path: str) -> None:
    """A `--json`, `--markdown` or `--plot` FILE the run could not write at its end (a missing
    folder, its link's target's too, a directory, no permission) is `PlaceError` before anything
    is measured; nothing is created here, not even a probe."""
    if path == "":
        raise PlaceError(f"{option}: an empty path")
    if path.endswith("/"):  # Path() drops the slash: `new/` would be written as a file `new`
        raise PlaceError(f"{option} {path}: names a folder (a trailing '/'), not a file")
    target = Path(path)
    try:
        if target.is_dir():
            raise PlaceError(f"{option} {path}: a directory, not a file")
        if stat.S_ISFIFO(os.stat(path).st_mode if target.exists() else 0) and not _a_descriptor(path):
            raise PlaceError(
                f"{option} {path}: a FIFO, which would hold the run's end until something reads it "
                "(write to /dev/stdout and pipe it instead)"
            )
        if target.exists():
            writable = os.access(target, os.W_OK)
        else:  # made where a dangling link points, not beside the link
            folder = Path(os.path.realpath(path)).parent
            if not folder.is_dir():
                raise PlaceError(f"{option} {path}: no such folder {folder}")
            writable = os.access(folder, os.W_OK | os.X_OK)
    except OSError as error:  # a path through a regular file, a name too long
        raise PlaceError(f"{option} {path}: {error.strerror or error}") from None
    if not writable:
        raise PlaceError(f"{option} {path}: not writable (read-only filesystem or no permission)")


def _a_descriptor(path: str) -> bool:
    """Whether `path` names one of this process's descriptors (/dev/stdout, /dev/fd/N, a shell's
    `>(...)`): a pipe there has its reader already."""
    return os.path.realpath(path).startswith(
        ("/proc/self/fd/", f"/proc/{os.getpid()}/fd/")
    ) or path.startswith(("/dev/fd/", "/dev/stdout", "/dev/stderr", "/proc/self/fd/"))


def check_postgres(url: str) -> None:
    """A `--postgres` URL the bench cannot read or cannot isolate its rows from is PlaceError,
    before any connection and without the URL (it may hold a password)."""
    _checked(url)


def database_url(url: str, database: str) -> str:
    """`url` with its database replaced by `database` (user, password, host and options kept;
    an empty host too: `postgresql:///db?host=...`, which urlunsplit would drop to one slash)."""
    made = urlunsplit(_checked(url)._replace(path=f"/{database}"))
    scheme, _, rest = made.partition(":")
    return made if rest.startswith("//") else f"{scheme}://{rest}"


def _checked(url: str) -> SplitResult:
    parts = _parts(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise PlaceError("--postgres: not a postgresql:// URL")
    # libpq knows no fragment: a '#' is part of the query it reads
    query = parts.query + ("#" + parts.fragment if parts.fragment else "")
    if any(unquote(piece.partition("=")[0]).strip().lower() == "dbname" for piece in query.split("&")):
        raise PlaceError(
            "--postgres: its query names the database (dbname=), which would override the scratch "
            "database the bench runs in: name it in the path instead"
        )
    return parts


def where(url: str) -> str:
    """`url` without its password: host, port and database, for messages; a `host=` or `port=`
    of the query names the server, as libpq reads it."""
    parts = _parts(url)
    query = dict(parse_qsl(parts.query))
    host, port = query.get("host") or parts.hostname or "localhost", query.get("port") or parts.port or 5432
    return mask_in(f"{host}:{port}{parts.path or '/'}", url)


def _parts(url: str) -> SplitResult:
    """`url` split, its port read: what urlsplit cannot read (an unclosed IPv6 host, a port out
    of range or no number) is PlaceError, without the URL (it may hold a password)."""
    try:
        parts = urlsplit(url)
        several = "," in parts.netloc.rpartition("@")[2]
        if not several:
            parts.port  # noqa: B018 (read for its ValueError)
    except ValueError:  # its text may quote the netloc, password and all
        raise PlaceError(
            "--postgres: not a valid URL (its host or port cannot be read; not shown: it may hold a password)"
        ) from None
    if several:
        raise PlaceError("--postgres: several hosts (h1,h2) are not supported: name the one to run on")
    # A user or password holding an unencoded '/', '?' or '#' ends the host early: its rest would
    # be read as the path or query (and quoted by libpq's errors). Refused, never shown.
    rest = url.partition("://")[2]
    tail = rest[len(parts.netloc) :]
    at, equals = tail.find("@"), tail.find("=")
    if at >= 0 and (equals < 0 or at < equals):
        raise PlaceError(
            "--postgres: not a valid URL: its user or password holds an unencoded '/', '?' or '#' "
            "(percent-encode them: %2F, %3F, %23; not shown: it may hold a password)"
        )
    return parts


class ScratchDatabase:
    """`with ScratchDatabase(url) as scratch_url:` a database made for the run, dropped after."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.name = f"{PREFIX}{secrets.token_hex(6)}"
        self.scratch_url = database_url(url, self.name)

    def _execute(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as connection:
            connection.execute(sql)

    def __enter__(self) -> str:
        try:
            self._read_as_scratch()
            self._execute(f'create database "{self.name}"')
        except PlaceError:
            raise
        except Exception as error:  # psycopg's errors, unreachable servers: one line, no password
            message = self.problem(error)
            raise PlaceError(
                f"--postgres {where(self.url)}: cannot create the scratch database {self.name} "
                f"({message}); the bench writes only there, never into the URL's own database"
            ) from None
        return self.scratch_url

    def _read_as_scratch(self) -> None:
        """PlaceError unless libpq reads the scratch database's name from its URL (what
        `check_postgres` did not foresee, read by libpq itself)."""
        from psycopg.conninfo import conninfo_to_dict

        if conninfo_to_dict(self.scratch_url).get("dbname") != self.name:
            raise PlaceError(
                f"--postgres {where(self.url)}: libpq does not read the scratch database's name from "
                "the URL (a parameter overrides its path); the bench writes only there, never into "
                "the URL's own database"
            )

    def refusal(self, durability: str = "power") -> str | None:
        """Why the server cannot give its rows `durability` (the repository's own check at open,
        `check_class`: fsync=off, a weak synchronous_commit), None when it can; the rows would
        raise DurabilityUnavailableError."""
        import psycopg

        from ..core.errors import DurabilityUnavailableError
        from ..repositories.postgres_schema import check_class

        server = where(self.url).split("/", 1)[0]
        try:
            with psycopg.connect(self.scratch_url, autocommit=True, connect_timeout=10) as connection:
                check_class(connection, durability, server)
        except DurabilityUnavailableError as error:
            return self.problem(error)
        except Exception as error:  # the server went away since the scratch database was made
            raise PlaceError(f"--postgres {where(self.url)}: {self.problem(error)}") from None
        return None

    def problem(self, error: BaseException) -> str:
        """The driver's message, its first line, with the URL's password masked in every form
        (libpq quotes a password it cannot decode)."""
        text = str(error).strip()
        return mask_in(text.splitlines()[0] if text else type(error).__name__, self.url)

    def drop(self) -> None:
        self._execute(f'drop database if exists "{self.name}" with (force)')

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        for _attempt in range(2):  # a second Ctrl-C while dropping: once more, then say so
            try:
                self.drop()
                return
            except KeyboardInterrupt:
                continue
            except Exception as error:  # the server went away: say what is left, never a traceback
                print(f"sessionlog bench: could not drop {self.name}: {self.problem(error)}", file=sys.stderr)
                break
        print(
            f"sessionlog bench: the scratch database {self.name} on {where(self.url)} is left: "
            f'drop it by hand (drop database "{self.name}")',
            file=sys.stderr,
        )
