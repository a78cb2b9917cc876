"""PostgreSQL: the repository and store contracts against a real server the tests start, and
what only a shared database has: leases across hosts, recovery workers, an unknown COMMIT
outcome, a server killed mid-commit, a synchronous standby, bad credentials, and a foreign
table in the way."""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from sessionlog.core import facts as F
from sessionlog.testing import AsyncStoreContract, StoreContract
from sessionlog.testing.postgres import PathSessions, PostgresRows, PostgresServer
from sessionlog.testing.repository_suite import AsyncRepositoryContract, RepositoryContract

HEADER: dict[str, Any] = {"provider": "openrouter", "model": "test/model", "cwd": "/w"}
_NAMES = itertools.count()


def fresh_database(server: PostgresServer) -> str:
    """A new, empty database on the server; its URL."""
    name = f"t{os.getpid()}_{next(_NAMES)}"
    server.psql(f"create database {name}")
    return server.url_for(name)


def sql(url: str, statement: str, *values: Any) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        cursor = connection.execute(statement, values or None)
        return cursor.fetchall() if cursor.description else []


# -- the contracts -------------------------------------------------------------------------------


class PostgresHooks:
    urls: dict[Path, str]

    @pytest.fixture(autouse=True)
    def _server(self, postgres_server: PostgresServer) -> None:
        self.server = postgres_server
        self.urls = {}

    def location(self, where: Path) -> str:
        if where not in self.urls:
            self.urls[where] = fresh_database(self.server)
        return self.urls[where]

    def downgrade(self, where: Path) -> None:
        pytest.skip("version 1 is PostgreSQL's first schema: there is no previous one to migrate from")

    def take_over(self, where: Path, session_id: str) -> None:
        """A writer on another host takes the session (its lease expired, or it was told to)."""
        sql(
            self.location(where),
            "update sessionlog.sessions set writer = 'elsewhere:1:x', writer_epoch = writer_epoch + 1, "
            "lease_expires_at = now() + interval '1 minute' where session_id = %s",
            session_id,
        )


class TestPostgresRepository(PostgresHooks, RepositoryContract):
    pass


class TestAsyncPostgresRepository(PostgresHooks, AsyncRepositoryContract):
    pass


@pytest.fixture(scope="session")
def postgres_paths(postgres_server: PostgresServer) -> Any:
    paths = PathSessions(fresh_database(postgres_server))
    yield paths
    paths.close()


class StoreHooks(PostgresRows):
    @pytest.fixture(autouse=True)
    def _paths(self, postgres_paths: PathSessions) -> None:
        self.paths = postgres_paths
        self.registry = postgres_paths.registry()


class TestPostgresStore(StoreHooks, StoreContract):
    backend = "postgres-store"


class TestPostgresAsyncStore(StoreHooks, AsyncStoreContract):
    backend = "postgres-store-async"
