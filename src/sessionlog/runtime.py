"""The durable agent loop as an API: intent before effect by construction.

    session = sessionlog.Session(store, tools=[read, bash], model="provider/model")
    run = session.resume() or session.start(prompt)      # recovery first, then the new prompt
    if run.blocked:                                      # e.g. attempt 2's answer lost too
        run = run.restart()                              # end it truthfully, ask again
    while run.needs_model:
        attempt = run.attempt()                          # durable before the request is sent
        reply = call_model(list(session.state.active_context))
        attempt.settle(reply.content, reply.tool_calls, usage=reply.usage)
        for call in run.start_tools():                   # the step's calls, in the model's order
            call.run()                                   # its intent, the tool, then its result
    run.finish()

Every fact is committed before the effect it describes: the prompt with its run (one
transaction), the attempt before the model request, the answer with its usage, each tool's
intent right before that tool runs (`intents="tool"`, the default; `intents="step"` commits all
intents of a step in one transaction before the first tool runs), each result after its tool.
`Session.resume` applies the recovery plan until the caller is needed: it settles what needs no
effect, runs declared-safe reads again, settles the rest as *interrupted* (a `never` tool is
never run twice), always settling a pending call before a later call of its step starts
(`recovery.plan_in_order`), and returns the run whose next step is a model call, or None when
there is nothing to resume. A blocked run (attempt 2's answer is unknown too, or the
configuration, environment or a replay declaration changed) is never stuck: `run.blocked` is a
`Blocked` value with the reason and the ways out, `run.restart()`, `run.end()`, or keep it for a
person (`runtime_blocked`); a step of a blocked run raises `RunBlockedError`. A call's tool runs
once: `run()` and `finish()` read the log and refuse (nothing run) once the call has its outcome;
an output too long for the store's lines is recorded as an error result saying its size. A `Run`
is tied to its run: once over, its steps raise `RunOverError`. docs/agent-loop.md.

Every call has an idempotency key (`ToolCall.key`, from its intent's fact id); a tool declared
`idempotent` is replayed with it, one with `reconcile` is asked about by it before its pending
intent is settled as interrupted (`runtime_reconcile`, docs/idempotency.md).

The declarations (`sessionlog.tools`) make both the attempt's configuration snapshot and the
planner's current configuration, so they cannot disagree. `AsyncSession` (in `runtime_async`)
is the same over an async store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .core import facts as build
from .core.state import SessionState, copy_json
from .recovery import (
    Store,
    ToolStart,
    facts_for_plan,
    plan_in_order,
    recover,
    start_step_facts,
)
from .runtime_blocked import Blocked, end_facts, run_prompt
from .runtime_errors import (
    AttemptOpenError,
    InvalidAnswerError,
    RunBlockedError,
    RunOverError,
    RuntimeStateError,
)
from .runtime_facts import (
    INTENTS,
    ToolCallInput,
    begin_facts,
    check_prompt,
    contract_calls,
    declarations,
    has_result,
    oversized,
    oversized_text,
    settle_facts,
    tool_facts,
)
from .runtime_reconcile import ask, decision, noted, pending_of, ran_output, reconcilable

__all__ = [
    "INTENTS",
    "Attempt",
    "AttemptOpenError",
    "Blocked",
    "InvalidAnswerError",
    "Run",
    "RunBlockedError",
    "RunOverError",
    "RuntimeStateError",
    "Session",
    "ToolCall",
    "ToolCallInput",
    "begin_facts",
    "contract_calls",
    "settle_facts",
    "tool_facts",
]
from .tools import Configuration, Ran, Tool, Tools, recordable_text, tool_output

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


def result_facts(start: ToolStart, output: str, ok: bool, usage: Mapping[str, int] | None) -> list[Fact]:
    """A tool's result under its intent's reserved id, and its usage: one transaction."""
    facts = [start.result(recordable_text(output), ok=ok)]
    if usage is not None:
        facts.append(build.usage(start.intent["operationId"], usage, tool_started_id=start.tool_started_id))
    return facts


def failure_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


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


# -- the sync runtime --------------------------------------------------------------------------


class Session(SessionBase):
    """An agent session over a sync store (`sessionlog.open` / `create`, any backend): see the
    module docstring and `SessionBase` for the arguments."""

    store: Store

    def _header_environment(self) -> str:
        return str(self.store.load().header["environmentIdentity"])

    @property
    def state(self) -> SessionState:
        return self.store.load()

    def start(self, prompt: str) -> Run:
        """Accept a prompt: its user entry and the run that answers it, in one transaction."""
        check_prompt(prompt)
        if not self.state.is_idle:
            raise RuntimeStateError("a run is in progress: resume() or finish it first")
        _, run = self.store.commit(build.accept_prompt(prompt))
        return Run(self, run["record"]["operationId"])

    def resume(self) -> Run | None:
        """Recover an interrupted run up to where the caller is needed; None when the session is
        idle. Safe reads with an unknown result are run again through their declared tool (an
        idempotent tool with its key); a tool with `reconcile` is asked first (`reconcile`)."""
        self.open_attempt_id = None  # resuming: an open attempt's answer is taken as lost
        current = self.configuration.current
        hold = reconcilable(self.tools)
        while True:
            plan = recover(self.store, current, in_order=True, hold=hold)
            state = self.store.load()
            if state.is_idle:
                return None
            start = pending_of(state, plan, self.tools)
            if start is not None:
                self.reconcile(state, plan, start)
                continue
            if plan["type"] != "startTool":
                return Run(self, state.operation["operationId"])
            if plan["mode"] == "replay":
                ToolCall(self, replay_start(state, plan), begun=True).run()
            else:
                for call in Run(self, state.operation["operationId"]).start_tools():
                    call.run()

    def reconcile(self, state: SessionState, plan: Mapping[str, Any], start: ToolStart) -> None:
        """Ask the tool's `reconcile` whether the pending call ran (`runtime_reconcile`): commit
        its reported result, run it now with the same key, or settle it as interrupted."""
        tool = self.tools[start.tool_name]
        answer = ask(tool, start)
        decided = decision(tool, start, answer)
        call = ToolCall(self, start, begun=True)
        if decided == "ran":
            assert isinstance(answer, Ran)
            call.record_reconciled(*ran_output(tool, answer))
        elif decided == "notRun":
            call.note = "notRun"
            call.run()
        else:
            self.store.commit(facts_for_plan(state, plan, self.configuration.current))


def replay_start(state: SessionState, plan: Mapping[str, Any]) -> ToolStart:
    """How to carry out a `startTool` replay: the pending intent it names, run again."""
    for tool in state.pending_tools:
        if tool["toolStartedId"] == plan["toolStartedId"]:
            return ToolStart("replay", [], tool)
    raise RuntimeStateError(f"no pending intent {plan['toolStartedId']}")  # pragma: no cover


class Run(RunBase):
    """The run in progress (one accepted prompt); its steps raise `RunOverError` once it is over."""

    session: Session

    def _state(self) -> SessionState:
        return self.check_current(self.session.state)

    @property
    def needs_model(self) -> bool:
        """Whether the next step is a model request (`attempt()`); False once the model answered
        without tool calls (`finish()`), or when the run is blocked or over."""
        state = self.session.state
        return self.is_current(state) and needs_model(state, self.session.configuration)

    @property
    def blocked(self) -> Blocked | None:
        """Why the run cannot go on by itself and the ways out (a `Blocked`), else None (also
        once the run is over)."""
        state = self.session.state
        return blocked(state, self.session.configuration) if self.is_current(state) else None

    def end(self) -> dict[str, Any]:
        """End a blocked run truthfully (see `runtime_blocked`): `abortRequested`, the run then
        finishes `aborted`. Its outcome."""
        facts, _ = blocked_end_facts(self._state(), self.session.configuration)
        self.session.store.commit(facts)
        self.session.open_attempt_id = None
        recover(self.session.store, self.session.configuration.current, in_order=True)
        return self.session.state.last_finished or {}

    def restart(self) -> Run:
        """End a blocked run truthfully (`end()`) and ask its prompt again: the new run."""
        _, prompt = blocked_end_facts(self._state(), self.session.configuration)
        self.end()
        new = self.session.start(prompt)
        self.restarted_as = new.operation_id
        return new

    def attempt(self) -> Attempt:
        """Record the model attempt (attempt 2 of the same step after a crash) before the request."""
        state = self._state()
        check_no_open_attempt(self.session, state)
        (fact,) = self.session.store.commit(attempt_facts(state, self.session.configuration))
        self.session.open_attempt_id = fact["record"]["attemptId"]
        return Attempt(self, fact["record"])

    def start_tools(self) -> list[ToolCall]:
        """The calls of the settled step that can run, in the model's order (unknown tools and
        bad arguments get their synthetic results now); run them in that order (`ToolCall.run`,
        or `begin` and `finish` with your own output). With `intents="step"` every intent is
        committed here, in one transaction."""
        session = self.session
        step = session.intents == "step"
        facts, starts = tool_facts(
            self._state(), session.tools, session.configuration.current, intents=session.intents
        )
        if facts:
            session.store.commit(facts)
        return [ToolCall(session, start, begun=step) for start in starts]

    def finish(self) -> dict[str, Any]:
        """End the run as the planner says (completed, normal or truncated); its outcome."""
        self.session.store.commit(finish_facts(self._state(), self.session.configuration))
        return self.session.state.last_finished or {}

    def abort(self) -> dict[str, Any]:
        """End the run as aborted: `abortRequested`, then the synthetic results and the finish
        recovery plans from it. Its outcome."""
        facts = abort_facts(self._state())
        if facts:
            self.session.store.commit(facts)
        recover(self.session.store, self.session.configuration.current)
        return self.session.state.last_finished or {}


class Attempt(AttemptBase):
    run: Run

    def settle(
        self,
        content: str | None,
        tool_calls: Sequence[ToolCallInput] = (),
        *,
        usage: Mapping[str, int] | None = None,
        stop_reason: str | None = None,
    ) -> None:
        """The model's answer (and its usage) in one transaction."""
        store = self.run.session.store
        store.commit(settle_facts(store.load(), self.record, content, tool_calls, usage, stop_reason))
        self.run.session.open_attempt_id = None

    def fail(self, code: str, message: str) -> None:
        """The request failed (the planner then retries once, or fails the run)."""
        self.run.session.store.commit(self._failed(code, message))
        self.run.session.open_attempt_id = None


