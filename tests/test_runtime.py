"""The agent loop as an API: sessionlog.Session (and AsyncSession) over a store."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from conftest import HEADER


class Effects:
    """Tools whose every execution is logged: `read` is safe, `bash` is never."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def tools(self) -> list[sessionlog.Tool]:
        def read(arguments: dict[str, Any]) -> str:
            self.log.append(f"read {arguments['path']}")
            return f"contents of {arguments['path']}"

        def bash(arguments: dict[str, Any]) -> str:
            self.log.append(f"bash {arguments['command']}")
            return "ok"

        return [
            sessionlog.Tool("read", read, "read a file", replay="safe"),
            sessionlog.Tool("bash", bash, "run a command"),
        ]


def model(step: int) -> tuple[str | None, list[dict[str, Any]]]:
    """A fake model: two steps of a read then a bash, then an answer."""
    if step < 2:
        return None, [
            {"id": f"r{step}", "name": "read", "arguments": {"path": f"f{step}"}},
            {"id": f"b{step}", "name": "bash", "arguments": {"command": f"c{step}"}},
        ]
    return "done", []


def _session(tmp_path: Path, effects: Effects, backend: str = "jsonl") -> sessionlog.Session:
    path = tmp_path / "s.jsonl"
    store = sessionlog.open(path, backend) if path.exists() else sessionlog.create(path, backend, **HEADER)
    return sessionlog.Session(store, tools=effects.tools(), model="test/model")


def _loop(session: sessionlog.Session, run: sessionlog.Run) -> dict[str, Any]:
    while run.needs_model:
        attempt = run.attempt()
        step = sum(1 for message in session.state.transcript if message["role"] == "assistant")
        content, calls = model(step)
        attempt.settle(content, calls, usage={"input": 10, "output": 5})
        for call in run.start_tools():
            call.run()
    return run.finish()


def test_the_loop_commits_intent_before_effect_and_finishes(tmp_path: Path) -> None:
    effects = Effects()
    session = _session(tmp_path, effects)
    run = session.start("do it")
    outcome = _loop(session, run)
    assert outcome["outcome"] == "completed" and outcome["completion"] == "normal"
    assert effects.log == ["read f0", "bash c0", "read f1", "bash c1"]
    state = session.state
    assert state.is_idle and state.last_finished == outcome
    assert state.usage.input == 30
    # each intent is its own transaction, right before its tool's result
    lines = (tmp_path / "s.jsonl").read_bytes().splitlines()
    intents = [number for number, line in enumerate(lines) if b'"toolStarted"' in line]
    assert len(intents) == 4 and all(lines[number].count(b'"toolStarted"') == 1 for number in intents)
    assert all(b'"toolStartedId"' in lines[number + 1] for number in intents)
    snapshot = next(json.loads(line) for line in lines if b'"stepAttempt"' in line)["record"]
    assert snapshot["configurationDigest"] == session.configuration.current["configurationDigest"]
    session.store.close()


def test_resume_never_runs_bash_twice(tmp_path: Path) -> None:
    effects = Effects()
    session = _session(tmp_path, effects)
    run = session.start("do it")
    attempt = run.attempt()
    attempt.settle(*model(0))
    calls = run.start_tools()
    assert [call.name for call in calls] == ["read", "bash"]
    calls[0].run()
    calls[1].begin()  # bash's intent is durable; then the process dies: it may have run
    session.store.close()
    resumed = _session(tmp_path, effects)
    again = resumed.resume()
    assert again is not None and again.needs_model  # bash settled as interrupted
    assert effects.log == ["read f0"]
    results = [m["content"] for m in resumed.state.transcript if m["role"] == "tool"]
    assert results[0] == "contents of f0" and results[1].startswith("Operation interrupted")
    _loop(resumed, again)
    assert effects.log == ["read f0", "read f1", "bash c1"]  # bash c0 never ran (here)
    resumed.store.close()


def test_resume_retries_an_open_attempt_and_a_second_loss_blocks_until_abort(tmp_path: Path) -> None:
    effects = Effects()
    session = _session(tmp_path, effects)
    session.start("do it").attempt()  # the request may have been sent; its answer is lost
    again = session.resume()
    assert again is not None and again.needs_model
    assert again.attempt().number == 2  # the same step, once more
    blocked = session.resume()
    assert blocked is not None and not blocked.needs_model
    assert blocked.blocked is not None and blocked.blocked.reason == "attempts_exhausted"
    assert blocked.blocked.plan == {"type": "blocked", "reason": "attempts_exhausted"}
    assert blocked.abort()["outcome"] == "aborted"
    assert session.state.is_idle and session.resume() is None
    session.store.close()


