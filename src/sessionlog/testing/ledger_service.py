"""A counterpart for the idempotency proof (issue 27): a payment-and-deploy service in its own
process, with its own durable ledger (SQLite, `synchronous=FULL`), that honours idempotency keys
and answers status queries by key, as a payment API does.

    python -m sessionlog.testing.ledger_service serve --db ledger.db --port-file port [--unknown 0.2]

* `POST /charge` and `POST /deploy` with `{"key", "subject", "value"}`: the first request with a
  key makes the effect (one ledger row, committed before the answer); a later one with the same
  key makes nothing and answers the first one's result (`"duplicate": true`). Every request is
  also counted in `requests`, so that a key that changed between two runs of one call would show
  as two effects of one subject.
* `GET /status/KEY`: `{"status": "done", "result": ...}` or `{"status": "absent"}`; with
  `--unknown P` a share P of status queries answers 503 (the counterpart cannot tell), so that
  reconciliation's third answer is exercised too.

The agent side (`agent_tools`): the 3-tool step of the kill harness (`testing.agent_kills`,
`--against ledger`): a `charge` declared `idempotent` (replayed with its key), a `deploy` with a
`reconcile` that asks `/status/KEY`, a `bash` with neither. `LedgerFigures` reads what the
service and the logs hold at the end: charges per intended call, deploys reconciled or
interrupted, bash never twice.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS effects (
    key TEXT PRIMARY KEY, kind TEXT NOT NULL, subject TEXT NOT NULL, result TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL, kind TEXT NOT NULL, subject TEXT NOT NULL,
    duplicate INTEGER NOT NULL
);
"""
KINDS = ("charge", "deploy")
TIMEOUT = 30.0  # seconds a request may take (a loaded machine): never a figure, only a bound


# -- the service ---------------------------------------------------------------------------------


class Ledger:
    """The durable ledger: one SQLite connection, one transaction per request."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)
        self.lock = threading.Lock()

    def effect(self, kind: str, key: str, subject: str, value: object) -> dict[str, Any]:
        """Make the effect once per key; the first result for every request with that key."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                row = self.db.execute("SELECT kind, result FROM effects WHERE key = ?", (key,)).fetchone()
                duplicate = row is not None
                if row is None:
                    number = self.db.execute("SELECT count(*) FROM effects").fetchone()[0] + 1
                    result = f"{kind} {subject} {value} done (#{number})"
                    self.db.execute("INSERT INTO effects VALUES (?, ?, ?, ?)", (key, kind, subject, result))
                else:
                    result = row[1]
                self.db.execute(
                    "INSERT INTO requests (key, kind, subject, duplicate) VALUES (?, ?, ?, ?)",
                    (key, kind, subject, int(duplicate)),
                )
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
        return {"result": result, "duplicate": duplicate}

    def status(self, key: str) -> dict[str, Any]:
        with self.lock:
            row = self.db.execute("SELECT result FROM effects WHERE key = ?", (key,)).fetchone()
        return {"status": "absent"} if row is None else {"status": "done", "result": row[0]}


def _handler(ledger: Ledger, unknown: float, rng: random.Random) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet: the figures say what happened
            pass

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            kind = self.path.strip("/")
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if kind not in KINDS or not isinstance(body.get("key"), str) or not body["key"]:
                self._answer(400, {"error": "POST /charge or /deploy with a key"})
                return
            self._answer(200, ledger.effect(kind, body["key"], str(body.get("subject")), body.get("value")))

        def do_GET(self) -> None:
            if not self.path.startswith("/status/"):
                self._answer(404, {"error": "GET /status/KEY"})
                return
            with ledger.lock:
                cannot_tell = rng.random() < unknown
            if cannot_tell:
                self._answer(503, {"error": "the ledger cannot tell now"})
                return
            self._answer(200, ledger.status(self.path[len("/status/") :]))

    return Handler


