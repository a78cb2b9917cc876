"""A tool ledger for LangGraph: each tool call's intent and result in a sessionlog session, so
that a graph on LangGraph's own checkpointer knows after a crash whether a tool may have run,
and never runs it twice.

    ledger = ToolLedger(sessionlog.repository("sqlite:///ledger.db"), idempotent=["charge"])
    graph.add_node("tools", ledger.tool_node([search, charge, deploy]))   # a ToolNode
    graph.compile(checkpointer=SqliteSaver(...)).invoke(..., config, durability="sync")

sessionlog is not a checkpointer here: LangGraph keeps its channel values, versions and pending
writes in its own checkpointer (the contract has no place for them), and LangGraph runs a node
at least once: a node killed midway runs again from its start. The ledger is what makes that
harmless for the tool node. It is `ToolNode`'s own extension point, `wrap_tool_call`
(`ledger.wrap_tool_call` for a `ToolNode` you build yourself); each call is looked up first:

* its result is recorded: that result is returned (as a `ToolMessage`), the tool does not run;
* its intent is recorded without a result (the process died during the tool): a tool declared
  `safe` (a read) or `idempotent` runs again with the same key; one with `reconcile=fn` is
  asked `fn(key, arguments)` (`Ran`, `DidNotRun`, `Unknown`, as in `sessionlog.tools`); any
  other is settled as *interrupted* (the contract's fixed text, returned as an error
  `ToolMessage`) and never runs again;
* nothing is recorded: its intent is committed, the tool runs, its result is committed.

The key: `idempotency_key()` called inside the tool (a contextvar the wrapper sets around the
tool's run) is the call's `sl-...` key, made from its intent's fact id: the same when it runs
again after a crash, no other call's (docs/idempotency.md).

Which session: one per LangGraph thread (`config["configurable"]["thread_id"]`), the current
session of the caller key `langgraph-thread:THREAD` (`repositories.keys`: two processes making
the first ledger of one thread at once agree on one session), labelled `sessionlog:tool-ledger`
and `langgraph-thread:THREAD` too. It is held open while a tool node of that thread runs in this
process.

The facts it writes, all valid contract facts (the contract's words for a model loop, mapped onto
a tool node honestly):

1. when a tool node first sees an AI message (one transaction): a **user entry** that is the
   ledger's marker, not a prompt (`[sessionlog tool ledger] LangGraph thread ...`; the
   conversation is in LangGraph's checkpointer, `sessionlog ls` shows no title for a ledger),
   its **runStarted**, a **stepAttempt** (its configuration snapshot: the node's tools, their
   definition digests; its context is the marker: what the model saw is LangGraph's) and the
   **assistant entry** settling it: the AI message's text and its tool calls, in its order. The
   model request was LangGraph's and is over by then, so no attempt is ever open;
2. per call: its **toolStarted** intent (arguments, `replay` `safe` or `never`, replay key,
   environment) right before the tool runs, and after it the **tool result** under the reserved
   id (success, or error when the `ToolMessage` has status `error` or the tool raised), or the
   `interrupted` synthetic, or a reconciled result with its note; an unknown tool gets the
   `unknownTool` synthetic. Calls that ToolNode runs in parallel record their intents in the
   order they start (the reducer accepts any order; a ledger is not replayed in order: LangGraph
   re-runs the node);
3. once every call of the message has its outcome: **abortRequested** (phase `model`, reason
   `escape`, the contract's only one) and **operationFinished** `aborted`. The contract ends a
   run either with a model answer without calls or with an abort; the ledger never sees the next
   answer (LangGraph's model node does), so each ledger run ends as aborted: read it as "the
   ledger's part is over", not as a user's abort. The session is then idle (`sessionlog ls`:
   idle) and `needs-recovery` only while a tool node of it is unfinished.

A tool node that moves on to a new AI message while the previous one's run is open (the graph
was resumed elsewhere) ends that run first the same way: pending intents are settled as
interrupted, calls never started as `aborted`. Tool call ids must be unique in a thread (every
provider's are): a re-executed node is matched to its run by its calls' ids.

What LangGraph must keep: the AI message durable before the tool node runs (`durability="sync"`;
with `"async"` a kill can lose the model node's checkpoint, the model is asked again, and its
new calls are new calls to the ledger). A tool that returns a `Command` runs as usual; its
result is recorded as a note saying so (a re-executed node gets that note, not the `Command`).
A tool that calls `interrupt()` must be `safe` or `idempotent`: LangGraph re-runs it from its
start on resume, which the ledger allows only for those. A tool that raised has its error
recorded: a node run again (a crash, or LangGraph's retry policy) gets that error back, the tool
does not run again. A result returned from the ledger is a `ToolMessage` of its recorded text,
status `error` for a synthetic one (the transcript keeps no other result type). Under `ainvoke`
ToolNode calls this same sync wrapper on the loop (its calls then run one after another); an
async-only tool is not supported.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt import ToolNode
from langgraph.types import Command

from ..core import facts as build
from ..core.errors import SessionLogError, name_shown
from ..core.shapes import LEDGER_MARKER_PREFIX, SYNTHETIC_CONTENT
from ..core.state import SessionState
from ..recovery import ToolStart, new_intent, recover
from ..repositories.base import MAX_LABEL
from ..repositories.keys import key_problem, key_shown
from ..runtime_facts import oversized, oversized_text
from ..runtime_reconcile import ask, decision, noted, ran_output
from ..runtime_shared import failure_text, result_facts
from ..tools import Configuration, ReconcileFunction, Tool, Tools, tool_named, tool_output
from .labels import TOOL_LEDGER, thread_label

__all__ = ["ADAPTER", "LedgerError", "ToolLedger", "idempotency_key"]

ADAPTER = "sessionlog.adapters.langgraph_tools"
"""The adapter identity in each ledger step's configuration snapshot."""
MARKER = LEDGER_MARKER_PREFIX + "LangGraph thread {thread}: the tool calls of one AI message"
COMMAND_NOTE = (
    "[sessionlog: the tool returned a LangGraph Command; the ledger records that it ran, not the Command]"
)

