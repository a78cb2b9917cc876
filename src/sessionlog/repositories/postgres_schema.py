"""The PostgreSQL repository's schema: its migration steps, made or checked when a repository
opens under `pg_advisory_xact_lock` (so many workers starting at once migrate it once), and the
check that the server can give the durability class asked for."""

from __future__ import annotations

import errno
from typing import Any

from ..core.errors import DurabilityUnavailableError, RepositoryNotFoundError, SessionPathError

STEPS = (
    # 1: the design's schema, lines byte for byte
    """
    create schema if not exists sessionlog;
    create table sessionlog.schema_version (version integer not null);
    create table sessionlog.sessions (
        session_id text primary key,
        created_at bigint not null,
        updated_at bigint not null,
        head_line integer not null,
        head_bytes bigint not null,
        summary text not null,
        labels text not null default '[]',
        idle boolean not null default true,
        writer text,
        writer_epoch bigint not null default 0,
        lease_expires_at timestamptz
    );
    create index sessions_by_update on sessionlog.sessions (updated_at, session_id);
    create index sessions_open on sessionlog.sessions (updated_at) where not idle;
    create table sessionlog.lines (
        session_id text not null references sessionlog.sessions (session_id) on delete cascade,
        line_no integer not null,
        line bytea not null,
        primary key (session_id, line_no)
    )
    """,
    # 2: caller keys (`keys`): the sessions of each key, at most one of them current
    """
    create table sessionlog.session_keys (
        session_id text primary key references sessionlog.sessions (session_id) on delete cascade,
        caller_key text not null,
        generation bigint not null,
        replaced_at bigint,
        unique (caller_key, generation)
    );
    create unique index session_keys_current on sessionlog.session_keys (caller_key)
        where replaced_at is null
    """,
)
SCHEMA_VERSION = len(STEPS)
LOCK = 0x5E5510_6  # pg_advisory_xact_lock key of sessionlog's migrations
KEY_LOCK = 0x5E55  # with hashtext(key): pg_advisory_xact_lock(int, int) of the binds of one key


def check_class(connection: Any, durability: str, where: str) -> None:
    """DurabilityUnavailableError unless the server can give `durability` (checked at open)."""

    def show(name: str) -> str:
        return str(connection.execute(f"show {name}").fetchone()[0])

    if show("fsync") != "on":
        raise DurabilityUnavailableError(f"{where}: the server runs with fsync=off: no class holds")
    level = show("synchronous_commit")
    if level not in (
        ("on", "remote_apply")
        if durability == "replicated"
        else ("on", "remote_apply", "remote_write", "local")
    ):
        raise DurabilityUnavailableError(
            f"{where}: synchronous_commit is {level!r}, too weak for the {durability} class "
            "(ALTER ROLE ... SET synchronous_commit = on)"
        )
    if durability == "replicated":
        if not show("synchronous_standby_names"):
            raise DurabilityUnavailableError(
                f"{where}: the replicated class needs a synchronous standby, and "
                "synchronous_standby_names is empty"
            )
        connected = connection.execute(
            "select count(*) from pg_stat_replication where sync_state in ('sync', 'quorum')"
        ).fetchone()[0]
        if not connected:
            raise DurabilityUnavailableError(
                f"{where}: no synchronous standby is connected (pg_stat_replication; the role "
                "needs pg_monitor to see it)"
            )


def migrate_schema(transaction: Any, connection: Any, where: str, *, run: bool, create: bool = True) -> int:
    """Bring the schema to SCHEMA_VERSION under the advisory lock and return the version found
    (or, with `run=False`, only check it is there: the runtime role may lack the rights to change it). With
    `create=False` nothing is written: no schema is RepositoryNotFoundError."""
    run = run and create
    with transaction(connection) as open_connection:
        if run:
            open_connection.execute("select pg_advisory_xact_lock(%s)", (LOCK,))
        version_table, sessions = open_connection.execute(
            "select to_regclass('sessionlog.schema_version'), to_regclass('sessionlog.sessions')"
        ).fetchone()
        if version_table is None and sessions is not None:
            raise SessionPathError(
                0, f"{where}: sessionlog.sessions is another application's table; nothing was changed"
            )
        found = 0
        if version_table is None and not create:
            raise RepositoryNotFoundError(
                errno.ENOENT,
                f"no sessionlog repository in {where} (no schema sessionlog); nothing was created",
                where,
            )
        if version_table is not None:
            found = open_connection.execute("select max(version) from sessionlog.schema_version").fetchone()[
                0
            ]
        if found > len(STEPS):
            raise SessionPathError(0, f"{where}: schema version {found} is newer than this sessionlog")
        if found == len(STEPS):
            return found
        if not run:
            raise SessionPathError(
                0,
                f"{where}: the schema is at version {found}, not {len(STEPS)}: run `sessionlog migrate URL`",
            )
        for step in STEPS[found:]:
            for statement in filter(str.strip, step.split(";")):
                open_connection.execute(statement)
        open_connection.execute("delete from sessionlog.schema_version")
        open_connection.execute("insert into sessionlog.schema_version values (%s)", (len(STEPS),))
    return found
