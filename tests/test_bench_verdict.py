"""`sessionlog bench`'s verdicts and exit status, on this machine's disk (the bench's smallest
settings: `--tiny`, shape a; a few seconds each).

"Not syncing" is decided by the flushes the device under --dir completed during a row, never by
timing: a backend registered for the test that claims the power class and never syncs is caught
(exit 5, named); with a CPU hog and a disk hog (buffered writes, never a sync, so that the device's
flush counter stays the rows') beside it, the honest backends pass (exit 0) with their flushes
printed. Timing is not asserted anywhere here."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from sessionlog import bench
from sessionlog.backends.jsonl import open_jsonl
from sessionlog.bench import shapes
from sessionlog.bench.flushes import FlushCounter
from sessionlog.core.store import BackendInfo
from sessionlog.plugins.hookspecs import hookimpl
from sessionlog.plugins.registry import Registry, plugin_manager

LIAR = "liar-fsync"
LIAR_COMMITS = 2_000  # a row of the liar's (--tiny: 6)


class _Liar:
    """A plugin: `liar-fsync` says power class, but is `jsonl` (one write a commit, no sync)."""

    @hookimpl
    def register_backends(self, register: Any) -> None:
        register(LIAR, open_jsonl, BackendInfo(LIAR, "power", "sync", "claims power, never syncs"))


class _Failing:
    """A plugin: `broken` opens, and its first commit raises."""

    @hookimpl
    def register_backends(self, register: Any) -> None:
        def open_broken(path: Path, **options: Any) -> Any:
            store = open_jsonl(path, **options)

            def append(*args: Any, **kwargs: Any) -> Any:
                raise OSError(5, "the disk said no")

            store.append = append  # type: ignore[method-assign]
            return store

        register("broken", open_broken, BackendInfo("broken", "power", "sync", "fails its first commit"))


def _registry(plugin: object) -> Registry:
    return Registry(plugin_manager(entry_points=False, plugins=[plugin]))


def _needs_counter(folder: Path) -> None:
    counter = FlushCounter(folder)
    if counter.device is None:
        pytest.skip(f"no device flush counter under {folder}: {counter.unavailable}")


def test_a_backend_that_claims_power_but_never_syncs_is_caught_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device's counter also counts other processes' flushes (a disk hog's, a database's)
    that fall into a row's window: at --tiny's 6 commits a power row, 3 of them hid the liar. Its
    rows get LIAR_COMMITS (cheap: it never syncs), so that those flushes, which grow with the
    window, stay far below half its commits; the honest rows keep --tiny's."""
    _needs_counter(tmp_path)
    sessions_job = shapes.sessions_job

    def more_for_the_liar(
        scratch: Any, backend: str, sessions: int, commits: int, *more: Any, **options: Any
    ) -> Any:
        commits = LIAR_COMMITS if backend == LIAR else commits
        return sessions_job(scratch, backend, sessions, commits, *more, **options)

    monkeypatch.setattr(shapes, "sessions_job", more_for_the_liar)
    argv = ["--dir", str(tmp_path), "--backends", f"{LIAR},jsonl-fsync", "--shape", "a", "--tiny"]
    code = bench.main(argv, registry=_registry(_Liar()))
    out, err = capsys.readouterr()
    assert code == bench.EXIT_NOT_SYNCING == 5, out + err
    verdict = next(line for line in err.splitlines() if "NOT SYNCING" in line)
    assert LIAR in verdict and "jsonl-fsync" not in verdict  # the liar, and only it, is named
    shown = next(line for line in out.splitlines() if f"{LIAR}, a: 1 session, 1 committer, 1 fact:" in line)
    assert f" flushes for {LIAR_COMMITS} commits" in shown  # its flushes are printed, for its commits
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # no scratch left


@contextlib.contextmanager
def _hogs(folder: Path) -> Iterator[None]:
    """A CPU hog and a disk hog (32 MiB rewritten over and over, buffered, never synced)."""
    cpu = "while True: pass"
    disk = (
        "import os, sys\n"
        "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)\n"
        "block = os.urandom(1 << 20)\n"
        "while True:\n"
        "    for offset in range(32):\n"
        "        os.pwrite(fd, block, offset << 20)\n"
    )
    hogs = [
        subprocess.Popen([sys.executable, "-c", cpu]),
        subprocess.Popen([sys.executable, "-c", disk, str(folder / "hog.bin")]),
    ]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def test_beside_a_cpu_hog_and_a_disk_hog_honest_backends_pass_with_their_flushes_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _needs_counter(tmp_path)
    hog_folder, scratch = tmp_path / "hog", tmp_path / "bench"
    hog_folder.mkdir()
    scratch.mkdir()
    names = sorted(sessionlog.backends())
    with _hogs(hog_folder):
        code = bench.main(["--dir", str(scratch), "--backends", ",".join(names), "--shape", "a", "--tiny"])
    out, err = capsys.readouterr()
    assert code == bench.EXIT_OK, err
    assert "NOT SYNCING" not in out + err
    power = [name for name in names if sessionlog.backends()[name].durability != "process"]
    assert power
    for name in power:
        for shape in ("a: 1 session, 1 committer, 1 fact", "a: 1 session, 1 committer, 10 facts"):
            line = next(line for line in out.splitlines() if line.strip().startswith(f"* {name}, {shape}:"))
            assert " flushes for " in line and " commits" in line
    assert "flushes counted on /dev/" in out
    assert list(scratch.iterdir()) == []


def test_a_row_that_fails_is_exit_6_named_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--dir", str(tmp_path), "--backends", "broken", "--shape", "a", "--tiny"]
    code = bench.main(argv, registry=_registry(_Failing()))
    _, err = capsys.readouterr()
    assert code == bench.EXIT_ROW_FAILED == 6
    message = next(line for line in err.splitlines() if "error:" in line)
    assert "the row 'broken' failed: StorePoisonedError" in message and "the disk said no" in message
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_the_exit_codes_are_distinct_from_the_clis_and_documented(cli: Any) -> None:
    from sessionlog import cli as command_line

    cli_codes = {command_line.EXIT_BAD_SESSION, command_line.EXIT_IN_USE, 4}  # 4: recovery blocked
    assert {bench.EXIT_NOT_SYNCING, bench.EXIT_ROW_FAILED, bench.EXIT_INTERRUPTED}.isdisjoint(cli_codes)
    assert bench.EXIT_USAGE == command_line.EXIT_USAGE  # usage means usage everywhere
    run = cli("bench", "--help")
    shown = " ".join(run.out.split())
    assert run.code == 0
    for phrase in ("exit status", "5 a row was caught not syncing", "6 a row failed", "2 usage"):
        assert phrase in shown, phrase
    docs = (Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md").read_text()
    for code in ("`0`", "`2`", "`5`", "`6`", "`130`"):
        assert code in docs, code
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "exits 0 finished, 2 usage, 5 a row caught not syncing, 6 a row failed, 130 interrupted" in readme
