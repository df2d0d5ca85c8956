"""Hostile inputs to the engine: each is the model's or a tool's fault, so each is data.

Arguments nested 100,000 deep or 10 MB long, numbers no double holds, a handler that
hangs (sync or async), a result that cannot become text, an async observer: ``run()``
returns, the model gets an error result saying what went wrong, and the call is still
recorded as a node, events and a span.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import assert_valid_history, last_tool_results
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from treellm import (
    ConfigError,
    LoopGuard,
    ModelTurn,
    ScriptedModel,
    Tool,
    ToolCall,
    ToolDefinitionError,
    ToolNode,
    TreeConfig,
    TreeExecutor,
    canonical_json,
)
from treellm.engine.events import Event, EventType, ToolError
from treellm.signature import arguments_problem
from treellm.telemetry import semconv as sc

TINY = 0.05
"""The timeout of the hung-handler tests: the only real wait in this file."""


class Spans:
    """A real SDK pipeline into memory (the pattern of tests/test_telemetry.py)."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def executor(self, model: ScriptedModel, tools: list[Tool], config: TreeConfig | None = None) -> TreeExecutor:
        return TreeExecutor(model, tools, config, tracer_provider=self.provider, sleep=_no_sleep)

    def tool_span(self, node_id: str) -> ReadableSpan:
        spans = [s for s in self.exporter.get_finished_spans() if (s.attributes or {}).get(sc.NODE_ID) == node_id]
        assert len(spans) == 1, [s.name for s in self.exporter.get_finished_spans()]
        return spans[0]


@pytest.fixture
def spans() -> Iterator[Spans]:
    s = Spans()
    yield s
    s.provider.shutdown()


async def _no_sleep(_: float) -> None:
    return None


def _one_call(arguments: str, name: str = "t") -> ScriptedModel:
    return ScriptedModel([ModelTurn(tool_calls=[ToolCall(name, arguments, id="c1")]), ModelTurn(text="done")])


def _counting_tool(name: str = "t") -> tuple[Tool, list[dict[str, Any]]]:
    calls: list[dict[str, Any]] = []

    def handler(args: dict[str, Any]) -> str:
        calls.append(args)
        return "ran"

    return Tool(name, "a tool", handler=handler), calls


def _only_tool_node(result: Any) -> ToolNode:
    nodes = [n for n in result.nodes if isinstance(n, ToolNode)]
    assert len(nodes) == 1
    return nodes[0]


def _tool_events(result: Any, node_id: str) -> list[EventType]:
    return [e.type for e in result.events if e.node_id == node_id and e.type.startswith("tool:")]


def _assert_failed_call(result: Any, spans: Spans, model: ScriptedModel, error_type: str, says: str) -> ToolNode:
    """run() returned; the model got the error; the node, its events and its span exist."""
    assert result.outcome == "completed"
    node = _only_tool_node(result)
    assert node.status == "failed"
    assert node.error_type == error_type
    assert node.result is not None and node.result.startswith("Error:") and says in node.result
    assert last_tool_results(model.requests[1]) == [node.result]
    assert_valid_history(model.requests[1].messages)
    assert _tool_events(result, node.id) == [EventType.TOOL_START, EventType.TOOL_ERROR]
    error = next(e.payload for e in result.events if isinstance(e.payload, ToolError))
    assert error.error_type == error_type
    span = spans.tool_span(node.id)
    assert span.name == "execute_tool t"
    attributes = dict(span.attributes or {})
    assert attributes[sc.NODE_STATUS] == "failed"
    assert attributes[sc.ERROR_TYPE] == error_type
    assert spans.provider  # the run's other spans are there too
    names = [s.name for s in spans.exporter.get_finished_spans()]
    assert names.count("invoke_agent agent") == 1 and names.count("chat scripted") == 2
    return node


def _nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


# -- 1. deep and huge arguments -------------------------------------------------------------------


@pytest.mark.parametrize("depth", [65, 900, 1_000, 100_000])
def test_deeply_nested_arguments_are_an_error_result_never_an_exception(spans: Spans, depth: int) -> None:
    tool, calls = _counting_tool()
    model = _one_call(_nested(depth))
    result = spans.executor(model, [tool]).run("go")
    node = _assert_failed_call(result, spans, model, "arguments_too_large", "nest deeper than 64 levels")
    assert calls == []  # never run
    assert node.attempts == 0
    assert node.raw_args == _nested(depth)  # the node keeps what the model sent
    assert node.signature.startswith("t:")


