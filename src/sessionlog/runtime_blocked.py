"""A blocked run, as a value: why recovery cannot go on by itself, and the ways out.

Recovery is `blocked` when the answer of attempt 2 of a model call is unknown too
(`attempts_exhausted`), or when the configuration, the environment or a safe tool's replay
declaration changed under an open step or a pending tool. The runtime never guesses past it;
it offers three ways out:

* `restart`: end the run truthfully and ask its prompt again as a new run (`Run.restart()`);
* `end`: end the run truthfully (`Run.end()`): `abortRequested`, as `sessionlog abort` writes;
  an open model attempt is then closed with error `aborted` ("Operation aborted"), a pending
  tool is settled as *interrupted* and the rest as *aborted*, and the run finishes `aborted`
  (contract rule 2). No record claims a provider request failed;
* `keep`: leave it for a person (`sessionlog plan FILE`, `sessionlog abort FILE`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .core import facts as build
from .core.state import SessionState

EXPLANATIONS = {
    "attempts_exhausted": "the process died during attempt 2 of the same model call too: its answer is "
    "unknown and the contract allows no attempt 3",
    "configuration_changed": "the configuration (model, prompt, tools) differs from the one the open step "
    "or the pending tool was started with",
    "environment_changed": "the environment identity differs from the one the pending tool was started in",
    "replay_declaration_changed": "a pending tool recorded as safe to run again is no longer declared safe "
    "with the same replay key",
}

WAYS_OUT = {
    "restart": "run.restart(): end the run truthfully and ask its prompt again as a new run",
    "end": "run.end(): end the run truthfully (aborted), nothing more",
    "keep": "leave it for a person: sessionlog plan FILE, sessionlog abort FILE",
}


@dataclass(frozen=True)
class Blocked:
    """Why a run is blocked (`reason`, the contract's blocked reason; `explanation` in words)
    and the ways out (`ways_out`: `restart`, `end`, `keep`; see `WAYS_OUT`)."""

    reason: str
    explanation: str
    ways_out: tuple[str, ...] = ("restart", "end", "keep")
    plan: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, plan: Mapping[str, Any]) -> Blocked:
        reason = str(plan["reason"])
        return cls(reason, EXPLANATIONS.get(reason, "recovery needs a person"), plan=dict(plan))

    def __str__(self) -> str:
        ways = "; ".join(WAYS_OUT[way] for way in self.ways_out)
        return f"the run is blocked: {self.reason} ({self.explanation}); ways out: {ways}"


def end_facts(state: SessionState, blocked: Blocked) -> list[dict[str, Any]]:
    """The first transaction of `Run.end()`: `abortRequested` (phase `tool` naming the first
    pending call, else `model`), as `sessionlog abort` writes for the same state; recovery then
    closes an open attempt as `aborted`, settles a pending tool as *interrupted* and the rest as
    *aborted*, and finishes the run `aborted` (contract rule 2). Nothing claims a request failed:
    the blocked reason is the caller's to log (the contract's abort reason is always `escape`)."""
    operation = state.current_operation
    assert operation is not None  # a blocked plan is of a running operation
    pending = sorted(state.pending_tools, key=lambda tool: tool["toolIndex"])
    return [
        build.abort_requested(
            operation["operationId"],
            operation["kind"],
            "tool" if pending else "model",
            tool_call_id=pending[0]["toolCallId"] if pending else None,
        )
    ]


def run_prompt(state: SessionState) -> str:
    """The prompt of the current run, to ask again: its input, the latest user message."""
    for message in reversed(state.transcript):
        if message["role"] == "user" and isinstance(message.get("content"), str):
            return str(message["content"])
    raise ValueError("the run has no user message to ask again")  # pragma: no cover
