"""The scripted workload through the OpenAI Agents SDK, traced by OpenInference.

Runs in ``.venv-fw/agents``. One agent with the six ``scenario.ToolBox`` tools, on the
Chat Completions API of the fake server (``--base-url``), one ``Runner.run`` per run
index, in order. ``--shape handoff``: each run starts at a triage agent with no tools and
one handoff to that agent (the model transfers at once, ``scenario.Responder``).
``OpenAIAgentsInstrumentor`` registers its ``TracingProcessor`` with the SDK on the tracer
provider of ``driver_common.tracer_provider``; the SDK's default processor (which exports
to OpenAI's servers) is replaced, so nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import driver_common  # also sets the no-telemetry environment
import scenario
from agents import (
    Agent,
    FunctionTool,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
    set_default_openai_api,
    set_trace_processors,
    set_tracing_disabled,
)
from agents.tracing import get_trace_provider
from openai import AsyncOpenAI
from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor
from openinference.instrumentation.openai_agents._processor import (
    OpenInferenceTracingProcessor,
)

MODEL = "gpt-4o-mini"
MAX_TURNS = 10


def make_tools(box: scenario.ToolBox) -> list[FunctionTool]:
    """The six tools, typed, with their scenario descriptions; every call runs the ToolBox."""

    return [
        function_tool(fn, name_override=fn.__name__, description_override=scenario.TOOL_DOCS[fn.__name__])
        for fn in scenario.tool_functions(box)
    ]


def only_openinference_processor() -> None:
    """Keep the OpenInference processor alone (the SDK's default one exports to OpenAI)."""
    provider = get_trace_provider()
    processors = list(provider._multi_processor._processors)  # type: ignore[attr-defined]
    ours = [p for p in processors if isinstance(p, OpenInferenceTracingProcessor)]
    if len(ours) != 1:
        raise SystemExit(f"expected one OpenInference trace processor, found {processors!r}")
    if processors != ours:
        set_trace_processors(ours)


async def drive(args: argparse.Namespace, box: scenario.ToolBox) -> None:
    client = AsyncOpenAI(base_url=args.base_url, api_key="sk-test", max_retries=0)
    agent = Agent(
        name="Support agent",
        instructions="Help the customer. Use the tools.",
        model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
        tools=make_tools(box),
    )
    if args.shape == "handoff":
        agent = Agent(
            name="Triage agent",
            instructions="Hand the customer to the support agent.",
            model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
            handoffs=[agent],
        )
    elif args.shape != "default":
        raise SystemExit(f"unknown shape {args.shape!r}")
    config = RunConfig(trace_include_sensitive_data=True)
    for i in args.run_list:
        result = await Runner.run(agent, scenario.task(i), max_turns=MAX_TURNS, run_config=config)
        print(f"run {i}: {result.final_output}", file=sys.stderr)
    await client.close()


def main() -> None:
    args = driver_common.parse_args()
    provider = driver_common.tracer_provider(args, service="fw-agents")
    set_default_openai_api("chat_completions")
    set_tracing_disabled(False)  # whatever OPENAI_AGENTS_DISABLE_TRACING says
    OpenAIAgentsInstrumentor().instrument(tracer_provider=provider)
    only_openinference_processor()
    try:
        asyncio.run(drive(args, scenario.ToolBox()))
    finally:
        get_trace_provider().force_flush()
        provider.shutdown()


if __name__ == "__main__":
    main()
