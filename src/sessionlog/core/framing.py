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

Two limits keep hostile input a CorruptionError instead of exhausted memory or a crashed
interpreter: a line longer than `max_line_bytes` (default 64 MiB) is refused before it is copied
or parsed, and a value nested deeper than `MAX_NESTING_DEPTH` arrays/objects is MALFORMED_JSON
(the contract sets no depth; without a fixed one the outcome of a very deep line would depend on
the caller's stack depth).

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

from .errors import CorruptionError, shown

DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024
# The deepest value orjson encodes: every line that reads can be written back (and the fast path
# below needs no depth check of its own); the state's recursive copies stay far from Python's
# recursion limit.
MAX_NESTING_DEPTH = 254
# The power-loss rule (`core.loading`): a NUL run is a hole only in whole 512-byte sectors (the
# smallest unit a drive writes) or from where the last write began; and the last write of a
# group-committing backend is at most NUL_WINDOW bytes (its batches are capped at that, a larger
# single transaction is written alone). Constants of the format, so that any reader reads any
# writer's log the same way.
SECTOR = 512
NUL_WINDOW = 4 << 20

# From this length on a line is parsed by the strict path straight from the file's buffer: its
# memory is then about the line's size once, not a copy plus a re-encoding.
LARGE_LINE = 1 << 20

_SURROGATE = re.compile(rb"\xed[\xa0-\xbf][\x80-\xbf]")
_UTF8_CHUNK = 1 << 20


def committed_length(data: bytes) -> int:
    """Byte length up to and including the last LF (the contract's `repairedLength`); 0 if none."""
    return data.rfind(b"\n") + 1


def line_of(data: bytes, offset: int) -> tuple[int, int]:
    """The 1-based line holding byte `offset`, and the offset where that line starts."""
    return data.count(b"\n", 0, offset) + 1, data.rfind(b"\n", 0, offset) + 1


def check_committed(data: bytes, end: int, start: int = 0) -> None:
    """Whole-prefix checks that precede the line-by-line ones: surrogates, then UTF-8.

    The strict decoder rejects encoded surrogates too, so a prefix that decodes holds none; only
    when decoding fails is the prefix searched for a surrogate, which is reported first.
    `start` (a line start): check only data[start:end], the rest being known good."""
    view = memoryview(data)
    first = start
    while start < end:
        stop = min(start + _UTF8_CHUNK, end)
        try:
            _, consumed = codecs.utf_8_decode(view[start:stop], "strict", stop == end)
        except UnicodeDecodeError as error:
            found = _SURROGATE.search(data, first, end)
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


def lines(
    data: bytes, end: int, max_line_bytes: int | None = None, *, start: int = 0, number: int = 1
) -> Iterator[tuple[int, int, bytes]]:
    """(line number, byte offset of the line, line bytes without the LF) for data[start:end]
    (`start` a line start, numbered `number`). A line longer than `max_line_bytes` is refused
    here, before it is copied; one longer than `LARGE_LINE` comes as a memoryview of `data`, not
    a copy."""
    find = data.find
    view = memoryview(data)
    while start < end:
        stop = find(b"\n", start, end)
        if stop - start > LARGE_LINE:
            if max_line_bytes is not None and stop - start > max_line_bytes:
                _refuse_long(number, start, stop - start, data[stop - 1] == 13, max_line_bytes)
            yield number, start, view[start:stop]  # type: ignore[misc]
        else:
            yield number, start, data[start:stop]
        start = stop + 1
        number += 1


def _refuse_long(line: int, offset: int, size: int, ends_in_cr: bool, max_line_bytes: int) -> None:
    if ends_in_cr:  # the contract checks CR before JSON
        raise CorruptionError("CRLF_NOT_ALLOWED", line, detail="line ends in CR", offset=offset)
    raise CorruptionError(
        "MALFORMED_JSON",
        line,
        detail=f"line of {size} bytes exceeds the maximum of {max_line_bytes}",
        offset=offset,
    )


def parse_line(raw: bytes, line: int, offset: int, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Any:
    """One committed line to its JSON value, or CorruptionError naming the line and its offset."""
    if not raw:
        raise CorruptionError("BLANK_LINE", line, detail="empty line", offset=offset)
    if len(raw) > max_line_bytes or raw[-1] == 13:
        _refuse_long(line, offset, len(raw), raw[-1] == 13, max_line_bytes)
    if len(raw) > LARGE_LINE:  # re-encoding to prove it free of duplicate keys would cost 2-3x its size
        return _parse_strict(raw, line, offset)
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _parse_strict(raw, line, offset)
    try:
        compact = orjson.dumps(value)
    except orjson.JSONEncodeError:  # nested deeper than MAX_NESTING_DEPTH: the strict path says so
        return _parse_strict(raw, line, offset)
    if compact != raw:
        return _parse_strict(raw, line, offset)
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        key = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise ValueError(f"duplicated object key {shown(key)}")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:40]} overflows a double")
    return value


def _check_value(value: Any) -> None:
    """Lone surrogates and nesting depth, without recursion."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if _LONE_SURROGATE.search(item):
                raise ValueError("escaped lone surrogate")
        elif isinstance(item, list | dict):
            depth += 1
            if depth > MAX_NESTING_DEPTH:
                raise ValueError(f"nesting deeper than {MAX_NESTING_DEPTH}")
            if isinstance(item, dict):
                stack.extend((key, depth) for key in item)
                stack.extend((child, depth) for child in item.values())
            else:
                stack.extend((child, depth) for child in item)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _parse_strict(raw: bytes, line: int, offset: int) -> Any:
    try:
        value = json.loads(
            str(raw, "utf-8"),
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
            parse_float=_finite,
        )
        _check_value(value)
    except (ValueError, RecursionError) as error:
        detail = (
            f"nesting deeper than {MAX_NESTING_DEPTH}" if isinstance(error, RecursionError) else str(error)
        )
        raise CorruptionError("MALFORMED_JSON", line, detail=detail, offset=offset) from error
    return value
