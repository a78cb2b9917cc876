"""Tools declared once: what the model sees, how a tool runs, and whether recovery may run it again.

A `Tool` is the one place a tool is declared. `Tools` turns the declarations into both things
the log needs, so that they can never disagree: the `tools` of every attempt's configuration
snapshot (name and definition digest) and the planner's current configuration (the same, plus
`replay` and `replayKey`). A tool declared `safe` is a read: recovery may run it again for an
intent whose result is unknown. Every other tool is `never`: its result is settled as
*interrupted*, and it is never run twice.

Two declarations use the call's idempotency key (`ToolCall.key`, made from its intent's fact id:
durable before the effect, the same on replay, reconciliation and in a fork), passed as the
tool's second argument, `run(arguments, key)` (docs/idempotency.md):

* `idempotent=True`: running again with the same key is harmless (the counterpart deduplicates
  by it). In the contract's terms the tool is `safe` with its own replay key (`idempotent:NAME:
  DIGEST`), so every port's planner replays a pending intent of it, and the runtime passes the
  same key again.
* `reconcile=fn`: a `never` tool whose counterpart can say, by key, whether the call ran. After a
  crash, before its pending intent is settled as interrupted, the runtime asks `fn(key,
  arguments)`: `Ran(output)` (the result is committed), `DidNotRun()` (the tool runs now, with the
  same key), or `Unknown(why)` (settled as interrupted, as is a failure or a timeout of `fn`, or
  any other answer: `runtime_reconcile`).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from threading import TIMEOUT_MAX
from types import GeneratorType
from typing import Any

from .core.canonical import canonical, configuration_digest, digest
from .core.commit import first_non_json
from .core.errors import short_shown, shown, type_named
from .core.framing import MAX_NESTING_DEPTH
from .schema import CurrentConfiguration, CurrentTool, Replay

ToolFunction = Callable[..., Any]
"""`run(arguments)`, or `run(arguments, key)` for a tool that takes the call's key
(`Tool.keyed`); it returns the output (text or a JSON value), or an awaitable of it (async)."""
ReconcileFunction = Callable[[str, dict[str, Any]], Any]
"""`reconcile(key, arguments)`: `Ran(output)`, `DidNotRun()` or `Unknown(why)` (or an awaitable
of one, for the async runtime)."""

RECONCILE_TIMEOUT = 10.0
"""Seconds a reconcile function may take (default) before its answer counts as unknown."""


@dataclass(frozen=True)
class Ran:
    """A reconcile answer: the call ran before the crash; `output` is its result (as a tool's
    output: text or a JSON value), `ok=False` for an error result (`ok` is True or False: any
    other value is a TypeError, never read as true)."""

    output: object
    ok: bool = True

    def __post_init__(self) -> None:
        if type(self.ok) is not bool:  # ok="no" would count as a success if read with bool()
            raise TypeError(f"Ran(output, ok=...): ok is True or False, not {type(self.ok).__name__}")


@dataclass(frozen=True)
class DidNotRun:
    """A reconcile answer: the call never took effect; the tool runs now, with the same key."""


@dataclass(frozen=True)
class Unknown:
    """A reconcile answer: the counterpart cannot tell; the call is settled as interrupted."""

    why: str = ""

    def __post_init__(self) -> None:
        if not issubclass(type(self.why), str):
            raise TypeError(f"Unknown(why): why is a string, not {type(self.why).__name__}")
        # a plain copy: no method of a subclass's runs when it is read later
        object.__setattr__(self, "why", str.__str__(self.why))


RECONCILE_ANSWERS = (Ran, DidNotRun, Unknown)


class _NotGiven(str):
    """The default of `Tool.replay`: `never`, or `safe` for an idempotent tool; told apart from
    an explicit `replay="never"` (which contradicts `idempotent=True`) by identity."""


_REPLAY_NOT_GIVEN: Any = _NotGiven("never")


def _callable_with(function: Callable[..., Any], count: int) -> bool:
    """Whether `function` accepts `count` positional arguments (True when its signature cannot
    be read: a builtin, an extension type)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return True
    try:
        signature.bind(*range(count))
    except TypeError:
        return False
    return True


