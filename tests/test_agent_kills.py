"""Issue 23, item 5: the crash harness of the agent loop (`sessionlog.testing.agent_kills`).

The README's loop on a scripted agent of 3-tool steps (a safe read, a write, a bash), killed at
every point (anywhere, during a model request, twice during one, during a tool, during recovery
itself) and run again; for each design, what it counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import budgets
from sessionlog.testing.agent_kills import KILLS, AgentKillReport, run_agent_kills


def _show(report: AgentKillReport) -> None:
    print("\n" + report.summary())


def _sound(report: AgentKillReport) -> None:
    """What both designs promise: no tool twice, none out of order, no run stuck."""
    assert report.failures == []
    assert report.run_twice == 0 and report.out_of_order == 0 and report.stuck == 0
    assert report.sessions > 0 and report.completed >= report.sessions  # every prompt answered


@pytest.mark.parametrize("kills", budgets(5, 200))
def test_the_default_design_never_runs_a_tool_twice_nor_settles_a_never_started_one(
    kills: int, tmp_path: Path
) -> None:
    report = run_agent_kills(kills, directory=tmp_path, intents="tool")
    _show(report)
    _sound(report)
    assert report.kills == kills
    assert report.never_started_interrupted == 0  # no intent is durable while an earlier tool runs
    if kills >= 100:
        assert set(report.kinds) == set(KILLS) and report.restarts > 0 and report.replays > 0


@pytest.mark.parametrize("kills", budgets(4, 200))
def test_the_step_design_is_measured_too(kills: int, tmp_path: Path) -> None:
    report = run_agent_kills(kills, directory=tmp_path, intents="step", seed=1)
    _show(report)
    _sound(report)
    if kills >= 100:  # its cost: later tools of a step killed in an earlier one are interrupted
        assert report.never_started_interrupted > 0


def test_two_kills_during_one_model_request_are_restarted_and_finish(tmp_path: Path) -> None:
    report = run_agent_kills(2, directory=tmp_path, intents="tool", kinds=["model-twice"], seed=2)
    _show(report)
    _sound(report)
    assert report.kinds == {"model-twice": 2}
    assert report.restarts >= 1 and report.aborted >= 1  # the blocked run ended aborted, asked again


def test_kills_during_recovery_itself(tmp_path: Path) -> None:
    report = run_agent_kills(2, directory=tmp_path, intents="tool", kinds=["recovery"], seed=3)
    _show(report)
    _sound(report)
    assert report.kinds == {"recovery": 2}


def test_unknown_kill_kinds_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="kill kinds"):
        run_agent_kills(1, directory=tmp_path, kinds=["power"])


def test_a_child_that_keeps_failing_stops_the_run_with_the_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never a harness looping for ever on a broken agent: three failed children in a row end
    the run, and the failures say what they printed."""
    from sessionlog.testing import agent_kills

    def broken(folder: Path, seed: int, intents: str, killed_in_model: bool = False) -> None:
        agent_kills._say("ready")
        raise RuntimeError("the agent is broken")

    monkeypatch.setattr(agent_kills, "child_main", broken)
    report = run_agent_kills(5, directory=tmp_path)
    assert report.kills == 0 and report.stuck == 3
    assert any("the agent is broken" in failure for failure in report.failures)
    assert report.failures[-1].endswith("3 children in a row failed; the run stops")
