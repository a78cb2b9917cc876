"""What the sync and async runtimes share (`runtime`, `runtime_async`): the facts made from a
session's state and plan (an attempt, a finish, an abort, a result), the checks both make before
a step, and the base classes of their twins (a run, an attempt, a tool call, a session). Each
twin adds only the way it commits: `store.commit` or `await store.commit`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .core import facts as build
from .core.errors import type_named
from .core.state import SessionState, copy_json
from .recovery import (
    ToolStart,
    facts_for_plan,
    plan_in_order,
    start_step_facts,
)
from .runtime_blocked import Blocked, end_facts, run_prompt
from .runtime_errors import (
    AttemptOpenError,
    RunBlockedError,
    RunOverError,
    RuntimeStateError,
)
from .runtime_facts import (
    INTENTS,
    declarations,
    has_result,
)
from .runtime_reconcile import Reconciled, noted
from .tools import Configuration, Tool, Tools, recordable_text

Fact = dict[str, Any]


# -- what the sync and async runtimes share: state to facts ------------------------------------


def next_plan(state: SessionState, configuration: Configuration) -> Mapping[str, Any]:
    """The runtime's next plan: `plan_in_order` (a pending call settled before a later one)."""
    return plan_in_order(state, configuration.current)


def check_not_blocked(plan: Mapping[str, Any]) -> None:
    if plan["type"] == "blocked":
        raise RunBlockedError(Blocked.of(plan))


def attempt_facts(state: SessionState, configuration: Configuration) -> list[Fact]:
    plan = next_plan(state, configuration)
    check_not_blocked(plan)
    if plan["type"] != "startStep":
        raise RuntimeStateError(f"the run's next step is {plan['type']}, not a model attempt")
    return start_step_facts(state, plan, configuration.snapshot if plan["attempt"] == 1 else None)


def finish_facts(state: SessionState, configuration: Configuration) -> list[Fact]:
    plan = next_plan(state, configuration)
    check_not_blocked(plan)
    if plan["type"] != "finish" or state.is_idle:
        raise RuntimeStateError(f"the run cannot finish yet: its next step is {plan['type']}")
    return facts_for_plan(state, plan, configuration.current)


def abort_facts(state: SessionState, phase: str | None = None) -> list[Fact]:
    """`abortRequested` for the current operation (none when it was asked before). The phase is
    read from the state unless given: `compact` for a compaction, `tool` (naming the first
    pending call) while intents are pending, else `model`."""
    operation = state.current_operation
    if operation is None:
        raise RuntimeStateError("nothing to abort: the session is idle")
    if operation["abortRequested"]:
        return []
    pending = state.pending_tools
    phase = phase or ("compact" if operation["kind"] == "compaction" else "tool" if pending else "model")
    if phase == "tool" and not pending:
        raise RuntimeStateError("phase tool, but no tool intent is pending (use model)")
    return [
        build.abort_requested(
            operation["operationId"],
            operation["kind"],
            phase,
            tool_call_id=pending[0]["toolCallId"] if phase == "tool" else None,
        )
    ]


def check_no_open_attempt(session: Any, state: SessionState) -> None:
    open_attempt = state.open_attempt
    if open_attempt is not None and open_attempt["attemptId"] == session.open_attempt_id:
        raise AttemptOpenError(
            f"attempt {open_attempt['attempt']} of this run is open: settle() or fail() it first"
        )


def needs_model(state: SessionState, configuration: Configuration) -> bool:
    return not state.is_idle and next_plan(state, configuration)["type"] == "startStep"


def blocked(state: SessionState, configuration: Configuration) -> Blocked | None:
    if state.is_idle:
        return None
    plan = next_plan(state, configuration)
    return Blocked.of(plan) if plan["type"] == "blocked" else None


def blocked_end_facts(state: SessionState, configuration: Configuration) -> tuple[list[Fact], str]:
    """`Run.end()`'s first transaction and the run's prompt; RuntimeStateError when the run is
    not blocked (`abort()` ends any run)."""
    found = blocked(state, configuration)
    if found is None:
        raise RuntimeStateError("the run is not blocked: nothing to end or restart (abort() ends any run)")
    return end_facts(state, found), run_prompt(state)


