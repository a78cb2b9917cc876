"""Issue 27, item 4: the proof against a real counterpart.

The kill harness (`testing.agent_kills`, `against="ledger"`) runs the README's loop against the
test service of `testing.ledger_service` (its own process, its own durable SQLite ledger, keys
honoured, status by key) with 3-tool steps: a `charge` declared idempotent, a `deploy` with
reconciliation, a `bash` with neither. It SIGKILLs the agent at random points and runs it again.
Every intended charge is made exactly once, no deploy takes effect twice, no bash runs twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import budgets
from sessionlog.testing.agent_kills import AgentKillReport, run_agent_kills
from sessionlog.testing.ledger_service import Ledger, ledger_figures


def _sound(report: AgentKillReport) -> None:
    print("\n" + report.summary())
    ledger = report.ledger
    assert ledger is not None
    assert report.failures == [] and report.stuck == 0 and report.out_of_order == 0
    assert report.run_twice == 0  # bash never twice
    assert ledger.made["charge"] == ledger.intended["charge"] > 0  # exactly one charge per call
    assert ledger.double == {"charge": 0, "deploy": 0} and ledger.missing["charge"] == 0
    assert ledger.keys_per_call == 1  # the same key on every replay and reconciliation
    # every deploy either took effect once or was settled as interrupted (it may have run)
    assert ledger.made["deploy"] + ledger.missing["deploy"] == ledger.intended["deploy"]
    assert ledger.missing["deploy"] <= ledger.interrupted.get("deploy", 0)


@pytest.mark.parametrize("kills", budgets(24, 300))
def test_charges_exactly_once_deploys_reconciled_bash_never_twice(kills: int, tmp_path: Path) -> None:
    report = run_agent_kills(kills, directory=tmp_path, intents="tool", against="ledger", seed=27)
    _sound(report)
    assert report.kills == kills
    if kills >= 100:
        ledger = report.ledger
        assert ledger is not None and report.replays > 0 and ledger.deduplicated["charge"] > 0
        assert ledger.reconciled_ran > 0 and ledger.reconciled_not_run > 0


@pytest.mark.parametrize("kills", budgets(12, 300))
def test_the_step_design_against_the_ledger(kills: int, tmp_path: Path) -> None:
    report = run_agent_kills(kills, directory=tmp_path, intents="step", against="ledger", seed=28)
    _sound(report)
    if kills >= 100:  # never-started deploys are reconciled as not run, and run: no interrupted guess
        ledger = report.ledger
        assert ledger is not None and ledger.reconciled_not_run > 0


def test_the_ledger_honours_keys_and_answers_status_by_key(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.db")
    first = ledger.effect("charge", "sl-a", "order-1", 5)
    again = ledger.effect("charge", "sl-a", "order-1", 5)
    assert again == {"result": first["result"], "duplicate": True} and not first["duplicate"]
    assert ledger.status("sl-a") == {"status": "done", "result": first["result"]}
    assert ledger.status("sl-b") == {"status": "absent"}
    ledger.effect("charge", "sl-b", "order-1", 5)  # a second key for one call: counted as double
    ledger.db.close()
    figures = ledger_figures(tmp_path / "ledger.db", [])
    assert figures.double["charge"] == 1 and figures.keys_per_call == 2
    assert any("twice" in failure for failure in figures.failures)


def test_an_unknown_counterpart_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="against"):
        run_agent_kills(1, directory=tmp_path, against="mainframe")
