"""A deterministic corruption corpus for the read path, and the judge of each case.

`corpus(seed)` mutates small valid sessions (from `sessionlog.testing.sessions`): truncation at
every byte offset, bit flips, byte insertions and deletions, NUL runs, duplicated and swapped
lines, invalid UTF-8 of several shapes, CRLF, duplicated keys at several depths, blank lines,
valid re-encodings (spaces, escaped `/`, reordered keys: these must still reduce), non-JSON
numbers, deep nesting, and two of these at once (which rule comes first). Same seed, same cases.

`judge(case)` says what is wrong with `reduce_bytes(case.data)` (None: nothing). It relies on
an independent *reference framing* written here from contract section 1 (stdlib `json`, not the
framing module), on the generator's own model of the expected state, and on the lines before the
first changed byte being the original's (which are valid):

* the committed part is a line prefix of the original: it must reduce to exactly the
  generator's expected state for that many lines;
* otherwise, if it reduces: the reference framing finds nothing wrong, `repairedLength` is the
  committed length, and `last_seq` equals the number of facts in the committed lines: no line
  was skipped silently;
* if it raises CorruptionError: a whole-file framing error (MISSING_HEADER, a surrogate,
  INVALID_UTF8) must be exactly the reference's code and line; any other error must be at the
  first line the reference rejects, or at an earlier line with a reducer code, never before
  the first changed line; its byte offset is that line's start, its seq (when it has one)
  lies in that line, and the lines before it reduce, holding every one of their facts;
* any other exception is a failure.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..core.errors import CorruptionError
from ..core.framing import DEFAULT_MAX_LINE_BYTES, MAX_NESTING_DEPTH
from ..core.loading import reduce_bytes
from ..core.state import SessionState
from .sessions import GeneratedSession, generate_session

__all__ = ["KINDS", "Case", "Verdict", "corpus", "judge", "mutate", "reference_framing"]

_SURROGATE = re.compile(rb"\xed[\xa0-\xbf][\x80-\xbf]")
_WHOLE_FILE = "whole-file"
_FRAMING_CODES = frozenset(
    ("MISSING_HEADER", "INVALID_UTF8", "BLANK_LINE", "CRLF_NOT_ALLOWED", "MALFORMED_JSON")
)


@dataclass(frozen=True)
class Case:
    kind: str
    session: GeneratedSession
    original: bytes
    data: bytes
    note: str = ""


@dataclass(frozen=True)
class Verdict:
    """`outcome` is "reduced" or the CorruptionError's code; `problem` is None when the case
    behaved as the contract says."""

    outcome: str
    problem: str | None


# -- the reference framing ---------------------------------------------------------------------


def _line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicated key")
    return dict(pairs)


def _reject(name: str) -> Any:
    raise ValueError(name)


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError("overflow")
    return value


def _acceptable(value: Any) -> bool:
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if any(0xD800 <= ord(char) <= 0xDFFF for char in item):
                return False
        elif isinstance(item, dict | list):
            if depth + 1 > MAX_NESTING_DEPTH:
                return False
            children = [*item, *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return True


def reference_parse(raw: bytes) -> tuple[bool, Any]:
    """(True, value) if the line is one strict JSON value, else (False, None)."""
    try:
        value = json.loads(
            raw.decode("utf-8"), object_pairs_hook=_pairs, parse_constant=_reject, parse_float=_float
        )
    except (ValueError, RecursionError):
        return False, None
    return (True, value) if _acceptable(value) else (False, None)


def reference_framing(
    data: bytes, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> tuple[tuple[str, int, str] | None, list[Any]]:
    """The first framing error of `data` as (code, line, "whole-file" or "line"), or None; and
    the JSON values of the committed lines before it."""
    end = data.rfind(b"\n") + 1
    if end == 0:
        return ("MISSING_HEADER", 1, _WHOLE_FILE), []
    if data[0] == 0x0A:  # listed with "no LF at all", before the encoding rules
        return ("MISSING_HEADER", 1, _WHOLE_FILE), []
    committed = data[:end]
    found = _SURROGATE.search(committed)
    if found is not None:
        return ("MALFORMED_JSON", _line_of(data, found.start()), _WHOLE_FILE), []
    try:
        committed.decode("utf-8")
    except UnicodeDecodeError as error:
        return ("INVALID_UTF8", _line_of(data, error.start), _WHOLE_FILE), []
    values: list[Any] = []
    for number, raw in enumerate(committed[:-1].split(b"\n"), start=1):
        if not raw:
            return ("BLANK_LINE", number, "line"), values
        if raw.endswith(b"\r"):
            return ("CRLF_NOT_ALLOWED", number, "line"), values
        ok, value = reference_parse(raw) if len(raw) <= max_line_bytes else (False, None)
        if not ok:
            return ("MALFORMED_JSON", number, "line"), values
        values.append(value)
    return None, values


def _facts_in(value: Any) -> int:
    return len(value) if isinstance(value, list) else 1


# -- the judge ---------------------------------------------------------------------------------


def _common_prefix(a: bytes, b: bytes) -> int:
    low, high = 0, min(len(a), len(b))
    while low < high:  # the longest equal prefix is at least `low` and at most `high` bytes
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _line_starts(data: bytes, end: int) -> list[int]:
    starts = [0]
    position = data.find(b"\n", 0, end)
    while position >= 0 and position + 1 < end:
        starts.append(position + 1)
        position = data.find(b"\n", position + 1, end)
    return starts


Reduce = Callable[[bytes], SessionState]


def judge(case: Case, reduce: Reduce = reduce_bytes) -> Verdict:
    """Reduce the case and check the outcome against the contract (see the module docstring).
    `reduce` is the function under test (`reduce_bytes`; another one to test the judge)."""
    data, original = case.data, case.original
    try:
        state = reduce(data)
    except CorruptionError as error:
        return Verdict(error.code, _judge_error(case, error, reduce))
    except Exception as error:  # the finding: only CorruptionError may come out
        return Verdict(type(error).__name__, f"raised {error!r}")
    end = data.rfind(b"\n") + 1
    if state.repaired_length != end:
        return Verdict(
            "reduced", f"repairedLength {state.repaired_length}, the committed part is {end} bytes"
        )
    lines = data.count(b"\n", 0, end)
    if original.startswith(data[:end]):
        expected = case.session.expected_state(lines)
        if state.to_json() != expected:
            return Verdict("reduced", f"the state of the first {lines} lines differs from the generator's")
        return Verdict("reduced", None)
    framing, values = reference_framing(data)
    if framing is not None:
        return Verdict(
            "reduced", f"reduced, but the reference framing finds {framing[0]} at line {framing[1]}"
        )
    facts = sum(_facts_in(value) for value in values[1:])
    if state.last_seq != facts:
        return Verdict("reduced", f"last_seq {state.last_seq}, but the committed lines hold {facts} facts")
    return Verdict("reduced", None)


def _judge_error(case: Case, error: CorruptionError, reduce: Reduce) -> str | None:
    data, original = case.data, case.original
    end = data.rfind(b"\n") + 1
    if end and original.startswith(data[:end]):
        return f"{error.code} at line {error.line}, but the committed part is a prefix of a valid session"
    framing, values = reference_framing(data)
    got = (error.code, error.line)
    if framing is not None and framing[2] == _WHOLE_FILE:
        return None if got == framing[:2] else f"{got}, the reference says {framing[:2]}"
    first_bad = framing[1] if framing is not None else None
    first_changed = _line_of(data, _common_prefix(data, original))
    if error.line < first_changed:
        return f"{got} before the first changed line {first_changed}"
    if first_bad is not None and error.line > first_bad:
        return f"{got} after line {first_bad}, which the reference rejects ({framing[0] if framing else ''})"
    if error.line == first_bad:
        if framing is not None and error.code != framing[0] and error.code in _FRAMING_CODES:
            return f"{got}, the reference says {framing[:2]}"
    elif error.code in _FRAMING_CODES:
        return f"{got}: a framing error where the reference framing finds the line valid"
    starts = _line_starts(data, end)
    if error.line > len(starts):
        return f"{got}: there are only {len(starts)} committed lines"
    start = starts[error.line - 1]
    if error.offset != start:
        return f"{got}: offset {error.offset}, the line starts at {start}"
    before = sum(_facts_in(value) for value in values[1 : error.line - 1])
    if error.seq is not None and error.code != "SEQ_MISMATCH" and error.line - 1 < len(values):
        count = _facts_in(values[error.line - 1]) if error.line > 1 else 0
        if not before < error.seq <= before + max(count, 1):
            return f"{got}: seq {error.seq} is not in that line (facts {before + 1}..{before + count})"
    if error.line > 1:
        try:
            prefix = reduce(data[:start])
        except CorruptionError as earlier:
            return f"{got}, but the lines before it do not reduce: {earlier.code} at line {earlier.line}"
        if prefix.last_seq != before:
            return (
                f"{got}: the lines before it hold {before} facts, they reduce to last_seq {prefix.last_seq}"
            )
    return None


# -- mutations ---------------------------------------------------------------------------------


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def _dump_with_duplicate(value: Any, target: int, counter: list[int]) -> str:
    """JSON text of `value` where the `target`-th object (depth-first) repeats its first key."""
    if isinstance(value, dict):
        index = counter[0]
        counter[0] += 1
        items = [
            f"{json.dumps(key)}:{_dump_with_duplicate(item, target, counter)}" for key, item in value.items()
        ]
        if index == target and value:
            key, item = next(iter(value.items()))
            items.append(f"{json.dumps(key)}:{json.dumps(item, separators=(',', ':'), ensure_ascii=False)}")
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dump_with_duplicate(item, target, counter) for item in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _objects(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + sum(_objects(item) for item in value.values())
    if isinstance(value, list):
        return sum(_objects(item) for item in value)
    return 0


_INVALID_UTF8 = (
    b"\xff",
    b"\xc0\x80",
    b"\x80",
    b"\xe6\x97",
    b"\xed\xa0\x80",
    b"\xf8\x88\x80\x80\x80",
    b"\xf4\x90\x80\x80",
)
_SPECIAL = b'\n\r\x00"{}[],:\\ \t\x7f\xff\xed0a'
_NON_JSON = (b"NaN", b"Infinity", b"-Infinity", b"1e400", b"01", b"1" * 5000, b"+1", b".5", b"true ", b"'x'")


def mutate(kind: str, session: GeneratedSession, rng: random.Random) -> tuple[bytes, str]:
    """One mutation of `kind` of the session's bytes, drawn with `rng`."""
    data = session.to_bytes()
    lines = _lines(data)
    pos = rng.randrange(len(data))
    if kind == "bit-flip":
        bit = rng.randrange(8)
        return data[:pos] + bytes([data[pos] ^ (1 << bit)]) + data[pos + 1 :], f"byte {pos} bit {bit}"
    if kind == "insert":
        byte = bytes([rng.choice(_SPECIAL) if rng.random() < 0.7 else rng.randrange(256)])
        return data[:pos] + byte + data[pos:], f"{byte!r} at {pos}"
    if kind == "delete":
        size = rng.choice((1, 1, 1, 2, 5, 40, 300))
        return data[:pos] + data[pos + size :], f"{size} bytes at {pos}"
    if kind == "nul-run":
        size = rng.choice((1, 3, 16, 100, 600))
        if rng.random() < 0.3:  # in the last line, which the power class would treat as torn
            pos = max(0, data.rfind(b"\n", 0, len(data) - 1) + 1 + rng.randrange(max(1, len(lines[-1]) - 1)))
        run = bytes(min(size, len(data) - pos))
        return data[:pos] + run + data[pos + len(run) :], f"{size} NULs at {pos}"
    if kind == "duplicate-line":
        index = rng.randrange(len(lines))
        return b"".join([*lines[: index + 1], lines[index], *lines[index + 1 :]]), f"line {index + 1}"
    if kind == "swap-lines":
        if len(lines) < 2:
            return data, "one line"
        first, second = sorted(rng.sample(range(len(lines)), 2))
        swapped = list(lines)
        swapped[first], swapped[second] = swapped[second], swapped[first]
        return b"".join(swapped), f"lines {first + 1} and {second + 1}"
    if kind == "invalid-utf8":
        bad = rng.choice(_INVALID_UTF8)
        if rng.random() < 0.5:  # inside a string, where it would otherwise be legal text
            strings = [m.start() + 1 for m in re.finditer(rb'"[^"\\\n]', data)]
            pos = rng.choice(strings) if strings else pos
        return data[:pos] + bad + data[pos:], f"{bad!r} at {pos}"
    if kind == "crlf":
        ends = [m.start() for m in re.finditer(b"\n", data)]
        if rng.random() < 0.2:
            return data.replace(b"\n", b"\r\n"), "every line"
        at = rng.choice(ends)
        return data[:at] + b"\r" + data[at:], f"before the LF at {at}"
    if kind == "duplicate-key":
        index = rng.randrange(len(lines))
        value = json.loads(lines[index])
        target = rng.randrange(max(1, _objects(value)))
        text = _dump_with_duplicate(value, target, [0]).encode() + b"\n"
        return b"".join([*lines[:index], text, *lines[index + 1 :]]), f"line {index + 1} object {target}"
    if kind == "blank-line":
        index = rng.randrange(len(lines) + 1)
        return b"".join([*lines[:index], b"\n", *lines[index:]]), f"before line {index + 1}"
    if kind == "re-encode":  # the same values, other bytes: must reduce as before
        index = rng.randrange(len(lines))
        value = json.loads(lines[index])
        style = rng.choice(("spaces", "ascii", "slash", "sorted"))
        if style == "spaces":
            encoded = json.dumps(value, ensure_ascii=False)
        elif style == "ascii":
            encoded = json.dumps(value, separators=(",", ":"))
        elif style == "slash":
            encoded = json.dumps(value, separators=(",", ":"), ensure_ascii=False).replace("/", "\\/")
        else:
            encoded = json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
        return b"".join(
            [*lines[:index], encoded.encode() + b"\n", *lines[index + 1 :]]
        ), f"line {index + 1} {style}"
    if kind == "non-json-number":
        numbers = [m.start() for m in re.finditer(rb":\d", data)]
        at = rng.choice(numbers) + 1 if numbers else pos
        stop = at
        while stop < len(data) and data[stop : stop + 1].isdigit():
            stop += 1
        literal = rng.choice(_NON_JSON)
        return data[:at] + literal + data[stop:], f"{literal[:12]!r} at {at}"
    if kind == "deep-nesting":
        depth = rng.choice((MAX_NESTING_DEPTH - 1, MAX_NESTING_DEPTH + 1, 1000, 100_000))
        line = b"[" * depth + b"]" * depth + b"\n"
        index = rng.randrange(1, len(lines) + 1)
        return b"".join([*lines[:index], line, *lines[index:]]), f"depth {depth} before line {index + 1}"
    if kind == "combined":  # two mutations: which rule comes first
        before = rng.choice(KINDS[:-1])
        after = rng.choice([name for name in _BYTE_KINDS if name != before])
        once, first_note = mutate(before, session, rng)
        twice, second_note = mutate(after, _Bytes(session, once), rng)
        return twice, f"{before} ({first_note}) then {after} ({second_note})"
    raise ValueError(f"unknown mutation {kind!r}")


