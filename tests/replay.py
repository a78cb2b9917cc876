"""Randomness that replays: a red CI run's cases are the cases its rerun runs (a pytest plugin,
loaded by conftest.py).

Every process collects the same test ids. The xdist workers get one PYTHONHASHSEED (0 under
CI=true, else one drawn for the run, named by the rerun command), so that a set's order is the same
in both; and an id holding a memory address (an object's default repr, `hex(id(x))`, a Mock) is
refused at collection: it differs from process to process, and no rerun command can name it.

Under CI=true (or HYPOTHESIS_PROFILE=ci) Hypothesis runs derandomized, with no example database.
The harnesses' seeds are fixed in the tests themselves (seed 0 unless a test names another). A
failed test says how to run it again: one command, and the seeds it used."""

from __future__ import annotations

import os
import random
import re
from typing import Any

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")
HYPOTHESIS_PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if CI else "default")
settings.load_profile(HYPOTHESIS_PROFILE)
# The hash seed this process started with (a worker: the one its controller set below), and the
# one the workers this process starts will have.
STARTED_HASH_SEED = os.environ.get("PYTHONHASHSEED")
os.environ.setdefault("PYTHONHASHSEED", "0" if CI else str(random.randrange(1 << 32)))
# An address: a default repr ('<x.Y object at 0x7f...>', cut anywhere after ' at 0x'), a long hex
# number (`hex(id(x))`), a Mock's id. (Text such as 'the byte at 0x10' is refused too: its own
# ids say it plainly.)
ADDRESS = re.compile(r" at 0x|0x[0-9a-fA-F]{8,}|\bid='\d+'")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse a test id that holds a memory address: it differs from process to process, so the
    two xdist workers' collections disagree (a whole run errors, by chance) and no rerun finds it."""
    addressed = [item.nodeid for item in items if ADDRESS.search(item.nodeid)]
    if addressed:
        raise pytest.UsageError(
            f"{len(addressed)} test id(s) hold a memory address, which differs between processes "
            "(give the parametrization ids of its own): " + ", ".join(addressed[:5])
        )


def rerun_command(item: pytest.Item) -> str:
    """One command that reruns this test alone, in this process, with the same seeds."""
    hash_seed = f"PYTHONHASHSEED={STARTED_HASH_SEED} " if STARTED_HASH_SEED is not None else ""
    return f"{hash_seed}CI=true python -m pytest -n 0 -m '' '{item.nodeid}'"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test says how to run it again: the command, and which seeds it used."""
    report = yield
    if report.failed:
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec is not None else {}
        seeds = [f"{name}={value}" for name, value in params.items() if "seed" in name]
        report.sections.append((
            "rerun",
            f"{rerun_command(item)}\n"
            f"seeds: {', '.join(seeds) or 'the fixed ones in its source (a harness: seed 0 unless named)'}; "
            f"Hypothesis profile {HYPOTHESIS_PROFILE!r}. Where timing decides the interleaving "
            "(kills, the nemesis), the rerun replays the seeds, not always the interleaving: the "
            "history the checker judged is in the failure above.",
        ))  # fmt: skip
    return report
