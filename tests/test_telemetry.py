"""OpenTelemetry instrumentation: spans per node with the right parents, loop events, metrics, capture."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from treellm import (
    LoopGuard,
    ModelRequest,
    ModelTurn,
    ScriptedModel,
    Skill,
    Tool,
    ToolCall,
    ToolNode,
    TreeConfig,
    TreeExecutor,
)
from treellm.telemetry import Capture, TelemetryObserver
from treellm.telemetry import semconv as sc


class Pipeline:
    """A real SDK pipeline into memory: spans and metrics."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    @property
    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def metrics(self) -> dict[str, list[Any]]:
        data = self.reader.get_metrics_data()
        out: dict[str, list[Any]] = {}
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    out[metric.name] = list(metric.data.data_points)
        return out

    def executor(
        self, model: ScriptedModel, tools: list[Tool], config: TreeConfig | None = None, **kw: Any
    ) -> TreeExecutor:
        return TreeExecutor(
            model,
            tools,
            config,
            tracer_provider=self.tracer_provider,
            meter_provider=self.meter_provider,
            **kw,
        )


@pytest.fixture
def pipeline() -> Iterator[Pipeline]:
    p = Pipeline()
    yield p
    p.tracer_provider.shutdown()
    p.meter_provider.shutdown()


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def node_spans(spans: list[ReadableSpan]) -> dict[str, ReadableSpan]:
    return {attrs(s)[sc.NODE_ID]: s for s in spans if sc.NODE_ID in attrs(s)}


def assert_parents_match_the_tree(spans: list[ReadableSpan]) -> None:
    """Every node span's parent is its parent node's span (or the run/skill span for roots)."""
    by_node = node_spans(spans)
    by_span_id = {s.context.span_id: s for s in spans}
    for node_id, span in by_node.items():
        parent_node = attrs(span)[sc.NODE_PARENT_ID]
        assert span.parent is not None, node_id
        parent_span = by_span_id[span.parent.span_id]
        if parent_node and attrs(parent_span).get(sc.NODE_ID) != parent_node:
            # a skill's root ThinkNode hangs under the skill's invoke_agent span, itself under the tool span
            assert attrs(parent_span).get(sc.SKILL_NAME), (node_id, parent_span.name)
            assert parent_span.parent is not None
            assert attrs(by_span_id[parent_span.parent.span_id])[sc.NODE_ID] == parent_node
        elif not parent_node:
            assert parent_span.name.startswith("invoke_agent")
        assert span.context.trace_id == parent_span.context.trace_id


def collapse_run(pipeline: Pipeline, **kw: Any) -> tuple[Any, list[ReadableSpan]]:
    model = ScriptedModel(
        [
            ModelTurn(tool_calls=[ToolCall("search", {"q": "x"}), ToolCall("read", {"p": "a"})], usage=None),
            ModelTurn(tool_calls=[ToolCall("search", {"q": "x"}), ToolCall("read", {"p": "b"})]),
            ModelTurn(text="answer"),
        ],
        model_name="gpt-test",
    )

    async def search(args: dict[str, Any]) -> str:
        return f"found {args['q']}"

    async def read(args: dict[str, Any]) -> str:
        return f"file {args['p']}"

    tools = [Tool("search", "s", handler=search), Tool("read", "r", handler=read)]
    result = pipeline.executor(model, tools, name="tester", **kw).run("the task")
    return result, pipeline.spans


def test_one_span_per_node_with_the_right_parent_and_a_root_run_span(pipeline: Pipeline) -> None:
    result, spans = collapse_run(pipeline)
    roots = [s for s in spans if s.parent is None]
    assert len(roots) == 1 and roots[0].name == "invoke_agent tester"
    root = attrs(roots[0])
    assert root[sc.RUN_ID] == result.run_id and root[sc.RUN_OUTCOME] == "completed"
    assert root[sc.CONFIG_MAX_REPEATS] == 1 and root[sc.CONFIG_BRANCHING] == "collapse"
    assert root[sc.GEN_AI_OPERATION_NAME] == "invoke_agent" and root[sc.GEN_AI_AGENT_NAME] == "tester"
    by_node = node_spans(spans)
    assert set(by_node) == {n.id for n in result.nodes}
    for node in result.nodes:
        a = attrs(by_node[node.id])
        assert (a[sc.NODE_KIND], a[sc.NODE_DEPTH], a[sc.NODE_PARENT_ID]) == (
            node.kind,
            node.depth,
            node.parent_id or "",
        )
    assert_parents_match_the_tree(spans)
    names = sorted(s.name for s in spans)
    assert names.count("chat gpt-test") == 3 and names.count("collapse") == 2


