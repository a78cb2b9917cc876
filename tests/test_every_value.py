"""Every input ends in a state or a CorruptionError: each field of each fact of generated sessions,
replaced by a value of every JSON type, reduces or is refused; the reducer never raises anything
else (a differential fuzz against the tiny-agent ports once found `TypeError: unhashable type`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from sessionlog import CorruptionError, reduce_bytes
from sessionlog.testing.sessions import generate_session

# One value of each JSON type, the containers both empty and not.
VALUES: list[Any] = [{}, {"k": "v"}, [], ["x"], "text", "", 0, -1, 2.5, True, False, None]


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON value, its root excluded."""
    if type(value) is dict:
        for key, child in value.items():
            yield (*path, key)
            yield from _paths(child, (*path, key))
    elif type(value) is list:
        for index, child in enumerate(value):
            yield (*path, index)
            yield from _paths(child, (*path, index))


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if type(value) is dict else list(value)
    copy[path[0]] = _replaced(value[path[0]], path[1:], new)
    return copy


@pytest.mark.parametrize(("seed", "profile"), [(1, "mixed"), (2, "mixed"), (3, "mixed"), (4, "bulk")])
def test_every_field_with_every_json_type_reduces_or_is_corruption(seed: int, profile: str) -> None:
    lines = generate_session(seed, 50, profile=profile).lines()
    checked = 0
    for index in range(1, len(lines)):
        value = orjson.loads(lines[index])
        before, after = b"".join(lines[:index]), b"".join(lines[index + 1 :])
        for path in _paths(value):
            for new in VALUES:
                mutated = orjson.dumps(_replaced(value, path, new)) + b"\n"
                try:
                    reduce_bytes(before + mutated + after)
                except CorruptionError:
                    pass
                except Exception as error:  # pragma: no cover - what the test is for
                    pytest.fail(f"line {index + 1}, {path} = {new!r}: {type(error).__name__}: {error}")
                checked += 1
    assert checked > 1000
