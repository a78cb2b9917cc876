"""Issue 27, item 3: `Tool(..., reconcile=fn)` turns "may have run" back into "ran" or "did not
run". After a crash, before a pending intent of a `never` tool is settled as interrupted, the
runtime asks `fn(key, arguments)`: ran (its result is committed), did not run (the tool runs now,
with the same key), unknown, a failure or a timeout of `fn` (settled as interrupted, as before),
and so is any other answer (named in the log and in `Session.reconciled`)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from conftest import HEADER, SHARED, needs_shared
from sessionlog.runtime_reconcile import NOT_RUN_NOTE, RAN_NOTE, reconciliation
from sessionlog.tools import DidNotRun, Ran, Unknown

INTERRUPTED = "Operation interrupted after execution status became unknown; the tool was not replayed."


class Killed(BaseException):
    """Stands for SIGKILL inside a tool: not an Exception, so the runtime records nothing."""


class Deploys:
    """A deploy tool and its counterpart's answers: `runs` the keys it ran with, `asked` the
    (key, arguments) reconcile was asked with, `answer` what reconcile answers (a callable)."""

    def __init__(self, answer: Any) -> None:
        self.runs: list[str] = []
        self.asked: list[tuple[str, dict[str, Any]]] = []
        self.answer = answer
        self.kill_next = True

    def run(self, arguments: dict[str, Any], key: str) -> str:
        self.runs.append(key)
        if self.kill_next:
            self.kill_next = False
            raise Killed
        return f"deployed {arguments['version']}"

    def reconcile(self, key: str, arguments: dict[str, Any]) -> Any:
        self.asked.append((key, arguments))
        return self.answer()

    def tools(self, **options: Any) -> list[sessionlog.Tool]:
        return [sessionlog.Tool("deploy", self.run, reconcile=self.reconcile, **options)]


def crashed(path: Path, tools: list[sessionlog.Tool]) -> str:
    """A session whose one deploy call (of `tools`) died after its effect began, by `Killed`
    raised in its first run; the call's key."""
    store = sessionlog.create(path, "jsonl", **HEADER)
    run = sessionlog.Session(store, tools=tools, model="m").start("go")
    run.attempt().settle(None, [{"id": "1", "name": "deploy", "arguments": {"version": "v2"}}])
    (call,) = run.start_tools()
    with pytest.raises(Killed):
        call.run()
    store.close()
    return call.key


def _crashed(path: Path, deploys: Deploys, **options: Any) -> str:
    return crashed(path, deploys.tools(**options))


def _resumed(path: Path, deploys: Deploys, **options: Any) -> sessionlog.SessionState:
    store = sessionlog.open(path, "jsonl")
    session = sessionlog.Session(store, tools=deploys.tools(**options), model="m")
    run = session.resume()
    assert run is not None and run.needs_model  # the step is settled: the model is asked next
    state = session.state
    store.close()
    return state


def test_ran_commits_the_reported_result_and_runs_nothing(tmp_path: Path) -> None:
    deploys = Deploys(lambda: Ran("deployed v2 (release 7)"))
    key = _crashed(tmp_path / "s.jsonl", deploys)
    state = _resumed(tmp_path / "s.jsonl", deploys)
    assert deploys.asked == [(key, {"version": "v2"})] and deploys.runs == [key]
    content = state.transcript[-1]["content"]
    assert content == f"deployed v2 (release 7)\n{RAN_NOTE}" and reconciliation(content) == "ran"
    assert state.tool_calls[0]["status"] == "completed"


def test_ran_with_an_error_is_an_error_result(tmp_path: Path) -> None:
    deploys = Deploys(lambda: Ran({"error": "quota"}, ok=False))
    _crashed(tmp_path / "s.jsonl", deploys)
    _resumed(tmp_path / "s.jsonl", deploys)
    data = (tmp_path / "s.jsonl").read_bytes().splitlines()[-1]
    assert b'"result":{"type":"error"}' in data and b'{\\"error\\":\\"quota\\"}' in data


