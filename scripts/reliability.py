"""Run the reliability harnesses and write RELIABILITY.md from what they found.

    python scripts/reliability.py            # the CI counts (a minute or two)
    python scripts/reliability.py --soak     # 10x: 2,000 kills per backend, 1,000 traces, ...
    python scripts/reliability.py --out -    # print instead of writing RELIABILITY.md
    python scripts/reliability.py --seed 7   # replay a run: its seed is printed and written

Each run draws a fresh seed (printed first, and in the file) unless --seed names one: the harnesses'
kill points, schedules and generated cases all derive from it, so a run's failure is rerun by its
seed. What a fresh seed finds becomes a fixed-seed test in tests/.

Every figure in the file comes from this run; nothing is typed by hand. The harnesses live in
`sessionlog.testing` (crash, powerloss, faults, mutations); the async cancellation stress is the
one in tests/test_cancellation.py, imported from there; the hostile-input checks are
tests/test_hostile.py, run with pytest. Wall times are printed for information only: no result
depends on timing. Exit status 1 if any harness found a violation.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib
import importlib.metadata
import os
import platform
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import sessionlog  # noqa: E402
from sessionlog.testing.agent_kills import run_agent_kills  # noqa: E402
from sessionlog.testing.bitflips import run_bit_flips  # noqa: E402
from sessionlog.testing.crash import run_kills  # noqa: E402
from sessionlog.testing.faults import real_enospc, run_faults  # noqa: E402
from sessionlog.testing.mutations import run_corpus  # noqa: E402
from sessionlog.testing.nemesis import run_fault_harness  # noqa: E402
from sessionlog.testing.operations import OPERATIONS, run_operation_kills  # noqa: E402
from sessionlog.testing.powerloss import run_powerloss  # noqa: E402
from sessionlog.testing.repository_kills import run_repository_kills  # noqa: E402


@dataclass
class Row:
    test: str
    backend: str
    durability: str
    cases: str
    lost: str
    result: str


Table = list[Row]


def _timed(label: str, work: Callable[[], Any]) -> Any:
    started = time.monotonic()
    print(f"{label} ...", end="", flush=True)
    result = work()
    print(f" {time.monotonic() - started:.1f}s", flush=True)
    return result


def kill9(names: list[str], kills: int, directory: Path, seed: int) -> tuple[Table, bool]:
    rows, ok = [], True
    for name in names:
        folder = directory / f"kill-{name}"
        folder.mkdir()
        report = _timed(
            f"kill -9 {name}",
            lambda name=name, folder=folder: run_kills(name, kills, seed=seed, directory=folder),
        )
        ok = ok and report.ok
        rows.append(
            Row(
                "kill -9",
                name,
                report.durability,
                f"{report.kills} kills ({report.acknowledged} acknowledged commits, {report.torn_tails} "
                f"torn tails, {report.reopened} reopen + append checks)",
                str(report.lost),
                "pass" if report.ok else "FAIL: " + "; ".join(report.failures[:2]),
            )
        )
    return rows, ok


def operator_kills(kills: int, directory: Path, seed: int) -> tuple[Table, bool]:
    rows, ok = [], True
    for operation in OPERATIONS:
        folder = directory / f"ops-{operation}"
        folder.mkdir()
        report = _timed(
            f"kill -9 during {operation}",
            lambda operation=operation, folder=folder: run_operation_kills(
                operation, kills, seed=seed, directory=folder
            ),
        )
        ok = ok and report.ok
        outcomes = ", ".join(f"{name} {count}" for name, count in sorted(report.outcomes.items()))
        rows.append(
            Row(
                f"kill -9 during `{'repair --quarantine' if operation == 'quarantine' else operation}`",
                "jsonl-fsync",
                "power",
                f"{report.kills} kills, {report.killed} before it finished (left: {outcomes}); no partial "
                "copy, no debris",
                "0" if report.ok else "see result",
                "pass" if report.ok else "FAIL: " + "; ".join(report.failures[:2]),
            )
        )
    return rows, ok


def agent_loop(kills: int, directory: Path, seed: int) -> tuple[Table, bool]:
    """The README's loop killed and run again, per design: `intents="tool"` (the default) and
    `intents="step"` (the option; its never-started tools settled as interrupted are its cost)."""
    rows, ok = [], True
    for intents, test in (
        ("tool", "kill -9 of an agent loop on `sessionlog.Session`, resumed each time"),
        ("step", 'kill -9 of an agent loop on `sessionlog.Session`, `intents="step"` (the option)'),
    ):
        folder = directory / f"agent-{intents}"
        folder.mkdir()
        report = _timed(
            f"kill -9 of the runtime's agent loop (intents={intents})",
            lambda folder=folder, intents=intents: run_agent_kills(
                kills, directory=folder, intents=intents, seed=seed
            ),
        )
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(report.kinds.items()))
        ok = ok and report.ok
        rows.append(
            Row(
                test,
                "jsonl-fsync",
                "power",
                f"{report.kills} kills ({kinds}); {report.sessions} sessions, {report.runs_finished} runs "
                f"finished ({report.completed} completed, {report.failed} failed, {report.aborted} aborted: "
                f"blocked when attempt 2's answer was lost too, {report.restarts} restarted as new runs); "
                f"{report.tool_runs} tool runs, "
                f"{report.replays} safe reads replayed, {report.interrupted} settled as interrupted; "
                f"{report.run_twice} tools run twice, {report.out_of_order} out of the model's order, "
                f"{report.stuck} runs stuck, {report.never_started_interrupted} never-started tools "
                f"settled as interrupted (+{report.killed_before_the_tool_began} killed between their "
                "own intent and their first instruction)",
                "0 prompts lost",
                "pass" if report.ok else "FAIL: " + "; ".join(report.failures[:2]),
            )
        )
    return rows, ok


def idempotency(kills: int, directory: Path, seed: int) -> tuple[Table, bool]:
    """Issue 27: the README's loop against the ledger service (its own process, a durable SQLite
    ledger honouring keys, status by key): an idempotent charge, a reconciled deploy, a bash;
    killed and run again, per design."""
    rows, ok = [], True
    for intents, test in (
        (
            "tool",
            "kill -9 of an agent loop against a keyed ledger service (idempotent charge, reconciled deploy)",
        ),
        ("step", 'kill -9 of an agent loop against a keyed ledger service, `intents="step"`'),
    ):
        folder = directory / f"ledger-{intents}"
        folder.mkdir()
        report = _timed(
            f"kill -9 of the agent loop against the ledger service (intents={intents})",
            lambda folder=folder, intents=intents: run_agent_kills(
                kills, directory=folder, intents=intents, against="ledger", seed=seed
            ),
        )
        ledger = report.ledger
        assert ledger is not None
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(report.kinds.items()))
        ok = ok and report.ok
        rows.append(
            Row(
                test,
                "jsonl-fsync",
                "power",
                f"{report.kills} kills ({kinds}); {report.sessions} sessions, {report.runs_finished} runs "
                f"finished; charges: {ledger.intended.get('charge', 0)} intended, "
                f"{ledger.made.get('charge', 0)} made ({ledger.double['charge']} double, "
                f"{ledger.missing['charge']} missing; {report.replays} replayed with their key, "
                f"{ledger.deduplicated['charge']} of them deduplicated by the ledger); deploys: "
                f"{ledger.intended.get('deploy', 0)} intended, {ledger.made.get('deploy', 0)} made "
                f"({ledger.double['deploy']} double), {ledger.reconciled_ran} reconciled as ran, "
                f"{ledger.reconciled_not_run} as not run (run then, same key), "
                f"{ledger.interrupted.get('deploy', 0)} interrupted (the ledger answered 503); bash: "
                f"{ledger.intended.get('bash', 0)} intended, {report.run_twice} run twice, "
                f"{ledger.interrupted.get('bash', 0)} interrupted; at most {ledger.keys_per_call} key a call",
                "0 charges lost or doubled",
                "pass" if report.ok else "FAIL: " + "; ".join(report.failures[:2]),
            )
        )
    return rows, ok


def sqlite_writers(kills: int, directory: Path, seed: int) -> tuple[Table, bool]:
    """kill -9 of SQLite writers (sync, and async: eight commits at once through the writer
    thread), and a real full disk under each SQLite backend."""
    rows, ok = [], True
    for durability, use_async, name in (
        ("power", False, "sqlite"),
        ("process", False, "sqlite-normal"),
        ("power", True, "sqlite-async"),
        ("process", True, "sqlite-normal-async"),
    ):
        location = f"sqlite:///{directory / f'repository-{name}.db'}?durability={durability}"
        report = _timed(
            f"kill -9 of a SQLite repository writer ({name})",
            lambda location=location, use_async=use_async: run_repository_kills(
                location, kills, use_async=use_async, seed=seed
            ),
        )
        ok = ok and report.ok
        rows.append(
            Row(
                "kill -9 of a writer of a SQLite repository session",
                name,
                durability,
                f"{report.kills} kills ({report.acknowledged} acknowledged commits; each next writer "
                "takes the dead one's hold over and appends)",
                str(report.lost),
                "pass" if report.ok else "FAIL: " + "; ".join(report.failures[:2]),
            )
        )
    for name in ("sqlite", "sqlite-normal", "sqlite-async", "sqlite-normal-async"):
        rows.append(_enospc_row(name, sessionlog.backends()[name].durability, "256k"))
        ok = ok and rows[-1].result.startswith(("pass", "skipped"))
    return rows, ok


def _enospc_row(name: str, durability: str, size: str) -> Row:
    """Commit until a tiny tmpfs is full: a typed error, the store poisoned, nothing lost."""
    result = _timed(f"real ENOSPC {name}", lambda: real_enospc(name, size=size))
    label = f"real ENOSPC ({size[:-1]} KiB tmpfs)"
    if result.skipped is not None:
        return Row(label, name, durability, "-", "-", f"skipped: {result.skipped}")
    good = not result.failures and result.lost == 0
    return Row(
        label,
        name,
        durability,
        f"filled after {result.acknowledged} acknowledged commits",
        str(result.lost),
        "pass" if good else "FAIL: " + "; ".join(result.failures[:2]),
    )


def bit_flips(names: list[str], directory: Path) -> tuple[Table, bool]:
    rows, ok = [], True
    for name in names:
        if sessionlog.backends()[name].durability != "power":
            continue
        report = _timed(f"bit flips {name}", lambda name=name: run_bit_flips(name, directory))
        ok = ok and not report.shortened
        rows.append(
            Row(
                "every single-bit flip of a synced log",
                name,
                "power",
                f"{report.flips:,} flips: {report.refused:,} refused (CorruptionError), {report.kept:,} "
                "reduced with every line (a changed letter)",
                f"{len(report.shortened)} flips shorten the log",
                "pass" if not report.shortened else f"FAIL: {report.shortened[:3]}",
            )
        )
    return rows, ok


def power_loss(names: list[str], traces: int, directory: Path, seed: int) -> tuple[Table, bool]:
    rows, ok = [], True
    for name in names:
        folder = directory / f"power-{name}"
        folder.mkdir()
        report = _timed(
            f"power loss {name}",
            lambda name=name, folder=folder: run_powerloss(name, traces, seed=seed, directory=folder),
        )
        cases = (
            f"{report.traces} traces, {report.states:,} crash states ({report.reductions:,} distinct images "
            f"reduced, {report.nul_tails} NUL tails cut, {report.reopened} reopened + appended)"
        )
        if report.durability == "power":
            if report.lost_states == 0 and report.ok:
                lost, result = "0", "pass"
            else:
                ok = False
                lost = f"{report.lost_states} states ({report.refused_intact} refused after the acknowledged)"
                result = "FAIL: " + "; ".join(report.violations[:2])
        else:
            lost = (
                f"{report.lost_states:,} states lose some (at most {report.max_lost} commits; "
                f"{report.lost_commits:,} summed)"
            )
            result = "counted (the class promises kill -9 only)" if report.misread == 0 else "FAIL: misread"
            ok = ok and report.misread == 0
        rows.append(Row("power loss (simulated)", name, report.durability, cases, lost, result))
    return rows, ok


def faults(names: list[str], directory: Path, seed: int) -> tuple[Table, bool]:
    rows, ok = [], True
    for name in names:
        folder = directory / f"faults-{name}"
        folder.mkdir()
        report = _timed(
            f"I/O faults {name}",
            lambda name=name, folder=folder: run_faults(name, seed=seed, directory=folder),
        )
        ok = ok and report.ok
        operations = ", ".join(f"{op} {count}" for op, count in sorted(report.by_operation.items()))
        rows.append(
            Row(
                "I/O faults (k-th operation fails: EIO, ENOSPC, EFBIG, short write)",
                name,
                report.durability,
                f"{report.runs} runs, {report.faults} faults ({operations}); failing commit whole "
                f"{report.landed}, absent {report.absent}",
                str(report.lost),
                "pass" if report.ok else "FAIL: " + "; ".join(report.failures[:2]),
            )
        )
        rows.append(_enospc_row(name, report.durability, "64k"))
        ok = ok and rows[-1].result.startswith(("pass", "skipped"))
    return rows, ok


def cancellation(names: list[str], rounds: int, seed: int) -> tuple[Table, bool]:
    """The stress of tests/test_cancellation.py, per backend."""
    infos = sessionlog.backends()
    async_names = [name for name in names if infos[name].api == "async"]
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        module = importlib.import_module("test_cancellation")
        stress = module._stress
    except (ImportError, AttributeError) as error:
        return [
            Row("async cancellation", name, infos[name].durability, "-", "-", f"not run: {error}")
            for name in async_names
        ], True
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as folder:
        for name in async_names:
            totals: dict[str, int] = {}
            failure = None
            started = time.monotonic()
            for stream in range(seed * 1000, seed * 1000 + rounds):
                path = Path(folder) / f"{name}-{stream}.jsonl"
                try:
                    figures = asyncio.run(stress(path, name, stream))
                except AssertionError as error:
                    failure = f"stream {stream}: {error}"
                    break
                for key, value in figures.items():
                    totals[key] = totals.get(key, 0) + value
            print(f"async cancellation {name} ... {time.monotonic() - started:.1f}s", flush=True)
            ok = ok and failure is None
            rows.append(
                Row(
                    "async cancellation (random cancels)",
                    name,
                    infos[name].durability,
                    f"{totals.get('cancelled', 0)} cancels ({totals.get('acknowledged', 0)} acknowledged, "
                    f"{totals.get('landed_after_cancel', 0)} landed after their caller was cancelled)",
                    "0" if failure is None else "?",
                    "pass" if failure is None else f"FAIL: {failure}",
                )
            )
    return rows, ok


def fuzzing(per_kind: int, hypothesis_rounds: int, seed: int) -> tuple[Table, bool]:
    count, outcomes, problems = _timed("corruption corpus", lambda: run_corpus(seed, per_kind=per_kind))
    kinds = ", ".join(f"{kind} {sum(seen.values())}" for kind, seen in outcomes.items())
    rows = [
        Row(
            "corruption fuzzing: deterministic corpus",
            "(read path, all)",
            "-",
            f"{count:,} cases ({kinds})",
            "-",
            "pass" if not problems else f"FAIL: {len(problems)} cases, e.g. {problems[0]}",
        )
    ]
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        module = importlib.import_module("test_fuzz")
        tests = [module.test_hypothesis_mutations, module.test_hypothesis_arbitrary_edits]
        examples = len(tests) * module.FUZZ.max_examples
    except (ImportError, AttributeError) as error:
        rows.append(
            Row("corruption fuzzing: hypothesis", "(read path, all)", "-", "-", "-", f"not run: {error}")
        )
        return rows, not problems
    failure = None
    started = time.monotonic()
    for round in range(hypothesis_rounds):
        for test in tests:
            test._hypothesis_internal_use_seed = seed * 1000 + round  # what hypothesis.seed() sets
            try:
                test()
            except AssertionError as error:
                failure = str(error).splitlines()[0]
    print(f"hypothesis ... {time.monotonic() - started:.1f}s", flush=True)
    rows.append(
        Row(
            "corruption fuzzing: hypothesis",
            "(read path, all)",
            "-",
            f"up to {examples * hypothesis_rounds:,} examples",
            "-",
            "pass" if failure is None else f"FAIL: {failure}",
        )
    )
    return rows, not problems and failure is None


def _pytest(label: str, test_file: str, *options: str) -> tuple[str, bool, str]:
    """Run one test file of tests/ with pytest: how many passed, whether all did, its last line."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(ROOT / "tests" / test_file), "-p", "no:cacheprovider", *options],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    print(f"{label} ... {time.monotonic() - started:.1f}s", flush=True)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr.strip()[-200:]
    passed = re.search(r"(\d+) passed", done.stdout)
    return (passed.group(1) if passed else "?"), done.returncode == 0, summary


