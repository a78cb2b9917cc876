"""kill -9 of an agent loop written on the runtime (`sessionlog.Session`), resumed again and again.

A child process runs a scripted agent: prompts 1..N, each a run of a few steps in which a fake
model asks for a safe `read` and then a `bash` (never replayable), then answers. Every tool
execution is appended to an effects log (the effect itself), every accepted prompt to an ack
log once `start` returned. The parent SIGKILLs the child at a random moment after it is ready,
starts the next one (which resumes the session and goes on), and after every kill checks:

* no `bash` ran twice (each call id at most once in the effects log);
* the tools of a step ran in the model's order (no `read` of a step after that step's `bash`:
  a read replayed after a later bash would return the bash's effect);
* no accepted prompt is missing from the session;
* the log reduces; at the end every run is finished, `completed` or `aborted` (the documented
  terminal state when recovery is blocked: the answer of attempt 2 lost as well).

    python -m sessionlog.testing.agent_kills run --kills 200
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.loading import reduce_bytes

PROMPTS = 3
STEPS = 3  # tool steps per run; then the answer


@dataclass
class AgentKillReport:
    kills: int = 0
    rounds: int = 0
    runs_finished: int = 0
    aborted: int = 0
    bash_runs: int = 0
    replays: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures


# -- the child: a scripted agent ----------------------------------------------------------------


def _append(path: Path, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def child_main(folder: Path, seed: int) -> None:
    import sessionlog

    rng = random.Random(seed)
    effects, acks = folder / "effects.log", folder / "acks.log"

    def pause() -> None:
        time.sleep(rng.random() * 0.004)

    # Each tool logs itself as it begins: from there on its effect may have happened.
    def read(arguments: dict[str, Any]) -> str:
        _append(effects, f"read {arguments['key']}")
        time.sleep(rng.random() * 0.012)  # a slow read: kills land in it, and recovery replays it
        return f"read {arguments['key']}"

    def bash(arguments: dict[str, Any]) -> str:
        _append(effects, f"bash {arguments['key']}")
        pause()
        return f"ran {arguments['key']}"

    tools = [sessionlog.Tool("read", read, replay="safe"), sessionlog.Tool("bash", bash)]
    path = folder / "session.jsonl"
    if path.exists():
        store = sessionlog.open(path, "jsonl-fsync")
    else:
        store = sessionlog.create(
            path, "jsonl-fsync", provider="p", model="m", cwd="/agent", environment_identity="a"
        )
    session = sessionlog.Session(store, tools=tools, model="scripted")
    sys.stdout.write("ready\n")
    sys.stdout.flush()

    def drive(run: sessionlog.Run) -> None:
        while run.needs_model:
            attempt = run.attempt()
            state = session.state
            prompt = sum(1 for message in state.transcript if message["role"] == "user")
            step = sum(1 for tool in state.tool_calls if tool["toolName"] == "bash")
            pause()  # the model request
            if step < STEPS:
                key = f"{prompt}.{step}"
                calls = [
                    {"id": f"r{key}", "name": "read", "arguments": {"key": key}},
                    {"id": f"b{key}", "name": "bash", "arguments": {"key": key}},
                ]
                attempt.settle(None, calls, usage={"input": 3, "output": 2})
            else:
                attempt.settle(f"answer {prompt}", usage={"input": 3, "output": 2})
            for call in run.start_tools():
                call.run()
        if run.blocked is not None:
            run.abort()
        else:
            run.finish()

    run = session.resume()
    if run is not None:
        drive(run)
    while True:
        accepted = sum(1 for message in session.state.transcript if message["role"] == "user")
        if accepted >= PROMPTS:
            break
        run = session.start(f"prompt {accepted + 1}")
        _append(acks, f"accepted {accepted + 1}")
        drive(run)
    store.close()
    sys.stdout.write("done\n")
    sys.stdout.flush()


# -- the parent ----------------------------------------------------------------------------------


def _check(folder: Path, report: AgentKillReport, *, final: bool) -> None:
    effects = (folder / "effects.log").read_text().split() if (folder / "effects.log").exists() else []
    lines = [f"{kind} {key}" for kind, key in zip(effects[::2], effects[1::2], strict=True)]
    bashes = [line.split()[1] for line in lines if line.startswith("bash")]
    duplicates = {key for key in bashes if bashes.count(key) > 1}
    if duplicates:
        report.failures.append(f"{folder.name}: bash ran twice: {sorted(duplicates)}")
    for index, line in enumerate(lines):
        kind, key = line.split()
        if kind == "read" and f"bash {key}" in lines[:index]:
            report.failures.append(f"{folder.name}: read {key} ran after bash {key}")
    try:
        state = reduce_bytes((folder / "session.jsonl").read_bytes(), nul_tail=True)
    except Exception as error:  # a failure to report, whatever it is
        report.failures.append(f"{folder.name}: the log does not reduce: {error!r}")
        return
    acked = (folder / "acks.log").read_text().split("\n") if (folder / "acks.log").exists() else []
    prompts = {message["content"] for message in state.transcript if message["role"] == "user"}
    for line in filter(None, acked):
        if f"prompt {line.split()[1]}" not in prompts:
            report.failures.append(f"{folder.name}: {line} is not in the session")
    if final:
        data = (folder / "session.jsonl").read_bytes()
        report.runs_finished += data.count(b'"type":"operationFinished"')
        report.aborted += data.count(b'"outcome":"aborted"')
        if data.count(b'"type":"operationFinished"') != data.count(b'"type":"runStarted"'):
            report.failures.append(f"{folder.name}: a run was never finished")
        report.bash_runs += len(bashes)
        report.replays += len(lines) - len(set(lines))
        if not state.is_idle or len(prompts) != PROMPTS:
            report.failures.append(f"{folder.name}: the session did not end idle with every prompt")


def _spawn(folder: Path, rng: random.Random) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sessionlog.testing.agent_kills",
            "child",
            str(folder),
            str(rng.getrandbits(32)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stderr is not None
    if child.stdout.readline().strip() != b"ready":
        raise RuntimeError(f"the scripted agent did not start: {child.stderr.read().decode()[-400:]}")
    return child


def _calibrate(folder: Path, rng: random.Random) -> float:
    """How long a whole child takes here, from ready to done: kills are aimed within it."""
    folder.mkdir()
    child = _spawn(folder, rng)
    started = time.monotonic()
    child.communicate()
    shutil.rmtree(folder, ignore_errors=True)
    return time.monotonic() - started


def run_agent_kills(
    kills: int = 200, *, seed: int = 0, directory: str | os.PathLike[str] | None = None
) -> AgentKillReport:
    """SIGKILL `kills` children running the scripted agent (see the module docstring)."""
    report = AgentKillReport()
    rng = random.Random(f"agent-kills:{seed}")
    owned = directory is None
    root = Path(tempfile.mkdtemp(prefix="sessionlog-agent-")) if directory is None else Path(directory)
    started = time.monotonic()
    try:
        span = _calibrate(root / "calibration", rng)
        folder = root / "round-0"
        folder.mkdir(parents=True)
        while report.kills < kills:
            child = _spawn(folder, rng)
            time.sleep(rng.uniform(0, span))
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGKILL)
            rest, error = child.communicate()
            finished = b"done" in rest
            if child.returncode not in (0, -signal.SIGKILL):
                report.failures.append(f"a child failed (exit {child.returncode}): {error.decode()[-600:]}")
                break
            report.kills += not finished
            _check(folder, report, final=finished)
            if finished:  # every prompt done: the next kills go to a new session
                report.rounds += 1
                folder = root / f"round-{report.rounds}"
                folder.mkdir()
    finally:
        report.seconds = time.monotonic() - started
        if owned:
            shutil.rmtree(root, ignore_errors=True)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sessionlog.testing.agent_kills", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    child = commands.add_parser("child", help="run the scripted agent (used by the harness)")
    child.add_argument("folder", type=Path)
    child.add_argument("seed", type=int)
    run = commands.add_parser("run", help="kill agents and check what they did")
    run.add_argument("--kills", type=int, default=200)
    run.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "child":
        child_main(args.folder, args.seed)
        return 0
    report = run_agent_kills(args.kills, seed=args.seed)
    print(
        f"{report.kills} kills, {report.rounds} sessions completed, {report.runs_finished} runs finished "
        f"({report.aborted} aborted), {report.bash_runs} bash runs, "
        f"{report.replays} safe reads replayed, {report.seconds:.1f}s: {'ok' if report.ok else 'FAILED'}"
    )
    for failure in report.failures[:10]:
        print("  ", failure)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
