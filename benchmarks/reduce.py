"""The reducer's cost: throughput against a bare parse, linearity in size, peak memory.

    python -m benchmarks.reduce [--full] [--json]

All figures come from one run, on generated valid sessions (``sessionlog.testing.sessions``,
profile ``bulk``: ~500-byte messages, tool-using runs, usage facts, two compactions):

* **throughput ratio** = t(split into lines + ``orjson.loads`` each) / t(``reduce_bytes``) on the
  same bytes of a 100,000-fact session. 1.0 would mean validating costs nothing over parsing.
  Target >= 0.3.
* **linearity** = t(``reduce_bytes``, 100,000 facts) / t(``reduce_bytes``, 10,000 facts), same
  seed and profile. 10 is linear. Target <= 12.
* **memory ratio** = peak memory while reducing the 100,000-fact session / its file size,
  measured with ``tracemalloc`` in a child process: the bytes are read before tracing starts, so
  the input buffer is not counted; the peak includes the reduced state, which stays alive.
  Target <= 6. The child's peak resident set (``VmHWM``; it includes the interpreter, the
  input bytes and tracemalloc's own overhead) is reported alongside.

The same three figures are also measured on profile ``bulk-flat`` (the same sessions without
compactions, under ``without_compactions``): a compaction digests every message so far, so the
difference is the O(session) cost of compacting (``canonical.source_digest``).

The throughput ratio depends on the bytes per fact: parsing costs per byte, validating mostly per
fact. ``by_text_scale`` measures it on ``bulk-flat`` sessions of 20,000 facts whose message and
argument texts are 1, 4, 16 and 64 times as long (``generate_session(text_scale=...)``): from
~620 to ~8,800 bytes per fact.

Times are best of N (N = 3 quick, 7 full), from a warm page cache, with no I/O timed; the machine
should be otherwise idle.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from benchmarks.ceilings import percentile
from sessionlog import reduce_bytes
from sessionlog.testing.sessions import GeneratedSession, generate_session

FACTS = 100_000
SMALL_FACTS = 10_000
SEED = 20_240_601
TARGETS = {"throughput_ratio": 0.3, "linearity": 12.0, "memory_ratio": 6.0}

_MEMORY_PROBE = textwrap.dedent(
    """
    import json, resource, sys, tracemalloc
    from sessionlog import reduce_bytes
    data = open(sys.argv[1], "rb").read()
    tracemalloc.start()
    state = reduce_bytes(data)
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    try:  # VmHWM is reset by exec; ru_maxrss would still hold the forking parent's peak
        status = open("/proc/self/status").read()
        rss = int(status.split("VmHWM:")[1].split()[0]) * 1024
    except (OSError, IndexError):
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"peak": peak, "retained": current, "maxrss": rss, "seq": state.last_seq}))
    """
)


def _timings(function: Callable[[], object], repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return samples


def _bare_parse(data: bytes) -> int:
    """The floor: what any JSON-lines load must do."""
    loads = orjson.loads
    count = 0
    for line in data.splitlines():
        loads(line)
        count += 1
    return count


_UUID7 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}").fullmatch


def _floor(data: bytes) -> int:
    """The least any exact reducer must do: split, parse, prove every line free of duplicate keys
    (the same re-encoding check as `core.framing`), and the five checks every fact needs (seq in
    order, a fresh UUIDv7 id, an integer timestamp, a known kind). No rule of any fact type, no
    state. What a reducer may spend on the ~40 type-specific rules is the target's budget less this."""
    loads, dumps, uuid7 = orjson.loads, orjson.dumps, _UUID7
    kinds = ("entry", "record", "usage")
    ids: set[str] = set()
    expected = 1
    lines = data.split(b"\n")
    for raw in lines[1 : len(lines) - 1]:
        value = loads(raw)
        if dumps(value) != raw:
            raise ValueError("not compact JSON")
        for fact in value if type(value) is list else (value,):
            seq, fact_id, timestamp = fact.get("seq"), fact.get("id"), fact.get("timestamp")
            if (
                type(seq) is not int
                or seq != expected
                or type(fact_id) is not str
                or uuid7(fact_id) is None
                or fact_id in ids
                or type(timestamp) is not int
                or fact.get("kind") not in kinds
            ):
                raise ValueError(f"fact {seq} fails a check every fact needs")
            ids.add(fact_id)
            expected += 1
    return expected - 1