def test_an_unknown_tool_or_bad_arguments_get_synthetic_results_in_the_same_transaction(
    tmp_path: Path,
) -> None:
    effects = Effects()
    session = _session(tmp_path, effects)
    run = session.start("do it")
    run.attempt().settle(
        None,
        [
            {"id": "x", "name": "missing", "arguments": {}},
            {"id": "y", "name": "read", "arguments": "not json"},
            {"id": "z", "name": "read", "arguments": {"path": "a"}},
        ],
    )
    calls = run.start_tools()
    assert [call.index for call in calls] == [2]
    reasons = [m["content"] for m in session.state.transcript if m["role"] == "tool"]
    assert reasons[0].startswith("Error: Unknown tool") and reasons[1].startswith("Error: Tool arguments")
    calls[0].run()
    assert run.needs_model
    session.store.close()


def test_a_failing_tool_is_recorded_as_an_error_result(tmp_path: Path) -> None:
    def broken(arguments: dict[str, Any]) -> str:
        raise OSError("disk on fire")

    store = sessionlog.create(tmp_path / "s.jsonl", "jsonl", **HEADER)
    session = sessionlog.Session(store, tools=[sessionlog.Tool("bash", broken)], model="m")
    run = session.start("x")
    run.attempt().settle(None, [{"id": "1", "name": "bash", "arguments": {}}])
    (call,) = run.start_tools()
    assert call.run() == "OSError: disk on fire"
    assert session.state.transcript[-1]["content"] == "OSError: disk on fire"
    with pytest.raises(sessionlog.RuntimeStateError):
        session.start("another prompt while the run is open")
    store.close()


def test_tools_are_declared_once() -> None:
    def noop(arguments: dict[str, Any]) -> str:
        return ""

    with pytest.raises(ValueError, match="declared twice"):
        sessionlog.Tools([sessionlog.Tool("a", noop), sessionlog.Tool("a", noop)])
    with pytest.raises(ValueError, match="safe"):
        sessionlog.Tool("a", noop, replay="maybe")  # type: ignore[arg-type]
    tools = sessionlog.Tools([sessionlog.Tool("a", noop, replay="safe")])
    configuration = sessionlog.Configuration.of(tools, model="m", environment="e")
    (declared,) = configuration.current["tools"]
    assert declared["definitionDigest"] == configuration.snapshot["tools"][0]["definitionDigest"]
    assert declared["replay"] == "safe" and declared["replayKey"].startswith("a:")
    sessionlog.plan_recovery(
        sessionlog.reduce_bytes(
            sessionlog.encode_header(cwd="/", provider="p", model="m", environment_identity="e")
        ),
        configuration.current,
    )  # a valid current configuration


def test_the_async_twin(tmp_path: Path) -> None:
    effects = Effects()

    async def main() -> None:
        store = await sessionlog.create_async(tmp_path / "s.jsonl", "jsonl-group", **HEADER)
        session = sessionlog.AsyncSession(store, tools=effects.tools(), model="test/model")
        run = await session.start("do it")
        step = 0
        while run.needs_model:
            attempt = await run.attempt()
            content, calls = model(step)
            await attempt.settle(content, calls)
            for call in await run.start_tools():
                await call.run()
            step += 1
        assert (await run.finish())["outcome"] == "completed"
        assert await session.resume() is None
        attempts = [
            line for line in (tmp_path / "s.jsonl").read_bytes().splitlines() if b"stepAttempt" in line
        ]
        assert len(attempts) == 3 and all(b'"attempt":1' in line for line in attempts)
        await store.close()

    asyncio.run(main())
    assert effects.log == ["read f0", "bash c0", "read f1", "bash c1"]


def test_plans_are_typed_for_mypy_users(tmp_path: Path) -> None:
    """py.typed ships: a framework's mypy checks plan keys against the union keyed on `type`."""
    import subprocess
    import sys

    good = tmp_path / "good.py"
    good.write_text(
        "import sessionlog\n"
        "from sessionlog.schema import CurrentConfiguration\n"
        "def next_tool(state: sessionlog.SessionState, current: CurrentConfiguration) -> str:\n"
        "    plan = sessionlog.plan_recovery(state, current)\n"
        "    if plan['type'] == 'startTool':\n"
        "        return plan['toolName'] + plan['mode']\n"
        "    return ''\n"
    )
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import sessionlog\n"
        "def next_tool(state: sessionlog.SessionState) -> str:\n"
        "    plan = sessionlog.plan_recovery(state, {})\n"
        "    return plan['toolName']\n"  # not narrowed: not every plan has it
    )
    command = [
        sys.executable,
        "-m",
        "mypy",
        "--strict",
        "--no-incremental",
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    assert subprocess.run([*command, str(good)], capture_output=True, text=True).returncode == 0
    checked = subprocess.run([*command, str(bad)], capture_output=True, text=True)
    assert checked.returncode == 1 and "toolName" in checked.stdout


def _quick_start() -> str:
    import re

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    quick: str = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)[0]
    assert "sessionlog.Session" in quick and len(quick.strip().splitlines()) <= 30
    return quick


