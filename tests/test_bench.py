"""`sessionlog bench`: a smoke run of every shape (numbers too small to mean anything: timing is
the benchmark's business, not a test's), its outputs, and that it leaves no scratch files."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from sessionlog.bench import report
from sessionlog.bench import run as bench_run


def test_every_shape_runs_and_every_row_names_its_ceiling(tmp_path: Path) -> None:
    result = bench_run(str(tmp_path), None, None, "tiny", progress=False)
    shapes = {row["shape"][0] for row in result["rows"]}
    assert shapes == set("abcdefgh")
    assert "f: 1 committer, a session of 300 facts" in {row["shape"] for row in result["rows"]}
    names = {row["name"] for row in result["rows"]}
    assert set(sessionlog.backends()) <= names  # every registered backend has rows
    for row in result["rows"]:
        assert row["per_s"] > 0 and row["min_per_s"] <= row["per_s"] <= row["max_per_s"]
        if row["kind"] != "ceiling" and row["shape"][0] in "abcf":
            assert row["vs_ceiling"] > 0 and row["ceiling_per_s"] > 0, row
    assert list(tmp_path.iterdir()) == []  # no scratch left
    advice = report.recommend(result["rows"])
    assert any("power class" in line for line in advice) and any("process class" in line for line in advice)
    result["recommendation"] = advice
    text = report.text(result)
    assert "Recommendation" in text and "issue" not in text.lower() and "target" not in text.lower()
    assert "| row |" in report.markdown(result)


def test_the_command_line_writes_json_markdown_and_a_plot(tmp_path: Path, cli: Any) -> None:
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (the bench extra)")
    out = tmp_path / "out"
    out.mkdir()
    run = cli(
        "bench",
        "--tiny",
        "--backends",
        "jsonl,jsonl-group",
        "--dir",
        str(tmp_path),
        "--json",
        out / "r.json",
        "--markdown",
        out / "r.md",
        "--plot",
        out / "r.png",
    )
    assert run.code == 0, run.err
    assert "Recommendation" in run.out
    assert json.loads((out / "r.json").read_text())["rows"]
    assert (out / "r.md").read_text().startswith("# sessionlog bench")
    assert (out / "r.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]


def test_not_syncing_is_decided_by_the_device_flushes_never_by_timing_alone() -> None:
    row = {"shape": "a: 1 session, 1 committer, 1 fact", "kind": "backend", "durability": "power"}
    ceiling = {
        "shape": row["shape"],
        "kind": "ceiling",
        "name": "write+fdatasync",
        "flushes": 190,
        "operations": 180,
    }
    rows = [
        ceiling,
        {
            **row,
            "name": "honest but fast",
            "vs_ceiling": 3.0,
            "ceiling": "write+fdatasync",
            "flushes": 170,
            "operations": 180,
        },
        {
            **row,
            "name": "liar",
            "vs_ceiling": 0.9,
            "ceiling": "write+fdatasync",
            "flushes": 2,
            "operations": 180,
        },
        {**row, "name": "process", "durability": "process", "flushes": 0, "operations": 3000},
    ]
    result = {"mode": "quick", "rows": rows, "flush_device": "vda", "flushes": "counted on /dev/vda"}
    assert [line.split(" (")[0] for line in report.not_syncing(result)] == ["liar"]
    assert "honest but fast" in " ".join(report.above_ceiling(result))  # reported, not a verdict
    shown = report.checks({**result, "seconds": 1.0})  # the ceiling had no rounds to move in: no claim it did
    assert any(
        line.startswith("above its ceiling (not a verdict; its flushes are the evidence): honest but fast")
        for line in shown
    ), shown
    assert report.not_syncing({**result, "flush_device": None}) == []  # no counter: no verdict
    unseen = [{**ceiling, "flushes": 0}, *rows[1:]]  # the ceiling's syncs made no flushes it saw
    assert report.not_syncing({**result, "rows": unseen}) == []


def test_with_many_committers_a_flush_covers_at_most_one_commit_of_each() -> None:
    """Shapes b and c (recorded figures of a quick run here): each committer waits for its commit's
    sync before its next, so one flush makes at most one commit of each durable; a power row
    with fewer flushes than half its commits over its committers did not sync. A PostgreSQL row
    is not judged (its server's disk need not be the one under --dir), nor a process-class row."""
    b, c = "b: 1 session, 64 committers", "c: 64 sessions, one writer each"

    def row(shape: str, name: str, flushes: int, operations: int, **more: Any) -> dict[str, Any]:
        kind = "repository" if "repository" in name else "backend"
        return {
            "shape": shape,
            "name": name,
            "kind": kind,
            "durability": "power",
            "flushes": flushes,
            "operations": operations,
            **more,
        }

    ceiling = {"kind": "ceiling", "name": "64 threads: write+fdatasync", "flushes": 1267, "operations": 1920}
    rows = [
        {**ceiling, "shape": b},
        row(b, "jsonl-group", 30, 1920),  # 64 commits a flush: the most one flush can hold
        row(b, "b liar", 14, 1920),  # fewer than half of 1920 / 64
        {**ceiling, "shape": c, "operations": 960, "flushes": 692},
        row(c, "jsonl-syncfs", 65, 960),  # one syncfs a flush for many sessions: 14.8 commits a flush
        row(c, "c liar", 7, 960),
        row(
            c, "postgresql repository, async (power)", 0, 960, on_server=True
        ),  # the server's disk: not judged
        row(c, "jsonl", 0, 2880, durability="process"),
    ]
    result = {"mode": "quick", "rows": rows, "flush_device": "vda", "flushes": "counted on /dev/vda"}
    assert [line.split(" (")[0] for line in report.not_syncing(result)] == ["b liar", "c liar"]
    shown = report.checks({**result, "seconds": 1.0})
    assert (
        "jsonl-group, b: 1 session, 64 committers: 30 flushes for 1920 commits (64 a flush, 64 at most)"
        in shown
    )
    assert not any("postgresql" in line for line in shown)
    blind = [{**rows[0], "flushes": 10}, *rows[1:3]]  # the ceiling's syncs made too few flushes it saw
    assert report.not_syncing({**result, "rows": blind}) == []


def test_a_run_without_a_power_row_to_judge_claims_no_flushes() -> None:
    rows = [
        {
            "shape": "d: load 200 facts",
            "name": "reduce",
            "kind": "backend",
            "durability": "-",
            "flushes": 0,
            "operations": 200,
        }
    ]
    shown = report.checks(
        {
            "mode": "quick",
            "seconds": 1.0,
            "rows": rows,
            "flush_device": "vda",
            "flushes": "flushes counted on /dev/vda",
        }
    )
    assert not any("every power-class row" in line for line in shown)
    assert "no power-class row to judge by its flushes in this run (shapes a, b, c and f have them)" in shown


def test_unknown_backends_are_a_usage_error(cli: Any) -> None:
    run = cli("bench", "--backends", "jsonl,nope")
    assert run.code == 2 and "nope" in run.err and "sqlite-repository" in run.err


def test_python_m_benchmarks_is_a_thin_entry_to_sessionlog_bench() -> None:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--help"], cwd=root, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: sessionlog bench") and "exit status" in done.stdout
    assert sorted(path.name for path in (root / "benchmarks").glob("*.py")) == ["__init__.py", "__main__.py"]


