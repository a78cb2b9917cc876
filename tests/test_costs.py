"""Costs proportional to the work: what a snapshot copies, what reading the state copies. (How
long things take is measured by `sessionlog bench`, never asserted here.)"""

from __future__ import annotations

import asyncio
import weakref
from pathlib import Path

import pytest

import sessionlog
from conftest import HEADER
from sessionlog.core import state as state_module
from sessionlog.core.commit import CommitPipeline, encode_header
from sessionlog.core.loading import load
from sessionlog.testing.sessions import tool_run


def _pipeline(steps: int) -> CommitPipeline:
    header = encode_header(cwd="/", provider="p", model="m", environment_identity="env")
    reducer, end = load(header)
    pipeline = CommitPipeline(reducer, end, 1)
    for transaction in tool_run(steps):
        pipeline.acknowledge(pipeline.prepare(transaction))
    return pipeline


def test_a_snapshot_copies_only_the_intents_that_can_still_change() -> None:
    pipeline = _pipeline(300)
    state = pipeline.state()
    assert len(state.tool_calls) == 300
    assert state._intents is not None and state._intents._tail == []  # all settled: nothing copied


def test_a_snapshot_before_a_result_still_shows_the_intent_pending(tmp_path: Path) -> None:
    transactions = list(tool_run(200))
    with sessionlog.create(tmp_path / "s.jsonl", "jsonl", **HEADER) as store:
        for transaction in transactions[:-1]:  # the last result not yet committed
            store.commit(transaction)
        before = store.load()
        assert before._intents is not None and len(before._intents._tail) == 1  # the pending one only
        store.commit(transactions[-1])
        after = store.load()
    assert [tool["status"] for tool in before.tool_calls][-2:] == ["completed", "pending"]
    assert after.tool_calls[-1]["status"] == "completed"
    assert before.operation["toolCalls"][-1]["status"] == "pending"


def test_an_async_store_keeps_a_bounded_snapshot_per_batch(tmp_path: Path) -> None:
    transactions = list(tool_run(100))

    async def main() -> None:
        async with await sessionlog.create_async(tmp_path / "s.jsonl", "jsonl-async", **HEADER) as store:
            for transaction in transactions:
                await store.commit(transaction)
            state = await store.load()
            assert len(state.tool_calls) == 100 and state._intents is not None
            assert state._intents._tail == []

    asyncio.run(main())


def test_reading_the_state_copies_only_what_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    state = _pipeline(500).state()
    copies: list[object] = []
    real = state_module.copy_json

    def counting(value: object) -> object:
        copies.append(value)
        return real(value)

    monkeypatch.setattr(state_module, "copy_json", counting)
    transcript = state.transcript
    assert len(transcript) == 1 + 500 * 2 and len(state.active_context) == len(transcript)
    assert copies == []  # a view and its length copy nothing
    last = transcript[-1]
    assert last["role"] == "tool" and copies[0] == last and len(copies) == 4  # its dict and 3 values
    last["content"] = "changed"  # a copy: the state is untouched
    assert state.transcript[-1]["content"] == "contents"
    assert transcript[:2] == list(transcript)[:2] and transcript == state.transcript.to_list()
    with pytest.raises(IndexError):
        transcript[len(transcript)]


def test_a_load_leaves_the_hosts_collector_as_it_was(tmp_path: Path) -> None:
    """No freeze: the host's cyclic garbage of the moment is still collected afterwards."""
    import gc

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    path = tmp_path / "s.jsonl"
    with sessionlog.create(path, "jsonl", **HEADER) as store:
        for transaction in tool_run(20):
            store.commit(transaction)
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            frozen = gc.get_freeze_count()
            garbage = Cycle()
            alive = weakref.ref(garbage)
            del garbage
            sessionlog.reduce_bytes(path.read_bytes())
            sessionlog.open(path).close()
            assert gc.isenabled() is enabled and gc.get_freeze_count() == frozen
            gc.collect()
            assert alive() is None  # collected: it was not frozen
        finally:
            gc.enable()
