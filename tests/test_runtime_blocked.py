"""Issue 23, item 1: never stuck. A blocked plan is a typed value with its reason and the ways
out, and the runtime offers them: `Run.restart()` (end the run truthfully, ask its prompt again
as a new run), `Run.end()`, or keep it for a person."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import sessionlog
from conftest import HEADER


def _tools(log: list[str], *, read_replay: str = "safe") -> list[sessionlog.Tool]:
    def read(arguments: dict[str, Any]) -> str:
        log.append("read")
        return "text"

    def bash(arguments: dict[str, Any]) -> str:
        log.append("bash")
        return "ok"

    return [sessionlog.Tool("read", read, replay=read_replay), sessionlog.Tool("bash", bash)]  # type: ignore[arg-type]


def _open(path: Path, log: list[str], **options: Any) -> sessionlog.Session:
    store = sessionlog.open(path, "jsonl") if path.exists() else sessionlog.create(path, "jsonl", **HEADER)
    read_replay = options.pop("read_replay", "safe")
    return sessionlog.Session(store, tools=_tools(log, read_replay=read_replay), model="m", **options)


def _answer(session: sessionlog.Session, run: sessionlog.Run) -> dict[str, Any]:
    while run.needs_model:
        attempt = run.attempt()
        if session.state.transcript[-1]["role"] == "tool":
            attempt.settle("done")
        else:
            attempt.settle(None, [{"id": "1", "name": "read", "arguments": {}}, {"id": "2", "name": "bash"}])
        for call in run.start_tools():
            call.run()
    return run.finish()


def test_two_lost_answers_of_one_model_call_block_with_a_reason_and_restart_finishes(tmp_path: Path) -> None:
    log: list[str] = []
    session = _open(tmp_path / "s.jsonl", log)
    session.start("do it").attempt()  # killed during the request
    session.resume().attempt()  # type: ignore[union-attr]  # attempt 2: killed again
    run = session.resume()
    assert run is not None and not run.needs_model
    blocked = run.blocked
    assert isinstance(blocked, sessionlog.Blocked) and blocked.reason == "attempts_exhausted"
    assert set(blocked.ways_out) == {"restart", "end", "keep"} and "attempt 2" in blocked.explanation
    with pytest.raises(sessionlog.RunBlockedError) as raised:
        run.attempt()
    assert raised.value.blocked.reason == "attempts_exhausted" and "restart()" in str(raised.value)
    with pytest.raises(sessionlog.RunBlockedError):
        run.finish()
    again = run.restart()
    ended = [line for line in (tmp_path / "s.jsonl").read_text().splitlines() if "operationFinished" in line]
    assert len(ended) == 1 and '"outcome":"aborted"' in ended[0]  # ended by the program, as abort does
    assert "provider request failed" not in (tmp_path / "s.jsonl").read_text()  # no request failed
    assert again.operation_id != run.operation_id and again.blocked is None
    assert _answer(session, again)["outcome"] == "completed"
    prompts = [m["content"] for m in session.state.transcript if m["role"] == "user"]
    assert prompts == ["do it", "do it"] and log == ["read", "bash"]
    session.store.close()


def test_a_changed_environment_blocks_a_pending_tool_and_end_aborts_truthfully(tmp_path: Path) -> None:
    log: list[str] = []
    session = _open(tmp_path / "s.jsonl", log)
    run = session.start("do it")
    run.attempt().settle(None, [{"id": "1", "name": "bash", "arguments": {}}, {"id": "2", "name": "read"}])
    (bash, _read) = run.start_tools()
    bash.begin()  # the intent is durable, then the process dies
    session.store.close()
    moved = _open(tmp_path / "s.jsonl", log, environment="elsewhere")
    blocked = moved.resume()
    assert blocked is not None and blocked.blocked is not None
    assert blocked.blocked.reason == "environment_changed"
    outcome = blocked.end()
    assert outcome["outcome"] == "aborted" and moved.state.is_idle
    results = [m["content"] for m in moved.state.transcript if m["role"] == "tool"]
    assert results[0].startswith("Operation interrupted") and results[1].startswith("Operation aborted")
    assert log == []  # nothing ran
    moved.store.close()


def test_a_pending_read_no_longer_safe_blocks_before_a_later_tool_starts(tmp_path: Path) -> None:
    """The planner alone would start the later bash (rule 9 before rule 11); the runtime settles
    call 0 first, so it is blocked on it: replay_declaration_changed."""
    log: list[str] = []
    session = _open(tmp_path / "s.jsonl", log)
    run = session.start("do it")
    run.attempt().settle(None, [{"id": "1", "name": "read", "arguments": {}}, {"id": "2", "name": "bash"}])
    run.start_tools()[0].begin()
    session.store.close()
    changed = _open(tmp_path / "s.jsonl", log, read_replay="never")
    run = changed.resume()
    assert run is not None and run.blocked is not None
    assert run.blocked.reason == "replay_declaration_changed" and log == []
    assert sessionlog.plan_recovery(changed.state, changed.configuration.current)["type"] == "startTool"
    again = run.restart()
    assert _answer(changed, again)["outcome"] == "completed" and log == ["read", "bash"]
    changed.store.close()


def test_restart_and_end_refuse_a_run_that_is_not_blocked(tmp_path: Path) -> None:
    session = _open(tmp_path / "s.jsonl", [])
    run = session.start("do it")
    with pytest.raises(sessionlog.RuntimeStateError, match="not blocked"):
        run.restart()
    with pytest.raises(sessionlog.RuntimeStateError, match="not blocked"):
        run.end()
    session.store.close()


def test_the_async_twin_restarts_a_blocked_run(tmp_path: Path) -> None:
    import asyncio

    async def main() -> None:
        path = tmp_path / "s.jsonl"
        store = await sessionlog.create_async(path, "jsonl-group", **HEADER)
        session = sessionlog.AsyncSession(store, tools=_tools([]), model="m")
        await (await session.start("do it")).attempt()
        await (await session.resume()).attempt()  # type: ignore[union-attr]
        run = await session.resume()
        assert run is not None
        blocked = run.blocked
        assert blocked is not None and blocked.reason == "attempts_exhausted"
        with pytest.raises(sessionlog.RunBlockedError):
            await run.attempt()
        again = await run.restart()
        await (await again.attempt()).settle("done")
        assert (await again.finish())["outcome"] == "completed"
        assert (await session.state()).last_finished["outcome"] == "completed"  # type: ignore[index]
        await store.close()

    asyncio.run(main())
