"""Framing: session bytes to JSON values, one per LF-terminated line (contract section 1).

On-disk format::

    <header JSON> LF
    <transaction JSON: one fact object, or a non-empty array of facts> LF
    ...
    <torn tail: any bytes after the last LF; never committed, never parsed>

Checks run in the contract's order: no LF at all -> MISSING_HEADER; a UTF-8-encoded surrogate
(ED A0..BF xx) anywhere in the committed part -> MALFORMED_JSON at its line; other invalid UTF-8
-> INVALID_UTF8; an empty first line -> MISSING_HEADER; then line by line: BLANK_LINE,
CRLF_NOT_ALLOWED, MALFORMED_JSON (not JSON, NaN/Infinity, a number that overflows a double, a
duplicated key at any depth, an escaped lone surrogate).

The fast path parses with orjson and proves the line free of duplicate keys by re-encoding it: a
compact line that survives `dumps(loads(line)) == line` cannot hold one (equal text, equal syntax
tree, and a dict has no duplicates). Lines written by other encoders (spaces, escaped `/`, big
integers) take the strict stdlib path, which checks every rule explicitly.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from typing import Any

import orjson

from .errors import CorruptionError

DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024

_SURROGATE = re.compile(rb"\xed[\xa0-\xbf][\x80-\xbf]")
_UTF8_CHUNK = 1 << 20


def committed_length(data: bytes) -> int:
    """Byte length up to and including the last LF (the contract's `repairedLength`); 0 if none."""
    return data.rfind(b"\n") + 1


def line_of(data: bytes, offset: int) -> tuple[int, int]:
    """The 1-based line holding byte `offset`, and the offset where that line starts."""
    return data.count(b"\n", 0, offset) + 1, data.rfind(b"\n", 0, offset) + 1


def check_committed(data: bytes, end: int) -> None:
    """Whole-prefix checks that precede the line-by-line ones: surrogates, then UTF-8.

    The strict decoder rejects encoded surrogates too, so a prefix that decodes holds none; only
    when decoding fails is the prefix searched for a surrogate, which is reported first."""
    view = memoryview(data)
    start = 0
    while start < end:
        stop = min(start + _UTF8_CHUNK, end)
        try:
            _, consumed = codecs.utf_8_decode(view[start:stop], "strict", stop == end)
        except UnicodeDecodeError as error:
            found = _SURROGATE.search(data, 0, end)
            if found is not None:
                line, begin = line_of(data, found.start())
                raise CorruptionError(
                    "MALFORMED_JSON", line, detail="UTF-8-encoded surrogate code point", offset=begin
                ) from None
            bad = start + error.start
            line, begin = line_of(data, bad)
            raise CorruptionError(
                "INVALID_UTF8", line, detail=f"invalid UTF-8 at byte {bad}", offset=begin
            ) from error
        start += consumed  # a character cut by the chunk's end is decoded with the next chunk


def lines(data: bytes, end: int) -> Iterator[tuple[int, int, bytes]]:
    """(line number, byte offset of the line, line bytes without the LF) for data[:end]."""
    find = data.find
    start = 0
    number = 1
    while start < end:
        stop = find(b"\n", start, end)
        yield number, start, data[start:stop]
        start = stop + 1
        number += 1


def parse_line(raw: bytes, line: int, offset: int, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Any:
    """One committed line to its JSON value, or CorruptionError naming the line and its offset."""
    if not raw:
        raise CorruptionError("BLANK_LINE", line, detail="empty line", offset=offset)
    if raw[-1] == 13:
        raise CorruptionError("CRLF_NOT_ALLOWED", line, detail="line ends in CR", offset=offset)
    if len(raw) > max_line_bytes:
        raise CorruptionError(
            "MALFORMED_JSON",
            line,
            detail=f"line of {len(raw)} bytes exceeds the maximum of {max_line_bytes}",
            offset=offset,
        )
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _parse_strict(raw, line, offset)
    if orjson.dumps(value) != raw:
        return _parse_strict(raw, line, offset)
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        key = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise ValueError(f"duplicated object key {key!r}")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:40]} overflows a double")
    return value


def _has_lone_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _LONE_SURROGATE.search(item):
                return True
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
    return False


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _parse_strict(raw: bytes, line: int, offset: int) -> Any:
    try:
        value = json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
            parse_float=_finite,
        )
        if _has_lone_surrogate(value):
            raise ValueError("escaped lone surrogate")
    except (ValueError, RecursionError) as error:
        detail = "nesting too deep" if isinstance(error, RecursionError) else str(error)
        raise CorruptionError("MALFORMED_JSON", line, detail=detail, offset=offset) from error
    return value
