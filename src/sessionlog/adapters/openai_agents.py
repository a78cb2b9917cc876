"""sessionlog under the OpenAI Agents SDK: one object that is both the SDK's `Session` and its
`RunHooks`, so that a run is intent before effect (docs/adapters/openai-agents.md).

    from agents import Agent, Runner
    from sessionlog.adapters.openai_agents import AgentSession

    agent = Agent(name="ops", tools=[read, charge, bash])
    store = sessionlog.create("ops.jsonl", "jsonl-fsync", provider="openai", model="gpt", exist_ok=True)
    session = AgentSession(store, agent.tools, safe={"read"}, idempotent={"charge"})
    result = await Runner.run(agent, "Deploy.", session=session, hooks=session.hooks)

What is written when (the SDK's own `Session` protocol alone cannot be intent before effect:
`Runner.run` hands a step's function calls and their outputs to `add_items` only after every tool
ran, so the hooks write at the right moments and `add_items` checks and completes):

* `add_items([user message])` at the start of a run: the prompt and its run, one transaction;
* `on_llm_start`: the model attempt, durable before the request is sent;
* `on_llm_end`: the answer (its text and function calls) and its usage;
* the first `on_tool_start` of a step: the intents of every call of the step, in one transaction
  (the runtime's `intents="step"`), before the first tool runs. The SDK runs a step's function
  tools concurrently (one task each, started in the model's order, their `on_tool_start` hooks
  before their bodies), so each intent records "this call may run from now on", all of them at
  once, in the model's order (`toolIndex`): after a crash every call of the step without a
  result is one that may have run. A call's idempotency key exists from then on: a tool reads
  it with `call_key(ctx)` (its `ToolContext`);
* `on_tool_end`: that tool's result (the output the SDK makes of it: `function_call_output`);
* `add_items([...the step's items])`: a call's output that no hook saw (the SDK made it without
  running the tool, e.g. a rejected approval) is recorded; at the run's last `add_items` the run
  finishes (`completed`).

After a crash (the process died with the run in progress), or after a `Runner.run` that raised
(max turns, a tool's error the SDK re-raises: the session methods get each run's context, so a
run held from another run's context is known to be over): the next `get_items` or `add_items`
of the next `Runner.run` on the same session recovers before anything else, as
`AsyncSession.resume` does: a pending call of a tool declared `safe` (a read) or `idempotent` is
run again (an idempotent one with the same key), one with `reconcile` is asked about by key, any
other is settled as *interrupted* (never run twice), a call whose intent was never written runs
now; then the old run ends (`finished`: the SDK cannot go on with a run it no longer holds, so it
ends `aborted`; a run whose model had answered last ends `completed`). What it did is in
`session.recovery` (a `Recovery`: each call and what was decided) and logged as a warning on the
`sessionlog.adapters.openai_agents` logger; `get_items` then shows it in the SDK's form (the
settled outputs as `function_call_output` items) and the new run starts.

`pop_item` and `clear_session`: the log is append-only, so neither removes a fact. What the SDK's
sessions promise is what the next `get_items` (the model's context) shows: without the latest
item, or empty. The contract has exactly one operation that changes the context without
rewriting the log, a compaction (section 4: `activeContext` becomes one user message, the
summary, then a retained tail; `transcript` unchanged). So both are a compaction of every message
entry through the input boundary (`openai_agents_history`): `clear_session` with an empty
summary, `pop_item` with a summary that holds, as JSON after the `SUMMARY_MARK` line, the items
that remain. `get_items` shows the items a summary of the adapter holds; any other reader (the
CLI, another port) sees an ordinary compaction, and `sessionlog inspect` still lists everything
that happened. A run in progress is ended first (`aborted`), since a compaction starts only in an
idle session. `pop_item` of an item that cannot go alone is refused (`PopError`): a tool output
(its call would be left unanswered) or one function call of an assistant message (the message
and its calls are one canonical entry; pop its outputs first, then the whole answer goes).

In a repository (`AgentSession.in_repository(repository, sdk_id, tools)`) the SDK's session id
is the caller key `KEY_PREFIX + sdk_id` (`repositories.keys`: race-free between processes), and
`clear_session` replaces the key's session with a new one, the old one kept, listed as replaced.

Content the canonical messages cannot carry is refused by default, or dropped and counted with
`carry={kind: "drop"}` (`openai_agents_items`: the kinds and the table of item types).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agents import FunctionTool, RunContextWrapper, RunHooks
from agents.items import ItemHelpers, ModelResponse, TResponseInputItem
from agents.tool_context import ToolContext

from ..core.errors import SessionLogError, name_shown, shown
from ..core.state import SessionState
from ..repositories.keys import InvalidKeyError
from ..runtime_async import AsyncAttempt, AsyncRun, AsyncSession, AsyncToolCall
from ..runtime_shared import SessionBase, next_plan
from ..tools import ReconcileFunction, Tool
from .openai_agents_history import PopError, compaction_facts, visible_messages
from .openai_agents_items import (
    KINDS,
    Carry,
    Choice,
    UnsupportedItemError,
    answer_of,
    as_dict,
    output_text,
    prompt_text,
    sdk_items,
)
from .openai_agents_recovery import RecoveredCall, Recovery, report

__all__ = [
    "KEY_PREFIX",
    "KINDS",
    "AgentSession",
    "CallKeyError",
    "PopError",
    "RecoveredCall",
    "Recovery",
    "UndeclaredToolError",
    "UnsupportedItemError",
    "call_key",
]

_log = logging.getLogger("sessionlog.adapters.openai_agents")


class UndeclaredToolError(SessionLogError, LookupError):
    """The model called a tool the session was not given (`AgentSession(store, tools)`): its
    intent could not be written, so it was not run (a handoff is such a call too)."""


class CallKeyError(SessionLogError, LookupError):
    """`call_key(ctx)` for a context of no call this process has started through an `AgentSession`."""


_KEYS: dict[int, tuple[Any, str]] = {}
"""id(ToolContext) -> (the context, its call's key), while the call runs."""


def call_key(ctx: Any) -> str:
    """The idempotency key of the call a tool runs for (`ToolCall.key`: `sl-` and its intent's
    fact id), from the tool's `ToolContext`: durable before the tool runs, the same when it is
    replayed or reconciled after a crash, no other call's. Pass it to an API that deduplicates
    by key. `CallKeyError` outside such a call."""
    held = _KEYS.get(id(ctx))
    if held is not None and held[0] is ctx:
        return held[1]
    raise CallKeyError(
        "no sessionlog call is running for this tool context (pass session=s, hooks=s.hooks to Runner.run)"
    )


def _hold_key(ctx: Any, key: str) -> None:
    _KEYS[id(ctx)] = (ctx, key)


def _drop_key(ctx: Any) -> None:
    _KEYS.pop(id(ctx), None)


class _Awaited:
    """A sync store seen through the async store protocol (its commits block the loop for their
    fsync, as they would in a sync program)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    @property
    def header(self) -> Any:
        return self.store.header

    async def commit(self, facts: Any) -> Any:
        return self.store.commit(facts)

    async def load(self) -> SessionState:
        return self.store.load()  # type: ignore[no-any-return]


def _is_async_store(store: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(getattr(store, "commit", None))


def _declare(tool: FunctionTool, replay: str, reconcile: ReconcileFunction | None, idempotent: bool) -> Tool:
    """The sessionlog declaration of one SDK function tool: its definition as the model sees it;
    `run` invokes the SDK tool (for a replay or a reconciled call run again after a crash)."""

    async def run(arguments: dict[str, Any], key: str | None = None) -> Any:
        text = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
        ctx = ToolContext(
            context=None, tool_name=tool.name, tool_call_id=f"sessionlog-replay-{key}", tool_arguments=text
        )
        if key is not None:
            _hold_key(ctx, key)
        try:
            result = await tool.on_invoke_tool(ctx, text)
        finally:
            _drop_key(ctx)
        return output_for(result)

    kwargs: dict[str, Any] = {
        "description": tool.description or "",
        "parameters": dict(tool.params_json_schema),
    }
    if idempotent:
        return Tool(tool.name, run, idempotent=True, **kwargs)
    return Tool(tool.name, run, replay=replay, reconcile=reconcile, **kwargs)  # type: ignore[arg-type]


def output_for(result: Any) -> Any:
    """The `output` of the SDK's `function_call_output` for a tool's return value."""
    call = {"type": "function_call", "call_id": "x", "name": "x", "arguments": "{}"}
    from openai.types.responses import ResponseFunctionToolCall

    return ItemHelpers.tool_call_output_item(ResponseFunctionToolCall(**call), result)["output"]  # type: ignore[arg-type]


class AgentSession(RunHooks[Any]):
    """The SDK's `Session` over a sessionlog store, and the `RunHooks` that make it intent before
    effect: `Runner.run(agent, text, session=s, hooks=s.hooks)` (`hooks` is the session itself).

    `store`: a store you opened (`sessionlog.open` / `create`, sync or async, any backend, or a
    repository's session), or a `sessionlog.Session` / `AsyncSession` (its store is used).
    `tools`: the agent's function tools (`agent.tools`; every tool the
    model may call, else `UndeclaredToolError`). `safe`: names of reads recovery may run again;
    `idempotent`: names of tools run again with the same key (the counterpart deduplicates by
    it); `reconcile`: name -> `fn(key, arguments)` answering `Ran`, `DidNotRun` or `Unknown`
    (`sessionlog.tools`). `carry`: kind -> `refuse` | `drop` (`KINDS`). `session_id`: the id the
    SDK sees (default: the sessionlog session's id). `model`, `system_prompt`: the configuration
    each attempt records."""

    session_settings = None

    def __init__(
        self,
        store: Any,
        tools: Sequence[Any],
        *,
        safe: Iterable[str] = (),
        idempotent: Iterable[str] = (),
        reconcile: Mapping[str, ReconcileFunction] | None = None,
        carry: Mapping[str, Choice] | None = None,
        session_id: str | None = None,
        model: str = "openai-agents",
        system_prompt: str = "",
    ) -> None:
        if isinstance(store, SessionBase):  # a sessionlog Session you already have: its store
            store = store.store
        function_tools = [tool for tool in tools if isinstance(tool, FunctionTool)]
        if len(function_tools) != len(tools):
            other = next(type(tool).__name__ for tool in tools if not isinstance(tool, FunctionTool))
            raise UnsupportedItemError("hosted_tool", "tools", f"a {other} (only function tools are carried)")
        names = {tool.name for tool in function_tools}
        for what, declared in (("safe", safe), ("idempotent", idempotent)):
            if isinstance(declared, str):  # a str is iterable: "read" would name r, e, a, d
                raise TypeError(f"{what} is a collection of tool names ({what}={{'read'}}), not a str")
        safe, idempotent, reconcile = set(safe), set(idempotent), dict(reconcile or {})
        for what, given in (("safe", safe), ("idempotent", idempotent), ("reconcile", set(reconcile))):
            unknown = sorted(given - names)
            if unknown:
                raise ValueError(f"{what} names tools not given: {', '.join(map(name_shown, unknown))}")
        self.store = store
        self.tools = function_tools
        declarations = [
            _declare(
                tool,
                "safe" if tool.name in safe else "never",
                reconcile.get(tool.name),
                tool.name in idempotent,
            )
            for tool in function_tools
        ]
        self._declarations, self._model, self._system_prompt = declarations, model, system_prompt
        self.runtime = self._runtime_over(store)
        self._repository: Any = None
        self._provider = "openai"
        self.carry = Carry(dict(carry or {}))
        self.session_id = session_id or str(store.header["id"])
        self.recovery: Recovery | None = None
        """What the last recovery did (None until one was needed)."""
        self._run: AsyncRun | None = None
        self._attempt: AsyncAttempt | None = None
        self._calls: dict[str, AsyncToolCall] = {}
        self._starting = asyncio.Lock()
        self._wrapper: RunContextWrapper[Any] | None = None
        """The SDK's context of the run this object holds (the SDK passes it to every call)."""
        self._input: list[dict[str, Any]] | None = None
        """A streamed run's input, started from `on_llm_start`: its `add_items` is then a no-op."""

    def _runtime_over(self, store: Any) -> AsyncSession:
        return AsyncSession(
            store if _is_async_store(store) else _Awaited(store),
            tools=self._declarations,
            model=self._model,
            system_prompt=self._system_prompt,
            adapter="openai-agents",
            intents="step",
        )

    @classmethod
    async def in_repository(
        cls,
        repository: Any,
        session_id: str,
        tools: Sequence[Any],
        *,
        provider: str = "openai",
        **options: Any,
    ) -> AgentSession:
        """The session the SDK calls `session_id`, in a sessionlog repository (sync or async): the
        current session of the caller key `KEY_PREFIX + session_id`, opened for writing, or made
        (`provider`, and `options["model"]` for its header) when the key has none. Race-free
        between processes: two opening a new id at once agree on one session, and the one that
        does not hold it gets `KeyHeldError` naming it. `clear_session` replaces the key's
        session with a new one and keeps the old one (listed as replaced, readable, by
        `repository.key_sessions(key)`). `options` go to `AgentSession`."""
        if type(session_id) is not str:
            raise TypeError(f"session_id is the SDK's id of the session, a str, not {shown(session_id)}")
        if not session_id:
            raise InvalidKeyError("session_id is empty: the SDK's id of a session names it")
        model = str(options.get("model", "openai-agents"))
        key = KEY_PREFIX + session_id
        store = await _maybe(repository.create(provider=provider, model=model, key=key))
        session = cls(store, tools, session_id=session_id, **options)
        session._repository, session._provider = repository, provider
        return session

    async def _replace_in_repository(self) -> None:
        """`clear_session` in a repository: a new current session for the key, the old one kept."""
        old = self.store
        new = await _maybe(
            self._repository.replace(KEY_PREFIX + self.session_id, provider=self._provider, model=self._model)
        )
        await _maybe(old.close())
        self.store, self.runtime = new, self._runtime_over(new)

    @property
    def hooks(self) -> AgentSession:
        """The run hooks: the session itself."""
        return self

    @property
    def dropped(self) -> Counter[str]:
        """How many parts of each kind were dropped (`carry={kind: "drop"}`)."""
        return self.carry.dropped

    # -- the SDK's Session protocol --------------------------------------------------------

    async def get_items(
        self, limit: int | None = None, wrapper: RunContextWrapper[Any] | None = None
    ) -> list[TResponseInputItem]:
        await self._recover_if_needed(wrapper)
        state = await self.runtime.state()
        items = sdk_items(visible_messages(state.active_context))
        if limit is not None:
            items = items[-limit:] if limit > 0 else []
        return items  # type: ignore[return-value]

    async def add_items(
        self, items: list[TResponseInputItem], wrapper: RunContextWrapper[Any] | None = None
    ) -> None:
        if not items:
            return
        await self._recover_if_needed(wrapper)
        given = [as_dict(item) for item in items]
        if self._run is None:
            await self._start(given)
            self._wrapper = wrapper
            return
        if self._input is not None and given == self._input:
            self._input = None  # a streamed run's input, started by on_llm_start already
            return
        for item in items:
            found = as_dict(item)
            if found.get("type") == "function_call_output":
                await self._record(str(found.get("call_id")), found.get("output"))
            elif found.get("role") == "user":
                raise UnsupportedItemError("other", "add_items", "a user message while a run is in progress")
        await self._finish_if_done()

    async def pop_item(self, wrapper: RunContextWrapper[Any] | None = None) -> TResponseInputItem | None:
        items = await self.get_items(wrapper=wrapper)
        if not items:
            return None
        await self._end_run()
        state = await self.runtime.state()
        facts = compaction_facts(state, self.runtime.configuration, self.store, pop=True)
        await self.runtime.commit(facts)
        return items[-1]

    async def clear_session(self, wrapper: RunContextWrapper[Any] | None = None) -> None:
        await self._recover_if_needed(wrapper)
        await self._end_run()
        if self._repository is not None:
            await self._replace_in_repository()
            return
        state = await self.runtime.state()
        if not visible_messages(state.active_context):
            return
        await self.runtime.commit(compaction_facts(state, self.runtime.configuration, self.store, pop=False))

    # -- the run hooks ---------------------------------------------------------------------

    async def on_llm_start(
        self, context: RunContextWrapper[Any], agent: Any, system_prompt: str | None, input_items: list[Any]
    ) -> None:
        if self._run is None:  # a streamed run persists its input after this hook: start from it
            history = await self.get_items()
            fresh = [as_dict(item) for item in input_items[len(history) :]]
            await self._start(fresh)
            self._input, self._wrapper = fresh, context
        self._attempt = await self._current_run().attempt()

    async def on_llm_end(self, context: RunContextWrapper[Any], agent: Any, response: ModelResponse) -> None:
        attempt = self._attempt
        if attempt is None:
            raise SessionLogError("on_llm_end without on_llm_start: pass hooks=session.hooks to Runner.run")
        self._attempt = None
        try:
            answer = answer_of(response.output, self.carry)
            undeclared = [call["name"] for call in answer.calls if call["name"] not in self.runtime.tools]
            if undeclared:
                raise UndeclaredToolError(
                    f"the model called {', '.join(map(name_shown, undeclared))}, not among the session's "
                    "tools (AgentSession(store, agent.tools)): not run"
                )
        except SessionLogError as error:
            await attempt.fail("unsupported_content", f"{type(error).__name__}: {error}")
            await self._end_run()
            raise
        usage = response.usage
        counts = {
            "input": int(usage.input_tokens or 0),
            "output": int(usage.output_tokens or 0),
            "cacheRead": int(getattr(usage.input_tokens_details, "cached_tokens", 0) or 0),
        }
        await attempt.settle(answer.content, answer.calls, usage=counts)
        self.carry.count(answer.drops)
        self._calls = {}
        self._starting = asyncio.Lock()  # this step's, on this step's loop

    async def on_tool_start(self, context: RunContextWrapper[Any], agent: Any, tool: Any) -> None:
        call_id = str(getattr(context, "tool_call_id", ""))
        async with self._starting:  # the step's tools start concurrently: one of them writes the intents
            if not self._calls:
                started = await self._current_run().start_tools()
                self._calls = {str(call.start.intent["toolCallId"]): call for call in started}
        call = self._calls.get(call_id)
        if call is None and await self._settled_unrun(call_id):
            return  # its arguments are no JSON object: settled as not run, and the SDK runs no tool
        if call is None:
            raise UndeclaredToolError(
                f"tool {name_shown(str(getattr(tool, 'name', '?')))} (call {name_shown(call_id)}) has no "
                "intent in the session: not run"
            )
        _hold_key(context, call.key)

    async def _settled_unrun(self, call_id: str) -> bool:
        """Whether the step settled call `call_id` before it could run, without an intent (its
        arguments are no JSON object: the contract's `invalidArguments`, which the SDK refuses
        too, before the tool's body, when it cannot read them; `items.arguments_of`)."""
        state = await self.runtime.state()
        for index, call in enumerate(state.settled_calls):
            if call["id"] == call_id:
                started = any(tool["toolCallId"] == call_id for tool in state.tool_calls)
                return state.has_outcome(index) and not started
        return False

    async def on_tool_end(
        self, context: RunContextWrapper[Any], agent: Any, tool: Any, result: object
    ) -> None:
        _drop_key(context)
        await self._record(str(getattr(context, "tool_call_id", "")), output_for(result))

    # -- what the hooks and the protocol share ---------------------------------------------

    async def _start(self, items: list[dict[str, Any]]) -> None:
        """Start the run that answers the input `items` (one user message)."""
        prompt, drops = prompt_text(items, self.carry)
        self._run = await self.runtime.start(prompt)
        self.carry.count(drops)

    def _current_run(self) -> AsyncRun:
        if self._run is None:
            raise SessionLogError(
                "no run in progress: pass session=session to Runner.run (its input starts the run)"
            )
        return self._run

    async def _record(self, call_id: str, output: Any) -> None:
        """The result of one call, once (an output the log holds already is not written again)."""
        call = self._calls.get(call_id)
        if call is None:
            return
        state = await self.runtime.state()
        if any(
            tool["toolStartedId"] == call.start.tool_started_id and tool["status"] != "pending"
            for tool in state.tool_calls
        ):
            return
        text, drops = output_text(output, self.carry, f"the output of call {name_shown(call_id)}")
        await call.finish(text)
        self.carry.count(drops)

    async def _finish_if_done(self) -> None:
        run = self._run
        if run is None:
            return
        state = await self.runtime.state()
        if run.is_current(state) and next_plan(state, self.runtime.configuration)["type"] == "finish":
            await run.finish()
            self._run = None

    async def _end_run(self) -> None:
        """End the run this session holds (aborted), if any."""
        run, self._run = self._run, None
        if run is None:
            return
        state = await self.runtime.state()
        if run.is_current(state):
            await run.abort()

    async def _recover_if_needed(self, wrapper: RunContextWrapper[Any] | None) -> None:
        """After a crash (a run in progress that this object does not hold), or after a
        `Runner.run` that raised (the run this object holds is of another run's context than
        `wrapper`, the SDK's context of the calling run): recover it."""
        if (
            self._run is not None
            and wrapper is not None
            and self._wrapper is not None
            and wrapper is not self._wrapper
        ):
            self._run = self._wrapper = None  # its Runner.run is over: its run is abandoned
        state = await self.runtime.state()
        if state.is_idle or self._run is not None:
            return
        await self._recover(state)

    async def _recover(self, before: SessionState) -> None:
        operation_id = str(before.operation["operationId"])
        run = await self.runtime.resume()
        if run is not None:
            state = await self.runtime.state()
            if next_plan(state, self.runtime.configuration)["type"] == "finish":
                await run.finish()
            elif run.blocked is not None:
                await run.end()
            else:
                await run.abort()
        recovery = report(operation_id, before, await self.runtime.state())
        self.recovery = recovery
        _log.warning(
            "sessionlog: recovered run %s of session %s (left in progress by a crash, or by a Runner.run "
            "that raised): %s; the run ended %s",
            operation_id,
            self.session_id,
            ", ".join(f"{call.tool_name} {call.tool_call_id}: {call.decision}" for call in recovery.calls)
            or "no call was pending",
            recovery.outcome,
        )


KEY_PREFIX = "openai-agents:"
"""The caller key of an SDK session id is this prefix and the id (`AgentSession.in_repository`)."""


async def _maybe(value: Any) -> Any:
    """`value`, awaited when it is awaitable (a sync or an async repository)."""
    import inspect

    return await value if inspect.isawaitable(value) else value
