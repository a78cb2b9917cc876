"""`python -m benchmarks`: the repository's entry to `sessionlog bench`, the one benchmark (the
same run, the same options and exit status: `python -m benchmarks --help`)."""

from __future__ import annotations

import sys

from sessionlog.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
