"""Repositories: the four figures, as ratios measured in one run (medians of alternating rounds).

    python -m benchmarks.repositories [--full]

1. SQLite, power class, one session, one committer: a store's commit vs a bare `INSERT` +
   `COMMIT` of the same bytes into the same schema with the same settings. Bound: >= 0.8x.
2. SQLite, power class, 64 concurrent sessions, one writer each: the async repository (one
   writer thread, shared transactions) vs the sync one with a connection per thread. Bound:
   >= 8x; p99 latencies printed.
3. `list(limit=100)` over 10,000 sessions vs over 100 (SQLite summary rows). Bound: <= 2x.
4. A directory repository's `list` of 10,000 unchanged sessions vs reducing them. Bound: <= 0.05x.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import sessionlog
from sessionlog.core import facts as F

HEADER: dict[str, Any] = {"provider": "p", "model": "m", "cwd": "/bench"}


def _median(samples: list[float]) -> float:
    return statistics.median(samples)


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


# -- 1. one session vs a bare INSERT + COMMIT ----------------------------------------------------


def one_session(directory: Path, commits: int, rounds: int) -> dict[str, float]:
    """Alternating rounds: the store's commits, and bare `BEGIN IMMEDIATE; INSERT; COMMIT` of the
    same bytes into the same `lines` table (another session's rows) on a connection with the
    repository's settings; and the bare INSERT with the session row's UPDATE the design adds."""
    repo = sessionlog.repository(f"sqlite:///{directory / 'one.db'}")
    store = repo.create(**HEADER)
    bare_id = repo.create_row(**HEADER)
    bare = repo.connect()
    line = b'{"kind":"entry","seq":1,"id":"x","timestamp":1,"entry":' + b"x" * 400 + b"}\n"
    times: dict[str, list[float]] = {"store": [], "bare": [], "bare_update": []}
    number = 1
    summary = '{"provider":"p","model":"m","idle":true,"last_seq":1,"title":null,"usage":[0,0,0,0]}'
    for _ in range(rounds):
        start = time.perf_counter()
        for index in range(commits):
            store.commit([F.user_message(f"message {index} " + "x" * 380)])
        times["store"].append((time.perf_counter() - start) / commits)
        start = time.perf_counter()
        for _ in range(commits):
            number += 1
            bare.execute("begin immediate")
            bare.execute("insert into lines values (?, ?, ?)", (bare_id, number, line))
            bare.execute("commit")
        times["bare"].append((time.perf_counter() - start) / commits)
        start = time.perf_counter()
        for _ in range(commits):  # what the design needs at least: the line and its session's row
            number += 1
            bare.execute("begin immediate")
            bare.execute(
                "update sessions set head_line = ?, updated_at = ?, summary = ? where session_id = ?",
                (number, time.time_ns() // 1_000_000, summary, bare_id),
            )
            bare.execute("insert into lines values (?, ?, ?)", (bare_id, number, line))
            bare.execute("commit")
        times["bare_update"].append((time.perf_counter() - start) / commits)
    store.close()
    bare.close()
    repo.close()
    return {
        "store_us": _median(times["store"]) * 1e6,
        "bare_us": _median(times["bare"]) * 1e6,
        "bare_update_us": _median(times["bare_update"]) * 1e6,
        "ratio": _median(times["bare"]) / _median(times["store"]),
        "ratio_update": _median(times["bare"]) / _median(times["bare_update"]),
        "ratio_floor": _median(times["bare_update"]) / _median(times["store"]),
    }


# -- 2. 64 sessions: sync (a connection per thread) vs async (one writer thread) -------------------


def _sync_sessions(location: str, sessions: int, commits: int) -> tuple[float, list[float]]:
    repo = sessionlog.repository(location)
    stores = [repo.create(**HEADER) for _ in range(sessions)]
    latencies: list[float] = []
    lock = threading.Lock()

    def writer(store: sessionlog.SessionStore) -> None:
        mine = []
        for index in range(commits):
            start = time.perf_counter()
            store.commit([F.user_message(f"m{index}")])
            mine.append(time.perf_counter() - start)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=writer, args=(store,)) for store in stores]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    for store in stores:
        store.close()
    repo.close()
    return sessions * commits / elapsed, latencies


def _async_sessions(location: str, sessions: int, commits: int) -> tuple[float, list[float]]:
    async def main() -> tuple[float, list[float]]:
        repo = await sessionlog.repository_async(location)
        stores = [await repo.create(**HEADER) for _ in range(sessions)]
        latencies: list[float] = []

        async def writer(store: Any) -> None:
            for index in range(commits):
                start = time.perf_counter()
                await store.commit([F.user_message(f"m{index}")])
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(writer(store) for store in stores))
        elapsed = time.perf_counter() - start
        for store in stores:
            await store.close()
        await repo.close()
        return sessions * commits / elapsed, latencies

    return asyncio.run(main())


def many_sessions(directory: Path, sessions: int, commits: int, rounds: int) -> dict[str, float]:
    rates: dict[str, list[float]] = {"sync": [], "async": []}
    latencies: dict[str, list[float]] = {"sync": [], "async": []}
    for round_number in range(rounds):
        for kind, run in (("sync", _sync_sessions), ("async", _async_sessions)):
            location = f"sqlite:///{directory / f'many-{kind}-{round_number}.db'}"
            rate, latency = run(location, sessions, commits)
            rates[kind].append(rate)
            latencies[kind].extend(latency)
    return {
        "sync_per_s": _median(rates["sync"]),
        "async_per_s": _median(rates["async"]),
        "ratio": _median(rates["async"]) / _median(rates["sync"]),
        "sync_p99_ms": _p99(latencies["sync"]) * 1e3,
        "async_p99_ms": _p99(latencies["async"]) * 1e3,
    }


# -- 3 and 4. listing ----------------------------------------------------------------------------


def listing(directory: Path, big: int, rounds: int) -> dict[str, float]:
    results: dict[str, float] = {}
    times: dict[int, list[float]] = {}
    for count in (100, big):
        repo = sessionlog.repository(f"sqlite:///{directory / f'list-{count}.db'}?durability=process")
        for index in range(count):
            repo.create_row(**HEADER, labels=[f"l{index % 7}"])
        times[count] = []
        for _ in range(rounds):
            start = time.perf_counter()
            repo.list(limit=100)
            times[count].append(time.perf_counter() - start)
        repo.close()
    results["sqlite_small_ms"] = _median(times[100]) * 1e3
    results["sqlite_big_ms"] = _median(times[big]) * 1e3
    results["sqlite_ratio"] = _median(times[big]) / _median(times[100])
    folder = directory / "dir"
    repo_dir = sessionlog.repository(folder, backend="jsonl")
    for index in range(big):  # sessions of 30 messages, finished, as a platform keeps them
        with repo_dir.create(**HEADER) as store:
            for step in range(30):
                store.commit([F.user_message(f"task {index} step {step} " + "x" * 200)])
    repo_dir.list(limit=None)  # builds the index
    listed, reduced = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        repo_dir.list(limit=100)
        listed.append(time.perf_counter() - start)
        start = time.perf_counter()
        for path in folder.glob("*.jsonl"):
            sessionlog.reduce_bytes(path.read_bytes())
        reduced.append(time.perf_counter() - start)
    repo_dir.close()
    results["dir_list_ms"] = _median(listed) * 1e3
    results["dir_reduce_ms"] = _median(reduced) * 1e3
    results["dir_ratio"] = _median(listed) / _median(reduced)
    return results


def run(full: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sessionlog-repositories-") as folder:
        directory = Path(folder)
        return {
            "one": one_session(directory, 25, 60 if full else 24),
            "many": many_sessions(directory, 64, 40 if full else 15, 3 if full else 2),
            "listing": listing(directory, 10_000, 5 if full else 3),
        }


def report(result: dict[str, Any]) -> str:
    one, many, listed = result["one"], result["many"], result["listing"]
    return "\n".join(
        [
            "Repositories (medians of alternating rounds; bounds beside)",
            "",
            f"1. SQLite power, 1 session: commit {one['store_us']:.0f} us, bare INSERT+COMMIT "
            f"{one['bare_us']:.0f} us: {one['ratio']:.2f}x (bound >= 0.8x); the floor of the design, a "
            f"bare INSERT + the session row's UPDATE + COMMIT, {one['bare_update_us']:.0f} us: "
            f"{one['ratio_update']:.2f}x of the bare INSERT; the store {one['ratio_floor']:.2f}x of that "
            "floor (the rest is the contract's checks, about 25 us a commit)",
            f"2. SQLite power, 64 sessions: async {many['async_per_s']:,.0f} commits/s (p99 "
            f"{many['async_p99_ms']:.1f} ms), sync with a connection per thread {many['sync_per_s']:,.0f} "
            f"(p99 {many['sync_p99_ms']:.1f} ms): {many['ratio']:.1f}x (bound >= 8x)",
            f"3. list(limit=100) over 10,000 sessions {listed['sqlite_big_ms']:.1f} ms, over 100 "
            f"{listed['sqlite_small_ms']:.1f} ms: {listed['sqlite_ratio']:.2f}x (bound <= 2x)",
            f"4. directory list of 10,000 unchanged sessions {listed['dir_list_ms']:.0f} ms, reducing them "
            f"{listed['dir_reduce_ms']:.0f} ms: {listed['dir_ratio']:.3f}x (bound <= 0.05x)",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.repositories", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--full", action="store_true", help="more rounds and commits")
    args = parser.parse_args(argv)
    print(report(run(args.full)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