def test_arguments_at_the_depth_limit_still_run(spans: Spans) -> None:
    tool, calls = _counting_tool()
    result = spans.executor(_one_call(_nested(64)), [tool]).run("go")
    assert _only_tool_node(result).status == "completed"
    assert len(calls) == 1


def test_a_10_mb_argument_string_is_an_error_result_and_telemetry_sees_a_preview(spans: Spans) -> None:
    tool, calls = _counting_tool()
    arguments = json.dumps({"text": "x" * 10_000_000})
    model = _one_call(arguments)
    result = spans.executor(model, [tool]).run("go")
    node = _assert_failed_call(
        result, spans, model, "arguments_too_large", "10,000,012 bytes, above the limit of 1,048,576"
    )
    assert calls == []
    assert len(str(dict(spans.tool_span(node.id).attributes or {}).get(sc.GEN_AI_TOOL_CALL_ARGUMENTS, ""))) < 5000
    call_chunk = next(c for c in result.chunks if c.type == "toolCall")
    assert len(call_chunk.content) < 3000


def test_the_same_rejected_call_twice_counts_as_a_repeat_on_its_raw_text(spans: Spans) -> None:
    tool, _ = _counting_tool()
    deep = _nested(200)
    model = ScriptedModel(
        [
            ModelTurn(tool_calls=[ToolCall("t", deep, id="c1")]),
            ModelTurn(tool_calls=[ToolCall("t", deep, id="c2"), ToolCall("t", _nested(201), id="c3")]),
            ModelTurn(text="done"),
        ]
    )
    result = spans.executor(model, [tool]).run("go")
    assert [p.call_id for p in result.pruned_calls] == ["c2"]  # the other deep call is a different call
    assert len([n for n in result.nodes if isinstance(n, ToolNode)]) == 2


def test_limits_are_settings(spans: Spans) -> None:
    tool, calls = _counting_tool()
    config = TreeConfig(max_argument_depth=2, max_argument_bytes=20)
    model = ScriptedModel(
        [
            ModelTurn(tool_calls=[ToolCall("t", '{"a": {"b": 1}}', id="c1"), ToolCall("t", '{"a": [[1]]}', id="c2")]),
            ModelTurn(tool_calls=[ToolCall("t", json.dumps({"a": "y" * 30}), id="c3")]),
            ModelTurn(text="done"),
        ]
    )
    result = spans.executor(model, [tool], config).run("go")
    assert calls == [{"a": {"b": 1}}]
    assert last_tool_results(model.requests[1])[1].startswith("Error: the arguments of t were rejected: they nest")
    assert "above the limit of 20" in last_tool_results(model.requests[2])[0]
    assert result.outcome == "completed"


def test_a_deep_task_complete_answer_is_kept_as_its_raw_text(spans: Spans) -> None:
    deep = '{"result": ' + "[" * 5_000 + "]" * 5_000 + "}"
    model = ScriptedModel([ModelTurn(tool_calls=[ToolCall("task_complete", deep)])])
    result = spans.executor(model, []).run("go")
    assert result.outcome == "completed"
    assert result.answer == deep


def test_numbers_no_double_holds_reach_the_handler_as_infinities(spans: Spans) -> None:
    tool, calls = _counting_tool()
    arguments = '{"big": 1e999, "digits": ' + "9" * 5_000 + ', "small": -1e400, "exact": 12345678901234567890}'
    model = _one_call(arguments)
    result = spans.executor(model, [tool]).run("go")
    assert result.outcome == "completed"
    node = _only_tool_node(result)
    assert node.status == "completed"
    assert calls[0]["big"] == math.inf and calls[0]["digits"] == math.inf and calls[0]["small"] == -math.inf
    assert calls[0]["exact"] == 12345678901234567890.0
    assert spans.tool_span(node.id).attributes is not None


