"""LangGraph ReAct agent (``langchain.agents.create_agent`` on ``langgraph``, ``ChatOpenAI``)
instrumented by OpenLLMetry's ``opentelemetry-instrumentation-langchain``.

Runs ``scenario.task(i)`` for each requested run, one after the other, each in its own
LangGraph thread (``thread_id`` ``run-<i>``), against the fake OpenAI-compatible server.
Every tool call the model asks for runs through the real ``ToolNode`` (no caching), and
its result is the ``scenario.ToolBox`` string. Loopback only: no LangSmith, no Traceloop
SDK (``Traceloop.init`` is not used), content capture on.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # driver_common, scenario

# Before any framework import: content capture on, every phone-home switch off.
os.environ["TRACELOOP_TRACE_CONTENT"] = "true"
os.environ["TRACELOOP_TELEMETRY"] = "false"
os.environ["LANGCHAIN_TRACING_V2"] = "false"
os.environ["LANGSMITH_TRACING"] = "false"
os.environ["LANGCHAIN_TRACING"] = "false"

import scenario
from driver_common import parse_args, tracer_provider
from langchain.agents import create_agent
from langchain_core.tools import StructuredTool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from opentelemetry.instrumentation.langchain import LangchainInstrumentor

TOOL_NAMES = ("search", "fetch_url", "start_job", "job_status", "list_orders", "get_order")


def main() -> None:
    args = parse_args()
    provider = tracer_provider(args, service="fw-openllmetry")
    instrumentor = LangchainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        box = scenario.ToolBox()
        # Typed parameters come from the ToolBox methods' signatures (query: str, page: int, ...).
        tools = [
            StructuredTool.from_function(func=getattr(box, name), name=name, description=scenario.TOOL_DOCS[name])
            for name in TOOL_NAMES
        ]
        model = ChatOpenAI(
            model="gpt-4o-mini",
            base_url=args.base_url,
            api_key="sk-test",
            max_retries=0,  # a retried request would shift the server's per-run script
        )
        agent = create_agent(model, tools, checkpointer=InMemorySaver(), name="support_agent")
        for i in args.run_list:
            config = {"configurable": {"thread_id": f"run-{i}"}, "recursion_limit": 50}
            result = agent.invoke({"messages": [{"role": "user", "content": scenario.task(i)}]}, config)
            print(f"run {i}: {result['messages'][-1].content}", flush=True)
    finally:
        instrumentor.uninstrument()
        provider.shutdown()


if __name__ == "__main__":
    main()
