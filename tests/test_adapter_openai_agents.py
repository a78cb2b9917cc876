"""The OpenAI Agents SDK adapter (`sessionlog.adapters.openai_agents`) under the SDK's real
`Runner` with a scripted `Model` (no network): intent before effect, kill -9 in forked children
during the model call and during each tool (the effects counted in a ledger file outside the
session), item-for-item equality with the SDK's own `SQLiteSession`, pop and clear, refusals."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import traceback
from pathlib import Path
from typing import Any

import pytest

agents = pytest.importorskip(
    "agents", reason="SKIPPED LOUDLY: openai-agents is not installed (pip install -e '.[openai-agents]')"
)

from agents import Agent, Runner, SQLiteSession, function_tool, set_tracing_disabled  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402

import sessionlog  # noqa: E402
from sessionlog.adapters.openai_agents import (  # noqa: E402
    AgentSession,
    CallKeyError,
    PopError,
    UnsupportedItemError,
    call_key,
)
from sessionlog.adapters.openai_agents_items import UncarriedArgumentsError  # noqa: E402
from sessionlog.core.shapes import SYNTHETIC_CONTENT  # noqa: E402

set_tracing_disabled(True)
INTERRUPTED = SYNTHETIC_CONTENT["interrupted"]


# -- the agent: a read (safe), a charge (idempotent, the ledger deduplicates by key), a bash ----


class Ledger:
    """The counterpart, outside the session: one line per effect (`tool call_id key`); a charge is
    made once per key (a second request with the same key finds the first)."""

    def __init__(self, path: Path, kill_at: str | None = None) -> None:
        self.path, self.kill_at = path, kill_at

    def lines(self) -> list[list[str]]:
        if not self.path.exists():
            return []
        return [line.split() for line in self.path.read_text().splitlines()]

    def effect(self, tool: str, call_id: str, key: str) -> None:
        if tool == "charge" and any(line[0] == "charge" and line[2] == key for line in self.lines()):
            return  # deduplicated by key
        with self.path.open("a") as file:
            file.write(f"{tool} {call_id} {key}\n")
            file.flush()
            os.fsync(file.fileno())
        if self.kill_at == tool:
            os.kill(os.getpid(), signal.SIGKILL)


def make_tools(ledger: Ledger) -> list[Any]:
    @function_tool
    async def read(ctx: ToolContext[Any], path: str) -> str:
        """Read a file."""
        ledger.effect("read", ctx.tool_call_id, "-")
        return f"text of {path}"

    @function_tool
    async def charge(ctx: ToolContext[Any], amount: int) -> str:
        """Charge an amount."""
        key = call_key(ctx)
        ledger.effect("charge", ctx.tool_call_id, key)
        return f"charged {amount}"

    @function_tool
    async def bash(ctx: ToolContext[Any], command: str) -> str:
        """Run a command."""
        ledger.effect("bash", ctx.tool_call_id, call_key(ctx))
        return f"ran {command}"

    return [read, charge, bash]


def step_calls() -> list[Any]:
    return [
        assistant_message("Reading, charging, deploying.", item_id="m1"),
        function_call("read", {"path": "notes.txt"}, call_id="c1"),
        function_call("charge", {"amount": 5}, call_id="c2"),
        function_call("bash", {"command": "make deploy"}, call_id="c3"),
    ]


def script(kill_model: bool) -> list[Any]:
    def killed(call: Any) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)

    first = killed if kill_model else (lambda call: step_calls())
    from agents.testing import ModelStep

    return [ModelStep.respond(first), [assistant_message("Deployed.")]]


def open_store(path: Path) -> Any:
    if path.exists():
        return sessionlog.open(path, "jsonl")
    return sessionlog.create(path, "jsonl", provider="openai", model="scripted")


def adapter(store: Any, ledger: Ledger) -> AgentSession:
    return AgentSession(store, make_tools(ledger), safe={"read"}, idempotent={"charge"})


async def turn(path: Path, ledger: Ledger, prompt: str, steps: list[Any], out: Path | None = None) -> None:
    store = open_store(path)
    session = adapter(store, ledger)
    model = ScriptedModel(steps)
    agent = Agent(name="ops", model=model, tools=session.tools)
    result = await Runner.run(agent, prompt, session=session, hooks=session.hooks)
    if out is not None:
        recovery = session.recovery
        out.write_text(
            json.dumps(
                {
                    "final": result.final_output,
                    "items": await session.get_items(),
                    "input": model.calls[0].input,
                    "recovery": None
                    if recovery is None
                    else {"outcome": recovery.outcome, "calls": [vars(call) for call in recovery.calls]},
                }
            )
        )
    store.close()


def in_child(job: Any) -> int:
    """Run `job()` in a forked child; its wait status (a signal number, negative, or its exit code)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            asyncio.run(job())
        except BaseException:
            traceback.print_exc()
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


