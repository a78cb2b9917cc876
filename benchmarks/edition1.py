"""`python -m benchmarks.edition1`: the first edition of the benchmark (see suite.py): every backend,
the ceilings and the peers in one run, with the issue targets (`--targets`)."""

from __future__ import annotations

import argparse
import pathlib
import sys

from rich.console import Console

from benchmarks import render, suite

RESULTS = pathlib.Path("bench-results")


def main(argv: list[str] | None = None, plan: suite.Plan | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.edition1", description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the default: under 90 s on 2 cores")
    mode.add_argument("--full", action="store_true", help="more rounds and larger sessions")
    parser.add_argument(
        "--targets",
        action="store_true",
        help="also run benchmarks.reduce / stores / async_backends for the issue targets (minutes)",
    )
    parser.add_argument("--json", type=pathlib.Path, default=RESULTS / "run.json", help="rows + metadata")
    parser.add_argument("--plot", type=pathlib.Path, default=RESULTS / "run.png", help="PNG of commits/s")
    parser.add_argument("--markdown", type=pathlib.Path, help="also write the tables as markdown")
    parser.add_argument(
        "--dir",
        type=pathlib.Path,
        default=RESULTS / "scratch",
        help="where the sessions are written (the filesystem under test); emptied afterwards",
    )
    args = parser.parse_args(argv)
    plan = plan or (suite.FULL if args.full else suite.QUICK)
    if args.targets:
        plan = suite.with_targets(plan)
    console = Console()
    if not console.is_terminal:
        console = Console(width=180)  # a log file or a pipe: no wrapping of the tables
    scratch = args.dir / "run"
    try:
        with render.progress_bars(console) as progress:
            run = suite.run(plan, scratch, progress)
    finally:
        suite.scratch(scratch)
    render.write_json(run, args.json)
    render.plot(run, args.plot)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(render.markdown_report(run) + "\n")
    render.show(console, run)
    console.print(f"wrote {args.json} and {args.plot}")
    if not run["check"]["passed"]:
        console.print("[bold white on red]HARD CHECK FAILED: a power-class backend is not syncing[/]")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
