"""The OpenAI Agents SDK's items and sessionlog's canonical messages, both ways
(`openai_agents`): what is carried, what is refused, what is dropped and counted.

The canonical contract carries text: a user message, an assistant message (its text and its
function calls), a tool result. An SDK item holding more is one of the `KINDS`; for each kind the
caller chooses `refuse` (the default: `UnsupportedItemError`, nothing written) or `drop` (the
part is left out and counted in `Carry.dropped`). Nothing is lost silently.

Fields the SDK makes anew on each response (item `id`, `status`, empty `annotations` and
`logprobs`) are not stored; on read a message item has `status` `completed`, empty annotations
and logprobs and no `id`, a function call no `id` (the Responses API accepts input items
without ids; an invented id could name no server item).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from ..core.errors import SessionLogError, name_shown, shown
from ..tools import unrecordable

Choice = Literal["refuse", "drop"]

KINDS = ("image", "file", "audio", "refusal", "annotations", "reasoning", "hosted_tool", "other")
"""What the canonical messages cannot carry: `image`, `file` and `audio` parts (of a user message
or a tool's output), an assistant's `refusal` part, non-empty `annotations` (citations) of its
text, `reasoning` items, `hosted_tool` items (web and file search, computer, code interpreter,
image generation, MCP, shell, patch and custom tool calls and their outputs) and any `other`
item type."""

HOSTED_TOOL_TYPES = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "computer_call",
        "computer_call_output",
        "code_interpreter_call",
        "image_generation_call",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "custom_tool_call",
        "custom_tool_call_output",
        "tool_search_call",
        "tool_search_output",
    }
)

_PART_KINDS = {"input_image": "image", "input_file": "file", "input_audio": "audio", "refusal": "refusal"}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


class UnsupportedItemError(SessionLogError, ValueError):
    """An SDK item holds content the canonical messages cannot carry, and its kind is not set
    to `drop`: nothing of it was written. `kind` is one of `KINDS`, `where` names the item."""

    def __init__(self, kind: str, where: str, what: str) -> None:
        self.kind, self.where = kind, where
        super().__init__(
            f"{where}: {what}, which sessionlog's messages cannot carry (kind {kind!r}); "
            f"pass carry={{{kind!r}: 'drop'}} to leave it out (counted in session.dropped)"
        )


class UncarriedArgumentsError(SessionLogError, ValueError):
    """A function call whose arguments the SDK reads as a JSON object (it would run the tool)
    but canonical JSON cannot hold (NaN, Infinity, an integer beyond 64 bits, a lone
    surrogate): its intent cannot be written, so the run ends before the tool could run."""


@dataclass
class Carry:
    """The caller's choice for each kind (`refuse` unless given) and what was dropped so far."""

    choices: Mapping[str, Choice] = field(default_factory=dict)
    dropped: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        for kind, choice in self.choices.items():
            if kind not in KINDS:
                raise ValueError(
                    f"carry: unknown kind {name_shown(str(kind))} (the kinds: {', '.join(KINDS)})"
                )
            if choice not in ("refuse", "drop"):
                wrong = name_shown(choice) if isinstance(choice, str) else shown(choice)
                raise ValueError(f"carry[{kind!r}] is 'refuse' or 'drop', not {wrong}")

    def check(self, kind: str, where: str, what: str) -> None:
        """Refuse (raise) or note the drop of one part of `kind`; call `count` once written."""
        if self.choices.get(kind, "refuse") == "refuse":
            raise UnsupportedItemError(kind, where, what)

    def count(self, kinds: Iterable[str]) -> None:
        self.dropped.update(kinds)


def _get(item: Any, key: str, default: Any = None) -> Any:
    if isinstance(item, Mapping):
        return item.get(key, default)
    return getattr(item, key, default)


def as_dict(item: Any) -> dict[str, Any]:
    """An SDK item (a TypedDict or a pydantic model) as a plain dict."""
    if isinstance(item, Mapping):
        return dict(item)
    dump = getattr(item, "model_dump", None)
    if dump is not None:
        return dict(dump(exclude_unset=True))
    raise TypeError(f"an SDK item is a mapping or a pydantic model, not {type(item).__name__}")


def _text_of(parts: Any, carry: Carry, where: str, drops: list[str]) -> str:
    """The text of a content list; other parts refused or dropped (noted in `drops`)."""
    if isinstance(parts, str):
        return parts
    texts = []
    for position, part in enumerate(parts or ()):
        kind_name = _get(part, "type")
        if kind_name in _TEXT_PARTS:
            texts.append(str(_get(part, "text", "")))
            if _get(part, "annotations"):
                carry.check("annotations", f"{where}.content[{position}]", "annotations (citations)")
                drops.append("annotations")
            continue
        kind = _PART_KINDS.get(str(kind_name), "other")
        carry.check(kind, f"{where}.content[{position}]", f"a {kind_name!s} part")
        drops.append(kind)
    return "".join(texts)


def prompt_text(items: Sequence[Any], carry: Carry) -> tuple[str, list[str]]:
    """The user message a run starts with: one SDK input item of role `user` (its text, or its
    text parts); the parts dropped. Anything else is refused (`UnsupportedItemError`)."""
    if len(items) != 1 or _get(items[0], "role") != "user" or _get(items[0], "type", "message") != "message":
        kinds = [str(_get(item, "type") or _get(item, "role")) for item in items]
        raise UnsupportedItemError(
            "other",
            "add_items (the run's input)",
            f"{len(items)} item(s) {kinds} instead of one user message",
        )
    drops: list[str] = []
    return _text_of(_get(items[0], "content"), carry, "input[0]", drops), drops


def arguments_of(raw: Any, where: str) -> Any:
    """A function call's arguments as the log keeps them, read as the SDK reads them before it
    runs a tool (`json.loads`, an empty string being `{}`): text that is no JSON object stays as
    it is (the log settles the call as `invalidArguments`, and the SDK does not run the tool);
    an object the SDK would run with but canonical JSON cannot hold is refused."""
    if raw == "":
        return "{}"
    try:
        read = json.loads(raw)
    except (TypeError, ValueError, RecursionError):
        return raw
    if type(read) is dict:
        try:
            kept = orjson.loads(raw)
        except orjson.JSONDecodeError:
            kept = None
        if not _same(read, kept):  # what the log would record is not what the tool would get
            raise UncarriedArgumentsError(
                f"{where}: arguments the SDK would run the tool with, which canonical JSON cannot hold "
                "(NaN, Infinity, an integer beyond 64 bits or a lone surrogate): the run ends, the tool "
                "did not run"
            ) from None
    return raw


def _same(read: Any, kept: Any) -> bool:
    """Whether two parsed JSON values are the same, type for type (orjson reads an integer
    beyond 64 bits as a float: equal in value, perhaps, but not what the SDK passes the tool)."""
    if type(read) is not type(kept):
        return False
    if isinstance(read, dict):
        return read.keys() == kept.keys() and all(_same(read[key], kept[key]) for key in read)
    if isinstance(read, list):
        return len(read) == len(kept) and all(_same(a, b) for a, b in zip(read, kept, strict=True))
    return bool(read == kept)


@dataclass
class Answer:
    """A model response in sessionlog's terms: its text, its function calls (`{id, name,
    arguments}`), the kinds dropped."""

    content: str | None
    calls: list[dict[str, Any]]
    drops: list[str]


def answer_of(output: Sequence[Any], carry: Carry) -> Answer:
    """A `ModelResponse.output`: at most one assistant message (its text), any function calls;
    every other item refused or dropped (`Carry`)."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    drops: list[str] = []
    messages = 0
    for position, item in enumerate(output):
        kind_name = _get(item, "type")
        where = f"response.output[{position}]"
        if kind_name == "message":
            messages += 1
            if messages > 1:
                carry.check("other", where, "a second assistant message in one response")
                drops.append("other")
                continue
            texts.append(_text_of(_get(item, "content"), carry, where, drops))
        elif kind_name == "function_call":
            call_id, name = str(_get(item, "call_id")), str(_get(item, "name"))
            calls.append(
                {"id": call_id, "name": name, "arguments": arguments_of(_get(item, "arguments"), where)}
            )
        else:
            kind = (
                "reasoning"
                if kind_name == "reasoning"
                else "hosted_tool"
                if kind_name in HOSTED_TOOL_TYPES
                else "other"
            )
            carry.check(kind, where, f"a {kind_name!s} item")
            drops.append(kind)
    return Answer("".join(texts) if messages else None, calls, drops)


def output_text(output: Any, carry: Carry, where: str) -> tuple[str, list[str]]:
    """A function call output as the tool result's text: a string as it is, a list of parts as
    its text parts (others refused or dropped)."""
    if issubclass(type(output), str):  # by its type: a StrEnum member is the string it holds
        return str.__str__(output), []
    drops: list[str] = []
    if issubclass(type(output), list | tuple):
        return _text_of(output, carry, where, drops), drops
    what = unrecordable(output)
    if what is not None:  # the tool ran: its result is recorded, saying what it returned
        return f"Error: {where} is {what}, not text or a JSON value", []
    return orjson.dumps(output).decode(), []


# -- canonical messages to SDK items ---------------------------------------------------------


def sdk_items(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Canonical messages as the SDK's items, in the SDK's order: a user message; an assistant
    message (when it has text), then its function calls; their outputs in the calls' order."""
    items: list[dict[str, Any]] = []
    order: dict[str, int] = {}
    outputs: list[tuple[int, dict[str, Any]]] = []

    def flush() -> None:
        items.extend(item for _, item in sorted(outputs, key=lambda pair: pair[0]))
        outputs.clear()

    for message in messages:
        role = message["role"]
        if role == "tool":
            call_id = message["tool_call_id"]
            item = {"call_id": call_id, "output": message["content"], "type": "function_call_output"}
            outputs.append((order.get(call_id, len(order)), item))
            continue
        flush()
        if role == "user":
            items.append({"content": message["content"], "role": "user"})
        elif role == "assistant":
            if message.get("content"):
                items.append(assistant_item(message["content"]))
            order = {}
            for position, call in enumerate(message.get("tool_calls") or ()):
                function = call["function"]
                order[call["id"]] = position
                items.append(
                    {
                        "arguments": function["arguments"],
                        "call_id": call["id"],
                        "name": function["name"],
                        "type": "function_call",
                    }
                )
    flush()
    return items


def assistant_item(text: str) -> dict[str, Any]:
    return {
        "content": [{"annotations": [], "text": text, "type": "output_text", "logprobs": []}],
        "role": "assistant",
        "status": "completed",
        "type": "message",
    }
