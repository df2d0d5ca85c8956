"""Small named scenarios, each showing one behaviour, written like the simulated workloads.

``treellm simulate --scenario NAME --out FILE`` writes one; ``sample_traces/`` holds them.
Deterministic like :mod:`treellm.simulate.runner` (seeded ids, a step clock, async tools).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource

from treellm._version import __version__
from treellm.agent import TreeExecutor
from treellm.config import TreeConfig
from treellm.engine.events import Observer
from treellm.engine.tools import Skill, Tool
from treellm.errors import ConfigError
from treellm.models.base import ModelRequest, ModelTurn, ToolCall
from treellm.models.scripted import ScriptedModel
from treellm.otlp import traces_data_line
from treellm.simulate.demo import demo_executor
from treellm.simulate.runner import RunCollector, SeededIds, StepClock
from treellm.telemetry.observer import TelemetryObserver
from treellm.telemetry.redaction import Capture

__all__ = ["SCENARIOS", "write_scenario"]

START = dt.datetime(2026, 11, 29, 9, 0, tzinfo=dt.UTC)
Factory = Callable[[list[Observer], Callable[[], int], Callable[[], str]], TreeExecutor]


def _calls(request: ModelRequest) -> list[str]:
    return [c["function"]["name"] for m in request.messages for c in (m.get("tool_calls") or [])]


def _last_result(request: ModelRequest) -> str:
    return str(request.messages[-1].get("content") or "") if request.messages[-1].get("role") == "tool" else ""


async def _no_wait(_: float) -> None:
    return None


def _executor(
    turns: Callable[[ModelRequest], ModelTurn], tools: list[Tool], config: TreeConfig, name: str, **kw: Any
) -> Factory:
    def build(observers: list[Observer], clock: Callable[[], int], run_ids: Callable[[], str]) -> TreeExecutor:
        return TreeExecutor(
            ScriptedModel(turns, model_name="scripted-sample"), tools, config, name=name, observers=observers,
            telemetry=False, clock=clock, sleep=_no_wait, run_ids=run_ids, **kw,
        )  # fmt: skip

    return build


def _branch_local_loop() -> Factory:
    def build(observers: list[Observer], clock: Callable[[], int], run_ids: Callable[[], str]) -> TreeExecutor:
        return demo_executor(observers, telemetry=False, clock=clock, run_ids=run_ids)

    return build


async def _lookup(args: dict[str, Any]) -> str:
    return f"record {args.get('id')}: status shipped"


def _nudge_and_cache() -> Factory:
    def turns(request: ModelRequest) -> ModelTurn:
        calls = _calls(request)
        if len(calls) < 4:
            return ModelTurn(tool_calls=[ToolCall("lookup", {"id": 7}), ToolCall("quote", {"sku": "A-1"})])
        return ModelTurn(tool_calls=[ToolCall("task_complete", {"result": "order 7 shipped; A-1 costs 12"})])

    async def quote(args: dict[str, Any]) -> str:
        return f"{args.get('sku')}: 12 EUR"

    tools = [Tool("lookup", "Look up an order.", handler=_lookup, on_repeat="nudge"),
             Tool("quote", "Price of a SKU.", handler=quote, on_repeat="cache")]  # fmt: skip
    return _executor(turns, tools, TreeConfig(), "support-agent")


def _shadow_mode() -> Factory:
    def turns(request: ModelRequest) -> ModelTurn:
        if len(_calls(request)) < 3:
            return ModelTurn(tool_calls=[ToolCall("lookup", {"id": 7})])
        return ModelTurn(text="order 7 shipped")

    return _executor(turns, [Tool("lookup", "Look up an order.", handler=_lookup)], TreeConfig(shadow=True),
                     "support-agent")  # fmt: skip


def _retries() -> Factory:
    attempts = {"n": 0}

    async def fetch(args: dict[str, Any]) -> str:
        attempts["n"] += 1
        if attempts["n"] < 3:
            raise ConnectionError("503 Service Unavailable")
        return "<html>the page</html>"

    def turns(request: ModelRequest) -> ModelTurn:
        if not _calls(request):
            return ModelTurn(tool_calls=[ToolCall("fetch_url", {"url": "https://example.org"})])
        return ModelTurn(text="fetched after retries")

    config = TreeConfig(retry_max_attempts=3, retry_base_delay_s=0.5)
    return _executor(turns, [Tool("fetch_url", "Fetch a page.", handler=fetch)], config, "research-agent")


def _budget_exhausted() -> Factory:
    async def poll(args: dict[str, Any]) -> str:
        return "running"

    def turns(request: ModelRequest) -> ModelTurn:
        return ModelTurn(tool_calls=[ToolCall("check_job_status", {"job_id": "j1", "poll": len(_calls(request))})])

    config = TreeConfig(node_budget=13)
    return _executor(turns, [Tool("check_job_status", "Job status.", handler=poll)], config, "ops-agent")


def _skill_subtree() -> Factory:
    async def search(args: dict[str, Any]) -> str:
        return f"3 hits for {args.get('q')}"

    def turns(request: ModelRequest) -> ModelTurn:
        calls = _calls(request)
        if request.skill_stack:
            if not calls:
                return ModelTurn(tool_calls=[ToolCall("search", {"q": "tree llm"})])
            if len(calls) == 1:
                return ModelTurn(tool_calls=[ToolCall("search", {"q": "tree llm"})])  # pruned inside the skill
            return ModelTurn(text="skill: done")
        if not calls:
            return ModelTurn(tool_calls=[ToolCall("search", {"q": "tree llm"}),
                                         ToolCall("skill_researcher", {"task": "dig deeper"})])  # fmt: skip
        return ModelTurn(tool_calls=[ToolCall("task_complete", {"result": _last_result(request) or "done"})])

    skill = Skill("researcher", "A research sub-agent.", "You research one question.")
    tools = [Tool("search", "Search.", handler=search)]
    return _executor(turns, tools, TreeConfig(branching="fork"), "lead-agent", skills=[skill])


SCENARIOS: dict[str, tuple[str, Callable[[], Factory]]] = {
    "branch_local_loop": ("a loop pruned on one fork branch but not on its sibling", _branch_local_loop),
    "nudge_and_cache": ("repeated calls answered by a nudge and from the cache", _nudge_and_cache),
    "shadow_mode": ("shadow mode: repeats run, would-be prunes are reported", _shadow_mode),
    "retries": ("a flaky tool retried with backoff until it succeeds", _retries),
    "budget_exhausted": ("a polling loop stopped by the node budget", _budget_exhausted),
    "skill_subtree": ("a skill's sub-tree with its own path and depth", _skill_subtree),
}


def write_scenario(name: str, out: str | Path, seed: int = 0) -> int:
    """Run scenario ``name`` once and write its spans to ``out``; returns the span count."""
    if name not in SCENARIOS:
        raise ConfigError(f"--scenario: expected one of {', '.join(SCENARIOS)}, got {name!r}")
    resource = Resource({"service.name": f"sample-{name}", "service.version": __version__,
                         "telemetry.sdk.name": "opentelemetry", "telemetry.sdk.language": "python"})  # fmt: skip
    from opentelemetry.sdk.trace import TracerProvider

    ids = SeededIds(int.from_bytes(hashlib.blake2b(f"{name}:{seed}".encode(), digest_size=8).digest(), "big"))
    provider = TracerProvider(resource=resource, id_generator=ids)
    collector = RunCollector()
    provider.add_span_processor(collector)
    meter_provider = MeterProvider()
    observer = TelemetryObserver(provider, meter_provider, capture=Capture("redacted"))
    build = SCENARIOS[name][1]()
    clock = StepClock(int(START.timestamp()) * 10**9)
    try:
        build([observer], clock, lambda: f"sample-{name}").run(f"sample scenario: {name}")
        spans = collector.drain()
    finally:
        provider.shutdown()
        meter_provider.shutdown()
    Path(out).write_bytes(traces_data_line(spans))
    return len(spans)