def _run_killed(code: str) -> None:
    """Run the loop in this process until it 'dies' (SystemExit), then release its store as a
    killed process's would be."""
    import gc

    with pytest.raises(SystemExit):
        exec(compile(code, "quick start", "exec"), {"__name__": "quick"})
    gc.collect()


def test_the_readme_quick_start_is_short_and_runs_again_after_a_kill_during_bash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    quick = _quick_start()
    monkeypatch.chdir(tmp_path)
    # Killed while bash runs: its intent is durable, its result is not.
    killed = quick.replace("return f\"ran {arguments['command']}\"", "raise SystemExit('killed')", 1)
    assert killed != quick
    _run_killed(killed)
    exec(compile(quick, "quick start", "exec"), {"__name__": "quick"})
    assert "'outcome': 'completed'" in capsys.readouterr().out
    transcript = sessionlog.reduce_bytes((tmp_path / "agent.jsonl").read_bytes()).transcript
    results = [message["content"] for message in transcript if message["role"] == "tool"]
    assert results[0] == "deploy with: make deploy"  # the read's result, kept
    assert results[1].startswith("Operation interrupted")  # bash may have run: never again


def test_the_readme_quick_start_finishes_after_two_kills_during_one_model_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    quick = _quick_start()
    monkeypatch.chdir(tmp_path)
    line = "    content, calls = call_model("
    killed = quick.replace(line, "    raise SystemExit('killed'); " + line.strip(), 1)
    assert killed != quick
    _run_killed(killed)  # attempt 1 open, its answer lost
    _run_killed(killed)  # attempt 2 of the same call open: blocked attempts_exhausted
    exec(compile(quick, "quick start", "exec"), {"__name__": "quick"})
    assert "'outcome': 'completed'" in capsys.readouterr().out
    data = (tmp_path / "agent.jsonl").read_bytes()
    assert data.count(b'"outcome":"aborted"') == 1 and data.count(b'"outcome":"completed"') == 1
    state = sessionlog.reduce_bytes(data)
    results = [message["content"] for message in state.transcript if message["role"] == "tool"]
    assert results == ["deploy with: make deploy", "ran make deploy"] and state.is_idle


def test_create_with_exist_ok_opens_the_session_that_is_there(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with sessionlog.create(path, "jsonl", **HEADER) as store:
        store.commit(
            [{"kind": "entry", "entry": {"type": "message", "message": {"role": "user", "content": "x"}}}]
        )
    with pytest.raises(sessionlog.SessionExistsError):
        sessionlog.create(path, "jsonl", **HEADER)
    with sessionlog.create(path, "jsonl", exist_ok=True, **HEADER) as store:
        assert store.load().last_seq == 1


@pytest.mark.parametrize("kind", ["directory", "sqlite"])
def test_a_repository_gives_the_runtime_session_open_or_new(kind: str, tmp_path: Path) -> None:
    location = str(tmp_path / "repo") if kind == "directory" else f"sqlite:///{tmp_path / 's.db'}"
    effects = Effects()
    with sessionlog.repository(location) as repo:
        session = repo.session(tools=effects.tools(), model="test/model", labels=["demo"])
        run = session.start("do it")
        run.attempt()  # ... and the process dies with the request in flight
        session_id = session.state.session_id
        session.store.close()
        (unfinished,) = repo.unfinished()
        assert unfinished.session_id == session_id and unfinished.labels == ("demo",)
        again = repo.session(session_id, tools=effects.tools(), model="test/model")
        resumed = again.resume()
        assert resumed is not None and resumed.needs_model and resumed.attempt().number == 2
        again.store.close()

    async def async_twin() -> None:
        repo = await sessionlog.repository_async(location)
        session = await repo.session(tools=effects.tools(), model="test/model")
        run = await session.start("async")
        assert run.needs_model
        await session.store.close()
        await repo.close()

    asyncio.run(async_twin())
