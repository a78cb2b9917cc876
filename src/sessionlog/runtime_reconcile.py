"""Reconciliation: asking a tool's counterpart whether a call that may have run did run.

After a crash, a pending intent of a `never` tool is settled as *interrupted* (contract rule 11):
its effect may have happened, so it is never run again. A tool declared with `reconcile=fn`
(`sessionlog.tools`) gets one question first: the runtime holds that `interrupted` synthetic
(`recover(..., hold=...)`, `reconcilable`) and asks `fn(key, arguments)` with the call's
idempotency key, for at most the tool's `reconcile_timeout` seconds:

* `Ran(output)`: the call ran; `output` is committed as the tool's result (`success`, or `error`
  with `ok=False`), its content ending with the line `RAN_NOTE`;
* `DidNotRun()`: the tool runs now, with the same key, and its result is committed, its content
  ending with `NOT_RUN_NOTE`;
* `Unknown(why)`, or `fn` raised or timed out: the intent is settled as interrupted, as without
  `reconcile` (the contract's fixed text: nothing is added to it).

Any other answer (None, a string, a dict, a `Ran` whose `ok` is not a bool, an answer whose
reading raises, a `DidNotRun` for a tool whose definition changed since the intent) is a failed
reconcile, handled as one: the call is settled as interrupted. Why not an error, or a blocked
run: the answer comes from the program's own function, asked again on every resume, so an
error would repeat on every resume and the session would be stuck for good, and a blocked
run would need a person for a bug that the contract already has a safe answer for (rule 11's
`interrupted`: the effect may have happened, the model is told so). What the runtime may not do
is guess from a wrong answer, so it takes none of it as `Ran` or `DidNotRun`; it says what was
wrong instead: each failure (a wrong answer, named by its type, never its value; an exception,
named by its class; a timeout) is logged as a warning on the `sessionlog.reconcile` logger
naming the tool, the call and the why, and every decision is kept on the session
(`Session.reconciled`, `Reconciled`: `decision` `unknown` and that `why`).

The timeout: a sync function is asked in a daemon thread named `sessionlog reconcile NAME KEY`;
the resume goes on at the timeout, the thread cannot be stopped and runs on until the function
returns (its answer is then dropped). A coroutine function is awaited on the async runtime's
loop and cancelled at the timeout, without waiting for the cancellation to be honoured (one
that ignores it stays on the loop, and `asyncio.run` waits for it at its exit; whatever it ends
with is dropped); a coroutine that blocks the loop (`time.sleep`) cannot be interrupted by
anything on that loop: the resume waits for it, and an answer later than the timeout counts as
unknown all the same. `KeyboardInterrupt` and `SystemExit` raised by `fn` stop the resume (in
either runtime, sync or coroutine function): nothing is settled, the next resume asks again.

Both notes are content text of an ordinary tool result, valid for every reducer;
`reconciliation(content)` reads them back (`sessionlog inspect` counts them). Where this departs
from rule 11: a pending intent of a `never` tool whose counterpart says `Ran` or `DidNotRun` is
not settled as interrupted (docs/idempotency.md).
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from .core.errors import type_named
from .core.state import SessionState
from .recovery import Plan, ToolStart
from .tools import DidNotRun, Ran, Tool, Tools, Unknown, tool_output, unrecordable

_log = logging.getLogger("sessionlog.reconcile")

NOTE = "[sessionlog: reconciled after a crash: "
RAN_NOTE = NOTE + "the call had run; this is the result its counterpart reported]"
NOT_RUN_NOTE = NOTE + "the call had not run; it ran now, with the same key]"
DECISIONS = ("ran", "notRun", "unknown")
Decision = Literal["ran", "notRun", "unknown"]


def reconcilable(tools: Tools) -> Any:
    """The `hold` for `recover`: the `interrupted` synthetic of one pending intent of a tool
    declared with `reconcile` (not of an aborted run: an abort settles every pending intent as
    interrupted, as the contract says)."""

    def hold(state: SessionState, plan: Plan) -> bool:
        return pending_of(state, plan, tools) is not None

    return hold


def pending_of(state: SessionState, plan: Mapping[str, Any], tools: Tools) -> ToolStart | None:
    """The pending intent a reconcilable plan would settle as interrupted, else None."""
    if plan["type"] != "appendSynthetic" or state.operation.get("abortRequested"):
        return None
    results = plan["results"]
    if len(results) != 1 or results[0].get("reason") != "interrupted" or "toolStartedId" not in results[0]:
        return None
    for tool in state.pending_tools:
        if tool["toolStartedId"] == results[0]["toolStartedId"]:
            declared = tools.get(tool["toolName"])
            if declared is None or declared.reconcile is None or tool["replay"] != "never":
                return None
            return ToolStart("replay", [], tool)
    return None


@dataclass(frozen=True)
class Reconciled:
    """What reconciliation decided for one pending call (`Session.reconciled`, in order):
    `decision` is `ran`, `notRun` or `unknown` (settled as interrupted); `why` is an `Unknown`'s
    reason, or what went wrong (the function raised, timed out, or answered something else),
    empty for `ran` and `notRun`."""

    tool_name: str
    index: int
    tool_call_id: str
    key: str
    decision: Decision
    why: str = ""


class _Failed(Unknown):
    """An unknown that is the reconcile function's failure, not its answer: it is logged."""