def test_a_tool_that_echoes_huge_numbers_back_still_answers() -> None:
    model = _one_call('{"n": ' + "1" * 5_000 + "}")
    tool = Tool("t", "echo", handler=lambda args: {"n": args["n"], "int": 10**5000})
    result = TreeExecutor(model, [tool], telemetry=False).run("go")
    node = _only_tool_node(result)
    assert result.outcome == "completed"
    assert node.status == "failed" and node.error_type == "unserializable_result"  # 10**5000 has no JSON text


def test_canonical_json_and_the_limit_check_never_recurse() -> None:
    value: object = 1
    for _ in range(100_000):
        value = {"a": [value]}
    assert canonical_json(value) == '{"a":[' * 100_000 + "1" + "]}" * 100_000
    assert arguments_problem(value, max_depth=64, max_bytes=1 << 20) is not None
    assert arguments_problem("[" * 100_000, max_depth=64, max_bytes=1 << 20) is not None
    assert arguments_problem('{"s": "' + "[" * 100 + '"}', max_depth=64, max_bytes=1 << 20) is None  # in a string
    assert arguments_problem({"a": "é" * 600_000}, max_depth=64, max_bytes=1 << 20) is not None  # UTF-8 bytes


# -- 2. timeouts ------------------------------------------------------------------------------------


def test_a_hung_sync_handler_times_out_and_its_thread_is_abandoned(spans: Spans) -> None:
    release, started, finished = threading.Event(), threading.Event(), threading.Event()
    calls = 0

    def hang(_: dict[str, Any]) -> str:
        nonlocal calls
        calls += 1
        started.set()
        release.wait()
        finished.set()
        return "late"

    model = _one_call("{}")
    config = TreeConfig(retry_max_attempts=3)
    try:
        result = spans.executor(model, [Tool("t", "hangs", handler=hang, timeout_s=TINY)], config).run("go")
        node = _assert_failed_call(result, spans, model, "timeout", f"tool t timed out after {TINY:g} s")
        assert node.attempts == 1 and calls == 1  # a timeout is never retried
        assert started.is_set() and not finished.is_set()  # run() returned while the handler still hangs
        worker = next(t for t in threading.enumerate() if t.name == "treellm-tool-t")
        assert worker.daemon  # never keeps the process alive
    finally:
        release.set()
    worker.join(timeout=10)  # its late result goes to a closed loop: dropped without an error
    assert not worker.is_alive() and finished.is_set()


def test_a_hung_async_handler_times_out_and_is_cancelled(spans: Spans) -> None:
    cancelled = threading.Event()

    async def hang(_: dict[str, Any]) -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    model = _one_call("{}")
    result = spans.executor(model, [Tool("t", "hangs", handler=hang)], TreeConfig(tool_timeout_s=TINY)).run("go")
    _assert_failed_call(result, spans, model, "timeout", "timed out after")
    assert cancelled.is_set()


def test_the_limits_file_timeout_wins_over_the_tools_own(spans: Spans) -> None:
    async def hang(_: dict[str, Any]) -> str:
        await asyncio.Event().wait()
        return "never"

    config = TreeConfig.from_mapping({"tools": {"t": {"timeout_s": TINY}}})
    model = _one_call("{}")
    result = spans.executor(model, [Tool("t", "hangs", handler=hang, timeout_s=3600)], config).run("go")
    _assert_failed_call(result, spans, model, "timeout", f"after {TINY:g} s")


def test_fast_handlers_are_unaffected_by_a_timeout(spans: Spans) -> None:
    tool, calls = _counting_tool()
    result = spans.executor(_one_call('{"q": 1}'), [tool], TreeConfig(tool_timeout_s=60)).run("go")
    assert _only_tool_node(result).result == "ran" and calls == [{"q": 1}]


def test_timeout_settings_are_validated() -> None:
    for bad in (0, -1, True, "10", math.nan):
        with pytest.raises(ConfigError, match="tool_timeout_s: expected a number of seconds > 0"):
            TreeConfig(tool_timeout_s=bad)
        with pytest.raises(ToolDefinitionError, match="timeout_s: expected a number of seconds > 0"):
            Tool("t", "d", handler=lambda a: "", timeout_s=bad)
        with pytest.raises(ConfigError, match=r"tools\.t\.timeout_s"):
            TreeConfig.from_mapping({"tools": {"t": {"timeout_s": bad}}})
    assert TreeConfig(tool_timeout_s=None).tool_timeout_s is None
    assert Tool("t", "d", handler=lambda a: "", timeout_s=math.inf).timeout_s == math.inf
    for bad_depth in (0, 257, 1.5):
        with pytest.raises(ConfigError, match="max_argument_depth: expected an integer from 1 to 256"):
            TreeConfig(max_argument_depth=bad_depth)
    with pytest.raises(ConfigError, match="max_argument_bytes"):
        TreeConfig(max_argument_bytes=0)


