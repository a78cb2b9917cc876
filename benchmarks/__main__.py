"""`python -m benchmarks`: the repository's entry to `sessionlog bench` (the same run, the same
options: every backend, the repositories and the peers). The first edition, with the issue
targets, is `python -m benchmarks.edition1`."""

from __future__ import annotations

import sys

from sessionlog.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
