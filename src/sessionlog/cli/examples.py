"""What each command's `--help` shows below its options: an example or two, as a user types them
(docs/cli.md is checked against these, and each runs in a sandbox of such files, by
tests/test_cli_help.py)."""

from __future__ import annotations

import argparse
from typing import Any

EXAMPLES = {
    "backends": ["sessionlog backends", "sessionlog backends --json"],
    "inspect": [
        "sessionlog inspect session.jsonl",
        "sessionlog inspect sqlite:///sessions.db#SESSION_ID --json",
    ],
    "verify": ["sessionlog verify session.jsonl", "sessionlog verify sessions.db  # a SQLite database"],
    "repair": ["sessionlog repair session.jsonl --dry-run", "sessionlog repair session.jsonl --quarantine"],
    "reduce": ["sessionlog reduce session.jsonl | jq .state.transcript"],
    "plan": ["sessionlog plan session.jsonl", "sessionlog plan session.jsonl --current current.json"],
    "recover": ["sessionlog recover session.jsonl", "sessionlog recover sessions/#SESSION_ID"],
    "abort": ["sessionlog abort session.jsonl", "sessionlog abort sqlite:///sessions.db#SESSION_ID --json"],
    "bench": ["sessionlog bench", "sessionlog bench --dir /mnt/data --full"],
    "convert": [
        "sessionlog convert old.jsonl new.jsonl --to jsonl-fsync",
        "sessionlog convert old.jsonl sqlite:///sessions.db  # into a repository",
    ],
    "ls": [
        "sessionlog ls sessions/",
        "sessionlog ls sqlite:///sessions.db --status needs-recovery",
        "sessionlog ls postgresql://agent@db/agent --label support --json",
    ],
    "export": ["sessionlog export sqlite:///sessions.db#SESSION_ID -o exported.jsonl"],
    "import": ["sessionlog import sqlite:///sessions.db other.jsonl --label imported"],
    "fork": ["sessionlog fork sqlite:///sessions.db#SESSION_ID --at 2"],
    "rm": ["sessionlog rm sqlite:///sessions.db#SESSION_ID"],
    "migrate": ["sessionlog migrate postgresql://admin@db/agent"],
}


def explain(commands: Any) -> None:
    """Give every subcommand its description (its one-line help, where it has none) and its
    examples, kept as written."""
    helps = {action.dest: action.help for action in commands._choices_actions}
    for name, sub in commands.choices.items():
        sub.description = sub.description or helps.get(name)
        sub.formatter_class = argparse.RawDescriptionHelpFormatter
        if name in EXAMPLES:
            sub.epilog = "examples:\n" + "\n".join(f"  {line}" for line in EXAMPLES[name])
