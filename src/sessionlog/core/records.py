"""The reducer's rules for record facts (contract sections 6-8): runs and compactions started,
configuration snapshots, step attempts and failures, tool intents, abort requests, operations
finished. Each function takes the live `ReducerState` and mutates it, journalling while a commit is
validated."""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any

import orjson

from . import entries
from .canonical import MAX_SAFE_INTEGER, canonical, digest, source_digest
from .errors import shown
from .model import Attempt, Operation
from .shapes import (
    BLANK,
    COMPACTION_RESULT,
    DIGEST,
    ERROR,
    RECORD_FACT,
    RECORD_KEYS,
    SNAPSHOT,
    SNAPSHOT_CACHE,
    SNAPSHOT_TOOL,
    TOOL_RESULT,
    UUID7,
    Snapshot,
    fail,
)

if TYPE_CHECKING:
    from .reducer_state import ReducerState


def apply_record(reducer: ReducerState, fact: dict[str, Any], fact_id: str, line: int, seq: int) -> None:
    if not RECORD_FACT.issuperset(fact):
        reducer.check_keys(fact, RECORD_FACT, "record fact", line, seq)
    record = fact.get("record")
    if type(record) is not dict:
        raise fail("INVALID_FACT", line, seq, "record is not an object")
    kind = record.get("type")
    allowed = RECORD_KEYS.get(kind) if type(kind) is str else None
    if allowed is None or type(kind) is not str:
        raise fail("INVALID_FACT", line, seq, f"record type {shown(kind)} is unknown")
    if not allowed.issuperset(record):
        reducer.check_keys(record, allowed, kind, line, seq)
    if kind == "stepAttempt":
        step_attempt(reducer, record, line, seq)
    elif kind == "toolStarted":
        tool_started(reducer, record, fact_id, line, seq)
    elif kind == "runStarted":
        run_started(reducer, record, line, seq)
    elif kind == "operationFinished":
        operation_finished(reducer, record, line, seq)
    elif kind == "stepFailed":
        step_failed(reducer, record, line, seq)
    elif kind == "abortRequested":
        abort_requested(reducer, record, line, seq)
    else:
        compaction_started(reducer, record, line, seq)


def start(reducer: ReducerState, operation: Operation) -> None:
    reducer.operations[operation.id] = operation
    if reducer.undo is not None:
        reducer.undo.append(functools.partial(reducer.operations.pop, operation.id))
    reducer.current = operation


def run_started(reducer: ReducerState, record: dict[str, Any], line: int, seq: int) -> None:
    if record.get("operationKind") != "run" or reducer.current is not None:
        raise fail("INVALID_TRANSITION", line, seq, "runStarted needs operationKind run and an idle session")
    operation_id = reducer.reserve(record.get("operationId"), "operationId", line, seq)
    input_id = record.get("inputEntryId")
    if type(input_id) is not str or UUID7(input_id) is None:
        raise fail("INVALID_FACT", line, seq, "inputEntryId is not a UUIDv7")
    source = reducer.entries.get(input_id)
    if source is None or source.message is None or source.message["role"] != "user":
        raise fail("INVALID_REFERENCE", line, seq, f"inputEntryId {input_id} is not a user message entry")
    start(reducer, Operation("run", operation_id, input_id))


