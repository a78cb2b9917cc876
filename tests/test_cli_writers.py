"""The CLI's writing commands (repair, repair --quarantine, recover, convert) next to a live
writer, on a corrupt log, and when they go wrong: they take the writer lock, refuse with exit 3
while the session is in use, and never leave a partial copy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from sessionlog.cli import convert as convert_module
from sessionlog.cli import sessions as sessions_module
from test_cli import mid_crash, torn
from test_recovery import CURRENT

_HOLDER = """
import os, sys, sessionlog
store = sessionlog.open(sys.argv[1], "jsonl")
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
os.write(fd, b'{"kind":"entry","entry":{"type":"mes')  # the agent, in the middle of a short write
print("writing", flush=True)
sys.stdin.read()
"""


def test_writing_commands_refuse_a_session_held_by_a_live_writer(cli: Any, tmp_path: Path) -> None:
    path = mid_crash(tmp_path / "s.jsonl")
    current = tmp_path / "current.json"
    current.write_text(json.dumps(CURRENT))
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "writing"
        in_progress = path.read_bytes()
        for argv in (
            ["repair", path],
            ["repair", path, "--quarantine"],
            ["recover", path, "--current", current],
        ):
            run = cli(*argv)
            assert run.code == 3, (argv, run.err)
            assert "in use" in run.err and str(path) in run.err
            assert path.read_bytes() == in_progress  # the write in progress is left alone
    finally:
        holder.communicate("", timeout=30)


def test_repair_reports_what_it_cut_under_the_lock_never_a_negative_count(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = torn(mid_crash(tmp_path / "s.jsonl"))
    stale = path.read_bytes()[:-10]  # what a read saw before the torn write grew the file
    real = sessions_module.read_session

    def stale_first(*args: Any) -> tuple[bytes, dict[str, Any]]:
        monkeypatch.setattr(sessions_module, "read_session", real)
        return stale, {}

    monkeypatch.setattr(sessions_module, "read_session", stale_first)
    size = path.stat().st_size
    run = cli("repair", path)
    assert run.code == 0, run.err
    dropped = size - path.stat().st_size
    assert dropped > 0 and f"dropped a torn tail of {dropped:,} bytes" in run.out


# -- quarantine --------------------------------------------------------------------------------


def _corrupt_line(path: Path, line: int) -> bytes:
    data = path.read_bytes()
    starts = [0, *[index + 1 for index, byte in enumerate(data) if byte == 0x0A]]
    at = starts[line - 1] + 2
    path.write_bytes(data[:at] + b"#" + data[at + 1 :])
    return data


def test_quarantine_moves_the_bad_tail_aside_and_the_session_opens_again(cli: Any, tmp_path: Path) -> None:
    path = mid_crash(tmp_path / "s.jsonl")
    original = _corrupt_line(path, 4)
    corrupt = path.read_bytes()
    lines = corrupt.count(b"\n")
    assert cli("repair", path).code == 1  # the plain repair refuses corruption
    dry = cli("repair", path, "--quarantine", "--dry-run")
    assert dry.code == 0 and "would move" in dry.out
    assert path.read_bytes() == corrupt
    run = cli("repair", path, "--quarantine")
    assert run.code == 0, run.err
    starts = [0, *[index + 1 for index, byte in enumerate(corrupt) if byte == 0x0A]]
    side = path.with_name(f"{path.name}.quarantine.{starts[3]}")
    assert side.read_bytes() == corrupt[starts[3] :]  # everything from the bad line, unchanged
    assert path.read_bytes() == corrupt[: starts[3]]
    assert f"moved {lines - 3} lines from line 4" in run.out and str(side) in run.out
    assert "seq 4-" in run.out or "seq 3-" in run.out  # the seqs of the lines that still parse
    assert f"{len(corrupt) - starts[3]:,} bytes" in run.out
    with sessionlog.open(path) as store:
        assert store.load().repaired_length == starts[3]
    assert original[: starts[3]] == path.read_bytes()
    again = cli("repair", path, "--quarantine")
    assert again.code == 0 and "nothing to quarantine" in again.out


def test_quarantine_refuses_a_bad_header(cli: Any, tmp_path: Path) -> None:
    path = mid_crash(tmp_path / "s.jsonl")
    _corrupt_line(path, 1)
    before = path.read_bytes()
    assert cli("repair", path, "--quarantine").code == 1
    assert path.read_bytes() == before and list(tmp_path.iterdir()) == [path]


# -- convert -----------------------------------------------------------------------------------


def test_a_failed_convert_leaves_no_copy_and_no_temporary(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = mid_crash(tmp_path / "s.jsonl")
    copy = tmp_path / "copy.jsonl"

    def broken(*args: Any) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(convert_module, "sync_file", broken)
    assert cli("convert", path, copy, "--to", "jsonl-fsync").code == 1
    assert sorted(item.name for item in tmp_path.iterdir()) == ["s.jsonl"]
    monkeypatch.undo()
    assert cli("convert", path, copy, "--to", "jsonl-fsync").code == 0
    assert copy.read_bytes() == path.read_bytes()
    run = cli("convert", path, copy, "--to", "jsonl")
    assert run.code == 2 and "already exists" in run.err  # never overwrites


def test_verify_refuses_a_damaged_line_end_that_a_store_would_not_cut(cli: Any, tmp_path: Path) -> None:
    path = mid_crash(tmp_path / "s.jsonl")
    data = path.read_bytes()
    path.write_bytes(data[:-1] + b"\x0b")  # one flipped bit turned the last LF into VT
    run = cli("verify", path)
    assert run.code == 1 and "damaged line end" in run.err
    assert cli("repair", path).code == 1
    assert path.read_bytes() == data[:-1] + b"\x0b"
