"""The defects a review of #23's runtime found, each proven fixed (issue 23 review)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from conftest import HEADER
from sessionlog.runtime import InvalidAnswerError, RunOverError, RuntimeStateError


class Counted:
    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, arguments: dict[str, Any]) -> str:
        self.runs += 1
        return "deployed"


def _bash_session(path: Path, counted: Counted, **options: Any) -> sessionlog.Session:
    store = sessionlog.create(path, "jsonl", **HEADER)
    return sessionlog.Session(store, model="m", tools=[sessionlog.Tool("bash", counted)], **options)


def _one_call(run: Any, call_id: str = "1") -> None:
    run.attempt().settle(None, [{"id": call_id, "name": "bash", "arguments": {}}])


# -- 1: a call's tool runs once ----------------------------------------------------------------


@pytest.mark.parametrize("intents", ["tool", "step"])
def test_run_a_second_time_is_refused_before_the_tool_runs(tmp_path: Path, intents: str) -> None:
    counted = Counted()
    session = _bash_session(tmp_path / "s.jsonl", counted, intents=intents)
    run = session.start("go")
    _one_call(run)
    (call,) = run.start_tools()
    call.run()
    with pytest.raises(RuntimeStateError, match="result already"):
        call.run()
    with pytest.raises(RuntimeStateError, match="result already"):
        call.finish("again")
    assert counted.runs == 1


def test_run_after_begin_is_refused_the_tool_is_the_programs(tmp_path: Path) -> None:
    counted = Counted()
    session = _bash_session(tmp_path / "s.jsonl", counted)
    run = session.start("go")
    _one_call(run)
    (call,) = run.start_tools()
    call.begin()
    counted({})  # the program runs the tool itself
    with pytest.raises(RuntimeStateError, match="begin"):
        call.run()
    assert counted.runs == 1
    call.finish("deployed")
    assert session.state.pending_tools == []


def test_a_second_handle_of_a_call_reads_the_log(tmp_path: Path) -> None:
    counted = Counted()
    session = _bash_session(tmp_path / "s.jsonl", counted, intents="step")
    run = session.start("go")
    _one_call(run)
    (call,) = run.start_tools()
    twin = sessionlog.runtime.ToolCall(session, call.start, begun=True)
    call.run()
    with pytest.raises(RuntimeStateError, match="result already"):
        twin.run()
    assert counted.runs == 1


def test_async_run_a_second_time_is_refused(tmp_path: Path) -> None:
    runs = [0]

    async def bash(arguments: dict[str, Any]) -> str:
        runs[0] += 1
        return "ok"

    async def main() -> None:
        store = await sessionlog.create_async(tmp_path / "s.jsonl", "jsonl-async", **HEADER)
        session = sessionlog.AsyncSession(store, model="m", tools=[sessionlog.Tool("bash", bash)])
        run = await session.start("go")
        await (await run.attempt()).settle(None, [{"id": "1", "name": "bash", "arguments": {}}])
        (call,) = await run.start_tools()
        await call.run()
        with pytest.raises(RuntimeStateError, match="result already"):
            await call.run()
        await store.close()

    asyncio.run(main())
    assert runs == [1]


# -- 2: an output above the line limit ---------------------------------------------------------


def test_an_output_above_the_line_limit_is_an_error_result_and_resume_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    runs = [0]

    def read(arguments: dict[str, Any]) -> str:
        runs[0] += 1
        return "x" * 300_000

    store = sessionlog.create(path, "jsonl", **HEADER, max_line_bytes=100_000)
    session = sessionlog.Session(store, model="m", tools=[sessionlog.Tool("read", read, replay="safe")])
    run = session.start("go")
    run.attempt().settle(None, [{"id": "1", "name": "read", "arguments": {}}])
    (call,) = run.start_tools()
    text = call.run()
    assert "300000" in text and "100000" in text and "not recorded" in text
    (result,) = [m for m in session.state.transcript if m["role"] == "tool"]
    assert result["content"] == text
    assert '"result":{"type":"error"}' in path.read_text().splitlines()[-1]
    assert run.needs_model and runs == [1]
    store.close()
    again = sessionlog.Session(sessionlog.open(path, max_line_bytes=100_000), model="m", tools=[])
    assert again.resume() is not None  # never wedged


# -- 3: the async twin's blocked and needs_model are properties ---------------------------------


def test_the_readme_loop_ported_to_async(tmp_path: Path) -> None:
    async def main() -> dict[str, Any]:
        store = await sessionlog.create_async(tmp_path / "s.jsonl", "jsonl-async", **HEADER)
        session = sessionlog.AsyncSession(store, model="m", tools=[])
        run = await session.resume() or await session.start("Say hello.")
        assert run.blocked is None
        if run.blocked:
            run = await run.restart()  # pragma: no cover
        asked = 0
        while run.needs_model:
            asked += 1
            attempt = await run.attempt()
            await attempt.settle("Hello.")
        assert asked == 1
        finished = await run.finish()
        await store.close()
        return finished

    assert asyncio.run(main())["outcome"] == "completed"


# -- 4: a Run handle is tied to its run ------------------------------------------------------


def test_a_finished_runs_handle_refuses_every_step(tmp_path: Path) -> None:
    session = _bash_session(tmp_path / "s.jsonl", Counted())
    old = session.start("first")
    old.attempt().settle("done")
    old.finish()
    with pytest.raises(RunOverError, match="finished"):
        old.finish()
    new = session.start("second")
    with pytest.raises(RunOverError, match=old.operation_id):
        old.attempt()
    assert old.needs_model is False and old.blocked is None
    new.attempt().settle("done")
    assert new.finish()["outcome"] == "completed"


def test_a_restarted_runs_handle_refuses_every_step(tmp_path: Path) -> None:
    session = _bash_session(tmp_path / "s.jsonl", Counted())
    session.start("Say hello.").attempt()
    session.resume().attempt()  # type: ignore[union-attr]
    run = session.resume()
    assert run is not None and run.blocked is not None
    new = run.restart()
    for step in (run.restart, run.end, run.attempt, run.finish, run.abort):
        with pytest.raises(RunOverError, match="restarted"):
            step()
    new.attempt().settle("Hello.")
    assert new.finish()["outcome"] == "completed"


# -- 5: end and restart record the truth -------------------------------------------------------


def test_restart_of_a_changed_configuration_ends_aborted_not_a_failed_request(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    store = sessionlog.create(path, "jsonl", **HEADER)
    sessionlog.Session(store, model="m", tools=[]).start("go").attempt()
    store.close()
    session = sessionlog.Session(sessionlog.open(path), model="m2", tools=[])
    run = session.resume()
    assert run is not None and run.blocked is not None
    assert run.blocked.reason == "configuration_changed"
    run.restart()
    text = path.read_text()
    assert "model_error" not in text and "provider request failed" not in text
    finished = sessionlog.reduce_bytes(path.read_bytes())
    assert "abortRequested" in text
    assert finished.last_finished["outcome"] == "aborted"  # type: ignore[index]


# -- 7: settle() refuses what is not JSON, typed, with a path -----------------------------------


@pytest.mark.parametrize(
    ("content", "calls", "where"),
    [
        (None, [{"id": "1", "name": "t", "arguments": {"path": "x\udcff"}}], "tool_calls[0].arguments.path"),
        ("hi\ud800", [], "content"),
        (None, [{"name": "t", "arguments": {}}], "tool_calls[0].id"),
        (None, [{"id": "1", "arguments": {}}], "tool_calls[0].name"),
    ],
)
def test_settle_refuses_what_is_not_json_naming_where(
    tmp_path: Path, content: str | None, calls: list[dict[str, Any]], where: str
) -> None:
    path = tmp_path / "s.jsonl"
    store = sessionlog.create(path, "jsonl", **HEADER)
    session = sessionlog.Session(store, model="m", tools=[sessionlog.Tool("t", lambda a: "ok")])
    attempt = session.start("go").attempt()
    before = path.read_bytes()
    with pytest.raises(InvalidAnswerError) as raised:
        attempt.settle(content, calls)
    assert raised.value.path == where and where in str(raised.value)
    assert path.read_bytes() == before


# -- 8: the small ones -------------------------------------------------------------------------


def test_an_empty_model_and_a_prompt_not_text_are_refused(tmp_path: Path) -> None:
    store = sessionlog.create(tmp_path / "s.jsonl", "jsonl", **HEADER)
    with pytest.raises(ValueError, match="model"):
        sessionlog.Session(store, model="", tools=[])
    session = sessionlog.Session(store, model="m", tools=[])
    with pytest.raises(TypeError, match="prompt"):
        session.start(None)  # type: ignore[arg-type]


# -- 6: the CLI says idle once a run is finished -----------------------------------------------


def _pending_write(path: Path) -> None:
    store = sessionlog.create(path, "jsonl", **HEADER)
    session = sessionlog.Session(store, model="m", tools=[sessionlog.Tool("bash", Counted())])
    run = session.start("go")
    _one_call(run)
    (call,) = run.start_tools()
    call.begin()  # ... and the process dies
    store.close()


def test_abort_and_recover_json_give_no_plan_once_the_run_is_over(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    _pending_write(path)
    aborted = cli("abort", path, "--json")
    assert aborted.code == 0, aborted.err
    value = aborted.json()
    assert value["finished"]["outcome"] == "aborted" and value["plan"] is None
    assert cli("recover", path, "--json").json()["plan"] is None
    # plan --json is the contract's planner: rule 1's plan for idle (the shared fixture finish-idle)
    planned = cli("plan", path, "--json")
    assert planned.code == 0 and planned.json() == {
        "type": "finish",
        "outcome": "completed",
        "completion": "normal",
    }
    assert "idle" in cli("plan", path).out


def test_plan_with_a_missing_current_file_names_a_configuration_file(cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    _pending_write(path)
    run = cli("plan", path, "--current", tmp_path / "absent.json")
    assert run.code == 2
    assert "no session" not in run.err and "configuration file" in run.err


def test_a_kill_like_exception_in_the_tool_leaves_it_never_run_again_by_its_handle(tmp_path: Path) -> None:
    runs = [0]

    def bash(arguments: dict[str, Any]) -> str:
        runs[0] += 1
        raise KeyboardInterrupt

    store = sessionlog.create(tmp_path / "s.jsonl", "jsonl", **HEADER)
    session = sessionlog.Session(store, model="m", tools=[sessionlog.Tool("bash", bash)])
    run = session.start("go")
    _one_call(run)
    (call,) = run.start_tools()
    with pytest.raises(KeyboardInterrupt):
        call.run()
    with pytest.raises(RuntimeStateError, match="ran already"):
        call.run()
    with pytest.raises(RuntimeStateError, match="ran already"):
        call.finish("made up")
    assert runs == [1] and len(session.state.pending_tools) == 1
    again = session.resume()  # the never tool is settled as interrupted, not run
    assert again is not None and runs == [1] and again.needs_model


def test_the_async_twins_handle_is_tied_to_its_run(tmp_path: Path) -> None:
    async def main() -> None:
        store = await sessionlog.create_async(tmp_path / "s.jsonl", "jsonl-async", **HEADER)
        session = sessionlog.AsyncSession(store, model="m", tools=[])
        old = await session.start("first")
        await (await old.attempt()).settle("done")
        assert not old.needs_model  # the state in hand after settle
        await old.finish()
        new = await session.start("second")
        assert new.needs_model and not old.needs_model and old.blocked is None
        with pytest.raises(RunOverError, match="finished completed"):
            await old.attempt()
        await (await new.attempt()).settle("done")
        assert (await new.finish())["outcome"] == "completed"
        await store.close()

    asyncio.run(main())


def test_async_an_output_above_the_line_limit_is_an_error_result(tmp_path: Path) -> None:
    async def main() -> str:
        store = await sessionlog.create_async(
            tmp_path / "s.jsonl", "jsonl-async", **HEADER, max_line_bytes=100_000
        )
        tools = [sessionlog.Tool("read", lambda arguments: "y" * 200_000, replay="safe")]
        session = sessionlog.AsyncSession(store, model="m", tools=tools)
        run = await session.start("go")
        await (await run.attempt()).settle(None, [{"id": "1", "name": "read", "arguments": {}}])
        (call,) = await run.start_tools()
        text = await call.run()
        assert run.needs_model
        await store.close()
        return text

    text = asyncio.run(main())
    assert "200000 bytes" in text and "not recorded" in text