def compaction_started(reducer: ReducerState, record: dict[str, Any], line: int, seq: int) -> None:
    if record.get("operationKind") != "compaction" or reducer.current is not None:
        raise fail(
            "INVALID_TRANSITION",
            line,
            seq,
            "compactionStarted needs operationKind compaction and an idle session",
        )
    operation_id = reducer.reserve(record.get("operationId"), "operationId", line, seq)
    input_id = record.get("inputThroughEntryId")
    if type(input_id) is not str or UUID7(input_id) is None:
        raise fail("INVALID_FACT", line, seq, "inputThroughEntryId is not a UUIDv7")
    result_id = reducer.reserve(record.get("resultEntryId"), "resultEntryId", line, seq, COMPACTION_RESULT)
    source = reducer.entries.get(input_id)
    if source is None:
        raise fail("INVALID_REFERENCE", line, seq, f"inputThroughEntryId {input_id} is not an entry")
    compacted = record.get("compactedEntryIds")
    kept = record.get("retainedEntryIds")
    if type(compacted) is not list or not compacted or type(kept) is not list:
        raise fail("INVALID_FACT", line, seq, "compactedEntryIds / retainedEntryIds are not id arrays")
    partition = compacted + kept
    # The usual case first, at C speed: the partition is exactly the known message ids, all
    # proven UUIDv7 when they were added. Otherwise check each id, in the contract's order.
    ids = reducer.message_ids
    exact = (count := source.messages_through) == len(partition) and partition == ids[:count]
    if not exact:
        for value in partition:
            reducer.check_uuid(value, "a partition id", line, seq)
    if source.message is None:
        raise fail("INVALID_REFERENCE", line, seq, "inputThroughEntryId is not a message entry")
    if not exact:
        raise fail(
            "INVALID_REFERENCE",
            line,
            seq,
            "compacted + retained ids are not every message entry through the input",
        )
    claimed = record.get("sourceDigest")
    if type(claimed) is not str or DIGEST(claimed) is None:
        raise fail("INVALID_FACT", line, seq, "sourceDigest is not sha256:<64 hex>")
    actual = running_source_digest(reducer, count)
    if actual != claimed:
        raise fail("INVALID_REFERENCE", line, seq, f"sourceDigest is not the digest {actual} of the source")
    start(reducer, Operation("compaction", operation_id, input_id, result_id))


def running_source_digest(reducer: ReducerState, count: int) -> str:
    """The compaction `sourceDigest` of the first `count` messages. Messages never change once
    appended, so the hash runs on from the last compaction: each message is encoded and
    hashed once per session, not once per compaction."""
    if count < reducer.source_count:  # an earlier boundary than the last one hashed: from scratch
        entries = reducer.entries
        return source_digest((mid, entries[mid].message or {}) for mid in reducer.message_ids[:count])
    if reducer.undo is not None:  # a rolled-back transaction may remove messages hashed here
        reducer.undo.append(
            functools.partial(set_source, reducer, reducer.source_hash.copy(), reducer.source_count)
        )
    running, entries, ids = reducer.source_hash, reducer.entries, reducer.message_ids
    for index in range(reducer.source_count, count):
        mid = ids[index]
        item = {"sourceEntryId": mid, "message": entries[mid].message or {}}
        running.update(b"," + canonical(item) if index else canonical(item))
    reducer.source_count = count
    final = running.copy()
    final.update(b"]")
    return "sha256:" + final.hexdigest()


def set_source(reducer: ReducerState, running: Any, count: int) -> None:
    reducer.source_hash, reducer.source_count = running, count


def known_snapshot(reducer: ReducerState, value: Any, line: int, seq: int) -> Snapshot:
    """A configuration snapshot to (digest, normal form); equal snapshots share one object.

    Sessions repeat one snapshot in every attempt: its encoding, once validated, is a cache
    key that skips validation and hashing next time."""
    encoded = b""
    if type(value) is dict:
        with contextlib.suppress(TypeError):  # an integer beyond 64 bits: validate, don't cache
            encoded = orjson.dumps(value)
        cached = reducer.snapshots_by_bytes.get(encoded)
        if cached is not None:
            return cached
    known = validate_snapshot(reducer, value, line, seq)
    if encoded and len(reducer.snapshots_by_bytes) < SNAPSHOT_CACHE:
        reducer.snapshots_by_bytes[encoded] = known
    return known