NAME_SHOWN_WHOLE = 32
"""The longest tool name a declaration error shows whole (`deploy`, `search_knowledge_base`)."""


def tool_named(name: str) -> str:
    """A tool's name for a message: as written up to `NAME_SHOWN_WHOLE` characters, else by its
    length and first characters (`core.errors.short_shown`)."""
    return short_shown(name, "name", NAME_SHOWN_WHOLE)


@dataclass(frozen=True)
class Tool:
    """One tool: `run(arguments) -> output text` (a coroutine function for the async runtime),
    the definition the model sees (`description`, JSON-schema `parameters`), and its replay
    policy. `replay_key` names what a replay must match (default: the name and the definition's
    digest, so that changing the tool blocks the replay of an old intent). `idempotent=True`
    makes it `safe`, replayed with the same key; `reconcile=fn` lets recovery ask whether a call
    of a `never` tool ran (`reconcile_timeout` seconds at most); both make it `keyed`: it is run
    as `run(arguments, key)`. Declarations that would silently override each other are refused
    (`idempotent=True` with `replay="never"` or with `reconcile`, `reconcile` on a safe tool, a
    `replay_key` never used, a `reconcile_timeout` other than the default without `reconcile`,
    a keyed function that cannot take the key). The fields hold the resolved declaration (an
    idempotent tool's `replay` is `safe`), which `dataclasses.replace` passes on."""

    name: str
    run: ToolFunction
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})
    replay: Replay = _REPLAY_NOT_GIVEN
    """`never` (default) or `safe`; an idempotent tool is `safe` (`replay="never"` with
    `idempotent=True` is refused)."""
    replay_key: str | None = None
    idempotent: bool = False
    reconcile: ReconcileFunction | None = None
    reconcile_timeout: float = RECONCILE_TIMEOUT
    """Seconds `reconcile` may take (`RECONCILE_TIMEOUT` by default; only with `reconcile`)
    before its answer counts as unknown. A sync function is asked in a daemon thread named
    `sessionlog reconcile NAME KEY`: at the timeout the resume goes on without it, but a thread
    cannot be stopped, so the function keeps running in the background until it returns (its
    late answer is dropped; being a daemon, it never holds the interpreter's exit). A coroutine
    function is awaited on the loop and cancelled at the timeout (the resume does not wait for a
    coroutine that ignores its cancellation; `asyncio.run`'s exit does); one that blocks the
    loop (`time.sleep`, blocking I/O) cannot be interrupted: the resume waits until it returns,
    and its late answer counts as unknown."""

    def __post_init__(self) -> None:
        if type(self.name) is not str:
            raise TypeError(f"a tool's name is a string, not {type(self.name).__name__}")
        for key in ("description",):
            if not isinstance(getattr(self, key), str):
                raise TypeError(f"tool {tool_named(self.name)}: {key} is a string")
        if not isinstance(self.parameters, Mapping):
            raise TypeError(f"tool {tool_named(self.name)}: parameters is a mapping (a JSON schema)")
        if self.replay_key is not None and not isinstance(self.replay_key, str):
            raise TypeError(f"tool {tool_named(self.name)}: replay_key is a string or None")
        if not self.name:
            raise ValueError(f"a tool's name is a non-empty string, not {tool_named(self.name)}")
        if self.replay_key == "":  # `key` would silently fall back to the default
            raise ValueError(f"tool {tool_named(self.name)}: replay_key is a non-empty string or None")
        if self.replay not in ("safe", "never"):
            raise ValueError(
                f"tool {tool_named(self.name)}: replay is 'safe' or 'never', not {shown(self.replay)}"
            )
        if not callable(self.run):
            raise TypeError(f"tool {tool_named(self.name)}: run must be callable")
        if type(self.idempotent) is not bool:
            raise TypeError(f"tool {tool_named(self.name)}: idempotent is True or False")
        if self.reconcile is not None and not callable(self.reconcile):
            raise TypeError(f"tool {tool_named(self.name)}: reconcile is a function (key, arguments) or None")
        timeout = self.reconcile_timeout
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < timeout <= TIMEOUT_MAX
        ):
            # above TIMEOUT_MAX (inf, 1e300) a thread's wait raises OverflowError: every resume would fail
            raise ValueError(
                f"tool {tool_named(self.name)}: reconcile_timeout is a number of seconds above 0, "
                f"at most threading.TIMEOUT_MAX ({TIMEOUT_MAX:g})"
            )
        if self.idempotent and self.reconcile is not None:
            raise ValueError(
                f"tool {tool_named(self.name)}: idempotent and reconcile exclude each other (an "
                "idempotent tool is run again with its key; reconcile asks about a tool that must not be)"
            )
        self._check_contradictions()
        # in the contract's terms an idempotent tool is safe, under its own replay key
        replay = "safe" if self.idempotent else str.__str__(self.replay)
        object.__setattr__(self, "replay", replay)
        object.__setattr__(self, "reconcile_timeout", float(self.reconcile_timeout))
        if self.reconcile is not None and self.replay == "safe":
            raise ValueError(
                f"tool {tool_named(self.name)}: reconcile is for a tool recovery never runs again "
                "(replay='never')"
            )
        if self.replay_key is not None and self.replay == "never":
            raise ValueError(
                f"tool {tool_named(self.name)}: replay_key names what a replay must match, and a "
                "replay='never' tool is never replayed (declare it replay='safe' or idempotent=True, or "
                "drop replay_key)"
            )

    def _check_contradictions(self) -> None:
        """Refuse declarations that would silently override each other."""
        name = tool_named(self.name)
        if self.idempotent and self.replay is not _REPLAY_NOT_GIVEN and self.replay == "never":
            raise ValueError(
                f"tool {name}: idempotent=True is replay='safe' (replayed with its key), and "
                "replay='never' says it must not be replayed: declare one of them"
            )
        if self.reconcile is None and self.reconcile_timeout != RECONCILE_TIMEOUT:
            raise ValueError(
                f"tool {name}: reconcile_timeout is set without reconcile: it would time out nothing"
            )
        if self.keyed and not _callable_with(self.run, 2):
            raise TypeError(
                f"tool {name}: run cannot be called as run(arguments, key), and a tool declared "
                "idempotent or with reconcile is run with its call's key"
            )
        if self.reconcile is not None and not _callable_with(self.reconcile, 2):
            raise TypeError(f"tool {name}: reconcile cannot be called as reconcile(key, arguments)")

    @property
    def definition(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}

    @property
    def definition_digest(self) -> str:
        return digest(canonical(self.definition))

    @property
    def key(self) -> str:
        """The replay key: `replay_key`, else `NAME:DIGEST` (`idempotent:NAME:DIGEST` for an
        idempotent tool, so that a read and an idempotent effect never replay as each other)."""
        if self.replay_key:
            return self.replay_key
        kind = "idempotent:" if self.idempotent else ""
        return f"{kind}{self.name}:{self.definition_digest[7:19]}"

    @property
    def keyed(self) -> bool:
        """Whether it is run as `run(arguments, key)`: idempotent, or reconciled."""
        return self.idempotent or self.reconcile is not None