def result_facts(
    start: ToolStart, output: str, ok: bool, usage: Mapping[str, int] | None, note: str | None = None
) -> list[Fact]:
    """A tool's result under its intent's reserved id, and its usage: one transaction. `note`:
    what reconciliation decided (`runtime_reconcile.noted`), always the content's last line."""
    facts = [start.result(noted(recordable_text(output), note), ok=ok)]
    if usage is not None:
        facts.append(build.usage(start.intent["operationId"], usage, tool_started_id=start.tool_started_id))
    return facts


def failure_text(error: BaseException) -> str:
    """An exception a tool raised, as its error result: its class and its text (never an
    exception of its own: the tool ran, and its result must be recorded)."""
    try:
        text = str(error)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # a __str__ that raises
        text = "(its text could not be read)"
    return f"{type_named(error)}: {text}"


# -- what the twins share: who they are --------------------------------------------------------


class RunBase:
    """A run in progress (one accepted prompt), of a `Session` or an `AsyncSession`. Tied to
    its run: once that is over (finished, ended, restarted) every step raises `RunOverError`."""

    def __init__(self, session: Any, operation_id: str) -> None:
        self.session = session
        self.operation_id = operation_id
        self.restarted_as: str | None = None
        """The run `restart()` started in its place."""

    def is_current(self, state: SessionState) -> bool:
        operation = state.current_operation
        return (
            self.restarted_as is None
            and operation is not None
            and operation["operationId"] == self.operation_id
        )

    def check_current(self, state: SessionState) -> SessionState:
        """`state`, when the run is the session's current one; else RunOverError saying how it ended."""
        if self.is_current(state):
            return state
        last = state.last_finished
        how = "it is not the session's current run"
        if last is not None and last["operationId"] == self.operation_id:
            error = last.get("error")
            why = f" ({error['code']}: {error['message']})" if isinstance(error, Mapping) else ""
            how = f"it finished {last['outcome']}{why}"
        if self.restarted_as is not None:
            how = f"it was restarted as run {self.restarted_as} ({how})"
        raise RunOverError(self.operation_id, how)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.operation_id}>"


class AttemptBase:
    """A model attempt, durable before its request was sent."""

    def __init__(self, run: Any, record: Mapping[str, Any]) -> None:
        self.run = run
        self.record = dict(record)

    @property
    def number(self) -> int:
        return int(self.record["attempt"])

    def _failed(self, code: str, message: str) -> list[Fact]:
        record = self.record
        return [
            build.step_failed(record["operationId"], record["stepId"], record["attemptId"], code, message)
        ]


class ToolCallBase:
    """A call of the settled step: `run()` commits its intent, runs the tool and records its
    result; to run the tool yourself, `begin()` (the intent), then `finish(output)`."""

    def __init__(self, session: Any, start: ToolStart, *, begun: bool = False) -> None:
        self.session = session
        self.start = start
        self.begun = begun
        """Whether its intent is durable (a replay's, and every one with `intents="step"`)."""
        self.by_caller = False
        """Whether `begin()` was called: the tool is the program's to run, `run()` is refused."""
        self.tool_ran = False
        """Whether `run()` ran its tool in this process (it never runs twice)."""
        self.note: str | None = None
        """`notRun` when reconciliation found it had not run: its result says so."""

    def check_can_record(self, state: SessionState) -> None:
        """Refused (nothing run, nothing written) once the log holds the call's outcome."""
        if has_result(state, self.start):
            raise RuntimeStateError(
                f"call {self.index} ({self.name}) has its result already: its tool runs once "
                "(one outcome per call)"
            )

    def check_can_run(self, state: SessionState) -> None:
        """What `run()` checks before the tool runs: no outcome in the log, not run by this
        handle before, not begun by the caller (whose tool it then is)."""
        self.check_can_record(state)
        if self.tool_ran:
            raise RuntimeStateError(
                f"call {self.index} ({self.name}): its tool ran already in this process, its result is "
                "unknown (resume() settles it)"
            )
        if self.by_caller:
            raise RuntimeStateError(
                f"call {self.index} ({self.name}) was begun with begin(): its tool is the program's to run "
                "(finish(output) it), run() would run it again"
            )

    def _check_begun(self) -> None:
        if not self.begun:
            raise RuntimeStateError(
                f"call {self.index} ({self.name}) has no durable intent: begin() it before its tool runs"
            )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} #{self.index}>"

    @property
    def name(self) -> str:
        return self.start.tool_name

    @property
    def index(self) -> int:
        return int(self.start.intent["toolIndex"])

    @property
    def arguments(self) -> dict[str, Any]:
        return self.start.arguments

    @property
    def key(self) -> str:
        """The call's idempotency key (`recovery.idempotency_key`): made from its intent's fact
        id, the same on replay, reconciliation and in a fork, no other call's. Pass it to an API
        that deduplicates by key (an `Idempotency-Key` header, a client token, a resource name);
        a tool declared `idempotent` or with `reconcile` gets it as `run(arguments, key)`."""
        return self.start.key

    def call_tool(self) -> Any:
        """Run the declared tool: `run(arguments, key)` for a keyed tool, else `run(arguments)`."""
        tool = self.session.tools[self.name]
        return tool.run(self.arguments, self.key) if tool.keyed else tool.run(self.arguments)


