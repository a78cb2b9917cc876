"""Typed builders of new facts: mappings in the file's own shape, without `seq` and `timestamp`.

Each builder gives the fact an `id` (from `new_id()` unless one is passed) so a later fact of the
same transaction can name it. Reserved ids (operation, step, attempt, tool result, compaction
result) are passed in or made here and returned inside the fact for the caller to use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .canonical import configuration_digest
from .ids import new_id
from .reducer import SYNTHETIC_CONTENT

Fact = dict[str, Any]


def _entry(entry: dict[str, Any], fact_id: str | None) -> Fact:
    return {"kind": "entry", "id": fact_id or new_id(), "entry": entry}


def _record(record: dict[str, Any], fact_id: str | None) -> Fact:
    return {"kind": "record", "id": fact_id or new_id(), "record": record}


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One entry of an assistant message's `tool_calls` (`arguments` is the model's JSON text)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def user_message(content: str, *, id: str | None = None) -> Fact:
    return _entry({"type": "message", "message": {"role": "user", "content": content}}, id)


def run_started(input_entry_id: str, *, operation_id: str | None = None, id: str | None = None) -> Fact:
    return _record(
        {
            "type": "runStarted",
            "operationId": operation_id or new_id(),
            "operationKind": "run",
            "inputEntryId": input_entry_id,
        },
        id,
    )


def accept_prompt(content: str) -> list[Fact]:
    """The transaction that accepts work: a user entry and the run that answers it."""
    user = user_message(content)
    return [user, run_started(user["id"])]


def step_attempt(
    operation_id: str,
    context_through_entry_id: str,
    snapshot: Mapping[str, Any],
    *,
    step_kind: str = "assistant",
    attempt: int = 1,
    step_id: str | None = None,
    attempt_id: str | None = None,
    id: str | None = None,
) -> Fact:
    """A model attempt, written before the request is sent. Attempt 2 repeats attempt 1's stepId."""
    return _record(
        {
            "type": "stepAttempt",
            "operationId": operation_id,
            "stepId": step_id or new_id(),
            "attemptId": attempt_id or new_id(),
            "stepKind": step_kind,
            "attempt": attempt,
            "contextThroughEntryId": context_through_entry_id,
            "configurationSnapshot": dict(snapshot),
            "configurationDigest": configuration_digest(snapshot),
        },
        id,
    )


def assistant_message(
    step_id: str,
    attempt_id: str,
    content: str | None,
    *,
    tool_calls: Sequence[Mapping[str, Any]] = (),
    stop_reason: str | None = None,
    id: str | None = None,
) -> Fact:
    """The model's answer, settling its attempt. stopReason defaults to toolUse with calls, else stop."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [dict(call) for call in tool_calls]
    return _entry(
        {
            "type": "message",
            "stepId": step_id,
            "attemptId": attempt_id,
            "stopReason": stop_reason or ("toolUse" if tool_calls else "stop"),
            "message": message,
        },
        id,
    )


def step_failed(
    operation_id: str, step_id: str, attempt_id: str, code: str, message: str, *, id: str | None = None
) -> Fact:
    return _record(
        {
            "type": "stepFailed",
            "operationId": operation_id,
            "stepId": step_id,
            "attemptId": attempt_id,
            "error": {"code": code, "message": message},
        },
        id,
    )


def tool_started(
    operation_id: str,
    step_id: str,
    assistant_entry_id: str,
    tool_index: int,
    call: Mapping[str, Any],
    arguments: Mapping[str, Any],
    *,
    replay: str,
    replay_key: str,
    environment_identity: str,
    result_entry_id: str | None = None,
    id: str | None = None,
) -> Fact:
    """The intent that must be durable before the tool runs; reserves the result's entry id."""
    return _record(
        {
            "type": "toolStarted",
            "operationId": operation_id,
            "stepId": step_id,
            "assistantEntryId": assistant_entry_id,
            "toolIndex": tool_index,
            "toolCallId": call["id"],
            "toolName": call["function"]["name"],
            "arguments": dict(arguments),
            "replay": replay,
            "replayKey": replay_key,
            "environmentIdentity": environment_identity,
            "resultEntryId": result_entry_id or new_id(),
        },
        id,
    )


def tool_result(intent: Mapping[str, Any], content: str, *, ok: bool = True) -> Fact:
    """The result of a started tool, under the id its intent reserved. `intent` is the
    toolStarted fact (or its record, or a state tool entry with `toolStartedId`)."""
    record = intent.get("record", intent)
    started_id = intent["id"] if "record" in intent else record["toolStartedId"]
    return _entry(
        {
            "type": "message",
            "stepId": record["stepId"],
            "message": {"role": "tool", "content": content, "tool_call_id": record["toolCallId"]},
            "toolName": record["toolName"],
            "toolStartedId": started_id,
            "result": {"type": "success" if ok else "error"},
        },
        record["resultEntryId"],
    )


