"""Issue 23, item 2: never wrong about what ran, never out of order.

A tool that never started is never settled as interrupted (one intent per tool, committed right
before that tool runs), and tools never run or replay out of the model's order (on resume, a
pending call is settled before any later call of the same step starts)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from conftest import FIXTURES, HEADER, PLANNER_FIXTURES, SHARED, needs_shared, shared_manifest
from sessionlog.runtime import ToolCall as ToolCallTwin


class Killed(BaseException):
    """Stands for SIGKILL inside a tool: not an Exception, so the runtime records nothing."""


class Tools:
    """read (safe), write and bash (never); each logs itself as it begins. `kill_in` names a
    call id whose tool dies after its effect began."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.kill_in: str | None = None

    def declare(self) -> list[sessionlog.Tool]:
        def make(name: str) -> Any:
            def tool(arguments: dict[str, Any]) -> str:
                self.log.append(f"{name} {arguments['key']}")
                if self.kill_in == f"{name} {arguments['key']}":
                    self.kill_in = None
                    raise Killed
                return f"{name} {arguments['key']} done"

            return tool

        return [
            sessionlog.Tool("read", make("read"), replay="safe"),
            sessionlog.Tool("write", make("write")),
            sessionlog.Tool("bash", make("bash")),
        ]


def calls(step: int) -> list[dict[str, Any]]:
    return [
        {"id": f"{name[0]}{step}", "name": name, "arguments": {"key": str(step)}}
        for name in ("read", "write", "bash")
    ]


def _session(path: Path, tools: Tools, **options: Any) -> sessionlog.Session:
    store = sessionlog.open(path, "jsonl") if path.exists() else sessionlog.create(path, "jsonl", **HEADER)
    return sessionlog.Session(store, tools=tools.declare(), model="m", **options)


def _drive(session: sessionlog.Session, run: sessionlog.Run, steps: int = 2) -> dict[str, Any]:
    while run.needs_model:
        attempt = run.attempt()
        step = sum(1 for m in session.state.transcript if m["role"] == "assistant")
        attempt.settle(None, calls(step)) if step < steps else attempt.settle("done")
        for call in run.start_tools():
            call.run()
    return run.finish()


def _results(session: sessionlog.Session) -> list[str]:
    return [m["content"] for m in session.state.transcript if m["role"] == "tool"]


def _killed_and_resumed(path: Path, tools: Any, kill_in: str, **options: Any) -> tuple[Any, Any]:
    """The loop killed in `kill_in` and its session opened again: (the new session, its resumed run)."""
    tools.kill_in = kill_in
    session = _session(path, tools, **options)
    with pytest.raises(Killed):
        _drive(session, session.start("go"))
    session.store.close()
    again = _session(path, tools, **options)
    run = again.resume()
    assert run is not None
    return again, run


def test_a_kill_during_the_first_tool_settles_no_later_tool_as_interrupted(tmp_path: Path) -> None:
    tools = Tools()
    again, run = _killed_and_resumed(tmp_path / "s.jsonl", tools, "write 0")
    assert _drive(again, run)["outcome"] == "completed"
    # write 0 may have run: interrupted; bash 0 never started: it runs now, once
    assert tools.log == ["read 0", "write 0", "bash 0", "read 1", "write 1", "bash 1"]
    results = _results(again)
    assert results[0] == "read 0 done" and results[1].startswith("Operation interrupted")
    assert results[2] == "bash 0 done"
    again.store.close()


def test_a_safe_read_is_replayed_before_any_later_tool_starts(tmp_path: Path) -> None:
    tools = Tools()
    again, run = _killed_and_resumed(tmp_path / "s.jsonl", tools, "read 0")
    _drive(again, run)
    assert tools.log[:4] == ["read 0", "read 0", "write 0", "bash 0"]  # the model's order
    assert _results(again)[:3] == ["read 0 done", "write 0 done", "bash 0 done"]
    again.store.close()


def test_each_intent_is_committed_right_before_its_tool(tmp_path: Path) -> None:
    tools = Tools()
    session = _session(tmp_path / "s.jsonl", tools)
    _drive(session, session.start("go"), steps=1)
    kinds = []
    for line in (tmp_path / "s.jsonl").read_bytes().splitlines()[1:]:
        value = json.loads(line)
        for fact in value if isinstance(value, list) else [value]:
            record = fact.get("record") or {}
            if record.get("type") == "toolStarted":
                kinds.append(f"intent {record['toolName']}")
            elif (fact.get("entry") or {}).get("type") == "message" and "toolStartedId" in fact["entry"]:
                kinds.append(f"result {fact['entry']['toolName']}")
    assert kinds == [
        "intent read", "result read", "intent write", "result write", "intent bash", "result bash"
    ]  # fmt: skip
    session.store.close()


def test_the_step_design_is_an_explicit_option_and_keeps_its_behaviour(tmp_path: Path) -> None:
    tools = Tools()
    again, run = _killed_and_resumed(tmp_path / "s.jsonl", tools, "read 0", intents="step")
    _drive(again, run)
    # every intent was durable before read ran: write and bash may have run, as far as the log
    # knows, so they are settled as interrupted although they never started (the cost of the option)
    assert tools.log[:3] == ["read 0", "read 0", "read 1"]
    assert [r.startswith("Operation interrupted") for r in _results(again)[:3]] == [False, True, True]
    with pytest.raises(ValueError, match="intents"):
        sessionlog.Session(again.store, tools=tools.declare(), model="m", intents="batch")
    again.store.close()


