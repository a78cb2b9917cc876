"""`sessionlog bench` on the command line: its options, where it may write, its exit status.

Exit status (distinct from the other `sessionlog` commands', whose 1, 3 and 4 mean a bad
session, a session in use and a blocked recovery):

* 0: the run finished; every verdict it could reach was that the rows synced as their class
  promises (a row above its ceiling is reported, never an exit on its own);
* 2: usage: a bad argument, an unknown backend or shape, a `--dir` that is missing, not a
  directory or not writable, a `--postgres` URL that cannot be read (never shown) or on which no
  scratch database can be made, a `--json`, `--markdown` or `--plot` FILE that cannot be
  written or two naming one file, a `--plot` without matplotlib or of a run without shapes a, b,
  c or f; all before the run; and a `--dir` that fills up (or turns read-only) during the run,
  a FILE whose writing fails at its end;
* 5: a row was caught not syncing: a power-class row made fewer device flushes than half its
  commits over its committers (`report.flush_evidence`); the rows are named;
* 6: a row failed (it raised): the row and the error are named, the run stops;
* 130: interrupted: Ctrl-C, SIGTERM or SIGHUP (each takes Ctrl-C's path while the command runs,
  so a supervisor's or a closed terminal's stop cleans up too; never 143 or 129).

In every case the scratch folder and the scratch database are gone before it exits.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sessionlog

from . import runner
from .measure import RowFailed
from .peers import peers as all_peers
from .places import PlaceError, check_directory, check_outputs, check_postgres
from .report import PLOTTED, advise, as_json, markdown, not_syncing, plot, plotting, text
from .resume import readers

if TYPE_CHECKING:
    from ..plugins.registry import Registry

EXIT_OK, EXIT_USAGE, EXIT_NOT_SYNCING, EXIT_ROW_FAILED, EXIT_INTERRUPTED = 0, 2, 5, 6, 130
PROG = "sessionlog bench"
EPILOG = (
    "exit status (distinct from the other sessionlog commands'): 0 the run finished and no row was "
    "caught not syncing; 2 usage (a bad argument, a missing, non-directory or read-only --dir, a "
    "--postgres URL that cannot be read or where no scratch database can be made, a --json, "
    "--markdown or --plot FILE that cannot be written or two naming one file, a --plot without "
    "matplotlib or of a run without shapes a, b, c or f; all before the run; a --dir that fills "
    "up during it, a FILE that fails at its end); "
    "5 a row was caught not syncing (a power-class row made fewer device flushes than half its "
    "commits over its committers; named); 6 a row failed (named, with its error); 130 "
    "interrupted (Ctrl-C, SIGTERM or SIGHUP). Scratch files and the scratch database are removed in "
    "every case."
)


def parser() -> argparse.ArgumentParser:
    described = (runner.__doc__ or "").split("\n")[0]
    made = argparse.ArgumentParser(
        prog=PROG,
        description="Which backend to choose, measured on your own disk. " + described,
        epilog=EPILOG,
    )
    made.add_argument(
        "--dir", help="the filesystem under test (a scratch folder is made there, then removed)"
    )
    made.add_argument("--backends", help="comma-separated registered backends (default: all)")
    made.add_argument(
        "--postgres",
        metavar="URL",
        help="a PostgreSQL server for its rows: they run in a scratch database made on it and dropped "
        "after (the role needs CREATEDB); default: a throwaway local server when one can start",
    )
    made.add_argument(
        "--shape",
        default=runner.SHAPES,
        help="the shapes to run, letters of abcdefgh (a: 1 committer, b: 64 committers, c: N sessions, "
        "d: loading, e: list and unfinished, f: 1 committer into a long session, g: resume a session "
        "(open, load, list its messages) beside the peers' read paths, h: a platform's restart "
        "(reopen a repository, list it, claim the unfinished sessions); default: all)",
    )
    size = made.add_mutually_exclusive_group()
    size.add_argument(
        "--quick",
        action="store_true",
        help="the default: under 2 minutes on 2 idle cores (64 sessions at once, 1,000 listed); it "
        "prints how long it took and how long --full would",
    )
    size.add_argument(
        "--full",
        action="store_true",
        help="5 rounds, 3x the commits, 16 and 256 sessions beside 64, 100k-fact loads, 10,000 sessions "
        "listed, 100k-message resumes, 10,000-session restarts",
    )
    size.add_argument(
        "--tiny", action="store_true", help="a smoke test of the shapes: seconds, numbers too small to trust"
    )
    made.add_argument(
        "--json", metavar="FILE", help="every row, as JSON, with its note and whether its figure holds"
    )
    made.add_argument("--markdown", metavar="FILE", help="the tables and the recommendation")
    made.add_argument("--plot", metavar="FILE", help="a PNG: one panel per shape (needs matplotlib)")
    return made


def main(argv: list[str] | None = None, *, registry: Registry | None = None) -> int:
    """Run the bench; return its exit status (EXIT_*). `registry`: where the backends are
    registered (None: the default registry, third-party plugins too)."""
    made = parser()
    args = made.parse_args(argv)
    known = set(sessionlog.backends(registry)) | {f"{kind}-repository" for kind in runner.REPOSITORIES}
    backends = args.backends.split(",") if args.backends is not None else None
    if backends is not None and "" in backends:
        made.error(f"--backends: an empty name in {args.backends!r} (comma-separated registered backends)")
    if backends and not set(backends) <= known:
        unknown = ", ".join(sorted(set(backends) - known))
        names = ", ".join(sorted(known))
        made.error(f"--backends: not a registered backend nor a repository: {unknown} (known: {names})")
    if not args.shape or not set(args.shape) <= set(runner.SHAPES):
        made.error(f"--shape: letters of {runner.SHAPES}, not {args.shape!r}")
    only = "".join(letter for letter in runner.SHAPES if letter in args.shape)
    mode = "full" if args.full else "tiny" if args.tiny else "quick"
    try:
        directory = check_directory(args.dir)
        check_outputs({"--json": args.json, "--markdown": args.markdown, "--plot": args.plot})
        if args.plot is not None and not set(only) & set(PLOTTED):
            raise PlaceError("--plot: its panels are shapes a, b, c and f; this run has none of them")
        if args.plot is not None and (unable := plotting()) is not None:
            raise PlaceError(f"--plot {args.plot}: {unable}")
        if args.postgres is not None:
            check_postgres(args.postgres)
    except PlaceError as error:
        return _say(str(error), EXIT_USAGE)
    if args.postgres is not None and not runner.postgres_rows(backends, only):
        print(
            f"{PROG}: --postgres is not used: no PostgreSQL row in this run (--backends, --shape)",
            file=sys.stderr,
        )
    try:
        with _stops_as_interrupts():
            result = _run_with_a_server(args, directory, backends, only, mode, registry)
    except PlaceError as error:
        return _say(str(error), EXIT_USAGE)
    except OSError as error:
        if error.errno not in PLACE_ERRORS:
            raise
        return _say(
            f"--dir {directory}: {error.strerror} (during the run; nothing is left of it)", EXIT_USAGE
        )
    except RowFailed as error:
        return _say(f"{error}; nothing is left of the run", EXIT_ROW_FAILED)
    except KeyboardInterrupt:
        return _say("interrupted; the scratch folder and database are removed", EXIT_INTERRUPTED)
    result["recommendation"] = advise(result)
    print(text(result))
    writes: tuple[tuple[str, str | None, Callable[[str], object]], ...] = (
        ("--json", args.json, lambda path: _write_text(path, as_json(result))),
        ("--markdown", args.markdown, lambda path: _write_text(path, markdown(result))),
        ("--plot", args.plot, lambda path: plot(result, Path(path))),
    )
    for option, path, write in writes:
        if path is None:
            continue
        try:
            write(path)
        except OSError as error:  # a disk that filled meanwhile, a folder removed meanwhile
            return _say(
                f"{option} {path}: could not be written ({error.strerror}); the run's tables are above",
                EXIT_USAGE,
            )
    unsynced = not_syncing(result)
    if unsynced:
        print(
            f"NOT SYNCING (device flushes, not timing; exit {EXIT_NOT_SYNCING}): {'; '.join(unsynced)}",
            file=sys.stderr,
        )
        return EXIT_NOT_SYNCING
    return EXIT_OK


PLACE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)  # --dir could not hold the run: usage


def _write_text(path: str, text: str) -> None:
    """`text` into FILE; into the stream itself when FILE is this process's stdout or stderr
    (`--json /dev/stdout > run.txt`: opening it anew would truncate the tables printed above)."""
    for stream in (sys.stdout, sys.stderr):
        if _same_file(path, stream):
            stream.write(text)
            stream.flush()
            return
    Path(path).write_text(text)


def _same_file(path: str, stream: Any) -> bool:
    try:
        mine, theirs = os.fstat(stream.fileno()), os.stat(path)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):  # no descriptor (captured)
        return False
    return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)


STOPS = (signal.SIGTERM, signal.SIGHUP)  # a supervisor's stop, a closed terminal: as Ctrl-C


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _stops_as_interrupts() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt meanwhile: the run's cleanup (its scratch
    folder and database, a throwaway server) is Ctrl-C's, where their default ended the process
    with everything left. Python handles signals in the main thread only: elsewhere, as before."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {stop: signal.signal(stop, _interrupt) for stop in STOPS}
    try:
        yield
    finally:
        for stop, handler in before.items():
            signal.signal(stop, handler)


def _say(message: str, status: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


def _run_with_a_server(
    args: argparse.Namespace,
    directory: str,
    backends: list[str] | None,
    only: str,
    mode: str,
    registry: Registry | None,
) -> dict[str, Any]:
    """The run, its PostgreSQL rows in a scratch database (`runner.run`'s): on `--postgres`'s
    server, else on a throwaway local server when one can start (else those rows are skipped,
    with the reason)."""
    server, unavailable, url = None, None, args.postgres
    if url is None and runner.postgres_rows(backends, only):
        try:
            from ..testing.postgres import PostgresServer

            server = PostgresServer.start()
            url = server.url
        except Exception as error:
            unavailable = f"no --postgres URL and no local server could be started: {error}"[:300]
    ours = [server.postmaster_pid()] if server is not None else []  # its CPU is the run's
    try:
        result = runner.run(directory, backends, url, mode, True, all_peers, only, registry, readers(), ours)
    finally:
        if server is not None:
            server.stop()
    if unavailable:
        result["skipped"].append({"name": "the PostgreSQL rows", "reason": unavailable})
    return result
