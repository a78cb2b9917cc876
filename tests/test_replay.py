"""tests/replay.py: under CI=true Hypothesis replays the same cases, and a failed test names the
command that reruns it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

PROBE = """
from hypothesis import given, settings, strategies as st

SEEN = []

def test_profile():
    print("derandomize", settings.default.derandomize, "database", settings.default.database)

@given(st.integers())
def test_draws(number):
    SEEN.append(number)

def test_last():
    print("drawn", SEEN)

def test_fails():
    assert 1 == 2, "on purpose"
"""


def _pytest(
    tmp_path: Path, source: str, *options: str, drop: tuple[str, ...] = (), **env: str
) -> subprocess.CompletedProcess[str]:
    """pytest with this plugin on `source` as test_probe.py, in a process of its own: the variables
    in `drop` unset, those in `env` set."""
    (tmp_path / "test_probe.py").write_text(source)
    environ = {key: value for key, value in os.environ.items() if key not in drop} | env
    environ["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "replay", "-p", "no:cacheprovider", "-q", *options,
         str(tmp_path / "test_probe.py")],
        cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _run(tmp_path: Path, ci: str | None) -> str:
    done = _pytest(
        tmp_path, PROBE, "-s", "-n", "0", "-p", "no:randomly", drop=("CI", "HYPOTHESIS_PROFILE"),
        **({} if ci is None else {"CI": ci}),
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr  # test_fails, and only it
    assert "1 failed, 3 passed" in done.stdout, done.stdout
    return done.stdout


def _drawn(output: str) -> str:
    found = re.search(r"drawn \[[^\]]*\]", output)
    assert found, output
    return found.group()


def test_under_ci_hypothesis_draws_the_same_cases_every_run(tmp_path: Path) -> None:
    first, second = _run(tmp_path, "true"), _run(tmp_path, "true")
    assert "derandomize True database None" in first, first
    assert _drawn(first) == _drawn(second)


def test_outside_ci_hypothesis_searches_afresh(tmp_path: Path) -> None:
    first, second = _run(tmp_path, None), _run(tmp_path, None)
    assert "derandomize False" in first, first
    assert _drawn(first) != _drawn(second)  # 100 draws each: the same twice is astronomically unlikely


def test_a_failed_test_names_the_command_that_reruns_it(tmp_path: Path) -> None:
    output = _run(tmp_path, "true")
    section = output[output.index("rerun") :]
    hash_seed = os.environ["PYTHONHASHSEED"]  # set by the plugin for the processes it starts
    command = f"PYTHONHASHSEED={hash_seed} CI=true python -m pytest -n 0 -m '' 'test_probe.py::test_fails'"
    assert command in section, section
    assert "seeds:" in section and "Hypothesis profile 'ci'" in section, section


ADDRESSED = """
import pytest

class Opaque:  # the default repr: '<test_probe.Opaque object at 0x7f...>'
    pass

@pytest.mark.parametrize("value", [1, Opaque()], ids=lambda value: repr(value)[:40])
def test_value(value):
    pass

@pytest.mark.parametrize("value", [Opaque()], ids=lambda value: hex(id(value)))
def test_identity(value):
    pass
"""


def test_a_test_id_holding_a_memory_address_is_refused_at_collection(tmp_path: Path) -> None:
    """Each process collects its own ids: an id made of an object's default repr holds its address,
    which differs between the two xdist workers (a whole default run ended in 'Different tests were
    collected between gw1 and gw0' during a flake hunt) and between a run and its rerun."""
    done = _pytest(tmp_path, ADDRESSED, "-n", "0")
    output = done.stdout + done.stderr
    assert done.returncode == 4, output  # pytest's usage error: nothing ran
    assert "test_probe.py::test_value[<test_probe.Opaque object at 0x" in output, output
    assert "a memory address" in output, output
    assert re.search(r"test_probe.py::test_identity\[0x[0-9a-f]{8,}\]", output), output
    assert "test_probe.py::test_value[1]" not in output, output  # only the ids at fault are named


UNORDERED = """
import pytest

@pytest.mark.parametrize("word", {f"word{number}" for number in range(20)})
def test_word(word):
    pass
"""


def test_the_workers_collect_a_set_of_strings_in_one_order(tmp_path: Path) -> None:
    """A set's order follows the hash seed, which Python draws per process unless PYTHONHASHSEED is
    set: each xdist worker would collect the 20 tests in another order, and the run would end at
    collection. The plugin gives the workers one seed."""
    done = _pytest(tmp_path, UNORDERED, "-n", "2", drop=("PYTHONHASHSEED",))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "20 passed" in done.stdout, done.stdout
