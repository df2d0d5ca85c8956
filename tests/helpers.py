"""Shared helpers for the executor tests: a history validator and scripted responders."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from treellm import ModelRequest, ModelTurn


def assert_valid_history(messages: Sequence[dict[str, Any]]) -> None:
    """As real servers check: every assistant tool call is answered by exactly one tool message."""
    pending: dict[str, int] = {}
    for i, message in enumerate(messages):
        role = message["role"]
        if role == "tool":
            call_id = message["tool_call_id"]
            assert call_id in pending, f"message {i}: tool message answers no open call {call_id!r}"
            del pending[call_id]
            continue
        assert not pending, f"message {i} ({role}) comes before answers to {sorted(pending)}"
        if role == "assistant":
            ids = [c["id"] for c in message.get("tool_calls") or []]
            assert len(ids) == len(set(ids)), f"message {i}: duplicate tool call ids {ids}"
            pending = dict.fromkeys(ids, i)
    assert not pending, f"unanswered tool calls at the end: {sorted(pending)}"


def last_tool_results(request: ModelRequest) -> list[str]:
    """Contents of the tool messages after the last assistant message."""
    out: list[str] = []
    for message in reversed(request.messages):
        if message["role"] != "tool":
            break
        out.append(str(message["content"]))
    return list(reversed(out))


def by_depth(turns: dict[int, ModelTurn], default: ModelTurn | None = None) -> Callable[[ModelRequest], ModelTurn]:
    """A responder that answers by the requesting node's depth."""

    def respond(request: ModelRequest) -> ModelTurn:
        if request.depth in turns:
            return turns[request.depth]
        return default or ModelTurn(text="done")

    return respond


def recorded_requests(path: Path) -> list[TracesData]:
    """The OTLP export requests of a recorded framework trace (``tests/data/frameworks/*.pb``):
    each a 4-byte big-endian length, then a serialized ``TracesData``."""
    data = path.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        out.append(TracesData.FromString(data[pos + 4 : pos + 4 + size]))
        pos += 4 + size
    return out
