"""Commands on repositories: `ls`, `export`, `import`, `fork`, `rm`. A session inside a
repository is named `LOCATION#SESSION_ID` (a directory, `sqlite:///relative.db`,
`sqlite:////absolute.db` or `postgresql://...`, then its id),
which inspect, verify, reduce, plan, recover and abort accept too."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ..adapters.labels import TOOL_LEDGER
from ..backends.jsonl_file import read_session_file
from ..core.errors import CorruptionError, shown
from ..maintenance import remove_stale_copies, write_into_place
from ..plugins.registry import Registry
from .describe import created_text
from .new_database import writing_into
from .output import PROG, out, out_json, typed
from .sessions import UsageError, in_repository, open_repository


def _session(name: str) -> tuple[str, str]:
    if not in_repository(name):
        raise UsageError(f"{name}: not LOCATION#SESSION_ID (a repository, then a session id)")
    location, session_id = name.rsplit("#", 1)
    return location, session_id


def cmd_ls(args: argparse.Namespace, registry: Registry) -> int:
    with open_repository(args.location, registry) as repository:
        if args.backend is not None:
            _read_as(repository, args.backend, registry)
        rows = repository.list(
            status=args.status or None,
            labels=args.label,
            limit=min(args.limit + 1, _MAX_LIMIT),  # one more: are there more than it shows?
            cursor=args.cursor,
            key=args.key,
        )
    if len(rows) > args.limit:  # on stderr: stdout (and its JSON array) stays as it was
        rows = rows[: args.limit]
        sys.stderr.write(
            f"{PROG} ls: more sessions than --limit {args.limit}; continue with --cursor {rows[-1].cursor}\n"
        )
    if args.json:
        out_json([_row(info) for info in rows])
        return 0
    for info in rows:
        labels = f" [{', '.join(info.labels)}]" if info.labels else ""
        out(
            f"{info.session_id}  {info.status:<14} {created_text(info.updated_at)}  seq {info.last_seq:<6} "
            f"{_title(info) or ''}{labels}{_key(info)}"
        )
    if not rows:
        out("no sessions")
    return 0


def _read_as(repository: Any, backend: str, registry: Registry) -> None:
    """A directory's sessions read with the rule of the file backend that wrote them (an async
    repository's jsonl-group or jsonl-syncfs files: a power-loss hole may lie in a whole batch)."""
    from ..repositories.directory import DirectoryRepository

    if not registry.info(backend).plain_file:
        raise UsageError(f"--backend names the file backend that wrote a directory's sessions, not {backend}")
    if not isinstance(repository, DirectoryRepository):
        raise UsageError("--backend is for a directory repository (a database reads its own sessions)")
    repository.read_as(backend)


def _row(info: Any) -> dict[str, Any]:
    row = {key: getattr(info, key) for key in info.__dataclass_fields__}
    row["usage"] = info.usage.to_json()
    row["labels"] = list(info.labels)
    row["title"] = None if TOOL_LEDGER in info.labels else info.title
    return row


def _key(info: Any) -> str:
    """A session's caller key, escaped (a key may hold any text: a terminal sees no control
    character of it), and whether the key replaced it."""
    from ..repositories.keys import escaped

    if info.key is None:
        return ""
    return f"  key {escaped(info.key)}{' (replaced)' if info.replaced else ''}"


def _title(info: Any) -> str | None:
    """A session's title: its first user message, except in a tool ledger, whose user entries
    are the ledger's markers, never prompts (`adapters.langgraph_tools`)."""
    return "(tool ledger)" if TOOL_LEDGER in info.labels else info.title


def cmd_export(args: argparse.Namespace, registry: Registry) -> int:
    location, session_id = _session(args.session)
    if args.output:  # checked before anything is read: where it would go, by the name given
        folder = Path(args.output).parent
        if not folder.is_dir():
            raise UsageError(f"-o {args.output}: no directory {folder} to write it in (nothing was written)")
        if os.path.lexists(args.output):
            raise UsageError(f"-o {args.output}: already exists (nothing was written)")
    with open_repository(location, registry) as repository:
        data = repository.export(session_id)
    if args.output:
        remove_stale_copies(Path(args.output))  # of an export killed earlier
        write_into_place(Path(args.output), data)  # never overwrites; complete or absent
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return 0


def cmd_import(args: argparse.Namespace, registry: Registry) -> int:
    data = read_session_file(args.file)
    with writing_into(args.location, registry) as repository:
        try:
            session_id = repository.import_(data, labels=args.label)
        except CorruptionError as error:  # named by the file it came from, not "<bytes>"
            raise error.located(args.file) from None
    out(f"imported {args.file} as {args.location}#{session_id}")
    return 0


def cmd_fork(args: argparse.Namespace, registry: Registry) -> int:
    location, session_id = _session(args.session)
    with open_repository(location, registry) as repository:
        forked = repository.fork(session_id, args.at)
    out(f"forked {args.session} at seq {args.at} as {location}#{forked}")
    return 0


