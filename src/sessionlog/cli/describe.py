"""Plans and states in words, for people."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from .output import compact

BLOCKED = {
    "configuration_changed": "the configuration differs from the one the step or the pending tool was "
    "started with",
    "environment_changed": "the environment identity differs from the pending tool's",
    "replay_declaration_changed": "a pending safe tool is no longer declared safe with the same replay key",
    "attempts_exhausted": "attempt 2 is open: its answer is unknown and there is no attempt 3",
}


def describe_plan(plan: Mapping[str, Any], *, idle: bool = False) -> str:
    """One line for a plan, for people."""
    kind = plan["type"]
    if kind == "finish":
        if idle:
            return "nothing to do: the session is idle"
        text = f"finish {plan['outcome']}"
        if "completion" in plan:
            text += f" ({plan['completion']})"
        if "finalEntryId" in plan:
            text += f", final entry {plan['finalEntryId']}"
        if "error" in plan:
            text += f", error {plan['error'].get('code')}: {plan['error'].get('message')}"
        return text
    if kind == "startStep":
        text = (
            f"startStep attempt {plan['attempt']} ({plan['stepKind']}), "
            f"context through {plan['contextThroughEntryId']}"
        )
        if "stepId" in plan:
            text += f", step {plan['stepId']}"
        return text + ": the caller makes the model request"
    if kind == "startTool":
        text = (
            f"startTool {plan['mode']} {plan['toolName']} (call {plan['toolIndex']}) "
            f"{compact(plan['arguments'])}"
        )
        if plan["mode"] == "replay":
            text += f", intent {plan['toolStartedId']}: the caller runs the safe read again"
        else:
            text += ": the caller writes the intent, then runs the tool"
        return text
    if kind == "appendSynthetic":
        parts = [
            f"{result['reason']} {result['toolName']} (call {result['toolIndex']})"
            for result in plan["results"]
        ]
        return "appendSynthetic " + ", ".join(parts)
    if kind == "closeAttempt":
        return f"closeAttempt: {plan['error'].get('code')}: {plan['error'].get('message')}"
    if kind == "blocked":
        return f"blocked: {plan['reason']} ({BLOCKED.get(plan['reason'], 'needs a human')})"
    return compact(plan)


def seqs_text(committed: Sequence[Mapping[str, Any]]) -> str:
    first, last = committed[0]["seq"], committed[-1]["seq"]
    return f"seq {first}" if first == last else f"seq {first}-{last}"


def created_text(ms: int) -> str:
    try:
        return (
            datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        )
    except (OverflowError, OSError, ValueError):
        return str(ms)


def counter_text(counter: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in counter.items())