# -- two turns across two processes ------------------------------------------------------------


def without_regenerated(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{key: value for key, value in item.items() if key not in ("id", "status")} for item in items]


def sqlite_items(steps_per_turn: list[tuple[str, list[Any]]], tmp_path: Path) -> list[dict[str, Any]]:
    ledger = Ledger(tmp_path / "sqlite-ledger")

    async def run() -> list[dict[str, Any]]:
        session = SQLiteSession("theirs")
        tools = make_tools(ledger)
        # the SDK's own session has no keys: its tools get a fixed one through a context hook
        for prompt, steps in steps_per_turn:
            agent = Agent(name="ops", model=ScriptedModel(steps), tools=tools)
            await Runner.run(agent, prompt, session=session, hooks=_FixedKeys())
        return await session.get_items()  # type: ignore[return-value]

    return asyncio.run(run())


class _FixedKeys(agents.RunHooks[Any]):
    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        from sessionlog.adapters import openai_agents

        openai_agents._hold_key(context, "fixed")


def test_two_turns_in_two_processes_match_the_sdk_sqlite_session(tmp_path: Path) -> None:
    path, ledger = tmp_path / "s.jsonl", Ledger(tmp_path / "ledger")
    turns = [
        ("Deploy.", [step_calls(), [assistant_message("Deployed.")]]),
        ("Again?", [[assistant_message("No.")]]),
    ]
    assert in_child(lambda: turn(path, ledger, *turns[0])) == 0
    out = tmp_path / "out.json"
    assert in_child(lambda: turn(path, ledger, *turns[1], out=out)) == 0
    seen = json.loads(out.read_text())
    assert seen["recovery"] is None and seen["final"] == "No."
    ours = seen["items"]
    theirs = sqlite_items(turns, tmp_path)
    assert len(ours) == len(theirs) == 11
    assert without_regenerated(ours) == without_regenerated(theirs)
    # the second process's model saw the first turn's history, item for item
    assert without_regenerated(seen["input"]) == without_regenerated(theirs[:-1])
    assert sorted(line[0] for line in ledger.lines()) == ["bash", "charge", "read"]


# -- kill -9 during the model call and during each tool ----------------------------------------


def crash_and_recover(tmp_path: Path, kill_at: str) -> tuple[list[list[str]], dict[str, Any], Ledger]:
    path, ledger = tmp_path / "s.jsonl", Ledger(tmp_path / "ledger", kill_at=kill_at)
    status = in_child(lambda: turn(path, ledger, "Deploy.", script(kill_model=kill_at == "model")))
    assert status == -signal.SIGKILL, f"the child was to be killed at {kill_at}, it ended {status}"
    after = Ledger(ledger.path)  # the recovering process kills nothing
    out = tmp_path / "out.json"
    assert in_child(lambda: turn(path, after, "Status?", [[assistant_message("All settled.")]], out=out)) == 0
    return after.lines(), json.loads(out.read_text()), after


@pytest.mark.parametrize("kill_at", ["model", "read", "charge", "bash"])
def test_kill_9_runs_no_tool_twice(tmp_path: Path, kill_at: str) -> None:
    check_crash(tmp_path, kill_at)


@pytest.mark.long
@pytest.mark.parametrize("kill_at", ["model", "read", "charge", "bash"])
def test_kill_9_runs_no_tool_twice_25_times(tmp_path: Path, kill_at: str) -> None:
    for round in range(25):
        check_crash(tmp_path / str(round), kill_at)


