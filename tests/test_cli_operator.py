"""The CLI at 3 a.m.: what a model put in a session cannot drive the terminal, special files
cannot hang it, and every outcome has its own exit status."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from sessionlog.core import facts as F
from test_cli import mid_crash
from test_recovery import CURRENT, new_store, pending_tools

ESCAPES = "\x1b[2K\x1b[1A\r"  # erase the line, go up: hides what was printed before


def test_inspect_escapes_control_characters_from_the_session(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with new_store(path) as store:
        call = F.tool_call(f"call{ESCAPES}", "write", json.dumps({"path": "deploy.sh --prod"}))
        pending_tools(store, [call])
    run = cli("inspect", path)
    assert run.code == 0, run.err
    assert "\x1b" not in run.out and "\r" not in run.out
    assert "\\x1b[2K\\x1b[1A\\x0d" in run.out and "deploy.sh --prod" in run.out
    as_json = cli("inspect", path, "--json")
    assert as_json.json()["pendingIntents"][0]["toolCallId"] == f"call{ESCAPES}"  # JSON keeps the data


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "directory"])
def test_a_special_file_is_refused_without_hanging_or_reading_it(
    cli: Any, tmp_path: Path, special: str
) -> None:
    if special == "fifo":
        target = tmp_path / "fifo"
        os.mkfifo(target)
    elif special == "directory":
        target = tmp_path
    else:
        target = Path(special)
    for argv in (["verify", target], ["inspect", target], ["reduce", target]):
        run = cli(*argv)
        assert run.code == 2 and ("not a regular file" in run.err or "directory" in run.err), run.err
    session = mid_crash(tmp_path / "s.jsonl")
    run = cli("plan", session, "--current", target)
    assert run.code == 2 and "--current" in run.err


def test_a_huge_current_file_is_refused(cli: Any, tmp_path: Path) -> None:
    session = mid_crash(tmp_path / "s.jsonl")
    current = tmp_path / "current.json"
    with open(current, "wb") as file:
        file.truncate(64 << 20)
    run = cli("plan", session, "--current", current)
    assert run.code == 2 and "more than" in run.err


def _current(tmp_path: Path) -> Path:
    current = tmp_path / "current.json"
    current.write_text(json.dumps(CURRENT))
    return current
