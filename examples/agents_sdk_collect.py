"""An OpenAI Agents SDK agent traced into ``treellm collect``.

Start the collector, run the agent, then read the report:

    treellm collect --db runs.duckdb &
    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 python examples/agents_sdk_collect.py
    treellm report --db runs.duckdb

Needs ``openai-agents``, ``openinference-instrumentation-openai-agents`` and
``opentelemetry-exporter-otlp-proto-http``. The model comes from ``OPENAI_BASE_URL``,
``OPENAI_API_KEY`` and ``OPENAI_MODEL``; the collector from ``TREELLM_COLLECT_URL``
(default ``http://127.0.0.1:4318/v1/traces``). Prints the agent's answer.
"""

from __future__ import annotations

import os

from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
from openai import AsyncOpenAI
from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor


@function_tool
def get_order(order_id: str) -> str:
    """Look up an order by its id."""
    return f"order {order_id}: 2 items, shipped"


def main() -> None:
    endpoint = os.environ.get("TREELLM_COLLECT_URL", "http://127.0.0.1:4318/v1/traces")
    provider = TracerProvider(resource=Resource.create({"service.name": "support-agent"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    OpenAIAgentsInstrumentor().instrument(tracer_provider=provider)  # replaces the SDK's own trace export

    client = AsyncOpenAI(
        base_url=os.environ.get("OPENAI_BASE_URL"), api_key=os.environ.get("OPENAI_API_KEY", "sk-none")
    )
    model = OpenAIChatCompletionsModel(model=os.environ.get("OPENAI_MODEL", "gpt-4o-mini"), openai_client=client)
    agent = Agent(name="support", instructions="Answer questions about orders.", tools=[get_order], model=model)
    try:
        result = Runner.run_sync(agent, "Where is order 1234?", run_config=RunConfig(trace_include_sensitive_data=True))
        print(f"answer: {result.final_output}")
    finally:
        provider.shutdown()  # flush the spans to the collector before exiting


if __name__ == "__main__":
    main()
