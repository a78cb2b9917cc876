"""`python -m benchmarks`: `sessionlog bench` (the installed benchmark) with the third-party peers
(`pip install -e '.[bench,peers]'`); the same options. The first edition, with the issue
targets, is `python -m benchmarks.edition1`."""

from __future__ import annotations

import sys

from benchmarks.bench_peers import PEERS
from sessionlog.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], peers=PEERS))