def validate_snapshot(reducer: ReducerState, snapshot: Any, line: int, seq: int) -> Snapshot:
    if type(snapshot) is not dict:
        raise fail("INVALID_FACT", line, seq, "configurationSnapshot is not an object")
    if not SNAPSHOT.issuperset(snapshot):
        reducer.check_keys(snapshot, SNAPSHOT, "configurationSnapshot", line, seq)
    model = snapshot.get("model")
    if type(model) is not str or not model:
        raise fail("INVALID_FACT", line, seq, "snapshot model is not a non-empty string")
    prompt = snapshot.get("systemPromptDigest")
    adapter = snapshot.get("adapterIdentity")
    if type(adapter) is not str or not adapter:
        raise fail("INVALID_FACT", line, seq, "adapterIdentity is not a non-empty string")
    routing = snapshot.get("routingIdentity")
    if type(routing) is not str or not routing:
        raise fail("INVALID_FACT", line, seq, "routingIdentity is not a non-empty string")
    output = snapshot.get("outputOptionsDigest")
    raw_tools = snapshot.get("tools")
    if (
        type(prompt) is not str
        or DIGEST(prompt) is None
        or type(output) is not str
        or DIGEST(output) is None
        or type(raw_tools) is not list
    ):
        raise fail("INVALID_FACT", line, seq, "snapshot digests or tools are malformed")
    tools = []
    names = set()
    for tool in raw_tools:
        if type(tool) is not dict:
            raise fail("INVALID_FACT", line, seq, "a snapshot tool is not an object")
        if not SNAPSHOT_TOOL.issuperset(tool):
            reducer.check_keys(tool, SNAPSHOT_TOOL, "snapshot tool", line, seq)
        name = tool.get("name")
        if type(name) is not str or not name:
            raise fail("INVALID_FACT", line, seq, "tool name is not a non-empty string")
        definition = tool.get("definitionDigest")
        if name in names or type(definition) is not str or DIGEST(definition) is None:
            raise fail("INVALID_FACT", line, seq, f"snapshot tool {shown(name)} is repeated or malformed")
        names.add(name)
        tools.append((name, definition))
    key = (model, prompt, tuple(tools), adapter, routing, output)
    known = reducer.snapshots_by_digest.get(key)
    if known is None:
        normal = {
            "model": model,
            "systemPromptDigest": prompt,
            "tools": [{"name": name, "definitionDigest": definition} for name, definition in tools],
            "adapterIdentity": adapter,
            "routingIdentity": routing,
            "outputOptionsDigest": output,
        }
        known = reducer.snapshots_by_digest[key] = (
            digest(canonical(normal, strings_only=True)),
            normal,
            frozenset(names),
        )
    return known


def step_attempt(reducer: ReducerState, record: dict[str, Any], line: int, seq: int) -> None:
    found = reducer.running(record.get("operationId"), "operationId", line, seq)
    number = reducer.check_safe_int(record.get("attempt"), "attempt", line, seq, 1)
    step_id: str = record.get("stepId")  # type: ignore[assignment]
    if number == 1:
        reducer.reserve(step_id, "stepId", line, seq)
    elif type(step_id) is not str or UUID7(step_id) is None:
        raise fail("INVALID_FACT", line, seq, "stepId is not a UUIDv7")
    attempt_id = reducer.reserve(record.get("attemptId"), "attemptId", line, seq)
    kind = record.get("stepKind")
    if number > 2 or kind not in ("assistant", "compaction"):
        raise fail("INVALID_FACT", line, seq, "attempt is not 1 or 2, or stepKind is unknown")
    if kind != ("assistant" if found.kind == "run" else "compaction"):
        raise fail("INVALID_TRANSITION", line, seq, f"a {found.kind} cannot take a {kind} step")
    context_id = record.get("contextThroughEntryId")
    if type(context_id) is not str or context_id not in reducer.entries:
        if type(context_id) is not str or UUID7(context_id) is None:
            raise fail("INVALID_FACT", line, seq, "contextThroughEntryId is not a UUIDv7")
        raise fail("INVALID_REFERENCE", line, seq, f"contextThroughEntryId {context_id} is not an entry")
    if number == 1 and context_id != reducer.boundary:
        raise fail("INVALID_TRANSITION", line, seq, "attempt 1 context is not the active-context boundary")
    configuration_digest, snapshot, declared = known_snapshot(
        reducer, record.get("configurationSnapshot"), line, seq
    )
    claimed = record.get("configurationDigest")
    if type(claimed) is not str or claimed != configuration_digest:
        raise fail(
            "INVALID_FACT",
            line,
            seq,
            f"configurationDigest is not the snapshot's digest {configuration_digest}",
        )
    prior = reducer.steps.get(step_id)
    active = found.step
    if number == 1:
        if prior is not None or (active is not None and active.status != "settled"):
            raise fail("INVALID_TRANSITION", line, seq, "the current step is still open or failed")
        if active is not None:
            check_tools_settled(reducer, found, active, line, seq)
    else:
        first = prior[0] if prior else None
        if (
            first is None
            or len(prior or ()) != 1
            or first.number != 1
            or first.closed
            or first.failed
            or first.kind != kind
            or first.operation_id != found.id
            or first.context_id != context_id
            or first.digest != claimed
        ):
            raise fail(
                "INVALID_TRANSITION",
                line,
                seq,
                "attempt 2 needs an open attempt 1 of the same step, context and digest",
            )
        if reducer.undo is not None:
            reducer.remember(first, "closed")
        first.closed = True
    attempt = Attempt(found.id, step_id, attempt_id, number, kind, context_id, snapshot, claimed, declared)
    reducer.attempts[attempt_id] = attempt
    if reducer.undo is not None:
        reducer.undo.append(functools.partial(reducer.attempts.pop, attempt_id))
    if prior is None:
        reducer.steps[step_id] = [attempt]
        if reducer.undo is not None:
            reducer.undo.append(functools.partial(reducer.steps.pop, step_id))
    else:
        prior.append(attempt)
        if reducer.undo is not None:
            reducer.undo.append(prior.pop)
    if reducer.undo is not None:
        reducer.remember(found, "latest_step_id", "step")
    found.latest_step_id = step_id
    found.step = attempt


