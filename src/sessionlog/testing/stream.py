"""The deterministic stream of transactions the crash, fault and power-loss harnesses commit,
and the check of a log against it.

`Stream(seed)` yields transaction `i` the same every time: sizes from 100 B to several MB (so that
a kill or a lost write can land inside one), contents with multi-byte characters and characters
JSON escapes, ids from `fact_id`. `verify_log(data, stream, rule=...)` reduces a log and says how
many of the stream's transactions it holds, exactly and in order, or what is wrong with it.
`registry_for(plugins)` is the backend registry a harness child uses.
"""

from __future__ import annotations

import hashlib
import importlib
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.errors import CorruptionError
from ..core.loading import reduce_bytes
from ..plugins.registry import Registry, plugin_manager

__all__ = [
    "CWD",
    "MODEL",
    "PROVIDER",
    "SNAPSHOT_EVERY",
    "LogCheck",
    "Stream",
    "fact_id",
    "registry_for",
    "verify_log",
]

PROVIDER = "openrouter"
MODEL = "crash/model"
CWD = "/crash"

# Small contents hold multi-byte characters of every length and characters JSON escapes; large
# ones keep to narrower alphabets (Python and orjson handle a 4 MB string of 1-byte characters
# several times faster than one with a single emoji in it).
_PROSE = "the agent read the file, ran the tests and wrote a summary of what it found; "
_FILLERS = (
    _PROSE + 'naïve café, 日本語, emoji 🎉, a "quote", a backslash \\ and a tab\t | ',  # < 16 KiB
    _PROSE * 3 + "naïve café, 日本語 | ",  # < 1 MiB
    _PROSE * 3 + 'a "quote", a backslash \\ and a tab\t | ',  # several MB
)
_filled = list(_FILLERS)


# Snapshots on (#25): the sync children write one every this many transactions.
SNAPSHOT_EVERY = 40