def check_crash(tmp_path: Path, kill_at: str) -> None:
    tmp_path.mkdir(exist_ok=True)
    lines, seen, _ = crash_and_recover(tmp_path, kill_at)
    effects = {tool: [line for line in lines if line[0] == tool] for tool in ("read", "charge", "bash")}
    assert len(effects["bash"]) <= 1  # never: not run twice
    assert len(effects["charge"]) <= 1  # idempotent: replayed with the same key, made once
    recovery = seen["recovery"]
    assert recovery is not None and recovery["outcome"] == "aborted"
    decided = {call["tool_name"]: call["decision"] for call in recovery["calls"]}
    outputs = {
        item["call_id"]: item["output"]
        for item in seen["items"]
        if item.get("type") == "function_call_output"
    }
    if kill_at == "model":
        assert lines == [] and decided == {} and outputs == {}
        # the unanswered prompt, then the new one: the SDK's own form
        assert [item.get("content") for item in seen["items"][:2]] == ["Deploy.", "Status?"]
        return
    # every call of the step has an output now, in the SDK's item form
    assert set(outputs) == {"c1", "c2", "c3"}
    assert len(effects["charge"]) == 1  # its intent was durable before the effect: made exactly once
    killed = {"read": "replayed", "charge": "replayed", "bash": "interrupted"}[kill_at]
    assert decided[kill_at] == killed  # the call killed after its effect was pending
    if kill_at == "bash":
        assert decided["bash"] == "interrupted" and outputs["c3"] == INTERRUPTED
        assert len(effects["bash"]) == 1
    for name, call_id in (("read", "c1"), ("charge", "c2")):
        if name in decided:  # pending at the kill: replayed (a read, an idempotent charge)
            assert decided[name] == "replayed"
            assert outputs[call_id] != INTERRUPTED
    if "charge" in decided:  # replayed: the ledger found the first charge by its key
        assert outputs["c2"] == "charged 5"
    assert seen["final"] == "All settled."


# -- one process: hooks, keys, refusals, pop and clear ------------------------------------------


def run_once(session: AgentSession, steps: list[Any], prompt: str = "Go.") -> Any:
    agent = Agent(name="ops", model=ScriptedModel(steps), tools=session.tools)
    return Runner.run(agent, prompt, session=session, hooks=session.hooks)


def test_each_intent_is_durable_before_its_tool_runs(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s.jsonl")
    seen: list[tuple[str, str]] = []

    @function_tool
    async def probe(ctx: ToolContext[Any], n: int) -> str:
        """Probe."""
        state = store.load()
        intent = next(tool for tool in state.tool_calls if tool["toolCallId"] == ctx.tool_call_id)
        seen.append((intent["status"], call_key(ctx)))
        assert state.open_attempt is None  # the answer is durable too
        return str(n)

    session = AgentSession(store, [probe])
    calls = [function_call("probe", {"n": n}, call_id=f"p{n}") for n in range(2)]
    asyncio.run(run_once(session, [calls, [assistant_message("ok")]]))
    assert [status for status, _ in seen] == ["pending", "pending"]
    assert len({key for _, key in seen}) == 2 and all(key.startswith("sl-") for _, key in seen)
    assert store.load().last_finished["outcome"] == "completed"
    with pytest.raises(CallKeyError):
        call_key(object())


def test_reasoning_is_refused_by_default_and_dropped_with_a_count(tmp_path: Path) -> None:
    from openai.types.responses import ResponseReasoningItem

    reasoning = ResponseReasoningItem(id="rs_1", type="reasoning", summary=[])
    store = open_store(tmp_path / "s.jsonl")
    session = AgentSession(store, [])
    with pytest.raises(UnsupportedItemError, match="reasoning"):
        asyncio.run(run_once(session, [[reasoning, assistant_message("hi")]]))
    assert store.load().is_idle  # the refused answer's run ended, nothing half-written
    dropping = AgentSession(store, [], carry={"reasoning": "drop"})
    asyncio.run(run_once(dropping, [[reasoning, assistant_message("hi")]]))
    assert dropping.dropped["reasoning"] == 1
    assert asyncio.run(dropping.get_items())[-1]["content"][0]["text"] == "hi"


def test_an_image_input_is_refused_or_dropped(tmp_path: Path) -> None:
    image = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"},
            ],
        }
    ]
    store = open_store(tmp_path / "s.jsonl")
    with pytest.raises(UnsupportedItemError, match="image"):
        asyncio.run(AgentSession(store, []).add_items(image))  # type: ignore[arg-type]
    assert store.load().is_idle and len(store.load().transcript) == 0
    session = AgentSession(store, [], carry={"image": "drop"})
    asyncio.run(session.add_items(image))  # type: ignore[arg-type]
    assert session.dropped["image"] == 1
    assert store.load().transcript[0]["content"] == "What is this?"


