"""Deep Python objects as a tool call's arguments become an error result of that call, as deep
JSON text does (issue 22, point 5): never a ``RecursionError`` out of ``run()``."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from treellm import ModelTurn, ScriptedModel, Tool, ToolCall, ToolNode, TreeExecutor
from treellm.models.base import arguments_text
from treellm.signature import _walk_json, json_text
from treellm.telemetry import semconv as sc


def _dict(depth: int) -> dict[str, Any]:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return dict(value)


def _mixed(depth: int) -> dict[str, Any]:
    """Dicts and lists in turn: {"a": [{"a": [... 1 ...]}]}."""
    value: Any = 1
    for level in range(depth):
        value = {"a": value} if level % 2 else [value]
    return {"a": value}


def _text(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


@pytest.fixture
def exporter() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield provider, memory
    provider.shutdown()


def _run(arguments: Any, provider: TracerProvider) -> tuple[Any, ToolNode, list[dict[str, Any]], ScriptedModel]:
    calls: list[dict[str, Any]] = []
    model = ScriptedModel([ModelTurn(tool_calls=[ToolCall("t", arguments, id="c1")]), ModelTurn(text="done")])
    tool = Tool("t", "a tool", handler=lambda args: calls.append(args) or "ran")
    result = TreeExecutor(model, [tool], tracer_provider=provider).run("go")
    node = next(n for n in result.nodes if isinstance(n, ToolNode))
    return result, node, calls, model


@pytest.mark.parametrize("depth", [1_000, 5_000, 100_000])
@pytest.mark.parametrize("make", [_dict, _mixed], ids=["dicts", "dicts-and-lists"])
def test_a_deep_python_object_as_arguments_is_an_error_result_of_that_call(
    exporter: tuple[TracerProvider, InMemorySpanExporter], depth: int, make: Any
) -> None:
    provider, memory = exporter
    result, node, calls, model = _run(make(depth), provider)
    assert result.outcome == "completed" and result.answer == "done"
    assert node.status == "failed" and node.error_type == "arguments_too_large"
    assert node.result is not None and node.result.startswith("Error:")
    assert "nest deeper than 64 levels" in node.result
    assert calls == []  # never run
    assert len(model.requests) == 2  # the model got the error result and answered
    span = next(s for s in memory.get_finished_spans() if (s.attributes or {}).get(sc.NODE_ID) == node.id)
    assert dict(span.attributes or {})[sc.NODE_STATUS] == "failed"


def test_a_deep_dict_and_the_same_depth_as_json_text_get_the_same_error_result(
    exporter: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, _ = exporter
    _, from_dict, _, _ = _run(_dict(1_000), provider)
    _, from_text, _, _ = _run(_text(1_000), provider)
    assert from_dict.result == from_text.result
    assert from_dict.raw_args == from_text.raw_args == _text(1_000)
    assert from_dict.signature == from_text.signature


def test_a_shallow_dict_still_runs(exporter: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, _ = exporter
    _, node, calls, _ = _run(_dict(64), provider)
    assert node.status == "completed" and len(calls) == 1


# -- json_text: json.dumps's text at any depth ----------------------------------------------------------------


SAMPLES: list[Any] = [
    {},
    [],
    {"a": [], "b": {}, "c": [[], [{}]]},
    {"z": 1, "a": 2, "m": [3, 2, 1]},  # key order kept, never sorted
    {"text": 'é \u2028 \U0001f600 "quoted" \\ \n\t\x00'},
    {"n": [0, -1, 2**70, 1.5, -0.0, 1e300, 1e-7, True, False, None]},
    {1: "int", 2.5: "float", False: "false", None: "null"},
    {True: "true"},
    ("tuple", ("inner",)),
    "bare text",
    7,
    {"nan": math.nan, "inf": [math.inf, -math.inf]},
]


@pytest.mark.parametrize("value", SAMPLES, ids=range(len(SAMPLES)))
def test_the_walk_writes_what_json_dumps_writes(value: Any) -> None:
    expected = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert _walk_json(value) == json_text(value) == expected
    if not isinstance(value, str):  # text is kept as the model sent it
        assert arguments_text(value) == expected


def test_a_value_deeper_than_the_stack_is_written_whole() -> None:
    assert json_text(_dict(100_000)) == _text(100_000)
    deep_list: Any = []
    for _ in range(50_000):
        deep_list = [deep_list, 0]
    assert json_text(deep_list) == "[" * 50_000 + "[]" + ",0]" * 50_000


def test_the_walk_refuses_what_json_dumps_refuses() -> None:
    circular: dict[str, Any] = {}
    circular["self"] = [circular]
    with pytest.raises(ValueError, match="Circular reference"):
        _walk_json(circular)
    shared = [1]
    assert _walk_json({"a": shared, "b": shared}) == '{"a":[1],"b":[1]}'  # shared is not circular
    with pytest.raises(TypeError):
        _walk_json({"a": object()})
    with pytest.raises(TypeError, match="keys must be"):
        _walk_json({(1, 2): "tuple key"})
