"""Recovery planning (contract section 11): a state and the current configuration to one action.

Pure and deterministic: it never executes an effect, allocates an id or writes. The first
matching rule wins. The rule behind tool recovery: an intent without a result means the effect
may have happened and its result is unknown, so only a declared-safe read in the same
environment is ever run again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

import orjson

from .. import schema
from .errors import ConfigurationError, shown
from .reducer import SYNTHETIC_CONTENT
from .state import SessionState, copy_json

Plan = dict[str, Any]

ABORT_ERROR = {"code": "aborted", "message": "Operation aborted"}
MODEL_ERROR = {"code": "model_error", "message": "provider request failed"}


_CURRENT_KEYS = frozenset(("configurationDigest", "environmentIdentity", "tools"))
_TOOL_KEYS = frozenset(("name", "definitionDigest", "replay", "replayKey"))
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}").fullmatch


def check_current(current: Any) -> None:
    """The current configuration's shape (`current-configuration.schema.json`), or
    ConfigurationError naming the first bad key: the planner never plans from a malformed one."""
    if not isinstance(current, Mapping):
        raise ConfigurationError("the configuration", f"is {shown(current)}, not an object")
    for key in sorted(_CURRENT_KEYS - current.keys()):
        raise ConfigurationError(key, "is missing")
    for key in sorted(current.keys() - _CURRENT_KEYS, key=str):
        raise ConfigurationError(shown(key), "is not a key of the current configuration")
    if type(current["configurationDigest"]) is not str or not _DIGEST(current["configurationDigest"]):
        raise ConfigurationError("configurationDigest", "is not sha256:<64 lowercase hex>")
    if type(current["environmentIdentity"]) is not str or not current["environmentIdentity"]:
        raise ConfigurationError("environmentIdentity", "is not a non-empty string")
    if type(current["tools"]) is not list:
        raise ConfigurationError("tools", "is not an array")
    names: set[str] = set()
    for index, tool in enumerate(current["tools"]):
        where = f"tools[{index}]"
        if not isinstance(tool, Mapping):
            raise ConfigurationError(where, "is not an object")
        for key in sorted(_TOOL_KEYS - tool.keys()):
            raise ConfigurationError(f"{where}.{key}", "is missing")
        for key in sorted(tool.keys() - _TOOL_KEYS, key=str):
            raise ConfigurationError(f"{where}.{shown(key)}", "is not a key of a declared tool")
        if type(tool["name"]) is not str or not tool["name"]:
            raise ConfigurationError(f"{where}.name", "is not a non-empty string")
        if tool["name"] in names:
            raise ConfigurationError(f"{where}.name", f"{shown(tool['name'])} is declared twice")
        names.add(tool["name"])
        if type(tool["definitionDigest"]) is not str or not _DIGEST(tool["definitionDigest"]):
            raise ConfigurationError(f"{where}.definitionDigest", "is not sha256:<64 lowercase hex>")
        if tool["replay"] not in ("safe", "never"):
            raise ConfigurationError(f"{where}.replay", f"is {shown(tool['replay'])}, not safe or never")
        if type(tool["replayKey"]) is not str or not tool["replayKey"]:
            raise ConfigurationError(f"{where}.replayKey", "is not a non-empty string")


def _declared(current: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    for tool in current["tools"]:
        if tool.get("name") == name:
            return tool  # type: ignore[no-any-return]
    return None


def _synthetic(
    assistant_id: str, index: int, call: Mapping[str, Any], reason: str, tool: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "assistantEntryId": assistant_id,
        "toolIndex": index,
        "toolCallId": call["id"],
        "toolName": call["function"]["name"],
    }
    if tool is not None:
        result["toolStartedId"] = tool["toolStartedId"]
        result["resultEntryId"] = tool["resultEntryId"]
    result["reason"] = reason
    result["content"] = SYNTHETIC_CONTENT[reason]
    return result


def _parsed_arguments(text: str) -> dict[str, Any] | None:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return value if type(value) is dict else None


def plan_recovery(state: SessionState, current: Mapping[str, Any]) -> schema.Plan:
    """The one next action for `state` under the `current` configuration: a plan of the
    contract's recovery-plan form (`sessionlog.schema.Plan`, a union keyed on `type`).
    ConfigurationError when `current` is malformed (it names the bad key)."""
    check_current(current)
    return cast(schema.Plan, _plan(state, current))


def _plan(state: SessionState, current: Mapping[str, Any]) -> Plan:
    operation = state.operation
    if operation["kind"] == "idle":
        return {"type": "finish", "outcome": "completed", "completion": "normal"}
    step = operation.get("step")
    settled_id = state.settled_entry_id
    calls = state.settled_calls
    tools = operation.get("toolCalls", [])
    by_index = {tool["toolIndex"]: tool for tool in tools if tool["assistantEntryId"] == settled_id}

    if operation["abortRequested"]:
        if step is not None and step["status"] == "attempting":
            return {"type": "closeAttempt", "error": dict(ABORT_ERROR)}
        results = []
        for index, call in enumerate(calls):
            tool = by_index.get(index)
            if tool is not None and tool["status"] == "pending":
                results.append(_synthetic(settled_id or "", index, call, "interrupted", tool))
            elif not state.has_outcome(index):
                results.append(_synthetic(settled_id or "", index, call, "aborted"))
        if results:
            return {"type": "appendSynthetic", "results": results}
        return {"type": "finish", "outcome": "aborted"}

    if step is None:
        if operation["kind"] == "run":
            return {
                "type": "startStep",
                "stepKind": "assistant",
                "attempt": 1,
                "contextThroughEntryId": operation["inputEntryId"],
            }
        return {
            "type": "startStep",
            "stepKind": "compaction",
            "attempt": 1,
            "contextThroughEntryId": operation["inputThroughEntryId"],
        }
    if step["status"] == "failed":
        return {"type": "finish", "outcome": "failed", "error": dict(MODEL_ERROR)}
    if step["status"] == "attempting":
        if step["attempt"] == 2:
            return {"type": "blocked", "reason": "attempts_exhausted"}
        if step["configurationDigest"] != current["configurationDigest"]:
            return {"type": "blocked", "reason": "configuration_changed"}
        return {
            "type": "startStep",
            "stepKind": step["stepKind"],
            "attempt": 2,
            "stepId": step["stepId"],
            "contextThroughEntryId": step["contextThroughEntryId"],
        }
    if operation["kind"] == "compaction":
        return {"type": "finish", "outcome": "completed", "finalEntryId": operation["resultEntryId"]}

    assistant_id = step["settledEntryId"]
    if step.get("stopReason") == "length" and calls:
        results = [
            _synthetic(assistant_id, index, call, "truncated")
            for index, call in enumerate(calls)
            if not state.has_outcome(index)
        ]
        if results:
            return {"type": "appendSynthetic", "results": results}
        return {
            "type": "finish",
            "outcome": "completed",
            "completion": "truncated",
            "finalEntryId": assistant_id,
        }
    if not calls:
        return {
            "type": "finish",
            "outcome": "completed",
            "completion": "normal",
            "finalEntryId": assistant_id,
        }

    for index, call in enumerate(calls):
        if state.has_outcome(index):
            continue
        name = call["function"]["name"]
        if _declared(current, name) is None:
            return {
                "type": "appendSynthetic",
                "results": [_synthetic(assistant_id, index, call, "unknownTool")],
            }
        arguments = _parsed_arguments(call["function"]["arguments"])
        if arguments is None:
            return {
                "type": "appendSynthetic",
                "results": [_synthetic(assistant_id, index, call, "invalidArguments")],
            }
        return {
            "type": "startTool",
            "mode": "start",
            "assistantEntryId": assistant_id,
            "toolIndex": index,
            "toolName": name,
            "arguments": arguments,
        }

    pending = sorted(
        (tool for tool in tools if tool["status"] == "pending"), key=lambda tool: tool["toolIndex"]
    )
    if not pending:
        return {
            "type": "startStep",
            "stepKind": "assistant",
            "attempt": 1,
            "contextThroughEntryId": state.active_context_through,
        }
    return settle_pending_intent(pending[0], calls, current)


def settle_pending_intent(
    tool: Mapping[str, Any], calls: Sequence[Mapping[str, Any]], current: Mapping[str, Any]
) -> Plan:
    """Rule 11 for one pending intent (`tool`, of the assistant entry whose `calls` these are):
    blocked when its environment, its tool's declaration or its replay declaration changed; its
    replay when it is safe and declared so still; else its `interrupted` synthetic result."""
    if tool["environmentIdentity"] != current["environmentIdentity"]:
        return {"type": "blocked", "reason": "environment_changed"}
    declaration = _declared(current, tool["toolName"])
    if declaration is None or not declaration.get("definitionDigest"):
        return {"type": "blocked", "reason": "configuration_changed"}
    if (
        tool["replay"] == "safe"
        and declaration.get("replay") == "safe"
        and (tool["replayKey"] == declaration.get("replayKey"))
    ):
        return {
            "type": "startTool",
            "mode": "replay",
            "assistantEntryId": tool["assistantEntryId"],
            "toolIndex": tool["toolIndex"],
            "toolStartedId": tool["toolStartedId"],
            "toolName": tool["toolName"],
            "arguments": copy_json(tool["arguments"]),
        }
    if tool["replay"] == "safe":
        return {"type": "blocked", "reason": "replay_declaration_changed"}
    call = calls[tool["toolIndex"]]
    return {
        "type": "appendSynthetic",
        "results": [_synthetic(tool["assistantEntryId"], tool["toolIndex"], call, "interrupted", tool)],
    }
