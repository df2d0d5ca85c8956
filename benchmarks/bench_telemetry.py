"""Telemetry overhead: a 2,000-node scripted run with and without telemetry, and the
per-span cost of treellm's observer against bare SDK spans with the same attributes.

Run: .venv/bin/python benchmarks/bench_telemetry.py
Prints ratios measured side by side in one process (medians of alternating rounds).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import set_span_in_context

from treellm import ModelRequest, ModelTurn, ScriptedModel, Tool, ToolCall, TreeConfig, TreeExecutor
from treellm.exporters.jsonl import OTLPJsonlSpanExporter
from treellm.telemetry import TelemetryObserver

CALLS_PER_TURN = 8
LEVELS = 200  # think + 8 tools + collapse = 10 nodes per level: 2,000 nodes, plus the answer


def responder(request: ModelRequest) -> ModelTurn:
    if request.depth >= LEVELS:
        return ModelTurn(text="done")
    calls = [ToolCall("lookup", {"level": request.depth, "item": i, "query": "x" * 40}) for i in range(8)]
    return ModelTurn(tool_calls=calls)


class SlowModel(ScriptedModel):
    """The same script with a fixed latency per model turn (a real LLM takes 0.5-5 s)."""

    def __init__(self, latency_s: float) -> None:
        super().__init__(responder)
        self.latency_s = latency_s

    async def stream(self, request: ModelRequest) -> Any:
        await asyncio.sleep(self.latency_s)
        async for delta in super().stream(request):
            yield delta


async def lookup(args: dict[str, Any]) -> str:
    return f"value of {args['item']} at {args['level']}"


def executor(telemetry: bool, provider: TracerProvider | None, latency_s: float = 0.0) -> TreeExecutor:
    config = TreeConfig(depth_limit=LEVELS + 1, node_budget=10 * LEVELS + 10)
    return TreeExecutor(
        SlowModel(latency_s) if latency_s else ScriptedModel(responder),
        [Tool("lookup", "l", handler=lookup)],
        config,
        telemetry=telemetry,
        tracer_provider=provider,
    )


def run_once(telemetry: bool, folder: Path, index: int, latency_s: float = 0.0) -> tuple[float, int]:
    provider = None
    if telemetry:
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(OTLPJsonlSpanExporter(folder / f"run{index}.jsonl")))
    ex = executor(telemetry, provider, latency_s)
    t0 = time.perf_counter()
    result = ex.run("benchmark")
    if provider is not None:
        provider.force_flush()
    elapsed = time.perf_counter() - t0
    if provider is not None:
        provider.shutdown()
    return elapsed, len(result.nodes)


def bare_spans(count: int) -> float:
    """Seconds to create and end ``count`` bare SDK spans with ~12 attributes (no processor)."""
    tracer = TracerProvider().get_tracer("floor")
    attributes: dict[str, Any] = {f"treellm.attr.{i}": i for i in range(12)}
    t0 = time.perf_counter()
    for _ in range(count):
        tracer.start_span("execute_tool lookup", attributes=attributes).end()
    return time.perf_counter() - t0


def whole_run(rounds: int = 5) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        run_once(True, folder, -1)  # warm up imports and caches
        off, on, floor = [], [], []
        nodes = 0
        for i in range(rounds):
            t, nodes = run_once(False, folder, i)
            off.append(t)
            t, _ = run_once(True, folder, i)
            on.append(t)
            floor.append(bare_spans(nodes + 1))
        lines = sum(1 for _ in (folder / "run0.jsonl").open())
        slow_off, _ = run_once(False, folder, 100, latency_s=0.010)
        slow_on, _ = run_once(True, folder, 100, latency_s=0.010)
    base, traced, bare = statistics.median(off), statistics.median(on), statistics.median(floor)
    print(f"whole run: {nodes} nodes, {rounds} alternating rounds, medians; zero-latency model and tools")
    print(f"{'configuration':58} {'seconds':>8} {'ratio':>7}")
    print(f"{'telemetry=False':58} {base:8.3f} {1.0:7.2f}")
    print(f"{'telemetry: batch processor + JSONL file + force_flush':58} {traced:8.3f} {traced / base:7.2f}")
    floor_label = "floor: telemetry=False + bare SDK spans for every node"
    print(f"{floor_label:58} {base + bare:8.3f} {(base + bare) / base:7.2f}")
    print(f"overhead: {100 * (traced / base - 1):.1f}% (target <= 25%); JSONL lines written per run: {lines}")
    print("\nsame run, model latency 10 ms per turn (one round each)")
    print(f"{'telemetry=False':58} {slow_off:8.3f} {1.0:7.2f}")
    label = "telemetry: batch processor + JSONL file + force_flush"
    print(f"{label:58} {slow_on:8.3f} {slow_on / slow_off:7.2f}")


def per_span(rounds: int = 5) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    result = executor(False, None).run("benchmark")
    events = result.events
    observer = TelemetryObserver(provider)
    for event in events:
        observer(event)
    recorded: list[ReadableSpan] = list(memory.get_finished_spans())
    memory.clear()
    bare_provider = TracerProvider()  # same SDK, no processor: span creation cost only
    obs_provider = TracerProvider()
    tracer = bare_provider.get_tracer("bare")
    ours, bare = [], []
    for _ in range(rounds):
        observer = TelemetryObserver(obs_provider)
        t0 = time.perf_counter()
        for event in events:
            observer(event)
        ours.append((time.perf_counter() - t0) / len(recorded))
        t0 = time.perf_counter()
        root = tracer.start_span("root")
        context = set_span_in_context(root)
        for span in recorded:
            s = tracer.start_span(span.name, context=context, attributes=span.attributes, links=span.links)
            for e in span.events:
                s.add_event(e.name, e.attributes)
            s.set_attributes(span.attributes or {})
            s.end()
        root.end()
        bare.append((time.perf_counter() - t0) / len(recorded))
    o, b = statistics.median(ours), statistics.median(bare)
    print(f"\nper span ({len(recorded)} spans per run, {rounds} rounds, medians)")
    print(f"{'cost per span':52} {'us':>8} {'ratio':>7}")
    print(f"{'bare SDK span, same name, attributes, events, links':52} {b * 1e6:8.1f} {1.0:7.2f}")
    print(f"{'TelemetryObserver (events -> spans, capture redacted)':52} {o * 1e6:8.1f} {o / b:7.2f}")
    print("target: <= 2.00x")


if __name__ == "__main__":
    whole_run()
    per_span()
