"""The shared golden fixtures of the v2 contract, read from ../shared (never copied here)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import sessionlog
from conftest import FIXTURES, PLANNER_FIXTURES, needs_shared, shared_manifest


def outcome(data: bytes) -> dict[str, Any]:
    try:
        return {"ok": True, "state": sessionlog.reduce_bytes(data).to_json()}
    except sessionlog.CorruptionError as error:
        return {"ok": False, "error": error.to_json()}


@needs_shared
@pytest.mark.parametrize("fixture", shared_manifest(FIXTURES), ids=lambda fixture: fixture["name"])
def test_reducer_fixture(fixture: dict[str, Any]) -> None:
    data = (FIXTURES / fixture["file"]).read_bytes()
    expected = json.loads((FIXTURES / fixture["expected"]).read_text())
    assert outcome(data) == expected


@needs_shared
@pytest.mark.parametrize("fixture", shared_manifest(PLANNER_FIXTURES), ids=lambda fixture: fixture["name"])
def test_planner_fixture(fixture: dict[str, Any]) -> None:
    case = json.loads((PLANNER_FIXTURES / fixture["input"]).read_text())
    state = sessionlog.reduce_bytes((FIXTURES / case["sessionFile"]).read_bytes())
    expected = json.loads((PLANNER_FIXTURES / fixture["expected"]).read_text())
    assert sessionlog.plan_recovery(state, case["current"]) == expected


@needs_shared
def test_every_fixture_is_listed() -> None:
    """A fixture file the manifest forgets would silently go untested."""
    listed = {fixture["file"] for fixture in shared_manifest(FIXTURES)}
    assert listed == {path.name for path in FIXTURES.glob("*.jsonl")}