def test_a_tool_run_by_hand_needs_its_intent_first(tmp_path: Path) -> None:
    tools = Tools()
    session = _session(tmp_path / "s.jsonl", tools)
    run = session.start("go")
    run.attempt().settle(None, calls(0))
    first, second, third = run.start_tools()
    with pytest.raises(sessionlog.RuntimeStateError, match="begin"):
        first.finish("by hand")  # its intent is not durable: the effect would come first
    first.begin()
    first.finish("by hand")
    with pytest.raises(sessionlog.RuntimeStateError, match="order"):
        third.begin()  # write comes first
    second.run()
    third.run()
    assert _results(session) == ["by hand", "write 0 done", "bash 0 done"]
    again = run.start_tools  # the step is done: nothing left to start
    assert again() == []
    twin = ToolCallTwin(session, first.start)
    with pytest.raises(sessionlog.RuntimeStateError, match="already"):
        twin.begin()
    session.store.close()


def test_the_async_twin_runs_tools_in_order_with_one_intent_each(tmp_path: Path) -> None:
    tools = Tools()
    tools.kill_in = "read 0"

    async def drive(session: sessionlog.AsyncSession, run: Any) -> None:
        while run.needs_model:
            attempt = await run.attempt()
            step = sum(1 for m in (await session.state()).transcript if m["role"] == "assistant")
            await (attempt.settle(None, calls(step)) if step < 1 else attempt.settle("done"))
            for call in await run.start_tools():
                await call.run()
        await run.finish()

    async def main() -> None:
        path = tmp_path / "s.jsonl"
        store = await sessionlog.create_async(path, "jsonl-group", **HEADER)
        session = sessionlog.AsyncSession(store, tools=tools.declare(), model="m")
        with pytest.raises(Killed):
            await drive(session, await session.start("go"))
        await store.close()
        store = await sessionlog.open_async(path, "jsonl-group")
        session = sessionlog.AsyncSession(store, tools=tools.declare(), model="m")
        run = await session.resume()
        await drive(session, run)
        assert (await session.state()).is_idle
        await store.close()

    asyncio.run(main())
    assert tools.log == ["read 0", "read 0", "write 0", "bash 0"]


@needs_shared
@pytest.mark.parametrize("kill_in", ["read 0", "write 0", "bash 0"])
def test_every_fact_of_in_order_recovery_follows_the_shared_contract(kill_in: str, tmp_path: Path) -> None:
    """What the per-tool design writes, killed in a tool and resumed, is every line valid under
    the shared session schema and reduces; every plan the runtime carries out (including its
    departure, `plan_in_order`) is of the shared recovery-plan schema."""
    import jsonschema

    from test_own_fixtures import schema_valid

    schema = json.loads((SHARED.parent / "session.schema.json").read_text())
    base = {key: value for key, value in schema.items() if key != "oneOf"}
    header = jsonschema.Draft202012Validator({**base, "$ref": "#/$defs/header"})
    transaction = jsonschema.Draft202012Validator({**base, "$ref": "#/$defs/transaction"})
    plans = jsonschema.Draft202012Validator(json.loads((SHARED / "recovery-plan.schema.json").read_text()))
    tools = Tools()
    tools.kill_in = kill_in
    path = tmp_path / "s.jsonl"
    session = _session(path, tools)
    with pytest.raises(Killed):
        _drive(session, session.start("go"))
    session.store.close()
    again = _session(path, tools)
    seen: list[dict[str, Any]] = []
    original = sessionlog.recovery.plan_in_order

    def recording(state: sessionlog.SessionState, current: Any) -> Any:
        plan = original(state, current)
        seen.append(plan)
        return plan

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sessionlog.recovery, "plan_in_order", recording)
        run = again.resume()
    assert run is not None
    _drive(again, run)
    again.store.close()
    assert seen and all(plans.is_valid(plan) for plan in seen)
    data = path.read_bytes()
    assert schema_valid(data, header, transaction)
    assert sessionlog.reduce_bytes(data).is_idle


@needs_shared
@pytest.mark.parametrize("fixture", shared_manifest(PLANNER_FIXTURES), ids=lambda fixture: fixture["name"])
def test_plan_in_order_is_the_contract_planner_on_every_shared_case(fixture: dict[str, Any]) -> None:
    """The departure only ever applies to a pending call before an unstarted one (a state the
    batched design never wrote); on every shared planner case it plans what the contract says."""
    case = json.loads((PLANNER_FIXTURES / fixture["input"]).read_text())
    state = sessionlog.reduce_bytes((FIXTURES / case["sessionFile"]).read_bytes())
    expected = json.loads((PLANNER_FIXTURES / fixture["expected"]).read_text())
    departs = any(
        pending["toolIndex"] < index and not state.has_outcome(index)
        for pending in state.pending_tools
        for index in range(len(state.settled_calls))
    )
    planned = sessionlog.recovery.plan_in_order(state, case["current"])
    assert planned == expected or departs
