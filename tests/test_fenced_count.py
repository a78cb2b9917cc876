"""A writer that lost its hold is fenced, typed and counted: `repository.fenced` counts the
commits its repository refused because their writer no longer held the session, whether the
hold was seen lost before anything was sent (a takeover the heartbeat saw, a lease run out) or
the database's writer epoch fenced it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import sessionlog
from sessionlog.core import facts as F

HEADER: dict[str, Any] = {"provider": "openrouter", "model": "test/model", "cwd": "/w"}


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sessions.db'}"
    server = request.getfixturevalue("postgres_server")
    return str(server.new_database())


def test_a_writer_taken_over_is_fenced_typed_and_counted(location: str) -> None:
    with sessionlog.repository(location) as repo, sessionlog.repository(location) as other:
        first = repo.create(**HEADER)
        first.commit([F.user_message("one")])
        session_id = first.load().session_id
        assert repo.fenced == 0
        with other.open(session_id, take_over=True) as second:
            second.commit([F.user_message("two")])
        with pytest.raises(sessionlog.StorePoisonedError) as caught:
            first.commit([F.user_message("fenced")])
        assert isinstance(caught.value.__cause__, sessionlog.SessionChangedError)
        assert (repo.fenced, other.fenced) == (1, 0)
        first.close()
        assert b"fenced" not in repo.export(session_id)


def test_a_writer_whose_hold_was_seen_lost_is_counted_before_it_sends(location: str) -> None:
    with sessionlog.repository(location) as repo, sessionlog.repository(location) as other:
        store = repo.create(**HEADER)
        session_id = store.load().session_id
        with other.open(session_id, take_over=True):
            pass
        repo.heartbeat.renew_now()  # the round that finds the row another writer's
        with pytest.raises(sessionlog.StorePoisonedError):
            store.commit([F.user_message("late")])
        assert repo.fenced == 1
        store.close()
        assert b"late" not in repo.export(session_id)
