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

from collections.abc import Mapping, Sequence
from typing import Any

from .core import facts as build
from .core.state import SessionState
from .recovery import (
    Store,
    ToolStart,
    facts_for_plan,
    recover,
)
from .runtime_blocked import Blocked
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
from .tools import tool_output

Fact = dict[str, Any]

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
        reconciled, ran = decision(tool, start, answer)
        self.reconciled.append(reconciled)
        decided = reconciled.decision
        call = ToolCall(self, start, begun=True)
        if ran is not None:
            call.record_reconciled(*ran_output(tool, reconciled, ran))
        elif decided == "notRun":
            call.note = "notRun"
            call.run()
        else:
            self.store.commit(facts_for_plan(state, plan, self.configuration.current))


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
            return self._record(failure_text(error), False, None, self.note)
        text, ok = tool_output(self.name, output)
        return self._record(text, ok, None, self.note)

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
        return self._record(text, ok, None, "ran")

    def _record(self, output: str, ok: bool, usage: Mapping[str, int] | None, note: str | None = None) -> str:
        """The result; an output above the store's line limit as an error result saying so.
        `note`: what reconciliation decided (`runtime_reconcile.noted`)."""
        store = self.session.store
        self.check_can_record(store.load())
        try:
            store.commit(result_facts(self.start, output, ok, usage, note))
        except ValueError as error:
            if not oversized(error):
                raise
            output = oversized_text(output, error)
            store.commit(result_facts(self.start, output, False, usage, note))
        return noted(output, note)
