"""LoopGuard with calls in flight (reservations) and in the framework's own trace (span modes)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from opentelemetry import context, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from treellm import ConfigError, Event, LoopGuard
from treellm.telemetry import semconv as sc


class Pipeline:
    """A real SDK pipeline into memory, and a tracer standing for a framework's instrumentor."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.framework = self.tracer_provider.get_tracer("framework")

    def guard(self, **kw: Any) -> LoopGuard:
        return LoopGuard(tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **kw)

    @property
    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def metric(self, name: str) -> int:
        data = self.reader.get_metrics_data()
        assert data is not None
        total = 0
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        total += sum(int(getattr(point, "value", 0)) for point in metric.data.data_points)
        return total


@pytest.fixture
def pipeline() -> Iterator[Pipeline]:
    p = Pipeline()
    yield p
    p.tracer_provider.shutdown()
    p.meter_provider.shutdown()


TOOL_SPAN = {sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: "fetch"}


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def hex_id(span: ReadableSpan) -> str:
    assert span.context is not None
    return format(span.context.span_id, "016x")


# -- reservations ---------------------------------------------------------------------------------


def test_concurrent_identical_checks_on_threads_allow_exactly_the_limit() -> None:
    guard = LoopGuard(limits={"fetch": 3}, telemetry=False)
    barrier = threading.Barrier(10)

    def call(_: int) -> bool:
        barrier.wait()
        return guard.check("fetch", {"u": 1}, path="c").allowed

    with ThreadPoolExecutor(max_workers=10) as pool:
        allowed = list(pool.map(call, range(10)))
    assert allowed.count(True) == 3
    assert guard.count("fetch", {"u": 1}, path="c") == 3
    for _ in range(3):
        guard.record("fetch", {"u": 1}, "page", path="c")
    assert guard.count("fetch", {"u": 1}, path="c") == 3
    assert not guard.check("fetch", {"u": 1}, path="c").allowed


def test_a_turn_gathered_on_asyncio_counts_the_calls_still_running() -> None:
    """The OpenAI Agents SDK checks a turn's calls before any of them has run."""
    events: list[Event] = []
    guard = LoopGuard(observers=[events.append], telemetry=False)
    ran: list[int] = []

    async def call(i: int) -> str:
        args = {"u": i % 5}  # five pairs of identical calls
        decision = guard.check("fetch", args, path="turn", call_id=f"c{i}")
        if not decision.allowed:
            return "caught"
        await asyncio.sleep(0)
        ran.append(i)
        guard.record("fetch", args, f"page {i % 5}", path="turn", call_id=f"c{i}")
        return "ran"

    async def turn() -> list[str]:
        return await asyncio.gather(*(call(i) for i in range(10)))

    outcomes = asyncio.run(turn())
    assert outcomes.count("ran") == 5 and outcomes.count("caught") == 5
    assert sorted(ran) == [0, 1, 2, 3, 4]
    caught = [e.payload.call for e in events if e.type == "loop:detected"]  # type: ignore[union-attr]
    assert [(c.call_id, c.count, c.earlier_node_ids) for c in caught] == [
        (f"c{i}", 1, (f"n{i - 4}",)) for i in range(5, 10)
    ]
    starts = [e for e in events if e.type == "tool:start"]
    assert [e.node_id for e in starts] == ["n1", "n2", "n3", "n4", "n5"]
    assert {e.payload.ordinal for e in starts} == {1}  # type: ignore[union-attr]


def test_release_frees_the_slot_and_counts_the_call_as_never_checked() -> None:
    guard = LoopGuard(telemetry=False)
    first = guard.check("fetch", {"u": 1})
    assert first.allowed and first.reservation is not None
    assert not guard.check("fetch", {"u": 1}).allowed  # the first is still running
    assert guard.release(first) is True
    assert guard.release(first) is False  # already released
    second = guard.check("fetch", {"u": 1}, call_id="k2")
    assert second.allowed and second.count == 0
    assert guard.release("fetch", {"u": 1}, path=None, call_id="k2") is True
    assert guard.count("fetch", {"u": 1}) == 0
    third = guard.check("fetch", {"u": 1})
    assert guard.release("fetch", {"u": 1}) is True  # the oldest of that call, without an id
    assert guard.release(third) is False
    caught = guard.check("fetch", {"u": 1})
    guard.record("fetch", {"u": 1}, "page")
    assert guard.release(caught) is False and guard.count("fetch", {"u": 1}) == 1


def test_end_clears_reservations_that_were_never_recorded() -> None:
    events: list[Event] = []
    guard = LoopGuard(observers=[events.append], telemetry=False, run_ids=iter(["r1", "r2"]).__next__)
    stale = guard.check("fetch", {"u": 1}, path="c")
    assert not guard.check("fetch", {"u": 1}, path="c").allowed
    guard.end(path="c")
    assert events[-1].type == "run:complete" and events[-1].payload.stats.tool_nodes == 0  # type: ignore[union-attr]
    assert guard.count("fetch", {"u": 1}, path="c") == 0
    fresh = guard.check("fetch", {"u": 1}, path="c")
    assert fresh.allowed and fresh.count == 0
    assert guard.release(stale) is False  # a reservation of the ended conversation
    assert guard.count("fetch", {"u": 1}, path="c") == 1