def check_tools_settled(
    reducer: ReducerState, run: Operation, previous: Attempt, line: int, seq: int
) -> None:
    """A later step of a run needs a toolUse assistant entry whose calls all have results."""
    settled = reducer.entries.get(previous.settled_id or "")
    if run.kind != "run" or settled is None or settled.stop_reason != "toolUse":
        raise fail("INVALID_TRANSITION", line, seq, "a later step needs a toolUse assistant entry before it")
    if run.pending:
        raise fail("INVALID_TRANSITION", line, seq, "a tool intent is still pending")
    assert settled.message is not None
    calls = settled.message.get("tool_calls", ())
    entry_id = previous.settled_id or ""
    for index in range(len(calls)):
        if (entry_id, index) not in reducer.outcomes:
            raise fail("INVALID_TRANSITION", line, seq, f"tool call {index} has no result yet")


def step_failed(reducer: ReducerState, record: dict[str, Any], line: int, seq: int) -> None:
    found = reducer.running(record.get("operationId"), "operationId", line, seq)
    attempt_id = record.get("attemptId")
    if type(attempt_id) is not str or UUID7(attempt_id) is None:
        raise fail("INVALID_FACT", line, seq, "attemptId is not a UUIDv7")
    attempt = reducer.attempts.get(attempt_id)
    check_error(reducer, record.get("error"), line, seq)
    if (
        attempt is None
        or attempt.operation_id != found.id
        or attempt.step_id != record.get("stepId")
        or attempt.closed
    ):
        raise fail("INVALID_REFERENCE", line, seq, f"{attempt_id} is not an open attempt of that step")
    if reducer.undo is not None:
        reducer.remember(attempt, "closed", "failed")
    attempt.closed = True
    attempt.failed = True


def check_error(reducer: ReducerState, value: Any, line: int, seq: int) -> None:
    error = value
    if type(error) is not dict:
        raise fail("INVALID_FACT", line, seq, "error is not an object")
    if not ERROR.issuperset(error):
        reducer.check_keys(error, ERROR, "error", line, seq)
    reducer.check_text(error.get("code"), "error code", line, seq)
    reducer.check_text(error.get("message"), "error message", line, seq)


