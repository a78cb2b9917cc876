from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared" / "contract" / "schemas" / "session"
FIXTURES = SHARED / "fixtures"
PLANNER_FIXTURES = SHARED / "planner-fixtures"
OWN_FIXTURES = Path(__file__).resolve().parent / "fixtures"

needs_shared = pytest.mark.skipif(
    not FIXTURES.is_dir(), reason=f"the shared contract fixtures are absent ({FIXTURES})"
)


def shared_manifest(folder: Path) -> list[dict[str, Any]]:
    """Manifest entries of a shared fixture folder; empty when ../shared is absent (tests skip)."""
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        return []
    return json.loads(manifest.read_text())["fixtures"]  # type: ignore[no-any-return]