def cmd_rm(args: argparse.Namespace, registry: Registry) -> int:
    location, session_id = _session(args.session)
    with open_repository(location, registry) as repository:
        repository.delete(session_id)
    out(f"removed {args.session}")
    return 0


def cmd_migrate(args: argparse.Namespace, registry: Registry) -> int:
    """Make or migrate a PostgreSQL repository's schema, apart from the runtime (whose role then
    needs only SELECT, INSERT, UPDATE, DELETE)."""
    if not args.location.startswith(("postgresql://", "postgres://")):
        raise UsageError(f"migrate is for PostgreSQL repositories (postgresql://...), not {args.location}")
    from ..repositories.postgres import PostgresRepository
    from ..repositories.postgres_schema import SCHEMA_VERSION

    repository = PostgresRepository(args.location)
    found = repository.found_version
    repository.close()
    if found == SCHEMA_VERSION:
        out(f"{args.location}: the schema is at version {SCHEMA_VERSION}; nothing to do")
    else:
        out(f"{args.location}: migrated the schema from version {found} to version {SCHEMA_VERSION}")
    return 0


_MAX_LIMIT = (1 << 63) - 1  # a listing's limit is a 64-bit SQL integer


def _limit(text: str) -> int:
    """`--limit`: a whole number from 1 on, said so in the CLI's words (the repositories check it
    too, in the API's)."""
    try:
        value: int | str = int(text)
    except ValueError:
        value = text
    if type(value) is not int or not 1 <= value <= _MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"a whole number from 1 to {_MAX_LIMIT:,}, not {shown(value)}")
    return value


def _cursor(text: str) -> str:
    """`--cursor`: the CURSOR a "more sessions" line gave, checked as the listing checks it and
    refused quoting the user's own argument."""
    from ..repositories.info import Filters

    try:
        Filters(cursor=text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a cursor of this listing (the CURSOR of a 'more sessions' line): {typed(text)}"
        ) from None
    return text


def add_commands(commands: Any) -> None:
    """The repository commands, on the main parser's subcommands."""
    sub = commands.add_parser("ls", help="list the sessions of a repository, newest first")
    sub.add_argument(
        "location",
        metavar="LOCATION",
        help="a directory, sqlite:///relative.db, sqlite:////absolute.db or postgresql://USER@HOST/DATABASE",
    )
    sub.add_argument(
        "--status",
        action="append",
        choices=("idle", "running", "needs-recovery", "corrupt"),
        help="only these",
    )
    sub.add_argument("--label", action="append", default=[], help="only sessions with this label")
    sub.add_argument(
        "--key",
        metavar="KEY",
        help="only the sessions of this caller key (its current one and those it replaced)",
    )
    sub.add_argument(
        "--limit",
        type=_limit,
        default=100,
        help="at most this many (default 100); when there are more, a line on stderr gives the --cursor "
        "that lists the next ones",
    )
    sub.add_argument(
        "--cursor",
        metavar="CURSOR",
        type=_cursor,
        help="continue a listing after the last row shown (the CURSOR its 'more sessions' line gave)",
    )
    sub.add_argument(
        "--backend",
        metavar="NAME",
        help="for a directory: the file backend that wrote its sessions, whose rule reads them "
        "(default jsonl-fsync; jsonl-group or jsonl-syncfs for an async repository's)",
    )
    sub.add_argument("--json", action="store_true", help="as JSON")
    sub = commands.add_parser("export", help="the canonical JSONL of a session in a repository")
    sub.add_argument("session", metavar="LOCATION#SESSION_ID")
    sub.add_argument(
        "-o", "--output", metavar="FILE", help="write it here (must not exist) instead of stdout"
    )
    sub = commands.add_parser("import", help="store a JSONL session in a repository (validated first)")
    sub.add_argument("location", metavar="LOCATION")
    sub.add_argument("file", metavar="FILE")
    sub.add_argument("--label", action="append", default=[], help="a label for it")
    sub = commands.add_parser("fork", help="a new session holding a session's transactions through a seq")
    sub.add_argument("session", metavar="LOCATION#SESSION_ID")
    sub.add_argument("--at", type=int, required=True, metavar="SEQ", help="the last seq to keep")
    sub = commands.add_parser("rm", help="remove a session and its summary (refused while a writer holds it)")
    sub.add_argument("session", metavar="LOCATION#SESSION_ID")
    sub = commands.add_parser("migrate", help="make or migrate a PostgreSQL repository's schema")
    sub.add_argument("location", metavar="URL", help="postgresql://user@host/database")


COMMANDS = {
    "ls": cmd_ls,
    "export": cmd_export,
    "import": cmd_import,
    "fork": cmd_fork,
    "rm": cmd_rm,
    "migrate": cmd_migrate,
}
