"""The LangGraph tool ledger (`sessionlog.adapters.langgraph_tools`) under LangGraph itself: its
own `StateGraph`, `ToolNode` and SQLite checkpointer (`SqliteSaver`, durable across processes),
a fake chat model that asks for three tools, and a child process killed with SIGKILL during a
tool. The child then runs again from LangGraph's checkpoint; every effect is counted in a file
outside both stores (`effects.txt`), and the ledger is read back to say what happened."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.sqlite", reason="LangGraph tests need sessionlog[langgraph]")

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import sessionlog
from sessionlog.adapters.labels import TOOL_LEDGER
from sessionlog.adapters.langgraph_tools import LedgerError, ToolLedger, idempotency_key
from sessionlog.core.shapes import SYNTHETIC_CONTENT
from sessionlog.recovery import idempotency_key as key_of
from sessionlog.runtime_reconcile import NOT_RUN_NOTE, RAN_NOTE
from sessionlog.tools import DidNotRun, Ran

THREAD = {"configurable": {"thread_id": "thread-1"}}
INTERRUPTED = SYNTHETIC_CONTENT["interrupted"]


class ScriptedModel(BaseChatModel):
    """A chat model without a network: after a user message it asks for charge, deploy and bash
    (ids made from the turn, so the same AI message has the same calls); after tool results it
    answers `done`."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **_: Any
    ) -> Any:
        if isinstance(messages[-1], HumanMessage):
            turn = sum(isinstance(message, HumanMessage) for message in messages)
            calls = [
                {"id": f"call-{turn}-charge", "name": "charge", "args": {"amount": 5}},
                {"id": f"call-{turn}-deploy", "name": "deploy", "args": {"version": "v2"}},
                {"id": f"call-{turn}-bash", "name": "bash", "args": {"command": "make clean"}},
            ]
            message = AIMessage(content="", tool_calls=calls)
        else:
            message = AIMessage(content="done")
        return ChatResult(generations=[ChatGeneration(message=message)])


# -- the world outside both stores: effects.txt, one line per effect -----------------------------

WORLD: dict[str, Any] = {"dir": None, "kill": None}


def _effect(kind: str, key: str) -> None:
    with open(Path(WORLD["dir"]) / "effects.txt", "a") as file:
        file.write(f"{kind} {key}\n")
        file.flush()
        os.fsync(file.fileno())


def effects(folder: Path) -> list[tuple[str, str]]:
    path = folder / "effects.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(line.split()[0], line.split()[1]) for line in lines]


def _key() -> str:
    """The call's key under the ledger; without it (the control run) a fresh one per run."""
    try:
        return idempotency_key()
    except LedgerError:
        return f"no-ledger-{os.urandom(4).hex()}"


def _maybe_killed(name: str, when: str) -> None:
    if WORLD["kill"] == (name, when):
        os.kill(os.getpid(), signal.SIGKILL)


@tool
def charge(amount: int) -> str:
    """Charge the card (the payment API deduplicates by idempotency key)."""
    key = _key()
    _maybe_killed("charge", "before")
    _effect("charge-request", key)
    if ("charge", key) not in effects(Path(WORLD["dir"])):
        _effect("charge", key)
    _maybe_killed("charge", "after")
    return f"charged {amount}"


@tool
def deploy(version: str) -> str:
    """Deploy a release (its status can be asked by key)."""
    key = _key()
    _maybe_killed("deploy", "before")
    _effect("deploy", key)
    _maybe_killed("deploy", "after")
    return f"release {version} live"


@tool
def bash(command: str) -> str:
    """Run a shell command (never twice)."""
    _maybe_killed("bash", "before")
    _effect("bash", _key())
    _maybe_killed("bash", "after")
    return f"ran {command}"


def deploy_status(key: str, arguments: dict[str, Any]) -> object:
    if ("deploy", key) in effects(Path(WORLD["dir"])):
        return Ran(f"release {arguments['version']} live")
    return DidNotRun()


def ledger_for(folder: Path) -> ToolLedger:
    repository = sessionlog.repository(f"sqlite:///{folder}/ledger.db")
    return ToolLedger(repository, idempotent=["charge"], reconcile={"deploy": deploy_status})


def graph_for(folder: Path, ledger: ToolLedger | None, connection: sqlite3.Connection) -> Any:
    """The README's ReAct loop; `ledger=None`: a plain ToolNode (the control)."""
    model = ScriptedModel()
    graph = StateGraph(MessagesState)
    graph.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
    tools = [charge, deploy, bash]
    graph.add_node("tools", ledger.tool_node(tools) if ledger is not None else ToolNode(tools))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=SqliteSaver(connection))