def _filler(kind: int, size: int) -> str:
    text = _filled[kind]
    if len(text) < size:
        text = _FILLERS[kind] * (size // len(_FILLERS[kind]) + 1)
        _filled[kind] = text
    return text[:size]


def fact_id(seed: int, index: int, part: int) -> str:
    """A deterministic UUIDv7 for part `part` of transaction `index` of stream `seed`."""
    digest = hashlib.blake2b(f"{seed}:{index}:{part}".encode(), digest_size=10).digest()
    ms = 1_700_000_000_000 + index
    value = (ms << 80) | (0x7 << 76) | (int.from_bytes(digest[:2]) & 0xFFF) << 64
    value |= (0b10 << 62) | (int.from_bytes(digest[2:]) & ((1 << 62) - 1))
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


@dataclass(frozen=True)
class Stream:
    """Transaction i: 1 to 3 user entries with deterministic ids; the first one's content is
    `size(i)` characters, log-uniform in `small` (most), `medium` (a `medium_fraction`) or
    uniform in `huge` (a `huge_fraction`). The default reaches several MB: only writes that
    large reliably tear when a kill lands in them (the page cache takes a 1 MiB write in well
    under a millisecond)."""

    seed: int = 0
    small: tuple[int, int] = (100, 16 << 10)
    medium: tuple[int, int] = (16 << 10, 1 << 20)
    huge: tuple[int, int] = (2 << 20, 4 << 20)
    medium_fraction: float = 0.1
    huge_fraction: float = 0.05

    def _rng(self, index: int) -> random.Random:
        return random.Random(f"sessionlog-stream:{self.seed}:{index}")

    def fact_count(self, index: int) -> int:
        return 1 + self._rng(index).randrange(3)

    def size(self, index: int) -> int:
        rng = self._rng(index)
        rng.randrange(3)
        roll = rng.random()
        if roll < self.huge_fraction:
            return rng.randrange(*self.huge)
        low, high = self.medium if roll < self.huge_fraction + self.medium_fraction else self.small
        return int(low * (high / low) ** rng.random())

    def content(self, index: int, part: int, size: int) -> str:
        head = f"transaction {index} part {part} of stream {self.seed}: "
        if size <= len(head):
            return head
        kind = 0 if size < 16 << 10 else 1 if size < 1 << 20 else 2
        return head + _filler(kind, size - len(head))

    def transaction(self, index: int) -> list[dict[str, Any]]:
        """The facts to commit, each with its id (`seq` and `timestamp` come from the store)."""
        facts = []
        for part in range(self.fact_count(index)):
            size = self.size(index) if part == 0 else 40 + 13 * part
            facts.append(
                {
                    "kind": "entry",
                    "id": fact_id(self.seed, index, part),
                    "entry": {
                        "type": "message",
                        "message": {"role": "user", "content": self.content(index, part, size)},
                    },
                }
            )
        return facts

    def index_after(self, last_seq: int) -> int:
        """How many transactions fill seqs 1..last_seq (ValueError if that is no boundary)."""
        index = seq = 0
        while seq < last_seq:
            seq += self.fact_count(index)
            index += 1
        if seq != last_seq:
            raise ValueError(f"seq {last_seq} ends inside transaction {index - 1}")
        return index


@dataclass
class LogCheck:
    """What `verify_log` found. `error` is the CorruptionError when the log does not reduce;
    `mismatch` names the first committed line that is not the stream's (a misread log)."""

    transactions: int = 0
    repaired_length: int = 0
    torn_bytes: int = 0
    error: CorruptionError | None = None
    mismatch: str | None = None

    @property
    def reduced(self) -> bool:
        return self.error is None

    def lost(self, acknowledged: int) -> int:
        """Acknowledged transactions this log does not hold (all of them if it does not open)."""
        if self.error is not None or self.mismatch is not None:
            return acknowledged
        return max(0, acknowledged - self.transactions)


# Each fact as the commit pipeline encodes it (orjson, keys in this order).
_FACT_HEAD = re.compile(rb'"kind":"entry","seq":(\d+),"id":"([^"]*)","timestamp":\d+,')


def verify_log(data: bytes, stream: Stream, *, rule: Mapping[str, Any]) -> LogCheck:
    """Reduce `data` as a store of that class would, then compare the committed transactions
    with the stream's first N: one line per transaction, the same facts (seq, id, content) in
    the same order. A log that reduces but differs is a `mismatch` (misread)."""
    try:
        state = reduce_bytes(data, **rule)
    except CorruptionError as error:
        return LogCheck(error=error)
    end = state.repaired_length
    check = LogCheck(repaired_length=end, torn_bytes=len(data) - end)
    transcript = state.transcript
    heads = _FACT_HEAD.finditer(data, data.index(b"\n") + 1, end)
    line_end = data.index(b"\n")
    seq = 0
    index = 0
    while line_end + 1 < end:
        line_start, line_end = line_end + 1, data.index(b"\n", line_end + 1)
        for fact in stream.transaction(index):
            seq += 1
            head = next(heads, None)
            where = f"line {index + 2} (transaction {index}, seq {seq})"
            if head is None or not line_start <= head.start() < line_end:
                check.mismatch = f"{where}: the line does not hold the transaction's facts"
                return check
            if int(head[1]) != seq or head[2].decode() != fact["id"]:
                check.mismatch = (
                    f"{where}: found seq {int(head[1])} id {head[2].decode()}, expected {fact['id']}"
                )
                return check
            if transcript[seq - 1]["content"] != fact["entry"]["message"]["content"]:
                check.mismatch = f"{where}: the content differs"
                return check
        index += 1
    if next(heads, None) is not None or state.last_seq != seq or len(transcript) != seq:
        check.mismatch = f"the log holds {state.last_seq} facts in {index} lines, not the stream's {seq}"
        return check
    check.transactions = index
    return check


def registry_for(plugins: Sequence[str]) -> Registry | None:
    """The registry a child uses: the default one, or one made of these plugin modules."""
    if not plugins:
        return None
    manager = plugin_manager(plugins=[importlib.import_module(name) for name in plugins])
    return Registry(manager)
