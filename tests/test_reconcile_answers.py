"""Issue 27 review: what a reconcile function may answer, how long it may take, and the
declarations that contradict each other.

* A wrong answer (None, a string, a dict, `Ran(ok="no")`) is a failed reconcile: the call is
  settled as interrupted (Unknown), the answer's type named in the `sessionlog.reconcile` log and
  in the session's `reconciled` decisions; the session always progresses (sync and async).
* The timeout holds for a coroutine reconcile function too: one that awaits forever, or that
  swallows its cancellation, is given up at the timeout; one that blocks the loop (time.sleep)
  cannot be interrupted, and its late answer counts as unknown.
* A timed-out sync reconcile function keeps running in a named daemon thread; the resume
  returns after the timeout all the same.
* `Ran(ok=...)` and `Unknown(why)` take a real bool and a string; `Tool` refuses declarations
  that contradict each other (`idempotent=True, replay="never"`, a replay key or a reconcile
  timeout that nothing uses, a keyed function that cannot take the key).
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from test_reconcile import INTERRUPTED, Killed, crashed

RUNTIMES = ["sync", "async"]


class Deploy:
    """A deploy tool killed in its first run; `runs` the keys it ran with."""

    def __init__(self) -> None:
        self.runs: list[str] = []

    def __call__(self, arguments: dict[str, Any], key: str) -> str:
        self.runs.append(key)
        if len(self.runs) == 1:
            raise Killed
        return "deployed"


_crashed = crashed


def raiser(error: Callable[[], BaseException], coroutine: bool) -> Callable[..., Any]:
    """A reconcile function (a coroutine function if `coroutine`) that raises `error()`."""

    async def asynchronous(key: str, arguments: dict[str, Any]) -> object:
        raise error()

    def plain(key: str, arguments: dict[str, Any]) -> object:
        raise error()

    return asynchronous if coroutine else plain


def _resumed(path: Path, tools: list[sessionlog.Tool], runtime: str) -> tuple[bool, list[Any], str]:
    """Resume in the `runtime`: (whether the run went on to its next model request, the
    session's reconciled decisions, the last message's content)."""
    if runtime == "sync":
        store = sessionlog.open(path, "jsonl")
        session = sessionlog.Session(store, tools=tools, model="m")
        run = session.resume()
        progressed = run is not None and run.needs_model
        content = session.state.transcript[-1]["content"]
        store.close()
        return progressed, session.reconciled, content

    async def main() -> tuple[bool, list[Any], str]:
        store = await sessionlog.open_async(path, "jsonl-async")
        session = sessionlog.AsyncSession(store, tools=tools, model="m")
        run = await session.resume()
        progressed = run is not None and run.needs_model
        content = (await session.state()).transcript[-1]["content"]
        await store.close()
        return progressed, session.reconciled, content

    return asyncio.run(main())


def _deploy(reconcile: Callable[..., Any], deploy: Deploy, **options: Any) -> list[sessionlog.Tool]:
    return [sessionlog.Tool("deploy", deploy, reconcile=reconcile, **options)]


# -- 1. a wrong answer is a failed reconcile: the session progresses ------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize(
    "answer",
    [None, "yes it ran, secret=hunter2", {"status": "done"}, sessionlog.Ran, True],
    ids=["None", "str", "dict", "the-class", "bool"],
)
def test_a_wrong_answer_is_settled_as_interrupted_and_named(
    tmp_path: Path, runtime: str, answer: object, caplog: pytest.LogCaptureFixture
) -> None:
    deploy = Deploy()
    tools = _deploy(lambda key, arguments: answer, deploy)
    key = _crashed(tmp_path / "s.jsonl", tools)
    with caplog.at_level(logging.WARNING, logger="sessionlog.reconcile"):
        progressed, reconciled, content = _resumed(tmp_path / "s.jsonl", tools, runtime)
    assert progressed and content == INTERRUPTED  # progressed
    assert deploy.runs == [key]  # never run again
    (decided,) = reconciled
    kind = type(answer).__name__
    assert decided.decision == "unknown" and decided.tool_name == "deploy" and decided.key == key
    assert decided.index == 0 and decided.tool_call_id == "1"
    assert f"returned a {kind}, not Ran(output), DidNotRun() or Unknown(why)" in decided.why
    (record,) = [r for r in caplog.records if r.name == "sessionlog.reconcile"]
    assert record.levelno == logging.WARNING
    assert "tool 'deploy', call 0 (id '1')" in record.getMessage() and decided.why in record.getMessage()
    assert "hunter2" not in caplog.text and "hunter2" not in decided.why  # the type, never the value


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_wrong_answer_never_blocks_a_later_resume(tmp_path: Path, runtime: str) -> None:
    """The first resume settles the call; the next finds nothing to ask (no loop of errors)."""
    asked: list[str] = []

    def garbage(key: str, arguments: dict[str, Any]) -> object:
        asked.append(key)
        return None

    tools = _deploy(garbage, Deploy())
    _crashed(tmp_path / "s.jsonl", tools)
    _resumed(tmp_path / "s.jsonl", tools, runtime)
    progressed, reconciled, content = _resumed(tmp_path / "s.jsonl", tools, runtime)
    assert progressed and reconciled == [] and len(asked) == 1 and content == INTERRUPTED


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_every_decision_is_recorded_on_the_session(tmp_path: Path, runtime: str) -> None:
    deploy = Deploy()
    tools = _deploy(lambda key, arguments: sessionlog.DidNotRun(), deploy)
    key = _crashed(tmp_path / "s.jsonl", tools)
    _, reconciled, content = _resumed(tmp_path / "s.jsonl", tools, runtime)
    assert [(d.decision, d.key, d.why) for d in reconciled] == [("notRun", key, "")]
    assert content.startswith("deployed\n") and deploy.runs == [key, key]


# -- 3. Ran(ok=...) is a real bool; Unknown(why) a string ------------------------------------------


def test_ran_and_unknown_refuse_values_of_another_type() -> None:
    with pytest.raises(TypeError, match=r"Ran\(output, ok=\.\.\.\): ok is True or False, not str"):
        sessionlog.Ran("output", ok="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not int"):
        sessionlog.Ran("output", ok=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Unknown\(why\): why is a string, not int"):
        sessionlog.Unknown(503)  # type: ignore[arg-type]
    assert sessionlog.Ran("x", ok=False).ok is False and sessionlog.Unknown().why == ""


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_ran_with_ok_no_is_a_failed_reconcile_never_a_success(tmp_path: Path, runtime: str) -> None:
    deploy = Deploy()
    tools = _deploy(lambda key, arguments: sessionlog.Ran("deployed", ok="no"), deploy)
    _crashed(tmp_path / "s.jsonl", tools)
    _, reconciled, content = _resumed(tmp_path / "s.jsonl", tools, runtime)
    assert content == INTERRUPTED and len(deploy.runs) == 1
    (decided,) = reconciled
    assert decided.decision == "unknown" and decided.why == "reconcile raised TypeError"


def test_a_ran_whose_ok_was_forced_past_its_check_is_a_wrong_answer(tmp_path: Path) -> None:
    forced = sessionlog.Ran("deployed")
    object.__setattr__(forced, "ok", "no")
    tools = _deploy(lambda key, arguments: forced, Deploy())
    _crashed(tmp_path / "s.jsonl", tools)
    _, reconciled, content = _resumed(tmp_path / "s.jsonl", tools, "sync")
    assert content == INTERRUPTED and "Ran(ok=...) is a str, not True or False" in reconciled[0].why


# -- 2. the timeout holds for a coroutine reconcile function ----------------------------------------


def test_a_coroutine_that_swallows_its_cancellation_is_given_up_at_the_timeout(tmp_path: Path) -> None:
    """asyncio.wait_for waits for a cancelled coroutine to end: one that catches the
    cancellation and waits on would hold the resume as long; the resume returns without it."""
    deploy = Deploy()
    events: dict[str, asyncio.Event] = {}

    async def stubborn(key: str, arguments: dict[str, Any]) -> object:
        events["release"] = release = asyncio.Event()
        asyncio.get_running_loop().call_later(60, release.set)  # a bound, should the test fail
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await release.wait()
        return sessionlog.Ran("too late")

    tools = _deploy(stubborn, deploy, reconcile_timeout=0.2)
    _crashed(tmp_path / "s.jsonl", tools)

    async def main() -> tuple[bool, str, list[Any]]:
        store = await sessionlog.open_async(tmp_path / "s.jsonl", "jsonl-async")
        session = sessionlog.AsyncSession(store, tools=tools, model="m")
        assert await session.resume() is not None
        released = events["release"].is_set()
        content = (await session.state()).transcript[-1]["content"]
        await store.close()
        events["release"].set()  # let the stubborn coroutine end before the loop closes
        return released, content, session.reconciled

    released, content, reconciled = asyncio.run(main())
    assert not released  # the resume returned while the coroutine still waited
    assert content == INTERRUPTED and reconciled[0].why == "reconcile took longer than 0.2 s"


def test_a_cancelled_resume_cancels_the_coroutine_it_awaits(tmp_path: Path) -> None:
    """Giving up at the timeout leaves a coroutine behind; a cancelled resume must not."""
    tools: list[sessionlog.Tool] = []
    seen: dict[str, asyncio.Event] = {}

    async def waits(key: str, arguments: dict[str, Any]) -> object:
        seen["started"].set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen["cancelled"].set()
            raise
        return sessionlog.Ran("never")

    tools = _deploy(waits, Deploy(), reconcile_timeout=3600)
    _crashed(tmp_path / "s.jsonl", tools)

    async def main() -> list[Any]:
        seen.update(started=asyncio.Event(), cancelled=asyncio.Event())
        store = await sessionlog.open_async(tmp_path / "s.jsonl", "jsonl-async")
        session = sessionlog.AsyncSession(store, tools=tools, model="m")
        resume = asyncio.ensure_future(session.resume())
        await seen["started"].wait()
        resume.cancel()
        with pytest.raises(asyncio.CancelledError):
            await resume
        await asyncio.wait_for(seen["cancelled"].wait(), 60)  # a bound, should the test fail
        pending = (await session.state()).pending_tools
        await store.close()
        return pending

    assert len(asyncio.run(main())) == 1  # nothing decided, nothing written: the next resume asks


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_cancellation_raised_by_the_function_itself_is_a_failed_reconcile(
    tmp_path: Path, runtime: str
) -> None:
    """A coroutine that awaits an inner task which was cancelled raises `CancelledError` itself:
    that is the function's failure (settled as interrupted), not the agent's own cancellation
    (which propagates: `test_a_cancelled_resume_cancels_the_coroutine_it_awaits`) (#38 item 7)."""
    deploy = Deploy()

    async def cancelled_inside(key: str, arguments: dict[str, Any]) -> object:
        inner = asyncio.ensure_future(asyncio.sleep(3600))
        await asyncio.sleep(0)
        inner.cancel()
        await inner  # raises CancelledError into the function
        return sessionlog.DidNotRun()

    tools = _deploy(cancelled_inside, deploy)
    _crashed(tmp_path / "s.jsonl", tools)
    for _ in range(2):  # settled on the first resume: the second asks nothing
        progressed, reconciled, content = _resumed(tmp_path / "s.jsonl", tools, runtime)
        assert progressed and content == INTERRUPTED and len(deploy.runs) == 1
        if reconciled:
            assert reconciled[0].decision == "unknown" and "cancelled" in reconciled[0].why.lower()


def test_a_coroutine_that_blocks_the_loop_past_its_timeout_counts_as_unknown(tmp_path: Path) -> None:
    """A coroutine that blocks (time.sleep) cannot be interrupted: the loop is its until it
    returns. Its answer, later than the timeout, counts as unknown all the same."""
    deploy = Deploy()

    async def blocking(key: str, arguments: dict[str, Any]) -> object:
        time.sleep(0.5)  # blocks the loop: nothing can interrupt it
        return sessionlog.DidNotRun()

    tools = _deploy(blocking, deploy, reconcile_timeout=0.1)
    _crashed(tmp_path / "s.jsonl", tools)
    progressed, reconciled, content = _resumed(tmp_path / "s.jsonl", tools, "async")
    assert progressed and content == INTERRUPTED and len(deploy.runs) == 1
    assert reconciled[0].decision == "unknown"
    assert reconciled[0].why.startswith(
        "reconcile answered after its 0.1 s timeout (it blocked the event loop"
    )


def test_a_callable_returning_a_coroutine_is_timed_out_in_the_async_runtime(tmp_path: Path) -> None:
    """Not a coroutine function, but its call returns one: asked in its own thread and loop."""
    deploy = Deploy()

    release = threading.Event()

    class Status:
        async def __call__(self, key: str, arguments: dict[str, Any]) -> object:
            while not release.is_set():  # ends once released: no thread left behind by the test
                await asyncio.sleep(0.01)
            return sessionlog.Ran("too late")

    tools = _deploy(Status(), deploy, reconcile_timeout=0.2)
    _crashed(tmp_path / "s.jsonl", tools)
    try:
        _, reconciled, content = _resumed(tmp_path / "s.jsonl", tools, "async")
    finally:
        release.set()
    assert content == INTERRUPTED and reconciled[0].why == "reconcile took longer than 0.2 s"


def test_a_coroutine_function_in_the_sync_runtime_is_timed_out_too(tmp_path: Path) -> None:
    """The sync runtime runs a coroutine on its thread's own loop: the timeout holds."""
    release = threading.Event()

    async def waits(key: str, arguments: dict[str, Any]) -> object:
        while not release.is_set():  # ends once released: no thread left behind by the test
            await asyncio.sleep(0.01)
        return sessionlog.Ran("too late")

    deploy = Deploy()
    tools = _deploy(waits, deploy, reconcile_timeout=0.2)
    _crashed(tmp_path / "s.jsonl", tools)
    try:
        progressed, reconciled, content = _resumed(tmp_path / "s.jsonl", tools, "sync")
    finally:
        release.set()
    assert progressed and content == INTERRUPTED and reconciled[0].why == "reconcile took longer than 0.2 s"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_reconcile_function_that_raises_is_logged_by_its_class(
    tmp_path: Path, runtime: str, caplog: pytest.LogCaptureFixture
) -> None:
    raising = raiser(lambda: ConnectionError("https://user:hunter2@status.example/"), runtime == "async")
    tools = _deploy(raising, Deploy())
    _crashed(tmp_path / "s.jsonl", tools)
    with caplog.at_level(logging.WARNING, logger="sessionlog.reconcile"):
        progressed, reconciled, content = _resumed(tmp_path / "s.jsonl", tools, runtime)
    assert progressed and content == INTERRUPTED and reconciled[0].why == "reconcile raised ConnectionError"
    assert "reconcile raised ConnectionError" in caplog.text and "hunter2" not in caplog.text


class Fatal(BaseException):
    """What a careless counterpart client may raise: not an Exception, a secret in its text."""


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_reconcile_raising_a_base_exception_is_settled_and_its_text_never_shown(
    tmp_path: Path, runtime: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """Found by review: the sync thread let a BaseException reach threading.excepthook (its
    traceback and secret on stderr); the async runtime re-raised it on every resume (stuck)."""

    tools = _deploy(raiser(lambda: Fatal("token=sk_live_SECRET"), runtime == "async"), Deploy())
    _crashed(tmp_path / "s.jsonl", tools)
    progressed, reconciled, content = _resumed(tmp_path / "s.jsonl", tools, runtime)
    assert progressed and reconciled[0].why == "reconcile raised Fatal" and content == INTERRUPTED
    time.sleep(0.2)  # a thread's excepthook would have printed by now
    out, err = capfd.readouterr()
    assert "SECRET" not in out + err and "Traceback" not in err


def test_an_unknown_from_the_counterpart_is_no_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tools = _deploy(lambda key, arguments: sessionlog.Unknown("no record yet"), Deploy())
    _crashed(tmp_path / "s.jsonl", tools)
    with caplog.at_level(logging.WARNING, logger="sessionlog.reconcile"):
        _, reconciled, content = _resumed(tmp_path / "s.jsonl", tools, "sync")
    assert content == INTERRUPTED and reconciled[0].why == "no record yet" and caplog.records == []


# -- 4. a timed-out sync reconcile function keeps its daemon thread --------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_resume_returns_while_a_timed_out_function_still_runs(tmp_path: Path, runtime: str) -> None:
    release = threading.Event()
    finished = threading.Event()

    def hangs(key: str, arguments: dict[str, Any]) -> object:
        release.wait(60)  # a bound, should the test fail
        finished.set()
        return sessionlog.Ran("too late")

    deploy = Deploy()
    tools = _deploy(hangs, deploy, reconcile_timeout=0.2)
    key = _crashed(tmp_path / "s.jsonl", tools)
    try:
        progressed, reconciled, content = _resumed(tmp_path / "s.jsonl", tools, runtime)
        assert not finished.is_set()  # returned while the function still runs
        threads = [t for t in threading.enumerate() if t.name == f"sessionlog reconcile deploy {key}"]
        (thread,) = threads
        assert thread.daemon and thread.is_alive()  # never holds the interpreter's exit
        assert progressed and content == INTERRUPTED and len(deploy.runs) == 1
        assert reconciled[0].why == "reconcile took longer than 0.2 s"
    finally:
        release.set()
    thread.join(10)
    assert finished.is_set() and not thread.is_alive()  # its late answer was dropped


# -- 5. declarations that contradict each other are refused ---------------------------------------


def _named(tool: str, pattern: str) -> str:
    """A match for a declaration error: the tool as every such error shows it (whole up to 32
    characters; a secret pasted as a longer name must not leak, tests/test_hostile.py), then
    `pattern`."""
    return re.escape(f"tool {tool!r}: ") + pattern


def _effect(arguments: dict[str, Any], key: str) -> str:
    return ""


def _status(key: str, arguments: dict[str, Any]) -> object:
    return sessionlog.Unknown()


def test_idempotent_with_replay_never_is_refused() -> None:
    with pytest.raises(
        ValueError, match=_named("charge", r"idempotent=True is replay='safe'.*replay='never'")
    ):
        sessionlog.Tool("charge", _effect, idempotent=True, replay="never")
    assert sessionlog.Tool("charge", _effect, idempotent=True, replay="safe").replay == "safe"
    assert sessionlog.Tool("charge", _effect, idempotent=True).replay == "safe"
    assert sessionlog.Tool("bash", lambda arguments: "").replay == "never"


def test_a_replay_key_on_a_tool_that_is_never_replayed_is_refused() -> None:
    with pytest.raises(ValueError, match=_named("bash", r"replay_key .* never replayed")):
        sessionlog.Tool("bash", lambda arguments: "", replay_key="bash:v1")
    with pytest.raises(ValueError, match=_named("deploy", r"replay_key")):
        sessionlog.Tool("deploy", _effect, reconcile=_status, replay_key="deploy:v1")
    assert sessionlog.Tool("read", lambda arguments: "", replay="safe", replay_key="read:v1").key == "read:v1"


def test_an_empty_replay_key_is_refused_never_replaced_by_the_default() -> None:
    with pytest.raises(ValueError, match=_named("read", r"replay_key is a non-empty string or None")):
        sessionlog.Tool("read", lambda arguments: "", replay="safe", replay_key="")


def test_a_reconcile_timeout_without_reconcile_is_refused() -> None:
    with pytest.raises(ValueError, match=_named("bash", r"reconcile_timeout .* without reconcile")):
        sessionlog.Tool("bash", lambda arguments: "", reconcile_timeout=5)
    with pytest.raises(ValueError, match=_named("charge", r"reconcile_timeout")):
        sessionlog.Tool("charge", _effect, idempotent=True, reconcile_timeout=5)
    tool = sessionlog.Tool("deploy", _effect, reconcile=_status)
    assert tool.reconcile_timeout == sessionlog.tools.RECONCILE_TIMEOUT
    assert type(tool.reconcile_timeout) is float


@pytest.mark.parametrize(
    "timeout", [float("inf"), 1e300, float("nan"), -1.0], ids=["inf", "huge", "nan", "negative"]
)
def test_a_reconcile_timeout_no_wait_can_keep_is_refused(timeout: float) -> None:
    """`Event.wait(inf)` raises OverflowError: such a timeout would fail every resume."""
    with pytest.raises(ValueError, match=_named("deploy", r"reconcile_timeout is a number of seconds")):
        sessionlog.Tool("deploy", _effect, reconcile=_status, reconcile_timeout=timeout)
    longest = sessionlog.Tool("deploy", _effect, reconcile=_status, reconcile_timeout=threading.TIMEOUT_MAX)
    assert longest.reconcile_timeout == threading.TIMEOUT_MAX


def test_a_keyed_function_that_cannot_take_the_key_is_refused() -> None:
    with pytest.raises(TypeError, match=_named("charge", r"run cannot be called as run\(arguments, key\)")):
        sessionlog.Tool("charge", lambda arguments: "", idempotent=True)
    with pytest.raises(TypeError, match=_named("deploy", r"run cannot be called as run\(arguments, key\)")):
        sessionlog.Tool("deploy", lambda arguments: "", reconcile=_status)
    with pytest.raises(
        TypeError, match=_named("deploy", r"reconcile cannot be called as reconcile\(key, arguments\)")
    ):
        sessionlog.Tool("deploy", _effect, reconcile=lambda key: sessionlog.Unknown())
    sessionlog.Tool("deploy", lambda *args: "", reconcile=print)  # no signature or *args: accepted


def test_the_resolved_defaults_compare_as_plain_values() -> None:
    """The defaults that tell "not given" from given are resolved: a declaration compares
    equal to the same one spelled out."""
    implicit = sessionlog.Tool("bash", print)
    explicit = sessionlog.Tool("bash", print, replay="never")
    assert implicit == explicit and type(implicit.replay) is str and type(implicit.reconcile_timeout) is float


# -- 6. what a reconcile function needs, at top level ---------------------------------------------


def test_a_reconcile_function_needs_only_the_top_level() -> None:
    from sessionlog import DidNotRun, Ran, Reconciled, Unknown

    for name in ("Ran", "DidNotRun", "Unknown", "Reconciled"):
        assert name in sessionlog.__all__
    assert Ran is sessionlog.tools.Ran and DidNotRun is sessionlog.tools.DidNotRun
    assert Unknown is sessionlog.tools.Unknown and Reconciled is sessionlog.runtime_reconcile.Reconciled
