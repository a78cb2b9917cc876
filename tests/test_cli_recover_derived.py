"""Issue 23, item 1 (CLI): plan, recover and abort without a hand-written --current, from what
the session itself logged, saying so; after an abort the messages say aborted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import sessionlog
from conftest import HEADER


def _tools() -> list[sessionlog.Tool]:
    return [
        sessionlog.Tool("read", lambda arguments: "text", replay="safe"),
        sessionlog.Tool("bash", lambda arguments: "ok"),
    ]


def _session(path: Path) -> sessionlog.Session:
    return sessionlog.Session(sessionlog.create(path, "jsonl", **HEADER), tools=_tools(), model="m")


def _exhausted(path: Path) -> None:
    session = _session(path)
    session.start("do it").attempt()
    session.resume().attempt()  # type: ignore[union-attr]
    session.store.close()


def _pending(path: Path, index: int) -> None:
    session = _session(path)
    run = session.start("do it")
    run.attempt().settle(None, [{"id": "1", "name": "read", "arguments": {}}, {"id": "2", "name": "bash"}])
    calls = run.start_tools()
    for call in calls[:index]:
        call.run()
    calls[index].begin()  # ... and the process dies
    session.store.close()


def test_plan_without_current_uses_the_sessions_configuration_and_says_so(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    _exhausted(path)
    run = cli("plan", path)
    assert run.code == 4, run.err
    assert "blocked: attempts_exhausted" in run.out
    assert "no --current" in run.out and "last recorded" in run.out
    assert f"sessionlog abort {path}" in run.out and "--current ..." not in run.out
    assert cli("plan", path, "--json").json() == {"type": "blocked", "reason": "attempts_exhausted"}


def test_abort_without_current_ends_the_run_and_says_aborted(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    _exhausted(path)
    run = cli("abort", path)
    assert run.code == 0, run.err
    assert "nothing to do" not in run.out and '"completed"' not in run.out
    assert "the run ended: aborted" in run.out
    assert sessionlog.reduce_bytes(path.read_bytes()).last_finished["outcome"] == "aborted"  # type: ignore[index]
    as_json = cli("abort", path, "--json")
    assert as_json.code == 2  # idle now: nothing to abort


def test_abort_json_names_the_outcome(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    _pending(path, 1)
    run = cli("abort", path, "--json")
    assert run.code == 0, run.err
    value = run.json()
    assert value["finished"]["outcome"] == "aborted" and value["currentFrom"] == "session"


def test_recover_without_current_settles_a_pending_bash_then_stops(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    _pending(path, 1)
    run = cli("recover", path)
    assert run.code == 0, run.err
    assert "no --current" in run.out and "interrupted bash" in run.out
    assert "startStep attempt 1" in run.out
    tool = [m for m in sessionlog.reduce_bytes(path.read_bytes()).transcript if m["role"] == "tool"]
    assert tool[1]["content"].startswith("Operation interrupted")


def test_recover_without_current_leaves_a_safe_read_for_the_program(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    _pending(path, 0)
    run = cli("recover", path, "--json")
    assert run.code == 0, run.err
    plan = run.json()["plan"]
    assert plan["type"] == "startTool" and plan["mode"] == "replay" and plan["toolName"] == "read"
    assert run.json()["committed"] == []


def test_a_given_current_is_still_used(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    _exhausted(path)
    current = tmp_path / "current.json"
    session_current = sessionlog.Session(sessionlog.open(path, "jsonl"), tools=_tools(), model="other")
    current.write_text(json.dumps(session_current.current()))  # the program's own, dumped
    session_current.store.close()
    run = cli("plan", path, "--current", current)
    assert run.code == 4 and "no --current" not in run.out


def test_plan_without_current_of_a_run_with_no_attempt_yet(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    session = _session(path)
    session.start("do it")
    session.store.close()
    run = cli("plan", path)
    assert run.code == 0, run.err
    assert "no model attempt yet" in run.out and "startStep attempt 1" in run.out
