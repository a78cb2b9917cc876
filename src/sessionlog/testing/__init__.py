"""The invariant suite every backend must pass, importable by third-party backends.

    from sessionlog.testing import StoreContract

    class TestMine(StoreContract):
        backend = "mine"

The suite needs pytest; its names load on first use, so `sessionlog.testing.sessions` (the
session generator) imports without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .suite import (
        SNAPSHOT,
        AsyncStoreContract,
        ContractBase,
        RecordingOps,
        Script,
        StoreContract,
        agent_turn,
        committed_lines,
        contract_classes,
        stored_facts,
    )

__all__ = [
    "SNAPSHOT",
    "AsyncStoreContract",
    "ContractBase",
    "RecordingOps",
    "Script",
    "StoreContract",
    "agent_turn",
    "committed_lines",
    "contract_classes",
    "stored_facts",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(".suite", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
