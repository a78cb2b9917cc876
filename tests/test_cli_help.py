"""The command line explains itself and never prints a traceback.

Every command's `--help` has a description and examples, the examples parse as the command line
reads them, and docs/cli.md shows every one. Every command (bench aside: it has its own tests)
is run on hostile inputs: missing, empty, binary, NUL-filled, invalid UTF-8, a directory, a
symlink, a FIFO, a corrupt SQLite file, malformed locations, a PostgreSQL URL with a password
that cannot be reached, and the contract's own invalid fixtures where they are at hand. Each
ends with a status the CLI documents (0-4), one message, no traceback and no "unexpected"
(the CLI's words for a defect it caught), and never the password."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sessionlog.cli import build_parser
from sessionlog.cli.examples import EXAMPLES
from sessionlog.core.ids import new_id

ROOT = Path(__file__).resolve().parents[1]
SECRET = "s3cr3t-hostile-pw"


def _subcommands() -> dict[str, Any]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(getattr(a, "choices", None), dict))
    return dict(action.choices)


def test_every_command_has_a_description_and_examples(cli: Any) -> None:
    commands = _subcommands()
    assert set(commands) == set(EXAMPLES), set(commands) ^ set(EXAMPLES)
    for name in commands:
        if name == "bench":
            continue  # its own parser: `sessionlog bench --help`
        run = cli(name, "--help")
        assert run.code == 0, name
        assert commands[name].description, f"{name} has no description"
        assert commands[name].description in " ".join(run.out.split()) or name == "abort", name
        assert "examples:" in run.out, name
        for example in EXAMPLES[name]:
            assert example in run.out, (name, example)


def test_the_examples_parse_and_docs_show_each_one() -> None:
    page = (ROOT / "docs" / "cli.md").read_text()
    parser = build_parser()
    for name, examples in EXAMPLES.items():
        for example in examples:
            assert example in page, f"docs/cli.md lacks the example {example!r}"
            command = example.split("  #")[0].split(" | ")[0]  # a comment, a pipe: not the command's
            argv = shlex.split(command.replace("SESSION_ID", new_id()))[1:]
            if name != "bench":
                parser.parse_args(argv)  # a usage error would exit 2 here


def _sandbox(here: Path) -> dict[str, str]:
    """The files the examples name, made as a user would have them; the ids to put in."""
    import json

    import sessionlog
    from sessionlog.core import facts

    with sessionlog.create(here / "session.jsonl", backend="jsonl", provider="p", model="m") as store:
        store.commit(facts.accept_prompt("hello"))
        agent = sessionlog.Session(store, tools=[], model="m")
        (here / "current.json").write_text(json.dumps(agent.current()))
    for name in ("old.jsonl", "other.jsonl"):
        with sessionlog.create(here / name, backend="jsonl", provider="p", model="m") as store:
            store.commit(facts.accept_prompt(f"from {name}"))
    ids = {}
    for location in (f"sqlite:///{here}/sessions.db", str(here / "sessions")):
        repo = sessionlog.repository(location)
        with repo.create(provider="p", model="m", labels=["support"]) as store:
            store.commit(facts.accept_prompt("hi"))
            ids[location] = store.load().session_id
        repo.close()
    return {"sqlite": ids[f"sqlite:///{here}/sessions.db"], "directory": ids[str(here / "sessions")]}


def test_the_examples_run_in_a_sandbox(tmp_path: Path) -> None:
    """Each example of every command, as docs/cli.md shows it, run by bash in a folder holding
    the files it names: it succeeds (exit 0) and prints no traceback."""
    ids = _sandbox(tmp_path)
    ran = 0
    for name, examples in EXAMPLES.items():
        for example in examples:
            if name == "bench" or "postgresql://" in example:
                continue  # minutes, or a server: tests/test_bench*.py and the PostgreSQL tests
            if "| jq" in example and shutil.which("jq") is None:
                example = example.split(" | ")[0]
            command = example.replace("sessions/#SESSION_ID", f"sessions/#{ids['directory']}")
            command = command.replace("SESSION_ID", ids["sqlite"])
            done = subprocess.run(
                ["bash", "-c", f"{shlex.quote(sys.executable)} -m sessionlog.cli {command.split(' ', 1)[1]}"],
                cwd=tmp_path, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            said = done.stdout + done.stderr
            failed = f"{example!r} exited {done.returncode}: {said[-600:]}"
            assert done.returncode == 0, failed
            assert "Traceback" not in said, f"{example!r}: {said[-800:]}"
            ran += 1
    assert ran >= 20
    assert (tmp_path / "exported.jsonl").stat().st_size > 0 and (tmp_path / "new.jsonl").is_file()


def _hostile(tmp_path: Path) -> dict[str, str]:
    """name -> a location or file as a careless or hostile user would pass it."""
    made = tmp_path / "made"
    made.mkdir()
    (made / "empty.jsonl").write_bytes(b"")
    (made / "binary.jsonl").write_bytes(os.urandom(4096))
    (made / "nul.jsonl").write_bytes(b"\0" * 1024)
    (made / "utf8.jsonl").write_bytes(b'{"a":"\xff\xfe"}\n')
    (made / "array.jsonl").write_bytes(b"[]\n[]\n")
    (made / "corrupt.db").write_bytes(b"SQLite format 3\x00" + os.urandom(2000))
    (made / "dir").mkdir()
    os.symlink(made / "array.jsonl", made / "link.jsonl")
    os.mkfifo(made / "fifo")
    inputs = {path.name: str(path) for path in made.iterdir()}
    inputs |= {
        "missing": str(made / "no-such.jsonl"),
        "hash": f"{made}/array.jsonl#not-an-id",
        "dir-session": f"{made / 'dir'}#{new_id()}",
        "sqlite-missing": f"sqlite:///{made}/none.db#{new_id()}",
        "sqlite-host": f"sqlite://host/x.db#{new_id()}",
        "file-url": f"file:///{made}/dir#{new_id()}",
        "postgres": f"postgresql://u:{SECRET}@127.0.0.1:1/x?connect_timeout=1#{new_id()}",
        "nonsense-url": "nope://x",
        "newline": f"{made}/a\nb.jsonl",
    }
    contract = Path(os.environ.get("SESSIONLOG_CONTRACT", ROOT.parent / "shared" / "contract"))
    for fixture in sorted(contract.glob("**/invalid*/**/*.jsonl"))[:10]:
        inputs[f"contract:{fixture.name}"] = str(fixture)
    return inputs


def _argvs(name: str, value: str, tmp_path: Path) -> list[list[str]]:
    location = value.rpartition("#")[0] if "#" in value else value
    return {
        "backends": [[name], [name, "--json"]] if value.endswith("empty.jsonl") else [],
        "inspect": [[name, value], [name, value, "--json"]],
        "verify": [[name, value]],
        "repair": [[name, value, "--dry-run"]],
        "reduce": [[name, value]],
        "plan": [[name, value]],
        "recover": [[name, value]],
        "abort": [[name, value]],
        "convert": [[name, value, str(tmp_path / "out" / f"{new_id()}.jsonl")]],
        "ls": [[name, location]],
        "export": [[name, value]],
        "import": [[name, str(tmp_path / "repo"), value], [name, location, str(tmp_path / "none.jsonl")]],
        "fork": [[name, value, "--at", "1"]],
        "rm": [[name, value]],
        "migrate": [[name, location]],
    }.get(name, [])


@pytest.mark.parametrize("name", sorted(set(EXAMPLES) - {"bench"}))
def test_no_command_prints_a_traceback_on_hostile_input(cli: Any, tmp_path: Path, name: str) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "repo").mkdir()
    ran = 0
    for label, value in _hostile(tmp_path).items():
        for argv in _argvs(name, value, tmp_path):
            run = cli(*argv)
            ran += 1
            said = run.out + run.err
            where = f"{' '.join(argv)!r} ({label})"
            assert run.code in (0, 1, 2, 3, 4), f"{where} exited {run.code}: {said[-500:]}"
            assert "Traceback" not in said and "unexpected" not in said, f"{where}: {said[-800:]}"
            assert SECRET not in said, f"{where} echoed the password"
            if run.code:
                assert run.err.strip(), f"{where} failed without a word"
    assert ran >= (2 if name == "backends" else 10)


def test_python_dash_m_sessionlog_is_the_command(tmp_path: Path) -> None:
    """Where the `sessionlog` script is not on PATH (a venv not activated), `python -m sessionlog`
    is the same command: found by a helper running the bench as a new user would ('No module
    named sessionlog.__main__')."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "sessionlog", "verify", str(tmp_path / "missing.jsonl")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "missing.jsonl" in done.stderr and "Traceback" not in done.stderr
    shown = subprocess.run([sys.executable, "-m", "sessionlog", "--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and "usage: sessionlog" in shown.stdout, shown.stdout[:300]
