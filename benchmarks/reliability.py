"""Acknowledged commits lost per backend, from the crash harnesses in their short modes.

``sessionlog.testing.crash`` (SIGKILL of a committing child, the log checked after every kill)
and ``sessionlog.testing.powerloss`` (every crash state of recorded file-operation traces) are
imported lazily: when one is missing or fails, its column is "—" with the reason, never a number.
"""

from __future__ import annotations

import importlib
import pathlib
from collections.abc import Callable
from typing import Any

from benchmarks.ceilings import Progress

Row = dict[str, Any]


def not_run(reason: str, names: list[str]) -> dict[str, Row]:
    return {name: {"lost_kill9": None, "lost_power": None, "lost_note": reason} for name in names}


def _kills(module: Any, backend: str, directory: pathlib.Path, kills: int) -> Row:
    report = module.run_kills(backend, kills, directory=directory)
    state = "ok" if report.ok else "FAILED: " + "; ".join(report.failures[:3])
    return {
        "lost_kill9": report.lost,
        "kill9": {"kills": report.kills, "acknowledged": report.acknowledged, "ok": report.ok},
        "lost_note": f"kill -9: {report.kills} kills, {report.acknowledged} acknowledged commits, "
        f"{report.lost} lost, {report.torn_tails} torn tails, {report.reopened} reopen+append checks, "
        f"{state}; ",
    }


def _powerloss(module: Any, backend: str, directory: pathlib.Path, traces: int) -> Row:
    report = module.run_powerloss(backend, traces, directory=directory)
    state = "ok" if report.ok else "FAILED: " + "; ".join(report.violations[:3])
    return {
        "lost_power": report.max_lost,
        "power": {
            "traces": report.traces,
            "states": report.states,
            "lost_states": report.lost_states,
            "lost_commits": report.lost_commits,
            "misread": report.misread,
            "ok": report.ok,
        },
        "lost_note": f"power loss: {report.traces} traces, {report.states} crash states, "
        f"{report.lost_states} lose acknowledged commits (at most {report.max_lost} in one state, "
        f"{report.lost_commits} summed), {report.misread} misread, {state}; ",
    }


def measure(
    names: list[str],
    directory: pathlib.Path,
    progress: Progress | None = None,
    *,
    kills: int = 8,
    traces: int = 20,
) -> dict[str, Row]:
    """backend -> {lost_kill9: acknowledged commits lost over `kills` kills; lost_power: the most
    acknowledged commits one simulated crash state loses, over `traces` traces; details; a note}."""
    out = not_run("", names)
    harnesses: list[tuple[str, str, int, Callable[[Any, str, pathlib.Path], Row]]] = [
        ("crash", "lost_kill9", kills, lambda module, name, folder: _kills(module, name, folder, kills)),
        (
            "powerloss",
            "lost_power",
            traces,
            lambda module, name, folder: _powerloss(module, name, folder, traces),
        ),
    ]
    for module_name, column, count, run in harnesses:
        label = f"sessionlog.testing.{module_name} (short)"
        if count <= 0:
            for name in names:
                out[name]["lost_note"] += f"{column}: not run in this mode; "
            continue
        try:
            module = importlib.import_module(f"sessionlog.testing.{module_name}")
        except ImportError as error:
            for name in names:
                out[name]["lost_note"] += f"{column}: harness missing ({error}); "
            continue
        for done, name in enumerate(names):
            if progress is not None:
                progress(label, done, len(names))
            folder = directory / f"{module_name}-{name}"
            folder.mkdir(parents=True, exist_ok=True)
            try:
                found = run(module, name, folder)
            except Exception as error:  # a harness that breaks is a reason, not a number
                found = {"lost_note": f"{column}: harness failed: {type(error).__name__}: {error}; "}
            note = out[name]["lost_note"] + found.pop("lost_note")
            out[name].update(found, lost_note=note)
        if progress is not None:
            progress(label, len(names), len(names))
    return out
