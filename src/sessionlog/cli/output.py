"""Output of the command line: lines for people (escaped), JSON for programs, progress."""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from collections.abc import Iterator
from typing import Any

import orjson

from ..core.errors import shown
from ..repositories.locations import mask_in, masked

PROG = "sessionlog"
LARGE = 32 << 20  # bytes: from here on, work on a terminal shows progress


class Locations:
    """The locations given on this command line, and how each may be shown. Every line the CLI
    prints passes through `private`, which writes each location (also without its `#SESSION_ID`)
    as `masked` shows it, and nothing else: session data (a title, a label, a role, JSON for
    programs) is never rewritten, even where it happens to hold the password's text. A message
    (`say_error`: a driver's, which may quote the password in another shape) passes through
    `message` too, which masks each given location's password in every form (`mask_in`)."""

    def __init__(self) -> None:
        self._given: dict[str, str] = {}

    def add(self, location: str) -> None:
        for form in {location, location.rpartition("#")[0] or location}:
            if masked(form) != form:
                self._given[form] = masked(form)
                self._given[json.dumps(form)[1:-1]] = json.dumps(masked(form))[1:-1]  # as JSON quotes it

    def clear(self) -> None:
        self._given.clear()

    def private(self, text: str) -> str:
        for location in sorted(self._given, key=len, reverse=True):
            text = text.replace(location, self._given[location])
        return text

    def message(self, text: str) -> str:
        text = self.private(text)
        for location in self._given:
            text = mask_in(text, location)
        return masked(text)


LOCATIONS = Locations()


def dumps(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
    except TypeError:  # integers beyond 64 bits (tool arguments may hold them)
        return json.dumps(value, indent=2, ensure_ascii=False)


def out(text: str = "") -> None:
    """A line for people: control and format characters (terminal escapes, bidi overrides) that
    a model or a file put in a session are shown escaped, never executed by the terminal."""
    sys.stdout.write(LOCATIONS.private(escaped(text)) + "\n")


def out_json(value: Any) -> None:
    """JSON for programs (its encoder escapes what JSON must)."""
    sys.stdout.write(LOCATIONS.private(dumps(value)) + "\n")


def escaped(text: str) -> str:
    if text.isprintable():
        return text
    return "".join(
        char
        if char.isprintable() or char == "\n"
        else f"\\x{ord(char):02x}"
        if ord(char) < 0x100
        else f"\\u{ord(char):04x}"
        for char in text
    )


_TYPED = re.compile(r"[A-Za-z0-9._:/+-]{1,40}")


def typed(value: str) -> str:
    """A value the user typed on this command line (a backend's name), for a message about it:
    as typed when it is a short identifier-like word, else as `shown` bounds it. The library's
    own messages show no string whole (`shown`: a value in a wrong field may be a secret); the
    user's own argument, quoted back to that user, is no leak, and `bogus` tells more than
    "a string of 5 characters". A location goes through `masked` instead (it may hold a
    password)."""
    return repr(value) if _TYPED.fullmatch(value) else shown(value)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def say_error(command: str, message: str) -> None:
    """One line on stderr; a password-shaped part of it masked too (a message, never data)."""
    sys.stderr.write(f"{PROG} {command}: {LOCATIONS.message(escaped(one_line(message)))}\n")


def compact(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class Progress:
    """Progress of a long operation on stderr: a rich bar when rich is installed, else plain
    text. Shown with `--progress always`, or by default for large work on a terminal."""

    def __init__(self, mode: str, label: str, total: int) -> None:
        self.total = max(total, 1)
        self.label = label = LOCATIONS.private(escaped(label))  # it names the session
        self._shown = -1
        self._bar: Any = None
        self._task: Any = None
        self.enabled = mode == "always" or (mode == "auto" and total >= LARGE and sys.stderr.isatty())
        if not self.enabled or not sys.stderr.isatty():  # plain lines into a pipe or a log file
            return
        try:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn
        except ImportError:
            return
        self._bar = Progress(
            "{task.description}",
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task(label, total=self.total)

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=done)
            return
        percent = done * 100 // self.total
        step = 1 if sys.stderr.isatty() else 10
        if percent // step != self._shown // step:
            self._shown = percent
            end = "\r" if sys.stderr.isatty() else "\n"
            sys.stderr.write(f"{self.label}: {percent}%{end}")
            sys.stderr.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.stop()
        elif sys.stderr.isatty():
            sys.stderr.write("\n")
        self.enabled = False


@contextlib.contextmanager
def status(mode: str, label: str, size: int) -> Iterator[None]:
    """An indicator for work that reports no fraction done (reducing a large log)."""
    shown = mode == "always" or (mode == "auto" and size >= LARGE and sys.stderr.isatty())
    if not shown:
        yield
        return
    label = LOCATIONS.private(escaped(label))  # it names the session
    try:
        if not sys.stderr.isatty():
            raise ImportError("plain lines into a pipe or a log file")
        from rich.console import Console
    except ImportError:
        started = time.monotonic()
        sys.stderr.write(f"{label} ({size:,} bytes)...\n")
        yield
        sys.stderr.write(f"{label}: done in {time.monotonic() - started:.1f} s\n")
        return
    with Console(stderr=True).status(f"{label} ({size:,} bytes)"):
        yield
