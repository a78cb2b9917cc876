"""The durable agent loop over an async store: `AsyncSession`, the twin of `runtime.Session`
(same methods, awaited; a tool's `run` may be a coroutine function). See `runtime`."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .core import facts as build
from .core.state import SessionState
from .recovery import AsyncStore, ToolStart, recover_async
from .runtime import (
    RuntimeStateError,
    ToolCallInput,
    abort_facts,
    attempt_facts,
    blocked,
    declarations,
    failure_text,
    finish_facts,
    needs_model,
    replay_start,
    result_facts,
    settle_facts,
    tool_facts,
)
from .tools import Configuration, Tool, Tools


class AsyncSession:
    """`runtime.Session` over an async store (`sessionlog.open_async` / `create_async`)."""

    def __init__(
        self,
        store: AsyncStore,
        *,
        tools: Tools | Iterable[Tool],
        model: str,
        system_prompt: str = "",
        adapter: str = "sessionlog",
        routing: str = "default",
        output_options: Mapping[str, Any] | None = None,
        environment: str | None = None,
    ) -> None:
        self.store = store
        self.tools = declarations(tools)
        if environment is None:
            environment = store.header["environmentIdentity"]  # type: ignore[attr-defined]
        self.configuration = Configuration.of(
            self.tools,
            model=model,
            environment=environment,
            system_prompt=system_prompt,
            adapter=adapter,
            routing=routing,
            output_options=output_options,
        )

    async def state(self) -> SessionState:
        return await self.store.load()

    async def start(self, prompt: str) -> AsyncRun:
        if not (await self.state()).is_idle:
            raise RuntimeStateError("a run is in progress: resume() or finish it first")
        _, run = await self.store.commit(build.accept_prompt(prompt))
        return AsyncRun(self, run["record"]["operationId"])

    async def resume(self) -> AsyncRun | None:
        current = self.configuration.current
        while True:
            plan = await recover_async(self.store, current)
            state = await self.store.load()
            if state.is_idle:
                return None
            if plan["type"] != "startTool":
                return AsyncRun(self, state.operation["operationId"])
            if plan["mode"] == "replay":
                await AsyncToolCall(self, replay_start(state, plan)).run()
            else:
                for call in await AsyncRun(self, state.operation["operationId"]).start_tools():
                    await call.run()


class AsyncRun:
    def __init__(self, session: AsyncSession, operation_id: str) -> None:
        self.session = session
        self.operation_id = operation_id

    def __repr__(self) -> str:
        return f"<AsyncRun {self.operation_id}>"

    async def needs_model(self) -> bool:
        return needs_model(await self.session.state(), self.session.configuration)

    async def blocked(self) -> Mapping[str, Any] | None:
        return blocked(await self.session.state(), self.session.configuration)

    async def attempt(self) -> AsyncAttempt:
        facts = attempt_facts(await self.session.state(), self.session.configuration)
        (fact,) = await self.session.store.commit(facts)
        return AsyncAttempt(self, fact["record"])

    async def start_tools(self) -> list[AsyncToolCall]:
        session = self.session
        facts, starts = tool_facts(await session.state(), session.tools, session.configuration.current)
        if facts:
            await session.store.commit(facts)
        return [AsyncToolCall(session, start) for start in starts]

    async def finish(self) -> dict[str, Any]:
        await self.session.store.commit(finish_facts(await self.session.state(), self.session.configuration))
        return (await self.session.state()).last_finished or {}

    async def abort(self) -> dict[str, Any]:
        facts = abort_facts(await self.session.state())
        if facts:
            await self.session.store.commit(facts)
        await recover_async(self.session.store, self.session.configuration.current)
        return (await self.session.state()).last_finished or {}


class AsyncAttempt:
    def __init__(self, run: AsyncRun, record: Mapping[str, Any]) -> None:
        self.run = run
        self.record = dict(record)

    @property
    def number(self) -> int:
        return int(self.record["attempt"])

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

    async def fail(self, code: str, message: str) -> None:
        record = self.record
        await self.run.session.store.commit(
            [build.step_failed(record["operationId"], record["stepId"], record["attemptId"], code, message)]
        )


class AsyncToolCall:
    def __init__(self, session: AsyncSession, start: ToolStart) -> None:
        self.session = session
        self.start = start

    def __repr__(self) -> str:
        return f"<AsyncToolCall {self.name} #{self.index}>"

    @property
    def name(self) -> str:
        return self.start.tool_name

    @property
    def index(self) -> int:
        return int(self.start.intent["toolIndex"])

    @property
    def arguments(self) -> dict[str, Any]:
        return self.start.arguments

    async def run(self) -> str:
        try:
            output = self.session.tools[self.name].run(self.arguments)
            if inspect.isawaitable(output):
                output = await output
        except Exception as error:
            await self.fail(failure_text(error))
            return failure_text(error)
        if not isinstance(output, str):
            raise TypeError(f"tool {self.name!r} returned {type(output).__name__}, not text")
        await self.finish(output)
        return output

    async def finish(self, output: str, *, ok: bool = True, usage: Mapping[str, int] | None = None) -> None:
        await self.session.store.commit(result_facts(self.start, output, ok, usage))

    async def fail(self, message: str) -> None:
        await self.finish(message, ok=False)
