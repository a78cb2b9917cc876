"""One PostgreSQL session's commits against a bare INSERT of the same bytes, interleaved.

    python scripts/postgres_commit_speed.py [--rounds 15] [--commits 200] [--postgres URL] [--source DIR]

Each round times `--commits` commits of one sessionlog store (the bench's transaction: one user
message, a ~550-byte line; the power class, synchronous_commit=on) and then as many bare
statements on one autocommit psycopg connection: `insert into bare_lines values (%s, %s, %s)`
of the line that store wrote, each its own transaction (INSERT + COMMIT in one round trip, as
sessionlog's one statement is). Prints the median time of each and the median of the rounds'
ratios (bare time / sessionlog time: 1.0 is as fast as the bare INSERT), and the CPU time this
process spent on each (less sensitive to a loaded machine than the wall time). Without
--postgres a throwaway local server is started (`sessionlog.testing.postgres`; under TMPDIR, so that
TMPDIR=/dev/shm takes the disk's flush out of both and leaves the client's and the round
trip's share). `--source` runs another checkout's package (its `src` first on sys.path), to
compare before and after a change.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
from pathlib import Path

# The bench's transaction (`sessionlog.bench.shapes`): one user message, a ~550-byte line.
HEADER = {"provider": "bench", "model": "bench", "cwd": "/bench"}
TEXT = "x" * 380


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--postgres", metavar="URL")
    parser.add_argument("--source", metavar="DIR", help="a checkout whose src/ to measure")
    args = parser.parse_args()
    if args.source:
        sys.path.insert(0, str(Path(args.source) / "src"))
    import psycopg

    import sessionlog
    from sessionlog.core import facts as F

    def transaction(index: int, _: int) -> list[dict[str, object]]:
        return [F.user_message(f"{index}:0 {TEXT}")]

    server = None
    url = args.postgres
    if url is None:
        from sessionlog.testing.postgres import PostgresServer

        server = PostgresServer.start()
        url = server.new_database()
    try:
        repo = sessionlog.repository(url)
        store = repo.create(**HEADER)
        bare = psycopg.connect(url, autocommit=True)
        bare.execute(
            "create table if not exists bare_lines (session_id text, line_no integer, line bytea, "
            "primary key (session_id, line_no))"
        )
        store.commit(transaction(0, 1))
        line = repo.export(store.load().session_id).splitlines(keepends=True)[-1]
        ours: list[float] = []
        theirs: list[float] = []
        number, key = 0, secrets.token_hex(8)  # a run's own rows
        cpu: list[tuple[float, float]] = []  # this process's CPU time a commit, each side
        for _ in range(args.rounds):
            started, used = time.perf_counter(), time.process_time()
            for index in range(args.commits):
                store.commit(transaction(index, 1))
            ours.append((time.perf_counter() - started) / args.commits)
            mine = (time.process_time() - used) / args.commits
            started, used = time.perf_counter(), time.process_time()
            for _ in range(args.commits):
                number += 1
                bare.execute("insert into bare_lines values (%s, %s, %s)", (key, number, line))
            theirs.append((time.perf_counter() - started) / args.commits)
            cpu.append((mine, (time.process_time() - used) / args.commits))
        store.close()
        repo.close()
        bare.close()
    finally:
        if server is not None:
            server.stop()
    ratios = [other / mine for mine, other in zip(ours, theirs, strict=True)]
    where = args.source or "this checkout"
    print(f"sessionlog commit  {statistics.median(ours) * 1e6:8.1f} us ({where}, {len(line)}-byte line)")
    print(f"bare INSERT        {statistics.median(theirs) * 1e6:8.1f} us")
    rounds = f"median of {args.rounds} interleaved rounds"
    print(f"ratio              {statistics.median(ratios):8.2f}x ({rounds})")
    mine, other = (statistics.median(side) * 1e6 for side in zip(*cpu, strict=True))
    print(f"client CPU         {mine:8.1f} us a commit, {other:.1f} us a bare INSERT")


if __name__ == "__main__":
    main()
