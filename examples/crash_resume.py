"""A scripted agent that crashes in the middle of a tool and resumes from its session.

    python examples/crash_resume.py SESSION WORKSPACE [--crash-in-tool] [--prompt TEXT]
    python examples/crash_resume.py SESSION WORKSPACE --print-current

No network and no model: a fake provider answers from the active context. Two real tools act on
the WORKSPACE directory: `write` appends text to a file (declared `replay: never`: running it
twice would append twice) and `read` returns a file's text (declared `replay: safe`).

Intent before effect, throughout:

    accept the prompt   [user entry, runStarted]            the work is accepted
    each model call     stepAttempt, then the request, then [assistant entry, usage]
    each tool batch     one toolStarted per call, all durable before the first tool runs
    each tool           run it, then its result under the entry id its intent reserved
    the end             operationFinished (sessionlog.recover commits it: it needs no effect)

The agent loop is the recovery loop: `sessionlog.recover` commits whatever needs no effect and
returns the next plan; the agent carries out `startStep` (a model call) and `startTool` (a tool
batch, or the replay of a safe read) with the building blocks `start_step_facts` and
`start_tool_facts`. A fresh run and a resumed run are the same loop.

`--crash-in-tool` kills the process with `os._exit(1)` inside the write tool, after its effect
and before its result: both intents are durable, neither outcome is. Run the script again (with
or without `sessionlog recover` in between): the write is settled as interrupted and never run
again, the read is replayed, and the run completes.

Every run writes the current configuration (the planner's input) to `current.json` next to the
session, for `sessionlog plan` and `sessionlog recover`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sessionlog
from sessionlog.core import facts as F

MODEL = "scripted/fake-1"
SYSTEM_PROMPT = "You are a careful agent. Use the tools to change and inspect files in the workspace."
DEFAULT_PROMPT = "Append a greeting to notes.txt, then show me the file."
GREETING = "hello from the agent\n"

# name: (definition, replay, replayKey). The definition is what the model sees; its digest
# pins it in the configuration snapshot of every attempt.
TOOLS: dict[str, tuple[dict[str, Any], str, str]] = {
    "write": (
        {
            "name": "write",
            "description": "Append text to a file in the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
                "required": ["path", "text"],
            },
        },
        "never",
        "crash_resume:write:v1",
    ),
    "read": (
        {
            "name": "read",
            "description": "Return the text of a file in the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
        "safe",
        "crash_resume:read:v1",
    ),
}


def _digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(sessionlog.canonical(value)).hexdigest()


def configuration(environment: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The configuration snapshot every attempt records, and the planner's current configuration."""
    snapshot = {
        "model": MODEL,
        "systemPromptDigest": _digest(SYSTEM_PROMPT),
        "tools": [{"name": name, "definitionDigest": _digest(spec[0])} for name, spec in TOOLS.items()],
        "adapterIdentity": "crash_resume.fake_provider:v1",
        "routingIdentity": "local",
        "outputOptionsDigest": _digest({}),
    }
    current = {
        "configurationDigest": sessionlog.configuration_digest(snapshot),
        "environmentIdentity": environment,
        "tools": [
            {"name": name, "definitionDigest": _digest(spec[0]), "replay": spec[1], "replayKey": spec[2]}
            for name, spec in TOOLS.items()
        ],
    }
    return snapshot, current


# -- the fake provider -------------------------------------------------------------------------


@dataclass
class Reply:
    content: str | None
    calls: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)


