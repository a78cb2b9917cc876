"""kill -9 during the operator's commands: create, repair, repair --quarantine and convert.

Each kill runs one command in a child process (started ahead, waiting on a pipe, so that the kill
lands in the command and not in the interpreter's start-up) and SIGKILLs it at a kill point: just
before the command's N-th call that changes files (`os.open`, `write`, `fsync`, `fdatasync`,
`ftruncate`, `link`, `replace`, `rename`, `unlink`, `chmod`, `fchmod`, `mkdir`), every N of the
calls a first, unkilled run counted in turn (and after the last of them), in an order drawn from
the seed. The child stops there and says so; the kill lands in the command on every run, however
loaded the machine (a kill after a random delay landed in none of 20 fast creates on a quiet
one). Then it checks what the command left:

* ``create``: the session is absent or opens (never a partial header); the next create or open
  succeeds and leaves no temporary file of the session behind.
* ``repair`` (a log with a torn tail): the log is either untouched or cut exactly at its last
  LF; it opens with every committed line.
* ``quarantine`` (a log with a bad line): the session is untouched, or untouched beside a
  complete side file, or cut at the bad line beside a complete side file: nothing is lost and
  the side file never holds part of what moved. Running it again finishes the job.
* ``convert``: the destination is absent or a complete copy that reduces to the source's state;
  never a partial copy under its name. Running it again succeeds and leaves no temporary.

    python -m sessionlog.testing.operations run --kills 200
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..backends.jsonl_file import FileOps
from ..core.errors import SessionLogError
from ..core.loading import reduce_bytes
from ..opening import create, open

OPERATIONS = ("create", "repair", "quarantine", "convert")
_HEADER = {"provider": "openrouter", "model": "kill/model", "cwd": "/kill", "environment_identity": "k"}
_TRANSACTIONS = 300
CHILD_BOUND = 300.0  # seconds a child may take to stop or finish (a hung one is a failure)


@dataclass
class OperationReport:
    """Totals for one operation: `killed` children died of the SIGKILL before they finished;
    `failures` says what broke (empty when every check held)."""

    operation: str
    kills: int = 0
    killed: int = 0
    finished: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures


def _user(text: str) -> dict[str, object]:
    return {"kind": "entry", "entry": {"type": "message", "message": {"role": "user", "content": text}}}


def _session(path: Path, rng: random.Random) -> bytes:
    """A valid jsonl-fsync session of a few hundred lines of varied size; its bytes."""
    with create(path, "jsonl-fsync", **_HEADER) as store:  # type: ignore[arg-type]
        for index in range(_TRANSACTIONS):
            store.commit([_user(f"{index} " + "x" * rng.randrange(50, 2000))])
    return path.read_bytes()


def _line_starts(data: bytes) -> list[int]:
    return [0, *[index + 1 for index, byte in enumerate(data) if byte == 0x0A]]


@dataclass
class _Case:
    """One prepared run: the command line and what the directory held before it."""

    argv: list[str]
    path: Path
    before: bytes = b""
    cut: int = 0  # repair: the last LF; quarantine: the bad line's offset
    source: Path | None = None


def _prepare(operation: str, folder: Path, rng: random.Random) -> _Case:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    path = folder / "s.jsonl"
    if operation == "create":
        return _Case(["create", str(path)], path)
    data = _session(path, rng)
    if operation == "repair":
        torn = data + b'{"kind":"entry","entry":{"type":"message","mess'
        path.write_bytes(torn)
        return _Case(["repair", str(path), "--backend", "jsonl-fsync"], path, torn, len(data))
    if operation == "quarantine":
        starts = _line_starts(data)
        bad = starts[rng.randrange(len(starts) // 2, len(starts) - 1)]
        broken = data[: bad + 2] + b"#" + data[bad + 3 :]
        path.write_bytes(broken)
        return _Case(["repair", str(path), "--quarantine", "--backend", "jsonl-fsync"], path, broken, bad)
    copy = folder / "copy.jsonl"
    return _Case(["convert", str(path), str(copy), "--to", "jsonl-fsync"], copy, data, source=path)


def _spawn(case: _Case) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(
        [sys.executable, "-m", "sessionlog.testing.operations", "child", *case.argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert child.stdout is not None
    if child.stdout.readline().strip() != b"ready":
        raise RuntimeError(f"the child for {case.argv} did not start")
    return child


def _run(case: _Case, kill_at: int | None) -> tuple[bool, int]:
    """Run the case in a child; SIGKILL it where it stops before its `kill_at`-th call that
    changes files (None: let it finish). Returns (killed before it finished, the calls it made)."""
    child = _spawn(case)
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(b"go %d\n" % (kill_at or 0))
    child.stdin.flush()
    # "at N CALL": stopped there; "done N": finished. A bound only for a child that hangs.
    if not select.select([child.stdout], [], [], CHILD_BOUND)[0]:
        child.kill()
        child.wait()
        raise RuntimeError(f"the child for {case.argv} said nothing in {CHILD_BOUND} s (kill at {kill_at})")
    said = child.stdout.readline().split()
    if said[:1] == [b"at"]:
        child.kill()
    child.wait()
    with contextlib.suppress(OSError):
        child.stdin.close()
    child.stdout.close()
    if said[:1] not in ([b"at"], [b"done"]):
        raise RuntimeError(f"the child for {case.argv} said {said!r} (exit {child.returncode})")
    return said[0] == b"at", int(said[1])


def _temporaries(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.startswith("."))


def _check(operation: str, case: _Case, report: OperationReport) -> None:
    folder = case.path.parent

    def fail(what: str) -> None:
        report.failures.append(f"{operation} kill {report.kills}: {what}")

    def outcome(name: str) -> None:
        report.outcomes[name] = report.outcomes.get(name, 0) + 1

    if operation == "create":
        if case.path.exists():
            try:
                open(case.path, "jsonl-fsync").close()
            except SessionLogError as error:
                fail(f"the created session does not open: {error!r}")
                return
            outcome("created")
        else:
            create(case.path, "jsonl-fsync", **_HEADER).close()  # type: ignore[arg-type]
            outcome("absent")
    elif operation == "repair":
        data = case.path.read_bytes()
        if data not in (case.before, case.before[: case.cut]):
            fail(f"the log is neither untouched nor cut at its last LF ({len(data)} bytes)")
            return
        outcome("untouched" if data == case.before else "repaired")
        with open(case.path, "jsonl-fsync") as store:
            if store.load().repaired_length != case.cut:
                fail("committed lines were lost")
    elif operation == "quarantine":
        data = case.path.read_bytes()
        side = case.path.with_name(f"{case.path.name}.quarantine.{case.cut}")
        moved = case.before[case.cut :]
        has_side = side.exists()
        if has_side and side.read_bytes() != moved:
            fail("the side file holds part of what moved")
            return
        if data == case.before:
            outcome("untouched, side file" if has_side else "untouched")
        elif data == case.before[: case.cut] and has_side:
            outcome("quarantined")
        else:
            fail(f"the session was cut without a complete side file ({len(data)} bytes, side {has_side})")
            return
        from ..cli import main

        with contextlib.redirect_stdout(io.StringIO()):
            code = main(case.argv[:1] + case.argv[1:])
        if code != 0 or case.path.read_bytes() != case.before[: case.cut] or side.read_bytes() != moved:
            fail(f"running it again did not finish the quarantine (exit {code})")
            return
        open(case.path, "jsonl-fsync").close()
    else:
        if case.path.exists():
            if case.path.read_bytes() != case.before:
                fail("a partial copy stands under the destination's name")
                return
            outcome("converted")
            # Killed between the link and the unlink of its temporary: the next open removes it.
            open(case.path, "jsonl-fsync").close()
        else:
            from ..cli import main

            with contextlib.redirect_stdout(io.StringIO()):
                code = main(case.argv)
            if code != 0 or case.path.read_bytes() != case.before:
                fail(f"converting again failed (exit {code})")
                return
            outcome("absent")
        reduce_bytes(case.path.read_bytes())
    left = _temporaries(folder)
    if left:
        fail(f"temporary files left behind: {left}")


def run_operation_kills(
    operation: str, kills: int = 50, *, seed: int = 0, directory: str | os.PathLike[str] | None = None
) -> OperationReport:
    """SIGKILL `kills` children running `operation` (see the module docstring)."""
    if operation not in OPERATIONS:
        raise ValueError(f"operation must be one of {OPERATIONS}, not {operation!r}")
    report = OperationReport(operation)
    rng = random.Random(f"operations:{operation}:{seed}")
    owned = directory is None
    root = Path(tempfile.mkdtemp(prefix="sessionlog-ops-")) if directory is None else Path(directory)
    started = time.monotonic()
    try:
        folder = root / operation
        calls = _run(_prepare(operation, folder, rng), None)[1]  # a case's calls vary a little
        points = list(range(1, calls + 2))  # calls + 1: after the last call, before it says done
        rng.shuffle(points)
        for index in range(kills):  # every kill point in turn, in the seed's order
            case = _prepare(operation, folder, rng)
            killed, _ = _run(case, points[index % len(points)])
            report.kills += 1
            report.killed += killed
            report.finished += not killed
            _check(operation, case, report)
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)
    report.seconds = time.monotonic() - started
    return report


# The calls that change files, counted in the child; it stops before the one it is to be killed at.
KILL_POINTS = ("open", "write", "fsync", "fdatasync", "ftruncate", "link", "replace", "rename", "unlink",
               "chmod", "fchmod", "mkdir")  # fmt: skip


def _stop_at_kill_point(kill_at: int, out: TextIO) -> list[int]:
    """Wrap the os functions of KILL_POINTS (and the file backends' FileOps) so that the
    `kill_at`-th call (from 1; 0: none) says "at N NAME" on `out` and waits for its SIGKILL.
    Returns the running count."""
    count = [0]

    def wrapped(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            if count[0] == kill_at:
                _stopped(out, f"at {count[0]} {name}")
            return real(*args, **kwargs)

        return call

    for name in KILL_POINTS:
        setattr(os, name, wrapped(name, getattr(os, name)))
        if name in vars(FileOps):  # the file backends' seam holds the os functions it was made with
            setattr(FileOps, name, staticmethod(wrapped(name, getattr(FileOps, name))))
    return count


def _stopped(out: TextIO, said: str) -> None:
    out.write(said + "\n")
    out.flush()
    while True:
        time.sleep(60)  # until the harness's SIGKILL


def child_main(argv: Sequence[str]) -> None:
    """Wait for the go (and the kill point), run the command line, say done and how many calls
    that change files it made (unless stopped at its kill point first)."""
    from ..cli import main as cli_main

    out = sys.stdout  # the harness's pipe (the CLI's own output goes to stderr)
    out.write("ready\n")
    out.flush()
    kill_at = int(sys.stdin.readline().split()[1])
    count = _stop_at_kill_point(kill_at, out)
    if argv[0] == "create":
        create(argv[1], "jsonl-fsync", **_HEADER).close()  # type: ignore[arg-type]
    else:
        with contextlib.redirect_stdout(sys.stderr):
            cli_main(list(argv))
    if kill_at == count[0] + 1:  # after the last call, before it says done
        _stopped(out, f"at {kill_at} end")
    out.write(f"done {count[0]}\n")
    out.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sessionlog.testing.operations", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    child = commands.add_parser("child", help="run one command when told to (used by the harness)")
    child.add_argument("argv", nargs=argparse.REMAINDER)
    run = commands.add_parser("run", help="kill children running each operation and check what they left")
    run.add_argument("--operation", action="append", choices=OPERATIONS)
    run.add_argument("--kills", type=int, default=50)
    run.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "child":
        child_main(args.argv)
        return 0
    failed = False
    for operation in args.operation or OPERATIONS:
        report = run_operation_kills(operation, args.kills, seed=args.seed)
        print(
            f"{operation}: {report.kills} kills, {report.killed} before it finished, outcomes "
            f"{report.outcomes}, {report.seconds:.1f}s: {'ok' if report.ok else 'FAILED'}"
        )
        for failure in report.failures[:10]:
            print("  ", failure)
        failed = failed or not report.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
