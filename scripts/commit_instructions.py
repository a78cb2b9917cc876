"""Count the CPU instructions of one commit (valgrind callgrind), the interpreter's start excluded.

    python scripts/commit_instructions.py [--backend jsonl] [--commits 2000] [--source DIR]
    python scripts/commit_instructions.py --backend postgres --postgres URL
    python scripts/commit_instructions.py --top 15      # also the C functions that cost most

Each figure is the difference of two runs under callgrind, one making `--commits` commits and
one making twice as many after the same start and the same warm-up, divided by `--commits`: what
one more commit costs in the thread that commits (for PostgreSQL the client's side: the server's
work, the pool's and the heartbeat's threads are not counted). The transaction is the bench's
(one user message of a ~550-byte line). `--source` runs another checkout's package (its `src`
folder first on sys.path), to compare before and after a change on the same machine.
PYTHONHASHSEED is fixed, so two runs of a file backend differ by a few hundred instructions a
commit at most (PostgreSQL's by more: the socket's waits).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The bench's transaction (`sessionlog.bench.shapes`): one user message, a ~550-byte line.
HEADER = {"provider": "bench", "model": "bench", "cwd": "/bench"}
TEXT = "x" * 380

WARM_UP = 200


def commit_loop(backend: str, commits: int, postgres: str | None) -> None:
    """The measured program: open a store, warm up, then `commits` commits."""
    import sessionlog
    from sessionlog.core import facts as F

    def transaction(index: int, _: int) -> list[dict[str, object]]:
        return [F.user_message(f"{index}:0 {TEXT}")]

    folder = tempfile.mkdtemp(prefix="commit-instructions-")
    if backend == "postgres":
        repository = sessionlog.repository(postgres)
        store = repository.create(**HEADER)
    else:
        repository = None
        store = sessionlog.create(Path(folder) / "s.jsonl", backend, **HEADER)
    with store:
        for index in range(WARM_UP):
            store.commit(transaction(index, 1))
        for index in range(commits):
            store.commit(transaction(index, 1))
    if repository is not None:
        repository.close()
    shutil.rmtree(folder)


def instructions(args: argparse.Namespace, commits: int, out: Path) -> int:
    command = [
        "valgrind",
        "--tool=callgrind",
        "--separate-threads=yes",  # the main thread's count alone: the pool's and heartbeat's apart
        f"--callgrind-out-file={out}",
        sys.executable,
        __file__,
        "--child",
        "--backend",
        args.backend,
        "--commits",
        str(commits),
    ]
    if args.postgres:
        command += ["--postgres", args.postgres]
    # its snapshots signed with a key of its scratch, never one made in the user's HOME
    env = {**os.environ, "PYTHONHASHSEED": "0", "SESSIONLOG_STATE_DIR": str(out.parent / "state")}
    if args.source:
        env["PYTHONPATH"] = str(Path(args.source) / "src")
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    main_thread = Path(f"{out}-01")
    text = main_thread.read_text() if main_thread.exists() else ""
    found = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
    if done.returncode or found is None:
        sys.exit(f"callgrind run failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return int(found.group(1))


def top_functions(before: Path, after: Path, commits: int, count: int) -> list[tuple[int, str]]:
    """The C functions whose self cost grew most between the two runs, per commit."""

    def self_costs(path: Path) -> dict[str, int]:
        text = subprocess.run(
            ["callgrind_annotate", "--threshold=100", str(path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        costs: dict[str, int] = {}
        for line in text.splitlines():
            match = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(\S.*)$", line)
            if match:
                costs[match.group(2)] = int(match.group(1).replace(",", ""))
        return costs

    small, big = self_costs(before), self_costs(after)
    grown = [
        ((big[name] - small.get(name, 0)) // commits, re.sub(r"\S*/", "", name))
        for name in big
        if name != "PROGRAM TOTALS"
    ]
    return sorted(grown, reverse=True)[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="jsonl", help="a file backend's name, or postgres")
    parser.add_argument("--commits", type=int, default=2000)
    parser.add_argument("--postgres", metavar="URL", help="the database of --backend postgres")
    parser.add_argument("--source", metavar="DIR", help="a checkout whose src/ to measure")
    parser.add_argument("--top", type=int, default=0, help="list the N C functions that cost most")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.backend == "postgres" and not args.postgres:
        parser.error("--backend postgres needs --postgres URL")
    if args.child:
        commit_loop(args.backend, args.commits, args.postgres)
        return
    with tempfile.TemporaryDirectory() as scratch:
        once, twice = Path(scratch) / "once.out", Path(scratch) / "twice.out"
        first = instructions(args, args.commits, once)
        second = instructions(args, 2 * args.commits, twice)
        once, twice = Path(f"{once}-01"), Path(f"{twice}-01")
        where = args.source or "this checkout"
        print(f"{args.backend}: {(second - first) / args.commits:,.0f} instructions a commit ({where})")
        for cost, name in top_functions(once, twice, args.commits, args.top) if args.top else []:
            print(f"{cost:>10,}  {name}")


if __name__ == "__main__":
    main()