def tool_started(reducer: ReducerState, record: dict[str, Any], fact_id: str, line: int, seq: int) -> None:
    found = reducer.running(record.get("operationId"), "operationId", line, seq)
    if found.kind != "run" or reducer.current is not found:
        raise fail("INVALID_TRANSITION", line, seq, "toolStarted names no current run")
    assistant_id: str = record.get("assistantEntryId")  # type: ignore[assignment]
    assistant = reducer.entries.get(assistant_id) if type(assistant_id) is str else None
    if assistant is None and (type(assistant_id) is not str or UUID7(assistant_id) is None):
        raise fail("INVALID_FACT", line, seq, "assistantEntryId is not a UUIDv7")
    if assistant is None or assistant.stop_reason != "toolUse" or assistant.operation_id != found.id:
        raise fail(
            "INVALID_REFERENCE", line, seq, f"{assistant_id} is not a toolUse assistant entry of this run"
        )
    index = record.get("toolIndex")
    if type(index) is not int or not 0 <= index <= MAX_SAFE_INTEGER:
        raise fail("INVALID_FACT", line, seq, "toolIndex is not a safe integer")
    call_id = record.get("toolCallId")
    if type(call_id) is not str or not call_id:
        raise fail("INVALID_FACT", line, seq, "toolCallId is not a non-empty string")
    name = record.get("toolName")
    if type(name) is not str or not name:
        raise fail("INVALID_FACT", line, seq, "toolName is not a non-empty string")
    entries.call_at(reducer, assistant, index, call_id, name, line, seq)
    step_id = record.get("stepId")
    if assistant.step_id != step_id:
        raise fail("INVALID_REFERENCE", line, seq, "stepId is not the assistant entry's step")
    pair = (assistant_id, index)
    if pair in reducer.outcomes:
        raise fail("INVALID_TRANSITION", line, seq, f"tool call {index} already has an outcome")
    arguments = record.get("arguments")
    if type(arguments) is not dict:
        raise fail("INVALID_FACT", line, seq, "arguments is not an object")
    replay = record.get("replay")
    if replay not in ("safe", "never"):
        raise fail("INVALID_FACT", line, seq, f"replay {shown(replay)} is not safe or never")
    replay_key = record.get("replayKey")
    if type(replay_key) is not str or not replay_key:
        raise fail("INVALID_FACT", line, seq, "replayKey is not a non-empty string")
    environment = record.get("environmentIdentity")
    if type(environment) is not str or not environment:
        raise fail("INVALID_FACT", line, seq, "environmentIdentity is not a non-empty string")
    attempt = reducer.attempts.get(assistant.attempt_id or "")
    if attempt is None or name not in attempt.declared:
        raise fail(
            "INVALID_TRANSITION",
            line,
            seq,
            f"tool {shown(name)} is not declared in the attempt's snapshot",
        )
    result_id = reducer.reserve(record.get("resultEntryId"), "resultEntryId", line, seq, TOOL_RESULT)
    tool = {
        "operationId": found.id,
        "toolStartedId": fact_id,
        "stepId": step_id,
        "assistantEntryId": assistant_id,
        "toolIndex": index,
        "toolCallId": call_id,
        "toolName": name,
        "arguments": arguments,
        "replay": replay,
        "replayKey": replay_key,
        "environmentIdentity": environment,
        "resultEntryId": result_id,
        "status": "pending",
    }
    reducer.tools[fact_id] = tool
    if reducer.undo is not None:
        reducer.undo.append(functools.partial(reducer.tools.pop, fact_id))
    reducer.outcomes.add(pair)
    if reducer.undo is not None:
        reducer.undo.append(functools.partial(reducer.outcomes.discard, pair))
    found.tool_calls.append(tool)
    if reducer.undo is not None:
        reducer.remember(found, "pending")
    found.pending += 1
    if reducer.undo is not None:
        reducer.undo.append(found.tool_calls.pop)


def abort_requested(reducer: ReducerState, record: dict[str, Any], line: int, seq: int) -> None:
    found = reducer.running(record.get("operationId"), "operationId", line, seq)
    if record.get("operationKind") != found.kind or record.get("reason") != "escape":
        raise fail("INVALID_TRANSITION", line, seq, "operationKind differs or reason is not escape")
    phase = record.get("phase")
    if phase not in ("model", "tool", "compact"):
        raise fail("INVALID_FACT", line, seq, f"phase {shown(phase)} is not model, tool or compact")
    if (phase == "tool") != (type(record.get("toolCallId")) is str):
        raise fail("INVALID_FACT", line, seq, "toolCallId must be a string exactly when phase is tool")
    if reducer.current is not found or found.abort_requested:
        raise fail("INVALID_TRANSITION", line, seq, "not the current operation, or abort already requested")
    if reducer.undo is not None:
        reducer.remember(found, "abort_requested")
    found.abort_requested = True


