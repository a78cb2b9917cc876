"""Masking a location's password touches the location and the driver's messages about it, and
nothing else: a password in any URL shape (its userinfo, holding '@' or not; its query, with the
keyword percent-encoded as libpq decodes it; `sslpassword`) is masked; a sentence holding a
location keeps every other word; session data that happens to hold the password's text is shown
as it is."""

from __future__ import annotations

import json
from typing import Any

import pytest

import sessionlog
from sessionlog.core import facts as F
from sessionlog.repositories.locations import mask_in, masked


@pytest.mark.parametrize(
    "location",
    [
        "postgresql://u@127.0.0.1:5432/sessionlog?pass%77ord=Zq9SecretXy#SID",
        "postgresql://u@127.0.0.1:5432/sessionlog?%70assword=Zq9SecretXy",
        "postgresql://u@127.0.0.1:5432/sessionlog?sslmode=require&%50ASSWORD=Zq9SecretXy",
        "postgresql://u@127.0.0.1:5432/sessionlog?sslpassword=Zq9SecretXy&user=u",
        "host=h sslpassword=Zq9SecretXy dbname=d",
    ],
)
def test_a_password_in_every_query_shape_is_masked(location: str) -> None:
    assert "Zq9SecretXy" not in masked(location)
    assert "***" in masked(location)


def test_a_sentence_holding_a_location_keeps_every_other_word() -> None:
    sentence = "postgresql://u:PW@localhost:1/db#abc is a repository (ls lists them)"
    assert masked(sentence) == "postgresql://u:***@localhost:1/db#abc is a repository (ls lists them)"
    with_query = "not postgresql://u:PW@localhost:1/db?x=1@2 as given"
    assert masked(with_query) == "not postgresql://u:***@localhost:1/db?x=1@2 as given"


def test_no_part_of_a_password_holding_an_at_sign_is_shown() -> None:
    location = "postgresql://u:SEC@RET@127.0.0.1:1/db"
    assert masked(location) == "postgresql://u:***@127.0.0.1:1/db"
    # libpq splits at the first '@' and quotes the rest, lowercased, as the host
    message = mask_in("failed to resolve host 'ret@127.0.0.1'", location)
    assert "ret" not in message.lower() and "SEC" not in message, message


def test_the_cli_never_prints_a_percent_encoded_query_password(postgres_server: Any, cli: Any) -> None:
    url = postgres_server.new_database()
    password = postgres_server.password
    user_and_host = url.split("://", 1)[1]
    userinfo, where = user_and_host.split("@", 1)
    location = f"postgresql://{userinfo.split(':', 1)[0]}@{where}?pass%77ord={password}"
    repository = sessionlog.repository(location)
    try:
        with repository.create(provider="p", model="m") as store:
            store.commit(F.accept_prompt("x"))
            session_id = store.load().session_id
    finally:
        repository.close()
    for argv in (
        ["verify", f"{location}#{session_id}"],
        ["inspect", f"{location}#{session_id}"],
        ["inspect", f"{location}#zz"],
        ["ls", location],
    ):
        run = cli(*argv)
        assert password not in run.out + run.err, (argv, run.out + run.err)


def test_session_data_holding_the_password_is_shown_as_it_is(postgres_server: Any, cli: Any) -> None:
    url = postgres_server.new_database()
    password = postgres_server.password
    repository = sessionlog.repository(url)
    try:
        with repository.create(provider="p", model="m", labels=[password]) as store:
            store.commit(F.accept_prompt(f"read the {password} manual"))
            session_id = store.load().session_id
    finally:
        repository.close()
    listed = cli("ls", url, "--json")
    assert listed.code == 0, listed.err
    rows = json.loads(listed.out)
    assert any(password in json.dumps(row) for row in rows), listed.out
    people = cli("ls", url)
    assert f"[{password}]" in people.out, people.out
    reduced = cli("reduce", f"{url}#{session_id}")
    assert f"read the {password} manual" in reduced.out, reduced.out
    assert f":{password}@" not in people.out + listed.out + reduced.out  # the location stays masked