def hostile() -> tuple[Table, bool]:
    passed, ok, summary = _pytest("hostile input", "test_hostile.py")
    return [
        Row(
            "hostile input (line > max, deep nesting, symlinks)",
            "all",
            "-",
            f"{passed} checks",
            "-",
            "pass" if ok else f"FAIL: {summary}",
        )
    ], ok


def postgres(kills: int, seed: int) -> tuple[Table, bool]:
    """kill -9 of PostgreSQL clients and of the postmaster, a failover to a synchronous standby,
    and the PostgreSQL fault tests of tests/test_postgres.py, on throwaway servers."""
    from sessionlog.testing.postgres import PostgresServer, PostgresUnavailable

    try:
        server = PostgresServer.start()
    except (PostgresUnavailable, ModuleNotFoundError) as error:
        return [Row("PostgreSQL", "postgres", "power", "-", "-", f"skipped: {error}")], True
    rows, ok = [], True

    def row(test: str, durability: str, report: Any, cases: str) -> None:
        nonlocal ok
        ok = ok and report.ok
        name = "postgres" if durability == "power" else "postgres-replicated"
        result = "pass" if report.ok else "FAIL: " + "; ".join(report.failures[:2])
        rows.append(Row(test, name, durability, cases, str(report.lost), result))

    with server:
        for use_async in (False, True):
            report = _timed(
                f"kill -9 of PostgreSQL clients ({'async' if use_async else 'sync'})",
                lambda use_async=use_async: run_repository_kills(
                    server.new_database(), kills, use_async=use_async, seed=seed
                ),
            )
            row(
                f"kill -9 of a PostgreSQL client ({'async, 8 commits at once' if use_async else 'sync'})",
                "power",
                report,
                f"{report.kills} kills ({report.acknowledged} acknowledged commits)",
            )

        def crash(child: Any) -> None:
            server.kill()
            child.wait(timeout=60)
            server.restart()

        report = _timed(
            "kill -9 of the postmaster",
            lambda: run_repository_kills(server.new_database(), 10, max_wait=0.3, crash=crash, seed=seed),
        )
        row(
            "kill -9 of the PostgreSQL server (postmaster and backends) mid-commit, restart",
            "power",
            report,
            f"{report.kills} server kills ({report.acknowledged} acknowledged commits)",
        )
    from sessionlog.testing.postgres import run_failovers

    report = _timed("failovers", lambda: run_failovers(3))
    row(
        "kill -9 of the primary mid-commit, promote its synchronous standby",
        "replicated",
        report,
        f"{report.kills} failovers ({report.acknowledged} acknowledged commits, read on the promoted "
        "standbys)",
    )
    passed, good, summary = _pytest(
        "PostgreSQL fault tests",
        "test_postgres.py",
        "-k",
        "connection_broken or two_writers or bad_credentials or foreign_table or recovery_workers "
        "or lease_expires or migrate or many_workers",
    )
    ok = ok and good
    rows.append(
        Row(
            "PostgreSQL faults: connection terminated before and after COMMIT (poisoned, reopening tells "
            "which), two writers on two hosts (one fenced, never interleaved), lease expiry, recovery "
            "workers (SKIP LOCKED), migration race, DML-only role, bad credentials (no password shown), "
            "a foreign table (untouched)",
            "postgres",
            "power",
            f"{passed} checks",
            "0" if good else "see result",
            "pass" if good else f"FAIL: {summary}",
        )
    )
    return rows, ok