def test_did_not_run_runs_the_tool_now_with_the_same_key(tmp_path: Path) -> None:
    deploys = Deploys(DidNotRun)
    key = _crashed(tmp_path / "s.jsonl", deploys)
    state = _resumed(tmp_path / "s.jsonl", deploys)
    assert deploys.runs == [key, key]
    content = state.transcript[-1]["content"]
    assert content == f"deployed v2\n{NOT_RUN_NOTE}" and reconciliation(content) == "notRun"


def _raises() -> Any:
    raise ConnectionError("the status endpoint is down")


def _hangs() -> Any:
    time.sleep(60)  # far past the 0.2 s timeout: its daemon thread is left behind, never the agent
    return Ran("too late")


@pytest.mark.parametrize(
    "answer", [lambda: Unknown("no record"), _raises, _hangs], ids=["unknown", "raises", "times-out"]
)
def test_unknown_a_failure_or_a_timeout_is_settled_as_interrupted(tmp_path: Path, answer: Any) -> None:
    deploys = Deploys(answer)
    key = _crashed(tmp_path / "s.jsonl", deploys)
    state = _resumed(tmp_path / "s.jsonl", deploys, reconcile_timeout=0.2)
    assert deploys.runs == [key]  # never run again
    assert state.transcript[-1]["content"] == INTERRUPTED


def test_another_answer_is_a_failed_reconcile_settled_as_interrupted(tmp_path: Path) -> None:
    """Not an error (it would repeat on every resume: stuck for good): unknown, its type named
    (tests/test_reconcile_answers.py has the rest)."""
    deploys = Deploys(lambda: "yes it ran, secret=hunter2")
    key = _crashed(tmp_path / "s.jsonl", deploys)
    store = sessionlog.open(tmp_path / "s.jsonl", "jsonl")
    session = sessionlog.Session(store, tools=deploys.tools(), model="m")
    assert session.resume() is not None
    (decided,) = session.reconciled
    assert decided.decision == "unknown" and "returned a str" in decided.why and "hunter2" not in decided.why
    assert deploys.runs == [key] and session.state.transcript[-1]["content"] == INTERRUPTED
    store.close()


def test_an_abort_settles_a_reconcilable_call_as_interrupted_without_asking(tmp_path: Path) -> None:
    deploys = Deploys(DidNotRun)
    _crashed(tmp_path / "s.jsonl", deploys)
    store = sessionlog.open(tmp_path / "s.jsonl", "jsonl")
    session = sessionlog.Session(store, tools=deploys.tools(), model="m")
    run = sessionlog.Run(session, session.state.operation["operationId"])
    assert run.abort()["outcome"] == "aborted"
    assert deploys.asked == [] and session.state.transcript[-1]["content"] == INTERRUPTED
    store.close()


def test_a_kill_while_the_tool_runs_again_is_reconciled_again(tmp_path: Path) -> None:
    """Did not run, so it runs now; killed during that run too, the next resume asks again."""
    deploys = Deploys(DidNotRun)
    key = _crashed(tmp_path / "s.jsonl", deploys)
    deploys.kill_next = True
    store = sessionlog.open(tmp_path / "s.jsonl", "jsonl")
    with pytest.raises(Killed):
        sessionlog.Session(store, tools=deploys.tools(), model="m").resume()
    store.close()
    deploys.answer = lambda: Ran("deployed v2")
    state = _resumed(tmp_path / "s.jsonl", deploys)
    assert deploys.runs == [key, key] and [asked[0] for asked in deploys.asked] == [key, key]
    assert reconciliation(state.transcript[-1]["content"]) == "ran"