def _memory(data: bytes) -> dict[str, int]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "session.jsonl"
        path.write_bytes(data)
        done = subprocess.run(
            [sys.executable, "-c", _MEMORY_PROBE, str(path)], capture_output=True, text=True, check=True
        )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _compactions(session: GeneratedSession) -> int:
    return sum(
        1
        for transaction in session.transactions
        for fact in transaction
        if fact["kind"] == "record" and fact["record"]["type"] == "compactionStarted"
    )


def measure(profile: str = "bulk", repeats: int = 3) -> dict[str, Any]:
    """The three figures for sessions of one generator profile."""
    started = time.perf_counter()
    session = generate_session(SEED, FACTS, profile=profile)
    generate_s = time.perf_counter() - started
    data = session.to_bytes()
    small = generate_session(SEED, SMALL_FACTS, profile=profile).to_bytes()
    if reduce_bytes(data).last_seq != FACTS or reduce_bytes(small).last_seq != SMALL_FACTS:
        raise RuntimeError("the generated sessions did not reduce to their fact counts")
    lines = _bare_parse(data)
    if _floor(data) != FACTS:
        raise RuntimeError("the floor loop did not count every fact")
    reduce_times = _timings(lambda: reduce_bytes(data), repeats)
    parse_times = _timings(lambda: _bare_parse(data), repeats)
    floor_times = _timings(lambda: _floor(data), repeats)
    small_times = _timings(lambda: reduce_bytes(small), repeats * 3)
    memory = _memory(data)
    reduce_s, parse_s, small_s = min(reduce_times), min(parse_times), min(small_times)
    floor_s = min(floor_times)
    figures = {
        "throughput_ratio": parse_s / reduce_s,
        "linearity": reduce_s / small_s,
        "memory_ratio": memory["peak"] / len(data),
    }
    return {
        "profile": profile,
        "facts": FACTS,
        "bytes": len(data),
        "lines": lines,
        "compactions": _compactions(session),
        "small_facts": SMALL_FACTS,
        "small_bytes": len(small),
        "repeats": repeats,
        "generate_s": generate_s,
        "reduce_s": reduce_s,
        "reduce_p50_s": percentile(reduce_times, 50),
        "parse_s": parse_s,
        "floor_s": floor_s,
        "floor_ratio": parse_s / floor_s,
        # per fact: what the target leaves for the type-specific rules, and what they take here
        "rules_budget_us": (parse_s / TARGETS["throughput_ratio"] - floor_s) / FACTS * 1e6,
        "rules_us": (reduce_s - floor_s) / FACTS * 1e6,
        "small_reduce_s": small_s,
        "facts_per_s": FACTS / reduce_s,
        "mb_per_s": len(data) / reduce_s / 1e6,
        "peak_bytes": memory["peak"],
        "retained_bytes": memory["retained"],
        "maxrss_bytes": memory["maxrss"],
        "memory_method": "tracemalloc peak in a child process (input bytes read before tracing)",
        **figures,
        "targets": dict(TARGETS),
        "meets": {
            "throughput_ratio": figures["throughput_ratio"] >= TARGETS["throughput_ratio"],
            "linearity": figures["linearity"] <= TARGETS["linearity"],
            "memory_ratio": figures["memory_ratio"] <= TARGETS["memory_ratio"],
        },
    }


TEXT_SCALES = (1, 4, 16, 64)
SCALE_FACTS = 20_000


