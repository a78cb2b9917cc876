"""Acknowledged commits stay, whoever else touches the session: the NUL rule, the single writer,
fork, dropped stores, interrupted commits."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import sessionlog
from conftest import HEADER
from sessionlog import CorruptionError
from sessionlog.core.framing import NUL_WINDOW


def _user(text: str) -> dict[str, object]:
    return {"kind": "entry", "entry": {"type": "message", "message": {"role": "user", "content": text}}}


# -- 1. the NUL rule ---------------------------------------------------------------------------


def test_a_flipped_bit_in_a_group_commit_log_is_refused_not_cut(tmp_path: Path) -> None:
    """One space turned NUL in line 50 of 100 synced commits: refused, nothing truncated."""
    path = tmp_path / "s.jsonl"

    async def write() -> None:
        async with await sessionlog.create_async(path, "jsonl-group", **HEADER) as store:
            for index in range(100):
                await store.commit([_user(f"message number {index}")])

    asyncio.run(write())
    data = path.read_bytes()
    starts = [0, *[index + 1 for index, byte in enumerate(data) if byte == 0x0A]]
    at = data.index(b" ", starts[49])  # line 50
    flipped = data[:at] + b"\0" + data[at + 1 :]
    path.write_bytes(flipped)

    async def reopen() -> None:
        await sessionlog.open_async(path, "jsonl-group")

    with pytest.raises(CorruptionError) as caught:
        asyncio.run(reopen())
    assert (caught.value.code, caught.value.line) == ("MALFORMED_JSON", 50)
    assert path.read_bytes() == flipped  # nothing cut


def test_a_batch_larger_than_the_format_window_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="max_batch_bytes is at most"):
            await sessionlog.create_async(
                tmp_path / "s.jsonl", "jsonl-group", max_batch_bytes=NUL_WINDOW + 1, **HEADER
            )

    asyncio.run(main())
    assert not (tmp_path / "s.jsonl").exists()  # validated before the disk was touched


# -- 8. bad arguments leave nothing behind ------------------------------------------------------

BAD_ARGUMENTS = [
    {"provider": ""},
    {"model": 5},
    {"cwd": ""},
    {"environment_identity": ""},
    {"session_id": "not-a-uuid"},
    {"max_line_bytes": 0},
    {"bogus": 1},
]


@pytest.mark.parametrize("bad", BAD_ARGUMENTS, ids=lambda bad: next(iter(bad)))
@pytest.mark.parametrize("backend", ["jsonl", "jsonl-fsync", "jsonl-async", "jsonl-group"])
def test_create_checks_every_argument_before_touching_the_disk(
    backend: str, bad: dict[str, object], tmp_path: Path
) -> None:
    path = tmp_path / "s.jsonl"
    arguments = {**HEADER, **bad}
    api = sessionlog.backends()[backend].api

    def create(**arguments: object) -> None:
        if api == "sync":
            sessionlog.create(path, backend, **arguments).close()  # type: ignore[arg-type]
            return

        async def main() -> None:
            await (await sessionlog.create_async(path, backend, **arguments)).close()  # type: ignore[arg-type]

        asyncio.run(main())

    with pytest.raises((sessionlog.ValidationError, ValueError, TypeError)):
        create(**arguments)
    assert list(tmp_path.iterdir()) == []  # no session, no temporary file
    create(**HEADER)  # the retry with good arguments is not refused as "exists"
    assert path.exists()
