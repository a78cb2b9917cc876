"""The durable agent loop over an async store: `AsyncSession`, the twin of `runtime.Session`
(same methods, awaited; a tool's `run` may be a coroutine function). See `runtime`."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from .core import facts as build
from .core.state import SessionState
from .recovery import AsyncStore, recover_async
from .runtime import (
    AttemptBase,
    RunBase,
    RuntimeStateError,
    SessionBase,
    ToolCallBase,
    ToolCallInput,
    abort_facts,
    attempt_facts,
    begin_facts,
    blocked,
    blocked_end_facts,
    check_no_open_attempt,
    failure_text,
    finish_facts,
    needs_model,
    replay_start,
    result_facts,
    settle_facts,
    tool_facts,
)
from .runtime_blocked import Blocked
from .tools import tool_output


class AsyncSession(SessionBase):
    """`runtime.Session` over an async store (`sessionlog.open_async` / `create_async`); the
    arguments are `SessionBase`'s."""

    store: AsyncStore

    async def state(self) -> SessionState:
        return await self.store.load()

    async def start(self, prompt: str) -> AsyncRun:
        if not (await self.state()).is_idle:
            raise RuntimeStateError("a run is in progress: resume() or finish it first")
        _, run = await self.store.commit(build.accept_prompt(prompt))
        return AsyncRun(self, run["record"]["operationId"])

    async def resume(self) -> AsyncRun | None:
        self.open_attempt_id = None
        current = self.configuration.current
        while True:
            plan = await recover_async(self.store, current, in_order=True)
            state = await self.store.load()
            if state.is_idle:
                return None
            if plan["type"] != "startTool":
                return AsyncRun(self, state.operation["operationId"])
            if plan["mode"] == "replay":
                await AsyncToolCall(self, replay_start(state, plan), begun=True).run()
            else:
                for call in await AsyncRun(self, state.operation["operationId"]).start_tools():
                    await call.run()


class AsyncRun(RunBase):
    session: AsyncSession

    async def needs_model(self) -> bool:
        return needs_model(await self.session.state(), self.session.configuration)

    async def blocked(self) -> Blocked | None:
        return blocked(await self.session.state(), self.session.configuration)

    async def end(self) -> dict[str, Any]:
        facts, _ = blocked_end_facts(await self.session.state(), self.session.configuration)
        await self.session.store.commit(facts)
        self.session.open_attempt_id = None
        await recover_async(self.session.store, self.session.configuration.current, in_order=True)
        return (await self.session.state()).last_finished or {}

    async def restart(self) -> AsyncRun:
        _, prompt = blocked_end_facts(await self.session.state(), self.session.configuration)
        await self.end()
        return await self.session.start(prompt)

    async def attempt(self) -> AsyncAttempt:
        state = await self.session.state()
        check_no_open_attempt(self.session, state)
        (fact,) = await self.session.store.commit(attempt_facts(state, self.session.configuration))
        self.session.open_attempt_id = fact["record"]["attemptId"]
        return AsyncAttempt(self, fact["record"])

    async def start_tools(self) -> list[AsyncToolCall]:
        session = self.session
        facts, starts = tool_facts(
            await session.state(), session.tools, session.configuration.current, intents=session.intents
        )
        if facts:
            await session.store.commit(facts)
        return [AsyncToolCall(session, start, begun=session.intents == "step") for start in starts]

    async def finish(self) -> dict[str, Any]:
        await self.session.store.commit(finish_facts(await self.session.state(), self.session.configuration))
        return (await self.session.state()).last_finished or {}

    async def abort(self) -> dict[str, Any]:
        facts = abort_facts(await self.session.state())
        if facts:
            await self.session.store.commit(facts)
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
        store = self.run.session.store
        await store.commit(
            settle_facts(await store.load(), self.record, content, tool_calls, usage, stop_reason)
        )
        self.run.session.open_attempt_id = None

    async def fail(self, code: str, message: str) -> None:
        await self.run.session.store.commit(self._failed(code, message))
        self.run.session.open_attempt_id = None


class AsyncToolCall(ToolCallBase):
    session: AsyncSession

    async def begin(self) -> None:
        if not self.begun:
            await self.session.store.commit(begin_facts(await self.session.state(), self.start))
            self.begun = True

    async def run(self) -> str:
        await self.begin()
        try:
            output = self.session.tools[self.name].run(self.arguments)
            if inspect.isawaitable(output):
                output = await output
        except Exception as error:
            await self.fail(failure_text(error))
            return failure_text(error)
        text, ok = tool_output(self.name, output)
        await self.finish(text, ok=ok)
        return text

    async def finish(self, output: str, *, ok: bool = True, usage: Mapping[str, int] | None = None) -> None:
        self._check_begun()
        await self.session.store.commit(result_facts(self.start, output, ok, usage))

    async def fail(self, message: str) -> None:
        await self.finish(message, ok=False)
