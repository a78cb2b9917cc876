"""Issue 27 review, item 7: a pending call's idempotency key is the one key of that call, across
crash -> replay, crash -> reconcile, and in a fork made at a seq after the intent, in both
runtimes, against a counterpart that deduplicates by key (`testing.ledger_service.Ledger`, its
durable SQLite ledger, here in process): every request of one call carries `call.key`, and the
ledger holds one effect per call."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from conftest import HEADER
from sessionlog.repositories.base import fork_bytes
from sessionlog.runtime_reconcile import NOT_RUN_NOTE, RAN_NOTE, reconciliation
from sessionlog.testing.ledger_service import Ledger

RUNTIMES = ["sync", "async"]


class Killed(BaseException):
    """Stands for SIGKILL inside a tool, after its effect: the runtime records nothing."""


class Counterpart:
    """The ledger and the tools against it: a `charge` declared idempotent, a `deploy` with a
    reconcile asking the ledger by key, an `echo` with neither. `kill` names the tool to kill
    once right after its effect; `asked` the keys reconcile was asked about."""

    def __init__(self, folder: Path) -> None:
        self.ledger = Ledger(folder / "ledger.db")
        self.kill: str | None = None
        self.asked: list[str] = []

    def _effect(self, kind: str) -> Any:
        def run(arguments: dict[str, Any], key: str) -> str:
            answer = self.ledger.effect(kind, key, arguments["subject"], 5)
            if self.kill == kind:
                self.kill = None
                raise Killed
            return str(answer["result"])

        return run

    def _status(self, key: str, arguments: dict[str, Any]) -> object:
        self.asked.append(key)
        found = self.ledger.status(key)
        return sessionlog.Ran(found["result"]) if found["status"] == "done" else sessionlog.DidNotRun()

    def tools(self) -> list[sessionlog.Tool]:
        return [
            sessionlog.Tool("charge", self._effect("charge"), idempotent=True),
            sessionlog.Tool("deploy", self._effect("deploy"), reconcile=self._status),
            sessionlog.Tool("echo", lambda arguments: "echoed"),
        ]

    def requests(self, kind: str) -> list[str]:
        """The key of every request of `kind`, in order (repeats included)."""
        rows = self.ledger.db.execute("SELECT key FROM requests WHERE kind = ? ORDER BY id", (kind,))
        return [row[0] for row in rows]

    def effects(self, kind: str) -> list[str]:
        rows = self.ledger.db.execute("SELECT key FROM effects WHERE kind = ?", (kind,))
        return [row[0] for row in rows]


def _calls(*names: str) -> list[dict[str, Any]]:
    return [{"id": str(i), "name": name, "arguments": {"subject": f"s{i}"}} for i, name in enumerate(names)]


def _crash(path: Path, counterpart: Counterpart, runtime: str, names: tuple[str, ...], **options: Any) -> Any:
    """One step of `names` calls, run in order until `counterpart.kill` kills one: (the keys of
    the calls, the seq of the last commit before the kill)."""

    def sync() -> tuple[list[str], int]:
        store = sessionlog.create(path, "jsonl", **HEADER)
        session = sessionlog.Session(store, tools=counterpart.tools(), model="m", **options)
        run = session.start("go")
        run.attempt().settle(None, _calls(*names))
        calls = run.start_tools()
        keys = [call.key for call in calls]  # before the runs: a key exists before its effect
        try:
            for call in calls:
                call.run()
        except Killed:
            pass
        last = session.state.last_seq
        store.close()
        return keys, last

    async def run_async() -> tuple[list[str], int]:
        store = await sessionlog.create_async(path, "jsonl-async", **HEADER)
        session = sessionlog.AsyncSession(store, tools=counterpart.tools(), model="m", **options)
        run = await session.start("go")
        await (await run.attempt()).settle(None, _calls(*names))
        calls = await run.start_tools()
        keys = [call.key for call in calls]
        try:
            for call in calls:
                await call.run()
        except Killed:
            pass
        last = (await session.state()).last_seq
        await store.close()
        return keys, last

    assert counterpart.kill is not None
    keys, last = sync() if runtime == "sync" else asyncio.run(run_async())
    assert counterpart.kill is None  # the kill happened
    return keys, last


def _resume(path: Path, counterpart: Counterpart, runtime: str) -> sessionlog.SessionState:
    def sync() -> sessionlog.SessionState:
        store = sessionlog.open(path, "jsonl")
        session = sessionlog.Session(store, tools=counterpart.tools(), model="m")
        assert session.resume() is not None
        state = session.state
        store.close()
        return state

    async def run_async() -> sessionlog.SessionState:
        store = await sessionlog.open_async(path, "jsonl-async")
        session = sessionlog.AsyncSession(store, tools=counterpart.tools(), model="m")
        assert await session.resume() is not None
        state = await session.state()
        await store.close()
        return state

    return sync() if runtime == "sync" else asyncio.run(run_async())


def _results(state: sessionlog.SessionState) -> dict[str, str]:
    """The content of each tool result by its call id."""
    return {m["tool_call_id"]: m["content"] for m in state.transcript if m["role"] == "tool"}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_crash_then_replay_sends_the_key_again_and_the_ledger_charges_once(
    tmp_path: Path, runtime: str
) -> None:
    counterpart = Counterpart(tmp_path)
    counterpart.kill = "charge"
    (key,), _ = _crash(tmp_path / "s.jsonl", counterpart, runtime, ("charge",))
    state = _resume(tmp_path / "s.jsonl", counterpart, runtime)
    assert counterpart.requests("charge") == [key, key] and counterpart.effects("charge") == [key]
    assert _results(state)["0"] == "charge s0 5 done (#1)"  # the first request's result, deduplicated
    assert state.tool_calls[0]["toolStartedId"] == key.removeprefix("sl-")


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("effect_made", [True, False], ids=["ran", "not-run"])
def test_crash_then_reconcile_asks_and_runs_with_the_key(
    tmp_path: Path, runtime: str, effect_made: bool
) -> None:
    counterpart = Counterpart(tmp_path)
    counterpart.kill = "deploy"
    (key,), _ = _crash(tmp_path / "s.jsonl", counterpart, runtime, ("deploy",))
    if not effect_made:  # the crash came before the request reached the counterpart
        counterpart.ledger.db.execute("DELETE FROM effects")
    state = _resume(tmp_path / "s.jsonl", counterpart, runtime)
    assert counterpart.asked == [key] and counterpart.effects("deploy") == [key]
    assert counterpart.requests("deploy") == [key, key] if not effect_made else [key]
    content = _results(state)["0"]
    assert reconciliation(content) == ("ran" if effect_made else "notRun")
    assert content.endswith(RAN_NOTE if effect_made else NOT_RUN_NOTE)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_fork_after_the_intents_replays_and_reconciles_with_the_original_keys(
    tmp_path: Path, runtime: str
) -> None:
    """`intents="step"`: the echo, charge and deploy intents in one transaction, the echo's
    result, then a kill in the charge after its effect. A fork at the echo's result (a seq after
    the intents) holds the charge and the deploy pending with the original's keys: the original
    and the fork both replay the charge (one charge in the ledger) and reconcile the deploy (the
    original runs it, not run; the fork finds it ran: one deploy)."""
    counterpart = Counterpart(tmp_path)
    counterpart.kill = "charge"
    original = tmp_path / "s.jsonl"
    (_, charge, deploy), last = _crash(
        original, counterpart, runtime, ("echo", "charge", "deploy"), intents="step"
    )
    data = original.read_bytes()
    header = sessionlog.reduce_bytes(data).header["id"]
    _, forked_data = fork_bytes(data, header, last)
    forked = tmp_path / "fork.jsonl"
    forked.write_bytes(forked_data)
    at_fork = sessionlog.reduce_bytes(forked_data)
    status = {t["toolName"]: (t["status"], t["toolStartedId"]) for t in at_fork.tool_calls}
    assert status == {  # the echo's result came after every intent: the fork is after them
        "echo": ("completed", status["echo"][1]),
        "charge": ("pending", charge.removeprefix("sl-")),
        "deploy": ("pending", deploy.removeprefix("sl-")),
    }

    mine = _resume(original, counterpart, runtime)
    theirs = _resume(forked, counterpart, runtime)
    assert counterpart.requests("charge") == [charge] * 3  # the run, the original's replay, the fork's
    assert counterpart.effects("charge") == [charge]
    assert counterpart.asked == [deploy, deploy]  # the original (absent: run now), the fork (done: ran)
    assert counterpart.requests("deploy") == [deploy] and counterpart.effects("deploy") == [deploy]
    assert reconciliation(_results(mine)["2"]) == "notRun" and reconciliation(_results(theirs)["2"]) == "ran"
    assert _results(mine)["1"] == _results(theirs)["1"] == "charge s1 5 done (#1)"
    assert _results(theirs)["2"] == f"{_results(mine)['2'].partition(chr(10))[0]}\n{RAN_NOTE}"