def complete(context: list[dict[str, Any]]) -> Reply:
    """The scripted model: tool calls for a new prompt, a summary once the tools answered."""
    size = sum(len(message.get("content") or "") for message in context) + len(SYSTEM_PROMPT)
    last = context[-1]
    if last["role"] == "user":
        calls = [
            F.tool_call("call_write", "write", json.dumps({"path": "notes.txt", "text": GREETING})),
            F.tool_call("call_read", "read", json.dumps({"path": "notes.txt"})),
        ]
        content = "I'll append the greeting, then read the file back."
        return Reply(content, calls, {"input": size // 4, "output": 40})
    answers = []
    for message in reversed(context):
        if message["role"] != "tool":
            break
        answers.append(f"[{message['tool_call_id']}] {message['content']}")
    content = "Done. The tools said:\n" + "\n".join(reversed(answers))
    return Reply(content, [], {"input": size // 4, "output": len(content) // 4})


# -- the tools ---------------------------------------------------------------------------------


class ToolError(Exception):
    pass


class Workspace:
    def __init__(self, root: Path, *, crash_in_tool: bool) -> None:
        self.root = root
        self.crash_in_tool = crash_in_tool

    def _path(self, relative: Any) -> Path:
        if not isinstance(relative, str) or not relative:
            raise ToolError("path must be a non-empty string")
        path = (self.root / relative).resolve()
        if not path.is_relative_to(self.root):
            raise ToolError(f"{relative} is outside the workspace")
        return path

    def run(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        try:
            if name == "write":
                return self.write(arguments), True
            if name == "read":
                return self.read(arguments), True
            raise ToolError(f"no tool {name}")
        except (ToolError, OSError) as error:
            return f"Error: {error}", False

    def write(self, arguments: dict[str, Any]) -> str:
        path = self._path(arguments.get("path"))
        text = arguments.get("text")
        if not isinstance(text, str):
            raise ToolError("text must be a string")
        with path.open("a", encoding="utf-8") as file:
            file.write(text)
        if self.crash_in_tool:
            # The effect happened; its result is not written: kill -9 in the worst moment.
            say("crash", f"os._exit(1) inside write, after appending to {path.name}, before its result")
            os._exit(1)
        return f"appended {len(text.encode())} bytes to {arguments['path']}"

    def read(self, arguments: dict[str, Any]) -> str:
        return self._path(arguments.get("path")).read_text(encoding="utf-8")


# -- the agent ---------------------------------------------------------------------------------


def say(what: str, text: str) -> None:
    print(f"{what:<9}{text}", flush=True)


def committed(plan: dict[str, Any], facts: list[dict[str, Any]]) -> None:
    """`sessionlog.recover` reports each transaction it commits."""
    seqs = f"seq {facts[0]['seq']}" + (f"-{facts[-1]['seq']}" if len(facts) > 1 else "")
    if plan["type"] == "appendSynthetic":
        text = ", ".join(f"{result['reason']} {result['toolName']}" for result in plan["results"])
        say("recover", f"{seqs}: synthetic result {text}")
    else:
        say("recover", f"{seqs}: {plan['type']} {plan.get('outcome', '')}".rstrip())


class Agent:
    def __init__(
        self,
        store: sessionlog.SessionStore,
        workspace: Workspace,
        snapshot: dict[str, Any],
        current: dict[str, Any],
    ) -> None:
        self.store = store
        self.workspace = workspace
        self.snapshot = snapshot
        self.current = current

    def drive(self) -> int:
        """Until the operation is finished: recover, then carry out the plan that needs us."""
        while True:
            plan = sessionlog.recover(self.store, self.current, on_commit=committed)
            state = self.store.load()
            if plan["type"] == "finish":  # idle: recover committed the finish (or there was none)
                return 0
            if plan["type"] == "blocked":
                say("blocked", f"{plan['reason']}: a human has to decide (the session is unchanged)")
                return 1
            if plan["type"] == "startStep":
                self.model_step(state, plan)
            elif plan["mode"] == "replay":
                self.run_tool(sessionlog.start_tool_facts(state, plan, self.current))
            else:
                self.tool_batch(plan)

    def model_step(self, state: sessionlog.SessionState, plan: dict[str, Any]) -> None:
        # Intent: once this stepAttempt is durable, a request may have been sent.
        attempt = self.store.commit(sessionlog.start_step_facts(state, plan, self.snapshot))[0]["record"]
        say("model", f"attempt {attempt['attempt']} of step {attempt['stepId']}")
        reply = complete(self.store.load().active_context)
        entry = F.assistant_message(
            attempt["stepId"], attempt["attemptId"], reply.content, tool_calls=reply.calls
        )
        usage = F.usage(attempt["operationId"], reply.usage, attempt_id=attempt["attemptId"])
        self.store.commit([entry, usage])
        if reply.calls:
            say("model", "asks for " + ", ".join(call["function"]["name"] for call in reply.calls))

    def tool_batch(self, plan: dict[str, Any]) -> None:
        """Every call's intent is durable before the first tool of the batch runs."""
        starts = []
        while plan["type"] == "startTool" and plan["mode"] == "start":
            start = sessionlog.start_tool_facts(self.store.load(), plan, self.current)
            self.store.commit(start.facts)
            say("intent", f"{start.tool_name} {json.dumps(start.arguments)} (result {start.result_entry_id})")
            starts.append(start)
            plan = sessionlog.plan_recovery(self.store.load(), self.current)
        for start in starts:
            self.run_tool(start)

    def run_tool(self, start: sessionlog.ToolStart) -> None:
        say(
            "replay" if start.mode == "replay" else "tool", f"{start.tool_name} {json.dumps(start.arguments)}"
        )
        content, ok = self.workspace.run(start.tool_name, start.arguments)
        self.store.commit([start.result(content, ok=ok)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("session", help="the session file (created on the first run, resumed after)")
    parser.add_argument("workspace", help="the directory the tools work in")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="the prompt of a new session")
    parser.add_argument(
        "--crash-in-tool", action="store_true", help="os._exit(1) in the middle of the write tool"
    )
    parser.add_argument(
        "--print-current", action="store_true", help="print the current configuration and exit"
    )
    args = parser.parse_args(argv)

    root = Path(args.workspace).resolve()
    root.mkdir(parents=True, exist_ok=True)
    environment = str(root)
    snapshot, current = configuration(environment)
    if args.print_current:
        print(json.dumps(current, indent=2))
        return 0
    session = Path(args.session)
    (session.parent / "current.json").write_text(json.dumps(current, indent=2) + "\n")

    if session.exists():
        store = sessionlog.open(session)
        say("session", f"{session}: resuming at seq {store.load().last_seq}")
        if store.load().is_idle:
            say("session", "idle: nothing to resume")
    else:
        store = sessionlog.create(
            session, provider="fake", model=MODEL, cwd=environment, environment_identity=environment
        )
        store.commit(F.accept_prompt(args.prompt))
        say("session", f"{session}: new, accepted {args.prompt!r}")
    with store:
        agent = Agent(store, Workspace(root, crash_in_tool=args.crash_in_tool), snapshot, current)
        status = agent.drive()
        state = store.load()
    if status == 0 and state.transcript:
        final = state.transcript[-1]
        if final["role"] == "assistant":
            say("answer", final["content"] or "")
    return status


if __name__ == "__main__":
    sys.exit(main())
