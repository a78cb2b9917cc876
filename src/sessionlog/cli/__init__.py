"""The `sessionlog` command line: look into a session after a crash, repair it, recover it.

    sessionlog backends [--json]
    sessionlog inspect FILE [--backend NAME] [--json]
    sessionlog verify FILE [--backend NAME]
    sessionlog repair FILE [--backend NAME] [--dry-run] [--quarantine]
    sessionlog reduce FILE [--backend NAME]
    sessionlog plan FILE [--current CONFIG.json] [--backend NAME] [--json]
    sessionlog recover FILE [--current CONFIG.json] [--backend NAME] [--dry-run] [--json]
    sessionlog abort FILE [--current CONFIG.json] [--phase {model,tool,compact}] [--backend NAME] [--json]
    sessionlog convert SRC DST --to BACKEND [--backend NAME]   (or SRC REPOSITORY)
    sessionlog ls LOCATION [--status S] [--label L] [--limit N] [--cursor CURSOR] [--json]
    sessionlog export LOCATION#SESSION_ID [-o FILE]
    sessionlog import LOCATION FILE [--label L]
    sessionlog fork LOCATION#SESSION_ID --at SEQ
    sessionlog rm LOCATION#SESSION_ID

A session inside a repository (a directory, `sqlite:///relative.db`, `sqlite:////absolute.db`,
`postgresql://USER@HOST/DATABASE`) is `LOCATION#SESSION_ID`; the read-only commands (inspect,
verify, reduce, plan) and recover and abort take that too. A missing repository is a usage error
(exit 2: "LOCATION: no such repository") and nothing is created, for every command but import and
convert, which make the repository they write into (a new SQLite database only once the write
succeeded: a killed or failed one leaves none). A location is printed as given, its password
masked (`repositories.locations.masked`) on stdout and stderr alike; session data (titles,
labels, JSON output) is printed as it is, and a driver's message is masked of every form of the
password. `ls` prints at most --limit rows (100); when there are more it says so on stderr with
the --cursor that continues.

Every command that reads a session also takes `--progress {auto,always,never}` (stderr; rich
when installed, plain text otherwise; `auto`: large sessions on a terminal).

Exit status (`EXIT_*` below): 0 ok; 1 the session is bad (corrupted, or the reducer refused what
recovery planned); 2 usage (bad arguments, no such file or backend, an unreadable --current
file); 3 the session is in use (another writer holds its lock: the writing commands repair,
recover, abort and convert take it, like every store); 4 recovery is blocked and needs a person
(`plan` or `recover` left a `blocked` plan: `abort` ends the run). Errors are one line on stderr
naming the file, the line and its byte offset; a bad argument is one line too (never a traceback).

Read-only commands (inspect, verify, reduce, plan, and repair/recover with --dry-run) never
modify the session and take no writer lock: for backends whose session is a plain file they read
the bytes with a read-only descriptor; any other backend is read through its own `read()` and
closed, never truncated or appended to.

One module per concern: `output` (lines for people, JSON, progress), `sessions` (reading a
session and the current configuration), `describe` (plans in words), and the commands: `look`
(backends, inspect, verify, reduce), `repair`, `recover` (plan, recover, abort), `convert`.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from ..core.errors import (
    CorruptionError,
    SessionExistsError,
    SessionLockedError,
    SessionLogError,
    SessionNotFoundError,
    SessionPathError,
    StorePoisonedError,
    UnknownBackendError,
    ValidationError,
)
from ..plugins.registry import Registry, default_registry
from ..repositories.locations import masked
from . import repos
from .convert import cmd_convert
from .examples import explain
from .look import cmd_backends, cmd_inspect, cmd_reduce, cmd_verify
from .output import LOCATIONS, PROG, one_line, say_error, typed
from .recover import cmd_abort, cmd_plan, cmd_recover
from .repair import cmd_repair
from .sessions import CURRENT_HELP, Mismatch, UsageError, backend_of, check_not_directory, check_session_name

EXIT_OK, EXIT_BAD_SESSION, EXIT_USAGE, EXIT_IN_USE = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, as every other error; masked, as it may echo a location given by mistake.
        self.exit(2, f"{self.prog}: error: {masked(one_line(message))} (see: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Look into, repair and recover sessionlog sessions (the canonical v2 session contract).",
        epilog="exit status: 0 ok, 1 the session is bad, 2 usage, 3 the session is in use, 4 recovery is "
        "blocked (see: abort)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    def command(name: str, help: str, *, file: bool = True) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        if file:
            sub.add_argument("file", metavar="FILE", help="the session")
        return sub

    def common(sub: argparse.ArgumentParser, what: str = "FILE") -> None:
        sub.add_argument(
            "--backend",
            default=None,
            metavar="NAME",
            help=f"the backend that stores {what} (default: read from {what}: sqlite for a SQLite "
            "database, else jsonl; a power-class file's NUL rule needs --backend jsonl-fsync)",
        )
        sub.add_argument(
            "--progress",
            choices=("auto", "always", "never"),
            default="auto",
            help="progress on stderr (default: auto, for large sessions on a terminal)",
        )

    sub = command("backends", "list the registered backends", file=False)
    sub.add_argument("--json", action="store_true", help="as JSON")

    sub = command("inspect", "header, counts, operation state, open attempt, pending intents, usage")
    common(sub)
    sub.add_argument("--json", action="store_true", help="as JSON")

    sub = command("verify", "check the whole session against the contract (exit 1 when corrupted)")
    common(sub)

    sub = command("repair", "drop a torn tail (only that: a corrupted session is refused and left as it is)")
    common(sub)
    sub.add_argument("--dry-run", action="store_true", help="say what would be dropped, change nothing")
    sub.add_argument(
        "--quarantine",
        action="store_true",
        help="for a session refused as corrupt: move everything from its first bad line into a side "
        "file next to it (NAME.quarantine.OFFSET, synced), so that it opens again; never a default",
    )

    sub = command(
        "reduce", 'print the reduced state: {"ok": true, "state": ...} or {"ok": false, "error": ...}'
    )
    common(sub)

    sub = command("plan", "print the recovery plan: the one next action (exit 4 when it is blocked)")
    common(sub)
    sub.add_argument("--current", metavar="CONFIG.json", help=CURRENT_HELP)
    sub.add_argument(
        "--json", action="store_true", help="the plan as JSON (the contract's recovery-plan form)"
    )

    sub = command(
        "recover",
        "commit every recovery step that needs no effect; print them and the plan left (exit 4 when it is "
        "blocked)",
    )
    common(sub)
    sub.add_argument("--current", metavar="CONFIG.json", help=CURRENT_HELP)
    sub.add_argument("--dry-run", action="store_true", help="say what would be committed, write nothing")
    sub.add_argument("--json", action="store_true", help="as JSON")

    sub = command(
        "abort",
        "end the current run or compaction as aborted: commit abortRequested, then the synthetic results "
        "and the finish that recovery plans from it (for a blocked or an unwanted run)",
    )
    common(sub)
    sub.add_argument("--current", metavar="CONFIG.json", help=CURRENT_HELP)
    sub.add_argument(
        "--phase",
        choices=("model", "tool", "compact"),
        help="what was in progress: model (a run waiting for or without a model answer), tool (a run with "
        "pending tool intents; the first pending call is named), compact (a compaction); default: read "
        "from the session",
    )
    sub.add_argument("--json", action="store_true", help="as JSON")

    commands.add_parser(
        "bench",
        help="which backend to choose, measured on this disk (sessionlog bench --help)",
        add_help=False,
    )
    sub = commands.add_parser(
        "convert",
        help="copy a session into another backend, every transaction unchanged",
        description="copy a session into another backend, every transaction unchanged",
    )
    sub.add_argument("src", metavar="SRC", help="the session to copy")
    sub.add_argument(
        "dst",
        metavar="DST",
        help="the new session (must not exist), or a repository (a directory, sqlite:///relative.db, "
        "sqlite:////absolute.db, postgresql://...) to "
        "import it into under its own id",
    )
    sub.add_argument("--to", metavar="BACKEND", help="the backend of DST (when DST is a session path)")
    common(sub, "SRC")
    repos.add_commands(commands)
    explain(commands)
    return parser


COMMANDS = {
    **repos.COMMANDS,
    "backends": cmd_backends,
    "inspect": cmd_inspect,
    "verify": cmd_verify,
    "repair": cmd_repair,
    "reduce": cmd_reduce,
    "plan": cmd_plan,
    "recover": cmd_recover,
    "abort": cmd_abort,
    "convert": cmd_convert,
}


_USAGE_ERRORS = (UsageError, UnknownBackendError, SessionNotFoundError, SessionExistsError, SessionPathError)


_BAD_SESSION = (CorruptionError, ValidationError, Mismatch, StorePoisonedError)


def _message(error: BaseException) -> str:
    if isinstance(error, UnknownBackendError):  # the name given with --backend or --to
        return f"unknown backend {typed(error.name)}; registered: {', '.join(error.known) or 'none'}"
    if isinstance(error, OSError) and not isinstance(error, SessionLogError) and error.filename:
        return f"{error.filename}: {error.strerror or error}"
    if isinstance(error, OSError) and isinstance(error, SessionLogError) and error.strerror:
        return str(error.strerror)
    return str(error)


def main(argv: Sequence[str] | None = None, *, registry: Registry | None = None) -> int:
    """Run the command line; return the exit status (0 ok, 1 the session is bad, 2 usage, 3 in use)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["bench"]:  # the benchmark has its own options (`sessionlog bench --help`)
        from ..bench import main as bench

        try:
            return bench(arguments[1:])
        except SystemExit as exit:  # --help, or a usage error its parser reported
            return 0 if exit.code is None else exit.code if isinstance(exit.code, int) else 2
    parser = build_parser()
    try:
        args = parser.parse_args(arguments)
    except SystemExit as exit:  # --help, or a usage error argparse has reported
        return 0 if exit.code is None else exit.code if isinstance(exit.code, int) else 2
    registry = registry if registry is not None else default_registry()
    LOCATIONS.clear()
    for name in ("file", "location", "session", "src", "dst"):
        if isinstance(getattr(args, name, None), str):
            LOCATIONS.add(getattr(args, name))  # every line printed from here on shows it masked
    try:
        for name in ("file", "src"):
            if isinstance(getattr(args, name, None), str):
                check_session_name(getattr(args, name))
                check_not_directory(getattr(args, name))
                if "backend" in vars(args) and args.backend is None:
                    args.backend = backend_of(getattr(args, name))  # what is there says which
        return COMMANDS[args.command](args, registry)
    except _USAGE_ERRORS as error:
        say_error(args.command, _message(error))
        damaged = isinstance(error, SessionPathError) and error.errno == errno.EBADMSG  # a corrupt database
        return EXIT_BAD_SESSION if damaged else EXIT_USAGE
    except _BAD_SESSION as error:
        say_error(args.command, _message(error))
        return 1
    except ValueError as error:  # a bad argument the library refused (a seq, a session id)
        say_error(args.command, _message(error))
        return EXIT_USAGE
    except SessionLockedError as error:
        message = _message(error)
        unchanged = "" if "nothing was" in message else "; nothing was changed"  # said once
        say_error(args.command, f"{message}{unchanged} (try again when it is closed)")
        return EXIT_IN_USE
    except BrokenPipeError:  # `sessionlog reduce FILE | head`: the reader left, say nothing more
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (OSError, SessionLogError) as error:  # a filesystem's or a database's failure
        say_error(args.command, _message(error))
        return 1
    except Exception as error:  # a defect: still one line, masked, never a traceback
        say_error(args.command, f"unexpected {type(error).__name__}: {_message(error)}")
        return 1