@pytest.mark.parametrize("option", ["--json", "--markdown", "--plot"])
@pytest.mark.parametrize("case", ["in a missing folder", "a directory"])
def test_an_output_file_that_cannot_be_written_is_a_usage_error_before_the_run(
    option: str, case: str, tmp_path: Path, cli: Any
) -> None:
    # Found trying --json as a careless user: the whole run (minutes with --full), then a
    # traceback (FileNotFoundError, IsADirectoryError) and exit 1, its figures lost
    target = tmp_path / "no such folder" / "run.out" if case == "in a missing folder" else tmp_path
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    run = cli("bench", "--tiny", "--shape", "d", "--backends", "jsonl", "--dir", scratch, option, target)
    assert run.code == sessionlog.bench.EXIT_USAGE and "Traceback" not in run.err
    assert run.err.startswith(f"sessionlog bench: error: {option} {target}: ")
    assert run.out == ""  # nothing was measured
    assert list(scratch.iterdir()) == []


def test_a_plot_of_a_run_without_a_plotted_shape_is_a_usage_error_before_the_run(
    tmp_path: Path, cli: Any
) -> None:
    # Found with `--plot F` on a run of no commit-rate shape: the run, then a traceback from
    # matplotlib (no panel to draw: "Number of rows must be a positive integer, not 0"), exit 1,
    # no plot
    run = cli(
        "bench",
        "--tiny",
        "--shape",
        "d",
        "--backends",
        "jsonl",
        "--dir",
        tmp_path,
        "--plot",
        tmp_path / "p.png",
    )
    assert run.code == sessionlog.bench.EXIT_USAGE and "Traceback" not in run.err
    assert "--plot: its panels are shapes a, b, c and f; this run has none of them" in run.err
    assert run.out == "" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("names", ["jsonl,", ",", ""])
