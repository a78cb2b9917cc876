"""Typed forms of what sessionlog exchanges with a framework: recovery plans (a union keyed on
`type`), the current configuration, and the facts a caller commits. The values are plain dicts
at run time; these types let mypy (and editors) check the keys and the fixed strings.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

Replay = Literal["safe", "never"]
Phase = Literal["model", "tool", "compact"]
Outcome = Literal["completed", "aborted", "failed"]
Completion = Literal["normal", "truncated"]
StepKind = Literal["assistant", "compaction"]
BlockedReason = Literal[
    "configuration_changed", "environment_changed", "replay_declaration_changed", "attempts_exhausted"
]
SyntheticReason = Literal["invalidArguments", "unknownTool", "truncated", "aborted", "interrupted"]


class ErrorInfo(TypedDict):
    code: str
    message: str


# -- plans (contract section 11) ----------------------------------------------------------------


class FinishPlan(TypedDict):
    type: Literal["finish"]
    outcome: Outcome
    completion: NotRequired[Completion]
    finalEntryId: NotRequired[str]
    error: NotRequired[ErrorInfo]


class StartStepPlan(TypedDict):
    type: Literal["startStep"]
    stepKind: StepKind
    attempt: int
    contextThroughEntryId: str
    stepId: NotRequired[str]


class StartToolPlan(TypedDict):
    type: Literal["startTool"]
    mode: Literal["start", "replay"]
    assistantEntryId: str
    toolIndex: int
    toolName: str
    arguments: dict[str, Any]
    toolStartedId: NotRequired[str]


class SyntheticResult(TypedDict):
    assistantEntryId: str
    toolIndex: int
    toolCallId: str
    toolName: str
    toolStartedId: NotRequired[str]
    resultEntryId: NotRequired[str]
    reason: SyntheticReason
    content: str


class AppendSyntheticPlan(TypedDict):
    type: Literal["appendSynthetic"]
    results: list[SyntheticResult]


class CloseAttemptPlan(TypedDict):
    type: Literal["closeAttempt"]
    error: ErrorInfo


class BlockedPlan(TypedDict):
    type: Literal["blocked"]
    reason: BlockedReason


Plan = FinishPlan | StartStepPlan | StartToolPlan | AppendSyntheticPlan | CloseAttemptPlan | BlockedPlan


# -- the current configuration --------------------------------------------------------------------


class CurrentTool(TypedDict):
    name: str
    definitionDigest: str
    replay: Replay
    replayKey: str


class CurrentConfiguration(TypedDict):
    configurationDigest: str
    environmentIdentity: str
    tools: list[CurrentTool]


# -- facts as a caller commits them (the store adds seq and timestamp, and id when absent) -------


class EntryFact(TypedDict):
    kind: Literal["entry"]
    entry: dict[str, Any]
    id: NotRequired[str]


class RecordFact(TypedDict):
    kind: Literal["record"]
    record: dict[str, Any]
    id: NotRequired[str]


class UsageCounts(TypedDict):
    input: int
    output: int
    cacheRead: int
    cacheWrite: int


class UsageFact(TypedDict):
    kind: Literal["usage"]
    operationId: str
    usage: UsageCounts
    attemptId: NotRequired[str]
    toolStartedId: NotRequired[str]
    id: NotRequired[str]


Fact = EntryFact | RecordFact | UsageFact