def serve(db: str, port_file: str, *, unknown: float = 0.0, seed: int = 0) -> None:
    """Serve on 127.0.0.1 (a free port, written to `port_file` once listening) until killed."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(Ledger(db), unknown, random.Random(seed)))
    server.daemon_threads = True
    temporary = f"{port_file}.tmp"
    Path(temporary).write_text(str(server.server_address[1]))
    os.replace(temporary, port_file)
    server.serve_forever()


class Service:
    """The service as a child process of the harness: `url` once it listens; `stop()`."""

    def __init__(self, folder: Path, *, unknown: float = 0.0, seed: int = 0) -> None:
        self.db = folder / "ledger.db"
        port_file = folder / "ledger.port"
        command = [sys.executable, "-m", "sessionlog.testing.ledger_service", "serve"]
        command += ["--db", str(self.db), "--port-file", str(port_file), "--unknown", str(unknown)]
        command += ["--seed", str(seed)]
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + TIMEOUT
        while not port_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                error = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
                self.stop()
                raise RuntimeError(f"the ledger service did not start: {error[-400:]}")
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{port_file.read_text()}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        self.process.wait()
        if self.process.stderr is not None:
            self.process.stderr.close()


# -- the agent side ------------------------------------------------------------------------------


class LedgerUnavailable(ConnectionError):
    """The ledger answered a status query with an error (503: it cannot tell)."""


def _request(url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]
    except urllib.error.HTTPError as error:
        raise LedgerUnavailable(f"the ledger answered {error.code}") from None


def agent_tools(url: str, began: Callable[[str, str], None], pause: Callable[[float], None]) -> list[Any]:
    """The harness's tools against the service at `url`: `began(name, subject)` is called as a
    tool begins (from there its effect may have happened), `pause(seconds)` around each request
    (a random share of it: where a kill may land)."""
    import sessionlog
    from sessionlog.tools import DidNotRun, Ran, Unknown

    def effect(kind: str) -> Callable[[dict[str, Any], str], str]:
        def run(arguments: dict[str, Any], key: str) -> str:
            began(kind, arguments["key"])
            pause(0.004)
            answer = _request(f"{url}/{kind}", {"key": key, "subject": arguments["key"], "value": 5})
            pause(0.004)
            return str(answer["result"])

        return run

    def reconcile(key: str, arguments: dict[str, Any]) -> object:
        found = _request(f"{url}/status/{key}")  # LedgerUnavailable: unknown, settled as interrupted
        if found["status"] == "done":
            return Ran(found["result"])
        return DidNotRun() if found["status"] == "absent" else Unknown(str(found["status"]))

    def bash(arguments: dict[str, Any]) -> str:
        began("bash", arguments["key"])
        pause(0.006)
        return f"bash {arguments['key']} done"

    return [
        sessionlog.Tool("charge", effect("charge"), idempotent=True),
        sessionlog.Tool("deploy", effect("deploy"), reconcile=reconcile),
        sessionlog.Tool("bash", bash),
    ]


# -- the figures ---------------------------------------------------------------------------------


@dataclass
class LedgerFigures:
    """What the ledger and the sessions' logs hold after a harness run against the service."""

    intended: dict[str, int] = field(default_factory=dict)
    """Calls the model asked for, by tool."""
    made: dict[str, int] = field(default_factory=dict)
    """Effects in the ledger, by kind."""
    double: dict[str, int] = field(default_factory=dict)
    """Subjects (calls) with more than one effect, by kind: must be 0."""
    missing: dict[str, int] = field(default_factory=dict)
    """Intended calls with no effect, by kind (a charge: must be 0)."""
    deduplicated: dict[str, int] = field(default_factory=dict)
    """Requests the ledger answered from an earlier one with the same key, by kind."""
    keys_per_call: int = 0
    """The most distinct keys one call was sent with: must be 1."""
    reconciled_ran: int = 0
    reconciled_not_run: int = 0
    interrupted: dict[str, int] = field(default_factory=dict)
    """Results settled as interrupted, by tool."""
    failures: list[str] = field(default_factory=list)

    def summary(self) -> str:
        def per(kind: str) -> str:
            return (
                f"{self.intended.get(kind, 0)} intended, {self.made.get(kind, 0)} made "
                f"({self.double.get(kind, 0)} double, {self.missing.get(kind, 0)} missing, "
                f"{self.deduplicated.get(kind, 0)} repeated requests deduplicated by key)"
            )

        return (
            f"charges: {per('charge')}; deploys: {per('deploy')}, {self.reconciled_ran} reconciled as ran, "
            f"{self.reconciled_not_run} as not run (run then), {self.interrupted.get('deploy', 0)} "
            f"interrupted; bash: {self.intended.get('bash', 0)} intended, "
            f"{self.interrupted.get('bash', 0)} interrupted; at most {self.keys_per_call} key per call"
        )


def ledger_figures(db: Path, logs: Sequence[Path]) -> LedgerFigures:
    """Count the ledger (`db`) against the calls of the sessions' `logs`."""
    from ..core.loading import reduce_bytes
    from ..runtime_reconcile import reconciliation

    figures = LedgerFigures()
    subjects: dict[str, set[str]] = {kind: set() for kind in KINDS}
    for log in logs:
        state = reduce_bytes(log.read_bytes(), nul_tail=True)
        names: dict[str, str] = {}
        for message in state.transcript:
            for call in message.get("tool_calls") or []:
                name = call["function"]["name"]
                names[call["id"]] = name
                figures.intended[name] = figures.intended.get(name, 0) + 1
                if name in subjects:
                    subjects[name].add(json.loads(call["function"]["arguments"])["key"])
            if message["role"] == "tool":
                name = names.get(message["tool_call_id"], "?")
                decided = reconciliation(message["content"])
                if decided == "ran":
                    figures.reconciled_ran += 1
                elif decided == "notRun":
                    figures.reconciled_not_run += 1
                elif str(message["content"]).startswith("Operation interrupted"):
                    figures.interrupted[name] = figures.interrupted.get(name, 0) + 1
    ledger = sqlite3.connect(db)
    try:
        for kind in KINDS:
            rows = ledger.execute(
                "SELECT subject, count(*) FROM effects WHERE kind = ? GROUP BY subject", (kind,)
            ).fetchall()
            made = dict(rows)
            figures.made[kind] = sum(made.values())
            figures.double[kind] = sum(1 for count in made.values() if count > 1)
            figures.missing[kind] = len(subjects[kind] - made.keys())
            figures.deduplicated[kind] = ledger.execute(
                "SELECT count(*) FROM requests WHERE kind = ? AND duplicate = 1", (kind,)
            ).fetchone()[0]
        figures.keys_per_call = ledger.execute(
            "SELECT coalesce(max(n), 0) FROM "
            "(SELECT count(DISTINCT key) AS n FROM requests GROUP BY kind, subject)"
        ).fetchone()[0]
    finally:
        ledger.close()
    for kind in KINDS:
        if figures.double[kind]:
            figures.failures.append(f"{figures.double[kind]} {kind} call(s) took effect twice")
    if figures.missing["charge"]:
        figures.failures.append(f"{figures.missing['charge']} intended charge(s) never made")
    if figures.keys_per_call > 1:
        figures.failures.append(f"a call was sent with {figures.keys_per_call} different keys")
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sessionlog.testing.ledger_service")
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("serve", help="serve the ledger until killed")
    command.add_argument("--db", required=True)
    command.add_argument("--port-file", required=True)
    command.add_argument("--unknown", type=float, default=0.0, help="share of status queries answered 503")
    command.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    serve(args.db, args.port_file, unknown=args.unknown, seed=args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
