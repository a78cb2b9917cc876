"""`sessionlog bench`: which backend to choose, measured on your own disk.

    sessionlog bench [--dir PATH] [--backends a,b] [--postgres URL] [--shape abcdefgh]
                     [--quick | --full | --tiny] [--json FILE] [--markdown FILE] [--plot FILE]

Shapes: (a) one session, one committer, 1- and 10-fact transactions; (b) one session, 64
committers (async stores); (c) N sessions at once, one writer each (N = 64; 16 and 256 with
`--full`); (d) loading a session by its length and by its number of compactions; (e) `list` and
`unfinished` over 1,000 sessions (10,000 with `--full`); (f) one committer into a session of
10,000 facts; (g) a resume:
open, load and list a session of 1k and 10k messages (100k with `--full`) beside the peers' read
paths; (h) a platform's restart: reopen a repository of 1,000 sessions (10,000 with `--full`),
list it and claim its unfinished sessions. Every registered backend (third-party ones too), the
repositories and the peers, each row beside its ceiling measured in the same run, interleaved
(`measure`). It ends with a recommendation computed from the run: per durability class and
shape, the fastest backend here and its p99.

Modules: `runner` (one run of the chosen shapes), `shapes` (the workloads), `measure`
(interleaved rounds), `flushes` (the device's flush counter: the evidence of syncing), `report`
(tables, verdicts, recommendation), `places` (the scratch folder and database: never the user's
data), `peers` (the other libraries), `resume` (shape g and the peers' read paths), `restart`
(shape h, and the filling of many sessions it shares with shape e), `command` (options and exit
status: 0 ok, 2 usage, 5 a row caught not syncing, 6 a row failed, 130 interrupted).
"""

from __future__ import annotations

from .command import EXIT_INTERRUPTED, EXIT_NOT_SYNCING, EXIT_OK, EXIT_ROW_FAILED, EXIT_USAGE, main
from .places import PlaceError
from .runner import REPOSITORIES, SHAPES, Plan, run

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_NOT_SYNCING",
    "EXIT_OK",
    "EXIT_ROW_FAILED",
    "EXIT_USAGE",
    "REPOSITORIES",
    "SHAPES",
    "PlaceError",
    "Plan",
    "main",
    "run",
]