def test_tool_spans_carry_genai_and_loop_attributes_and_pruned_calls_get_none(pipeline: Pipeline) -> None:
    result, spans = collapse_run(pipeline)
    tool_spans = [s for s in spans if s.name.startswith("execute_tool")]
    tool_nodes = [n for n in result.nodes if isinstance(n, ToolNode)]
    assert len(tool_spans) == len(tool_nodes) == 3  # the repeated search never ran: no span
    first = next(s for s in tool_spans if attrs(s)[sc.NODE_ID] == tool_nodes[0].id)
    a = attrs(first)
    assert a[sc.GEN_AI_TOOL_NAME] == "search" and a[sc.GEN_AI_TOOL_CALL_ID] == tool_nodes[0].call_id
    assert a[sc.TOOL_SIGNATURE] == tool_nodes[0].signature
    assert (a[sc.TOOL_ORDINAL], a[sc.TOOL_LIMIT], a[sc.TOOL_LIMIT_SOURCE]) == (1, 1, "default")
    assert a[sc.TOOL_RESULT_HASH] == tool_nodes[0].result_hash and a[sc.TOOL_ATTEMPTS] == 1
    assert a[sc.GEN_AI_TOOL_CALL_ARGUMENTS] == '{"q":"x"}' and a[sc.GEN_AI_TOOL_CALL_RESULT] == "found x"

    think = next(s for s in spans if s.events and s.events[0].name == "loop:detected")
    event = think.events[0]
    e = dict(event.attributes or {})
    assert e[sc.LOOP_TOOL] == "search" and e[sc.LOOP_SIGNATURE] == tool_nodes[0].signature
    assert (e[sc.LOOP_COUNT], e[sc.LOOP_LIMIT], e[sc.LOOP_LIMIT_SOURCE]) == (1, 1, "default")
    assert (e[sc.LOOP_ACTION], e[sc.LOOP_SHADOW]) == ("prune", False)
    assert e[sc.LOOP_ARGUMENTS] == '{"q":"x"}'
    assert list(e[sc.LOOP_EARLIER_NODE_IDS]) == [tool_nodes[0].id]
    assert list(e[sc.LOOP_EARLIER_SPAN_IDS]) == [format(first.context.span_id, "016x")]
    assert event.timestamp is not None and think.end_time is not None and event.timestamp <= think.end_time
    assert attrs(think)[sc.NODE_KIND] == "think"


def test_collapse_spans_link_to_the_tool_spans_they_merged(pipeline: Pipeline) -> None:
    _, spans = collapse_run(pipeline)
    collapse = next(s for s in spans if s.name == "collapse")
    merged = list(attrs(collapse)[sc.COLLAPSE_MERGED])
    by_node = node_spans(spans)
    assert {link.context.span_id for link in collapse.links} == {by_node[m].context.span_id for m in merged}
    assert attrs(collapse)[sc.COLLAPSE_COMPRESSED] is False


def test_the_run_joins_the_callers_current_span(pipeline: Pipeline) -> None:
    tracer = pipeline.tracer_provider.get_tracer("caller")
    with tracer.start_as_current_span("request handler") as caller:
        collapse_run(pipeline)
    spans = pipeline.spans
    root = next(s for s in spans if s.name == "invoke_agent tester")
    assert root.parent is not None and root.parent.span_id == caller.get_span_context().span_id
    assert root.context.trace_id == caller.get_span_context().trace_id