def operation_finished(reducer: ReducerState, record: dict[str, Any], line: int, seq: int) -> None:
    found = reducer.running(record.get("operationId"), "operationId", line, seq)
    outcome = record.get("outcome")
    if record.get("operationKind") != found.kind or outcome not in ("completed", "aborted", "failed"):
        raise fail("INVALID_TRANSITION", line, seq, "operationKind differs or outcome is unknown")
    if reducer.current is not found:
        raise fail("INVALID_TRANSITION", line, seq, "not the current operation")
    if outcome == "completed":
        check_completion(reducer, record, found, line, seq)
    elif "finalEntryId" in record:
        raise fail("INVALID_FACT", line, seq, "finalEntryId is only for a completed operation")
    if outcome == "aborted":
        pending = found.pending > 0
        attempting = found.step is not None and found.step.status == "attempting"
        if not found.abort_requested or pending or attempting:
            raise fail(
                "INVALID_TRANSITION",
                line,
                seq,
                "aborted needs an abort request, no pending tool and no open attempt",
            )
    if outcome != "completed" and "completion" in record:
        raise fail("INVALID_FACT", line, seq, "completion is only for a completed operation")
    if outcome == "failed":
        check_error(reducer, record.get("error"), line, seq)
    elif "error" in record:
        raise fail("INVALID_FACT", line, seq, "error is only for a failed operation")
    if reducer.undo is not None:
        reducer.remember(found, "finished")
        reducer.remember(reducer, "last_finished")
    found.finished = True
    reducer.current = None
    reducer.last_finished = {
        key: value
        for key, value in record.items()
        if key in ("operationId", "operationKind", "outcome", "completion", "finalEntryId", "error")
    }


def check_completion(
    reducer: ReducerState, record: dict[str, Any], found: Operation, line: int, seq: int
) -> None:
    completion = record.get("completion")
    if found.kind == "run" and completion not in ("normal", "truncated"):
        raise fail("INVALID_FACT", line, seq, "a completed run needs completion normal or truncated")
    if found.kind == "compaction" and "completion" in record:
        raise fail("INVALID_FACT", line, seq, "a completed compaction has no completion")
    final_id = record.get("finalEntryId")
    if type(final_id) is not str or UUID7(final_id) is None:
        raise fail("INVALID_FACT", line, seq, "finalEntryId is not a UUIDv7")
    info = reducer.entries.get(final_id)
    if info is None or info.operation_id != found.id:
        raise fail("INVALID_REFERENCE", line, seq, f"finalEntryId {final_id} is no entry of this operation")
    attempt = reducer.attempts.get(info.attempt_id or "")
    if found.kind == "compaction":
        if info.kind != "compaction" or found.result_id != final_id:
            raise fail("INVALID_REFERENCE", line, seq, "finalEntryId is not the compaction entry")
        if attempt is None or attempt.step_id != found.latest_step_id or attempt.settled_id != final_id:
            raise fail("INVALID_REFERENCE", line, seq, "the compaction entry did not settle the latest step")
        return
    wanted = "stop" if completion == "normal" else "length"
    if info.kind != "message" or info.stop_reason != wanted:
        raise fail("INVALID_REFERENCE", line, seq, f"finalEntryId did not stop with {wanted}")
    if (
        attempt is None
        or not attempt.closed
        or attempt.failed
        or attempt.step_id != found.latest_step_id
        or attempt.settled_id != final_id
    ):
        raise fail("INVALID_REFERENCE", line, seq, "finalEntryId did not settle the latest step")
    message = info.message or {}
    if completion == "normal" and not (message.get("content") or "").strip(BLANK):
        raise fail("INVALID_TRANSCRIPT", line, seq, "a normal completion needs non-blank content")
    if completion == "truncated" and "tool_calls" not in message:
        raise fail("INVALID_TRANSCRIPT", line, seq, "a truncated completion needs tool calls")
    if found.pending:
        raise fail("INVALID_TRANSCRIPT", line, seq, "a tool intent is still pending")