class ToolCall(ToolCallBase):
    """One call: `run()` once, or `begin()`, the program's own tool run, `finish(output)`.
    Each refuses (nothing run, nothing written) once the log holds the call's outcome."""

    session: Session

    def begin(self) -> None:
        """Commit the call's intent (once): from here on its effect may have happened, and the
        tool is the program's to run (`run()` is refused)."""
        self._begin()
        self.by_caller = True

    def _begin(self) -> None:
        if not self.begun:
            self.session.store.commit(begin_facts(self.session.state, self.start))
            self.begun = True

    def run(self) -> str:
        """Commit its intent, run the declared tool and record its output (an `Exception` is
        recorded as an error result; anything else, a kill, leaves the intent pending). Refused
        before the tool runs when the call has its outcome, or its tool ran already."""
        self.check_can_run(self.session.state)
        self._begin()
        self.tool_ran = True
        try:
            output = self.call_tool()
        except Exception as error:
            return self._record(noted(failure_text(error), self.note), False, None)
        text, ok = tool_output(self.name, output)
        return self._record(noted(text, self.note), ok, None)

    def finish(self, output: str, *, ok: bool = True, usage: Mapping[str, int] | None = None) -> None:
        """Record the tool's output (and its usage) in one transaction (after `begin`)."""
        self._check_begun()
        if self.tool_ran:
            self.check_can_run(self.session.state)
        self._record(output, ok, usage)

    def fail(self, message: str) -> None:
        self.finish(message, ok=False)

    def record_reconciled(self, text: str, ok: bool) -> str:
        """The result reconciliation found (`Ran`): the call ran before the crash."""
        return self._record(text, ok, None)

    def _record(self, output: str, ok: bool, usage: Mapping[str, int] | None) -> str:
        """The result; an output above the store's line limit as an error result saying so."""
        store = self.session.store
        self.check_can_record(store.load())
        try:
            store.commit(result_facts(self.start, output, ok, usage))
        except ValueError as error:
            if not oversized(error):
                raise
            output = oversized_text(output, error)
            store.commit(result_facts(self.start, output, False, usage))
        return output