# -- 3. results that cannot become text ------------------------------------------------------------


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def _circular() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


@pytest.mark.parametrize(
    "make", [_circular, lambda: {(1, 2): "tuple key"}, _Unprintable, lambda: {"deep": _deep_list(5_000)}]
)
def test_an_unserialisable_result_runs_the_handler_once_and_is_an_error_result(spans: Spans, make: Any) -> None:
    calls = 0

    def handler(_: dict[str, Any]) -> Any:
        nonlocal calls
        calls += 1
        return make()

    model = _one_call("{}")
    config = TreeConfig(retry_max_attempts=3)
    result = spans.executor(model, [Tool("t", "odd", handler=handler)], config).run("go")
    node = _assert_failed_call(result, spans, model, "unserializable_result", "returned a value that cannot be sent")
    assert calls == 1
    assert node.attempts == 1
    assert result.stats.retries == 0


def _deep_list(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def test_a_handler_that_raises_is_still_retried(spans: Spans) -> None:
    calls = 0

    def flaky(_: dict[str, Any]) -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise OSError("try again")
        return "fine"

    result = spans.executor(_one_call("{}"), [Tool("t", "flaky", handler=flaky)], TreeConfig()).run("go")
    assert calls == 3 and _only_tool_node(result).result == "fine"


# -- 4. async observers --------------------------------------------------------------------------------


async def _async_observer(event: Event) -> None:
    return None


class _AsyncCallable:
    async def __call__(self, event: Event) -> None:
        return None


@pytest.mark.parametrize("observer", [_async_observer, _AsyncCallable()])
def test_an_async_observer_is_refused_when_attached(observer: Any) -> None:
    tool, _ = _counting_tool()
    with pytest.raises(ConfigError, match="never awaited"):
        TreeExecutor(_one_call("{}"), [tool], observers=[observer], telemetry=False)
    executor = TreeExecutor(_one_call("{}"), [tool], telemetry=False)
    with pytest.raises(ConfigError, match="async observer"):
        executor.add_observer(observer)
    assert executor.observers == []


def test_a_plain_observer_returning_a_coroutine_is_detached_and_the_run_goes_on(
    spans: Spans, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[EventType] = []

    def sneaky(event: Event) -> Any:
        seen.append(event.type)
        return _async_observer(event)  # a coroutine: closed, never awaited, no warning

    tool, calls = _counting_tool()
    executor = spans.executor(_one_call("{}"), [tool])
    executor.add_observer(sneaky)
    result = executor.run("go")
    assert result.outcome == "completed" and len(calls) == 1
    assert seen == [EventType.RUN_START]
    assert "returned an awaitable" in caplog.text
    assert len(spans.exporter.get_finished_spans()) >= 4  # the telemetry observer kept going


# -- the LoopGuard shares the argument path -------------------------------------------------------------


@pytest.mark.parametrize("depth", [900, 1_000, 100_000])
@pytest.mark.parametrize("parsed", [False, True])
def test_the_loop_guard_records_deep_arguments_without_raising_or_losing_the_span(
    spans: Spans, depth: int, parsed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    arguments: object = _nested(depth)
    if parsed:
        value: object = 1
        for _ in range(depth):
            value = {"a": value}
        arguments = value
    guard = LoopGuard(tracer_provider=spans.provider)
    first = guard.check("t", arguments, path="p", call_id="c1")
    node_id = guard.record("t", arguments, "ok", path="p", call_id="c1")
    second = guard.check("t", arguments, path="p", call_id="c2")
    guard.end(path="p")
    assert first.allowed and not second.allowed
    span = spans.tool_span(node_id)
    assert dict(span.attributes or {})[sc.NODE_STATUS] == "completed"
    assert "telemetry observer failed" not in caplog.text