def nemesis(seconds: float, directory: Path, seed: int) -> tuple[Table, bool]:
    """Workers at random on each repository kind under a nemesis, their histories checked
    (`sessionlog.testing.nemesis`, `testing.histories`)."""
    from sessionlog.testing.postgres import PostgresServer, PostgresUnavailable

    rows, ok = [], True
    runs: list[tuple[str, str, Callable[[], Any]]] = [
        ("directory", "SIGKILL, SIGSTOP, clock shifts", lambda: run_fault_harness(
            str(directory / "nemesis-dir"), seconds=seconds, seed=seed,
            work=directory / "nemesis-dir-work")),
        ("sqlite", "SIGKILL, SIGSTOP, clock shifts (leases on the writer's clock)", lambda: run_fault_harness(
            f"sqlite:///{directory}/nemesis.db", seconds=seconds, seed=seed,
            work=directory / "nemesis-sqlite-work")),
    ]  # fmt: skip
    server = None
    try:
        server = PostgresServer.start()
    except (PostgresUnavailable, ModuleNotFoundError) as error:
        rows.append(Row("workers under a nemesis", "postgres", "power", "-", "-", f"skipped: {error}"))
    if server is not None:
        pg = server
        runs.append(("postgres", "SIGKILL, SIGSTOP past the 1 s lease, clock shifts, pg_terminate_backend, "
                     "server SIGKILL + restart", lambda: run_fault_harness(
            pg.new_database(), seconds=seconds, faults=("kill", "stop", "clock", "terminate", "restart"),
            options={"lease_seconds": 1.0}, stop_seconds=1.5, server=pg, seed=seed,
            work=directory / "nemesis-pg-work")))  # fmt: skip
    try:
        for kind, faults, run in runs:
            report = _timed(f"nemesis on {kind}", run)
            result = report.check
            good = report.ok and result.acknowledged > 0
            ok = ok and good
            done = ", ".join(f"{op} {n}" for op, n in sorted(result.by_op.items()))
            made = ", ".join(f"{name} {n}" for name, n in sorted(result.faults.items()))
            cases = (
                f"{seconds:g} s, {report.workers_started} worker processes: {result.operations} operations "
                f"({done}); faults: {made}; {result.acknowledged} acknowledged commits checked, "
                f"{result.unknown_present + result.unknown_absent} unknown outcomes resolved "
                f"({result.unknown_present} present, {result.unknown_absent} absent, 0 doubled)"
            )
            problems = result.violations[:2] + report.notes[:2]
            verdict = "pass" if good else "FAIL: " + "; ".join(problems)
            test = f"workers at random under a nemesis ({faults}); histories checked"
            rows.append(Row(test, kind, "power", cases, str(result.lost), verdict))
    finally:
        if server is not None:
            server.stop()
    return rows, ok