class _WrongAnswer(Exception):
    """An answer that decides nothing: a failed reconcile, settled as unknown and logged."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def decision(tool: Tool, start: ToolStart, answer: object) -> tuple[Reconciled, Ran | None]:
    """What an answer decides (`ran`, `notRun` or `unknown`), and for `ran` a plain copy of the
    `Ran` to commit. Anything else is a failed reconcile, settled as `unknown`: a wrong answer
    (its type named, never its value: an output may hold a secret), an answer whose reading
    raised (a `why` whose `__bool__` raises), a `DidNotRun` for a tool whose definition changed
    since the intent (never run under another definition than the one the model called);
    each is logged (see the module docstring)."""
    failed = type(answer) is _Failed
    try:
        decided, why, ran = _read(tool, start, answer)
    except _WrongAnswer as wrong:
        decided, why, ran, failed = "unknown", wrong.why, None, True
    except (KeyboardInterrupt, SystemExit):  # the process is asked to stop: never swallowed
        raise
    except BaseException as error:  # reading the answer ran its code: a failure of fn's, as any
        decided, why, ran = "unknown", f"reading reconcile's answer raised {type_named(error)}", None
        failed = True
    reconciled = Reconciled(
        tool.name, int(start.intent["toolIndex"]), str(start.intent["toolCallId"]), start.key, decided, why
    )
    if failed:  # a counterpart's own Unknown(why) is an answer, not a failure
        _warn(reconciled, f"{why}; settled as interrupted (the answers: sessionlog.Ran, DidNotRun, Unknown)")
    return reconciled, ran


def _read(tool: Tool, start: ToolStart, answer: object) -> tuple[Decision, str, Ran | None]:
    """`decision`'s reading of an answer, by its type (never `isinstance`, which believes an
    object's `__class__`), every value copied as a plain one."""
    kind = type(answer)
    if issubclass(kind, Ran):
        ran = cast(Ran, answer)
        if type(ran.ok) is not bool:  # forced past Ran's own check
            raise _WrongAnswer(f"Ran(ok=...) is a {type_named(ran.ok)}, not True or False")
        return "ran", "", Ran(ran.output, ran.ok)
    if issubclass(kind, DidNotRun):
        if start.intent["replayKey"] != tool.key:  # a never tool's key names its definition's digest
            raise _WrongAnswer(
                "DidNotRun, but the tool's definition changed since the call's intent: "
                "not run under another definition"
            )
        return "notRun", "", None
    if issubclass(kind, Unknown):
        why = cast(Unknown, answer).why
        if not issubclass(type(why), str):  # forced past Unknown's own check
            raise _WrongAnswer(f"Unknown(why) holds a value of type {type_named(why)}, not a string")
        return "unknown", str.__str__(why), None
    raise _WrongAnswer(
        f"reconcile returned a {type_named(answer)}, not Ran(output), DidNotRun() or Unknown(why)"
    )


def _warn(reconciled: Reconciled, what: str) -> None:
    _log.warning(
        "tool %r, call %d (id %r): %s",
        reconciled.tool_name,
        reconciled.index,
        reconciled.tool_call_id,
        what,
    )


def ran_output(tool: Tool, reconciled: Reconciled, ran: Ran) -> tuple[str, bool]:
    """What a `Ran` answer commits: its output as result text (to be `noted` with `ran`); an
    output that is no JSON value is an error result, logged."""
    what = unrecordable(ran.output)
    if what is not None:
        _warn(reconciled, f"Ran's output is {what}: committed as an error result")
    text, ok = tool_output(tool.name, ran.output)
    return text, ok and ran.ok


def noted(text: str, decided: str | None) -> str:
    """A reconciled result's content: the tool's text, then the note saying what was decided
    (`ran`, `notRun`); `text` itself when nothing was (`None`)."""
    if decided is None:
        return text
    return f"{text}\n{RAN_NOTE if decided == 'ran' else NOT_RUN_NOTE}"


def reconciliation(content: object) -> str | None:
    """`ran` or `notRun` when a tool result's content ends with a reconciliation note, else None."""
    if not isinstance(content, str):
        return None
    last = content.rpartition("\n")[2]
    return "ran" if last == RAN_NOTE else "notRun" if last == NOT_RUN_NOTE else None


