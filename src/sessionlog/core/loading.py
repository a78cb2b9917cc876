"""Bytes to state: framing, then the reducer, line by line (the read path of every backend).

`nul_tail=True` is the power class's one repair beyond the torn tail (contract section 1). After
power loss a filesystem may have recorded a file's new size but not all of its new data: the
missing sectors read back as NUL bytes, possibly followed by sectors that did arrive, LF included.
A line written that way was never acknowledged (its sync had not returned), and no encoder writes
a raw NUL (JSON escapes it). So when the *last* committed line holds NULs of that shape, it is
treated as torn: excluded from `repairedLength`, cut off before the first append.

The shape is what makes it safe: a hole is a run of NULs that starts where the unsynced write
began (a line start) or at a sector boundary (`framing.SECTOR`, 512 bytes, the weakest
assumption), and ends at a sector boundary or at the end of the file. A flipped bit, or a NUL
written by a bug, is a lone byte inside a line: that stays corruption, in the last line too, and
so does any NUL in a process-class log.

Group commit widens "the last line" to "the last write": one write there holds a whole batch of
lines, none acknowledged until its sync returns, and a hole may fall in any of them. With
`nul_window` (a group-committing backend's rule: `framing.NUL_WINDOW`, a constant of the format
that caps every batch) a hole in a line that starts within the last `nul_window` committed bytes
cuts the log at that line's start; the lines after it belong to the same unacknowledged write. A
NUL further back is corruption as before.
"""

from __future__ import annotations

import gc
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import ContractError, CorruptionError
from .framing import (
    DEFAULT_MAX_LINE_BYTES,
    NUL_WINDOW,
    SECTOR,
    check_committed,
    committed_length,
    lines,
    parse_line,
)
from .reducer import Reducer, validate_header
from .state import SessionState

_NUL_RUN = re.compile(rb"\0+")
_DECODER = json.JSONDecoder()