def _machine() -> list[str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        total = next(
            line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")
        )
        memory = f", {int(total.split()[1]) // 1024 // 1024} GiB RAM"
    except (OSError, StopIteration):
        pass
    filesystem = "?"
    try:
        done = subprocess.run(
            ["df", "-T", tempfile.gettempdir()], capture_output=True, text=True, check=False
        )
        filesystem = done.stdout.splitlines()[1].split()[1]
    except (OSError, IndexError):
        pass
    versions = ", ".join(
        f"{name} {importlib.metadata.version(name)}"
        for name in ("sessionlog", "orjson", "hypothesis", "pytest")
    )
    return [
        f"- machine: {cpu}, {os.cpu_count()} CPUs{memory}; {platform.system()} {platform.release()}; "
        f"temporary files on {filesystem} ({tempfile.gettempdir()})",
        f"- Python {platform.python_version()} ({platform.python_implementation()}); {versions}",
    ]


EXPLANATION = """\
## What the rows mean

* **kill -9**: a child process commits a deterministic stream (transactions of 100 B to 4 MiB)
  and reports each acknowledgement on a pipe; the parent SIGKILLs it at a random moment (during
  start-up and repair, after some commits, inside a multi-megabyte write, inside an fdatasync).
  After every kill the log must reduce, be exactly the first N transactions of the stream (ids
  and content), hold every acknowledged one, and the next child (or the parent) reopens it and
  appends. Both classes promise this. Where a kill lands is random; how many left a torn tail is
  reported, not required.
* **kill -9 during an operator command**: `create`, `repair`, `repair --quarantine` and
  `convert` run in a child that is SIGKILLed at a random moment within the command's measured
  duration. Afterwards the session holds every committed line, nothing partial stands under a
  final name (a copy, a side file), running the command again finishes the job, and no
  temporary file is left.
* **kill -9 of an agent loop**: the README's loop on a scripted agent (`sessionlog.Session`: a
  fake model asks for a safe `read`, a `write` and a `bash` per step) is SIGKILLed anywhere,
  during a model request, twice during one (the run is blocked, the loop restarts it as a new
  run: the first ends `failed`), during a tool and during recovery itself, and run again by the
  next process: no `write` or `bash` runs twice, a step's tools run in the model's order, no run
  is stuck, every prompt is answered. Per design (docs/agent-loop.md): with one intent per tool
  (the default) no tool that never began is settled as interrupted except one killed between
  its own intent and its first instruction (the window no intent-before-effect design closes);
  with `intents="step"` the later tools of a step killed in an earlier one are, counted.
* **kill -9 of an agent loop against a keyed ledger service** (issue 27, docs/idempotency.md):
  the same loop, its steps a `charge` declared `idempotent`, a `deploy` with `reconcile` and a
  `bash` with neither, against a test service in its own process with a durable SQLite ledger
  that honours idempotency keys and answers status by key (a fifth of status queries answer 503:
  the counterpart cannot tell). Every intended charge is in the ledger exactly once, no deploy
  takes effect twice, every call is sent with one key, bash never runs twice; a deploy the
  ledger cannot tell about is settled as interrupted.
* **kill -9 of a SQLite repository writer**: a child commits numbered messages to one session of
  a SQLite repository and prints each number once its commit returned; after every SIGKILL the
  session must read back as exactly the messages 0..N-1, N at least every printed number, and
  the next child takes the dead writer's hold over and appends. The async rows commit eight
  messages at once through `repository_async` (its writer thread puts them in one transaction).
  The same check runs against PostgreSQL (a throwaway server): SIGKILL of the client, and SIGKILL
  of the whole server (postmaster and backends) then a restart; for the replicated class the
  primary of a primary/synchronous-standby pair is SIGKILLed and the standby promoted, and the
  session is read there.
* **workers under a nemesis**: `sessionlog.testing.nemesis` (docs/faults.md): four worker
  processes open, create, fork, label, delete, claim and commit at random on at most four
  sessions of one repository while a nemesis process SIGKILLs them, SIGSTOPs them (on
  PostgreSQL past its 1 s lease), shifts their clocks by 40 s (libfaketime) and, on
  PostgreSQL, terminates every connection and kills and restarts the server. Every worker
  records each call and what it was told; the checker then proves against the repository that
  no acknowledged commit is missing, doubled or out of its writer's order, no two writers'
  lines interleave, no refused commit landed, no untyped error reached a caller and no call
  hung past 30 s. Unknown outcomes are resolved as present or absent, never doubled.
* **real ENOSPC**: commits until a tiny tmpfs is full: the failing commit raises
  `StorePoisonedError` caused by an `OSError` with `ENOSPC`, nothing acknowledged is lost, and
  reopening (or failing to, typed, while the disk stays full) keeps every acknowledged commit.
* **power loss (simulated)**: every file operation of a workload is recorded; every prefix of
  the operations is a crash point; at each, every byte prefix of the unsynced bytes, each
  unsynced 4 KiB page zeroed, dropped (stale), zeroed to the end, or the file ending in a page
  of garbage, and a file not yet made durable by a directory fsync missing (model:
  `sessionlog.testing.powerloss`). States whose committed part is equal are one class; each
  distinct image is reduced. *Power class*: every state must open (with the NUL rule: NUL runs
  shaped as unwritten sectors of the last write are torn, any other NUL is corruption) and hold
  every commit whose sync returned. *Process class*: states that lose acknowledged commits are
  counted: that is its trade-off, not a failure. No state of either class may be *misread*
  (reduce to something that was not written).
* **I/O faults**: the k-th file operation fails (EIO, ENOSPC, EFBIG; or a short write and then
  ENOSPC) for every k until the workload completes; the failing step raises
  (StorePoisonedError for a commit), the store stays poisoned, and after reopening the failing
  commit is wholly present or wholly absent and every acknowledged one is there. Also a real
  full disk.
* **every single-bit flip**: each bit of each byte of a small synced power-class log is flipped
  and the log opened as its store opens it: refused, or every line still there. A flip never
  makes the NUL rule or the torn-tail repair drop an acknowledged line.
* **async cancellation**: the stress of `tests/test_cancellation.py` (random cancels before,
  during and after the write; every acknowledged commit present once, in order).
* **corruption fuzzing**: each case reduces to the state of its committed prefix, or raises
  CorruptionError at the right line (checked against an independent reference framing and the
  generator's own state model), never another exception, never a silently skipped line.
"""


def render(tables: list[Table], mode: str, counts: str, seconds: float) -> str:
    lines = [
        "# Reliability",
        "",
        "Generated by `scripts/reliability.py` from a real run; do not edit by hand. Every claim names",
        "its durability class: *process* (an acknowledged commit survives kill -9) or *power* (it also",
        "survives power loss, provided the drive honours flushes). What each class does not survive:",
        'the page docs/reliability.md ("Reliability" on the documentation site).',
        "",
        f"- run: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}, {mode} ({counts}), "
        f"{seconds:.0f} s wall",
        *_machine(),
        "",
        "| test | backend | class | cases | acknowledged commits lost | result |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for table in tables:
        for row in table:
            cells = [
                row.test,
                f"`{row.backend}`" if row.backend[0].isalpha() else row.backend,
                row.durability,
            ]
            cells += [row.cases, row.lost, row.result]
            lines.append("| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |")
    lines += ["", EXPLANATION]
    return "\n".join(lines).rstrip() + "\n"


SECTIONS = {
    "kill9", "operator", "agent", "idempotency", "sqlite", "postgres", "nemesis", "powerloss",
    "bitflips", "faults", "cancellation", "fuzzing", "hostile",
}  # fmt: skip


def spliced(old: str, new: str) -> str:
    """`old` with the table rows of `new` in place of its rows of the same test and backend
    (new ones added after the table's last row), and a line saying which sections were rerun."""

    def key(line: str) -> tuple[str, str]:
        cells = line.split(" | ")
        return cells[0], cells[1]

    fresh = [line for line in new.splitlines() if line.startswith("| ") and not line.startswith("| test |")]
    fresh = [line for line in fresh if not line.startswith("| ---")]
    by_key = {key(line): line for line in fresh}
    lines, placed = [], set()
    for line in old.splitlines():
        if line.startswith("| ") and key(line) in by_key:
            lines.append(by_key[key(line)])
            placed.add(key(line))
        else:
            lines.append(line)
    last = max(index for index, line in enumerate(lines) if line.startswith("| "))
    rest = [line for line in fresh if key(line) not in placed]
    lines[last + 1 : last + 1] = rest
    run = next(line for line in new.splitlines() if line.startswith("- run:"))
    first = next(index for index, line in enumerate(lines) if line.startswith("- run:"))
    lines.insert(first + 1, run.replace("- run:", "- rows rerun alone (`--only`):", 1))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--soak", action="store_true", help="ten times the CI counts")
    parser.add_argument("--out", default=str(ROOT / "RELIABILITY.md"), help="'-' prints the report")
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(SECTIONS),
        help="run only this section (repeatable) and put its rows in place of the same rows of --out",
    )
    parser.add_argument("--seed", type=int, default=None, help="replay a run's seed (default: a fresh one)")
    args = parser.parse_args(argv)
    seed = random.randrange(1_000_000) if args.seed is None else args.seed
    print(f"seed {seed} (rerun: python scripts/reliability.py --seed {seed})", flush=True)
    scale = 10 if args.soak else 1
    kills, traces, per_kind, rounds, hypothesis_rounds = (
        200 * scale,
        100 * scale,
        600 * scale,
        2 * scale,
        scale,
    )
    # The file harnesses run on the backends whose session is a file; SQLite has its own rows.
    names = [name for name, info in sessionlog.backends().items() if info.plain_file]
    started = time.monotonic()
    tables, oks, ran = [], [], []
    with tempfile.TemporaryDirectory(prefix="sessionlog-reliability-") as folder:
        directory = Path(folder)
        sections: dict[str, Callable[[], tuple[Table, bool]]] = {
            "kill9": lambda: kill9(names, kills, directory, seed),
            "operator": lambda: operator_kills(kills // 4, directory, seed),
            "agent": lambda: agent_loop(kills, directory, seed),
            "idempotency": lambda: idempotency(kills * 3 // 2, directory, seed),
            "sqlite": lambda: sqlite_writers(kills, directory, seed),
            "postgres": lambda: postgres(kills, seed),
            "nemesis": lambda: nemesis(120 * scale, directory, seed),
            "powerloss": lambda: power_loss(names, traces, directory, seed),
            "bitflips": lambda: bit_flips(names, directory),
            "faults": lambda: faults(names, directory, seed),
            "cancellation": lambda: cancellation(names, rounds, seed),
            "fuzzing": lambda: fuzzing(per_kind, hypothesis_rounds, seed),
            "hostile": hostile,
        }
        assert set(sections) == SECTIONS
        for name, section in sections.items():
            if args.only and name not in args.only:
                continue
            table, ok = section()
            tables.append(table)
            oks.append(ok)
            ran.append(name)
    counts = f"{kills} kills and {traces} traces per backend, {per_kind} mutations per kind, seed {seed}"
    text = render(tables, "soak" if args.soak else "CI counts", counts, time.monotonic() - started)
    if args.only and args.out != "-":
        text = spliced(Path(args.out).read_text(), text)
    if args.out == "-":
        print(text)
    else:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    if not all(oks):
        only = " ".join(f"--only {name}" for name, good in zip(ran, oks, strict=True) if not good)
        print(f"FAILED: rerun with: python scripts/reliability.py --seed {seed} {only} --out -")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
