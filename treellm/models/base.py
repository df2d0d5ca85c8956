"""The ``ChatModel`` seam: requests, streamed deltas, and assembling them into a turn.

Contract of :class:`ChatModel`:

- ``stream(request)`` returns an async iterator of :data:`ModelDelta` values,
  called from the run's event loop; it never blocks that loop.
- It raises :class:`~treellm.errors.ModelError` when no turn can be had (after
  its own retries); the executor records that on the node (the model's fault is
  data). Any other exception is a bug and propagates.
- Tool-call fragments arrive as providers send them: with an ``index`` (OpenAI),
  or whole calls with no index (some OpenAI-compatible servers); :func:`assemble`
  turns either into :class:`ToolCall` values in order.

Messages are OpenAI chat-format dicts: the one wire format at this edge.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from treellm.signature import json_text

__all__ = [
    "ChatModel",
    "Message",
    "ModelDelta",
    "ModelRequest",
    "ModelTurn",
    "TextDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolSpec",
    "Usage",
    "UsageDelta",
    "arguments_text",
    "assemble",
]

Message = dict[str, Any]
"""One OpenAI chat-format message (``role``, ``content``, ``tool_calls``, ``tool_call_id``)."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens a model turn consumed, when the provider reports them."""

    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call as the model asked for it.

    ``arguments`` is a parsed mapping or the raw text the model sent (raw text
    may be malformed JSON: the executor turns it into an error result).
    """

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True, slots=True)
class ModelTurn:
    """What the model answered: text and/or tool calls, and its token usage."""

    text: str = ""
    tool_calls: Sequence[ToolCall] = ()
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool offered to the model (OpenAI function-tool shape)."""

    name: str
    description: str
    parameters: Mapping[str, Any]

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One request to the model for one node.

    ``purpose`` is ``"think"`` for a ThinkNode's turn and ``"collapse"`` when a
    CollapseNode asks for a dense summary (then ``tools`` is empty).
    """

    messages: Sequence[Message]
    tools: Sequence[ToolSpec]
    node_id: str
    depth: int
    purpose: Literal["think", "collapse"] = "think"
    skill_stack: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A fragment of a tool call. Any field may be missing from one fragment."""

    index: int | None = None
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class UsageDelta:
    usage: Usage


ModelDelta = TextDelta | ToolCallDelta | UsageDelta


@runtime_checkable
class ChatModel(Protocol):
    """A chat model that streams deltas (see the module docstring for the contract)."""

    @property
    def model_name(self) -> str:
        """The model's name as telemetry reports it (``gen_ai.request.model``)."""
        ...

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        """Stream one turn's deltas; raise ModelError when no turn can be had."""
        ...


def arguments_text(arguments: Mapping[str, Any] | str) -> str:
    """Arguments as the text a provider would send (raw text is kept as it is); a value of
    any depth, never a ``RecursionError`` (a deep one is then rejected as deep text is)."""
    if isinstance(arguments, str):
        return arguments
    return json_text(arguments)


@dataclass(slots=True)
class _Partial:
    id: str | None
    name: str
    arguments: list[str]


def assemble(deltas: Iterable[ModelDelta]) -> ModelTurn:
    """Assemble streamed deltas into one :class:`ModelTurn`.

    Fragments with an ``index`` are joined by index. A fragment with no index
    starts a new call when it carries a name or an id different from the last
    call's id, and otherwise continues the last call. Argument text stays raw:
    parsing is the executor's job (through ``parse_arguments``).
    """
    text: list[str] = []
    usage: Usage | None = None
    calls: list[_Partial] = []
    by_index: dict[int, _Partial] = {}
    for delta in deltas:
        if isinstance(delta, TextDelta):
            text.append(delta.text)
        elif isinstance(delta, UsageDelta):
            usage = delta.usage if usage is None else usage + delta.usage
        elif delta.index is not None:
            partial = by_index.get(delta.index)
            if partial is None:
                partial = _Partial(delta.id, delta.name or "", [])
                by_index[delta.index] = partial
                calls.append(partial)
            else:
                partial.id = partial.id or delta.id
                if delta.name and not partial.name:
                    partial.name = delta.name
            partial.arguments.append(delta.arguments)
        else:
            last = calls[-1] if calls else None
            starts_new = (
                last is None
                or bool(delta.name)
                or (delta.id is not None and last.id is not None and delta.id != last.id)
            )
            if starts_new or last is None:
                calls.append(_Partial(delta.id, delta.name or "", [delta.arguments]))
            else:
                last.id = last.id or delta.id
                last.arguments.append(delta.arguments)
    tool_calls = tuple(ToolCall(c.name, "".join(c.arguments), c.id) for c in calls)
    return ModelTurn("".join(text), tool_calls, usage)