def test_pop_item_and_clear_session_do_what_the_sdk_sessions_do(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s.jsonl")
    session = AgentSession(store, [])

    async def scenario() -> None:
        await run_once(session, [[assistant_message("One.")]], "First.")
        await run_once(session, [[assistant_message("Two.")]], "Second.")
        theirs = SQLiteSession("theirs")
        await theirs.add_items(await session.get_items())
        for _ in range(2):
            assert without_regenerated([await session.pop_item()]) == without_regenerated(
                [await theirs.pop_item()]
            )
            assert without_regenerated(await session.get_items()) == without_regenerated(
                await theirs.get_items()
            )
        await run_once(session, [[assistant_message("Three.")]], "Third.")
        assert [item.get("content") for item in await session.get_items()][::2] == ["First.", "Third."]
        await session.clear_session()
        assert await session.get_items() == [] and await session.pop_item() is None
        assert len(store.load().transcript) == 6  # the log keeps everything

    asyncio.run(scenario())
    store.close()
    reopened = AgentSession(sessionlog.open(tmp_path / "s.jsonl", "jsonl"), [])
    assert asyncio.run(reopened.get_items()) == []


def test_pop_of_a_tool_output_is_refused(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s.jsonl")
    ledger = Ledger(tmp_path / "ledger")
    session = adapter(store, ledger)
    asyncio.run(run_once(session, [step_calls(), [assistant_message("Done.")]]))
    asyncio.run(session.pop_item())  # the final answer goes
    before = store.load().last_seq
    with pytest.raises(PopError, match="unanswered"):
        asyncio.run(session.pop_item())
    assert store.load().last_seq == before


def test_a_streamed_run_and_failing_tools_match_the_sdk_sqlite_session(tmp_path: Path) -> None:
    @function_tool
    def boom(n: int) -> str:
        """Fail."""
        raise RuntimeError("boom")

    @function_tool
    def structured(n: int) -> dict[str, int]:
        """A JSON value."""
        return {"n": n}

    def steps() -> list[Any]:
        calls = [
            function_call("boom", {"n": 1}, call_id="b1"),
            function_call("structured", {"n": 2}, call_id="s1"),
        ]
        return [calls, [assistant_message("ok")]]

    async def run(session: Any, streamed: bool) -> list[dict[str, Any]]:
        agent = Agent(name="ops", model=ScriptedModel(steps()), tools=[boom, structured])
        hooks = getattr(session, "hooks", None)
        if streamed:
            result = Runner.run_streamed(agent, "Go.", session=session, hooks=hooks)
            async for _ in result.stream_events():
                pass
        else:
            await Runner.run(agent, "Go.", session=session, hooks=hooks)
        return await session.get_items()  # type: ignore[no-any-return]

    theirs = without_regenerated(asyncio.run(run(SQLiteSession("theirs"), False)))
    for streamed in (False, True):
        store = open_store(tmp_path / f"s-{streamed}.jsonl")
        ours = asyncio.run(run(AgentSession(store, [boom, structured]), streamed))
        assert without_regenerated(ours) == theirs
        assert store.load().last_finished["outcome"] == "completed"
        store.close()


def test_arguments_that_are_no_json_object_reach_the_model_as_an_error_and_no_tool_runs(
    tmp_path: Path,
) -> None:
    """A model that sends broken JSON (real ones do): the SDK does not run the tool and tells
    the model; the log settles the call as not run (`invalidArguments`) and the run goes on to
    its answer, as under the SDK's own session. Empty arguments are `{}` to the SDK (it runs the
    tool): they get an intent first."""
    ran: list[str] = []

    @function_tool
    def read(path: str) -> str:
        """Read a file."""
        ran.append(path)
        return "text"

    @function_tool
    def ping() -> str:
        """Ping."""
        ran.append("ping")
        return "pong"

    def steps() -> list[Any]:
        broken = [
            function_call("read", "{not json", call_id="c1"),
            function_call("read", "[1]", call_id="c2"),
        ]
        return [broken, [function_call("ping", "", call_id="c3")], [assistant_message("done")]]

    theirs = Runner.run(Agent(name="ops", model=ScriptedModel(steps()), tools=[read, ping]), "Go.")
    assert asyncio.run(theirs).final_output == "done" and ran == ["ping"]
    ran.clear()
    store = open_store(tmp_path / "s.jsonl")
    session = AgentSession(store, [read, ping])
    agent = Agent(name="ops", model=ScriptedModel(steps()), tools=session.tools)
    result = asyncio.run(Runner.run(agent, "Go.", session=session, hooks=session.hooks))
    assert result.final_output == "done" and ran == ["ping"]
    state = store.load()
    assert state.last_finished["outcome"] == "completed"
    lines = [json.loads(line) for line in (tmp_path / "s.jsonl").read_bytes().splitlines()[1:]]
    facts = [fact for line in lines for fact in (line if isinstance(line, list) else [line])]
    intents = [fact["record"] for fact in facts if fact.get("record", {}).get("type") == "toolStarted"]
    assert [fact["toolCallId"] for fact in intents] == ["c3"]  # the one intent: ping's
    settled = [entry for entry in state.transcript if entry["role"] == "tool"]
    assert [entry["content"] for entry in settled[:2]] == [SYNTHETIC_CONTENT["invalidArguments"]] * 2


def test_arguments_the_sdk_would_run_with_but_the_log_cannot_hold_end_the_run(tmp_path: Path) -> None:
    ran: list[float] = []

    @function_tool
    def scale(factor: float) -> str:
        """Scale."""
        ran.append(factor)
        return "scaled"

    for index, arguments in enumerate(['{"factor": NaN}', '{"factor": 18446744073709551616}']):
        store = open_store(tmp_path / f"s{index}.jsonl")
        session = AgentSession(store, [scale])
        steps = [[function_call("scale", arguments, call_id="n1")], [assistant_message("done")]]
        with pytest.raises(UncarriedArgumentsError, match=r"response.output\[0\].*NaN"):
            asyncio.run(run_once(session, steps))
        assert ran == [] and store.load().is_idle  # aborted before the tool could run
        assert store.load().last_finished["outcome"] == "aborted"
        store.close()


def test_killed_after_the_final_answer_the_run_completes(tmp_path: Path) -> None:
    path, ledger = tmp_path / "s.jsonl", Ledger(tmp_path / "ledger")

    class KillAtEnd(agents.AgentHooks[Any]):
        async def on_end(self, context: Any, agent: Any, output: Any) -> None:
            os.kill(os.getpid(), signal.SIGKILL)  # the answer is durable, add_items never came

    async def killed() -> None:
        session = adapter(open_store(path), ledger)
        agent = Agent(name="ops", model=ScriptedModel([[assistant_message("Hi.")]]), hooks=KillAtEnd())
        await Runner.run(agent, "Hello?", session=session, hooks=session.hooks)

    assert in_child(killed) == -signal.SIGKILL
    out = tmp_path / "out.json"
    assert in_child(lambda: turn(path, ledger, "Again?", [[assistant_message("Yes.")]], out=out)) == 0
    seen = json.loads(out.read_text())
    assert seen["recovery"] == {"outcome": "completed", "calls": []}
    assert [item.get("content") for item in seen["items"]][::2] == ["Hello?", "Again?"]


def test_a_reconciled_tool_killed_after_its_effect_is_found_run(tmp_path: Path) -> None:
    from sessionlog.tools import DidNotRun, Ran

    path, ledger = tmp_path / "s.jsonl", Ledger(tmp_path / "ledger", kill_at="deploy")

    def tools(ledger: Ledger) -> list[Any]:
        @function_tool
        async def deploy(ctx: ToolContext[Any], version: str) -> str:
            """Deploy a version."""
            ledger.effect("deploy", ctx.tool_call_id, call_key(ctx))
            return f"{version} live"

        return [deploy]

    def status(key: str, arguments: dict[str, Any]) -> Any:
        made = [line for line in Ledger(ledger.path).lines() if line[0] == "deploy" and line[2] == key]
        return Ran(f"{arguments['version']} live") if made else DidNotRun()

    async def run(ledger: Ledger, steps: list[Any], out: Path | None = None) -> None:
        store = open_store(path)
        session = AgentSession(store, tools(ledger), reconcile={"deploy": status})
        agent = Agent(name="ops", model=ScriptedModel(steps), tools=session.tools)
        await Runner.run(agent, "Deploy v2.", session=session, hooks=session.hooks)
        if out is not None:
            out.write_text(json.dumps({"recovery": [vars(call) for call in session.recovery.calls]}))  # type: ignore[union-attr]
        store.close()

    first = [[function_call("deploy", {"version": "v2"}, call_id="d1")], [assistant_message("Done.")]]
    assert in_child(lambda: run(ledger, first)) == -signal.SIGKILL
    out = tmp_path / "out.json"
    assert in_child(lambda: run(Ledger(ledger.path), [[assistant_message("Done.")]], out)) == 0
    assert json.loads(out.read_text())["recovery"] == [
        {"tool_call_id": "d1", "tool_name": "deploy", "decision": "reconciled-ran"}
    ]
    assert len(Ledger(ledger.path).lines()) == 1  # deployed once


def test_an_async_store_works_the_same(tmp_path: Path) -> None:
    async def scenario() -> list[dict[str, Any]]:
        store = await sessionlog.create_async(tmp_path / "a.jsonl", "jsonl-async", provider="p", model="m")
        session = adapter(store, Ledger(tmp_path / "ledger"))
        await run_once(session, [step_calls(), [assistant_message("Deployed.")]], "Deploy.")
        items = await session.get_items()
        await store.close()
        return items  # type: ignore[no-any-return]

    items = asyncio.run(scenario())
    assert [item.get("type", "user") for item in items] == ["user", "message"] + ["function_call"] * 3 + [
        "function_call_output"
    ] * 3 + ["message"]


def test_a_runner_run_that_raised_is_recovered_by_the_next_run(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s.jsonl")
    session = adapter(store, Ledger(tmp_path / "ledger"))
    with pytest.raises(agents.MaxTurnsExceeded):
        agent = Agent(name="ops", model=ScriptedModel([step_calls(), []]), tools=session.tools)
        asyncio.run(Runner.run(agent, "Deploy.", session=session, hooks=session.hooks, max_turns=1))
    assert not store.load().is_idle  # the SDK gave up mid-run: its run is left in progress
    result = asyncio.run(run_once(session, [[assistant_message("Fine.")]], "Again."))
    assert result.final_output == "Fine."
    assert session.recovery is not None and session.recovery.outcome == "aborted"
    assert session.recovery.calls == []  # every call had its result
    assert store.load().last_finished["outcome"] == "completed"


@pytest.mark.parametrize("location", ["sqlite", "directory"])
def test_an_sdk_session_id_in_a_repository_is_a_caller_key(tmp_path: Path, location: str) -> None:
    labelled_repository(tmp_path, location, sync=True)


def test_an_sdk_session_id_in_an_async_repository(tmp_path: Path) -> None:
    labelled_repository(tmp_path, "sqlite", sync=False)


def labelled_repository(tmp_path: Path, location: str, *, sync: bool) -> None:
    from sessionlog.adapters.openai_agents import KEY_PREFIX
    from sessionlog.repositories.aio import repository_async

    where = f"sqlite:///{tmp_path}/r.db" if location == "sqlite" else str(tmp_path / "sessions")
    if location == "directory":
        (tmp_path / "sessions").mkdir()

    async def scenario() -> None:
        repository = sessionlog.repository(where) if sync else await repository_async(where)

        async def maybe(value: Any) -> Any:
            return value if sync else await value

        session = await AgentSession.in_repository(repository, "user-42", [])
        assert session.session_id == "user-42"
        await run_once(session, [[assistant_message("One.")]], "First.")
        await maybe(session.store.close())
        again = await AgentSession.in_repository(repository, "user-42", [])  # the same session
        assert next(item.get("content") for item in await again.get_items()) == "First."
        old_id = again.store.header["id"]
        await again.clear_session()  # a new session for the id, the old one kept
        assert await again.get_items() == [] and again.store.header["id"] != old_id
        await run_once(again, [[assistant_message("Two.")]], "Second.")
        await maybe(again.store.close())
        keyed = await maybe(repository.key_sessions(KEY_PREFIX + "user-42"))
        assert keyed.replaced == (old_id,) and keyed.current == again.store.header["id"]
        listed = {info.session_id: (info.key, info.replaced) for info in await maybe(repository.list())}
        key = KEY_PREFIX + "user-42"
        assert listed == {old_id: (key, True), keyed.current: (key, False)}
        third = await AgentSession.in_repository(repository, "user-42", [])
        assert next(item.get("content") for item in await third.get_items()) == "Second."
        await maybe(third.store.close())
        await maybe(repository.close())

    asyncio.run(scenario())


def test_made_from_a_sessionlog_session_you_already_have(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s.jsonl")
    session = AgentSession(sessionlog.Session(store, model="m", tools=[]), [])
    assert session.store is store
    asyncio.run(run_once(session, [[assistant_message("Hi.")]], "Hello?"))
    assert store.load().last_finished["outcome"] == "completed"


def test_declarations_are_checked_and_name_what_was_wrong(tmp_path: Path) -> None:
    tools = make_tools(Ledger(tmp_path / "ledger"))
    store = open_store(tmp_path / "s.jsonl")
    with pytest.raises(TypeError, match="safe is a collection of tool names"):
        AgentSession(store, tools, safe="read")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="safe names tools not given: 'reed'"):
        AgentSession(store, tools, safe={"reed"})
    with pytest.raises(ValueError, match="unknown kind 'imag'"):
        AgentSession(store, tools, carry={"imag": "drop"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="not 'keep'"):
        AgentSession(store, tools, carry={"image": "keep"})  # type: ignore[dict-item]
    repo = sessionlog.repository(tmp_path / "repo")
    with pytest.raises(TypeError, match="session_id"):
        asyncio.run(AgentSession.in_repository(repo, None, tools))  # type: ignore[arg-type]
    with pytest.raises(sessionlog.InvalidKeyError, match="session_id is empty"):
        asyncio.run(AgentSession.in_repository(repo, "", tools))
    assert repo.list() == []
    repo.close()


def test_the_docs_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/openai-agents.md's code, with a scripted model in place of the SDK's default one."""
    page = (Path(__file__).parents[1] / "docs" / "openai-agents.md").read_text()
    code = page.split("```py\n", 1)[1].split("```", 1)[0]
    assert code.count('Agent(name="ops", ') == 1
    steps = [
        [function_call("read", {"path": "notes.txt"}, call_id="r1")],
        [function_call("charge", {"amount": 5}, call_id="c1")],
        [assistant_message("Charged 5.")],
    ]
    code = code.replace('Agent(name="ops", ', 'Agent(name="ops", model=SCRIPTED, ')
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("charge 5")
    printed: list[str] = []
    exec(
        compile(code, "openai-agents.md", "exec"), {"SCRIPTED": ScriptedModel(steps), "print": printed.append}
    )
    assert printed == ["Charged 5."]
    state = sessionlog.open(tmp_path / "ops.jsonl", "jsonl-fsync").load()
    assert state.last_finished["outcome"] == "completed"
    outputs = [entry["content"] for entry in state.transcript if entry["role"] == "tool"]
    assert outputs[0] == "charge 5" and outputs[1].startswith("charged 5, key sl-")
