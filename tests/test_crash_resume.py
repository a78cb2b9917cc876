"""The crash-and-resume walk-through of docs/cli.md, end to end with real processes: run the
example agent until it dies inside the write tool, inspect, recover, run it again to the end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from sessionlog.core.reducer import SYNTHETIC_CONTENT

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "crash_resume.py"
GREETING = "hello from the agent\n"

pytestmark = pytest.mark.skipif(not EXAMPLE.is_file(), reason="examples/crash_resume.py is absent")


def run(*argv: Any, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *map(str, argv)], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def agent(*argv: Any, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run(EXAMPLE, "session.jsonl", "workspace", *argv, cwd=cwd)


def cli(*argv: Any, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run("-m", "sessionlog.cli", *argv, cwd=cwd)


def records(path: Path, kind: str) -> list[dict[str, Any]]:
    found = []
    for line in path.read_bytes().splitlines()[1:]:
        value = json.loads(line)
        for fact in value if isinstance(value, list) else [value]:
            if fact["kind"] == "record" and fact["record"]["type"] == kind:
                found.append(fact)
    return found


def crash(tmp_path: Path) -> Path:
    crashed = agent("--crash-in-tool", cwd=tmp_path)
    assert crashed.returncode == 1, crashed.stderr
    assert "crash" in crashed.stdout
    assert crashed.stderr == ""
    return tmp_path / "session.jsonl"


def assert_completed(tmp_path: Path, session: Path) -> None:
    notes = tmp_path / "workspace" / "notes.txt"
    assert notes.read_text() == GREETING  # the write happened once: in the crashed run, never again
    state = sessionlog.reduce_bytes(session.read_bytes())
    assert state.is_idle
    write_intent, read_intent = (fact["record"] for fact in records(session, "toolStarted"))
    assert (write_intent["toolName"], read_intent["toolName"]) == ("write", "read")
    tools = {
        message["tool_call_id"]: message["content"]
        for message in state.transcript
        if message["role"] == "tool"
    }
    assert tools == {"call_write": SYNTHETIC_CONTENT["interrupted"], "call_read": GREETING}
    results = {}
    for line in session.read_bytes().splitlines()[1:]:
        value = json.loads(line)
        for fact in value if isinstance(value, list) else [value]:
            if fact["kind"] == "entry" and fact["entry"].get("toolStartedId"):
                results[fact["entry"]["toolName"]] = fact
    # Both results bear the ids their intents reserved; the read's is a real (replayed) result.
    assert results["write"]["id"] == write_intent["resultEntryId"]
    assert results["write"]["entry"]["result"] == {"type": "synthetic", "reason": "interrupted"}
    assert results["read"]["id"] == read_intent["resultEntryId"]
    assert results["read"]["entry"]["result"] == {"type": "success"}
    (finished,) = records(session, "operationFinished")
    assert (finished["record"]["outcome"], finished["record"]["completion"]) == ("completed", "normal")
    assert state.transcript[-1]["role"] == "assistant"
    assert GREETING.strip() in state.transcript[-1]["content"]


def test_the_walk_through(tmp_path: Path) -> None:
    session = crash(tmp_path)
    current = tmp_path / "current.json"
    assert json.loads(current.read_text())["environmentIdentity"] == str((tmp_path / "workspace").resolve())
    assert (tmp_path / "workspace" / "notes.txt").read_text() == GREETING  # the effect happened

    inspected = cli("inspect", "session.jsonl", cwd=tmp_path)
    assert inspected.returncode == 0, inspected.stderr
    assert "pending      2 tool intents without a result" in inspected.stdout
    assert "[0] write call_write (replay never" in inspected.stdout
    assert "[1] read call_read (replay safe" in inspected.stdout

    planned = cli("plan", "session.jsonl", "--current", "current.json", "--json", cwd=tmp_path)
    assert planned.returncode == 0
    assert json.loads(planned.stdout)["results"][0]["reason"] == "interrupted"

    recovered = cli("recover", "session.jsonl", "--current", "current.json", cwd=tmp_path)
    assert recovered.returncode == 0, recovered.stderr
    assert "appendSynthetic interrupted write (call 0)" in recovered.stdout
    assert "plan left: startTool replay read (call 1)" in recovered.stdout
    again = cli("recover", "session.jsonl", "--current", "current.json", "--json", cwd=tmp_path)
    assert json.loads(again.stdout)["committed"] == []

    resumed = agent(cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "replay   read" in resumed.stdout
    assert "tool     write" not in resumed.stdout
    assert "synthetic result interrupted write" not in resumed.stdout  # the CLI had settled it
    assert_completed(tmp_path, session)

    assert cli("verify", "session.jsonl", cwd=tmp_path).returncode == 0
    before = session.read_bytes()
    final = agent(cwd=tmp_path)  # a finished session: nothing to resume, nothing written
    assert final.returncode == 0
    assert "nothing to resume" in final.stdout
    assert session.read_bytes() == before


def test_the_example_recovers_by_itself(tmp_path: Path) -> None:
    session = crash(tmp_path)
    resumed = agent(cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "synthetic result interrupted write" in resumed.stdout
    assert "replay   read" in resumed.stdout
    assert_completed(tmp_path, session)


def test_a_run_without_a_crash_runs_each_tool_once(tmp_path: Path) -> None:
    done = agent(cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "tool     write" in done.stdout
    assert "replay" not in done.stdout
    state = sessionlog.reduce_bytes((tmp_path / "session.jsonl").read_bytes())
    assert state.is_idle
    assert [m["content"] for m in state.transcript if m["role"] == "tool"][1] == GREETING
    printed = agent("--print-current", cwd=tmp_path)
    assert json.loads(printed.stdout) == json.loads((tmp_path / "current.json").read_text())
