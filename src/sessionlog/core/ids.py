"""Fact ids: lowercase UUIDv7 strings (an id's clock is never read back as time)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_uuid7: Callable[[], Any] | None = None


def new_id() -> str:
    """A fresh UUIDv7, e.g. to reserve an id that a later fact of the same transaction names."""
    global _uuid7
    if _uuid7 is None:  # uuid6 pulls in importlib.metadata: loaded on the first id, not at import
        from uuid6 import uuid7

        _uuid7 = uuid7
    return str(_uuid7())
