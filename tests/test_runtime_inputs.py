"""Issue 23: the runtime keeps results in hand and validates like the store."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from conftest import HEADER


def _session(tmp_path: Path, run: Any) -> sessionlog.Session:
    store = sessionlog.create(tmp_path / "s.jsonl", "jsonl", **HEADER)
    return sessionlog.Session(store, tools=[sessionlog.Tool("t", run, replay="safe")], model="m")


def _one_call(session: sessionlog.Session) -> sessionlog.runtime.ToolCall:
    run = session.start("x")
    run.attempt().settle(None, [{"id": "1", "name": "t", "arguments": {}}])
    (call,) = run.start_tools()
    return call


def _results(session: sessionlog.Session) -> list[str]:
    return [m["content"] for m in session.state.transcript if m["role"] == "tool"]


def test_a_json_result_is_recorded_as_json_text(tmp_path: Path) -> None:
    session = _session(tmp_path, lambda arguments: {"b": [1, 2.5, None]})
    _one_call(session).run()
    assert json.loads(_results(session)[0]) == {"b": [1, 2.5, None]}
    session.store.close()


def test_a_result_that_is_not_json_is_an_error_naming_its_type(tmp_path: Path) -> None:
    session = _session(tmp_path, lambda arguments: b"bytes")
    _one_call(session).run()
    (result,) = _results(session)
    assert "bytes" in result
    assert session.state.tool_calls[0]["status"] != "pending"
    session.store.close()


def test_lone_surrogates_are_escaped_and_never_wedge_resume(tmp_path: Path) -> None:
    session = _session(tmp_path, lambda arguments: "name-\udcff.txt")
    _one_call(session).run()
    (result,) = _results(session)
    assert "name-\\udcff.txt" in result and "escape" in result
    assert session.resume() is not None
    session.store.close()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), datetime.datetime(2026, 1, 1)])
def test_settle_refuses_non_json_arguments_with_their_path(tmp_path: Path, bad: Any) -> None:
    session = _session(tmp_path, lambda arguments: "ok")
    run = session.start("x")
    attempt = run.attempt()
    before = (tmp_path / "s.jsonl").read_bytes()
    with pytest.raises(ValueError, match=r"tool_calls\[0\]\.arguments"):
        attempt.settle(None, [{"id": "1", "name": "t", "arguments": {"x": bad}}])
    assert (tmp_path / "s.jsonl").read_bytes() == before
    session.store.close()


def test_a_second_attempt_while_one_is_open_is_a_typed_error(tmp_path: Path) -> None:
    session = _session(tmp_path, lambda arguments: "ok")
    run = session.start("x")
    first = run.attempt()
    with pytest.raises(sessionlog.runtime.AttemptOpenError):
        run.attempt()
    first.settle("answer")
    assert run.finish()["outcome"] == "completed"
    session.store.close()


def test_wrong_argument_types_raise_type_error_at_construction(tmp_path: Path) -> None:
    store = sessionlog.create(tmp_path / "s.jsonl", "jsonl", **HEADER)
    tool = sessionlog.Tool("t", lambda arguments: "ok")
    with pytest.raises(TypeError, match="model"):
        sessionlog.Session(store, model={"name": "m"}, tools=[tool])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="system_prompt"):
        sessionlog.Session(store, model="m", tools=[tool], system_prompt=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sessionlog.Session(store, model="m", tools="t")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sessionlog.Tool(3, lambda arguments: "ok")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sessionlog.Tool("t", lambda arguments: "ok", description=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sessionlog.Tools(tool)  # type: ignore[arg-type]
    store.close()
