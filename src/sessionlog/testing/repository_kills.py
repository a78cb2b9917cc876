"""kill -9 of a process committing to a session of a repository (SQLite or a directory).

A child opens the repository, opens (or creates) its session and commits numbered user messages
as fast as it can, printing each number once its commit returned. The parent SIGKILLs it at a
random moment after a few acknowledgements (0 to 3, waited for: however slow a loaded machine's
commits, a run acknowledges some), then checks: the repository opens, the session reads back as exactly the
messages 0..N-1 in order (no gap, no duplicate), N is at least every number acknowledged, and
the next child opens the session (taking over the dead writer's hold) and goes on; past 2,000
lines the session is deleted once checked and the next child starts a new one.

    python -m sessionlog.testing.repository_kills run sqlite:////tmp/x.db --kills 200 [--async]

With `--async` the child commits eight messages at once through `repository_async` (for SQLite,
one transaction of the writer thread holds them), each acknowledged as its commit returns.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sessionlog

_ROTATE = 2000  # lines: a longer session is checked, then deleted, so that each check stays short


@dataclass
class RepositoryKillReport:
    kills: int = 0
    acknowledged: int = 0
    committed: int = 0
    lost: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures and self.lost == 0


def child_main(location: str, options: dict[str, Any]) -> None:
    """Commit one message at a time through the sync repository."""
    repo = sessionlog.repository(location, **options)
    rows = repo.list(limit=1)
    if rows:
        store = repo.open(rows[0].session_id)
    else:
        store = repo.create(provider="p", model="m", cwd="/kill")
    done = len(store.load().transcript)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        store.commit([sessionlog.core.facts.user_message(f"m{done}")])
        sys.stdout.write(f"{done}\n")
        sys.stdout.flush()
        done += 1


async def async_child_main(location: str, options: dict[str, Any], window: int = 8) -> None:
    """Commit `window` messages at once through the async repository (its writer thread puts
    them in one transaction), printing each number once its commit returned."""
    repo = await sessionlog.repository_async(location, **options)
    rows = await repo.list(limit=1)
    store = await (
        repo.open(rows[0].session_id) if rows else repo.create(provider="p", model="m", cwd="/kill")
    )
    done = len((await store.load()).transcript)
    sys.stdout.write("ready\n")
    sys.stdout.flush()

    async def commit(number: int) -> None:
        await store.commit([sessionlog.core.facts.user_message(f"m{number}")])
        sys.stdout.write(f"{number}\n")
        sys.stdout.flush()

    while True:
        await asyncio.gather(*(commit(number) for number in range(done, done + window)))
        done += window


HANG_SECONDS = 120.0  # a child that says nothing this long hangs (a bound for a hang only)


def _read_lines(fd: int, out: bytearray, lines: int | None) -> bool:
    """Read the child's output into `out` until it holds `lines` lines (None: to its end).
    False when its end or HANG_SECONDS without a byte came first."""
    while lines is None or out.count(b"\n") < lines:
        if not select.select([fd], [], [], HANG_SECONDS)[0]:
            return False
        chunk = os.read(fd, 65536)
        if not chunk:
            return lines is None
        out += chunk
    return True


def run_repository_kills(
    location: str,
    kills: int = 200,
    *,
    seed: int = 0,
    max_wait: float = 0.05,
    use_async: bool = False,
    options: dict[str, Any] | None = None,
    crash: Callable[[subprocess.Popen[bytes]], str | None] | None = None,
) -> RepositoryKillReport:
    """SIGKILL `kills` children committing to one session of the repository at `location`
    (through the async repository with `use_async`; `options` for `repository()`). `crash`, if
    given, crashes something else instead (a database server), brings it back, and returns the
    location to check and go on with (None: the same); the child is SIGKILLed after it, whatever
    it was doing (what it was acknowledged until then, before the crash or after it, is checked)."""
    report = RepositoryKillReport()
    rng = random.Random(f"repository-kills:{seed}")
    committed_before = 0
    command = "async-child" if use_async else "child"
    options = options or {}
    while report.kills < kills:
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sessionlog.testing.repository_kills",
                command,
                location,
                json.dumps(options),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert child.stdout is not None and child.stderr is not None
        out = bytearray()  # read from the pipe itself: a buffered reader would hide lines from select
        if not _read_lines(child.stdout.fileno(), out, 1) or not out.startswith(b"ready\n"):
            child.kill()
            child.wait()
            last = child.stderr.read().decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            report.failures.append(f"a child did not start: {last[0][-300:]}")
            return report
        # The kill lands after some acknowledgements (at least one before a crash of the server),
        # then after a random delay: waited for, so that a loaded machine's slow commits cannot
        # leave a run with nothing acknowledged.
        acks = rng.choice((0, 1, 1, 2, 3)) if crash is None else rng.choice((1, 2, 3))
        if not _read_lines(child.stdout.fileno(), out, 1 + acks):
            child.kill()
            child.wait()
            said = child.stderr.read().decode(errors="replace").strip()[-300:] or "nothing"
            report.failures.append(
                f"kill {report.kills + 1}: the child did not acknowledge {acks} commits (it ended, or said "
                f"nothing for {HANG_SECONDS:.0f} s); its stderr: {said}"
            )
            return report
        time.sleep(rng.uniform(0, max_wait))
        if crash is None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGKILL)
        else:
            location = crash(child) or location
            # then the client dies too: one that waits for the server to come back (its pool
            # waits 30 s for a connection) would otherwise decide how long each round takes
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGKILL)
        _read_lines(child.stdout.fileno(), out, None)  # the rest, to its end
        child.wait()
        child.stdout.close()
        child.stderr.close()
        out = out[len(b"ready\n") :]
        report.kills += 1
        acknowledged = [int(line) for line in bytes(out).split()]
        # Read back with any durability: after a failover the promoted standby has none of its own.
        repo = sessionlog.repository(location, **{k: v for k, v in options.items() if k != "durability"})
        try:
            (row,) = repo.list(limit=None)
            contents = [message["content"] for message in repo.load(row.session_id).transcript]
            if contents != [f"m{index}" for index in range(len(contents))]:
                report.failures.append(f"kill {report.kills}: the messages are not 0..N-1 in order")
            if acknowledged and max(acknowledged) >= len(contents):
                report.lost += len([number for number in acknowledged if number >= len(contents)])
            report.acknowledged += len(acknowledged)
            report.committed += len(contents) - committed_before
            committed_before = len(contents)
            if len(contents) > _ROTATE:  # checked: the next child starts a new session
                repo.delete(row.session_id)
                committed_before = 0
        except Exception as error:  # a failure to report, whatever it is
            report.failures.append(f"kill {report.kills}: the repository does not read back: {error!r}")
            return report
        finally:
            repo.close()
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sessionlog.testing.repository_kills", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("child", "async-child"):
        child = commands.add_parser(name, help="commit until killed (used by the harness)")
        child.add_argument("location")
        child.add_argument("options", nargs="?", default="{}", help="repository options, as JSON")
    run = commands.add_parser("run", help="kill committing children and check the session")
    run.add_argument("location")
    run.add_argument("--kills", type=int, default=200)
    run.add_argument("--async", dest="use_async", action="store_true", help="through repository_async")
    args = parser.parse_args(argv)
    if args.command == "child":
        child_main(args.location, json.loads(args.options))
        return 0
    if args.command == "async-child":
        asyncio.run(async_child_main(args.location, json.loads(args.options)))
        return 0
    report = run_repository_kills(args.location, args.kills, use_async=args.use_async)
    print(
        f"{report.kills} kills, {report.acknowledged} acknowledged, {report.committed} committed, "
        f"{report.lost} lost: {'ok' if report.ok else 'FAILED'}"
    )
    for failure in report.failures[:10]:
        print("  ", failure)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
