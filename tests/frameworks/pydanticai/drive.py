"""The scripted workload through Pydantic AI, traced by its own OpenTelemetry instrumentation.

Runs in ``.venv-fw/pydanticai``. One agent with the six ``scenario.ToolBox`` tools
(``Agent.tool_plain``, typed, with their scenario descriptions) on ``OpenAIChatModel``
against the fake server (``--base-url``), one ``run_sync`` per run index, in order.
Pydantic AI's built-in instrumentation (the ``Instrumentation`` capability, whose
``InstrumentationSettings`` use the tracer provider of ``driver_common.tracer_provider`` and
the default data-format version, 5) emits the spans; no logfire, nothing leaves 127.0.0.1.
The output type is ``str``, so the fake server's plain text answer ends the run without an
extra request; the OpenAI client does no HTTP retries (``max_retries=0``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import driver_common  # also sets the no-telemetry environment
import scenario
from pydantic_ai import Agent, InstrumentationSettings
from pydantic_ai.capabilities import Instrumentation
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import UsageLimits

MODEL = "gpt-4o-mini"
MAX_REQUESTS = 10


def make_agent(args: object, box: scenario.ToolBox, settings: InstrumentationSettings) -> Agent[None, str]:
    openai_provider = OpenAIProvider(base_url=args.base_url, api_key="sk-test")  # type: ignore[attr-defined]
    # max_retries=0: an HTTP request retried by the SDK would take the next scripted turn.
    model = OpenAIChatModel(MODEL, provider=openai_provider, settings=ModelSettings(max_retries=0))
    agent: Agent[None, str] = Agent(
        model,
        name="support_agent",
        instructions="Help the customer. Use the tools.",
        output_type=str,
        capabilities=[Instrumentation(settings=settings)],
    )

    for fn in scenario.tool_functions(box):
        agent.tool_plain(name=fn.__name__, description=scenario.TOOL_DOCS[fn.__name__])(fn)
    return agent


def main() -> None:
    args = driver_common.parse_args()
    provider = driver_common.tracer_provider(args, service="fw-pydanticai")
    settings = InstrumentationSettings(tracer_provider=provider)
    agent = make_agent(args, scenario.ToolBox(), settings)
    try:
        for i in args.run_list:
            result = agent.run_sync(scenario.task(i), usage_limits=UsageLimits(request_limit=MAX_REQUESTS))
            print(f"run {i}: {result.output}", file=sys.stderr)
    finally:
        provider.shutdown()


if __name__ == "__main__":
    main()