# -- asking, with a deadline ---------------------------------------------------------------------


def _timed_out(tool: Tool) -> _Failed:
    return _Failed(f"reconcile took longer than {tool.reconcile_timeout:g} s")


def _raised(error: BaseException) -> _Failed:
    return _Failed(f"reconcile raised {type_named(error)}")


class _Asked:
    """One question to a reconcile function, asked in a daemon thread (a function that hangs
    keeps its thread, never the agent: after the timeout the answer is taken as unknown)."""

    def __init__(self, tool: Tool, start: ToolStart) -> None:
        self.answer: object = _Failed("no answer")
        self.stop: KeyboardInterrupt | SystemExit | None = None
        self.done = threading.Event()
        self.tool = tool
        self.start = start

    def ask(self) -> None:
        try:
            reconcile = self.tool.reconcile
            assert reconcile is not None
            answer = reconcile(self.start.key, self.start.arguments)
            if inspect.isawaitable(answer):
                import asyncio  # only for a coroutine answer: `import sessionlog` loads no asyncio

                answer = asyncio.run(_awaited(answer))
            self.answer = answer
        except (KeyboardInterrupt, SystemExit) as stop:  # the process is asked to stop: `ask`
            self.stop = stop  # raises it in the resuming thread
        except BaseException as error:  # any other failure of fn, even no Exception: unknown,
            self.answer = _raised(error)  # as the contract settles it (never to the excepthook,
        finally:  # which would print its text: a secret of the call's, maybe)
            self.done.set()


async def _awaited(answer: Any) -> Any:
    return await answer


class _Question:
    """A coroutine function's question, as a task runs it: its answer, or its failure as a
    failed-reconcile answer, never the task's exception, which asyncio reports with its text (a
    secret of the call's, maybe) when nobody retrieves it, as at `asyncio.run`'s shutdown for a
    given-up question. A cancellation passes, and a stop (KeyboardInterrupt, SystemExit) too
    unless the question was given up (`given_up`: nobody waits for it, so it is dropped)."""

    def __init__(self, reconcile: Any, start: ToolStart) -> None:
        self.reconcile = reconcile
        self.start = start
        self.given_up = False

    async def asked(self) -> Any:
        import asyncio  # loaded already: this runs on its loop

        try:
            return await self.reconcile(self.start.key, self.start.arguments)
        except asyncio.CancelledError:
            raise
        except (KeyboardInterrupt, SystemExit) as stop:
            if self.given_up:
                return _raised(stop)
            raise
        except BaseException as error:
            return _raised(error)


def thread_name(tool: Tool, start: ToolStart) -> str:
    """The name of the daemon thread a sync reconcile function is asked in."""
    return f"sessionlog reconcile {tool.name} {start.key}"


def ask(tool: Tool, start: ToolStart) -> object:
    """The answer of `tool.reconcile(key, arguments)`, or `Unknown` when it raised or took
    longer than `tool.reconcile_timeout` seconds (its daemon thread then runs on, unwaited)."""
    asked = _Asked(tool, start)
    threading.Thread(target=asked.ask, name=thread_name(tool, start), daemon=True).start()
    if not asked.done.wait(tool.reconcile_timeout):
        return _timed_out(tool)
    if asked.stop is not None:  # the process is asked to stop: never swallowed
        raise asked.stop
    return asked.answer


async def ask_async(tool: Tool, start: ToolStart) -> object:
    """`ask` for the async runtime: a coroutine function is awaited on the loop, given up at the
    timeout (cancelled, never waited for: `asyncio.wait_for` would wait for a coroutine that
    ignores its cancellation); any other function is asked in a daemon thread (`ask`: a
    coroutine it returns runs on that thread's own loop)."""
    import asyncio  # loaded already: this runs on its loop

    reconcile = tool.reconcile
    assert reconcile is not None
    if not inspect.iscoroutinefunction(reconcile):
        return await asyncio.to_thread(ask, tool, start)
    began = time.monotonic()
    question = _Question(reconcile, start)
    task = asyncio.ensure_future(question.asked())
    try:
        done, _ = await asyncio.wait({task}, timeout=tool.reconcile_timeout)
    except BaseException:  # the resume itself was cancelled: so is the question
        question.given_up = True
        task.cancel()
        raise
    if not done:
        question.given_up = True
        task.cancel()  # whatever it ends with is dropped (`_Question`)
        return _timed_out(tool)
    if task.cancelled():
        return _Failed("reconcile was cancelled")
    if time.monotonic() - began > tool.reconcile_timeout:  # answered, but blocked the loop to do so
        return _Failed(
            f"reconcile answered after its {tool.reconcile_timeout:g} s timeout (it blocked the event loop: "
            "a coroutine that blocks cannot be interrupted)"
        )
    return task.result()