def test_an_empty_backend_name_is_a_usage_error(names: str, cli: Any) -> None:
    # Found trying --backends as a careless user: 'jsonl,' named an empty backend ("not a
    # registered backend nor a repository:  (known: ...)") and '' ran every backend
    run = cli("bench", "--backends", names, "--tiny", "--shape", "d")
    assert run.code == 2 and "--backends: an empty name" in run.err and run.out == ""


@pytest.mark.parametrize("option", ["--dir", "--json", "--markdown", "--plot"])
def test_an_empty_path_is_a_usage_error_that_says_so(option: str, tmp_path: Path, cli: Any) -> None:
    # Found trying the options as a careless user: `--dir ''` was "not writable", `--json ''`
    # "a directory, not a file"
    where = [] if option == "--dir" else ["--dir", tmp_path]
    run = cli("bench", "--tiny", "--shape", "a", "--backends", "jsonl", *where, option, "")
    assert run.code == 2 and run.err.strip() == f"sessionlog bench: error: {option}: an empty path"


def test_an_output_file_that_fails_at_the_end_is_one_line_after_the_tables(tmp_path: Path, cli: Any) -> None:
    # Found with `--json /dev/full`: the tables, then a traceback (OSError: No space left on
    # device) and exit 1, which the bench does not document
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here to fail a write")
    run = cli(
        "bench", "--tiny", "--shape", "d", "--backends", "jsonl", "--dir", tmp_path, "--json", "/dev/full"
    )
    assert run.code == 2 and "Traceback" not in run.err
    assert run.err.strip().splitlines()[-1] == (  # after the progress lines
        "sessionlog bench: error: --json /dev/full: could not be written (No space left on device); "
        "the run's tables are above"
    )
    assert "d: load 200 facts" in run.out and list(tmp_path.iterdir()) == []


def test_a_disk_that_fills_during_the_run_is_one_line_and_nothing_left(tiny_disk: Any, cli: Any) -> None:
    # Found with --dir on a full filesystem: the probe folder could be made, then a traceback
    # (OSError: No space left on device) from the run's first session, exit 1
    folder = tiny_disk("64k", "full")
    filler = folder / "filler"
    with contextlib.suppress(OSError), filler.open("wb") as out:
        while True:
            out.write(b"x" * 4096)
            out.flush()
    run = cli("bench", "--tiny", "--shape", "d", "--backends", "jsonl", "--dir", folder)
    assert run.code == 2 and "Traceback" not in run.err, run.err
    assert (
        run.err.strip()
        .splitlines()[-1]
        .startswith(f"sessionlog bench: error: --dir {folder}: No space left on device (during the run")
    )
    assert sorted(path.name for path in folder.iterdir()) == ["filler"]


