"""kill -9 of an agent loop written on the runtime (`sessionlog.Session`), resumed again and again.

A child process runs the README's loop on a scripted agent: prompts 1..N, each a run of a few
steps in which a fake model asks for three tools in one answer, a safe `read`, a `write` and a
`bash` (both never replayable), then answers. Every tool logs itself to an effects log as it
begins (from there on its effect may have happened), and the child says on stdout where it is
(`resume`, `model`, `tool NAME`). The parent SIGKILLs children and starts the next one (which
resumes the session and goes on, restarting a blocked run as the README does), choosing for each
kill one of:

* `anywhere`: a random moment of the child's life;
* `model`: during a model request; `model-twice`: during one, then during the retry of that
  same request in the next child (attempt 2: the run is blocked, the loop restarts it);
* `tool`: during a tool (read, write or bash, at random);
* `recovery`: during `resume()` itself (a tool killed first, so that recovery has work to do).

It counts, per design (`intents="tool"`, the default, and `intents="step"`):

* tools run twice (a `write` or `bash` call that began more than once);
* tools settled as interrupted that never started (no effect logged for that call);
* runs stuck (a child that failed, a session that did not end idle with every prompt answered);
* tools out of the model's order (a tool of a step that began after a later tool of that step);
* runs finished (completed, failed, aborted) and restarts.

`against="ledger"` (issue 27) runs the same loop against a real counterpart instead of an
effects file: the test service of `testing.ledger_service`, in its own process with its own
durable ledger, which honours idempotency keys and answers status queries by key. Each step asks
for a `charge` (declared `idempotent`: replayed with its key), a `deploy` (with `reconcile`: after
a crash the service is asked by key whether it ran) and a `bash` (neither). The report then has
`ledger` (`LedgerFigures`): charges per intended call (exactly 1), deploys reconciled as ran, as
not run, or interrupted, bash never run twice.

    python -m sessionlog.testing.agent_kills run --kills 200 [--intents tool|step] [--against ledger]
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import random
import select
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.loading import reduce_bytes
from .ledger_service import LedgerFigures, Service, agent_tools, ledger_figures

PROMPTS = 2
STEPS = 2  # tool steps per run; then the answer
TOOLS = ("read", "write", "bash")
SCENARIOS = {"files": TOOLS, "ledger": ("charge", "deploy", "bash")}
"""The tools of a step, by counterpart (`against`): the first of each may run again (a safe
read; an idempotent charge), and so may a reconciled `deploy` that had not run."""
RUN_AGAIN = {"read", "charge", "deploy"}
"""Tools whose call may begin more than once (`deploy`: run again when reconciliation says it
had not run; that it never took effect twice is the ledger's figure)."""
KILLS = ("anywhere", "model", "model-twice", "tool", "recovery")
INTERRUPTED = "Operation interrupted"
HUNG = 60  # seconds: a child silent that long (no marker) dumps its stacks and exits (1)


@dataclass
class AgentKillReport:
    intents: str = "tool"
    against: str = "files"
    kills: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    """Kills by kind (`KILLS`) that landed before the child was done."""
    sessions: int = 0
    runs_finished: int = 0
    completed: int = 0
    failed: int = 0
    aborted: int = 0
    restarts: int = 0
    tool_runs: int = 0
    bash_runs: int = 0
    replays: int = 0
    run_twice: int = 0
    never_started_interrupted: int = 0
    """Settled as interrupted, never began, its intent durable while an earlier tool ran."""
    killed_before_the_tool_began: int = 0
    """Settled as interrupted, never began: killed between its own intent and its first
    instruction (counted apart: no intent-before-effect design can tell it from a kill just
    after the tool began)."""
    interrupted: int = 0
    stuck: int = 0
    out_of_order: int = 0
    failures: list[str] = field(default_factory=list)
    never_started: list[str] = field(default_factory=list)
    """Which calls were settled as interrupted although they never began (folder: tool key)."""
    seconds: float = 0.0
    ledger: LedgerFigures | None = None
    """Against the ledger service: what it and the logs hold at the end."""

    @property
    def ok(self) -> bool:
        """No tool ran twice or out of order, no run stuck, every log reduced. Never-started
        tools settled as interrupted are counted, not failed: the cost of `intents="step"`."""
        return not self.failures

    @property
    def rounds(self) -> int:
        return self.sessions

    def summary(self) -> str:
        kinds = ", ".join(f"{kind} {self.kinds.get(kind, 0)}" for kind in KILLS)
        ledger = f"; against the ledger: {self.ledger.summary()}" if self.ledger else ""
        replayed = "idempotent charges" if self.against == "ledger" else "safe reads"
        return (
            f"intents={self.intents}: {self.kills} kills ({kinds}); {self.sessions} sessions, "
            f"{self.runs_finished} runs finished ({self.completed} completed, {self.failed} failed, "
            f"{self.aborted} aborted), {self.restarts} restarts; {self.tool_runs} tool runs, "
            f"{self.replays} {replayed} replayed, {self.interrupted} settled as interrupted; "
            f"{self.run_twice} run twice, {self.never_started_interrupted} never started but settled as "
            f"interrupted (and {self.killed_before_the_tool_began} killed between their own intent and "
            f"their first instruction), {self.stuck} stuck, {self.out_of_order} out of order; "
            f"{self.seconds:.0f} s{ledger}"
        )


# -- the child: the README's loop on a scripted agent -------------------------------------------


def _append(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


_markers = 1  # the fd the child says where it is on
_watched = False  # a forked child: each marker re-arms its hang detector (`Child`)


def _say(line: str) -> None:
    os.write(_markers, (line + "\n").encode())
    if _watched:  # progress: the detector fires after HUNG seconds without any, not of life
        faulthandler.cancel_dump_traceback_later()
        faulthandler.dump_traceback_later(HUNG, exit=True, file=2)


def child_main(
    folder: Path, seed: int, intents: str, killed_in_model: bool = False, ledger: str | None = None
) -> None:
    """The scripted agent. `killed_in_model`: the parent kills it during its first model request,
    which then waits for that kill (so that it lands there even on a loaded machine). `ledger`:
    the URL of the ledger service to run the ledger scenario's tools against."""
    import sessionlog

    rng = random.Random(seed)
    effects = folder / "effects.log"
    names = SCENARIOS["ledger" if ledger else "files"]

    def tool(name: str, seconds: float) -> Any:
        def run(arguments: dict[str, Any]) -> str:
            _append(effects, f"{name} {arguments['key']}")  # from here on the effect may have happened
            _say(f"tool {name}")
            time.sleep(rng.random() * seconds)
            return f"{name} {arguments['key']} done"

        return run

    def began(name: str, key: str) -> None:
        _append(effects, f"{name} {key}")  # from here on the effect may have happened
        _say(f"tool {name}")

    tools = [
        sessionlog.Tool("read", tool("read", 0.010), replay="safe"),
        sessionlog.Tool("write", tool("write", 0.006)),
        sessionlog.Tool("bash", tool("bash", 0.006)),
    ]
    if ledger:
        tools = agent_tools(ledger, began, lambda seconds: time.sleep(rng.random() * seconds))
    path = folder / "session.jsonl"
    if path.exists():
        store = sessionlog.open(path, "jsonl-fsync")
    else:
        store = sessionlog.create(
            path, "jsonl-fsync", provider="p", model="m", cwd="/agent", environment_identity="a"
        )
    session = sessionlog.Session(store, tools=tools, model="scripted", intents=intents)
    _say("ready")

    requests = [killed_in_model]

    def call_model(run: sessionlog.Run) -> tuple[str | None, list[dict[str, Any]]]:
        transcript = list(session.state.transcript)
        last_user = max(index for index, message in enumerate(transcript) if message["role"] == "user")
        step = sum(1 for message in transcript[last_user:] if message["role"] == "assistant")
        prompt = transcript[last_user]["content"].split()[-1]
        _say("model")
        if requests.pop() if requests else False:
            time.sleep(HUNG / 2)  # the request the parent's kill is aimed at
        time.sleep(0.002 + rng.random() * 0.006)  # the request
        if step >= STEPS:
            return f"answer {prompt}", []
        key = f"{prompt}.{run.operation_id[-12:]}.{step}"
        return None, [{"id": f"{name[0]}{key}", "name": name, "arguments": {"key": key}} for name in names]

    while True:  # the README's quick start, once per prompt
        _say("resume")
        run = session.resume()
        _say("resumed")
        if run is None:
            prompts = {m["content"] for m in session.state.transcript if m["role"] == "user"}
            if len(prompts) >= PROMPTS:
                break
            run = session.start(f"prompt {len(prompts) + 1}")
        if run.blocked:
            _say("restart")
            run = run.restart()
        while run.needs_model:
            attempt = run.attempt()
            content, calls = call_model(run)
            attempt.settle(content, calls, usage={"input": 3, "output": 2})
            for call in run.start_tools():
                call.run()
        run.finish()
    store.close()
    _say("done")


# -- the parent ----------------------------------------------------------------------------------


def _effects(folder: Path) -> list[tuple[str, str]]:
    path = folder / "effects.log"
    if not path.exists():
        return []
    return [(line.split()[0], line.split()[1]) for line in path.read_text().splitlines() if line]


def _transactions(data: bytes) -> tuple[dict[str, int], dict[str, int]]:
    """For each tool call id: the transaction (line) of its intent, and of its result."""
    intent_at: dict[str, int] = {}
    result_at: dict[str, int] = {}
    for number, line in enumerate(data.split(b"\n")[1:], 1):
        if not line.strip(b"\0 "):
            continue
        value = json.loads(line)
        for fact in value if isinstance(value, list) else [value]:
            record = fact.get("record") or {}
            message = (fact.get("entry") or {}).get("message") or {}
            if record.get("type") == "toolStarted":
                intent_at[record["toolCallId"]] = number
            elif message.get("role") == "tool":
                result_at[message["tool_call_id"]] = number
    return intent_at, result_at


def _check(folder: Path, report: AgentKillReport, *, final: bool) -> None:
    """What may be judged after every kill: never-replayable tools at most once, each step's
    tools in the model's order, the log reduces."""
    effects = _effects(folder)
    seen: dict[tuple[str, str], int] = {}
    for name, key in effects:
        seen[(name, key)] = seen.get((name, key), 0) + 1
    twice = {f"{name} {key}" for (name, key), count in seen.items() if count > 1 and name not in RUN_AGAIN}
    order = {name: index for names in SCENARIOS.values() for index, name in enumerate(names)}
    late: set[str] = set()
    for position, (name, key) in enumerate(effects):
        if any(order[other] > order[name] and k == key for other, k in effects[:position]):
            late.add(f"{name} {key}")
    try:
        state = reduce_bytes((folder / "session.jsonl").read_bytes(), nul_tail=True)
    except Exception as error:  # a failure to report, whatever it is
        report.failures.append(f"{folder.name}: the log does not reduce: {error!r}")
        return
    if not final:  # twice or late are counted once, when the session is judged at its end
        return
    report.run_twice += len(twice)
    report.out_of_order += len(late)
    for what in sorted(twice):
        report.failures.append(f"{folder.name}: {what} ran twice")
    for what in sorted(late):
        report.failures.append(f"{folder.name}: {what} began after a later tool of its step")
    calls: dict[str, tuple[str, str]] = {}
    earlier: dict[str, list[str]] = {}  # call id -> the ids of the calls before it in its answer
    for message in state.transcript:
        ids = [call["id"] for call in message.get("tool_calls") or []]
        for position, call in enumerate(message.get("tool_calls") or []):
            key = json.loads(call["function"]["arguments"])["key"]
            calls[call["id"]] = (call["function"]["name"], key)
            earlier[call["id"]] = ids[:position]
    data = (folder / "session.jsonl").read_bytes()
    intent_at, result_at = _transactions(data)
    began = set(effects)
    for message in state.transcript:
        if message["role"] == "tool" and str(message["content"]).startswith(INTERRUPTED):
            report.interrupted += 1
            call_id = message["tool_call_id"]
            if calls[call_id] in began:
                continue
            # Its intent was committed after every earlier call of its step had its result and was
            # the last line written before its interrupted result: the kill landed between that
            # intent and the tool's first instruction (no design that
            # commits the intent before the effect can tell that from a kill just after it).
            # Else its intent was durable while an earlier tool ran: the batched design's cost.
            # Strictly: nothing was written between its intent and its interrupted result.
            settled_next = result_at.get(call_id) == intent_at[call_id] + 1
            if settled_next and all(
                result_at.get(other, 1 << 62) < intent_at[call_id] for other in earlier[call_id]
            ):
                report.killed_before_the_tool_began += 1
            else:
                report.never_started_interrupted += 1
                report.never_started.append(f"{folder.name}: {' '.join(calls[call_id])}")
    report.runs_finished += data.count(b'"type":"operationFinished"')
    report.completed += data.count(b'"outcome":"completed"')
    report.failed += data.count(b'"outcome":"failed"')
    report.aborted += data.count(b'"outcome":"aborted"')
    report.tool_runs += len(effects)
    report.bash_runs += sum(1 for name, _ in effects if name == "bash")
    report.replays += sum(count - 1 for (name, _), count in seen.items() if name in ("read", "charge"))
    prompts = {message["content"] for message in state.transcript if message["role"] == "user"}
    if not state.is_idle or len(prompts) != PROMPTS:
        report.stuck += 1
        report.failures.append(f"{folder.name}: the session did not end idle with every prompt answered")


class Child:
    """A scripted agent, forked from this process (no interpreter start per child: the
    harness spends its time on kills, not imports), and the markers it prints."""

    def __init__(
        self,
        folder: Path,
        rng: random.Random,
        intents: str,
        *,
        killed_in_model: bool = False,
        ledger: str | None = None,
    ) -> None:
        seed = rng.getrandbits(32)
        self.names = SCENARIOS["ledger" if ledger else "files"]
        """The tools of its steps."""
        self.errors = folder / "child.err"
        read, write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child, measured by what it leaves behind
            status = 1
            try:
                global _markers, _watched
                os.close(read)
                _markers = write
                os.dup2(os.open(self.errors, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 2)
                # a child that hangs says where, and ends: a failure to report, never a hung harness
                # (re-armed by every marker, so a slow child that keeps going is not cut short)
                faulthandler.dump_traceback_later(HUNG, exit=True, file=2)
                _watched = True
                child_main(folder, seed, intents, killed_in_model, *([ledger] if ledger else []))
                status = 0
            except BaseException:
                import traceback

                os.write(2, traceback.format_exc().encode())
            finally:
                os._exit(status)
        os.close(write)
        self.pid = pid
        self.output = os.fdopen(read, "rb")
        self.lines: list[str] = []
        self.hung = False
        if self.wait_for("ready") is None:
            _, code, error = self.end()
            raise RuntimeError(f"the scripted agent did not start (exit {code}): {error[-400:]}")

    def wait_for(self, *markers: str) -> str | None:
        """Read markers until one of `markers` (returned) or the end of its output (None). A
        child silent for twice `HUNG` seconds is killed (its traceback is in `errors`)."""
        while True:
            ready, _, _ = select.select([self.output], [], [], 2 * HUNG)
            if not ready:
                self.hung = True
                self.kill()
                return None
            raw = self.output.readline()
            if not raw:
                return None
            line = raw.decode().strip()
            self.lines.append(line)
            if line in markers:
                return line
            if line == "done":
                return None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def end(self) -> tuple[bool, int, str]:
        """Whether it finished (`done`), its exit status, the tail of its stderr."""
        self.lines.extend(line.decode().strip() for line in self.output.read().splitlines())
        self.output.close()
        _, status = os.waitpid(self.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        error = self.errors.read_text(errors="replace")[-800:] if self.errors.exists() else ""
        return "done" in self.lines, code, error


def _aim(child: Child, kind: str, rng: random.Random, span: float, first: bool) -> bool:
    """Wait for the moment `kind` aims at and kill there; False if the child was done first."""
    if kind == "anywhere":
        time.sleep(rng.uniform(0, span))
    elif kind in ("model", "model-twice"):
        if child.wait_for("model") is None:
            return False
        time.sleep(rng.uniform(0, 0.004))  # the child waits in that request for this kill
    elif kind == "tool":
        name = rng.choice(child.names)
        if child.wait_for(f"tool {name}") is None:
            return False
        time.sleep(rng.uniform(0, 0.004))
    elif kind == "recovery":
        if first:  # a tool killed first, so that the next child's recovery has work to do
            if child.wait_for(f"tool {rng.choice(child.names)}") is None:
                return False
        else:
            if child.wait_for("resume") is None:
                return False
            time.sleep(rng.uniform(0, 0.012))
    child.kill()
    return True


def _calibrate(folder: Path, rng: random.Random, intents: str, ledger: str | None = None) -> float:
    """How long a whole child takes here, from ready to done: `anywhere` kills aim within it.
    Against the ledger its session is kept: the ledger's effects are counted against it too."""
    folder.mkdir()
    started = time.monotonic()
    Child(folder, rng, intents, ledger=ledger).end()
    if ledger is None:
        shutil.rmtree(folder, ignore_errors=True)
    return time.monotonic() - started


def run_agent_kills(
    kills: int = 200,
    *,
    seed: int = 0,
    directory: str | os.PathLike[str] | None = None,
    intents: str = "tool",
    kinds: Sequence[str] = KILLS,
    against: str = "files",
    cannot_tell: float = 0.2,
) -> AgentKillReport:
    """SIGKILL `kills` children running the scripted agent (see the module docstring), each
    kill of a kind drawn from `kinds`, under the design `intents` (`tool` or `step`), against
    an effects file (`files`) or the ledger service (`ledger`, whose status queries answer 503
    for a share `cannot_tell` of them)."""
    unknown = sorted(set(kinds) - set(KILLS))
    if unknown or not kinds:
        raise ValueError(f"kill kinds are some of {', '.join(KILLS)}, not {unknown or 'none'}")
    if against not in SCENARIOS:
        raise ValueError(f"against is one of {', '.join(SCENARIOS)}, not {against!r}")
    report = AgentKillReport(intents=intents, against=against)
    rng = random.Random(f"agent-kills:{seed}:{intents}:{against}")
    owned = directory is None
    root = Path(tempfile.mkdtemp(prefix="sessionlog-agent-")) if directory is None else Path(directory)
    started = time.monotonic()
    service = None
    if against == "ledger":
        (root / "ledger").mkdir(parents=True)
        service = Service(root / "ledger", unknown=cannot_tell, seed=seed)
    ledger = service.url if service else None
    try:
        span = _calibrate(root / "calibration", rng, intents, ledger) if "anywhere" in kinds else 0.0
        folder = root / "session-0"
        folder.mkdir(parents=True)
        plan: list[tuple[str, bool]] = []  # (kind, first of a pair) still to aim in this session
        failed_in_a_row = 0
        while report.kills < kills:
            if not plan:
                kind = rng.choice(list(kinds))
                paired = kind in ("model-twice", "recovery")
                plan = [(kind, True), (kind, False)] if paired else [(kind, True)]
            kind, first = plan.pop(0)
            child = Child(
                folder, rng, intents, killed_in_model=kind in ("model", "model-twice"), ledger=ledger
            )
            landed = _aim(child, kind, rng, span, first)
            finished, code, error = child.end()
            if child.hung or code not in (0, -signal.SIGKILL) or (code == 0 and not finished):
                report.stuck += 1
                what = "hung" if child.hung else f"failed (exit {code})"
                report.failures.append(f"{folder.name}: a child {what}: {error}")
                failed_in_a_row += 1
                if failed_in_a_row >= 3:  # it cannot go on: that is the finding, not a reason to loop
                    report.failures.append(f"{folder.name}: 3 children in a row failed; the run stops")
                    break
                continue
            failed_in_a_row = 0
            report.restarts += child.lines.count("restart")
            if landed and not finished:
                report.kills += 1
                report.kinds[kind] = report.kinds.get(kind, 0) + 1
            else:
                plan = []
            _check(folder, report, final=False)
            if finished:
                _finish_session(folder, report)
                report.sessions += 1
                folder = root / f"session-{report.sessions}"
                folder.mkdir()
                plan = []
        if (folder / "session.jsonl").exists():  # the last session: run it to its end, unkilled
            child = Child(folder, rng, intents, ledger=ledger)
            finished, code, error = child.end()
            report.restarts += child.lines.count("restart")
            if code != 0:
                report.stuck += 1
                report.failures.append(f"{folder.name}: a child failed (exit {code}): {error}")
            _finish_session(folder, report)
            report.sessions += 1
        if service is not None:
            service.stop()
            logs = sorted(root.glob("*/session.jsonl"))
            report.ledger = ledger_figures(service.db, logs)
            report.failures += report.ledger.failures
    finally:
        if service is not None:
            service.stop()
        report.seconds = time.monotonic() - started
        if owned:
            shutil.rmtree(root, ignore_errors=True)
    return report


def _finish_session(folder: Path, report: AgentKillReport) -> None:
    _check(folder, report, final=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sessionlog.testing.agent_kills", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="kill agents and check what they did")
    run.add_argument("--kills", type=int, default=200, help="kills per design")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--intents", choices=("tool", "step", "both"), default="both")
    run.add_argument("--against", choices=tuple(SCENARIOS), default="files", help="the tools' counterpart")
    args = parser.parse_args(argv)
    ok = True
    for intents in ("tool", "step") if args.intents == "both" else (args.intents,):
        report = run_agent_kills(args.kills, seed=args.seed, intents=intents, against=args.against)
        print(report.summary())
        for failure in report.failures[:10]:
            print("  ", failure)
        ok = ok and report.ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
