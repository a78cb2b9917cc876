"""Fact ids: lowercase UUIDv7 strings (an id's clock is never read back as time)."""

from __future__ import annotations

import uuid6


def new_id() -> str:
    """A fresh UUIDv7, e.g. to reserve an id that a later fact of the same transaction names."""
    return str(uuid6.uuid7())
