"""LlamaIndex ``FunctionAgent`` (``llama_index.core.agent.workflow``, ``llama-index-llms-openai``)
instrumented by OpenInference's ``openinference-instrumentation-llama-index``.

Runs ``scenario.task(i)`` for each requested run, one after the other, each ``agent.run``
with a fresh workflow context (its own memory), against the fake OpenAI-compatible
server. Every tool call the model asks for runs (no caching), and its result is the
``scenario.ToolBox`` string. Loopback only: LlamaIndex's tokenizer and NLTK data come from
the caches bundled in ``llama_index.core`` (nothing is downloaded).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # driver_common, scenario

# Before any framework import: content capture on, nothing fetched from a hub.
os.environ["OPENINFERENCE_HIDE_INPUTS"] = "false"
os.environ["OPENINFERENCE_HIDE_OUTPUTS"] = "false"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import scenario
from driver_common import parse_args, tracer_provider
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai import OpenAI
from openinference.instrumentation.llama_index import LlamaIndexInstrumentor

TOOL_NAMES = ("search", "fetch_url", "start_job", "job_status", "list_orders", "get_order")


async def drive(base_url: str, run_list: list[int]) -> None:
    box = scenario.ToolBox()
    # Typed parameters come from the ToolBox methods' signatures (query: str, page: int, ...).
    tools = [
        FunctionTool.from_defaults(fn=getattr(box, name), name=name, description=scenario.TOOL_DOCS[name])
        for name in TOOL_NAMES
    ]
    llm = OpenAI(
        model="gpt-4o-mini",
        api_base=base_url,
        api_key="sk-test",
        max_retries=0,  # a retried request would shift the server's per-run script
    )
    agent = FunctionAgent(
        name="support_agent",
        description="Helps customers using the tools.",
        tools=tools,
        llm=llm,
        system_prompt="You are a support agent. Use the tools.",
    )
    for i in run_list:
        # No ctx: each run gets a fresh Context and memory (its own conversation).
        result = await agent.run(user_msg=scenario.task(i), max_iterations=50)
        print(f"run {i}: {result}", flush=True)


def main() -> None:
    args = parse_args()
    provider = tracer_provider(args, service="fw-llamaindex")
    instrumentor = LlamaIndexInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        asyncio.run(drive(args.base_url, args.run_list))
    finally:
        instrumentor.uninstrument()
        provider.shutdown()


if __name__ == "__main__":
    main()
