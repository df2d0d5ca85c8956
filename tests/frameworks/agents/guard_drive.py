"""LoopGuard in an OpenAI Agents SDK agent: N identical calls of one tool, through the real SDK.

Runs in ``.venv-fw/agents`` (the SDK and treellm's core). One agent on the Chat
Completions API of the fake server of ``tests/test_integrations.py`` (which asks for the
calls), its tool guarded by ``loop_guard(agent, LoopGuard(max_repeats=L, on_repeat=ACTION))``;
``--runs R`` ``Runner.run`` calls, each its own SDK trace (the guard's conversation). With
``--instrument`` OpenInference's ``OpenAIAgentsInstrumentor`` traces the SDK, instrumented
after the agent was guarded (it replaces the SDK's trace processors: the guard's one that
ends conversations registers again); without it the SDK traces to no processor but the
guard's and the guard makes its own spans. Spans go where the ``driver_common`` options
say. Prints a JSON summary: how many times the tool body ran, per run what each call
returned to the model, and how many conversations the guard saw end.

    guard_drive.py --base-url URL --otlp-file PATH --mode sequential|parallel --calls N
                   --limit L --action prune|nudge|cache [--runs R] [--instrument]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import driver_common  # also sets the no-telemetry environment
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    ToolCallOutputItem,
    function_tool,
    set_default_openai_api,
    set_trace_processors,
    set_tracing_disabled,
)
from agents.tracing import get_trace_provider
from openai import AsyncOpenAI
from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

from treellm import LoopGuard
from treellm.engine.events import Event
from treellm.integrations.openai_agents import loop_guard

RESULT = "3 articles match 'refund policy': Returns, Refunds, Shipping."


def guard_args() -> tuple[argparse.Namespace, argparse.Namespace]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("sequential", "parallel"), required=True)
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--limit", type=int, required=True)
    parser.add_argument("--action", choices=("prune", "nudge", "cache"), required=True)
    parser.add_argument("--instrument", action="store_true")
    ours, rest = parser.parse_known_args()
    return ours, driver_common.parse_args(rest)


def task(mode: str, calls: int, run: int) -> str:
    """The user message; the fake server reads the mode and the number of calls from it."""
    return f"[guard {mode} {calls} run {run}] look up the refund policy."


async def drive(ours: argparse.Namespace, args: argparse.Namespace, agent: Agent[Any]) -> list[list[dict[str, Any]]]:
    config = RunConfig(trace_include_sensitive_data=True)
    runs = []
    for i in args.run_list:
        result = await Runner.run(agent, task(ours.mode, ours.calls, i), max_turns=ours.calls + 3, run_config=config)
        runs.append(
            [
                {"content": str(item.output), "call_id": item.raw_item.get("call_id")}
                for item in result.new_items
                if isinstance(item, ToolCallOutputItem)
            ]
        )
    return runs


def main() -> None:
    ours, args = guard_args()
    provider = driver_common.tracer_provider(args, service="guard-agents")
    set_default_openai_api("chat_completions")
    set_tracing_disabled(False)
    set_trace_processors([])  # the SDK's default processor exports to OpenAI: never
    bodies = 0
    lock = threading.Lock()
    ended: list[str] = []

    def search(query: str) -> str:
        """Search the help centre."""
        nonlocal bodies
        with lock:
            bodies += 1
        return RESULT

    def observe(event: Event) -> None:
        if event.type == "run:complete":
            ended.append(event.run_id)

    guard = LoopGuard(
        max_repeats=ours.limit, on_repeat=ours.action, tracer_provider=provider, observers=[observe], name="support"
    )
    client = AsyncOpenAI(base_url=args.base_url, api_key="sk-test", max_retries=0)
    agent = loop_guard(
        Agent(
            name="Support agent",
            instructions="Help the customer. Use the tools.",
            model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client),
            tools=[function_tool(search)],
        ),
        guard,
    )
    instrumentor = OpenAIAgentsInstrumentor() if ours.instrument else None
    if instrumentor is not None:  # after guarding: it replaces the SDK's processors, the guard's too
        instrumentor.instrument(tracer_provider=provider)
    try:

        async def run_all() -> list[list[dict[str, Any]]]:
            try:
                return await drive(ours, args, agent)
            finally:
                await client.close()

        runs = asyncio.run(run_all())
        print(json.dumps({"bodies": bodies, "runs": runs, "ended": len(ended)}))
    finally:
        guard.close()
        get_trace_provider().force_flush()
        if instrumentor is not None:
            instrumentor.uninstrument()
        provider.shutdown()


if __name__ == "__main__":
    main()