def _agent(
    folder: str, kill: tuple[str, str] | None, resume: bool, parallel: bool, plain: bool = False
) -> None:
    """One process of the agent: the graph from the prompt, or again from its checkpoint."""
    WORLD.update(dir=folder, kill=kill)
    path = Path(folder)
    connection = sqlite3.connect(path / "checkpoints.db", check_same_thread=False)
    app = graph_for(path, None if plain else ledger_for(path), connection)
    config = {**THREAD, "max_concurrency": None if parallel else 1}
    prompt = {"messages": [HumanMessage("Charge 5, deploy v2, clean up.")]}
    app.invoke(None if resume is True else prompt, config, durability="sync")
    connection.close()


def run_agent(
    folder: Path,
    kill: tuple[str, str] | None = None,
    *,
    resume: bool = False,
    parallel: bool = False,
    plain: bool = False,
) -> int:
    arguments = (str(folder), kill, resume, parallel, plain)
    process = multiprocessing.get_context("fork").Process(target=_agent, args=arguments)
    process.start()
    process.join(60)
    assert process.exitcode is not None, "the agent process did not end within 60 s"
    return process.exitcode


def final_messages(folder: Path) -> list[BaseMessage]:
    with sqlite3.connect(folder / "checkpoints.db", check_same_thread=False) as connection:
        app = graph_for(folder, ledger_for(folder), connection)
        return list(app.get_state(THREAD).values["messages"])


def ledger_state(folder: Path) -> sessionlog.SessionState:
    ledger = ledger_for(folder)
    session_id = ledger.session_id("thread-1")
    assert session_id is not None
    return ledger.repository.load(session_id)


def tool_results(messages: list[Any]) -> dict[str, str]:
    """Tool message content by tool name (a graph's ToolMessages or a ledger's transcript)."""
    found = {}
    for message in messages:
        if isinstance(message, ToolMessage):
            found[str(message.name)] = str(message.content)
        elif isinstance(message, dict) and message["role"] == "tool":
            found[message["tool_call_id"].rpartition("-")[2]] = message["content"]
    return found


# -- crashes -------------------------------------------------------------------------------------

CASES = {
    # kill point: (what the ledger says of the killed call, its effects after the rerun)
    ("bash", "after"): ("bash", INTERRUPTED, {"bash": 1}),
    ("bash", "before"): ("bash", INTERRUPTED, {"bash": 0}),
    ("charge", "after"): ("charge", "charged 5", {"charge": 1, "charge-request": 2}),
    ("deploy", "before"): ("deploy", f"release v2 live\n{NOT_RUN_NOTE}", {"deploy": 1}),
    ("deploy", "after"): ("deploy", f"release v2 live\n{RAN_NOTE}", {"deploy": 1}),
}


@pytest.mark.parametrize("kill", list(CASES), ids=lambda kill: f"{kill[0]}-{kill[1]}")
def test_a_tool_killed_runs_at_most_once_and_the_ledger_says_what_happened(
    tmp_path: Path, kill: tuple[str, str]
) -> None:
    name, recorded, counts = CASES[kill]
    assert run_agent(tmp_path, kill) == -signal.SIGKILL
    state = ledger_state(tmp_path)
    assert [tool["toolName"] for tool in state.pending_tools] == [name]  # the intent, durable first

    assert run_agent(tmp_path, resume=True) == 0  # from LangGraph's checkpoint: the tools node again

    made = effects(tmp_path)
    for kind in ("charge", "deploy", "bash"):
        keys = [key for what, key in made if what == kind]
        assert len(keys) == counts.get(kind, 1), (kind, made)
        assert len(set(keys)) == len(keys)  # at most once per call
    if "charge-request" in counts:  # the idempotent tool ran again, with the same key
        requests = [key for what, key in made if what == "charge-request"]
        assert len(requests) == 2 and len(set(requests)) == 1
    state = ledger_state(tmp_path)
    assert state.is_idle and state.last_finished is not None
    assert state.last_finished["outcome"] == "aborted"  # the ledger's part is over (see its docstring)
    assert not state.pending_tools
    ledger_says = tool_results(list(state.transcript))
    assert ledger_says[name] == recorded
    messages = final_messages(tmp_path)
    assert messages[-1].content == "done"
    assert tool_results(messages)[name] in (recorded, "release v2 live")  # notRun: the tool's own text


def test_without_the_ledger_langgraph_runs_the_killed_tool_again(tmp_path: Path) -> None:
    """The control: a plain ToolNode, killed during bash, runs bash again (at least once per
    node), and the charge twice under two keys."""
    assert run_agent(tmp_path, ("bash", "after"), plain=True) == -signal.SIGKILL
    assert run_agent(tmp_path, resume=True, plain=True) == 0
    made = [kind for kind, _ in effects(tmp_path)]
    assert made.count("bash") == 2 and made.count("charge") == 2


