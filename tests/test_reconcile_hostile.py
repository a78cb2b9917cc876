"""Issue 27, found by a second hostile try of reconciliation (each test failed before its fix):

* An output nested too deep to record (or holding itself) made every resume raise: the intent
  stayed pending, reconcile was asked again, and after `DidNotRun` the never-replayed tool ran
  once per resume. Now such an output is an error result, as any unrecordable output is.
* An answer that misbehaves when read (a `why` whose `__bool__` raises, an object claiming to
  be a `Ran`) made every resume raise: now a failed reconcile, settled as interrupted.
* A given-up coroutine that raised later was reported by asyncio at shutdown with its text.
* `DidNotRun` ran a tool whose definition changed since the intent, with the old arguments.
* `KeyboardInterrupt` / `SystemExit` from a sync reconcile function were swallowed (the call
  settled for good); from a coroutine they stopped the resume. One rule now: they stop it.
* Declaration errors named the tool as a value ("a string of 6 characters starting 'd'").
* A `Ran` whose output cannot be recorded was committed as an error result unlogged.

A third try found the rest of the first class: after a tool ran, recording its result raised
(an exception whose `__str__` raises, an output claiming to be a `str`, an output whose type's
metaclass `__eq__` raises), so after `DidNotRun` the tool ran once per resume; a `Ran` property
raising a `BaseException` escaped every resume; the reconciliation note was not the content's
last line when the output held a lone surrogate or was too long for the store; a given-up
coroutine's late `SystemExit` escaped the loop; the LangGraph ledger named a tool whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from sessionlog.core.framing import MAX_NESTING_DEPTH
from test_reconcile import Killed
from test_reconcile_answers import (
    INTERRUPTED,
    RUNTIMES,
    Deploy,
    _crashed,
    _deploy,
    _effect,
    _resumed,
    _status,
    raiser,
)

SECRET = "sk_live_51HxQ2eSECRETVALUE0123456789abcdef"


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _cycle() -> dict[str, Any]:
    value: dict[str, Any] = {}
    value["self"] = value
    return value


TOO_DEEP = f"Error: tool 'deploy' returned a value nested deeper than {MAX_NESTING_DEPTH} arrays or objects"


# -- an output too deep to record is an error result, never a resume that raises -----------------


@pytest.mark.parametrize(
    "output", [_nested(MAX_NESTING_DEPTH + 1), _nested(5000), _cycle()], ids=["255", "5000", "cycle"]
)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_ran_output_too_deep_to_record_is_an_error_result(
    tmp_path: Path, runtime: str, output: Any
) -> None:
    deploy = Deploy()
    tools = _deploy(lambda key, arguments: sessionlog.Ran(output), deploy)
    _crashed(tmp_path / "s.jsonl", tools)
    progressed, reconciled, content = _resumed(tmp_path / "s.jsonl", tools, runtime)
    assert progressed and reconciled[0].decision == "ran" and content.startswith(TOO_DEEP)
    assert len(deploy.runs) == 1
    assert _resumed(tmp_path / "s.jsonl", tools, runtime)[1] == []  # settled: nothing asked again


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_did_not_run_tool_whose_output_is_too_deep_runs_once(tmp_path: Path, runtime: str) -> None:
    runs: list[str] = []

    def deploy(arguments: dict[str, Any], key: str) -> object:
        runs.append(key)
        if len(runs) == 1:
            raise KeyboardInterrupt  # the crash: not an Exception, nothing recorded
        return _nested(5000)

    tools = [sessionlog.Tool("deploy", deploy, reconcile=lambda key, arguments: sessionlog.DidNotRun())]
    with pytest.raises(KeyboardInterrupt):
        _crashed(tmp_path / "s.jsonl", tools)
    for _ in range(3):
        _resumed(tmp_path / "s.jsonl", tools, runtime)
    assert len(runs) == 2 and len(set(runs)) == 1  # the crashed run and one run after DidNotRun
    content = _resumed(tmp_path / "s.jsonl", tools, runtime)[2]
    assert content.startswith(TOO_DEEP)


def test_a_tool_output_too_deep_to_record_is_an_error_result(tmp_path: Path) -> None:
    """Not only after a crash: any run of a tool."""
    with sessionlog.create(tmp_path / "s.jsonl", "jsonl", provider="p", model="m") as store:
        tools = [sessionlog.Tool("deploy", lambda arguments: _cycle())]
        run = sessionlog.Session(store, tools=tools, model="m").start("go")
        run.attempt().settle(None, [{"id": "1", "name": "deploy", "arguments": {}}])
        (call,) = run.start_tools()
        call.run()
        assert store.load().transcript[-1]["content"].startswith(TOO_DEEP)


# -- an answer that misbehaves when read is a failed reconcile ---------------------------------------


class _Why(str):
    def __bool__(self) -> bool:
        raise RuntimeError(SECRET)

    def __len__(self) -> int:
        raise RuntimeError(SECRET)


class _Impostor:
    """Claims to be a Ran (isinstance follows `__class__`), holds none of its fields."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return sessionlog.Ran


