"""A fault harness for repositories: workers at random, a nemesis, histories checked afterwards.

`run_fault_harness` starts N worker processes on at most M sessions of one repository (a
directory, SQLite, PostgreSQL, or a third party's: any `sessionlog.repository` location). Each
worker opens, creates, forks, labels, deletes, claims (`claim_unfinished`, where the repository
has it), commits and closes at random, recording every operation and its outcome in its own
history (`histories.Recorder`). A nemesis, a separate process, meanwhile:

* `kill`: SIGKILLs a worker (the harness starts a new one in its place);
* `stop`: SIGSTOPs a worker for `stop_seconds` (past the lease where the repository has one
  that short) and continues it: its hold may have been taken over meanwhile, and its next
  commit must then be refused;
* `clock`: shifts a worker's clock (libfaketime, its offset file rewritten: +-`clock_shift`
  seconds or back to none). SQLite's leases are on the writer's own clock (SQLite runs in the
  process): a worker whose clock runs ahead sees live holders' leases as run out and takes
  their sessions over: the writer epoch must fence the holder it took them from. PostgreSQL's
  leases use the server's clock (`now()`), so a client's shift moves only the summary rows'
  `updated_at`/`created_at` (written from the client's clock) and can break no hold; the
  directory's holds are flocks, which no clock touches.
* `terminate` (PostgreSQL): `pg_terminate_backend` of every worker connection;
* `restart` (PostgreSQL, when given the server): SIGKILL of the postmaster and its backends,
  then a restart.

At the end the workers are stopped (one that does not exit within `bound` seconds hung), the
repository is read back and `histories.check` judges the histories against it.

    python -m sessionlog.testing.nemesis run LOCATION --seconds 60 --workers 4 --sessions 4
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import SessionLogError
from .histories import AcknowledgedCount, CheckReport, Recorder, check, read_histories, token

FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
FAULTS = ("kill", "stop", "clock", "terminate", "restart")


def faketime_library() -> Path | None:
    """libfaketime (Debian's `faketime` package), or None where it is not installed."""
    for candidate in (FAKETIME, Path("/usr/lib/faketime/libfaketime.so.1")):
        if candidate.exists():
            return candidate
    return None


# -- a worker ------------------------------------------------------------------------------------


def _outcome(error: BaseException) -> str:
    """`fail` for a refusal that says nothing was written (a typed refusal, or a store poisoned
    because its hold was found lost before the commit was sent), else `unknown`."""
    from ..core import errors

    if isinstance(error, errors.StorePoisonedError) and isinstance(
        error.__cause__, errors.SessionChangedError
    ):
        return "fail"  # fenced before anything was sent: "nothing was written"
    unknown = (errors.CommitOutcomeUnknownError, errors.StorePoisonedError, errors.RepositoryError)
    if isinstance(error, errors.SessionLogError) and not isinstance(error, unknown):
        return "fail"
    return "unknown"


def worker_main(
    location: str, options: dict[str, Any], process: str, work: Path, seed: int, sessions: int
) -> None:
    import sessionlog
    from sessionlog.core.facts import user_message

    if "FAKETIME_TIMESTAMP_FILE" in os.environ:
        # libfaketime with the monotonic clock left real fails time.sleep's absolute
        # clock_nanosleep (EINVAL); select's relative timeout is faked correctly.
        time.sleep = lambda seconds: select.select([], [], [], float(seconds)) and None
    rng = random.Random(f"{seed}:{process}")
    history = Recorder(work / "histories" / f"{process}.jsonl", process)
    (work / "pids" / process).write_text(str(os.getpid()))
    store: Any = None
    hold = 0
    held: str | None = None
    number = 0

    def attempt(op: str, session: str | None, action: Any, value: str | None = None) -> Any:
        index = history.invoke(op, session, value)
        try:
            result = action()
        except Exception as error:
            history.complete(index, _outcome(error), error=error)
            return None
        history.complete(index, "ok", session=result if op in ("create", "fork", "claim") else None)
        return result

    def take(op: str, session: str | None, action: Any) -> None:
        nonlocal store, held, hold
        hold += 1
        opened: list[Any] = []

        def run() -> str | None:
            result = action()
            if result is None:
                return None
            opened.append(result)
            return str(result.header["id"])

        session_id = attempt(op, session, run)
        if opened:
            store, held = opened[0], session_id

    repo = None
    while repo is None and not (work / "stop").exists():  # the server may be down, or starting up
        repo = attempt("connect", None, lambda: sessionlog.repository(location, **options))
        if repo is None:
            time.sleep(0.1)
    if repo is None:
        return
    while not (work / "stop").exists():
        rows = attempt("list", None, lambda: repo.list(limit=None))
        if rows is None:
            rows = []
            time.sleep(0.05)
        ids = [row.session_id for row in rows]
        if store is not None:
            choice = rng.random()
            if choice < 0.8:
                number += 1
                value = token(process, hold, number)
                session = held
                if (
                    attempt(
                        "commit",
                        session,
                        lambda store=store, value=value: store.commit([user_message(value)]),
                        value,
                    )
                    is None
                ):
                    with contextlib.suppress(Exception):
                        store.close()
                    store = held = None
                continue
            if choice < 0.9:
                attempt("close", held, store.close)
                store = held = None
                continue
        choice = rng.random()
        if store is None and (choice < 0.1 or not ids) and len(ids) < sessions:
            take("create", None, lambda: repo.create(provider="p", model="m", cwd="/nemesis"))
        elif store is None and choice < 0.55 and ids:
            session = rng.choice(ids)
            take("open", session, lambda session=session: repo.open(session))
        elif store is None and choice < 0.6 and hasattr(repo, "claim_unfinished"):
            take("claim", None, repo.claim_unfinished)
        elif choice < 0.7 and rows and len(ids) < sessions:
            row = rng.choice(rows)
            attempt("fork", row.session_id, lambda row=row: repo.fork(row.session_id, row.last_seq))
        elif choice < 0.85 and ids:
            session = rng.choice(ids)
            attempt("label", session, lambda session=session: repo.label(session, [f"l{rng.randrange(3)}"]))
        elif choice < 0.92 and ids and len(ids) > 1:
            session = rng.choice(ids)
            attempt("delete", session, lambda session=session: repo.delete(session))
        else:
            time.sleep(0.01)
    with contextlib.suppress(Exception):
        if store is not None:
            store.close()
        repo.close()


# -- the nemesis ---------------------------------------------------------------------------------


def _terminate_backends(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=5) as connection:
        rows = connection.execute(
            "select pg_terminate_backend(pid) from pg_stat_activity "
            "where datname = current_database() and pid <> pg_backend_pid() "
            "and backend_type = 'client backend'"
        ).fetchall()
    return len(rows)


def _running(folder: Path) -> dict[str, int]:
    """The workers' pids by process name. A file its worker has not written yet is left out: read
    as pid 0 it sent the fault to the nemesis's whole process group (the harness, and the test run
    that started it); one the harness removed meanwhile (its worker died) is left out too."""
    pids: dict[str, int] = {}
    for path in folder.iterdir():
        with contextlib.suppress(OSError, ValueError):
            pid = int(path.read_text())
            if pid > 0:
                pids[path.name] = pid
    return pids


def nemesis_main(work: Path, settings: dict[str, Any]) -> None:
    rng = random.Random(f"nemesis:{settings['seed']}")
    history = Recorder(work / "histories" / "nemesis.jsonl", "nemesis")
    faults = settings["faults"]
    server = None
    if settings.get("server"):
        from .postgres import PostgresServer

        spec = settings["server"]
        server = PostgresServer(
            Path(spec["root"]), Path(spec["data"]), spec["port"], spec["password"], spec["run_as"]
        )
    deadline = time.monotonic() + settings["seconds"]
    due: list[str] = []
    while not (work / "stop").exists():
        # past the deadline until every kind of fault was made once (a loaded machine is slow),
        # and while the harness waits for more acknowledged commits (`min_acknowledged`)
        if time.monotonic() >= deadline and (work / "round").exists() and not (work / "more").exists():
            break
        if due == [] and (work / "round.started").exists():
            (work / "round").touch()  # the first round was made
        time.sleep(rng.uniform(0.05, settings["pause"]))
        if not due:  # every kind of fault once a round, in a random order
            due = rng.sample(faults, len(faults))
            (work / "round.started").touch()
        fault = due.pop()
        pids = _running(work / "pids")
        if not pids:
            due.append(fault)  # made later, on a worker then running
            continue
        target = rng.choice(sorted(pids))
        pid = pids[target]
        try:
            if fault == "kill":
                os.kill(pid, signal.SIGKILL)
                history.record(type="fault", fault="kill", target=target)
            elif fault == "stop":
                started = time.monotonic_ns()
                os.kill(pid, signal.SIGSTOP)
                time.sleep(settings["stop_seconds"])
                os.kill(pid, signal.SIGCONT)
                history.record(
                    type="fault", fault="stop", target=target, t=started, until=time.monotonic_ns()
                )
            elif fault == "clock":
                shift = rng.choice([f"+{settings['clock_shift']}s", f"-{settings['clock_shift']}s", "+0"])
                (work / "clocks" / target).write_text(shift + "\n")
                history.record(type="fault", fault="clock", target=target, shift=shift)
            elif fault == "terminate":
                count = _terminate_backends(settings["location"])
                history.record(type="fault", fault="terminate", connections=count)
            elif fault == "restart" and server is not None:
                server.kill()  # (a server a failed restart left down is just started)
                time.sleep(rng.uniform(0, 0.5))
                server.restart()
                history.record(type="fault", fault="restart")
        except (ProcessLookupError, FileNotFoundError, ValueError):
            due.append(fault)  # the worker died meanwhile: made later, on another
            continue
        except Exception as error:  # a fault that could not be made is recorded, not fatal
            history.record(type="fault-failed", fault=fault, error=repr(error)[:300])
    if server is not None and not server.listening():  # leave the server up for the check
        server.restart()


# -- the harness ---------------------------------------------------------------------------------


@dataclass
class FaultHarnessReport:
    check: CheckReport
    workers_started: int = 0
    seconds: float = 0.0
    clock_shifts: bool = False
    notes: list[str] = field(default_factory=list)  # what went wrong outside the histories
    remarks: list[str] = field(default_factory=list)  # what this run could not do, not failures
    work: Path | None = None  # where the histories are

    @property
    def ok(self) -> bool:
        return self.check.ok and not self.notes and self.check.operations > 0


def _spawn(
    location: str,
    options: dict[str, Any],
    process: str,
    work: Path,
    seed: int,
    sessions: int,
    faketime: Path | None,
) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    if faketime is not None:
        clock = work / "clocks" / process
        clock.write_text("+0\n")
        env.update(
            LD_PRELOAD=str(faketime),
            FAKETIME_TIMESTAMP_FILE=str(clock),
            FAKETIME_CACHE_DURATION="1",  # the offset file is read at most once a second
            FAKETIME_DONT_FAKE_MONOTONIC="1",  # the histories' times stay comparable
            FAKETIME_DONT_RESET="1",
        )
    argv = [
        sys.executable,
        "-m",
        "sessionlog.testing.nemesis",
        "worker",
        location,
        json.dumps(options),
        process,
        str(work),
        str(seed),
        str(sessions),
    ]
    with open(work / "errors" / process, "wb") as errors:  # the child keeps its own copy
        return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=errors)


