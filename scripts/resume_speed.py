"""Resume of 1k/10k/100k-message sessions without and with a snapshot, interleaved (issue #25).

    python scripts/resume_speed.py [--sizes 1000,10000,100000] [--rounds 7] [--backend jsonl]

A resume is what shape g of `sessionlog bench` times: open, load, `list(active_context)`, close,
of a session of ~550-byte user messages (one a line, the bench's bytes). Each round times both
ways back to back on the same file: *full* with the snapshot seam switched off (the load of
before snapshots: every line reduced), *snapshot* with the snapshot the first close wrote. The
figure is the median of the rounds; also the cost of writing the snapshot once (the close that
found it worth writing) and its size.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import sessionlog
from sessionlog.backends.jsonl_file import JsonlFile, snapshot_path
from sessionlog.bench.resume import messages, session_bytes
from sessionlog.core import store as store_module


def resume(path: Path, backend: str) -> float:
    start = time.perf_counter()
    with sessionlog.open(path, backend) as store:
        count = len(list(store.load().active_context))
    elapsed = time.perf_counter() - start
    assert count > 0
    return elapsed


def without_snapshots(path: Path, backend: str) -> float:
    read, worth = JsonlFile.read_snapshot, store_module.worth_writing
    JsonlFile.read_snapshot = lambda self: None  # type: ignore[method-assign]
    store_module.worth_writing = lambda *_: False
    try:
        return resume(path, backend)
    finally:
        JsonlFile.read_snapshot = read  # type: ignore[method-assign]
        store_module.worth_writing = worth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--backend", default="jsonl")
    args = parser.parse_args()
    print(
        f"{'messages':>9} {'full ms':>9} {'snapshot ms':>12} {'ratio':>6} {'write ms':>9} {'snapshot MB':>12}"
    )
    for size in (int(part) for part in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "s.jsonl"
            data = session_bytes(Path(folder), messages(size))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, data)
            os.close(fd)
            write = resume(path, args.backend) - without_snapshots(path, args.backend)  # first close writes
            assert snapshot_path(path).exists(), "no snapshot was written"
            full, fast = [], []
            for _ in range(args.rounds):
                full.append(without_snapshots(path, args.backend))
                fast.append(resume(path, args.backend))
            slow, quick = statistics.median(full), statistics.median(fast)
            megabytes = snapshot_path(path).stat().st_size / 1e6
            print(
                f"{size:>9} {slow * 1e3:>9.1f} {quick * 1e3:>12.1f} {slow / quick:>6.2f} "
                f"{write * 1e3:>9.1f} {megabytes:>12.1f}"
            )


if __name__ == "__main__":
    main()
