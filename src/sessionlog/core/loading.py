"""Bytes to state: framing, then the reducer, line by line (the read path of every backend)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import ContractError, CorruptionError
from .framing import DEFAULT_MAX_LINE_BYTES, check_committed, committed_length, lines, parse_line
from .reducer import Reducer, validate_header
from .state import SessionState


@contextmanager
def gc_paused() -> Iterator[None]:
    """Bulk reduction allocates many small containers that all stay alive: the collector would
    scan them again and again for nothing."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load(
    data: bytes, *, path: str | Path | None = None, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> tuple[Reducer, int]:
    """Reduce `data`; return the live reducer and the committed length (`repairedLength`)."""
    try:
        return _load(data, max_line_bytes)
    except CorruptionError as error:
        if path is None:
            raise
        raise error.located(path) from error.__cause__


def _load(data: bytes, max_line_bytes: int) -> tuple[Reducer, int]:
    end = committed_length(data)
    if end == 0:
        raise CorruptionError("MISSING_HEADER", 1, detail="no complete line: no LF in the file", offset=0)
    check_committed(data, end)
    if data[0] == 0x0A:
        raise CorruptionError("MISSING_HEADER", 1, detail="the first line is empty", offset=0)
    numbered = lines(data, end)
    _, _, raw = next(numbered)
    try:
        reducer = Reducer(validate_header(parse_line(raw, 1, 0, max_line_bytes)))
    except ContractError as error:
        if isinstance(error, CorruptionError):
            raise
        raise CorruptionError(error.code, 1, None, error.detail, offset=0) from None
    apply = reducer.apply
    with gc_paused():
        for number, offset, raw in numbered:
            value = parse_line(raw, number, offset, max_line_bytes)
            try:
                apply(value, number)
            except ContractError as error:
                raise CorruptionError(
                    error.code, error.line, error.seq, error.detail, offset=offset
                ) from None
    return reducer, end


def reduce_bytes(
    data: bytes, *, path: str | Path | None = None, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> SessionState:
    """The state of a session's bytes; CorruptionError names what is wrong and where."""
    reducer, end = load(data, path=path, max_line_bytes=max_line_bytes)
    return SessionState(reducer, end)