@pytest.mark.parametrize("kind", ["ran", "notRun", "timeout"])
def test_the_async_runtime_reconciles_the_same_way(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "s.jsonl"
    runs: list[str] = []

    async def deploy(arguments: dict[str, Any], key: str) -> str:
        runs.append(key)
        if len(runs) == 1:
            raise Killed
        return "deployed"

    async def reconcile(key: str, arguments: dict[str, Any]) -> Any:
        if kind == "timeout":
            await asyncio.sleep(60)  # cancelled at the 0.2 s timeout
        return Ran("it was deployed") if kind == "ran" else DidNotRun()

    async def main() -> str:
        tools = [sessionlog.Tool("deploy", deploy, reconcile=reconcile, reconcile_timeout=0.2)]
        store = await sessionlog.create_async(path, "jsonl-async", **HEADER)
        session = sessionlog.AsyncSession(store, tools=tools, model="m")
        run = await session.start("go")
        await (await run.attempt()).settle(None, [{"id": "1", "name": "deploy", "arguments": {}}])
        (call,) = await run.start_tools()
        with pytest.raises(Killed):
            await call.run()
        await store.close()
        store = await sessionlog.open_async(path, "jsonl-async")
        again = sessionlog.AsyncSession(store, tools=tools, model="m")
        assert await again.resume() is not None
        content = (await again.state()).transcript[-1]["content"]
        await store.close()
        assert runs == [call.key] * (2 if kind == "notRun" else 1)
        return str(content)

    content = asyncio.run(main())
    expected = {
        "ran": f"it was deployed\n{RAN_NOTE}",
        "notRun": f"deployed\n{NOT_RUN_NOTE}",
        "timeout": INTERRUPTED,
    }
    assert content == expected[kind]


def test_a_plain_reconcile_function_in_the_async_runtime(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    deploys = Deploys(lambda: Ran("done"))

    async def main() -> str:
        store = await sessionlog.create_async(path, "jsonl-async", **HEADER)
        session = sessionlog.AsyncSession(store, tools=deploys.tools(), model="m")
        run = await session.start("go")
        await (await run.attempt()).settle(None, [{"id": "1", "name": "deploy", "arguments": {"version": 1}}])
        (call,) = await run.start_tools()
        with pytest.raises(Killed):
            await call.run()
        assert await session.resume() is not None
        content = (await session.state()).transcript[-1]["content"]
        await store.close()
        return str(content)

    assert asyncio.run(main()) == f"done\n{RAN_NOTE}"


@needs_shared
@pytest.mark.parametrize(
    "answer", [lambda: Ran("ok"), DidNotRun, lambda: Unknown()], ids=["ran", "notRun", "unknown"]
)
def test_every_fact_of_a_reconciliation_follows_the_shared_contract(tmp_path: Path, answer: Any) -> None:
    import jsonschema

    from test_own_fixtures import schema_valid

    schema = json.loads((SHARED.parent / "session.schema.json").read_text())
    base = {key: value for key, value in schema.items() if key != "oneOf"}
    header = jsonschema.Draft202012Validator({**base, "$ref": "#/$defs/header"})
    transaction = jsonschema.Draft202012Validator({**base, "$ref": "#/$defs/transaction"})
    deploys = Deploys(answer)
    _crashed(tmp_path / "s.jsonl", deploys)
    _resumed(tmp_path / "s.jsonl", deploys)
    data = (tmp_path / "s.jsonl").read_bytes()
    assert schema_valid(data, header, transaction)
    assert sessionlog.reduce_bytes(data).tool_calls[0]["status"] == "completed"


def test_inspect_shows_what_reconciliation_decided_and_a_pending_call_s_key(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    deploys = Deploys(lambda: Ran("deployed v2"))
    key = _crashed(path, deploys)
    pending = cli("inspect", path)
    assert pending.code == 0 and f"      idempotency key {key}\n" in pending.out
    _resumed(path, deploys)
    run = cli("inspect", path)
    assert "reconciled   1 call after a crash: 1 had run (result from its counterpart), 0 had not" in run.out
    assert "  deploy 1: ran" in run.out
    report = cli("inspect", path, "--json").json()
    assert report["reconciled"] == [{"toolCallId": "1", "toolName": "deploy", "decision": "ran"}]


def test_a_coroutine_reconcile_function_in_the_sync_runtime(tmp_path: Path) -> None:
    async def ran() -> Any:
        return Ran("deployed v2")

    deploys = Deploys(ran)  # reconcile returns the coroutine: it is awaited in its thread
    _crashed(tmp_path / "s.jsonl", deploys)
    state = _resumed(tmp_path / "s.jsonl", deploys)
    assert state.transcript[-1]["content"] == f"deployed v2\n{RAN_NOTE}"
