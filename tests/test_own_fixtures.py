"""sessionlog's own reducer fixtures (tests/fixtures, written by tests/fixtures/make_fixtures.py).

Same form as the shared golden fixtures, plus `offset` (the failing line's first byte) on errors.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import sessionlog
from conftest import OWN_FIXTURES, SHARED, needs_shared
from sessionlog.core.errors import CODES

MANIFEST = json.loads((OWN_FIXTURES / "manifest.json").read_text())["fixtures"]

# Fixtures whose contract-derived expectation the reducer does not meet (see the reasons).
DISAGREEMENTS: dict[str, str] = {}  # fixture name -> why the reducer is known to differ


def outcome(data: bytes) -> dict[str, Any]:
    try:
        return {"ok": True, "state": sessionlog.reduce_bytes(data).to_json()}
    except sessionlog.CorruptionError as error:
        return {"ok": False, "error": {**error.to_json(), "offset": error.offset}}


def _cases() -> list[Any]:
    return [
        pytest.param(
            fixture,
            id=fixture["name"],
            marks=[pytest.mark.xfail(strict=True, reason=DISAGREEMENTS[fixture["name"]])]
            if fixture["name"] in DISAGREEMENTS
            else [],
        )
        for fixture in MANIFEST
    ]


@pytest.mark.parametrize("fixture", _cases())
def test_own_fixture(fixture: dict[str, Any]) -> None:
    data = (OWN_FIXTURES / fixture["file"]).read_bytes()
    expected = json.loads((OWN_FIXTURES / fixture["expected"]).read_text(encoding="utf-8"))
    assert outcome(data) == expected


def test_every_error_code_is_covered() -> None:
    codes = set()
    for fixture in MANIFEST:
        expected = json.loads((OWN_FIXTURES / fixture["expected"]).read_text(encoding="utf-8"))
        if not expected["ok"] and fixture["name"] not in DISAGREEMENTS:
            codes.add(expected["error"]["code"])
    assert codes == set(CODES)


def test_the_manifest_lists_every_file() -> None:
    listed = {fixture["file"] for fixture in MANIFEST} | {fixture["expected"] for fixture in MANIFEST}
    on_disk = {path.name for path in OWN_FIXTURES.glob("*.jsonl")} | {
        path.name for path in OWN_FIXTURES.glob("*.expected.json")
    }
    assert listed == on_disk
    assert len({fixture["name"] for fixture in MANIFEST}) == len(MANIFEST)


def _maker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_fixtures", OWN_FIXTURES / "make_fixtures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fixtures_regenerate_identically(tmp_path: Path) -> None:
    """The committed files are exactly what make_fixtures.py writes (fixed ids, no clock)."""
    written = _maker().write(tmp_path)
    assert sorted(written) == sorted(path.name for path in tmp_path.iterdir())
    for name in written:
        assert (tmp_path / name).read_bytes() == (OWN_FIXTURES / name).read_bytes(), name


# -- against the shared schemas (when ../shared is there) ----------------------------------


def _validator(schema: dict[str, Any]) -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    return jsonschema.Draft202012Validator(schema)


@needs_shared
def test_manifest_and_expectations_follow_the_shared_schemas() -> None:
    manifest = _validator(json.loads((SHARED / "fixtures" / "manifest.schema.json").read_text()))
    manifest.validate(json.loads((OWN_FIXTURES / "manifest.json").read_text()))
    expected_state = _validator(json.loads((SHARED / "expected-state.schema.json").read_text()))
    for fixture in MANIFEST:
        expected = json.loads((OWN_FIXTURES / fixture["expected"]).read_text(encoding="utf-8"))
        if not expected["ok"]:
            offset = expected["error"].pop("offset")  # our extension
            assert isinstance(offset, int) and offset >= 0
        expected_state.validate(expected)


def _strict_json(line: str) -> Any:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        if len({key for key, _ in items}) != len(items):
            raise ValueError("duplicate key")
        return dict(items)

    def constant(name: str) -> Any:
        raise ValueError(name)

    value = json.loads(line, object_pairs_hook=pairs, parse_constant=constant)
    json.dumps(value, ensure_ascii=False).encode("utf-8")  # a lone surrogate does not encode
    return value


def schema_valid(data: bytes, header: Any, transaction: Any) -> bool:
    """Every committed non-empty line is strict JSON that validates (line 1 as the header, the
    others as transactions); a file without a first line is not."""
    end = data.rfind(b"\n") + 1
    if end == 0 or data[0] == 0x0A:
        return False
    try:
        text = data[:end].decode("utf-8")
    except UnicodeDecodeError:
        return False
    for number, line in enumerate(text.split("\n")[:-1], 1):
        if not line:
            continue
        try:
            value = _strict_json(line)
        except (ValueError, UnicodeEncodeError):
            return False
        if not (header if number == 1 else transaction).is_valid(value):
            return False
    return True


@needs_shared
def test_schema_valid_flags() -> None:
    schema = json.loads((SHARED.parent / "session.schema.json").read_text())
    base = {key: value for key, value in schema.items() if key != "oneOf"}
    header = _validator({**base, "$ref": "#/$defs/header"})
    transaction = _validator({**base, "$ref": "#/$defs/transaction"})
    for fixture in MANIFEST:
        data = (OWN_FIXTURES / fixture["file"]).read_bytes()
        assert schema_valid(data, header, transaction) == fixture["schemaValid"], fixture["name"]
