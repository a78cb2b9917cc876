"""Time `sessionlog.core.ids.new_id` against uuid6's `str(uuid7())`, interleaved.

    python scripts/id_speed.py [rounds]

Each round times both for the same number of ids, one right after the other, so that the load of
a shared machine falls on both alike; prints the median per-id time of each and their ratio.
"""

from __future__ import annotations

import statistics
import sys
import timeit

from uuid6 import uuid7

from sessionlog.core.ids import new_id


def reference() -> str:
    return str(uuid7())


def main(rounds: int = 21, number: int = 20_000) -> None:
    ours: list[float] = []
    theirs: list[float] = []
    ratios: list[float] = []
    for _ in range(rounds):
        mine = timeit.timeit(new_id, number=number) / number
        other = timeit.timeit(reference, number=number) / number
        ours.append(mine)
        theirs.append(other)
        ratios.append(mine / other)
    print(f"new_id        {statistics.median(ours) * 1e9:8.0f} ns per id")
    print(f"uuid6 uuid7() {statistics.median(theirs) * 1e9:8.0f} ns per id (str of the UUID)")
    print(f"ratio         {statistics.median(ratios):8.3f} (median of {rounds} interleaved rounds)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 21)
