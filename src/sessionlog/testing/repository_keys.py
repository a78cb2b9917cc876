"""The caller keys' part of the repository conformance suite (`repository_suite`): what every
repository kind does with a framework's own name of a session (`repositories.keys`).
`RepositoryContract` inherits it, so a third party's repository is held to it in the same line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from sessionlog.core import facts as build
from sessionlog.repositories.keys import InvalidKeyError, KeyHeldError, KeyNotFoundError, KeySessions

HEADER: dict[str, Any] = {"provider": "openrouter", "model": "test/model", "cwd": "/w"}
BAD_KEYS = ("", "a\x00b", "e\u0301", "x" * 257, "\ud800")  # empty, NUL, not NFC, too long, not UTF-8
RACERS = 4

# A child of the race: opens or creates the key's session once every child is ready, says what
# it got, and holds what it got until its stdin closes.
_RACER = """
import sys
from sessionlog.repositories.keys import KeyHeldError
repo = open_repository(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
try:
    store = repo.create(provider="openrouter", model="test/model", cwd="/w", key=sys.argv[2])
except KeyHeldError as error:
    print("refused", error.session_id, flush=True)
else:
    print("held", store.load().session_id, flush=True)
sys.stdin.read()
"""


def _id(store: Any) -> str:
    return str(store.load().session_id)


class KeysContract:
    """Mixin (through `RepositoryContract`): caller keys, in every repository kind."""

    def location(self, where: Path) -> str:
        raise NotImplementedError

    def repository(self, where: Path) -> Any:
        raise NotImplementedError

    def _opener(self) -> str:
        raise NotImplementedError

    def downgrade(self, where: Path) -> None:
        raise NotImplementedError

    def test_a_key_names_one_session_opened_or_created(self, tmp_path: Path) -> None:
        """`create(key=K)` makes the key's session, or opens it when the key has one; while it
        is held, another writer is refused with KeyHeldError naming the session; `open(key=K)`
        opens it and is KeyNotFoundError for a key with no session."""
        with self.repository(tmp_path) as repo:
            with pytest.raises(KeyNotFoundError, match="'user-42'"):
                repo.open(key="user-42")
            store = repo.create(**HEADER, key="user-42", labels=["web"])
            first = _id(store)
            with pytest.raises(KeyHeldError) as held:
                repo.create(**HEADER, key="user-42")
            assert held.value.session_id == first and held.value.key == "user-42"
            with pytest.raises(sessionlog.SessionLockedError):
                repo.open(key="user-42")
            store.commit(build.accept_prompt("hello"))
            seq = store.load().last_seq
            store.close()
            with repo.create(**HEADER, key="user-42", labels=["other"]) as again:
                assert _id(again) == first and again.load().last_seq == seq
            with repo.open(key="user-42") as opened:
                assert _id(opened) == first
            (row,) = repo.list()
            assert (row.session_id, row.key, row.replaced, row.labels) == (first, "user-42", False, ("web",))
            assert repo.key_sessions("user-42") == KeySessions("user-42", first, ())
            assert repo.key_sessions("nobody") is None
            with repo.create(**HEADER, key="user-43") as other:
                assert _id(other) != first
            assert {row.key for row in repo.list()} == {"user-42", "user-43"}
            assert [row.session_id for row in repo.list(key="user-42")] == [first]

    def test_replace_makes_a_new_current_session_and_keeps_the_old(self, tmp_path: Path) -> None:
        """`replace(K)` (an adapter's `clear_session`) makes a new current session for the key,
        even while the old one is held; the old one stays, readable, listed as replaced."""
        with self.repository(tmp_path) as repo:
            with repo.create(**HEADER, key="thread-1") as old:
                old.commit(build.accept_prompt("before the clear"))
                first = _id(old)
                with repo.replace("thread-1", **HEADER, labels=["cleared"]) as new:
                    second = _id(new)
            assert second != first
            with repo.replace("thread-1", **HEADER) as newer:
                third = _id(newer)
            assert repo.key_sessions("thread-1") == KeySessions("thread-1", third, (first, second))
            with repo.create(**HEADER, key="thread-1") as current:
                assert _id(current) == third
            rows = {row.session_id: row for row in repo.list(key="thread-1")}
            assert {sid: (row.key, row.replaced) for sid, row in rows.items()} == {
                first: ("thread-1", True),
                second: ("thread-1", True),
                third: ("thread-1", False),
            }
            assert rows[second].labels == ("cleared",)
            assert repo.load(first).transcript[0]["content"] == "before the clear"
            with repo.open(first) as reopened:  # a replaced session is still a session
                assert reopened.load() == repo.load(first)

    def test_deleting_a_keys_current_session(self, tmp_path: Path) -> None:
        """The key then has no current session (its replaced ones stay replaced); the next
        `create(key=K)` makes a new one."""
        with self.repository(tmp_path) as repo:
            with repo.create(**HEADER, key="k") as store:
                first = _id(store)
            with repo.replace("k", **HEADER) as store:
                second = _id(store)
            repo.delete(second)
            assert repo.key_sessions("k") == KeySessions("k", None, (first,))
            with pytest.raises(KeyNotFoundError):
                repo.open(key="k")
            with repo.create(**HEADER, key="k") as store:
                third = _id(store)
            assert third not in (first, second)
            assert repo.key_sessions("k") == KeySessions("k", third, (first,))

    def test_a_key_is_never_a_session_id(self, tmp_path: Path) -> None:
        """A key that is some session's id names another session (its own); a session id is
        never looked up as a key, nor a key as an id."""
        with self.repository(tmp_path) as repo:
            with repo.create(**HEADER) as store:
                plain = _id(store)
            with pytest.raises(KeyNotFoundError):
                repo.open(key=plain)
            with repo.create(**HEADER, key=plain) as store:
                keyed = _id(store)
            assert keyed != plain
            with repo.open(plain) as store:
                assert _id(store) == plain
            with pytest.raises(ValueError, match="not a session id"):
                repo.open("user-42")
            with pytest.raises(TypeError, match="one of them"):
                repo.open(plain, key="user-42")
            rows = {row.session_id: row.key for row in repo.list()}
            assert rows == {plain: None, keyed: plain}

    def test_keys_are_checked_at_the_door(self, tmp_path: Path) -> None:
        """A key that cannot name a session is an InvalidKeyError (a ValueError) naming the key
        (escaped; a long one by its length), in every method taking one, and nothing is made; a
        non-str is a TypeError."""
        with self.repository(tmp_path) as repo:
            for bad in BAD_KEYS:
                calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
                    ("create", (), {**HEADER, "key": bad}),
                    ("open", (), {"key": bad}),
                    ("replace", (bad,), HEADER),
                    ("key_sessions", (bad,), {}),
                    ("list", (), {"key": bad}),
                ]
                for method, args, keywords in calls:
                    with pytest.raises(InvalidKeyError, match="cannot name a session") as refused:
                        getattr(repo, method)(*args, **keywords)
                    shown = ascii(bad) if len(bad) <= 16 else f"a key of {len(bad):,} characters"
                    assert shown in str(refused.value) and refused.value.key == bad
                    assert isinstance(refused.value, ValueError)
            for wrong in (42, b"user-42", ["user-42"]):
                with pytest.raises(TypeError, match="a key is a str"):
                    repo.create(**HEADER, key=wrong)
            with pytest.raises(TypeError, match="session_id"):
                repo.replace("k", **HEADER, session_id="0190a6b2-0000-7000-8000-000000000000")
            assert repo.list() == []
            with repo.create(**HEADER, key="x" * 256) as store:  # the longest key
                assert repo.key_sessions("x" * 256) == KeySessions("x" * 256, _id(store), ())
            with repo.create(**HEADER, key="\xe9 \u4e2d / # : ?") as store:  # any NFC text
                assert repo.list(key="\xe9 \u4e2d / # : ?")[0].session_id == _id(store)

    def test_processes_racing_for_one_key_agree_on_its_session(self, tmp_path: Path) -> None:
        """`RACERS` processes call `create(key=K)` at once on a key with no session: exactly one
        session is made and kept; one process holds it, every other is refused naming it."""
        self.repository(tmp_path).close()  # made before the race (a database's schema)
        source = self._opener() + _RACER
        children = [
            subprocess.Popen(
                [sys.executable, "-c", source, self.location(tmp_path), "raced"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(RACERS)
        ]
        try:
            for child in children:
                assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            for child in children:  # as near to at once as the processes can be
                assert child.stdin is not None
                child.stdin.write("go\n")
                child.stdin.flush()
            answers = [child.stdout.readline().split() for child in children if child.stdout]
        finally:
            errors = [child.communicate("", timeout=120)[1] for child in children]
        assert all(len(answer) == 2 for answer in answers), (answers, errors)
        assert sorted(answer[0] for answer in answers) == ["held"] + ["refused"] * (RACERS - 1), answers
        assert len({answer[1] for answer in answers}) == 1, answers
        with self.repository(tmp_path) as repo:
            assert [row.session_id for row in repo.list()] == [answers[0][1]]
            assert repo.key_sessions("raced") == KeySessions("raced", answers[0][1], ())

    def test_keys_in_a_repository_of_the_previous_schema(self, tmp_path: Path) -> None:
        """A repository of the previous schema opens, migrates, and takes keys; its sessions
        have none."""
        with self.repository(tmp_path) as repo, repo.create(**HEADER) as store:
            old = _id(store)
        self.downgrade(tmp_path)
        with self.repository(tmp_path) as repo:
            with repo.create(**HEADER, key="after") as store:
                keyed = _id(store)
            assert {row.session_id: row.key for row in repo.list()} == {old: None, keyed: "after"}
            with repo.create(**HEADER, key="after") as store:
                assert _id(store) == keyed
