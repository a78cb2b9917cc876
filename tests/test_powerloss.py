"""Power loss, simulated: every crash state of recorded file-operation traces, per backend
(`sessionlog.testing.powerloss` has the model). Power class: every state opens and holds every
commit whose sync returned. Process class: the states that lose acknowledged commits are counted
(the class promises kill -9, not power loss). No state of either class may be misread.

Also the NUL rule itself (`core.loading`, `nul_tail=True`, power class only).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from conftest import FILE_BACKENDS
from sessionlog import CorruptionError, reduce_bytes
from sessionlog.core.framing import NUL_WINDOW, SECTOR, committed_length
from sessionlog.testing.bitflips import run_bit_flips
from sessionlog.testing.powerloss import (
    PowerLossReport,
    check_trace,
    crash_states,
    record_trace,
    run_powerloss,
)

SOAK = os.environ.get("SESSIONLOG_SOAK") == "1"
TRACES = 1_000 if SOAK else 100  # per backend
BACKENDS = FILE_BACKENDS
INFO = sessionlog.backends()
POWER = [name for name in BACKENDS if INFO[name].durability == "power"]
PROCESS = [name for name in BACKENDS if INFO[name].durability == "process"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], PowerLossReport]:
    cache: dict[str, PowerLossReport] = {}

    def get(backend: str) -> PowerLossReport:
        if backend not in cache:
            folder = tmp_path_factory.mktemp(f"power-{backend}")
            report = cache[backend] = run_powerloss(backend, TRACES, directory=folder)
            print(
                f"\n{backend} ({report.durability}): {report.traces} traces, {report.states} crash states "
                f"({report.reductions} distinct images reduced), {report.opened} open, {report.refused} "
                f"refused, {report.missing} missing, {report.nul_tails} NUL tails dropped, "
                f"{report.lost_states} states lose acknowledged commits (at most {report.max_lost}), "
                f"{report.misread} misread; outside the model: {report.outside_model} "
                f"({report.outside_refused} refused); {report.reopened} reopened + appended"
            )
        return cache[backend]

    return get


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_crash_state_is_misread(backend: str, reports: Callable[[str], PowerLossReport]) -> None:
    """Whatever a state reduces to is a line prefix of what was written, in either class."""
    report = reports(backend)
    assert report.traces == TRACES and report.states > 0
    assert report.misread == 0, report.violations[:5]


@pytest.mark.parametrize("backend", POWER)
def test_power_class_every_state_opens_and_holds_every_synced_commit(
    backend: str, reports: Callable[[str], PowerLossReport]
) -> None:
    report = reports(backend)
    assert report.violations == []
    assert report.reopened > 0
    assert report.lost_states == 0


@pytest.mark.parametrize("backend", PROCESS)
def test_process_class_losses_are_counted(backend: str, reports: Callable[[str], PowerLossReport]) -> None:
    """The trade-off, measured: without fsync, power loss can take acknowledged commits."""
    report = reports(backend)
    assert report.lost_states > 0 and report.max_lost > 0
    assert report.violations == []  # losses are counted, never violations, in this class


def test_a_backend_that_claims_power_without_syncing_is_caught(tmp_path: Path) -> None:
    """The model is not vacuous: `jsonl` never syncs, so checked as power class it fails."""
    trace = record_trace("jsonl", 7, tmp_path)
    trace.durability = "power"
    report = check_trace(trace)
    assert report.lost_states > 0 and report.violations


def test_byte_prefix_classes_stand_for_every_byte_prefix(tmp_path: Path) -> None:
    """The enumeration reduces two members of each class of byte prefixes with equal committed
    part; here every member of every class at every crash point is reduced, and agrees."""
    trace = record_trace("jsonl-fsync", 3, tmp_path)
    from sessionlog.testing import disk_model

    model = disk_model._Model()
    checked = 0
    for op in trace.ops:
        model.apply(op)
        inode = model.names.get(trace.path)
        if inode is None or op.kind != "write":
            continue
        data = bytes(inode.data)
        expected = {}
        for cut in range(inode.low, len(data) + 1):
            image = data[:cut]
            state = reduce_bytes(image, nul_tail=True)
            key = committed_length(image)
            assert expected.setdefault(key, state.to_json()) == state.to_json()
            checked += 1
    assert checked > 1_000


def test_every_state_is_enumerated_once_per_fate(tmp_path: Path) -> None:
    trace = record_trace("jsonl-group", 5, tmp_path)
    fates = {state.fate for state in crash_states(trace)}
    assert {"synced", "prefix", "zeroed", "zero-tail", "garbage", "stale-lf", "missing"} <= fates
    total = sum(state.weight for state in crash_states(trace))
    assert total == check_trace(trace).states


# -- the NUL rule --------------------------------------------------------------------------------


def _session(tmp_path: Path, backend: str = "jsonl-fsync", commits: int = 3) -> Path:
    path = tmp_path / f"{backend}.jsonl"
    facts = [[_user(f"m{number}" * 300)] for number in range(commits)]  # lines over a sector
    if INFO[backend].api == "sync":
        with sessionlog.create(path, backend, provider="p", model="m", cwd="/") as store:
            for transaction in facts:
                store.commit(transaction)
        return path

    async def main() -> None:
        store = await sessionlog.create_async(path, backend, provider="p", model="m", cwd="/")
        try:
            for transaction in facts:
                await store.commit(transaction)
        finally:
            await store.close()

    asyncio.run(main())
    return path


def _user(content: str) -> dict[str, Any]:
    return {"kind": "entry", "entry": {"type": "message", "message": {"role": "user", "content": content}}}


def _line_starts(data: bytes) -> list[int]:
    return [0, *[index + 1 for index, byte in enumerate(data) if byte == 0x0A][:-1]]


def _with_nul_in_line(data: bytes, line: int) -> bytes:
    """A hole a power loss leaves: NULs from where `line` begins to the next sector boundary (the
    header is shorter than a sector: NULs up to its LF)."""
    at = _line_starts(data)[line - 1]
    stop = min((at // SECTOR + 1) * SECTOR, data.index(b"\n", at))
    return data[:at] + bytes(stop - at) + data[stop:]


def test_the_nul_rule_takes_only_a_nul_bearing_last_line(tmp_path: Path) -> None:
    data = _session(tmp_path).read_bytes()
    last = _with_nul_in_line(data, 4)
    with pytest.raises(CorruptionError) as caught:
        reduce_bytes(last)  # not asked for (process class): corruption
    assert (caught.value.code, caught.value.line) == ("MALFORMED_JSON", 4)
    state = reduce_bytes(last, nul_tail=True)
    assert state.repaired_length == data.rfind(b"\n", 0, len(data) - 1) + 1
    assert state.last_seq == 2
    for line in (1, 2, 3):  # not the last line: corruption even in the power class
        with pytest.raises(CorruptionError) as caught:
            reduce_bytes(_with_nul_in_line(data, line), nul_tail=True)
        assert caught.value.line == line
    assert reduce_bytes(data, nul_tail=True) == reduce_bytes(data)  # nothing to drop
    torn_nul = data + b'{"kind":' + bytes(5)  # NULs in the torn tail: torn anyway
    assert reduce_bytes(torn_nul).repaired_length == len(data)


def test_a_stray_nul_is_corruption_even_in_the_last_line(tmp_path: Path) -> None:
    """One flipped bit (a space becomes NUL) is no power-loss hole: refused, never cut."""
    data = _session(tmp_path).read_bytes()
    last = _line_starts(data)[-1]
    for at in (last + 40, (last // SECTOR + 1) * SECTOR):  # inside the line; at a sector boundary
        flipped = data[:at] + b"\0" + data[at + 1 :]
        with pytest.raises(CorruptionError) as caught:
            reduce_bytes(flipped, nul_tail=True, nul_window=NUL_WINDOW)
        assert (caught.value.code, caught.value.line) == ("MALFORMED_JSON", 4)


def test_a_hole_must_start_at_the_write_or_a_sector_and_end_at_a_sector_or_the_end(tmp_path: Path) -> None:
    data = _session(tmp_path).read_bytes()
    last = _line_starts(data)[-1]
    boundary = (last // SECTOR + 1) * SECTOR
    cut = {"nul_tail": True}
    holes = {
        "from the write to a sector": (last, boundary),
        "a whole sector": (boundary, boundary + SECTOR),
        "from a sector to the end": (boundary, len(data)),
    }
    for name, (start, stop) in holes.items():
        image = data[:start] + bytes(stop - start) + data[stop:]
        if stop == len(data):  # the LF went too: the hole is part of a torn tail
            assert reduce_bytes(image, **cut).repaired_length == last, name
            continue
        assert reduce_bytes(image, **cut).repaired_length == last, name
    not_holes = {
        "ends inside a sector": (last, boundary - 1),
        "starts inside a line and a sector": (last + 1, boundary),
        "starts before the last write": (last - 1, boundary),
    }
    for name, (start, stop) in not_holes.items():
        image = data[:start] + bytes(stop - start) + data[stop:]
        with pytest.raises(CorruptionError):
            reduce_bytes(image, **cut)
            pytest.fail(name)


@pytest.mark.parametrize("backend", POWER)
def test_every_single_bit_flip_of_a_synced_power_class_log_is_refused_or_keeps_every_line(
    backend: str, tmp_path: Path
) -> None:
    """The bit-flip sweep: no flip of any bit of a synced log makes a store drop a line."""
    report = run_bit_flips(backend, tmp_path)
    assert report.shortened == []
    assert report.flips == report.refused + report.kept
    assert report.refused and report.kept  # most flips break a line; some change a letter in text


def test_power_class_stores_open_a_nul_tail_and_cut_it(tmp_path: Path) -> None:
    for backend in BACKENDS:
        path = _session(tmp_path, backend)
        clean = path.read_bytes()
        path.write_bytes(_with_nul_in_line(clean, 4))
        if INFO[backend].durability == "process":
            with pytest.raises(CorruptionError):
                _open_and_commit(path, backend)
            continue
        _open_and_commit(path, backend)
        data = path.read_bytes()
        cut = clean.rfind(b"\n", 0, len(clean) - 1) + 1
        assert data.startswith(clean[:cut]) and b"\0" not in data
        assert reduce_bytes(data).last_seq == 3  # two kept, the NUL line gone, one new


def _open_and_commit(path: Path, backend: str) -> None:
    fact = _user("after")
    if INFO[backend].api == "sync":
        with sessionlog.open(path, backend) as store:
            store.commit([fact])
        return

    async def main() -> None:
        store = await sessionlog.open_async(path, backend)
        try:
            await store.commit([fact])
        finally:
            await store.close()

    asyncio.run(main())