def _forced_why() -> sessionlog.Unknown:
    answer = sessionlog.Unknown("503")
    object.__setattr__(answer, "why", 12345)
    return answer


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize(
    "answer, why",
    [
        (lambda: sessionlog.Unknown(_Why("503")), "503"),
        (_Impostor, "reconcile returned a _Impostor, not Ran(output), DidNotRun() or Unknown(why)"),
        (_forced_why, "Unknown(why) holds a value of type int, not a string"),
    ],
    ids=["why-raises", "impostor", "why-forced"],
)
def test_an_answer_that_misbehaves_when_read_is_settled_as_interrupted(
    tmp_path: Path, runtime: str, answer: Any, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    tools = _deploy(lambda key, arguments: answer(), Deploy())
    _crashed(tmp_path / "s.jsonl", tools)
    with caplog.at_level(logging.WARNING):
        progressed, reconciled, content = _resumed(tmp_path / "s.jsonl", tools, runtime)
    assert progressed and content == INTERRUPTED
    assert reconciled[0].decision == "unknown" and reconciled[0].why == why
    assert type(reconciled[0].why) is str and SECRET not in caplog.text


# -- a given-up coroutine never reports its failure's text ----------------------------------------


def test_a_given_up_coroutine_that_fails_later_is_never_reported_with_its_text(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """It ignores the timeout's cancellation and raises at asyncio.run's shutdown, which cancels
    every task left and reports a failure with its traceback: the question's failure is its
    answer, never asyncio's to report."""

    async def stubborn(key: str, arguments: dict[str, Any]) -> object:
        with contextlib.suppress(asyncio.CancelledError):  # ignores the timeout's cancellation
            await asyncio.sleep(3600)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:  # the shutdown's
            raise ConnectionError(f"token={SECRET}") from None
        return sessionlog.Unknown()

    tools = _deploy(stubborn, Deploy(), reconcile_timeout=0.1)
    _crashed(tmp_path / "s.jsonl", tools)
    with caplog.at_level(logging.DEBUG):
        progressed, reconciled, content = _resumed(tmp_path / "s.jsonl", tools, "async")
    out, err = capfd.readouterr()
    assert progressed and content == INTERRUPTED and reconciled[0].why == "reconcile took longer than 0.1 s"
    assert SECRET not in out + err + caplog.text
    assert [r for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR] == []


# -- DidNotRun never runs a tool whose definition changed ----------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_did_not_run_for_a_tool_whose_definition_changed_is_settled_as_interrupted(
    tmp_path: Path, runtime: str, caplog: pytest.LogCaptureFixture
) -> None:
    deploy = Deploy()
    _crashed(tmp_path / "s.jsonl", _deploy(lambda key, arguments: sessionlog.DidNotRun(), deploy))
    changed = [
        sessionlog.Tool(
            "deploy",
            deploy,
            parameters={"type": "object", "required": ["release"]},
            reconcile=lambda key, arguments: sessionlog.DidNotRun(),
        )
    ]
    with caplog.at_level(logging.WARNING, logger="sessionlog.reconcile"):
        progressed, reconciled, content = _resumed(tmp_path / "s.jsonl", changed, runtime)
    assert progressed and content == INTERRUPTED and len(deploy.runs) == 1  # not run again
    assert reconciled[0].decision == "unknown"
    assert reconciled[0].why == (
        "DidNotRun, but the tool's definition changed since the call's intent: "
        "not run under another definition"
    )
    assert reconciled[0].why in caplog.text


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_ran_for_a_tool_whose_definition_changed_is_recorded(tmp_path: Path, runtime: str) -> None:
    """The call ran under its old definition: its counterpart's report is the truth."""
    deploy = Deploy()
    _crashed(tmp_path / "s.jsonl", _deploy(lambda key, arguments: sessionlog.DidNotRun(), deploy))
    ran = sessionlog.Ran("done")
    changed = [sessionlog.Tool("deploy", deploy, description="v3", reconcile=lambda key, arguments: ran)]
    progressed, reconciled, content = _resumed(tmp_path / "s.jsonl", changed, runtime)
    assert progressed and reconciled[0].decision == "ran" and content.startswith("done\n")


# -- KeyboardInterrupt and SystemExit stop the resume, whatever asks ----------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("kind", ["function", "coroutine"])
@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_a_stop_raised_by_reconcile_stops_the_resume_and_settles_nothing(
    tmp_path: Path, runtime: str, kind: str, stop: type[BaseException]
) -> None:
    deploy = Deploy()
    tools = _deploy(raiser(stop, kind == "coroutine"), deploy)
    _crashed(tmp_path / "s.jsonl", tools)
    with pytest.raises(stop):
        _resumed(tmp_path / "s.jsonl", tools, runtime)
    state = sessionlog.reduce_bytes((tmp_path / "s.jsonl").read_bytes())
    assert len(state.pending_tools) == 1 and len(deploy.runs) == 1  # nothing settled, nothing run


# -- declarations ---------------------------------------------------------------------------------


def test_a_declaration_error_names_the_tool_as_written() -> None:
    with pytest.raises(ValueError, match=r"^tool 'deploy': reconcile_timeout is a number of seconds"):
        sessionlog.Tool("deploy", _effect, reconcile=_status, reconcile_timeout=0)
    with pytest.raises(ValueError, match=r"^tool 'search_knowledge_base': replay_key"):
        sessionlog.Tool("search_knowledge_base", lambda arguments: "", replay_key="v1")
    with pytest.raises(ValueError) as refused:  # a secret pasted as a name keeps its random part
        sessionlog.Tool(SECRET, lambda arguments: "", replay_key="v1")
    assert str(refused.value).startswith(f"tool a name of {len(SECRET)} characters starting 'sk_live_'")


def test_replace_into_a_contradiction_is_refused_with_the_fix() -> None:
    """`dataclasses.replace` passes the resolved `replay` on (the Tool docstring says so)."""
    plain = sessionlog.Tool("charge", _effect)
    with pytest.raises(ValueError, match=r"replay='never' says it must not be replayed: declare one of them"):
        dataclasses.replace(plain, idempotent=True)
    assert dataclasses.replace(plain, idempotent=True, replay="safe").key.startswith("idempotent:charge:")


# -- a Ran whose output cannot be recorded is logged ---------------------------------------------


@pytest.mark.parametrize(
    "output, what",
    [(b"x", "a value of type bytes"), (10**30, "an integer beyond 64 bits"), (float("nan"), "the float nan")],
    ids=["bytes", "big-int", "nan"],
)
def test_a_ran_output_that_cannot_be_recorded_is_logged_and_an_error_result(
    tmp_path: Path, output: object, what: str, caplog: pytest.LogCaptureFixture
) -> None:
    tools = _deploy(lambda key, arguments: sessionlog.Ran(output), Deploy())
    _crashed(tmp_path / "s.jsonl", tools)
    with caplog.at_level(logging.WARNING, logger="sessionlog.reconcile"):
        _, reconciled, content = _resumed(tmp_path / "s.jsonl", tools, "sync")
    assert reconciled[0].decision == "ran"
    assert content.startswith(f"Error: tool 'deploy' returned {what}, not text or a JSON value")
    assert f"Ran's output is {what}: committed as an error result" in caplog.text


# -- a third try: nothing raises after a tool ran; the note stays last ------------------------------


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError(SECRET)


class _FakeStr:
    """Claims to be a str (isinstance follows `__class__`)."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return str


class _Meta(type):
    def __eq__(cls, other: object) -> bool:
        raise RuntimeError(SECRET)

    __hash__ = type.__hash__


class _Weird(metaclass=_Meta):
    pass


def _unprintable() -> object:
    raise _Unprintable


OUTPUTS = {
    "str-raises": (_unprintable, "_Unprintable: (its text could not be read)"),
    "fake-str": (_FakeStr, "a value of type test_reconcile_hostile._FakeStr"),
    "metaclass-eq": (_Weird, "a value of type test_reconcile_hostile._Weird"),
}


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("case", ["fake-str", "metaclass-eq"])
def test_a_ran_output_whose_reading_raises_is_an_error_result(
    tmp_path: Path, runtime: str, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    make, shown = OUTPUTS[case]
    tools = _deploy(lambda key, arguments: sessionlog.Ran(make()), Deploy())
    _crashed(tmp_path / "s.jsonl", tools)
    with caplog.at_level(logging.WARNING, logger="sessionlog.reconcile"):
        progressed, reconciled, content = _resumed(tmp_path / "s.jsonl", tools, runtime)
    assert progressed and reconciled[0].decision == "ran" and shown in content
    assert f"Ran's output is {shown}" in caplog.text and SECRET not in caplog.text + content


class _Boom(BaseException):
    pass


class _RanBoom(sessionlog.Ran):
    @property  # type: ignore[misc]
    def output(self) -> object:
        raise _Boom(SECRET)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_answer_raising_a_base_exception_when_read_is_a_failed_reconcile(
    tmp_path: Path, runtime: str, caplog: pytest.LogCaptureFixture
) -> None:
    tools = _deploy(lambda key, arguments: object.__new__(_RanBoom), Deploy())
    _crashed(tmp_path / "s.jsonl", tools)
    with caplog.at_level(logging.WARNING):
        progressed, reconciled, content = _resumed(tmp_path / "s.jsonl", tools, runtime)
    assert progressed and content == INTERRUPTED
    assert reconciled[0].why == "reading reconcile's answer raised _Boom" and SECRET not in caplog.text


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("answer", ["ran", "notRun"])
def test_the_note_is_the_last_line_of_an_output_holding_a_lone_surrogate(
    tmp_path: Path, runtime: str, answer: str
) -> None:
    text = "a\ud800b"
    runs: list[str] = []

    def deploy(arguments: dict[str, Any], key: str) -> object:
        runs.append(key)
        if len(runs) == 1:
            raise Killed
        return text

    def status(key: str, arguments: dict[str, Any]) -> object:
        return sessionlog.Ran(text) if answer == "ran" else sessionlog.DidNotRun()

    tools = [sessionlog.Tool("deploy", deploy, reconcile=status)]
    _crashed(tmp_path / "s.jsonl", tools)
    _, _, content = _resumed(tmp_path / "s.jsonl", tools, runtime)
    assert content.startswith("a\\ud800b\n[sessionlog: 1 character(s) not encodable")
    assert sessionlog.runtime_reconcile.reconciliation(content) == answer


def test_the_note_is_the_last_line_of_an_output_too_long_for_the_store(tmp_path: Path) -> None:
    tools = _deploy(lambda key, arguments: sessionlog.Ran("x" * 20_000), Deploy())
    _crashed(tmp_path / "s.jsonl", tools)
    with sessionlog.open(tmp_path / "s.jsonl", "jsonl", max_line_bytes=8192) as store:
        session = sessionlog.Session(store, tools=tools, model="m")
        assert session.resume() is not None
        content = session.state.transcript[-1]["content"]
    assert content.startswith("Error: [sessionlog: the tool's output was 20000 bytes, too long")
    assert sessionlog.runtime_reconcile.reconciliation(content) == "ran"


def test_a_given_up_coroutine_that_stops_later_is_dropped(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Its late SystemExit reaches nobody: the loop goes on, nothing is printed."""
    events: dict[str, asyncio.Event] = {}

    async def stubborn(key: str, arguments: dict[str, Any]) -> object:
        with contextlib.suppress(asyncio.CancelledError):  # ignores the timeout's cancellation
            await asyncio.sleep(3600)
        await events["release"].wait()
        events["raised"].set()
        raise SystemExit(SECRET)

    tools = _deploy(stubborn, Deploy(), reconcile_timeout=0.1)
    _crashed(tmp_path / "s.jsonl", tools)

    async def main() -> str:
        events.update(release=asyncio.Event(), raised=asyncio.Event())
        store = await sessionlog.open_async(tmp_path / "s.jsonl", "jsonl-async")
        session = sessionlog.AsyncSession(store, tools=tools, model="m")
        await session.resume()
        events["release"].set()
        await asyncio.wait_for(events["raised"].wait(), 60)  # a bound, should the test fail
        for _ in range(3):
            await asyncio.sleep(0)  # the task ends: its SystemExit would leave the loop here
        content = (await session.state()).transcript[-1]["content"]
        await store.close()
        return content

    assert asyncio.run(main()) == INTERRUPTED
    out, err = capfd.readouterr()
    assert SECRET not in out + err


# -- a fourth try: type names read from the type object, BaseExceptions, str subclasses -----------


class _NamelessMeta(type):
    @property
    def __name__(cls) -> str:  # type: ignore[override]
        raise RuntimeError(SECRET)


class _Nameless(Exception, metaclass=_NamelessMeta):
    pass


class _BaseUnprintable(Exception):
    def __str__(self) -> str:
        raise _Boom(SECRET)


class _ClassRaises:
    @property  # type: ignore[misc]
    def __class__(self) -> type:
        raise RuntimeError(SECRET)


def _raise(error: BaseException) -> object:
    raise error


MORE_OUTPUTS = {
    "nameless-exception": (lambda: _raise(_Nameless()), "_Nameless: "),
    "str-raises-base": (lambda: _raise(_BaseUnprintable()), "_BaseUnprintable: (its text could not be read)"),
    "class-raises": (_ClassRaises, "a value of type test_reconcile_hostile._ClassRaises"),
}


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("case", list(OUTPUTS) + list(MORE_OUTPUTS))
def test_a_tool_run_after_did_not_run_is_recorded_whatever_it_returns(
    tmp_path: Path, runtime: str, case: str
) -> None:
    make, shown = {**OUTPUTS, **MORE_OUTPUTS}[case]
    runs: list[str] = []

    def deploy(arguments: dict[str, Any], key: str) -> object:
        runs.append(key)
        if len(runs) == 1:
            raise Killed
        return make()

    tools = [sessionlog.Tool("deploy", deploy, reconcile=lambda key, arguments: sessionlog.DidNotRun())]
    _crashed(tmp_path / "s.jsonl", tools)
    for _ in range(3):
        progressed, _, content = _resumed(tmp_path / "s.jsonl", tools, runtime)
        assert progressed
    assert len(runs) == 2  # the crashed run and the one after DidNotRun: never once a resume
    assert shown in content and SECRET not in content
    assert sessionlog.runtime_reconcile.reconciliation(content) == "notRun"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_reconcile_raising_a_nameless_exception_is_a_failed_reconcile(
    tmp_path: Path, runtime: str, capfd: pytest.CaptureFixture[str]
) -> None:
    tools = _deploy(raiser(_Nameless, runtime == "async"), Deploy())
    _crashed(tmp_path / "s.jsonl", tools)
    progressed, reconciled, content = _resumed(tmp_path / "s.jsonl", tools, runtime)
    assert progressed and content == INTERRUPTED and reconciled[0].why == "reconcile raised _Nameless"
    out, err = capfd.readouterr()
    assert SECRET not in out + err


class _Status(enum.StrEnum):
    DEPLOYED = "deployed"


TWO_CALLS = [{"id": "1", "name": "deploy", "arguments": {}}, {"id": "2", "name": "deploy", "arguments": {}}]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_str_subclass_is_recorded_as_the_string_it_holds(tmp_path: Path, runtime: str) -> None:
    """A StrEnum member from `finish` or a tool's run: the plain string (it was a ValidationError
    after the tool ran)."""
    tools = [sessionlog.Tool("deploy", lambda arguments: _Status.DEPLOYED)]
    path = tmp_path / "s.jsonl"
    if runtime == "sync":
        with sessionlog.create(path, "jsonl", provider="p", model="m") as store:
            run = sessionlog.Session(store, tools=tools, model="m").start("go")
            run.attempt().settle(None, TWO_CALLS)
            first, second = run.start_tools()
            first.run()
            second.begin()
            second.finish(_Status.DEPLOYED)
            contents = [message["content"] for message in store.load().transcript[-2:]]
    else:

        async def main() -> list[str]:
            store = await sessionlog.create_async(path, "jsonl-async", provider="p", model="m")
            run = await sessionlog.AsyncSession(store, tools=tools, model="m").start("go")
            await (await run.attempt()).settle(None, TWO_CALLS)
            first, second = await run.start_tools()
            await first.run()
            await second.begin()
            await second.finish(_Status.DEPLOYED)
            state = await store.load()
            await store.close()
            return [message["content"] for message in state.transcript[-2:]]

        contents = asyncio.run(main())
    assert contents == ["deployed", "deployed"] and all(type(text) is str for text in contents)


def test_the_openai_agents_output_of_a_str_subclass_or_an_unreadable_value_is_recorded() -> None:
    from sessionlog.adapters.openai_agents_items import Carry, output_text

    assert output_text(_Status.DEPLOYED, Carry(), "the output") == ("deployed", [])
    text, _ = output_text(_ClassRaises(), Carry(), "the output of call 'c1'")
    assert text == (
        "Error: the output of call 'c1' is a value of type test_reconcile_hostile._ClassRaises, "
        "not text or a JSON value"
    )
