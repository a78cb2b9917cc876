"""Issue 27, items 1 and 2: an idempotency key per tool call, and idempotent tools.

The key is made from the intent's fact id: it exists before the effect, is the same when the
call is replayed after a crash (sync and async) and in a fork of the session, and no other call
has it. `Tool(..., idempotent=True)` is `safe` with its own replay key in the contract's terms,
so the contract's planner itself replays it, and the runtime passes the same key again."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from conftest import HEADER
from sessionlog.repositories.base import fork_bytes


class Killed(BaseException):
    """Stands for SIGKILL inside a tool: not an Exception, so the runtime records nothing."""


class Charges:
    """A charge tool that records the key of every run; `kill_next` dies after the effect."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.kill_next = False

    def __call__(self, arguments: dict[str, Any], key: str) -> str:
        self.keys.append(key)
        if self.kill_next:
            self.kill_next = False
            raise Killed
        return f"charged {arguments['amount']}"


KEY = re.compile(r"sl-[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}").fullmatch


def _session(path: Path, charges: Charges, **options: Any) -> sessionlog.Session:
    store = sessionlog.open(path, "jsonl") if path.exists() else sessionlog.create(path, "jsonl", **HEADER)
    tools = [sessionlog.Tool("charge", charges, idempotent=True), sessionlog.Tool("echo", lambda a: "e")]
    return sessionlog.Session(store, tools=tools, model="m", **options)


def _charge(run: Any, *ids: str) -> None:
    run.attempt().settle(None, [{"id": i, "name": "charge", "arguments": {"amount": 5}} for i in ids])


def _killed_charging(session: Any, charges: Any) -> Any:
    """A run whose one charge call is killed after its effect, before its result: the call."""
    run = session.start("go")
    _charge(run, "1")
    (call,) = run.start_tools()
    charges.kill_next = True
    with pytest.raises(Killed):
        call.run()
    return call


def test_a_key_is_made_from_the_intent_id_and_no_other_call_has_it(tmp_path: Path) -> None:
    charges = Charges()
    session = _session(tmp_path / "s.jsonl", charges)
    run = session.start("go")
    _charge(run, "1", "2")
    calls = run.start_tools()
    keys = [call.key for call in calls]
    for call in calls:
        call.run()
    assert charges.keys == keys and len(set(keys)) == 2
    intents = [tool["toolStartedId"] for tool in session.state.tool_calls]
    assert keys == [f"sl-{started}" for started in intents]
    assert all(KEY(key) and len(key) == 39 for key in keys)  # a header, a client token, a resource name
    assert keys == [sessionlog.recovery.idempotency_key(started) for started in intents]


@pytest.mark.parametrize("intents", ["tool", "step"])
def test_a_replay_after_a_crash_passes_the_same_key(tmp_path: Path, intents: str) -> None:
    path = tmp_path / "s.jsonl"
    charges = Charges()
    session = _session(path, charges, intents=intents)
    call = _killed_charging(session, charges)
    session.store.close()
    again = _session(path, charges, intents=intents)
    resumed = again.resume()  # the idempotent charge is replayed, with its key
    assert resumed is not None
    assert charges.keys == [call.key, call.key]
    (tool,) = again.state.tool_calls
    assert tool["status"] == "completed" and again.state.transcript[-1]["content"] == "charged 5"
    again.store.close()


def test_the_contract_planner_itself_replays_an_idempotent_tool(tmp_path: Path) -> None:
    """`safe` with its own replay key: every port's planner (here the contract's own
    `plan_recovery`, not the runtime's `plan_in_order`) plans its replay."""
    path = tmp_path / "s.jsonl"
    charges = Charges()
    session = _session(path, charges)
    (declared,) = [tool for tool in session.current()["tools"] if tool["name"] == "charge"]
    assert declared["replay"] == "safe" and declared["replayKey"].startswith("idempotent:charge:")
    _killed_charging(session, charges)
    (pending,) = session.state.pending_tools
    assert pending["replay"] == "safe" and pending["replayKey"] == declared["replayKey"]
    plan = sessionlog.plan_recovery(session.state, session.current())
    assert plan["type"] == "startTool" and plan["mode"] == "replay"
    assert plan["toolStartedId"] == pending["toolStartedId"]
    session.store.close()


def test_a_read_and_an_idempotent_tool_never_replay_as_each_other() -> None:
    def read(arguments: dict[str, Any]) -> str:
        return ""

    as_read = sessionlog.Tool("t", read, replay="safe")
    as_idempotent = sessionlog.Tool("t", lambda arguments, key: "", idempotent=True)
    assert as_idempotent.replay == "safe" and as_idempotent.keyed and not as_read.keyed
    assert as_read.key != as_idempotent.key  # changing one into the other blocks an old replay
    assert (
        sessionlog.Tool("t", lambda arguments, key: "", idempotent=True, replay_key="mine:v1").key
        == "mine:v1"
    )


def test_a_fork_keeps_a_pending_call_s_key(tmp_path: Path) -> None:
    """A forked session's pending charge is replayed with the key of the original's: a
    counterpart deduplicating by it charges once for both."""
    path = tmp_path / "s.jsonl"
    charges = Charges()
    session = _session(path, charges)
    call = _killed_charging(session, charges)
    last = session.state.last_seq
    header = session.state.header["id"]
    session.store.close()
    _, data = fork_bytes(path.read_bytes(), header, last)
    forked = tmp_path / "fork.jsonl"
    forked.write_bytes(data)
    assert _session(forked, charges).resume() is not None
    assert charges.keys == [call.key, call.key]


def test_the_async_runtime_passes_the_same_key(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    keys: list[str] = []
    kill = [True]

    async def charge(arguments: dict[str, Any], key: str) -> str:
        keys.append(key)
        if kill.pop() if kill else False:
            raise Killed
        return "charged"

    async def main() -> None:
        tools = [sessionlog.Tool("charge", charge, idempotent=True)]
        store = await sessionlog.create_async(path, "jsonl-async", **HEADER)
        session = sessionlog.AsyncSession(store, tools=tools, model="m")
        run = await session.start("go")
        await (await run.attempt()).settle(None, [{"id": "1", "name": "charge", "arguments": {}}])
        (call,) = await run.start_tools()
        with pytest.raises(Killed):
            await call.run()
        await store.close()
        store = await sessionlog.open_async(path, "jsonl-async")
        again = sessionlog.AsyncSession(store, tools=tools, model="m")
        assert await again.resume() is not None
        assert keys == [call.key, call.key]
        await store.close()

    asyncio.run(main())


def test_declarations_that_contradict_each_other_are_refused() -> None:
    def effect(arguments: dict[str, Any], key: str) -> str:
        return ""

    with pytest.raises(ValueError, match="exclude each other"):
        sessionlog.Tool("t", effect, idempotent=True, reconcile=lambda key, arguments: None)
    with pytest.raises(ValueError, match="replay='never'"):
        sessionlog.Tool("t", effect, replay="safe", reconcile=lambda key, arguments: None)
    with pytest.raises(TypeError, match="idempotent is True or False"):
        sessionlog.Tool("t", effect, idempotent=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="reconcile is a function"):
        sessionlog.Tool("t", effect, reconcile="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reconcile_timeout"):
        sessionlog.Tool("t", effect, reconcile=lambda key, arguments: None, reconcile_timeout=0)
