"""Hunt flaky tests: run the test commands as CI does, beside a CPU hog and a disk hog.

    python scripts/flake_hunt.py                       # 3 default runs, 2 long ones (~45 min, 2 cores)
    python scripts/flake_hunt.py --default 1 --long 0  # one default run
    python scripts/flake_hunt.py --repeat 20 'tests/test_x.py::test_y'  # one test, 20 times in a row

A busy CI runner is simulated by two hogs, started before the first run and stopped after the
last (each also ends by itself after --hog-minutes): `python -c 'while True: pass'` and a loop of
`dd if=/dev/zero of=FILE bs=1M count=32 conv=fdatasync` in the temporary folder the tests use.
Every run has CI=true (Hypothesis derandomized, tests/replay.py) and the CI's requirements (a
missing PostgreSQL, chromium or shared contract fails). Each run's output goes to --logs; the
closing table names every run's result, its time and the tests that failed, and the exit status
is 1 if any run failed. A test that failed here is called fixed after it alone passes 20 times
in a row under the hogs (--repeat 20 NODEID).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def start_hogs(minutes: float, scratch: Path) -> list[subprocess.Popen[bytes]]:
    """The CPU hog and the disk hog, each in its own process group, ending by themselves after
    `minutes` if nobody stops them first."""
    seconds = str(int(minutes * 60))
    cpu = ["timeout", seconds, sys.executable, "-c", "while True: pass"]
    dd = f'dd if=/dev/zero of="{scratch}/disk-hog" bs=1M count=32 conv=fdatasync 2>/dev/null'
    disk = ["timeout", seconds, "sh", "-c", f"while :; do {dd}; done"]
    return [subprocess.Popen(argv, start_new_session=True) for argv in (cpu, disk)]


def stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    for hog in hogs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(hog.pid, signal.SIGKILL)
        hog.wait()


def run_once(name: str, argv: list[str], logs: Path) -> tuple[bool, float, list[str], str]:
    """One pytest run: passed or not, its seconds, the tests that failed, its closing line."""
    env = dict(os.environ, CI="true", HYPOTHESIS_PROFILE="ci", SESSIONLOG_REQUIRE_POSTGRES="1",
               SESSIONLOG_REQUIRE_CONTRACT="1", SESSIONLOG_REQUIRE_SITE="1")  # fmt: skip
    log = logs / f"{name}.log"
    started = time.monotonic()
    print(f"--> {name}: {shlex.join(argv)} (log: {log})", flush=True)
    with open(log, "wb") as out:  # its own process group: a hunt stopped midway stops it whole
        run = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            status = run.wait()
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGTERM)  # pytest and its workers (a daemonised PostgreSQL stays)
                try:
                    run.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(run.pid, signal.SIGKILL)
                    run.wait()
    took = time.monotonic() - started
    text = log.read_text(errors="replace")
    lines = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    closing = lines[-1].strip("= ") if lines else f"no closing line (exit {status})"
    failed = sorted(set(FAILED.findall(text)))
    print(f"<-- {name}: {'passed' if status == 0 else 'FAILED'} in {took:.0f} s: {closing}", flush=True)
    return status == 0, took, failed, closing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--default", type=int, default=3, help="runs of the default test command (3)")
    parser.add_argument("--long", type=int, default=2, help="runs of pytest -m long (2)")
    parser.add_argument("--repeat", type=int, default=20, help="with NODEIDs: runs of them alone (20)")
    parser.add_argument("--hog-minutes", type=float, default=120, help="the hogs end by themselves after")
    parser.add_argument("--no-hogs", action="store_true", help="run on the machine as it is")
    parser.add_argument("--logs", default=None, help="folder for each run's output (a new temporary one)")
    parser.add_argument("nodeids", nargs="*", help="hunt these tests alone, --repeat times in a row")
    args = parser.parse_args(argv)
    logs = Path(args.logs or tempfile.mkdtemp(prefix="sessionlog-flake-hunt-"))
    logs.mkdir(parents=True, exist_ok=True)
    pytest = [sys.executable, "-m", "pytest", "--durations=25"]
    if args.nodeids:  # -m "" selects long tests too
        runs = [(f"repeat-{i + 1}", [*pytest, "-m", "", *args.nodeids]) for i in range(args.repeat)]
    else:
        runs = [(f"default-{i + 1}", pytest) for i in range(args.default)]
        runs += [(f"long-{i + 1}", [*pytest, "-m", "long"]) for i in range(args.long)]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a `kill` stops the hogs too (finally)
    hogs = [] if args.no_hogs else start_hogs(args.hog_minutes, Path(tempfile.gettempdir()))
    results = []
    try:
        for name, command in runs:
            results.append((name, *run_once(name, command, logs)))
            if args.nodeids and not results[-1][1]:
                break  # "20 times in a row": the first failure ends the streak
    finally:
        stop_hogs(hogs)
    print(f"\n== flake hunt ({'no hogs' if args.no_hogs else 'CPU hog and disk hog beside'}); logs: {logs}")
    for name, ok, took, failed, closing in results:
        print(f"   {name:<10} {'passed' if ok else 'FAILED':<7} {took:6.0f} s  {closing}")
        for nodeid in failed:
            print(f"       failed: {nodeid}")
    green = all(ok for _, ok, *_ in results) and len(results) == len(runs)
    print(f"   {sum(ok for _, ok, *_ in results)} of {len(runs)} runs green")
    return 0 if green else 1


if __name__ == "__main__":
    sys.exit(main())