def by_text_scale(repeats: int = 3) -> list[dict[str, Any]]:
    """The throughput ratio as the texts grow: where validating per fact stops dominating."""
    out = []
    for scale in TEXT_SCALES:
        data = generate_session(SEED, SCALE_FACTS, profile="bulk-flat", text_scale=scale).to_bytes()
        reduce_s = min(_timings(lambda: reduce_bytes(data), repeats))  # noqa: B023
        parse_s = min(_timings(lambda: _bare_parse(data), repeats))  # noqa: B023
        out.append(
            {
                "text_scale": scale,
                "facts": SCALE_FACTS,
                "bytes_per_fact": len(data) / SCALE_FACTS,
                "reduce_s": reduce_s,
                "parse_s": parse_s,
                "throughput_ratio": parse_s / reduce_s,
                "mb_per_s": len(data) / reduce_s / 1e6,
            }
        )
    return out


def run(quick: bool = True) -> dict[str, Any]:
    """The figures on the bulk profile (the headline), and on bulk-flat, the same sessions
    without compactions, under ``without_compactions``: the difference is what compacting costs."""
    repeats = 3 if quick else 7
    result = measure("bulk", repeats)
    result["without_compactions"] = measure("bulk-flat", repeats)
    result["by_text_scale"] = by_text_scale(max(repeats, 5))  # small sessions: more repeats are cheap
    return result


def _table(result: dict[str, Any]) -> str:
    meets = result["meets"]
    targets = result["targets"]
    rows = [
        ("throughput ratio (parse / reduce)", "throughput_ratio", ">=", 3),
        ("linearity (100k / 10k)", "linearity", "<=", 2),
        ("peak memory / file size", "memory_ratio", "<=", 2),
    ]
    out = [
        f"session: {result['facts']:,} facts, {result['bytes'] / 1e6:.1f} MB, {result['lines']:,} lines, "
        f"{result['compactions']} compactions (profile {result['profile']}; "
        f"generated in {result['generate_s']:.1f} s)",
        f"reduce_bytes {result['reduce_s']:.3f} s ({result['facts_per_s']:,.0f} facts/s, "
        f"{result['mb_per_s']:.1f} MB/s); bare split+orjson.loads {result['parse_s']:.3f} s; "
        f"{result['small_facts']:,} facts {result['small_reduce_s']:.3f} s; best of {result['repeats']}",
        f"floor (parse + duplicate-key check + the 5 checks every fact needs) {result['floor_s']:.3f} s = "
        f"{result['floor_ratio']:.3f}x; per fact, the target leaves {result['rules_budget_us']:.2f} us "
        f"for the type-specific rules, which take {result['rules_us']:.2f} us here",
        f"memory: {result['memory_method']}: peak {result['peak_bytes'] / 1e6:.1f} MB, "
        f"child peak RSS {result['maxrss_bytes'] / 1e6:.1f} MB",
        "",
        f"{'figure':<36} {'measured':>10} {'target':>10}  ok",
    ]
    for label, key, sense, digits in rows:
        measured = f"{result[key]:.{digits}f}x"
        out.append(f"{label:<36} {measured:>10} {sense + ' ' + str(targets[key]) + 'x':>10}  ")
        out[-1] += "yes" if meets[key] else "NO"
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    result = run(quick="--full" not in args)
    if "--json" in args:
        print(json.dumps(result, indent=1))
    else:
        print(_table(result))
        print("\nthe same without compactions (profile bulk-flat):")
        print(_table(result["without_compactions"]))
        print(f"\nthroughput ratio by text length (bulk-flat, {SCALE_FACTS:,} facts):")
        print(f"{'text scale':>10} {'bytes/fact':>11} {'parse/reduce':>13} {'reduce MB/s':>12}")
        for row in result["by_text_scale"]:
            print(
                f"{row['text_scale']:>10} {row['bytes_per_fact']:>11,.0f} "
                f"{row['throughput_ratio']:>12.3f}x {row['mb_per_s']:>12.0f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