ACKNOWLEDGED_BOUND = 300.0  # seconds past `seconds` a run may go on for `min_acknowledged`: a hang bound


def run_fault_harness(
    location: str,
    *,
    workers: int = 4,
    sessions: int = 4,
    seconds: float = 10.0,
    min_acknowledged: int = 0,
    faults: Sequence[str] = ("kill", "stop", "clock"),
    options: dict[str, Any] | None = None,
    server: Any = None,
    stop_seconds: float = 0.5,
    clock_shift: int = 40,
    pause: float = 0.3,
    bound: float = 30.0,
    seed: int = 0,
    work: Path | None = None,
) -> FaultHarnessReport:
    """Run the workers and the nemesis on the repository at `location` for `seconds`, then check.
    `min_acknowledged`: the run (faults too) goes on past `seconds` until the workers' histories
    hold that many acknowledged commits (a loaded machine may make few), at most
    ACKNOWLEDGED_BOUND seconds more: a note of the report then says it fell short.
    `server`: the `testing.postgres.PostgresServer` behind a PostgreSQL location, for `restart`."""
    options = dict(options or {})
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        raise ValueError(f"no such fault: {', '.join(unknown)} (the faults: {', '.join(FAULTS)})")
    for name, value in (("workers", workers), ("sessions", sessions)):
        if type(value) is not int or value < 1:
            raise ValueError(f"{name} is a whole number of at least 1, not {value!r}")
    if type(min_acknowledged) is not int or min_acknowledged < 0:
        raise ValueError(f"min_acknowledged is a whole number, not {min_acknowledged!r}")
    if not seconds > 0:
        raise ValueError(f"seconds is a number above 0, not {seconds!r}")
    if "restart" in faults and server is None:
        raise ValueError("the restart fault needs the PostgresServer behind the location (server=)")
    import sessionlog

    sessionlog.repository(location, **options).close()  # reachable, of a known kind: else typed, now
    faketime = faketime_library() if "clock" in faults else None
    remarks = (
        [] if faketime is not None or "clock" not in faults else ["no libfaketime here: no clock shifts"]
    )
    faults = [fault for fault in faults if fault != "clock" or faketime is not None]
    work = Path(work or tempfile.mkdtemp(prefix="sessionlog-nemesis-"))
    for name in ("histories", "pids", "clocks", "errors"):
        (work / name).mkdir(parents=True, exist_ok=True)
    acknowledged = AcknowledgedCount(work / "histories")
    if min_acknowledged > 0:
        (work / "more").touch()  # before the nemesis starts: it goes on while this is there
    started = time.monotonic()
    waited = False  # whether the run went on past its end for `min_acknowledged`
    report_notes: list[str] = []
    settings: dict[str, Any] = {
        "seed": seed, "faults": faults, "seconds": seconds, "pause": pause, "stop_seconds": stop_seconds,
        "clock_shift": clock_shift, "location": location,
        "server": None if server is None else {
            "root": str(server.root), "data": str(server.data), "port": server.port,
            "password": server.password, "run_as": server.run_as,
        },
    }  # fmt: skip
    with open(work / "errors" / "nemesis", "wb") as errors:
        nemesis = subprocess.Popen(
            [sys.executable, "-m", "sessionlog.testing.nemesis", "nemesis", str(work), json.dumps(settings)],
            stdout=subprocess.DEVNULL, stderr=errors,
        )  # fmt: skip
    running: dict[int, tuple[str, subprocess.Popen[bytes]]] = {}
    incarnations = 0

    def start(slot: int) -> None:
        nonlocal incarnations
        process = f"w{slot}.{incarnations}"
        incarnations += 1
        running[slot] = (process, _spawn(location, options, process, work, seed, sessions, faketime))

    def wanting() -> bool:
        """Whether the histories hold fewer than `min_acknowledged` acknowledged commits yet."""
        nonlocal waited
        if not (work / "more").exists():
            return False
        if not acknowledged.reach(min_acknowledged):
            waited = True
            return True
        (work / "more").unlink()  # enough: the nemesis may end too
        return False

    try:
        for slot in range(workers):
            start(slot)
        deadline = started + seconds
        # past the deadline (by at most a minute) until the nemesis made each kind of fault once,
        # and (by at most ACKNOWLEDGED_BOUND) until the workers had `min_acknowledged` acknowledged
        while (
            time.monotonic() < deadline
            or (not (work / "round").exists() and time.monotonic() < deadline + 60)
            or (wanting() and time.monotonic() < deadline + ACKNOWLEDGED_BOUND)
        ):
            time.sleep(0.05)
            for slot, (process, child) in list(running.items()):
                if child.poll() is not None:
                    (work / "pids" / process).unlink(missing_ok=True)
                    if child.returncode != -signal.SIGKILL:
                        report_notes.append(
                            f"worker {process} exited {child.returncode}: {_tail(work / 'errors' / process)}"
                        )
                    start(slot)
        if wanting():
            report_notes.append(
                f"the workers had {acknowledged.count} commits acknowledged after "
                f"{time.monotonic() - started:.0f} s, short of the {min_acknowledged} asked for (the run "
                f"goes on at most {ACKNOWLEDGED_BOUND:g} s past its {seconds:g} s for them)"
            )
        elif waited:
            remarks.append(
                f"the run went on {time.monotonic() - deadline:.0f} s past its {seconds:g} s, until the "
                f"workers had {min_acknowledged} commits acknowledged"
            )
        (work / "stop").write_text("")
        nemesis.wait(timeout=bound + 60)
    except BaseException:  # interrupted (Ctrl-C), or failed: no worker or nemesis outlives the run
        (work / "stop").write_text("")
        for child in [nemesis, *(child for _, child in running.values())]:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            child.wait()
        raise
    alive: list[str] = []
    for _, child in running.values():
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGCONT)
    for process, child in running.values():
        try:
            child.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            alive.append(process)  # it lived to the end and did not stop: its pending call hung
            child.kill()
            child.wait()
            continue
        if child.returncode not in (0, -signal.SIGKILL):
            report_notes.append(
                f"worker {process} exited {child.returncode}: {_tail(work / 'errors' / process)}"
            )
    if server is not None and not server.listening():  # the nemesis could not start it again
        server.restart()  # PostgresUnavailable, with the server's log, if it cannot be started
    records = read_histories(work / "histories")
    remarks += [
        f"a {record['fault']} fault could not be made: {record.get('error')}"
        for record in records
        if record.get("type") == "fault-failed"
    ]
    contents = read_contents(location, options)
    report = FaultHarnessReport(
        check(records, contents, bound=bound, alive=alive),
        incarnations,
        time.monotonic() - started,
        faketime is not None,
        report_notes,
        remarks,
        work,
    )
    return report


