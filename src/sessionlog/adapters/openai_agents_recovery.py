"""What the OpenAI Agents SDK adapter's recovery did, for the caller (`openai_agents`):
`session.recovery`, read from the log before and after the recovery."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.shapes import SYNTHETIC_CONTENT
from ..core.state import SessionState
from ..runtime_reconcile import reconciliation


@dataclass(frozen=True)
class RecoveredCall:
    """One call recovery settled: `decision` is `replayed` (a safe or idempotent tool, run
    again), `reconciled-ran` / `reconciled-not-run` (its counterpart said so; not run: it ran now,
    same key), `interrupted` (may have run, not run again), or `started` (its intent was never
    written: it ran now)."""

    tool_call_id: str
    tool_name: str
    decision: str


@dataclass
class Recovery:
    """What the last recovery did: the calls it settled, in the model's order, and how the
    interrupted run ended (`aborted`, or `completed` when its model had answered last)."""

    operation_id: str
    calls: list[RecoveredCall] = field(default_factory=list)
    outcome: str = ""


def report(operation_id: str, before: SessionState, after: SessionState) -> Recovery:
    """The calls of the interrupted run's step that recovery settled (pending ones, and those
    whose intent was never written), in the model's order, with what was decided."""
    pending = [(str(tool["toolCallId"]), str(tool["toolName"])) for tool in before.pending_tools]
    pending_ids = {call_id for call_id, _ in pending}
    unstarted = [
        (str(call["id"]), str(call["function"]["name"]))
        for index, call in enumerate(before.settled_calls)
        if not before.has_outcome(index) and str(call["id"]) not in pending_ids
    ]
    outcome = str((after.last_finished or {}).get("outcome", ""))
    contents = {
        message.get("tool_call_id"): message.get("content")
        for message in after.transcript
        if message["role"] == "tool"
    }
    recovery = Recovery(operation_id, outcome=outcome)
    for call_id, name in sorted(pending + unstarted, key=lambda pair: _index(before, pair[0])):
        decided = _decision(contents.get(call_id), call_id in pending_ids)
        recovery.calls.append(RecoveredCall(call_id, name, decided))
    return recovery


def _index(state: SessionState, call_id: str) -> int:
    for index, call in enumerate(state.settled_calls):
        if str(call["id"]) == call_id:
            return index
    return len(state.settled_calls)


def _decision(content: Any, was_pending: bool) -> str:
    if content == SYNTHETIC_CONTENT["interrupted"]:
        return "interrupted"
    if content == SYNTHETIC_CONTENT["aborted"]:
        return "aborted"
    noted = reconciliation(content)
    if noted == "ran":
        return "reconciled-ran"
    if noted == "notRun":
        return "reconciled-not-run"
    return "replayed" if was_pending else "started"