def fork_skill_responder(request: ModelRequest) -> ModelTurn:
    if request.skill_stack:
        if request.depth == 0:
            return ModelTurn(tool_calls=[ToolCall("slow", {"i": 9})])
        return ModelTurn(tool_calls=[ToolCall("task_complete", {"result": "skill done"})])
    if request.depth == 0:
        return ModelTurn(
            tool_calls=[
                ToolCall("slow", {"i": 1}),
                ToolCall("slow", {"i": 2}),
                ToolCall("skill_helper", {"task": "t"}),
            ]
        )
    if request.depth == 1:
        return ModelTurn(tool_calls=[ToolCall("slow", {"i": 3})])
    return ModelTurn(text="done")


def test_fork_mode_concurrent_siblings_and_skills_land_on_the_right_parents(pipeline: Pipeline) -> None:
    async def slow(args: dict[str, Any]) -> str:
        await asyncio.sleep(0.001 * (5 - int(args["i"]) % 5))  # finish out of order
        return f"slow {args['i']}"

    model = ScriptedModel(fork_skill_responder)
    skill = Skill("helper", "helps", "You help.")
    result = pipeline.executor(
        model, [Tool("slow", "s", handler=slow)], TreeConfig(branching="fork"), skills=[skill]
    ).run("t")
    spans = pipeline.spans
    assert result.outcome == "completed"
    assert set(node_spans(spans)) == {n.id for n in result.nodes}
    assert_parents_match_the_tree(spans)
    skill_span = next(s for s in spans if s.name == "invoke_agent helper")
    a = attrs(skill_span)
    assert a[sc.SKILL_NAME] == "helper" and a[sc.GEN_AI_OPERATION_NAME] == "invoke_agent"
    skill_nodes = [s for s in spans if list(attrs(s).get(sc.NODE_SKILL_STACK, [])) == ["helper"]]
    assert skill_nodes and all(attrs(s)[sc.NODE_DEPTH] <= 1 for s in skill_nodes)


def test_retries_budget_and_answers_are_span_events(pipeline: Pipeline) -> None:
    calls: list[int] = []

    async def flaky(_: dict[str, Any]) -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("reset")
        return "ok"

    async def no_sleep(_: float) -> None:
        return None

    model = ScriptedModel(lambda r: ModelTurn(tool_calls=[ToolCall("f", {"d": r.depth})]))
    config = TreeConfig(node_budget=6)
    pipeline.executor(model, [Tool("f", "f", handler=flaky)], config, sleep=no_sleep).run("t")
    spans = pipeline.spans
    events = {e.name: dict(e.attributes or {}) for s in spans for e in s.events}
    assert events["tool:retry"][sc.RETRY_ATTEMPT] == 1 and "reset" in events["tool:retry"][sc.RETRY_ERROR]
    assert events["budget:exhausted"][sc.BUDGET_KIND] == "node"
    root = next(s for s in spans if s.parent is None)
    assert attrs(root)[sc.RUN_OUTCOME] == "budget_exhausted"


def test_metrics_count_tool_calls_loops_and_durations(pipeline: Pipeline) -> None:
    collapse_run(pipeline)
    metrics = pipeline.metrics()
    calls = {(p.attributes[sc.GEN_AI_TOOL_NAME], p.attributes[sc.METRIC_ATTR_STATUS]): p.value
             for p in metrics[sc.METRIC_TOOL_CALLS]}  # fmt: skip
    assert calls == {("search", "ok"): 1, ("read", "ok"): 2}
    loops = metrics[sc.METRIC_LOOP_DETECTIONS]
    assert [(p.attributes[sc.GEN_AI_TOOL_NAME], p.attributes[sc.LOOP_ACTION], p.value) for p in loops] == [
        ("search", "prune", 1)
    ]
    assert sum(p.count for p in metrics[sc.METRIC_TOOL_DURATION]) == 3


SECRET_ARGS = {
    "query": "status",
    "api_key": "sk-live-0123456789abcdef0123",
    "headers": {"Authorization": "x"},
}
SECRET_RESULT = "ok token=ghp_abcdefghijklmnopqrstuvwxyz0123 and Bearer abc.def.ghi-123456"


def secret_run(pipeline: Pipeline, capture: str) -> dict[str, Any]:
    model = ScriptedModel([ModelTurn(tool_calls=[ToolCall("call_api", SECRET_ARGS)]), ModelTurn(text="done")])
    ex = TreeExecutor(
        model,
        [Tool("call_api", "c", handler=lambda _: SECRET_RESULT)],
        telemetry=False,
        observers=[TelemetryObserver(pipeline.tracer_provider, pipeline.meter_provider, capture=capture)],  # type: ignore[arg-type]
    )
    ex.run("t")
    return attrs(next(s for s in pipeline.spans if s.name == "execute_tool call_api"))