def _tail(path: Path) -> str:
    with contextlib.suppress(OSError):
        lines = path.read_text(errors="replace").strip().splitlines()
        return lines[-1][-300:] if lines else "no output"
    return "no output"


def read_contents(location: str, options: dict[str, Any]) -> dict[str, list[str]]:
    """Each session of the repository: the texts of its messages, in order."""
    import sessionlog

    reading = {key: value for key, value in options.items() if key in ("backend",)}
    repo = sessionlog.repository(location, **reading)
    try:
        return {
            row.session_id: [str(message.get("content")) for message in repo.load(row.session_id).transcript]
            for row in repo.list(limit=None)
        }
    finally:
        repo.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sessionlog.testing.nemesis", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser("worker", help="operate at random until stopped (used by the harness)")
    for name in ("location", "options", "process", "work", "seed", "sessions"):
        worker.add_argument(name)
    nemesis = commands.add_parser("nemesis", help="make faults (used by the harness)")
    nemesis.add_argument("work")
    nemesis.add_argument("settings")
    run = commands.add_parser("run", help="run workers and the nemesis on a repository, then check")
    run.add_argument("location")
    run.add_argument("--seconds", type=float, default=60)
    run.add_argument("--workers", type=int, default=4)
    run.add_argument("--sessions", type=int, default=4)
    run.add_argument("--faults", default="kill,stop,clock", help=f"comma-separated, of {', '.join(FAULTS)}")
    args = parser.parse_args(argv)
    if args.command == "worker":
        worker_main(
            args.location,
            json.loads(args.options),
            args.process,
            Path(args.work),
            int(args.seed),
            int(args.sessions),
        )
        return 0
    if args.command == "nemesis":
        nemesis_main(Path(args.work), json.loads(args.settings))
        return 0
    try:
        report = run_fault_harness(
            args.location,
            workers=args.workers,
            sessions=args.sessions,
            seconds=args.seconds,
            faults=[fault for fault in args.faults.split(",") if fault],
        )
    except (ValueError, SessionLogError) as error:
        parser.error(str(error))
    print(summary(report))
    print(f"histories: {report.work}")
    for remark in report.remarks:
        print("  note:", remark)
    for violation in report.check.violations[:20]:
        print("  ", violation)
    for note in report.notes[:10]:
        print("  ", note)
    return 0 if report.ok else 1


def summary(report: FaultHarnessReport) -> str:
    result = report.check
    faults = ", ".join(f"{name} {count}" for name, count in sorted(result.faults.items())) or "none"
    return (
        f"{result.operations} operations ({', '.join(f'{op} {n}' for op, n in sorted(result.by_op.items()))}), "  # noqa: E501
        f"faults: {faults}; {result.acknowledged} acknowledged commits checked, "
        f"{result.unknown_present + result.unknown_absent} unknown outcomes resolved "
        f"({result.unknown_present} present, {result.unknown_absent} absent), lost {result.lost}, "
        f"{len(result.violations)} violations: {'ok' if report.ok else 'FAILED'}; typed failures told: "
        + (", ".join(f"{name} {n}" for name, n in result.errors.most_common()) or "none")
    )


if __name__ == "__main__":
    sys.exit(main())