def test_a_postgres_url_no_row_uses_is_said_to_be_unused(tmp_path: Path, cli: Any) -> None:
    # Found with --backends jsonl and a --postgres URL: the URL was ignored without a word
    url = "postgresql://someone:Sekr3t@db.invalid/x"
    run = cli("bench", "--tiny", "--shape", "d", "--backends", "jsonl", "--dir", tmp_path, "--postgres", url)
    assert run.code == 0
    assert "--postgres is not used: no PostgreSQL row in this run" in run.err and "Sekr3t" not in run.err


def test_a_plot_without_matplotlib_is_a_usage_error_before_the_run(
    tmp_path: Path, cli: Any, monkeypatch: Any
) -> None:
    # Found with --plot where matplotlib is not installed (it is the bench extra's): the whole
    # run, then a ModuleNotFoundError traceback when the plot was drawn, exit 1, the run lost
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ModuleNotFoundError
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    target = tmp_path / "p.png"
    run = cli("bench", "--tiny", "--shape", "a", "--backends", "jsonl", "--dir", scratch, "--plot", target)
    assert run.code == sessionlog.bench.EXIT_USAGE and "Traceback" not in run.err
    assert run.err.strip() == (
        f"sessionlog bench: error: --plot {target}: needs matplotlib, which is not installed "
        "(pip install 'sessionlog[bench]')"
    )
    assert run.out == "" and list(scratch.iterdir()) == [] and not target.exists()


def test_two_outputs_naming_one_file_are_a_usage_error_before_the_run(tmp_path: Path, cli: Any) -> None:
    # Found with --json and --markdown given the same FILE: the markdown silently replaced the JSON
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    same = tmp_path / "run.out"
    run = cli(
        "bench", "--tiny", "--shape", "d", "--backends", "jsonl", "--dir", scratch,
        "--json", same, "--markdown", tmp_path / "." / "run.out",
    )  # fmt: skip
    assert run.code == sessionlog.bench.EXIT_USAGE and "Traceback" not in run.err
    assert run.err.strip() == (
        f"sessionlog bench: error: --markdown {tmp_path / '.' / 'run.out'}: the same file as --json"
    )
    assert run.out == "" and sorted(path.name for path in tmp_path.iterdir()) == ["scratch"]


