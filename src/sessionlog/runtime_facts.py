"""What the sync and async runtimes share: a model answer, a step's tool calls and a call's
intent, from the state to the facts to commit (`runtime`, `runtime_async`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from .core import facts as build
from .core.commit import first_non_json
from .core.state import SessionState
from .recovery import ToolStart, new_intent
from .runtime_errors import InvalidAnswerError, RuntimeStateError
from .tools import Tool, Tools

Fact = dict[str, Any]
ToolCallInput = Mapping[str, Any]
"""A tool call as a model returns it: `{"id", "name", "arguments"}` (arguments a JSON object or
its text), or already in the contract's form `{"id", "type": "function", "function": {...}}`."""


def declarations(tools: Tools | Iterable[Tool]) -> Tools:
    return tools if isinstance(tools, Tools) else Tools(tools)


def contract_calls(tool_calls: Sequence[ToolCallInput]) -> list[dict[str, Any]]:
    """Tool calls in the contract's form, in the model's order."""
    calls = []
    if isinstance(tool_calls, str | bytes) or not isinstance(tool_calls, Sequence):
        raise TypeError(f"tool_calls is a sequence of calls, not {type(tool_calls).__name__}")
    for position, call in enumerate(tool_calls):
        if not isinstance(call, Mapping):
            raise TypeError(f"tool_calls[{position}] is a mapping, not {type(call).__name__}")
        found = first_non_json(dict(call))
        if found is not None:
            path, what = found
            raise InvalidAnswerError(f"tool_calls[{position}]{'.' if path[:1] != '[' else ''}{path}", what)
        surrogate = first_surrogate(call)
        if surrogate is not None:
            raise InvalidAnswerError(f"tool_calls[{position}]{surrogate}", "text not encodable as UTF-8")
        if "function" in call:
            calls.append(dict(call))
            continue
        for key in ("id", "name"):
            if key not in call:
                where = f"tool_calls[{position}].{key}"
                raise InvalidAnswerError(
                    where, "missing", message=f"{where} is missing: a tool call has an id and a name"
                )
        arguments = call.get("arguments", {})
        text = arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
        calls.append(build.tool_call(call["id"], call["name"], text))
    return calls


def first_surrogate(value: Any, path: str = "") -> str | None:
    """The path (`.arguments.path`, `[2]`) of the first text in a JSON value that holds a lone
    surrogate (not encodable as UTF-8), key or value; None when there is none."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or ""
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            where = f"{path}.{key}" if isinstance(key, str) and key.isidentifier() else f"{path}[{key!r}]"
            if isinstance(key, str) and first_surrogate(key) is not None:
                return where
            found = first_surrogate(item, where)
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = first_surrogate(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


def settle_facts(
    state: SessionState,
    attempt: Mapping[str, Any],
    content: str | None,
    tool_calls: Sequence[ToolCallInput],
    usage: Mapping[str, int] | None,
    stop_reason: str | None,
) -> list[Fact]:
    """The model's answer and its usage: one transaction."""
    if content is not None and not isinstance(content, str):
        raise TypeError(f"content is text or None, not {type(content).__name__}")
    if content is not None and first_surrogate(content) is not None:
        raise InvalidAnswerError("content", "text not encodable as UTF-8")
    entry = build.assistant_message(
        attempt["stepId"],
        attempt["attemptId"],
        content,
        tool_calls=contract_calls(tool_calls),
        stop_reason=stop_reason,
    )
    facts = [entry]
    if usage is not None:
        facts.append(build.usage(attempt["operationId"], usage, attempt_id=attempt["attemptId"]))
    return facts


INTENTS = ("tool", "step")
"""When intents are committed: `tool` (default) each right before its tool runs; `step` all of a
step in one transaction before the first tool runs (a kill during one tool then leaves the
later, never-started ones pending: `never` tools among them are settled as interrupted)."""


def tool_facts(
    state: SessionState, tools: Tools, current: Mapping[str, Any], *, intents: str = "tool"
) -> tuple[list[Fact], list[ToolStart]]:
    """Every call of the settled step that has no outcome yet, in the model's order: a
    pre-execution synthetic result for an unknown tool or arguments that are not a JSON object
    (in the facts), the intent of each one that can run (in the facts too with `intents="step"`:
    one transaction, no tool runs before all are durable; else each is committed by `begin`)."""
    if state.settled_entry_id is None or state.step is None:
        raise RuntimeStateError("no settled model answer to start tools for")
    facts: list[Fact] = []
    starts: list[ToolStart] = []
    declared = {tool["name"]: tool for tool in current["tools"]}
    for index, call in enumerate(state.settled_calls):
        if state.has_outcome(index):
            continue
        name = call["function"]["name"]
        arguments = _object(call["function"]["arguments"])
        reason = "unknownTool" if name not in tools or name not in declared else None
        if reason is None and arguments is None:
            reason = "invalidArguments"
        if reason is not None:
            facts.append(
                build.pre_execution_result(state.step["stepId"], state.settled_entry_id, index, call, reason)
            )
            continue
        start = new_intent(state, index, call, arguments or {}, declared[name], current)
        if intents == "step":
            facts.extend(start.facts)
        starts.append(start)
    return facts, starts


def begin_facts(state: SessionState, start: ToolStart) -> list[Fact]:
    """The intent of one call, to commit right before its tool runs: refused (nothing written)
    while an earlier call of its step has no result, so that tools run in the model's order."""
    index = int(start.intent["toolIndex"])
    if state.settled_entry_id != start.intent["assistantEntryId"]:
        raise RuntimeStateError(f"call {index} is not of the step the run is at")
    if state.has_outcome(index):
        raise RuntimeStateError(f"call {index} was started or settled already (one outcome per call)")
    pending = {tool["toolIndex"] for tool in state.pending_tools}
    for earlier in range(index):
        if not state.has_outcome(earlier) or earlier in pending:
            raise RuntimeStateError(
                f"call {earlier} has no result yet: tools run in the model's order (run it first)"
            )
    return start.facts


def _object(text: Any) -> dict[str, Any] | None:
    try:
        value = orjson.loads(text)
    except (orjson.JSONDecodeError, TypeError):
        return None
    return value if type(value) is dict else None


def has_result(state: SessionState, start: ToolStart) -> bool:
    """Whether the log holds an outcome for the call `start` is of: its intent has its result,
    or the call was settled without one (a synthetic result), or its run or step is over."""
    for tool in state.tool_calls:
        if tool["toolStartedId"] == start.tool_started_id:
            return bool(tool["status"] != "pending")
    if state.settled_entry_id != start.intent.get("assistantEntryId"):
        return True  # the step (or the run) it was of is over
    return state.has_outcome(int(start.intent["toolIndex"]))


def oversized(error: BaseException) -> bool:
    """Whether a refused commit was refused for a line above the store's `max_line_bytes`."""
    return getattr(error, "code", None) == "MALFORMED_JSON" and "above the maximum" in str(
        getattr(error, "detail", "")
    )


def oversized_text(output: str, error: BaseException) -> str:
    """The one rule for an output above the store's line limit (docs/agent-loop.md): its result
    is an error result giving the output's size and the limit; the output is not recorded."""
    size = len(output.encode("utf-8", "backslashreplace"))
    return (
        f"Error: [sessionlog: the tool's output was {size} bytes, too long for this store "
        f"({getattr(error, 'detail', error)}); not recorded]"
    )


def check_prompt(prompt: object) -> None:
    if not isinstance(prompt, str):
        raise TypeError(f"prompt is text, not {type(prompt).__name__}")
