"""The durable agent loop over an async store: `AsyncSession`, the twin of `runtime.Session`
(same methods, awaited; a tool's `run` may be a coroutine function). See `runtime`.

`run.blocked` and `run.needs_model` are properties, as in the sync runtime: they are read from
the state the session holds in hand (`AsyncSession.known`), which every awaited step of this
session refreshes after its commit; a write to the store by other code is seen after the next
awaited step (or `await session.state()`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .core import facts as build
from .core.state import SessionState
from .recovery import AsyncStore, ToolStart, facts_for_plan, recover_async
from .runtime_blocked import Blocked
from .runtime_errors import RuntimeStateError
from .runtime_facts import (
    ToolCallInput,
    begin_facts,
    check_prompt,
    oversized,
    oversized_text,
    settle_facts,
    tool_facts,
)
from .runtime_reconcile import ask_async, decision, noted, pending_of, ran_output, reconcilable
from .runtime_shared import (
    AttemptBase,
    RunBase,
    SessionBase,
    ToolCallBase,
    abort_facts,
    attempt_facts,
    blocked,
    blocked_end_facts,
    check_no_open_attempt,
    failure_text,
    finish_facts,
    needs_model,
    replay_start,
    result_facts,
)
from .tools import awaitable, tool_output


class AsyncSession(SessionBase):
    """`runtime.Session` over an async store (`sessionlog.open_async` / `create_async`); the
    arguments are `SessionBase`'s."""

    store: AsyncStore
    known: SessionState | None = None
    """The state this session last read or committed: what `AsyncRun.blocked` and `needs_model`
    are read from without awaiting."""

    async def state(self) -> SessionState:
        self.known = await self.store.load()
        return self.known

    async def commit(self, facts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Commit through the store, then refresh `known`."""
        try:
            return await self.store.commit(facts)
        finally:
            await self.state()

    async def start(self, prompt: str) -> AsyncRun:
        check_prompt(prompt)
        if not (await self.state()).is_idle:
            raise RuntimeStateError("a run is in progress: resume() or finish it first")
        _, run = await self.commit(build.accept_prompt(prompt))
        return AsyncRun(self, run["record"]["operationId"])

    async def resume(self) -> AsyncRun | None:
        self.open_attempt_id = None
        current = self.configuration.current
        hold = reconcilable(self.tools)
        while True:
            plan = await recover_async(self.store, current, in_order=True, hold=hold)
            state = await self.state()
            if state.is_idle:
                return None
            start = pending_of(state, plan, self.tools)
            if start is not None:
                await self.reconcile(state, plan, start)
                continue
            if plan["type"] != "startTool":
                return AsyncRun(self, state.operation["operationId"])
            if plan["mode"] == "replay":
                await AsyncToolCall(self, replay_start(state, plan), begun=True).run()
            else:
                for call in await AsyncRun(self, state.operation["operationId"]).start_tools():
                    await call.run()

    async def reconcile(self, state: SessionState, plan: Mapping[str, Any], start: ToolStart) -> None:
        """`Session.reconcile`, awaited (`runtime_reconcile.ask_async`)."""
        tool = self.tools[start.tool_name]
        answer = await ask_async(tool, start)
        reconciled, ran = decision(tool, start, answer)
        self.reconciled.append(reconciled)
        decided = reconciled.decision
        call = AsyncToolCall(self, start, begun=True)
        if ran is not None:
            await call.record_reconciled(*ran_output(tool, reconciled, ran))
        elif decided == "notRun":
            call.note = "notRun"
            await call.run()
        else:
            await self.commit(facts_for_plan(state, plan, self.configuration.current))


class AsyncRun(RunBase):
    session: AsyncSession

    async def _state(self) -> SessionState:
        return self.check_current(await self.session.state())

    def _known(self) -> SessionState | None:
        known = self.session.known
        return known if known is not None and self.is_current(known) else None

    @property
    def needs_model(self) -> bool:
        """As `Run.needs_model`, from the state in hand (`AsyncSession.known`)."""
        known = self._known()
        return known is not None and needs_model(known, self.session.configuration)

    @property
    def blocked(self) -> Blocked | None:
        """As `Run.blocked`, from the state in hand (`AsyncSession.known`)."""
        known = self._known()
        return None if known is None else blocked(known, self.session.configuration)

    async def end(self) -> dict[str, Any]:
        facts, _ = blocked_end_facts(await self._state(), self.session.configuration)
        await self.session.commit(facts)
        self.session.open_attempt_id = None
        await recover_async(self.session.store, self.session.configuration.current, in_order=True)
        return (await self.session.state()).last_finished or {}

    async def restart(self) -> AsyncRun:
        _, prompt = blocked_end_facts(await self._state(), self.session.configuration)
        await self.end()
        new = await self.session.start(prompt)
        self.restarted_as = new.operation_id
        return new

    async def attempt(self) -> AsyncAttempt:
        state = await self._state()
        check_no_open_attempt(self.session, state)
        (fact,) = await self.session.commit(attempt_facts(state, self.session.configuration))
        self.session.open_attempt_id = fact["record"]["attemptId"]
        return AsyncAttempt(self, fact["record"])

    async def start_tools(self) -> list[AsyncToolCall]:
        session = self.session
        facts, starts = tool_facts(
            await self._state(), session.tools, session.configuration.current, intents=session.intents
        )
        if facts:
            await session.commit(facts)
        return [AsyncToolCall(session, start, begun=session.intents == "step") for start in starts]

    async def finish(self) -> dict[str, Any]:
        await self.session.commit(finish_facts(await self._state(), self.session.configuration))
        return (await self.session.state()).last_finished or {}

    async def abort(self) -> dict[str, Any]:
        facts = abort_facts(await self._state())
        if facts:
            await self.session.commit(facts)
        await recover_async(self.session.store, self.session.configuration.current)
        return (await self.session.state()).last_finished or {}


class AsyncAttempt(AttemptBase):
    run: AsyncRun

    async def settle(
        self,
        content: str | None,
        tool_calls: Sequence[ToolCallInput] = (),
        *,
        usage: Mapping[str, int] | None = None,
        stop_reason: str | None = None,
    ) -> None:
        session = self.run.session
        await session.commit(
            settle_facts(await session.state(), self.record, content, tool_calls, usage, stop_reason)
        )
        session.open_attempt_id = None

    async def fail(self, code: str, message: str) -> None:
        await self.run.session.commit(self._failed(code, message))
        self.run.session.open_attempt_id = None


class AsyncToolCall(ToolCallBase):
    session: AsyncSession

    async def begin(self) -> None:
        await self._begin()
        self.by_caller = True

    async def _begin(self) -> None:
        if not self.begun:
            await self.session.commit(begin_facts(await self.session.state(), self.start))
            self.begun = True

    async def run(self) -> str:
        self.check_can_run(await self.session.state())
        await self._begin()
        self.tool_ran = True
        try:
            output = self.call_tool()
            if awaitable(output):  # by its type: an output's own code never runs here
                output = await output
        except Exception as error:
            return await self._record(failure_text(error), False, None, self.note)
        text, ok = tool_output(self.name, output)
        return await self._record(text, ok, None, self.note)

    async def finish(self, output: str, *, ok: bool = True, usage: Mapping[str, int] | None = None) -> None:
        self._check_begun()
        if self.tool_ran:
            self.check_can_run(await self.session.state())
        await self._record(output, ok, usage)

    async def fail(self, message: str) -> None:
        await self.finish(message, ok=False)

    async def record_reconciled(self, text: str, ok: bool) -> str:
        """The result reconciliation found (`Ran`): the call ran before the crash."""
        return await self._record(text, ok, None, "ran")

    async def _record(
        self, output: str, ok: bool, usage: Mapping[str, int] | None, note: str | None = None
    ) -> str:
        self.check_can_record(await self.session.state())
        try:
            await self.session.commit(result_facts(self.start, output, ok, usage, note))
        except ValueError as error:
            if not oversized(error):
                raise
            output = oversized_text(output, error)
            await self.session.commit(result_facts(self.start, output, False, usage, note))
        return noted(output, note)
