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

Any other answer is a `ReconcileAnswerError` naming the tool and the call (nothing is written:
the intent stays pending). Both notes are content text of an ordinary tool result, valid for
every reducer; `reconciliation(content)` reads them back (`sessionlog inspect` counts them).
Where this departs from rule 11: a pending intent of a `never` tool whose counterpart says
`Ran` or `DidNotRun` is not settled as interrupted (docs/idempotency.md).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Mapping
from typing import Any

from .core.state import SessionState
from .recovery import Plan, ToolStart
from .runtime_errors import ReconcileAnswerError
from .tools import DidNotRun, Ran, Tool, Tools, Unknown, tool_output

NOTE = "[sessionlog: reconciled after a crash: "
RAN_NOTE = NOTE + "the call had run; this is the result its counterpart reported]"
NOT_RUN_NOTE = NOTE + "the call had not run; it ran now, with the same key]"
DECISIONS = ("ran", "notRun", "unknown")


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


def decision(tool: Tool, start: ToolStart, answer: object) -> str:
    """`ran`, `notRun` or `unknown` for an answer; ReconcileAnswerError for anything else (its
    type is named, never its value: an output may hold a secret)."""
    if isinstance(answer, Ran):
        return "ran"
    if isinstance(answer, DidNotRun):
        return "notRun"
    if isinstance(answer, Unknown):
        return "unknown"
    raise ReconcileAnswerError(tool.name, int(start.intent["toolIndex"]), start.intent["toolCallId"], answer)


def ran_output(tool: Tool, answer: Ran) -> tuple[str, bool]:
    """What a `Ran` answer commits: its output as result text, with `RAN_NOTE`."""
    text, ok = tool_output(tool.name, answer.output)
    return noted(text, "ran"), ok and bool(answer.ok)


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


class _Asked:
    """One question to a reconcile function, asked in a daemon thread (a function that hangs
    keeps its thread, never the agent: after the timeout the answer is taken as unknown)."""

    def __init__(self, tool: Tool, start: ToolStart) -> None:
        self.answer: object = Unknown("no answer")
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
        except Exception as error:  # a failure of fn: unknown, as the contract settles it
            self.answer = Unknown(f"reconcile raised {type(error).__name__}")
        finally:
            self.done.set()


async def _awaited(answer: Any) -> Any:
    return await answer


def ask(tool: Tool, start: ToolStart) -> object:
    """The answer of `tool.reconcile(key, arguments)`, or `Unknown` when it raised or took
    longer than `tool.reconcile_timeout` seconds."""
    asked = _Asked(tool, start)
    threading.Thread(target=asked.ask, name=f"reconcile {tool.name}", daemon=True).start()
    if not asked.done.wait(tool.reconcile_timeout):
        return Unknown(f"reconcile took longer than {tool.reconcile_timeout} s")
    return asked.answer


async def ask_async(tool: Tool, start: ToolStart) -> object:
    """`ask` for the async runtime: a coroutine function is awaited on the loop (cancelled at
    the timeout), a plain function asked in a daemon thread."""
    import asyncio  # loaded already: this runs on its loop

    reconcile = tool.reconcile
    assert reconcile is not None
    if not inspect.iscoroutinefunction(reconcile):
        return await asyncio.to_thread(ask, tool, start)
    try:
        return await asyncio.wait_for(reconcile(start.key, start.arguments), tool.reconcile_timeout)
    except TimeoutError:
        return Unknown(f"reconcile took longer than {tool.reconcile_timeout} s")
    except Exception as error:
        return Unknown(f"reconcile raised {type(error).__name__}")