def test_redaction_masks_planted_secrets_in_arguments_and_results(pipeline: Pipeline) -> None:
    a = secret_run(pipeline, "redacted")
    arguments, result = a[sc.GEN_AI_TOOL_CALL_ARGUMENTS], a[sc.GEN_AI_TOOL_CALL_RESULT]
    assert "sk-live" not in arguments and '"api_key":"[REDACTED]"' in arguments
    assert '"Authorization":"[REDACTED]"' in arguments and '"query":"status"' in arguments
    assert "ghp_" not in result and "abc.def" not in result and result.startswith("ok token=[REDACTED]")
    assert a[sc.TOOL_SIGNATURE].startswith("call_api:")


def test_full_capture_keeps_content_and_none_keeps_only_hashes(pipeline: Pipeline) -> None:
    full = secret_run(pipeline, "full")
    assert "sk-live-0123456789abcdef0123" in full[sc.GEN_AI_TOOL_CALL_ARGUMENTS]
    pipeline.exporter.clear()
    none = secret_run(pipeline, "none")
    assert sc.GEN_AI_TOOL_CALL_ARGUMENTS not in none and sc.GEN_AI_TOOL_CALL_RESULT not in none
    assert none[sc.TOOL_SIGNATURE] == full[sc.TOOL_SIGNATURE]
    assert none[sc.TOOL_RESULT_HASH] == full[sc.TOOL_RESULT_HASH]


def test_capture_truncates_long_content(pipeline: Pipeline) -> None:
    capture = Capture("full", max_length=10)
    assert capture.text("x" * 25) == "x" * 10 + "…[truncated 15 chars]"


def test_capture_mode_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from treellm.errors import ConfigError
    from treellm.telemetry.redaction import resolve_capture

    monkeypatch.setenv("TREELLM_CAPTURE", "none")
    assert resolve_capture().mode == "none"
    assert resolve_capture("full").mode == "full"
    monkeypatch.setenv("TREELLM_CAPTURE", "everything")
    with pytest.raises(ConfigError, match="TREELLM_CAPTURE: expected redacted, full or none, got 'everything'"):
        resolve_capture()


def test_loop_guard_events_become_the_same_spans(pipeline: Pipeline) -> None:
    guard = LoopGuard(tracer_provider=pipeline.tracer_provider, meter_provider=pipeline.meter_provider, name="lg")
    guard.record("search", {"q": "x"}, "r1", path="conv-1")
    decision = guard.check("search", {"q": "x"}, path="conv-1")
    assert not decision.allowed
    guard.end(path="conv-1", outcome="pruned_out")
    spans = pipeline.spans
    root = next(s for s in spans if s.parent is None)
    assert root.name == "invoke_agent lg" and attrs(root)[sc.RUN_GUARD] is True
    assert attrs(root)[sc.GEN_AI_CONVERSATION_ID] == "conv-1" and attrs(root)[sc.RUN_OUTCOME] == "pruned_out"
    tool = next(s for s in spans if s.name == "execute_tool search")
    assert tool.parent is not None and tool.parent.span_id == root.context.span_id
    loop = next(e for e in root.events if e.name == "loop:detected")
    assert dict(loop.attributes or {})[sc.LOOP_EARLIER_SPAN_IDS] == (format(tool.context.span_id, "016x"),)
    assert pipeline.metrics()[sc.METRIC_LOOP_DETECTIONS][0].value == 1


def test_a_failing_tracer_is_counted_and_never_stops_the_agent(pipeline: Pipeline) -> None:
    observer = TelemetryObserver(pipeline.tracer_provider, pipeline.meter_provider)

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("exporter exploded")

    observer._tracer.start_span = broken  # type: ignore[method-assign]
    model = ScriptedModel([ModelTurn(text="fine")])
    result = TreeExecutor(model, [], telemetry=False, observers=[observer]).run("t")
    assert result.outcome == "completed" and observer.failures >= 1