_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("sessionlog_tool_key", default=None)


class LedgerError(SessionLogError):
    """The ledger cannot record a call: no thread id in the config, no AI message holding the
    call in the state, a call without an id, a declaration naming no tool of the node."""


def idempotency_key() -> str:
    """The idempotency key of the tool call running now (inside a tool the ledger runs): `sl-`
    and its intent's fact id, the same every time that call runs again. LedgerError elsewhere."""
    key = _KEY.get()
    if key is None:
        raise LedgerError(
            "idempotency_key() is for a tool the ledger runs (a ToolNode with its wrap_tool_call)"
        )
    return key


@dataclass(frozen=True)
class _Run:
    """Run the tool: `start` is its intent (committed), `note` a reconciliation's (`notRun`)."""

    start: ToolStart
    note: str | None = None


@dataclass(frozen=True)
class _Done:
    """The call's recorded outcome: return it, run nothing."""

    text: str
    ok: bool


@dataclass(frozen=True)
class _Ask:
    """A pending intent of a tool with `reconcile`: ask its counterpart first."""

    start: ToolStart


class _Book:
    """One thread's ledger session, open while a tool node of that thread runs here."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.lock = threading.RLock()
        self.users = 0


class ToolLedger:
    """The tool ledger of a graph's tool node. `repository` is a sync sessionlog repository
    (`sessionlog.repository(...)`); `safe` names the reads recovery may run again, `idempotent`
    the tools that run again with the same key, `reconcile` maps a tool's name to its
    `fn(key, arguments)`; every other tool is `never`. `model` names the header's and the
    snapshots' model, `messages_key` the state's messages (ToolNode's own default)."""

    def __init__(
        self,
        repository: Any,
        *,
        safe: Iterable[str] = (),
        idempotent: Iterable[str] = (),
        reconcile: Mapping[str, ReconcileFunction] | None = None,
        model: str = "langgraph",
        messages_key: str = "messages",
    ) -> None:
        for name in ("list", "create", "open"):
            if not callable(getattr(repository, name, None)):
                raise TypeError(
                    f"repository is a sync sessionlog repository, not {type(repository).__name__}"
                )
        self.repository = repository
        self.safe = frozenset(_names(safe, "safe"))
        self.idempotent = frozenset(_names(idempotent, "idempotent"))
        self.reconcile = dict(reconcile or {})
        self.model = model
        self.messages_key = messages_key
        self._books: dict[str, _Book] = {}
        self._lock = threading.Lock()
        self._configurations: dict[tuple[int, ...], tuple[Tools, Configuration]] = {}

    # -- LangGraph's side ----------------------------------------------------------------------

    def tool_node(self, tools: Sequence[BaseTool | Callable[..., Any]], **options: Any) -> ToolNode:
        """`ToolNode(tools, wrap_tool_call=self.wrap_tool_call, **options)`."""
        node = ToolNode(tools, wrap_tool_call=self.wrap_tool_call, **options)
        self._check_names(node.tools_by_name)
        return node

    def wrap_tool_call(self, request: Any, execute: Callable[[Any], Any]) -> Any:
        """ToolNode's `wrap_tool_call`: the call's recorded outcome, or its intent, the tool
        (`execute`), its result."""
        call = request.tool_call
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            raise LedgerError(
                f"tool call {name_shown(str(call.get('name')))} has no id: the ledger cannot record it"
            )
        thread = _thread_id(request.runtime.config)
        message = self._message_of(request.state, call_id)
        tools, configuration = self._declarations(request.runtime.tools)
        with self._book(thread) as book:
            with book.lock:
                step = self._prepare(book.store, thread, message, call_id, tools, configuration)
            if isinstance(step, _Ask):
                step = self._asked(book, step, tools, configuration)
            if isinstance(step, _Done):
                return ToolMessage(
                    content=step.text,
                    tool_call_id=call_id,
                    name=call["name"],
                    status="success" if step.ok else "error",
                )
            if request.tool is None:  # an unknown tool: its synthetic is recorded, ToolNode answers
                return execute(request)
            return self._run(book, step, request, execute, configuration)

    # -- the ledger ----------------------------------------------------------------------------

    def _prepare(
        self,
        store: Any,
        thread: str,
        message: AIMessage,
        call_id: str,
        tools: Tools,
        configuration: Configuration,
    ) -> _Run | _Done | _Ask:
        calls = _contract_calls(message)
        ids = [call["id"] for call in calls]
        index = ids.index(call_id)
        state = store.load()
        if not _is_current(state, ids):
            past = _recorded(state, ids)
            if past is not None:  # its run is over: every call of it has its outcome
                return _Done(past[call_id], past[call_id] not in SYNTHETIC_CONTENT.values())
            _begin_step(store, state, thread, message, calls, configuration)
            state = store.load()
        if state.has_outcome(index):
            pending = [tool for tool in state.pending_tools if tool["toolIndex"] == index]
            if not pending:
                text = (_results_of(state, ids) or {})[call_id]
                return _Done(text, text not in SYNTHETIC_CONTENT.values())
            return self._pending(store, state, pending[0], tools, configuration)
        name = calls[index]["function"]["name"]
        declared = {tool["name"]: tool for tool in configuration.current["tools"]}
        if name not in declared:
            facts = [
                build.pre_execution_result(
                    state.step["stepId"], state.settled_entry_id, index, calls[index], "unknownTool"
                )
            ]
            store.commit(facts)
            _end_if_settled(store, configuration)
            return _Done(SYNTHETIC_CONTENT["unknownTool"], False)
        arguments = message.tool_calls[index]["args"]
        start = new_intent(state, index, calls[index], arguments, declared[name], configuration.current)
        store.commit(start.facts)
        return _Run(start)

    def _pending(
        self,
        store: Any,
        state: SessionState,
        intent: dict[str, Any],
        tools: Tools,
        configuration: Configuration,
    ) -> _Run | _Done | _Ask:
        """A pending intent of a re-executed node: run again (safe, idempotent, same declaration
        and environment), ask (reconcile), or settle as interrupted."""
        start = ToolStart("replay", [], intent)
        declared = {tool["name"]: tool for tool in configuration.current["tools"]}.get(intent["toolName"])
        same = (
            declared is not None
            and declared["replay"] == intent["replay"]
            and declared["replayKey"] == intent["replayKey"]
            and configuration.current["environmentIdentity"] == intent["environmentIdentity"]
        )
        if same and intent["replay"] == "safe":
            return _Run(start)
        tool = tools.get(intent["toolName"])
        if same and tool is not None and tool.reconcile is not None:
            return _Ask(start)
        return self._interrupted(store, intent, configuration)

    def _interrupted(self, store: Any, intent: dict[str, Any], configuration: Configuration) -> _Done:
        store.commit([build.interrupted_result(intent)])
        _end_if_settled(store, configuration)
        return _Done(SYNTHETIC_CONTENT["interrupted"], False)

    def _asked(self, book: _Book, step: _Ask, tools: Tools, configuration: Configuration) -> _Run | _Done:
        """Reconciliation (outside the lock: it may take its timeout): the counterpart's result,
        a run now with the same key, or interrupted."""
        tool = tools[step.start.tool_name]
        reconciled, ran = decision(tool, step.start, ask(tool, step.start))
        with book.lock:
            if reconciled.decision == "notRun":
                return _Run(step.start, "notRun")
            if ran is not None:
                text, ok = ran_output(tool, reconciled, ran)
                self._record(book.store, step.start, text, ok, configuration, "ran")
                return _Done(noted(text, "ran"), ok)
            # Unknown, a failure, a timeout, or any other answer: the contract's safe answer
            return self._interrupted(book.store, step.start.intent, configuration)

    def _run(
        self,
        book: _Book,
        step: _Run,
        request: Any,
        execute: Callable[[Any], Any],
        configuration: Configuration,
    ) -> Any:
        """The tool, with its key in `idempotency_key()`, then its result (a raised Exception as
        an error result, raised on; GraphBubbleUp or a kill leaves the intent pending)."""
        token = _KEY.set(step.start.key)
        try:
            output = execute(request)
        except GraphBubbleUp:
            raise
        except Exception as error:
            with book.lock:
                self._record(book.store, step.start, failure_text(error), False, configuration, step.note)
            raise
        finally:
            _KEY.reset(token)
        text, ok = _output_text(step.start.tool_name, output)
        with book.lock:
            self._record(book.store, step.start, text, ok, configuration, step.note)
        return output

    def _record(
        self,
        store: Any,
        start: ToolStart,
        text: str,
        ok: bool,
        configuration: Configuration,
        note: str | None = None,
    ) -> None:
        try:
            store.commit(result_facts(start, text, ok, None, note))
        except ValueError as error:
            if not oversized(error):
                raise
            store.commit(result_facts(start, oversized_text(text, error), False, None, note))
        _end_if_settled(store, configuration)

    # -- sessions, declarations, messages ------------------------------------------------------

    @contextlib.contextmanager
    def _book(self, thread: str) -> Iterator[_Book]:
        """The thread's ledger session, opened (or created) on first use, closed after its last."""
        with self._lock:
            book = self._books.get(thread)
            if book is None:
                book = self._books[thread] = _Book(self._open(thread))
            book.users += 1
        try:
            yield book
        finally:
            with self._lock:
                book.users -= 1
                if not book.users:
                    del self._books[thread]
                    book.store.close()

    def _open(self, thread: str) -> Any:
        """The ledger of `thread`: the current session of the caller key `thread_label(thread)`,
        made on its first tool call (race-free between processes: `repositories.keys`)."""
        labels = [TOOL_LEDGER, thread_label(thread)]
        return self.repository.create(
            provider="langgraph", model=self.model, labels=labels, key=thread_label(thread)
        )

    def session_id(self, thread: str) -> str | None:
        """The id of thread `thread`'s ledger session, None before its first tool call."""
        sessions = self.repository.key_sessions(thread_label(thread))  # None: the key names none yet
        return None if sessions is None else sessions.current

    def _declarations(self, tools: Sequence[BaseTool]) -> tuple[Tools, Configuration]:
        """The node's tools as sessionlog declarations (what recovery may do with each), and the
        configuration each ledger step records; made once per set of tools."""
        cache_key = tuple(id(tool) for tool in tools)
        made = self._configurations.get(cache_key)
        if made is None:
            self._check_names({tool.name: tool for tool in tools})
            declared = Tools(self._declared(tool) for tool in tools)
            environment = self._environment()
            made = (
                declared,
                Configuration.of(declared, model=self.model, environment=environment, adapter=ADAPTER),
            )
            self._configurations[cache_key] = made
        return made

    def _declared(self, tool: BaseTool) -> Tool:
        function = convert_to_openai_tool(tool)["function"]
        declared: dict[str, Any] = {}
        if tool.name in self.safe:
            declared["replay"] = "safe"
        if tool.name in self.idempotent:
            declared["idempotent"] = True
        if tool.name in self.reconcile:
            declared["reconcile"] = self.reconcile[tool.name]
        return Tool(
            tool.name,
            _run_by_langgraph,
            description=function.get("description", ""),
            parameters=function.get("parameters", {"type": "object"}),
            **declared,
        )

    def _environment(self) -> str:
        return f"{ADAPTER}:{self.model}"

    def _check_names(self, tools: Mapping[str, Any]) -> None:
        for kind, names in (
            ("safe", self.safe),
            ("idempotent", self.idempotent),
            ("reconcile", self.reconcile),
        ):
            for name in sorted(set(names) - set(tools)):
                raise LedgerError(f"{kind} names tool {tool_named(name)}, which is not a tool of the node")

    def _message_of(self, state: Any, call_id: str) -> AIMessage:
        """The AI message in the graph state that holds call `call_id` (the latest such)."""
        if isinstance(state, Mapping):
            messages = state.get(self.messages_key, [])
        elif isinstance(state, list):
            messages = state
        else:
            messages = getattr(state, self.messages_key, [])
        for message in reversed(messages):
            if isinstance(message, AIMessage) and any(
                call.get("id") == call_id for call in message.tool_calls
            ):
                return message
        raise LedgerError(
            f"no AI message in the state's {self.messages_key!r} holds tool call {call_id!r}: the ledger "
            "records the calls of a message (give ToolNode the graph state, not bare tool calls)"
        )


# -- facts ---------------------------------------------------------------------------------------


def _begin_step(
    store: Any,
    state: SessionState,
    thread: str,
    message: AIMessage,
    calls: list[dict[str, Any]],
    configuration: Configuration,
) -> None:
    """The ledger run of one AI message (one transaction), after ending an open one."""
    if not state.is_idle:
        _end_run(store, state, configuration)
    user = build.user_message(MARKER.format(thread=thread))
    run = build.run_started(user["id"])
    operation_id = run["record"]["operationId"]
    attempt = build.step_attempt(operation_id, user["id"], configuration.snapshot)
    record = attempt["record"]
    text = message.text if isinstance(message.text, str) else ""
    answer = build.assistant_message(record["stepId"], record["attemptId"], text or None, tool_calls=calls)
    store.commit([user, run, attempt, answer])


def _end_if_settled(store: Any, configuration: Configuration) -> None:
    """End the ledger run once every call of its message has its outcome."""
    state = store.load()
    if state.is_idle or state.step is None or state.pending_tools:
        return
    if all(state.has_outcome(index) for index in range(len(state.settled_calls))):
        _end_run(store, state, configuration)


def _end_run(store: Any, state: SessionState, configuration: Configuration) -> None:
    """`abortRequested`, then what recovery plans from it: pending intents interrupted, calls
    never started aborted, the run finished `aborted`."""
    operation = state.current_operation
    assert operation is not None
    if not operation["abortRequested"]:
        pending = state.pending_tools
        phase = "tool" if pending else "model"
        tool_call_id = pending[0]["toolCallId"] if pending else None
        store.commit(
            [
                build.abort_requested(
                    operation["operationId"], operation["kind"], phase, tool_call_id=tool_call_id
                )
            ]
        )
    recover(store, configuration.current)


def _contract_calls(message: AIMessage) -> list[dict[str, Any]]:
    calls = []
    for call in message.tool_calls:
        if not isinstance(call.get("id"), str) or not call["id"]:
            raise LedgerError(
                f"tool call {name_shown(str(call.get('name')))} has no id: the ledger cannot record it"
            )
        calls.append(build.tool_call(call["id"], call["name"], json.dumps(call["args"], ensure_ascii=False)))
    return calls


def _is_current(state: SessionState, ids: list[str]) -> bool:
    return not state.is_idle and [call["id"] for call in state.settled_calls] == ids


def _recorded(state: SessionState, ids: list[str]) -> dict[str, str] | None:
    """The results of a past ledger run of the message whose calls are `ids`, else None."""
    found = _results_of(state, ids)
    return found if found is not None and len(found) == len(ids) else None


def _results_of(state: SessionState, ids: list[str]) -> dict[str, str] | None:
    """The results recorded for the latest assistant entry whose calls are `ids` (None: no such
    entry), by call id."""
    transcript = list(state.transcript)
    for position in range(len(transcript) - 1, -1, -1):
        message = transcript[position]
        if message["role"] == "assistant" and [call["id"] for call in message.get("tool_calls") or []] == ids:
            return _results(transcript[position + 1 :], ids)
    return None


def _results(messages: Iterable[Mapping[str, Any]], ids: list[str]) -> dict[str, str]:
    wanted = set(ids)
    found: dict[str, str] = {}
    for message in messages:
        if message["role"] == "tool" and message.get("tool_call_id") in wanted:
            found[message["tool_call_id"]] = message["content"]
    return found


def _output_text(name: str, output: Any) -> tuple[str, bool]:
    """What the ledger records of a tool's output: a ToolMessage's content as text (error when
    its status is), a Command's note."""
    outputs = output if isinstance(output, list) else [output]
    for item in outputs:
        if isinstance(item, ToolMessage):
            text, ok = tool_output(name, item.content)
            return text, ok and item.status != "error"
    if any(isinstance(item, Command) for item in outputs):
        return COMMAND_NOTE, True
    return tool_output(name, output)


MAX_THREAD = MAX_LABEL - len(thread_label(""))
"""The longest thread id a tool ledger takes, in characters: its label `langgraph-thread:ID` is
a label (`repositories.base.MAX_LABEL`) and its key a caller key."""


def _thread_id(config: Mapping[str, Any] | None) -> str:
    thread = ((config or {}).get("configurable") or {}).get("thread_id")
    if thread is None or thread == "":
        raise LedgerError(
            'the tool ledger needs a thread: invoke the graph with {"configurable": {"thread_id": ...}}'
        )
    thread = str(thread)
    problem = (
        f"it has {len(thread):,} characters, more than {MAX_THREAD}" if len(thread) > MAX_THREAD else None
    )
    problem = problem or key_problem(thread_label(thread))
    if problem is not None:
        raise LedgerError(f"thread id {key_shown(thread)} cannot name a tool ledger: {problem}")
    return thread


def _run_by_langgraph(arguments: Any, key: str | None = None) -> Any:
    """A declaration's `run`, never called: LangGraph runs the tool (`ToolNode`'s `execute`)."""
    raise LedgerError("the ledger never runs a tool itself: LangGraph's ToolNode does")


def _names(names: Iterable[str], what: str) -> list[str]:
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise TypeError(f"{what} is an iterable of tool names, not {type(names).__name__}")
    return [str(name) for name in names]