# The kinds that need no valid JSON to work on (the second mutation of `combined`).
_BYTE_KINDS = (
    "bit-flip",
    "insert",
    "delete",
    "nul-run",
    "duplicate-line",
    "swap-lines",
    "invalid-utf8",
    "crlf",
    "blank-line",
    "non-json-number",
    "deep-nesting",
)


class _Bytes(GeneratedSession):
    """A session whose bytes were already mutated once (for `combined`)."""

    def __init__(self, session: GeneratedSession, data: bytes) -> None:
        self.__dict__.update(session.__dict__)
        self._data = data

    def to_bytes(self) -> bytes:
        return self._data


KINDS = (
    "bit-flip",
    "insert",
    "delete",
    "nul-run",
    "duplicate-line",
    "swap-lines",
    "invalid-utf8",
    "crlf",
    "duplicate-key",
    "blank-line",
    "re-encode",
    "non-json-number",
    "deep-nesting",
    "combined",
)


def corpus(seed: int = 0, *, per_kind: int = 400, sessions: int = 8) -> Iterator[Case]:
    """Every truncation of one small session, then `per_kind` mutations of each kind, spread
    over `sessions` small generated sessions (5 to 20 facts). Deterministic."""
    bases = [generate_session(seed * 1000 + number, 5 + (number * 5) % 16) for number in range(sessions)]
    small = bases[0]
    original = small.to_bytes()
    for offset in range(len(original) + 1):
        yield Case("truncate", small, original, original[:offset], f"at {offset}")
    rng = random.Random(f"mutations:{seed}")
    for kind in KINDS:
        for number in range(per_kind):
            session = bases[number % len(bases)]
            data, note = mutate(kind, session, rng)
            yield Case(kind, session, session.to_bytes(), data, note)


def run_corpus(
    seed: int = 0,
    *,
    per_kind: int = 400,
    sessions: int = 8,
    on_case: Callable[[Case, Verdict], None] | None = None,
) -> tuple[int, dict[str, dict[str, int]], list[str]]:
    """Judge the whole corpus: (cases, outcomes per kind, problems)."""
    count = 0
    outcomes: dict[str, dict[str, int]] = {}
    problems: list[str] = []
    for case in corpus(seed, per_kind=per_kind, sessions=sessions):
        verdict = judge(case)
        count += 1
        per_kind_outcomes = outcomes.setdefault(case.kind, {})
        per_kind_outcomes[verdict.outcome] = per_kind_outcomes.get(verdict.outcome, 0) + 1
        if verdict.problem is not None:
            problems.append(f"{case.kind} ({case.note}, session seed {case.session.seed}): {verdict.problem}")
        if on_case is not None:
            on_case(case, verdict)
    return count, outcomes, problems
