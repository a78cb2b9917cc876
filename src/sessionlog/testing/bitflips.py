"""Every single-bit flip of a small synced power-class session: refused or harmless, never a
shorter log. The NUL rule and the torn-tail repair may cut only what an interrupted write
leaves; a flipped bit is never that (`core.loading`).

    from sessionlog.testing.bitflips import run_bit_flips
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import CorruptionError
from ..core.store import reduce_stored
from ..opening import backends, create, create_async

PROVIDER, MODEL, CWD = "openrouter", "bitflips/model", "/bitflips"


@dataclass
class BitFlipReport:
    """Every single-bit flip of every byte of a small synced session, opened as its backend's
    store opens it: `refused` raised CorruptionError, `kept` reduced with every line in place,
    `shortened` lists the flips (byte, bit) that made the store drop a line (must stay empty)."""

    backend: str
    flips: int = 0
    refused: int = 0
    kept: int = 0
    shortened: list[tuple[int, int]] = field(default_factory=list)


def run_bit_flips(backend: str, directory: Path, *, commits: int = 3) -> BitFlipReport:
    """Write `commits` synced transactions (lines longer than a sector), then flip each bit."""
    path = directory / f"flips-{backend}.jsonl"
    facts = [
        [
            {
                "kind": "entry",
                "entry": {"type": "message", "message": {"role": "user", "content": f"m{n} " * 150}},
            }
        ]
        for n in range(commits)
    ]
    info = backends()[backend]
    if info.api == "sync":
        with create(path, backend, provider=PROVIDER, model=MODEL, cwd=CWD) as store:
            for transaction in facts:
                store.commit(transaction)
    else:

        async def write() -> None:
            async with await create_async(path, backend, provider=PROVIDER, model=MODEL, cwd=CWD) as store:
                for transaction in facts:
                    await store.commit(transaction)

        asyncio.run(write())
    data = path.read_bytes()
    path.unlink()
    lines = data.count(b"\n")
    rule = info.nul_rule()
    report = BitFlipReport(backend)
    flipped = bytearray(data)
    for at in range(len(data)):
        for bit in range(8):
            flipped[at] ^= 1 << bit
            report.flips += 1
            try:
                state = reduce_stored(bytes(flipped), path, **rule)[0].state()
            except CorruptionError:
                report.refused += 1
            else:
                end = state.repaired_length
                if end != len(data) or flipped.count(b"\n", 0, end) != lines:
                    report.shortened.append((at, bit))
                else:
                    report.kept += 1
            flipped[at] ^= 1 << bit
    return report
