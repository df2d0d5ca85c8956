"""Shared helpers of the tests: a history validator, scripted responders, recorded requests and the
real texts of the trajectories of ``tests/data``."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import duckdb
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


def real_trajectory_texts() -> list[str]:
    """Every string of the real SWE-agent and mini-swe-agent trajectories of ``tests/data`` (8
    characters or more), and each as JSON text, as a message or tool result is stored."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str):
            found.add(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    data = Path(__file__).parent / "data"
    for path in sorted([*data.glob("swe-agent/*.traj"), *data.glob("mini-swe-agent/*/*.traj.json")]):
        walk(json.loads(path.read_text(encoding="utf-8")))
    texts = sorted(text for text in found if len(text) >= 8)
    return texts + [json.dumps(text) for text in texts]


def flagged_by_sql(texts: Sequence[str], predicate: Callable[[str], str]) -> set[int]:
    """The positions of ``texts`` where DuckDB finds the SQL ``predicate(column)`` true: for a
    check that a prefilter written in SQL lets through every text its Python rule needs."""
    con = duckdb.connect()
    try:
        con.execute("CREATE TABLE t (i INTEGER, v VARCHAR)")
        con.executemany("INSERT INTO t VALUES (?, ?)", list(enumerate(texts)))
        return {i for (i,) in con.execute(f"SELECT i FROM t WHERE {predicate('v')}").fetchall()}
    finally:
        con.close()
