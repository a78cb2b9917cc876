"""The labels adapters put on the sessions they create, so that the CLI can tell them apart
without importing a framework (`cli.repos` reads `TOOL_LEDGER`)."""

from __future__ import annotations

TOOL_LEDGER = "sessionlog:tool-ledger"
"""A session that is a tool ledger (`adapters.langgraph_tools`): its user entries are the
ledger's own markers, not prompts, so `sessionlog ls` shows no title for it."""

LANGGRAPH_THREAD = "langgraph-thread:"
"""The prefix of the label naming the LangGraph thread a tool ledger is of."""


def thread_label(thread_id: str) -> str:
    """The label of the tool ledger of LangGraph thread `thread_id`."""
    return f"{LANGGRAPH_THREAD}{thread_id}"
