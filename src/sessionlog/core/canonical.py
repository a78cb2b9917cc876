"""Canonical JSON and the contract's digests (contract section 9).

Canonical form: object keys sorted by UTF-16 code units, arrays in order, compact separators,
strings as JSON with non-ASCII kept as UTF-8, lone surrogates rejected, integers written plainly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from .errors import shown

MAX_SAFE_INTEGER = 2**53 - 1


def _utf16(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def _encode(value: Any, out: list[bytes], strings_only: bool) -> None:
    kind = type(value)
    if kind is str:
        try:
            out.append(orjson.dumps(value))
        except orjson.JSONEncodeError as error:
            raise ValueError("lone surrogate in a string") from error
    elif kind is dict:
        out.append(b"{")
        first = True
        for key in sorted(value, key=_utf16):
            if type(key) is not str:
                raise ValueError(f"object key {shown(key)} is not a string")
            if not first:
                out.append(b",")
            first = False
            _encode(key, out, strings_only)
            out.append(b":")
            _encode(value[key], out, strings_only)
        out.append(b"}")
    elif kind is list:
        out.append(b"[")
        for index, item in enumerate(value):
            if index:
                out.append(b",")
            _encode(item, out, strings_only)
        out.append(b"]")
    elif strings_only:
        raise ValueError(f"{kind.__name__} is outside the snapshot domain (objects, arrays, strings)")
    elif value is None or kind is bool:
        out.append(orjson.dumps(value))
    elif kind is int:
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise ValueError(f"integer {value} is not a safe integer")
        out.append(str(value).encode())
    else:
        raise ValueError(f"{kind.__name__} has no canonical form")


def _plain(value: Any, strings_only: bool) -> bool:
    """Whether orjson's sorted encoding is already canonical: every key ASCII (so code-point
    order is UTF-16 order), every number a safe integer, nothing outside JSON. False sends the
    value down the exact, slower path, which also names what is wrong."""
    stack = [value]
    pop, push = stack.pop, stack.append
    while stack:
        item = pop()
        kind = type(item)
        if kind is str:
            continue
        if kind is dict:
            for key, child in item.items():
                if type(key) is not str or not key.isascii():
                    return False
                push(child)
        elif kind is list:
            stack.extend(item)
        elif strings_only:
            return False
        elif item is None or kind is bool:
            continue
        elif kind is not int or not -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
            return False
    return True


def canonical(value: Any, *, strings_only: bool = False) -> bytes:
    """The canonical encoding of `value`; ValueError for anything outside the domain."""
    if _plain(value, strings_only):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError as error:  # a lone surrogate, or nesting orjson refuses
            raise ValueError(f"no canonical form: {error}") from None
    out: list[bytes] = []
    _encode(value, out, strings_only)
    return b"".join(out)


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def configuration_digest(snapshot: Mapping[str, Any]) -> str:
    """`configurationDigest` of a configuration snapshot (objects, arrays and strings only)."""
    return digest(canonical(dict(snapshot), strings_only=True))


def source_digest(messages: Iterable[tuple[str, Mapping[str, Any]]]) -> str:
    """Compaction `sourceDigest` of (entry id, message) pairs, every message through the boundary."""
    items = [{"sourceEntryId": entry_id, "message": message} for entry_id, message in messages]
    return digest(canonical(items))