class Tools(Mapping[str, Tool]):
    """The declared tools by name, in declaration order."""

    def __init__(self, tools: Iterable[Tool]) -> None:
        self._tools: dict[str, Tool] = {}
        if isinstance(tools, Tool | str | bytes | Mapping) or not isinstance(tools, Iterable):
            raise TypeError(f"Tools takes an iterable of Tool declarations, not {type(tools).__name__}")
        for tool in tools:
            if not isinstance(tool, Tool):
                raise TypeError(f"Tools takes Tool declarations, not {type(tool).__name__}")
            if tool.name in self._tools:
                raise ValueError(f"tool {tool_named(tool.name)} is declared twice")
            self._tools[tool.name] = tool

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def snapshot_tools(self) -> list[dict[str, str]]:
        """The `tools` of a configuration snapshot."""
        return [
            {"name": tool.name, "definitionDigest": tool.definition_digest} for tool in self._tools.values()
        ]

    def current_tools(self) -> list[CurrentTool]:
        """The `tools` of the planner's current configuration."""
        return [
            {
                "name": tool.name,
                "definitionDigest": tool.definition_digest,
                "replay": tool.replay,
                "replayKey": tool.key,
            }
            for tool in self._tools.values()
        ]


@dataclass(frozen=True)
class Configuration:
    """The configuration an attempt is made with (`snapshot`) and the one recovery plans with
    (`current`), both made from the same declarations."""

    snapshot: dict[str, Any]
    current: CurrentConfiguration

    @classmethod
    def of(
        cls,
        tools: Tools,
        *,
        model: str,
        environment: str,
        system_prompt: str = "",
        adapter: str = "sessionlog",
        routing: str = "default",
        output_options: Mapping[str, Any] | None = None,
    ) -> Configuration:
        snapshot = {
            "model": model,
            "systemPromptDigest": digest(canonical(system_prompt)),
            "tools": tools.snapshot_tools(),
            "adapterIdentity": adapter,
            "routingIdentity": routing,
            "outputOptionsDigest": digest(canonical(dict(output_options or {}))),
        }
        current: CurrentConfiguration = {
            "configurationDigest": configuration_digest(snapshot),
            "environmentIdentity": environment,
            "tools": tools.current_tools(),
        }
        return cls(snapshot, current)


