"""Carrying out recovery plans (contract section 11).

`plan_recovery` says what to do next and never writes. This module does the rest:

* `recover(store, current)` commits every plan that needs no external effect, one transaction
  each: synthetic tool results (`appendSynthetic`), `closeAttempt` as `stepFailed`, `finish` as
  `operationFinished`. It returns the first plan that needs the caller: `startStep` (a model
  request), `startTool` (a tool run), `blocked` (a human), or the idle `finish` (nothing to do).
  Running it again commits nothing: the planner is idempotent over what it causes.
* The building blocks turn a plan into facts, so a framework carries out `startStep` and
  `startTool` itself with intent before effect: `start_step_facts` (the `stepAttempt` to commit
  before the request is sent), `start_tool_facts` (the `toolStarted` intent to commit before the
  tool runs, and the result fact to commit after), `facts_for_plan` (any plan).

A replay (`startTool` mode `replay`) re-runs a declared-safe read for an intent that is already
durable: it writes no new intent (one outcome per call, the reducer refuses a second one); the
result goes under the intent's reserved `resultEntryId` with its `toolStartedId`.

`plan_in_order(state, current)` is `plan_recovery` with one departure, for a runtime that commits
one intent per tool right before it runs (`recover(..., in_order=True)` uses it): a pending call
is settled (replayed, settled as interrupted, or blocked on) before a later call of the same step
is started. The contract's rule order (rule 9, start the next call, before rule 11, settle a
pending one) would run a later `bash` before an earlier `read` is replayed. Every fact it leads
to is one the contract's planner would also plan, only sooner (docs/agent-loop.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

from . import schema
from .core import facts as build
from .core.canonical import configuration_digest
from .core.errors import shown
from .core.planner import plan_recovery, settle_pending_intent
from .core.state import SessionState, copy_json

Plan = schema.Plan
Fact = dict[str, Any]
OnCommit = Callable[[Plan, list[dict[str, Any]]], object]
"""`on_commit(plan, committed_facts)`: called after each transaction `recover` commits."""
Hold = Callable[[SessionState, Plan], bool]
"""`hold(state, plan)`: True to return an effect-free plan to the caller instead of committing
it (the runtime holds a reconcilable `interrupted` synthetic to ask its tool first)."""


class Store(Protocol):
    """What `recover` needs of a store: `SessionStore`, or anything that commits and loads."""

    def commit(self, facts: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]: ...

    def load(self) -> SessionState: ...


class AsyncStore(Protocol):
    """What `recover_async` needs of a store: `AsyncSessionStore`, or the like."""

    async def commit(self, facts: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]: ...

    async def load(self) -> SessionState: ...


__all__ = [
    "AsyncStore",
    "Hold",
    "OnCommit",
    "Store",
    "ToolStart",
    "facts_for_plan",
    "idempotency_key",
    "needs_caller",
    "new_intent",
    "plan_in_order",
    "recover",
    "recover_async",
    "start_step_facts",
    "start_tool_facts",
]


def needs_caller(state: SessionState, plan: Mapping[str, Any]) -> bool:
    """Whether `plan` is for the caller: a model request (`startStep`), a tool run (`startTool`),
    a human (`blocked`), or nothing at all (`finish` of an idle session)."""
    kind = plan["type"]
    if kind in ("startStep", "startTool", "blocked"):
        return True
    return kind == "finish" and state.is_idle


# -- plans to facts ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolStart:
    """How to carry out a `startTool` plan: commit `facts` (the intent; empty for a replay, whose
    intent is already durable), run the tool with `arguments`, then commit `result(content)`."""

    mode: str
    facts: list[Fact]
    intent: dict[str, Any]
    """The intent in the state's tool form (`toolStartedId`, `resultEntryId`, `toolCallId`, ...)."""

    @property
    def result_entry_id(self) -> str:
        return str(self.intent["resultEntryId"])

    @property
    def tool_started_id(self) -> str:
        return str(self.intent["toolStartedId"])

    @property
    def tool_name(self) -> str:
        return str(self.intent["toolName"])

    @property
    def key(self) -> str:
        """The call's idempotency key (`idempotency_key` of its intent's fact id)."""
        return idempotency_key(self.tool_started_id)

    @property
    def arguments(self) -> dict[str, Any]:
        return copy_json(self.intent["arguments"])  # type: ignore[no-any-return]

    def result(self, content: str, *, ok: bool = True) -> Fact:
        """The tool's result entry, under the intent's reserved id."""
        return build.tool_result(self.intent, content, ok=ok)