def test_record_pairs_with_the_reservation_of_its_call_id() -> None:
    events: list[Event] = []
    guard = LoopGuard(
        limits={"fetch": 2}, observers=[events.append], telemetry=False, clock=iter(range(1, 99)).__next__
    )
    a = guard.check("fetch", {"u": 1}, call_id="a")
    b = guard.check("fetch", {"u": 1}, call_id="b")
    assert (a.ordinal, b.ordinal) == (1, 2) and a.reservation != b.reservation
    assert guard.record("fetch", {"u": 1}, "page", call_id="b") == "n2"  # b's node, though a was first
    assert guard.record("fetch", {"u": 1}, "page") == "n1"  # no id: the oldest left
    starts = [e for e in events if e.type == "tool:start"]
    assert [(e.node_id, e.payload.call_id, e.payload.ordinal) for e in starts] == [  # type: ignore[union-attr]
        ("n2", "b", 2),
        ("n1", "a", 1),
    ]
    assert (starts[0].time_ns, starts[1].time_ns) == (3, 2)  # each call starts at its check
    assert guard.record("fetch", {"u": 1}, "page", call_id="zzz") == "n3"  # no reservation: counts from now
    assert not guard.check("fetch", {"u": 1}).allowed


def test_a_failed_call_ends_its_reservation_as_failed_and_changes_no_state() -> None:
    events: list[Event] = []
    guard = LoopGuard(mutates=["edit"], observers=[events.append], telemetry=False)
    guard.record("read", {"p": "a"}, "v1")
    edit = guard.check("edit", {"p": "a"}, call_id="e1")
    guard.record("edit", {"p": "a"}, "boom", error=True, call_id="e1")
    assert events[-1].type == "tool:error" and events[-1].node_id == "n2"
    assert not guard.check("read", {"p": "a"}).allowed  # a failed write restarts nothing
    assert edit.allowed
    guard.check("edit", {"p": "b"})
    guard.record("edit", {"p": "b"}, "Error: disk full")  # the failure rule on the text
    assert events[-1].type == "tool:error"
    assert guard.release(edit) is False


def test_a_shadow_catch_runs_so_it_is_reserved_too() -> None:
    guard = LoopGuard(shadow=True, telemetry=False)
    first = guard.check("s", {})
    shadowed = guard.check("s", {})
    assert first.allowed and shadowed.allowed and shadowed.shadow
    assert shadowed.reservation is not None and guard.count("s", {}) == 2


def test_an_unknown_span_mode_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="spans: expected auto, own or annotate, got 'both'"):
        LoopGuard(spans="both")  # type: ignore[arg-type]


# -- one trace, each call counted once ------------------------------------------------------------


def test_inside_the_framework_tool_span_the_guard_annotates_it_and_makes_no_span(pipeline: Pipeline) -> None:
    guard = pipeline.guard(limits={"fetch": 1})
    with pipeline.framework.start_as_current_span("agent step"):
        with pipeline.framework.start_as_current_span("execute_tool fetch", attributes=TOOL_SPAN):
            decision = guard.check("fetch", {"u": 1}, path="conv", call_id="call_1")
            assert decision.allowed
            guard.record("fetch", {"u": 1}, "page", path="conv", call_id="call_1")
        with pipeline.framework.start_as_current_span("execute_tool fetch", attributes=TOOL_SPAN):
            assert not guard.check("fetch", {"u": 1}, path="conv", call_id="call_2").allowed
    guard.end(path="conv")

    spans = pipeline.spans
    assert {s.instrumentation_scope.name for s in spans} == {"framework"}  # type: ignore[union-attr]
    assert len(spans) == 3 and not any(s.name.startswith("invoke_agent") for s in spans)
    assert len({s.context.trace_id for s in spans}) == 1
    first, second = (s for s in spans if s.name == "execute_tool fetch")
    a = attrs(first)
    assert a[sc.TOOL_ORDINAL] == 1 and a[sc.TOOL_LIMIT] == 1 and a[sc.TOOL_LIMIT_SOURCE] == "tool"
    assert a[sc.TOOL_SIGNATURE].startswith("fetch:") and a[sc.GEN_AI_TOOL_CALL_ID] == "call_1"
    assert not first.events
    (loop,) = second.events
    e = dict(loop.attributes or {})
    assert loop.name == sc.EVENT_LOOP_DETECTED
    assert (e[sc.LOOP_TOOL], e[sc.LOOP_CALL_ID], e[sc.LOOP_COUNT], e[sc.LOOP_LIMIT]) == ("fetch", "call_2", 1, 1)
    assert (e[sc.LOOP_ACTION], e[sc.LOOP_SHADOW], e[sc.LOOP_LIMIT_SOURCE]) == ("prune", False, "tool")
    assert e[sc.LOOP_SIGNATURE] == a[sc.TOOL_SIGNATURE] and e[sc.LOOP_EARLIER_NODE_IDS] == ("n1",)
    assert e[sc.LOOP_EARLIER_SPAN_IDS] == (hex_id(first),)
    assert sc.TOOL_ORDINAL not in attrs(second)  # a caught call's span gets only the event
    assert pipeline.metric(sc.METRIC_LOOP_DETECTIONS) == 1 and pipeline.metric(sc.METRIC_TOOL_CALLS) == 1