# -- what a tool returned, as result text ------------------------------------------------------


def recordable_text(text: str) -> str:
    """The one rule for output that cannot be encoded as UTF-8 (lone surrogates, e.g. a
    non-UTF-8 file name from `os.listdir`): each such character is written as its `\\uXXXX`
    escape, and a note saying so is appended to the content. A `str` subclass (a `StrEnum`
    member) is recorded as the plain string it holds."""
    if issubclass(type(text), str):  # by its type: none of a subclass's methods run
        text = str.__str__(text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        count = sum(1 for char in text if 0xD800 <= ord(char) <= 0xDFFF)
        escaped = text.encode("utf-8", "backslashreplace").decode("utf-8")
        return (
            f"{escaped}\n[sessionlog: {count} character(s) not encodable as UTF-8 written as \\uXXXX escapes]"
        )
    return text


def awaitable(value: object) -> bool:
    """`inspect.isawaitable` by the value's type alone (a tool's output may be anything, and
    none of its code runs here: `isinstance` would believe its `__class__`); False when even its
    type cannot say."""
    try:
        kind = type(value)
        if issubclass(kind, Awaitable):
            return True
        return kind is GeneratorType and bool(value.gi_code.co_flags & inspect.CO_ITERABLE_COROUTINE)  # type: ignore[attr-defined]
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:
        return False


def tool_output(name: str, output: object) -> tuple[str, bool]:
    """What a tool returned, as result text: a string as it is; another JSON value as its
    compact JSON text; anything else (a value of another type, an integer beyond 64 bits, a
    value nested deeper than `MAX_NESTING_DEPTH`, one that holds itself) an error result saying
    what it was, never an exception: the call ran, and its result must be recorded."""
    what = unrecordable(output)
    if what is not None:
        return f"Error: tool {name!r} returned {what}, not text or a JSON value", False
    if issubclass(type(output), str):  # by its type: an object may claim to be a str
        return str.__str__(output), True
    return json.dumps(output, ensure_ascii=False, separators=(",", ":")), True


def unrecordable(output: object) -> str | None:
    """What makes a tool's output neither text nor a JSON value a result can hold (`a value
    of type bytes at [0]`), None when it is one. Read by types alone; a value whose own code
    raises when read (a metaclass's `__eq__`) is named as one that could not be read."""
    try:
        if issubclass(type(output), str):
            return None
        found = first_non_json(output)
        if found is not None:
            path, what = found
            what = f"a value {what}" if what.startswith("of type") else what
            return f"{what} at {path}" if path and path != "the fact" else what  # "the fact": the top
        if _nested_deeper(output, MAX_NESTING_DEPTH):  # where the walk above stops, as orjson does
            return f"a value nested deeper than {MAX_NESTING_DEPTH} arrays or objects"
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as error:  # never raised after the tool ran: its result must be recorded
        return f"a value that could not be read ({type_named(error)} reading it)"
    return None


def _nested_deeper(value: object, limit: int) -> bool:
    """Whether `value` holds arrays or objects nested deeper than `limit` (a value that holds
    itself does), found without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is dict or kind is list:
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if kind is dict else item))
    return False