def interrupted_result(intent: Mapping[str, Any]) -> Fact:
    """Settles an intent whose effect may have happened: the tool is never replayed."""
    fact = tool_result(intent, SYNTHETIC_CONTENT["interrupted"])
    fact["entry"]["result"] = {"type": "synthetic", "reason": "interrupted"}
    return fact


def pre_execution_result(
    step_id: str,
    assistant_entry_id: str,
    tool_index: int,
    call: Mapping[str, Any],
    reason: str,
    *,
    id: str | None = None,
) -> Fact:
    """A synthetic result for a call that never started (invalidArguments, unknownTool, truncated,
    aborted), with the contract's fixed content."""
    return _entry(
        {
            "type": "message",
            "stepId": step_id,
            "assistantEntryId": assistant_entry_id,
            "toolIndex": tool_index,
            "message": {"role": "tool", "content": SYNTHETIC_CONTENT[reason], "tool_call_id": call["id"]},
            "toolName": call["function"]["name"],
            "result": {"type": "synthetic", "reason": reason},
        },
        id,
    )


def abort_requested(
    operation_id: str,
    operation_kind: str,
    phase: str,
    *,
    tool_call_id: str | None = None,
    id: str | None = None,
) -> Fact:
    record: dict[str, Any] = {
        "type": "abortRequested",
        "operationId": operation_id,
        "operationKind": operation_kind,
        "phase": phase,
        "reason": "escape",
    }
    if tool_call_id is not None:
        record["toolCallId"] = tool_call_id
    return _record(record, id)


def operation_finished(
    operation_id: str,
    operation_kind: str,
    outcome: str,
    *,
    completion: str | None = None,
    final_entry_id: str | None = None,
    error: Mapping[str, str] | None = None,
    id: str | None = None,
) -> Fact:
    record: dict[str, Any] = {
        "type": "operationFinished",
        "operationId": operation_id,
        "operationKind": operation_kind,
        "outcome": outcome,
    }
    if completion is not None:
        record["completion"] = completion
    if final_entry_id is not None:
        record["finalEntryId"] = final_entry_id
    if error is not None:
        record["error"] = dict(error)
    return _record(record, id)


def usage(
    operation_id: str,
    counts: Mapping[str, int],
    *,
    attempt_id: str | None = None,
    tool_started_id: str | None = None,
    id: str | None = None,
) -> Fact:
    """Usage of exactly one attempt or one tool intent: `counts` has input, output, cacheRead, cacheWrite."""
    fact: Fact = {"kind": "usage", "id": id or new_id(), "operationId": operation_id}
    if attempt_id is not None:
        fact["attemptId"] = attempt_id
    if tool_started_id is not None:
        fact["toolStartedId"] = tool_started_id
    fact["usage"] = {key: counts.get(key, 0) for key in ("input", "output", "cacheRead", "cacheWrite")}
    return fact


def compaction_started(
    input_through_entry_id: str,
    compacted_entry_ids: Sequence[str],
    retained_entry_ids: Sequence[str],
    source_digest: str,
    *,
    operation_id: str | None = None,
    result_entry_id: str | None = None,
    id: str | None = None,
) -> Fact:
    return _record(
        {
            "type": "compactionStarted",
            "operationId": operation_id or new_id(),
            "operationKind": "compaction",
            "inputThroughEntryId": input_through_entry_id,
            "resultEntryId": result_entry_id or new_id(),
            "compactedEntryIds": list(compacted_entry_ids),
            "retainedEntryIds": list(retained_entry_ids),
            "sourceDigest": source_digest,
        },
        id,
    )


def compaction_entry(
    started: Mapping[str, Any],
    summary: str,
    compacted_through_entry_id: str,
    retained_tail: Sequence[tuple[str, Mapping[str, Any]]],
) -> Fact:
    """The compaction's result under its reserved id; `retained_tail` is (entry id, message) pairs."""
    record = started.get("record", started)
    return _entry(
        {
            "type": "compaction",
            "operationId": record["operationId"],
            "summary": summary,
            "compactedThroughEntryId": compacted_through_entry_id,
            "retainedTail": [
                {"sourceEntryId": entry_id, "message": dict(message)} for entry_id, message in retained_tail
            ],
        },
        record["resultEntryId"],
    )
