"""A throwaway PostgreSQL cluster for tests and benchmarks: `initdb` into a temporary directory,
`pg_ctl` on a free loopback port (TCP only, no socket directory), password authentication, the
server's own durability settings (`fsync=on`). When running as root the cluster belongs to the
`postgres` system user, as PostgreSQL refuses to run as root.

    with PostgresServer.start() as server:        # PostgresUnavailable when it cannot be had
        url = server.url                          # postgresql://sessionlog:...@127.0.0.1:PORT/sessionlog
        server.kill()                             # SIGKILL the postmaster (and its children)
        server.restart()                          # after a kill: the stale postmaster.pid is removed
        standby = server.standby()                # a synchronous standby (pg_basebackup -R)

The binaries are looked up on PATH, then in `/usr/lib/postgresql/*/bin` (Debian keeps them
there). `SESSIONLOG_REQUIRE_POSTGRES=1` (CI sets it) turns "no PostgreSQL here" from a skip into
a failure: `PostgresUnavailable` carries the reason either way.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from ..plugins.hookspecs import hookimpl

USER = "sessionlog"
DATABASE = "sessionlog"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server can be started here (the reason is the message)."""


def binaries() -> Path:
    """The directory holding `initdb`, `pg_ctl` and `postgres`."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent  # a symlink on PATH: the directory of the real one
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(candidate) / "initdb").exists() and (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    raise PostgresUnavailable(
        "no PostgreSQL server binaries (initdb, pg_ctl) on PATH or in /usr/lib/postgresql"
    )


def free_port() -> int:
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


START_SECONDS = 300  # a start (with crash recovery) that takes longer hangs: a bound for a hang only


def _run_as_a_group(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """`subprocess.run` whose interruption (Ctrl-C, its timeout) kills the command's children too,
    not the command alone: initdb's single-user server went on writing into the folder being
    removed after initdb was killed, and the folder stayed."""
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as child:
        try:
            out, err = child.communicate(timeout=timeout)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)  # its own group (start_new_session)
            child.wait()  # a killed process: not a wait for its work
            raise
    return subprocess.CompletedProcess(argv, child.returncode, out, err)


class PostgresServer:
    """One cluster in a temporary directory; `stop()` (or leaving the `with`) removes it."""

    def __init__(self, root: Path, data: Path, port: int, password: str, run_as: str | None) -> None:
        self.root = root
        self.data = data
        self.port = port
        self.password = password
        self.run_as = run_as
        self.bin = binaries()
        self.standbys: list[PostgresServer] = []

    # -- making one ------------------------------------------------------------------------------

    @classmethod
    def start(cls, **settings: Any) -> PostgresServer:
        """initdb + start, with `settings` added to postgresql.conf."""
        directory = binaries()
        run_as = "postgres" if os.geteuid() == 0 else None
        if run_as is not None:
            try:
                pwd.getpwnam(run_as)
            except KeyError:
                raise PostgresUnavailable(
                    "running as root and there is no `postgres` user to run the server"
                ) from None
        root = Path(tempfile.mkdtemp(prefix="sessionlog-pg-"))
        server = None
        try:  # from the folder's making on: a Ctrl-C at any step leaves nothing behind
            server = cls(root, root / "data", free_port(), secrets.token_hex(12), run_as)
            if run_as is not None:
                shutil.chown(root, run_as)
            password_file = root / "password"
            password_file.touch(mode=0o600)  # read by initdb, then removed
            password_file.write_text(server.password)
            if run_as is not None:
                shutil.chown(password_file, run_as)
            server._run(
                directory / "initdb",
                "-D", str(server.data), "-U", USER, "--pwfile", str(password_file),
                "--auth-host=scram-sha-256", "--auth-local=reject", "-E", "UTF8", "--no-instructions",
            )  # fmt: skip
            password_file.unlink()
            server.configure(
                {
                    "listen_addresses": "'127.0.0.1'",
                    "port": str(server.port),
                    "unix_socket_directories": "''",
                    "fsync": "on",
                    "synchronous_commit": "on",
                    "max_connections": "300",
                    "shared_buffers": "'128MB'",
                    "wal_level": "replica",
                    "max_wal_senders": "4",
                    # After a crash the server syncs its data directory before recovery: one
                    # syncfs instead of an fsync of every file of every test's database (beside
                    # a disk hog that took over 60 s, and a restart in a test gave up).
                    **({"recovery_init_sync_method": "syncfs"} if server.version() >= 14 else {}),
                    **settings,
                }
            )
            with open(server.data / "pg_hba.conf", "a") as hba:
                hba.write("host replication sessionlog 127.0.0.1/32 scram-sha-256\n")
            server.start_postmaster()
            server.psql(f"create database {DATABASE}")
        except BaseException:
            if server is not None:
                server.stop()
            shutil.rmtree(root, ignore_errors=True)
            raise
        return server

    def configure(self, settings: dict[str, str]) -> None:
        with open(self.data / "postgresql.conf", "a") as conf:
            for key, value in settings.items():
                conf.write(f"{key} = {value}\n")

    def _run(
        self, *command: Any, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(part) for part in command]
        if self.run_as is not None:
            argv = ["runuser", "-u", self.run_as, "--", *argv]
        done = _run_as_a_group(argv, timeout)
        if check and done.returncode != 0:
            raise PostgresUnavailable(f"{Path(str(command[0])).name} failed: {done.stderr.strip()[-800:]}")
        return done

    # -- running it ------------------------------------------------------------------------------

    def version(self) -> int:
        """The server's major version (15 for 15.18)."""
        said = self._run(self.bin / "pg_ctl", "--version").stdout  # pg_ctl (PostgreSQL) 15.18 (...)
        return int(said.split(")")[1].split(".")[0])

    def start_postmaster(self) -> None:
        if not self._postmaster_alive():  # a SIGKILLed postmaster's pid file (PID 1 reaps no zombie)
            (self.data / "postmaster.pid").unlink(missing_ok=True)
        # -w: until it accepts connections (after crash recovery); the bound is for a hang only
        self._run(
            self.bin / "pg_ctl", "-D", self.data, "-l", self.root / "log", "-w", "-t", str(START_SECONDS),
            "start", timeout=START_SECONDS + 60,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return
            time.sleep(0.05)
        raise PostgresUnavailable(f"the server did not listen on port {self.port}")

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def _postmaster_alive(self) -> bool:
        """Whether the pid file names a running process (not a zombie, not gone): a postmaster
        still recovering must keep its pid file, or a second one would start beside it."""
        try:
            stat = Path(f"/proc/{self.postmaster_pid()}/stat").read_text()
        except (OSError, ValueError, IndexError):
            return False
        return stat.rsplit(")", 1)[1].split()[0] != "Z"

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend of it (a crash of the database host's server)."""
        postmaster: list[int] = []
        with contextlib.suppress(OSError, ValueError, IndexError):
            postmaster = [self.postmaster_pid()]
        # all at once, as a crash does: the children are listed before the postmaster dies
        for pid in [*postmaster, *self._leftovers()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._kill_leftovers()  # a child forked meanwhile
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2),
            ):
                time.sleep(0.05)
                continue
            break

    def _leftovers(self) -> dict[int, str]:
        """The live processes working in the data directory, each with its state, name and wait
        channel: every child of a postmaster has it as its working directory. Listed after the
        postmaster died, these are children of it that outlived it (a child forked while it was
        killed escapes any list taken before), which keep a new server from starting ("pre-existing
        shared memory block is still in use")."""
        data = os.path.realpath(self.data)
        found: dict[int, str] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.readlink(entry / "cwd") != data:
                    continue
                name, state = (entry / "stat").read_text().rsplit(")", 1)
                wchan = (entry / "wchan").read_text()
            except OSError:
                continue  # gone meanwhile, or not ours to read
            if state.split()[0] != "Z":
                found[int(entry.name)] = f"{state.split()[0]} {name.split('(', 1)[1]} {wchan}"
        return found

    def _kill_leftovers(self, seconds: float = 30) -> None:
        """SIGKILL the leftovers until none is left (the postmaster is dead: nothing forks more)."""
        deadline = time.monotonic() + seconds
        while (leftovers := self._leftovers()) and time.monotonic() < deadline:
            for pid in leftovers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def listening(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
            return True
        return False

    def restart(self, *, seconds: float = 60) -> None:
        """Start it again after a kill, trying for `seconds` (a backend the kill missed, forked
        meanwhile, exits once it sees its postmaster gone; until then the start is refused)."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                self.start_postmaster()
                return
            except (PostgresUnavailable, subprocess.TimeoutExpired) as error:
                if not self._postmaster_alive():  # (one still recovering is waited for instead)
                    self._kill_leftovers()
                if time.monotonic() > deadline:
                    log = self.root / "log"
                    tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
                    message = (
                        "the server did not start again (processes left in its data directory, pid: "
                        f"state, name, wait channel: {self._leftovers()}): {error}; log: {tail}"
                    )
                    raise PostgresUnavailable(message) from None
                time.sleep(0.5)

    def stop(self) -> None:
        """Stop the server (and its standbys) and remove its folder. A Ctrl-C while stopping (a
        second one, the first being why it stops) makes it try once more, and the folder, which
        holds the server's password, goes in any case; the interrupt is not raised again."""
        try:
            for _attempt in range(2):
                try:
                    for standby in self.standbys:
                        standby.stop()
                    if (self.data / "postmaster.pid").exists():
                        self._run(
                            self.bin / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop", check=False
                        )
                    return
                except KeyboardInterrupt:
                    continue
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- reaching it -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"postgresql://{USER}:{self.password}@127.0.0.1:{self.port}/{DATABASE}"

    def url_for(self, database: str) -> str:
        return f"postgresql://{USER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A new, empty database on this server; its URL."""
        name = f"db_{secrets.token_hex(6)}"
        self.psql(f"create database {name}")
        return self.url_for(name)

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run `sql` as the superuser; its output."""
        import psycopg

        with psycopg.connect(self.url_for(database), autocommit=True) as connection:
            cursor = connection.execute(sql)
            return "" if cursor.description is None else "\n".join(str(row) for row in cursor.fetchall())

    # -- a synchronous standby -------------------------------------------------------------------

    def standby(self, name: str = "standby1") -> PostgresServer:
        """A streaming standby made with `pg_basebackup -R`, and this server waiting for it
        (`synchronous_standby_names`); returns once the standby streams synchronously."""
        root = Path(tempfile.mkdtemp(prefix="sessionlog-pg-standby-"))
        if self.run_as is not None:
            shutil.chown(root, self.run_as)
        standby = PostgresServer(root, root / "data", free_port(), self.password, self.run_as)
        self.standbys.append(standby)
        conninfo = (
            f"host=127.0.0.1 port={self.port} user={USER} password={self.password} application_name={name}"
        )
        self._run(
            self.bin / "pg_basebackup", "-D", standby.data, "-R", "-X", "stream", "-c", "fast", "-d", conninfo
        )
        standby.configure(
            {"port": str(standby.port), "primary_conninfo": f"'{conninfo}'", "hot_standby": "on"}
        )
        standby.start_postmaster()
        self.psql(f"alter system set synchronous_standby_names = '{name}'")
        self.psql("select pg_reload_conf()")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.psql("select count(*) from pg_stat_replication where sync_state = 'sync'") == "(1,)":
                return standby
            time.sleep(0.1)
        raise PostgresUnavailable("the standby did not become synchronous within 60 s")

    def promote(self) -> None:
        """Make this standby a primary (after its primary died)."""
        self._run(self.bin / "pg_ctl", "-D", self.data, "-w", "promote")


# -- the store contract on PostgreSQL ------------------------------------------------------------


class PathSessions:
    """A plugin registering `postgres-store` (sync) and `postgres-store-async` for the store
    contract, whose tests name sessions by path: each path names the session created there, in
    one repository at `url`. (The repository API names sessions by id; this only maps.)"""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ids: dict[str, str] = {}
        self._repository: Any = None

    def repository(self) -> Any:
        if self._repository is None:
            from ..repositories.postgres import PostgresRepository

            self._repository = PostgresRepository(self.url)
        return self._repository

    def close(self) -> None:
        if self._repository is not None:
            self._repository.close()

    def session_id(self, path: Path, create: bytes | None) -> str:
        """The id of the session at `path`: a new one holding the header `create`, or the one
        made there before."""
        import orjson

        from ..core.errors import SessionExistsError, SessionNotFoundError

        key = os.path.realpath(path)
        if create is not None:
            if key in self.ids:
                raise SessionExistsError(0, f"a session already exists: {path}", str(path))
            self.repository().insert_header(create)
            self.ids[key] = orjson.loads(create)["id"]
        elif key not in self.ids:
            raise SessionNotFoundError(2, f"no session at {path}", str(path))
        return self.ids[key]

    def open_sync(self, path: Path, *, create: bytes | None = None, lock: bool = True) -> Any:
        from ..repositories.postgres_session import PostgresSession

        repository = self.repository()
        session_id = self.session_id(path, create)
        return PostgresSession(repository, session_id, repository.claim(session_id))

    async def open_async(self, path: Path, *, create: bytes | None = None, lock: bool = True) -> Any:
        import asyncio

        from ..repositories.aio import AsyncRowsSession, AsyncSQLRepository

        repository = self.repository()
        session_id = self.session_id(path, create)
        epoch = await asyncio.to_thread(repository.claim, session_id)
        owner = AsyncSQLRepository(repository, owns_sync=False)  # the repository stays open
        return AsyncRowsSession(owner, session_id, epoch, owner_closes=True)

    @hookimpl
    def register_backends(self, register: Any) -> None:
        from ..repositories.postgres import ASYNC_INFOS, INFOS

        register("postgres-store", self.open_sync, _renamed(INFOS["power"], "postgres-store"))
        register(
            "postgres-store-async", self.open_async, _renamed(ASYNC_INFOS["power"], "postgres-store-async")
        )

    def registry(self) -> Any:
        from ..plugins.registry import Registry, plugin_manager

        return Registry(plugin_manager(builtins=False, entry_points=False, plugins=[self]))


class PostgresRows:
    """Mixin for a store contract class of `PathSessions`' backends: the byte hooks read and
    replace a session's rows. Set `paths` (a `PathSessions`) before the harness is made."""

    paths: PathSessions
    unsupported: ClassVar[Mapping[str, str]] = {
        "files": "a session is rows in a database, not a file",
        "file_ops": "the server does the I/O; a killed server and a broken connection are tested instead",
        "flock": "the contract's paths are mapped in this process only; a writer in another process is "
        "refused by its lease (tests/test_postgres.py)",
    }

    def raw_bytes(self, path: Path) -> bytes:
        from .raw_rows import stored_rows

        return stored_rows(self.paths.repository(), self.paths.ids[os.path.realpath(path)])

    def write_raw(self, path: Path, data: bytes) -> None:
        from ..core.ids import new_id
        from .raw_rows import replace_rows

        key = os.path.realpath(path)  # one database for every test: a new id, not the header's
        self.paths.ids[key] = replace_rows(self.paths.repository(), self.paths.ids.get(key) or new_id(), data)


def terminate_backend(url: str, pid: int, *, seconds: float = 60) -> None:
    """`pg_terminate_backend(pid)` and wait until that backend is gone: the function only sends
    the signal, and on a loaded machine a statement sent right after it can still reach the live
    backend (a test of "the next commit finds its connection dead" must not race its own kill)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as killer:
        killer.execute("select pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + seconds
        while killer.execute("select 1 from pg_stat_activity where pid = %s", (pid,)).fetchone():
            if time.monotonic() > deadline:
                raise TimeoutError(f"backend {pid} still runs {seconds:.0f} s after pg_terminate_backend")
            time.sleep(0.01)


def recovery_workers(location: str, workers: int = 4) -> list[str]:
    """Run `workers` recovery workers at once, each with a repository of its own, each claiming
    sessions (`claim_unfinished`) and holding each a moment, until none is left; the ids they
    claimed, in claim order (two workers claiming one session shows as a repeated id)."""
    import sessionlog

    claimed: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        with sessionlog.repository(location) as mine:
            while (store := mine.claim_unfinished()) is not None:
                with lock:
                    claimed.append(store.load().session_id)
                time.sleep(0.01)  # recovering, while holding it

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return claimed


def _renamed(info: Any, name: str) -> Any:
    import dataclasses

    return dataclasses.replace(info, name=name)


def run_failovers(rounds: int) -> Any:
    """`rounds` times: a primary with a synchronous standby; a child commits in the replicated
    class; the primary is SIGKILLed mid-commit and the standby promoted; the session is checked
    there (`repository_kills`). One report for all rounds."""
    from .repository_kills import RepositoryKillReport, run_repository_kills

    total = RepositoryKillReport()
    for _ in range(rounds):
        with PostgresServer.start() as primary:
            standby = primary.standby()
            standby_url = primary.url.replace(f":{primary.port}/", f":{standby.port}/")

            def failover(
                child: Any,
                primary: PostgresServer = primary,
                standby: PostgresServer = standby,
                standby_url: str = standby_url,
            ) -> str:
                primary.kill()
                standby.promote()
                return standby_url

            report = run_repository_kills(
                primary.url, 1, max_wait=0.3, options={"durability": "replicated"}, crash=failover
            )
        total.kills += report.kills
        total.acknowledged += report.acknowledged
        total.lost += report.lost
        total.failures += report.failures
    return total