def test_checked_in_a_step_span_the_tool_span_is_annotated_at_record_time(pipeline: Pipeline) -> None:
    guard = pipeline.guard()
    with pipeline.framework.start_as_current_span("chat gpt-x", attributes={sc.GEN_AI_OPERATION_NAME: "chat"}):
        decision = guard.check("fetch", {"u": 1}, call_id="call_1")
        with pipeline.framework.start_as_current_span("execute_tool fetch", attributes=TOOL_SPAN):
            guard.record("fetch", {"u": 1}, "page", call_id="call_1")
        assert not guard.check("fetch", {"u": 1}).allowed
    guard.end()

    assert decision.allowed
    tool = next(s for s in pipeline.spans if s.name == "execute_tool fetch")
    chat = next(s for s in pipeline.spans if s.name == "chat gpt-x")
    assert attrs(tool)[sc.TOOL_ORDINAL] == 1 and attrs(tool)[sc.GEN_AI_TOOL_CALL_ID] == "call_1"
    assert sc.TOOL_SIGNATURE not in attrs(chat)  # not a tool span: no call facts on it
    assert [ev.name for ev in chat.events] == [sc.EVENT_LOOP_DETECTED]  # the catch lands where it happened
    assert len(pipeline.spans) == 2


def test_the_guard_keeps_the_call_id_the_instrumentor_set(pipeline: Pipeline) -> None:
    guard = pipeline.guard()
    with pipeline.framework.start_as_current_span(
        "tool", attributes={"openinference.span.kind": "TOOL", sc.GEN_AI_TOOL_CALL_ID: "theirs"}
    ):
        guard.check("fetch", {"u": 1}, call_id="ours")
        guard.record("fetch", {"u": 1}, "page", call_id="ours")
    (span,) = pipeline.spans
    assert attrs(span)[sc.GEN_AI_TOOL_CALL_ID] == "theirs" and attrs(span)[sc.TOOL_ORDINAL] == 1


def test_without_a_current_span_the_guard_makes_its_own_spans_on_the_current_context(pipeline: Pipeline) -> None:
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    token = context.attach(trace.set_span_in_context(NonRecordingSpan(remote)))
    try:
        guard = pipeline.guard(name="lg")
        guard.check("fetch", {"u": 1}, path="c", call_id="call_1")
        guard.record("fetch", {"u": 1}, "page", path="c", call_id="call_1")
        assert not guard.check("fetch", {"u": 1}, path="c").allowed
        guard.end(path="c")
    finally:
        context.detach(token)
    run = next(s for s in pipeline.spans if s.name == "invoke_agent lg")
    tool = next(s for s in pipeline.spans if s.name == "execute_tool fetch")
    assert run.parent is not None and run.parent.span_id == 0xDEF and run.context.trace_id == 0xABC
    assert tool.parent is not None and tool.parent.span_id == run.context.span_id
    assert attrs(tool)[sc.GEN_AI_TOOL_CALL_ID] == "call_1" and attrs(tool)[sc.TOOL_ORDINAL] == 1
    assert [ev.name for ev in run.events] == [sc.EVENT_LOOP_DETECTED]


def test_with_no_context_at_all_the_run_span_starts_a_trace(pipeline: Pipeline) -> None:
    guard = pipeline.guard(name="lg")
    guard.record("fetch", {"u": 1}, "page")
    guard.end()
    run = next(s for s in pipeline.spans if s.name == "invoke_agent lg")
    assert run.parent is None and len(pipeline.spans) == 2


def test_own_mode_makes_its_spans_even_inside_a_framework_span(pipeline: Pipeline) -> None:
    guard = pipeline.guard(name="lg", spans="own")
    with pipeline.framework.start_as_current_span("execute_tool fetch", attributes=TOOL_SPAN) as outer:
        guard.check("fetch", {"u": 1})
        guard.record("fetch", {"u": 1}, "page")
        guard.end()
    run = next(s for s in pipeline.spans if s.name == "invoke_agent lg")
    assert run.parent is not None and run.parent.span_id == outer.get_span_context().span_id
    framework = next(s for s in pipeline.spans if s.instrumentation_scope.name == "framework")  # type: ignore[union-attr]
    assert sc.TOOL_ORDINAL not in attrs(framework) and len(pipeline.spans) == 3


def test_annotate_mode_without_a_current_span_traces_nothing_but_counts(pipeline: Pipeline) -> None:
    guard = pipeline.guard(spans="annotate")
    guard.check("fetch", {"u": 1})
    guard.record("fetch", {"u": 1}, "page")
    assert not guard.check("fetch", {"u": 1}).allowed
    guard.end()
    assert pipeline.spans == []
    assert pipeline.metric(sc.METRIC_TOOL_CALLS) == 1 and pipeline.metric(sc.METRIC_LOOP_DETECTIONS) == 1