def test_a_kill_after_the_ledger_finished_returns_every_result_from_it(tmp_path: Path) -> None:
    """Killed while LangGraph saves the tool node's writes: the ledger has every result, the node
    runs again, and no tool does."""
    code = subprocess.run(
        [sys.executable, "-c", KILLED_IN_PUT_WRITES, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert code.returncode == -signal.SIGKILL, code.stderr[-2000:]
    before = effects(tmp_path)
    assert sorted(kind for kind, _ in before) == ["bash", "charge", "charge-request", "deploy"]
    assert ledger_state(tmp_path).is_idle
    assert run_agent(tmp_path, resume=True) == 0
    assert effects(tmp_path) == before
    assert tool_results(final_messages(tmp_path)) == {
        "charge": "charged 5",
        "deploy": "release v2 live",
        "bash": "ran make clean",
    }


KILLED_IN_PUT_WRITES = f"""
import os, signal, sys
sys.path.insert(0, os.path.dirname({__file__!r}))
import test_adapter_langgraph as t
from langgraph.checkpoint.sqlite import SqliteSaver
put_writes = SqliteSaver.put_writes
def killing(self, config, writes, task_id, task_path=""):
    if any(channel == "messages" and any(m.type == "tool" for m in value) for channel, value in writes):
        os.kill(os.getpid(), signal.SIGKILL)
    return put_writes(self, config, writes, task_id, task_path)
SqliteSaver.put_writes = killing
t._agent(sys.argv[1], None, False, False)
"""


def test_parallel_calls_each_recorded_once(tmp_path: Path) -> None:
    """ToolNode's own parallel run (a thread per call): each intent and result recorded, in the
    order the calls started; run again from the start of the node, nothing runs twice."""
    assert run_agent(tmp_path, ("bash", "after"), parallel=True) == -signal.SIGKILL
    assert run_agent(tmp_path, resume=True, parallel=True) == 0
    made = effects(tmp_path)
    assert sorted(kind for kind, _ in made if kind != "charge-request") == ["bash", "charge", "deploy"]
    state = ledger_state(tmp_path)
    assert state.is_idle and tool_results(list(state.transcript))["bash"] == INTERRUPTED


def test_a_graph_that_moves_on_ends_the_open_ledger_run_first(tmp_path: Path) -> None:
    """Killed during bash, then given a new prompt instead of being resumed: the tool node sees a
    new AI message while the first one's ledger run is open; that run is ended first (bash
    interrupted, never run again), then the new message's calls run."""
    assert run_agent(tmp_path, ("bash", "after")) == -signal.SIGKILL
    assert run_agent(tmp_path, resume="prompt") == 0
    state = ledger_state(tmp_path)
    assert state.is_idle
    transcript = list(state.transcript)
    results = {
        message["tool_call_id"]: message["content"] for message in transcript if message["role"] == "tool"
    }
    assert results["call-1-bash"] == INTERRUPTED
    aborts = [
        fact["record"]
        for facts in ledger_transactions(tmp_path)
        for fact in facts
        if fact["kind"] == "record" and fact["record"]["type"] == "abortRequested"
    ]
    assert [(abort["phase"], abort.get("toolCallId")) for abort in aborts] == [
        ("tool", "call-1-bash"),
        ("model", None),
    ]
    assert results["call-2-bash"] == "ran make clean"
    assert [key for kind, key in effects(tmp_path) if kind == "bash"] == [
        idempotency_key_of(tmp_path, "call-1-bash"),
        idempotency_key_of(tmp_path, "call-2-bash"),
    ]


def ledger_transactions(folder: Path) -> list[list[dict[str, Any]]]:
    """The ledger session's transactions, each a list of its facts, as exported."""
    ledger = ledger_for(folder)
    session_id = ledger.session_id("thread-1")
    assert session_id is not None
    lines = ledger.repository.export(session_id).decode().splitlines()[1:]
    return [value if isinstance(value, list) else [value] for value in map(json.loads, lines)]


def idempotency_key_of(folder: Path, call_id: str) -> str:
    """The key the ledger gave call `call_id`: made from its intent's fact id."""
    (intent,) = [
        fact
        for facts in ledger_transactions(folder)
        for fact in facts
        if fact["kind"] == "record" and fact["record"].get("toolCallId") == call_id
        and fact["record"]["type"] == "toolStarted"
    ]  # fmt: skip
    return key_of(intent["id"])


# -- what the ledger is ---------------------------------------------------------------------------


def test_the_ledger_facts_and_labels(tmp_path: Path) -> None:
    assert run_agent(tmp_path) == 0
    ledger = ledger_for(tmp_path)
    (info,) = ledger.repository.list()
    assert set(info.labels) == {TOOL_LEDGER, "langgraph-thread:thread-1"}
    transactions = ledger_transactions(tmp_path)
    assert [len(facts) for facts in transactions] == [4, 1, 1, 1, 1, 1, 1, 1, 1]  # the message's run: one
    facts = [fact for facts in transactions for fact in facts]
    kinds = [
        fact["record"]["type"] if fact["kind"] == "record" else fact["entry"]["message"]["role"]
        for fact in facts
    ]
    assert kinds == [
        "user", "runStarted", "stepAttempt", "assistant",
        "toolStarted", "tool", "toolStarted", "tool", "toolStarted", "tool",
        "abortRequested", "operationFinished",
    ]  # fmt: skip
    intents = [fact["record"] for fact, kind in zip(facts, kinds, strict=True) if kind == "toolStarted"]
    assert [(intent["toolName"], intent["replay"]) for intent in intents] == [
        ("charge", "safe"),
        ("deploy", "never"),
        ("bash", "never"),
    ]


def test_ls_shows_no_ledger_entry_as_a_prompt(tmp_path: Path) -> None:
    assert run_agent(tmp_path) == 0
    location = f"sqlite:///{tmp_path}/ledger.db"
    text = subprocess.run(
        [sys.executable, "-m", "sessionlog.cli", "ls", location], capture_output=True, text=True, check=True
    ).stdout
    assert "tool ledger" in text and "[sessionlog tool ledger]" not in text
    rows = json.loads(
        subprocess.run(
            [sys.executable, "-m", "sessionlog.cli", "ls", location, "--json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert rows[0]["title"] is None


def test_the_key_outside_a_ledger_call_is_refused() -> None:
    with pytest.raises(LedgerError, match="for a tool the ledger runs"):
        idempotency_key()


def test_a_declaration_naming_no_tool_of_the_node_is_refused(tmp_path: Path) -> None:
    ledger = ToolLedger(sessionlog.repository(f"sqlite:///{tmp_path}/l.db"), safe=["serch"])
    with pytest.raises(LedgerError, match="'serch'"):
        ledger.tool_node([charge])
    secret = "sk_live_" + "Q" * 40  # a secret pasted as a name: never shown beyond its first 8
    pasted = ToolLedger(sessionlog.repository(f"sqlite:///{tmp_path}/m.db"), reconcile={secret: print})
    with pytest.raises(
        LedgerError, match="names tool a name of 48 characters starting 'sk_live_'"
    ) as refused:
        pasted.tool_node([charge])
    assert "QQ" not in str(refused.value)


@pytest.mark.parametrize(
    ("thread", "refusal"),
    [
        (None, "needs a thread"),
        ("t" * 184, "thread id .* cannot name a tool ledger: it has 184 characters"),
        ("e\u0301", "thread id .* cannot name a tool ledger: it is not in NFC"),
        ("nul\x00", "thread id .* cannot name a tool ledger: it holds a NUL"),
    ],
    ids=["none", "too-long", "not-nfc", "nul"],
)
def test_a_graph_without_a_thread_a_ledger_can_name_is_refused_before_any_tool_runs(
    tmp_path: Path, thread: str | None, refusal: str
) -> None:
    WORLD.update(dir=str(tmp_path), kill=None)
    graph = StateGraph(MessagesState)
    graph.add_node("model", lambda state: {"messages": [ScriptedModel().invoke(state["messages"])]})
    graph.add_node("tools", ledger_for(tmp_path).tool_node([charge, deploy, bash]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    config = {} if thread is None else {"configurable": {"thread_id": thread}}
    with pytest.raises(LedgerError, match=refusal):
        graph.compile().invoke({"messages": [HumanMessage("Charge 5.")]}, config)  # type: ignore[arg-type]
    assert effects(tmp_path) == []


def test_the_docs_example_runs_as_written_twice_on_one_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/langgraph.md's code as it is: each run charges once, with a key of its own."""
    page = (Path(__file__).parents[1] / "docs" / "langgraph.md").read_text()
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    printed: list[str] = []
    for _ in range(2):
        exec(compile(code, "langgraph.md", "exec"), {"print": printed.append})
    assert printed == ["Charged.", "Charged."]
    with sessionlog.repository("sqlite:///ledger.db") as repo:
        (ledger,) = repo.list()
        results = [
            entry["content"] for entry in repo.load(ledger.session_id).transcript if entry["role"] == "tool"
        ]
    assert len(results) == 2 and results[0] != results[1]  # two charges, two keys