@pytest.mark.parametrize("kind", ["hard link", "trailing slash", "fifo"])
def test_an_output_that_would_be_lost_or_hang_is_a_usage_error_before_the_run(
    tmp_path: Path, cli: Any, kind: str
) -> None:
    """Found by a review of #38: a hard link to --json given as --markdown passed the same-file
    check (the JSON was replaced); `--json new/` wrote a file `new`; a FIFO passed the check and
    the run hung at its end, writing to it."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    first, second = tmp_path / "run.json", tmp_path / "run.md"
    options: list[Any] = ["--json", first]
    if kind == "hard link":
        first.write_text("")
        os.link(first, second)
        options += ["--markdown", second]
        expected = f"--markdown {second}: the same file as --json"
    elif kind == "trailing slash":
        options = ["--json", f"{tmp_path / 'new'}/"]
        expected = f"--json {tmp_path / 'new'}/: names a folder (a trailing '/'), not a file"
    else:
        os.mkfifo(first)
        expected = f"--json {first}: a FIFO, which would hold the run's end until something reads it"
    before = sorted(path.name for path in tmp_path.iterdir())
    run = cli("bench", "--tiny", "--shape", "d", "--backends", "jsonl", "--dir", scratch, *options)
    assert run.code == sessionlog.bench.EXIT_USAGE and "Traceback" not in run.err
    assert run.err.startswith(f"sessionlog bench: error: {expected}")
    assert run.out == "" and sorted(path.name for path in tmp_path.iterdir()) == before
    assert list(scratch.iterdir()) == []


def test_json_to_dev_stdout_redirected_to_a_file_keeps_the_tables_printed_above(tmp_path: Path) -> None:
    """Found by a review of #38: `--json /dev/stdout > run.txt` opened the file anew, truncated,
    and the printed tables were lost; the JSON now follows them on the stream itself."""
    scratch, out = tmp_path / "scratch", tmp_path / "run.txt"
    scratch.mkdir()
    with out.open("w") as stdout:
        done = subprocess.run(
            [sys.executable, "-m", "sessionlog", "bench", "--tiny", "--shape", "d", "--backends", "jsonl",
             "--dir", str(scratch), "--json", "/dev/stdout"],
            stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=300,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    printed = out.read_text()
    tables, brace, json_text = printed.partition("\n{")
    assert "Recommendation" in tables and brace
    assert json.loads("{" + json_text)["rows"]


def test_an_output_through_a_dangling_link_is_a_usage_error_before_the_run(tmp_path: Path, cli: Any) -> None:
    # A symbolic link to a file in a folder that is missing: the folder the FILE is written in is
    # the link's target's, not the link's
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    link = tmp_path / "run.json"
    link.symlink_to(tmp_path / "no such folder" / "run.json")
    run = cli("bench", "--tiny", "--shape", "d", "--backends", "jsonl", "--dir", scratch, "--json", link)
    assert run.code == sessionlog.bench.EXIT_USAGE and "Traceback" not in run.err
    assert run.err.startswith(f"sessionlog bench: error: --json {link}: no such folder ")
    assert run.out == "" and sorted(path.name for path in tmp_path.iterdir()) == ["run.json", "scratch"]


@pytest.mark.parametrize("shape", ["e", "h"])
def test_a_repository_that_cannot_be_filled_is_a_named_failed_row(
    shape: str, tmp_path: Path, cli: Any, monkeypatch: Any
) -> None:
    # Found with a server that refused the repository while shape e filled it: the filling and
    # the opening are no measured round, and their error was a raw traceback, exit 1
    from sessionlog.bench import restart

    def fill_fails(kind: str, location: str, sessions: int) -> None:
        raise RuntimeError("the disk said no")

    monkeypatch.setattr(restart, "fill", fill_fails)
    argv = ["--tiny", "--shape", shape, "--backends", "directory-repository", "--dir", tmp_path]
    run = cli("bench", *argv)
    assert run.code == sessionlog.bench.EXIT_ROW_FAILED and "Traceback" not in run.err
    row = "directory: list" if shape == "e" else "directory repository: reopen, list, claim the unfinished"
    assert run.err.strip().splitlines()[-1] == (
        f"sessionlog bench: error: the row {row!r} failed: RuntimeError: the disk said no; nothing is "
        "left of the run"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_plot_leaves_nothing_of_matplotlibs_in_home(tmp_path: Path) -> None:
    # Found with --plot: ~/.cache/matplotlib/fontlist-*.json and ~/.config/matplotlib left in the
    # user's HOME. A child process: matplotlib picks its folders once, at its first import.
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (the bench extra)")
    home, run, out = tmp_path / "home", tmp_path / "run", tmp_path / "out"
    for folder in (home, run, out):
        folder.mkdir()
    mine = ("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME")
    environment = {key: value for key, value in os.environ.items() if key not in mine}
    environment |= {"HOME": str(home), "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = ["--tiny", "--shape", "a", "--backends", "jsonl", "--dir", run, "--plot", out / "r.png"]
    done = subprocess.run(
        [sys.executable, "-m", "sessionlog", "bench", *map(str, argv)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=600,  # a bound for a hang only
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (out / "r.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(str(path.relative_to(home)) for path in home.rglob("*")) == []
    assert list(run.iterdir()) == []
