"""The shapes the reducer checks: which keys each fact, entry, record and message may have, the
fixed texts and sets of the contract, and the header (contract sections 2-7). Pure data and
small pure checks; the rules that need the session's state are in `entries` and `records`."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from .canonical import MAX_SAFE_INTEGER
from .errors import ContractError, shown

UUID7 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}").fullmatch

DIGEST = re.compile(r"sha256:[0-9a-f]{64}").fullmatch

# ECMAScript's WhiteSpace and LineTerminator: "non-blank" means what String.prototype.trim keeps.
BLANK = "\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"  # noqa: E501

# The user entry a tool ledger (adapters.langgraph_tools) starts each of its runs with: its
# marker, not a prompt (`sessionlog ls` titles a ledger "(tool ledger)", by its label).
LEDGER_MARKER_PREFIX = "[sessionlog tool ledger] "

SYNTHETIC_CONTENT = {
    "invalidArguments": "Error: Tool arguments were invalid; the tool was not executed.",
    "unknownTool": "Error: Unknown tool; the tool was not executed.",
    "truncated": "Error: Tool call arguments were truncated by the model token limit; the tool was not executed.",  # noqa: E501
    "aborted": "Operation aborted before execution.",
    "interrupted": "Operation interrupted after execution status became unknown; the tool was not replayed.",
}

PRE_EXECUTION_REASONS = frozenset(("invalidArguments", "unknownTool", "truncated", "aborted"))

HEADER_KEYS = frozenset(
    ("kind", "version", "id", "createdAt", "cwd", "provider", "model", "environmentIdentity")
)

ENTRY_FACT = frozenset(("kind", "seq", "id", "timestamp", "entry"))

RECORD_FACT = frozenset(("kind", "seq", "id", "timestamp", "record"))

USAGE_FACT = frozenset(
    ("kind", "seq", "id", "timestamp", "operationId", "attemptId", "toolStartedId", "usage")
)

USER_ENTRY = frozenset(("type", "message"))

ASSISTANT_ENTRY = frozenset(("type", "stepId", "attemptId", "stopReason", "message"))

STARTED_RESULT_ENTRY = frozenset(("type", "stepId", "message", "toolName", "toolStartedId", "result"))

PRE_EXECUTION_ENTRY = frozenset(
    ("type", "stepId", "assistantEntryId", "toolIndex", "message", "toolName", "result")
)

COMPACTION_ENTRY = frozenset(("type", "operationId", "summary", "compactedThroughEntryId", "retainedTail"))

RESULT = frozenset(("type", "reason"))

RETAINED = frozenset(("sourceEntryId", "message"))

USER_MESSAGE = frozenset(("role", "content"))

ASSISTANT_MESSAGE = frozenset(("role", "content", "tool_calls"))

TOOL_MESSAGE = frozenset(("role", "content", "tool_call_id"))

TOOL_CALL = frozenset(("id", "type", "function"))

FUNCTION = frozenset(("name", "arguments"))

SNAPSHOT = frozenset(
    ("model", "systemPromptDigest", "tools", "adapterIdentity", "routingIdentity", "outputOptionsDigest")
)

SNAPSHOT_TOOL = frozenset(("name", "definitionDigest"))

ERROR = frozenset(("code", "message"))

USAGE = ("input", "output", "cacheRead", "cacheWrite")

USAGE_KEYS = frozenset(USAGE)

RECORD_KEYS = {
    "runStarted": frozenset(("type", "operationId", "operationKind", "inputEntryId")),
    "compactionStarted": frozenset(
        (
            "type",
            "operationId",
            "operationKind",
            "inputThroughEntryId",
            "resultEntryId",
            "compactedEntryIds",
            "retainedEntryIds",
            "sourceDigest",
        )
    ),
    "stepAttempt": frozenset(
        (
            "type",
            "operationId",
            "stepId",
            "attemptId",
            "stepKind",
            "attempt",
            "contextThroughEntryId",
            "configurationSnapshot",
            "configurationDigest",
        )
    ),
    "stepFailed": frozenset(("type", "operationId", "stepId", "attemptId", "error")),
    "toolStarted": frozenset(
        (
            "type",
            "operationId",
            "stepId",
            "assistantEntryId",
            "toolIndex",
            "toolCallId",
            "toolName",
            "arguments",
            "replay",
            "replayKey",
            "environmentIdentity",
            "resultEntryId",
        )
    ),
    "abortRequested": frozenset(("type", "operationId", "operationKind", "phase", "toolCallId", "reason")),
    "operationFinished": frozenset(
        ("type", "operationId", "operationKind", "outcome", "completion", "finalEntryId", "error")
    ),
}

# A validated configuration snapshot: (its digest, its normal form, the tool names it declares).
Snapshot = tuple[str, dict[str, Any], frozenset[str]]

SNAPSHOT_CACHE = 256  # distinct snapshot encodings remembered per session

# Reservation kinds: what a reserved id may later become.
IDENTITY, TOOL_RESULT, COMPACTION_RESULT = "identity", "toolResult", "compactionResult"


def fail(code: str, line: int, seq: int | None, detail: str) -> ContractError:
    return ContractError(code, line, seq, detail)


_KEY_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,23}")


def key_names(keys: Iterable[str]) -> str:
    """Unknown keys for a message: at most five, each cut short (a key may be a megabyte long)."""
    names = sorted(keys)
    # A key is a field's name, not a value: a short word is named (a typo, `enviroment_identity`),
    # anything longer or stranger bounded by `shown` (a 40-character key-shaped one stays hidden).
    shown_names = ", ".join(repr(name) if _KEY_WORD.fullmatch(name) else shown(name) for name in names[:5])
    return f"[{shown_names}{f' and {len(names) - 5} more' if len(names) > 5 else ''}]"


def is_uuid7(value: Any) -> bool:
    return type(value) is str and UUID7(value) is not None


def validate_header(value: Any, line: int = 1) -> dict[str, Any]:
    """The header line to the state's `header` object (contract section 2)."""
    if type(value) is not dict:
        raise fail("INVALID_HEADER", line, None, "the header is not an object")
    if not value.keys() <= HEADER_KEYS:
        raise fail(
            "INVALID_HEADER", line, None, f"unknown header keys {key_names(value.keys() - HEADER_KEYS)}"
        )
    if value.get("kind") != "header":
        raise fail("INVALID_HEADER", line, None, 'header kind is not "header"')
    version = value.get("version")
    if type(version) is not int or version != 2:
        raise fail("UNSUPPORTED_VERSION", line, None, f"version {shown(version)} is not 2")
    if not is_uuid7(value.get("id")):
        raise fail("INVALID_HEADER", line, None, "header id is not a UUIDv7")
    created = value.get("createdAt")
    if type(created) is not int or not 0 <= created <= MAX_SAFE_INTEGER:
        raise fail("INVALID_HEADER", line, None, "createdAt is not a safe integer")
    header = {"id": value["id"], "createdAt": created}
    for key in ("cwd", "provider", "model", "environmentIdentity"):
        text = value.get(key)
        if type(text) is not str or not text:
            raise fail("INVALID_HEADER", line, None, f"{key} is not a non-empty string")
        header[key] = text
    return header