class SessionBase:
    """What `Session` and `AsyncSession` share: the store and the configuration made from the
    declarations. `model` names the model; `system_prompt`, `adapter`, `routing` and
    `output_options` complete the configuration snapshot each attempt records; `environment`
    is the environment identity (default: the session header's); `intents` when tool intents
    are committed (`INTENTS`: `tool`, the default, or `step`)."""

    def __init__(
        self,
        store: Any,
        *,
        tools: Tools | Iterable[Tool],
        model: str,
        system_prompt: str = "",
        adapter: str = "sessionlog",
        routing: str = "default",
        output_options: Mapping[str, Any] | None = None,
        environment: str | None = None,
        intents: str = "tool",
    ) -> None:
        if intents not in INTENTS:
            raise ValueError(
                f"intents is 'tool' (each before its tool) or 'step' (all at once), not {intents!r}"
            )
        self.intents = intents
        for name, value in (
            ("model", model),
            ("system_prompt", system_prompt),
            ("adapter", adapter),
            ("routing", routing),
        ):
            if not isinstance(value, str):
                raise TypeError(f"{name} is a string, not {type(value).__name__}")
        if not model.strip():
            raise ValueError("model names the model: a non-empty string")
        if environment is not None and not isinstance(environment, str):
            raise TypeError(f"environment is a string or None, not {type(environment).__name__}")
        if output_options is not None and not isinstance(output_options, Mapping):
            raise TypeError(f"output_options is a mapping or None, not {type(output_options).__name__}")
        if not (hasattr(store, "commit") and hasattr(store, "load")):
            raise TypeError(f"store is a session store (commit and load), not {type(store).__name__}")
        self.store = store
        self.tools = declarations(tools)
        self.open_attempt_id: str | None = None
        """The attempt this session opened and has not settled or failed (see AttemptOpenError)."""
        self.reconciled: list[Reconciled] = []
        """What reconciliation decided in this session's resumes, in order (`runtime_reconcile`)."""
        self.configuration = Configuration.of(
            self.tools,
            model=model,
            environment=environment or self._header_environment(),
            system_prompt=system_prompt,
            adapter=adapter,
            routing=routing,
            output_options=output_options,
        )

    def current(self) -> dict[str, Any]:
        """The planner's current configuration made from these declarations (a copy), as the
        contract's current-configuration JSON: `json.dump` it for `sessionlog plan|recover|abort
        --current FILE`."""
        return copy_json(dict(self.configuration.current))  # type: ignore[no-any-return]

    def _header_environment(self) -> str:
        header = getattr(self.store, "header", None)  # the built-in stores know their header
        if header is None:
            raise TypeError("this store has no header: pass environment=...")
        return str(header["environmentIdentity"])


def replay_start(state: SessionState, plan: Mapping[str, Any]) -> ToolStart:
    """How to carry out a `startTool` replay: the pending intent it names, run again."""
    for tool in state.pending_tools:
        if tool["toolStartedId"] == plan["toolStartedId"]:
            return ToolStart("replay", [], tool)
    raise RuntimeStateError(f"no pending intent {plan['toolStartedId']}")  # pragma: no cover