@contextmanager
def gc_paused() -> Iterator[None]:
    """Bulk reduction allocates many small containers that all stay alive: the collector would
    scan them again and again for nothing (about 3x slower). So it is paused while they are made,
    and afterwards the caller's collector is exactly as it was: enabled or not, nothing frozen
    (`gc.freeze()` would also freeze the host's garbage of that moment, for good)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load(
    data: bytes,
    *,
    path: str | Path | None = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    nul_tail: bool = False,
    nul_window: int = 0,
) -> tuple[Reducer, int]:
    """Reduce `data`; return the live reducer and the committed length (`repairedLength`).
    `nul_tail`: treat a NUL-bearing last line as torn (power class only; see the module doc);
    `nul_window`: or any line starting within that many final bytes (group commit)."""
    try:
        return _load(data, max_line_bytes, nul_tail, nul_window)
    except CorruptionError as error:
        if path is None:
            raise
        raise error.located(path) from error.__cause__


def committed_end(data: bytes, *, nul_tail: bool = False, nul_window: int = 0) -> int:
    """The committed length before any check: through the last LF, less, when `nul_tail`, the
    lines a power loss left holes in (see the module docstring); never the header."""
    end = committed_length(data)
    if not nul_tail or end == 0:
        return end
    last = data.rfind(b"\n", 0, end - 1) + 1
    if last == 0:
        return end  # only the header
    header_end = data.find(b"\n") + 1
    first = last
    if nul_window:  # the first line that starts within the last `nul_window` bytes
        floor = max(header_end, end - min(nul_window, NUL_WINDOW))
        first = min(last, floor if data[floor - 1] == 0x0A else data.find(b"\n", floor, end) + 1)
    nul = data.find(b"\0", first, end)
    if nul < 0 or not _holes_only(data, first, nul):
        return end  # no NUL, or one no power loss leaves: the reducer refuses the line
    return max(header_end, data.rfind(b"\n", 0, nul) + 1)


def _holes_only(data: bytes, first: int, nul: int) -> bool:
    """Whether every NUL from `nul` on lies in a run a power loss leaves: unwritten sectors. Such a
    run starts where the unsynced write began (a line start at or after `first`) or at a sector
    boundary, and ends at a sector boundary or at the end of the file. A flipped bit, a stray
    NUL written by a bug, or a run reaching back before the last write never has that shape."""
    size = len(data)
    for run in _NUL_RUN.finditer(data, nul):
        start, stop = run.span()
        begins_write = start >= first and data[start - 1] == 0x0A
        if (start % SECTOR and not begins_write) or (stop % SECTOR and stop != size):
            return False
    return True


def check_torn_tail(data: bytes, end: int, next_seq: int, *, path: str | Path | None = None) -> None:
    """Refuse to treat as torn a tail that no interrupted write leaves. A writer appends whole
    lines, so a torn tail is a prefix of one line and its LF: it never holds the next transaction
    (its first fact at `next_seq`) complete and followed by another byte. That shape is a
    committed line whose LF was damaged (one flipped bit); cutting it would drop an acknowledged
    commit. (Unless the byte after it starts a sector: a power loss may leave an unwritten sector
    holding anything; and stale bytes that only look like JSON are no transaction.) The
    contract's reduction ignores the tail whatever it holds; this is what a store checks before
    it truncates."""
    if end >= len(data) or data[end] not in b"[{":
        return
    tail = data[end:].decode("utf-8", "replace")
    try:
        value, stop = _DECODER.raw_decode(tail)
    except ValueError:
        return  # incomplete: what a torn write leaves
    first = value[0] if type(value) is list and value else value
    if type(first) is not dict or first.get("seq") != next_seq:
        return  # not the next transaction: stale bytes, not a damaged line
    after = end + len(tail[:stop].encode())
    if after == len(data) or not data[after:].strip(b"\0") or after % SECTOR == 0:
        return  # the LF is missing or lies in an unwritten sector: a torn write
    line = data.count(b"\n", 0, end) + 1
    raise CorruptionError(
        "MALFORMED_JSON",
        line,
        detail=f"a whole line followed by {tail[stop : stop + 1]!r} instead of LF: a damaged line end, "
        "not a torn write (refusing to cut it)",
        offset=end,
        path=path,
    )


def _load(data: bytes, max_line_bytes: int, nul_tail: bool, nul_window: int) -> tuple[Reducer, int]:
    end = committed_end(data, nul_tail=nul_tail, nul_window=nul_window)
    if end == 0:
        raise CorruptionError("MISSING_HEADER", 1, detail="no complete line: no LF in the file", offset=0)
    if data[0] == 0x0A:  # contract §1 lists this with "no LF at all", before the encoding checks
        raise CorruptionError("MISSING_HEADER", 1, detail="the first line is empty", offset=0)
    check_committed(data, end)
    numbered = lines(data, end, max_line_bytes)
    _, _, raw = next(numbered)
    try:
        reducer = Reducer(validate_header(parse_line(raw, 1, 0, max_line_bytes)))
    except ContractError as error:
        if isinstance(error, CorruptionError):
            raise
        raise CorruptionError(error.code, 1, None, error.detail, offset=0) from None
    reduce_lines(reducer, numbered, max_line_bytes)
    return reducer, end


def reduce_lines(
    reducer: Reducer, numbered: Iterator[tuple[int, int, bytes]], max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> None:
    """Apply committed lines (`framing.lines`) to `reducer`, the collector paused; a line that
    does not reduce is CorruptionError at its line and offset."""
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


def valid_prefix(
    data: bytes, *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, nul_tail: bool = False, nul_window: int = 0
) -> tuple[int, CorruptionError | None]:
    """How far `data` is valid: (the length of the longest prefix of whole lines that reduces, as
    a store reads it; the error that stops it there, or None when all of it reduces and the tail,
    if any, is a torn write). The prefix is 0 when the header itself is bad."""
    first: CorruptionError | None = None
    cut = len(data)
    while True:
        try:
            reducer, end = _load(data[:cut], max_line_bytes, nul_tail, nul_window)  # data itself at first
            if first is None:
                check_torn_tail(data, end, reducer.next_seq)
            return end, first
        except CorruptionError as error:
            first = first or error
            offset = error.offset or 0
            if offset >= cut or offset == 0:
                return 0, first
            cut = offset


def reduce_bytes(
    data: bytes,
    *,
    path: str | Path | None = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    nul_tail: bool = False,
    nul_window: int = 0,
) -> SessionState:
    """The state of a session's bytes; CorruptionError names what is wrong and where.
    `nul_tail=True` reads it as a power-class store does (a NUL-bearing last line is torn;
    `nul_window`: the last write, for group commit)."""
    reducer, end = load(
        data, path=path, max_line_bytes=max_line_bytes, nul_tail=nul_tail, nul_window=nul_window
    )
    return SessionState(reducer, end)
