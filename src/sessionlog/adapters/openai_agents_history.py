"""`pop_item` and `clear_session` of the OpenAI Agents SDK adapter as compactions
(`openai_agents`'s docstring argues why).

A compaction (contract section 4) partitions every message entry through its input boundary
into a compacted part and a retained tail, and makes the active context one user message
(`"[Compacted history]\\n" + summary`) followed by the retained tail; the transcript keeps
everything. The adapter compacts every message entry and retains none; its summary is the
`SUMMARY_MARK` line and then the JSON array of the canonical messages that remain visible (none
for `clear_session`, all but the last for `pop_item`). `visible_messages` reads them back: the
messages of an adapter's summary, then whatever came after it. A compaction made by anyone else
is shown as what it is, a user message holding its summary.

The four facts (`compactionStarted`, its attempt, the compaction entry, `operationFinished`) are
one transaction: a crash leaves either no compaction or all of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from ..core import facts as build
from ..core.canonical import source_digest
from ..core.errors import SessionLogError
from ..core.state import SessionState
from ..tools import Configuration

COMPACTED = "[Compacted history]\n"
SUMMARY_MARK = "[sessionlog openai-agents: the items that remain, as JSON]"


class PopError(SessionLogError, ValueError):
    """`pop_item` of an item that cannot go alone (a tool output, whose call would be left
    unanswered): nothing was changed."""


def visible_messages(context: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages the SDK's items are made of: an adapter summary's messages, then the rest."""
    messages = [dict(message) for message in context]
    if messages and messages[0].get("role") == "user":
        content = messages[0].get("content")
        prefix = COMPACTED + SUMMARY_MARK + "\n"
        if isinstance(content, str) and content.startswith(prefix):
            kept = orjson.loads(content[len(prefix) :])
            return [dict(message) for message in kept] + messages[1:]
    return messages


def message_entries(store: Any) -> list[tuple[str, dict[str, Any]]]:
    """Every message entry of the store, `(entry id, message)`, in order (a sessionlog store's
    reducer holds them)."""
    inner = getattr(store, "store", store)  # the adapter's view of a sync store
    pipeline = getattr(inner, "_pipeline", None)
    reducer = getattr(pipeline, "reducer", None)
    if reducer is None:
        raise SessionLogError(
            "pop_item and clear_session need a sessionlog store (sessionlog.open / create), "
            f"not {type(inner).__name__}"
        )
    return [(entry_id, dict(reducer.entries[entry_id].message or {})) for entry_id in reducer.message_ids]


def compaction_facts(
    state: SessionState, configuration: Configuration, store: Any, *, pop: bool
) -> list[Any]:
    """The one transaction of a pop (`pop=True`) or a clear: a compaction of every message entry
    whose summary holds the messages that remain visible."""
    if not state.is_idle:
        raise SessionLogError("a compaction needs an idle session: end the run first")
    visible = visible_messages(state.active_context)
    if pop:
        if not visible:
            raise PopError("nothing to pop")
        if visible[-1]["role"] == "tool":
            raise PopError(
                f"the latest item is the output of call {visible[-1].get('tool_call_id')!r}: popped alone it "
                "would leave its call unanswered (the contract's transcript must stay legal)"
            )
        visible = visible[:-1]
    else:
        visible = []
    entries = message_entries(store)
    through = entries[-1][0]
    summary = SUMMARY_MARK + "\n" + orjson.dumps(visible).decode()
    started = build.compaction_started(
        through, [entry_id for entry_id, _ in entries], [], source_digest(entries)
    )
    record = started["record"]
    attempt = build.step_attempt(
        record["operationId"], through, configuration.snapshot, step_kind="compaction"
    )
    entry = build.compaction_entry(started, summary, through, [])
    finished = build.operation_finished(
        record["operationId"], "compaction", "completed", final_entry_id=record["resultEntryId"]
    )
    return [started, attempt, entry, finished]