KEY_PREFIX = "sl-"


def idempotency_key(tool_started_id: str) -> str:
    """The idempotency key of a tool call: `sl-` and its `toolStarted` fact's id (a lowercase
    UUIDv7). It exists before the effect (the intent is durable first), is the same on every
    replay or reconciliation of that intent and in a fork (a fork keeps the facts' ids), and no
    other call has it. 39 characters of `[a-z0-9-]` starting with a letter: an `Idempotency-Key`
    header, a client token (<= 64) or a resource name (<= 63) takes it as it is. It holds
    nothing of the arguments, so it never carries a secret."""
    return f"{KEY_PREFIX}{tool_started_id}"


def _running(state: SessionState) -> dict[str, Any]:
    operation = state.current_operation
    if operation is None:
        raise ValueError("the session is idle: no operation to act on")
    return operation


def _declared(current: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    for tool in current["tools"]:
        if tool.get("name") == name:
            return tool  # type: ignore[no-any-return]
    return None


def _settled_call(state: SessionState, assistant_id: str, index: int, name: str) -> dict[str, Any]:
    """Call `index` of the assistant entry that settled the current step; checks the plan's names."""
    if state.settled_entry_id != assistant_id:
        raise ValueError(f"{assistant_id} is not the assistant entry that settled the current step")
    calls = state.settled_calls
    if not 0 <= index < len(calls) or calls[index]["function"]["name"] != name:
        raise ValueError(f"the assistant entry has no call {index} of tool {shown(name)}")
    return calls[index]


def _pending(state: SessionState, tool_started_id: str) -> dict[str, Any]:
    for tool in state.tool_calls:
        if tool["toolStartedId"] == tool_started_id:
            if tool["status"] != "pending":
                raise ValueError(f"tool intent {tool_started_id} already has its result")
            return tool
    raise ValueError(f"no tool intent {tool_started_id} in the current run")


def start_step_facts(
    state: SessionState, plan: Mapping[str, Any], snapshot: Mapping[str, Any] | None = None
) -> list[Fact]:
    """The transaction to commit before the model request of a `startStep` plan: one
    `stepAttempt` (read its `stepId` and `attemptId` from `facts[0]["record"]`).

    `snapshot` is the configuration the request is made with. Attempt 1 needs it; attempt 2
    repeats attempt 1's `stepId` and must use the same configuration, so it defaults to the
    snapshot attempt 1 persisted (a different one is refused here, not by the commit)."""
    if plan["type"] != "startStep":
        raise ValueError(f"not a startStep plan: {plan['type']}")
    operation = _running(state)
    attempt = plan["attempt"]
    if attempt == 2:
        step = state.open_attempt
        if step is None or step["stepId"] != plan.get("stepId"):
            raise ValueError("attempt 2 needs the open attempt 1 of the plan's step")
        if snapshot is None:
            snapshot = step["configurationSnapshot"]
        elif configuration_digest(snapshot) != step["configurationDigest"]:
            raise ValueError("attempt 2 must use attempt 1's configuration (the digests differ)")
    elif snapshot is None:
        raise ValueError("attempt 1 needs the configuration snapshot it is made with")
    return [
        build.step_attempt(
            operation["operationId"],
            plan["contextThroughEntryId"],
            snapshot,
            step_kind=plan["stepKind"],
            attempt=attempt,
            step_id=plan.get("stepId"),
        )
    ]


def start_tool_facts(state: SessionState, plan: Mapping[str, Any], current: Mapping[str, Any]) -> ToolStart:
    """How to carry out a `startTool` plan with intent before effect.

    Mode `start`: a new `toolStarted` intent with the plan's parsed arguments, the current
    declaration's `replay` and `replayKey` and the current environment identity; it reserves the
    result's entry id. Mode `replay`: no new fact; the pending intent the plan names is run again
    with its persisted arguments and settled by `ToolStart.result` under its reserved id."""
    if plan["type"] != "startTool":
        raise ValueError(f"not a startTool plan: {plan['type']}")
    _running(state)  # an idle session has nothing to start
    if plan["mode"] == "replay":
        tool = _pending(state, plan["toolStartedId"])
        if tool["toolIndex"] != plan["toolIndex"] or tool["toolName"] != plan["toolName"]:
            raise ValueError("the plan does not match the pending intent it names")
        return ToolStart("replay", [], tool)
    if plan["mode"] != "start":
        raise ValueError(f"unknown startTool mode {shown(plan['mode'])}")
    call = _settled_call(state, plan["assistantEntryId"], plan["toolIndex"], plan["toolName"])
    declaration = _declared(current, plan["toolName"])
    if declaration is None:
        raise ValueError(f"tool {shown(plan['toolName'])} is not declared in the current configuration")
    return new_intent(state, plan["toolIndex"], call, plan["arguments"], declaration, current)


def new_intent(
    state: SessionState,
    index: int,
    call: Mapping[str, Any],
    arguments: Mapping[str, Any],
    declaration: Mapping[str, Any],
    current: Mapping[str, Any],
) -> ToolStart:
    """The `toolStarted` intent for call `index` of the settled assistant entry, with its
    declaration's `replay` and `replayKey` and the current environment identity."""
    operation, step = _running(state), state.step
    assert step is not None and state.settled_entry_id is not None  # a settled entry implies a step
    fact = build.tool_started(
        operation["operationId"],
        step["stepId"],
        state.settled_entry_id,
        index,
        call,
        arguments,
        replay=declaration["replay"],
        replay_key=declaration["replayKey"],
        environment_identity=current["environmentIdentity"],
    )
    record = fact["record"]
    intent = {key: value for key, value in record.items() if key != "type"}
    intent["toolStartedId"] = fact["id"]
    intent["arguments"] = copy_json(record["arguments"])
    intent["status"] = "pending"
    return ToolStart("start", [fact], intent)


def _synthetic_facts(state: SessionState, results: list[Mapping[str, Any]]) -> list[Fact]:
    out = []
    for result in results:
        if "toolStartedId" in result:
            tool = _pending(state, result["toolStartedId"])
            if tool["resultEntryId"] != result["resultEntryId"]:
                raise ValueError("the plan's resultEntryId is not the one the intent reserved")
            out.append(build.interrupted_result(tool))
            continue
        call = _settled_call(state, result["assistantEntryId"], result["toolIndex"], result["toolName"])
        if call["id"] != result["toolCallId"]:
            raise ValueError(
                f"call {result['toolIndex']} has id {shown(call['id'])}, not {shown(result['toolCallId'])}"
            )
        step = state.step
        assert step is not None
        out.append(
            build.pre_execution_result(
                step["stepId"], result["assistantEntryId"], result["toolIndex"], call, result["reason"]
            )
        )
    return out


def facts_for_plan(
    state: SessionState,
    plan: Mapping[str, Any],
    current: Mapping[str, Any] | None = None,
    *,
    snapshot: Mapping[str, Any] | None = None,
) -> list[Fact]:
    """The one transaction that carries out `plan` on `state` (empty: nothing to write).

    `appendSynthetic`: the synthetic results (pre-execution ones as new entries, interrupted ones
    under the intent's reserved id); `closeAttempt`: `stepFailed` with the plan's error;
    `finish`: `operationFinished` (nothing when the session is idle); `blocked`: nothing;
    `startStep`: the `stepAttempt` (see `start_step_facts`, `snapshot` is passed on);
    `startTool`: the intent (see `start_tool_facts`, which also builds the result; needs
    `current`)."""
    kind = plan["type"]
    if kind == "blocked":
        return []
    if kind == "finish":
        if state.is_idle:
            return []
        operation = _running(state)
        return [
            build.operation_finished(
                operation["operationId"],
                operation["kind"],
                plan["outcome"],
                completion=plan.get("completion"),
                final_entry_id=plan.get("finalEntryId"),
                error=plan.get("error"),
            )
        ]
    if kind == "closeAttempt":
        step = state.open_attempt
        if step is None:
            raise ValueError("closeAttempt needs an open attempt")
        error = plan["error"]
        return [
            build.step_failed(
                step["operationId"], step["stepId"], step["attemptId"], error["code"], error["message"]
            )
        ]
    if kind == "appendSynthetic":
        return _synthetic_facts(state, plan["results"])
    if kind == "startStep":
        return start_step_facts(state, plan, snapshot)
    if kind == "startTool":
        if current is None:
            raise ValueError("a startTool plan needs the current configuration")
        return start_tool_facts(state, plan, current).facts
    raise ValueError(f"unknown plan type {shown(kind)}")


# -- the model's order -------------------------------------------------------------------------


def plan_in_order(state: SessionState, current: Mapping[str, Any]) -> Plan:
    """`plan_recovery`, except that a `startTool` start of call k while an earlier call j < k of
    the same step is pending gives the plan rule 11 gives for that pending call: its replay, its
    `interrupted` synthetic, or `blocked` (environment, configuration or replay declaration
    changed). Tools then run and replay in the model's order."""
    plan = plan_recovery(state, current)
    if plan["type"] != "startTool" or plan["mode"] != "start":
        return plan
    earlier = [
        tool
        for tool in state.pending_tools
        if tool["assistantEntryId"] == plan["assistantEntryId"] and tool["toolIndex"] < plan["toolIndex"]
    ]
    if not earlier:
        return plan
    pending = min(earlier, key=lambda tool: tool["toolIndex"])
    return cast(Plan, settle_pending_intent(pending, state.settled_calls, current))  # rule 11, for it


# -- the recovery loop -------------------------------------------------------------------------


def _next(
    state: SessionState,
    current: Mapping[str, Any],
    previous: Plan | None,
    in_order: bool = False,
    hold: Hold | None = None,
) -> tuple[Plan, list[Fact]]:
    """The next plan and its facts; no facts when the plan is for the caller."""
    plan = plan_in_order(state, current) if in_order else plan_recovery(state, current)
    if needs_caller(state, plan) or (hold is not None and hold(state, plan)):
        return plan, []
    if plan == previous:
        raise RuntimeError(  # the plan's type only: its arguments may hold a tool's secrets
            f"recovery made no progress: the planner repeats its {plan['type']} plan after it was committed"
        )
    facts = facts_for_plan(state, plan, current)
    if not facts:  # pragma: no cover - every effect-free plan of a running operation writes something
        raise RuntimeError(f"the {plan['type']} plan of a running operation gave no facts")
    return plan, facts


def recover(
    store: Store,
    current: Mapping[str, Any],
    *,
    on_commit: OnCommit | None = None,
    in_order: bool = False,
    hold: Hold | None = None,
) -> Plan:
    """Commit every plan that needs no external effect; return the first one that needs the
    caller (`startStep`, `startTool`, `blocked`, or the idle `finish`), or that `hold` holds.
    `in_order`: plan with `plan_in_order` (a pending call settled before a later one starts)
    instead of `plan_recovery`.

    Each effect-free plan is one transaction; `on_commit(plan, committed)` sees each. Idempotent:
    a second call commits nothing and returns the same plan. A transaction the reducer refuses
    raises ValidationError (nothing of it is written; earlier ones stay committed)."""
    previous: Plan | None = None
    while True:
        plan, facts = _next(store.load(), current, previous, in_order, hold)
        if not facts:
            return plan
        committed = store.commit(facts)
        if on_commit is not None:
            on_commit(plan, committed)
        previous = plan


async def recover_async(
    store: AsyncStore,
    current: Mapping[str, Any],
    *,
    on_commit: OnCommit | None = None,
    in_order: bool = False,
    hold: Hold | None = None,
) -> Plan:
    """`recover` for an AsyncSessionStore."""
    previous: Plan | None = None
    while True:
        plan, facts = _next(await store.load(), current, previous, in_order, hold)
        if not facts:
            return plan
        committed = await store.commit(facts)
        if on_commit is not None:
            on_commit(plan, committed)
        previous = plan
