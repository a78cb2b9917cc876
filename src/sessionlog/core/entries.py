"""The reducer's rules for entry facts (contract sections 3-5 and 7): user, assistant and tool
messages, pre-execution synthetic results, compaction entries. Each function takes the live
`ReducerState` and mutates it, journalling while a commit is validated."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from .canonical import MAX_SAFE_INTEGER
from .errors import shown
from .model import Entry
from .shapes import (
    ASSISTANT_ENTRY,
    ASSISTANT_MESSAGE,
    COMPACTION_ENTRY,
    COMPACTION_RESULT,
    ENTRY_FACT,
    FUNCTION,
    PRE_EXECUTION_ENTRY,
    PRE_EXECUTION_REASONS,
    RESULT,
    RETAINED,
    STARTED_RESULT_ENTRY,
    SYNTHETIC_CONTENT,
    TOOL_CALL,
    TOOL_MESSAGE,
    TOOL_RESULT,
    USER_ENTRY,
    USER_MESSAGE,
    UUID7,
    fail,
)

if TYPE_CHECKING:
    from .reducer_state import ReducerState


def message_shape(reducer: ReducerState, value: Any, line: int, seq: int) -> Any:
    """Validate a message and return it as it is: its key set is then exactly the contract's
    (no unknown keys, every required one present), so it equals the normal form."""
    if type(value) is not dict:
        raise fail("INVALID_FACT", line, seq, "message is not an object")
    role = value.get("role")
    content = value.get("content")
    if role == "user":
        if not USER_MESSAGE.issuperset(value):
            reducer.check_keys(value, USER_MESSAGE, "user message", line, seq)
        if type(content) is not str or not content:
            raise fail("INVALID_FACT", line, seq, "user content is not a non-empty string")
        return value
    if role == "tool":
        if not TOOL_MESSAGE.issuperset(value):
            reducer.check_keys(value, TOOL_MESSAGE, "tool message", line, seq)
        if type(content) is not str:
            raise fail("INVALID_FACT", line, seq, "tool content is not a string")
        call_id = value.get("tool_call_id")
        if type(call_id) is not str or not call_id:
            raise fail("INVALID_FACT", line, seq, "tool_call_id is not a non-empty string")
        return value
    if role != "assistant":
        raise fail("INVALID_FACT", line, seq, f"message role {shown(role)} is not user, assistant or tool")
    if not ASSISTANT_MESSAGE.issuperset(value):
        reducer.check_keys(value, ASSISTANT_MESSAGE, "assistant message", line, seq)
    if content is not None and type(content) is not str:
        raise fail("INVALID_FACT", line, seq, "assistant content is not a string or null")
    if "content" not in value:  # the ports read a missing content as null
        value = {"role": role, "content": None, **value}
    if "tool_calls" not in value:
        return value
    raw_calls = value["tool_calls"]
    if type(raw_calls) is not list or not raw_calls:
        raise fail("INVALID_FACT", line, seq, "tool_calls is not a non-empty array")
    ids = set()
    for raw in raw_calls:
        if type(raw) is not dict:
            raise fail("INVALID_FACT", line, seq, "a tool call is not an object")
        if not TOOL_CALL.issuperset(raw):
            reducer.check_keys(raw, TOOL_CALL, "tool call", line, seq)
        if raw.get("type") != "function":
            raise fail("INVALID_FACT", line, seq, 'tool call type is not "function"')
        function = raw.get("function")
        if type(function) is not dict:
            raise fail("INVALID_FACT", line, seq, "tool call function is not an object")
        if not FUNCTION.issuperset(function):
            reducer.check_keys(function, FUNCTION, "tool call function", line, seq)
        arguments = function.get("arguments")
        if type(arguments) is not str:
            raise fail("INVALID_FACT", line, seq, "tool call arguments is not a string")
        call_id = raw.get("id")
        name = function.get("name")
        if type(call_id) is not str or not call_id or type(name) is not str or not name:
            raise fail("INVALID_FACT", line, seq, "tool call id or name is not a non-empty string")
        ids.add(call_id)
    if len(ids) != len(raw_calls):
        raise fail("INVALID_TRANSCRIPT", line, seq, "two tool calls of one message share an id")
    return value


def apply_entry(reducer: ReducerState, fact: dict[str, Any], fact_id: str, line: int, seq: int) -> None:
    if not ENTRY_FACT.issuperset(fact):
        reducer.check_keys(fact, ENTRY_FACT, "entry fact", line, seq)
    entry = fact.get("entry")
    if type(entry) is not dict:
        raise fail("INVALID_FACT", line, seq, "entry is not an object")
    entry_type = entry.get("type")
    if entry_type == "message":
        apply_message(reducer, entry, fact_id, line, seq)
    elif entry_type == "compaction":
        apply_compaction(reducer, entry, fact_id, line, seq)
    else:
        raise fail("INVALID_FACT", line, seq, f"entry type {shown(entry_type)} is not message or compaction")


def apply_message(reducer: ReducerState, entry: dict[str, Any], fact_id: str, line: int, seq: int) -> None:
    message = message_shape(reducer, entry.get("message"), line, seq)
    role = message["role"]
    order = len(reducer.entries)
    through = len(reducer.message_ids) + 1
    if role == "user":
        if fact_id in reducer.reserved:
            raise fail("DUPLICATE_ID", line, seq, f"user entry id {fact_id} is reserved")
        if not USER_ENTRY.issuperset(entry):
            reducer.check_keys(entry, USER_ENTRY, "user entry", line, seq)
        info = Entry("message", message, order, through)
    elif role == "assistant":
        info = settle_attempt(reducer, entry, message, fact_id, line, seq)
    else:
        info = tool_result(reducer, entry, message, fact_id, line, seq)
    reducer.transcript.append(message)
    reducer.active_context.append(message)
    reducer.boundary = fact_id
    reducer.message_ids.append(fact_id)
    reducer.entries[fact_id] = info
    if reducer.undo is not None:
        reducer.undo.append(functools.partial(reducer.entries.pop, fact_id))


def settle_attempt(
    reducer: ReducerState, entry: dict[str, Any], message: dict[str, Any], fact_id: str, line: int, seq: int
) -> Entry:
    if fact_id in reducer.reserved:
        raise fail("DUPLICATE_ID", line, seq, f"assistant entry id {fact_id} is reserved")
    if not ASSISTANT_ENTRY.issuperset(entry):
        reducer.check_keys(entry, ASSISTANT_ENTRY, "assistant entry", line, seq)
    step_id = entry.get("stepId")
    attempt_id = entry.get("attemptId")
    attempt = reducer.attempts.get(attempt_id) if type(attempt_id) is str else None
    if attempt is None or attempt.step_id != step_id:  # a hit proves both are valid ids
        if type(step_id) is not str or UUID7(step_id) is None:
            raise fail("INVALID_FACT", line, seq, "stepId is not a UUIDv7")
        if type(attempt_id) is not str or UUID7(attempt_id) is None:
            raise fail("INVALID_FACT", line, seq, "attemptId is not a UUIDv7")
    stop = entry.get("stopReason")
    if stop not in ("stop", "toolUse", "length"):
        raise fail("INVALID_FACT", line, seq, f"stopReason {shown(stop)} is not stop, toolUse or length")
    if attempt is None or attempt.step_id != step_id or attempt.closed or attempt.kind != "assistant":
        raise fail(
            "INVALID_REFERENCE",
            line,
            seq,
            f"attempt {attempt_id} is not an open assistant attempt of step {step_id}",
        )
    current = reducer.current
    if current is None or current.kind != "run" or current.id != attempt.operation_id:
        raise fail("INVALID_TRANSITION", line, seq, "the attempt's run is not the current operation")
    if stop == "toolUse" and "tool_calls" not in message:
        raise fail("INVALID_TRANSCRIPT", line, seq, "stopReason toolUse without tool calls")
    if stop == "stop" and "tool_calls" in message:
        raise fail("INVALID_TRANSCRIPT", line, seq, "stopReason stop with tool calls")
    if reducer.undo is not None:
        reducer.remember(attempt, "closed", "settled_id", "stop_reason")
    attempt.closed = True
    attempt.settled_id = fact_id
    attempt.stop_reason = stop
    return Entry(
        "message",
        message,
        len(reducer.entries),
        len(reducer.message_ids) + 1,
        attempt.operation_id,
        step_id,
        attempt_id,
        stop,
    )


def tool_result(
    reducer: ReducerState, entry: dict[str, Any], message: dict[str, Any], fact_id: str, line: int, seq: int
) -> Entry:
    pre_execution = "assistantEntryId" in entry or "toolIndex" in entry
    if pre_execution:
        if not PRE_EXECUTION_ENTRY.issuperset(entry):
            reducer.check_keys(entry, PRE_EXECUTION_ENTRY, "pre-execution result entry", line, seq)
    else:
        if not STARTED_RESULT_ENTRY.issuperset(entry):
            reducer.check_keys(entry, STARTED_RESULT_ENTRY, "tool result entry", line, seq)
    step_id = entry.get("stepId")
    started_id = entry.get("toolStartedId")
    started = None if pre_execution or type(started_id) is not str else reducer.tools.get(started_id)
    if (started is None or started["stepId"] != step_id) and (
        type(step_id) is not str or UUID7(step_id) is None
    ):
        raise fail("INVALID_FACT", line, seq, "stepId is not a UUIDv7")
    result = entry.get("result")
    if type(result) is not dict:
        raise fail("INVALID_FACT", line, seq, "result is not an object")
    if not RESULT.issuperset(result):
        reducer.check_keys(result, RESULT, "result", line, seq)
    tool_name = entry.get("toolName")
    if type(tool_name) is not str or not tool_name:
        raise fail("INVALID_FACT", line, seq, "toolName is not a non-empty string")
    order = len(reducer.entries)
    through = len(reducer.message_ids) + 1
    if pre_execution:
        reason = result.get("reason")
        if (
            result.get("type") != "synthetic"
            or type(reason) is not str
            or reason not in PRE_EXECUTION_REASONS
        ):
            raise fail("INVALID_FACT", line, seq, "result is not a pre-execution synthetic result")
        assistant_id = entry.get("assistantEntryId")
        if type(assistant_id) is not str or UUID7(assistant_id) is None:
            raise fail("INVALID_FACT", line, seq, "assistantEntryId is not a UUIDv7")
        index = entry.get("toolIndex")
        if type(index) is not int or not 0 <= index <= MAX_SAFE_INTEGER:
            raise fail("INVALID_FACT", line, seq, "toolIndex is not a safe integer")
        assistant = reducer.entries.get(assistant_id)
        current = reducer.current
        if (
            assistant is None
            or assistant.kind != "message"
            or assistant.step_id != step_id
            or current is None
            or current.kind != "run"
            or assistant.operation_id != current.id
        ):
            raise fail(
                "INVALID_REFERENCE",
                line,
                seq,
                f"{assistant_id} is not an assistant entry of step {step_id} in the current run",
            )
        call_at(reducer, assistant, index, message["tool_call_id"], tool_name, line, seq)
        pair = (assistant_id, index)
        if pair in reducer.outcomes:
            raise fail("INVALID_TRANSITION", line, seq, f"tool call {index} already has an outcome")
        if message["content"] != SYNTHETIC_CONTENT[reason]:
            raise fail("INVALID_TRANSCRIPT", line, seq, f"content is not the fixed {reason} text")
        reducer.outcomes.add(pair)
        if reducer.undo is not None:
            reducer.undo.append(functools.partial(reducer.outcomes.discard, pair))
        return Entry("message", message, order, through, assistant.operation_id, step_id)
    if reducer.reserved.get(fact_id) != TOOL_RESULT:
        raise fail("INVALID_REFERENCE", line, seq, f"{fact_id} is not a reserved tool-result id")
    result_type = result.get("type")
    if result_type not in ("success", "error", "synthetic"):
        raise fail(
            "INVALID_FACT",
            line,
            seq,
            f"result type {shown(result_type)} is not success, error or synthetic",
        )
    if result_type == "synthetic":
        if result.get("reason") != "interrupted":
            raise fail("INVALID_FACT", line, seq, "a started tool's synthetic result is not interrupted")
        if message["content"] != SYNTHETIC_CONTENT["interrupted"]:
            raise fail("INVALID_TRANSCRIPT", line, seq, "content is not the fixed interrupted text")
    elif "reason" in result:
        raise fail("INVALID_FACT", line, seq, f"a {result_type} result has a reason")
    if started is None and (type(started_id) is not str or UUID7(started_id) is None):
        raise fail("INVALID_FACT", line, seq, "toolStartedId is not a UUIDv7")
    if (
        started is None
        or started["stepId"] != step_id
        or started["resultEntryId"] != fact_id
        or started["toolCallId"] != message["tool_call_id"]
        or started["toolName"] != tool_name
        or started["status"] != "pending"
    ):
        raise fail(
            "INVALID_REFERENCE", line, seq, f"{started_id} is not a pending tool intent for this result"
        )
    started["status"] = "completed"
    owner = reducer.operations[started["operationId"]]
    if reducer.undo is not None:
        reducer.undo.append(functools.partial(started.__setitem__, "status", "pending"))
        reducer.remember(owner, "pending")
    owner.pending -= 1
    reducer.unreserve(fact_id)
    return Entry("message", message, order, through, started["operationId"], started["stepId"])


def call_at(
    reducer: ReducerState, assistant: Entry, index: int, call_id: Any, name: Any, line: int, seq: int
) -> None:
    calls = assistant.message.get("tool_calls", ()) if assistant.message else ()
    call = calls[index] if index < len(calls) else None
    if call is None or call["id"] != call_id or call["function"]["name"] != name:
        raise fail(
            "INVALID_REFERENCE",
            line,
            seq,
            f"tool call {index} of the assistant entry is not {shown(call_id)} calling {shown(name)}",
        )


def apply_compaction(reducer: ReducerState, entry: dict[str, Any], fact_id: str, line: int, seq: int) -> None:
    if reducer.reserved.get(fact_id) != COMPACTION_RESULT:
        raise fail("INVALID_REFERENCE", line, seq, f"{fact_id} is not a reserved compaction result id")
    if not COMPACTION_ENTRY.issuperset(entry):
        reducer.check_keys(entry, COMPACTION_ENTRY, "compaction entry", line, seq)
    found = reducer.running(entry.get("operationId"), "operationId", line, seq)
    current = reducer.current
    if found.kind != "compaction" or current is not found:
        raise fail("INVALID_TRANSITION", line, seq, "operationId is not the current compaction")
    if found.result_id != fact_id:
        raise fail("INVALID_REFERENCE", line, seq, "the compaction reserved another result id")
    through_id = entry.get("compactedThroughEntryId")
    if type(through_id) is not str or UUID7(through_id) is None:
        raise fail("INVALID_FACT", line, seq, "compactedThroughEntryId is not a UUIDv7")
    through = reducer.entries.get(through_id)
    if through is None:
        raise fail("INVALID_REFERENCE", line, seq, f"compactedThroughEntryId {through_id} is not an entry")
    summary = entry.get("summary")
    tail = entry.get("retainedTail")
    if type(summary) is not str or type(tail) is not list:
        raise fail("INVALID_FACT", line, seq, "summary is not a string or retainedTail not an array")
    source = reducer.entries[found.input_id]
    if source.order < through.order:
        raise fail("INVALID_REFERENCE", line, seq, "compactedThroughEntryId is after the input boundary")
    first = through.messages_through
    expected = source.messages_through - first
    retained = []
    for index, raw in enumerate(tail):
        item = raw
        if type(item) is not dict:
            raise fail("INVALID_FACT", line, seq, "a retained message is not an object")
        if not RETAINED.issuperset(item):
            reducer.check_keys(item, RETAINED, "retained message", line, seq)
        source_id = item.get("sourceEntryId")
        if type(source_id) is not str or UUID7(source_id) is None:
            raise fail("INVALID_FACT", line, seq, "sourceEntryId is not a UUIDv7")
        message = message_shape(reducer, item.get("message"), line, seq)
        kept = reducer.entries.get(source_id)
        if (
            index >= expected
            or source_id != reducer.message_ids[first + index]
            or kept is None
            or kept.message != message
        ):
            raise fail(
                "INVALID_REFERENCE",
                line,
                seq,
                f"retainedTail[{index}] is not the message entry after the compacted part",
            )
        retained.append(message)
    if len(tail) != expected:
        raise fail(
            "INVALID_REFERENCE",
            line,
            seq,
            f"retainedTail holds {len(tail)} messages, the input boundary needs {expected}",
        )
    check_messages(retained, line, seq)
    attempt = found.step
    if attempt is None or attempt.closed or attempt.kind != "compaction":
        raise fail("INVALID_TRANSITION", line, seq, "the compaction has no open compaction attempt")
    reducer.active_context = [{"role": "user", "content": "[Compacted history]\n" + summary}, *retained]
    reducer.boundary = found.input_id
    if reducer.undo is not None:
        reducer.remember(attempt, "closed", "settled_id")
    attempt.closed = True
    attempt.settled_id = fact_id
    reducer.unreserve(fact_id)
    reducer.entries[fact_id] = Entry(
        "compaction",
        None,
        len(reducer.entries),
        len(reducer.message_ids),
        found.id,
        attempt.step_id,
        attempt.attempt_id,
    )
    if reducer.undo is not None:
        reducer.undo.append(functools.partial(reducer.entries.pop, fact_id))


def check_messages(messages: list[dict[str, Any]], line: int, seq: int) -> None:
    """Section 8 legality of a standalone message list (a compaction's retained tail)."""
    open_calls: set[str] = set()
    for message in messages:
        role = message["role"]
        if role == "tool":
            if message["tool_call_id"] not in open_calls:
                raise fail("INVALID_TRANSCRIPT", line, seq, "retained tool message answers no open call")
            open_calls.remove(message["tool_call_id"])
        elif open_calls:
            raise fail("INVALID_TRANSCRIPT", line, seq, "retained tail has unanswered tool calls")
        elif role == "assistant" and "tool_calls" in message:
            open_calls.update(call["id"] for call in message["tool_calls"])
