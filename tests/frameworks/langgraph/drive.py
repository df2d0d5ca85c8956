"""LangGraph driver: the scripted workload through LangChain's prebuilt ReAct agent.

``langchain.agents.create_agent`` (the LangGraph agent that replaced
``langgraph.prebuilt.create_react_agent`` in LangGraph 1.x) with ``ChatOpenAI``
against the fake OpenAI-compatible server, traced by OpenInference's
``LangChainInstrumentor`` on the provider of ``driver_common.tracer_provider``.
One graph invocation per run, sequentially, each with its own ``thread_id``.
Every tool call the model asks for runs (the tool node runs the calls of one turn
concurrently; ``ToolBox`` is thread-safe), nothing is cached.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Nothing leaves loopback: LangSmith tracing off whatever the environment says.
for _name in ("LANGSMITH_TRACING", "LANGSMITH_TRACING_V2", "LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING"):
    os.environ[_name] = "false"
os.environ.pop("LANGSMITH_API_KEY", None)
os.environ.pop("LANGCHAIN_API_KEY", None)

import driver_common  # noqa: E402  (sets the no-telemetry environment first)
import scenario  # noqa: E402
from langchain.agents import create_agent  # noqa: E402
from langchain_core.tools import BaseTool, StructuredTool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from openinference.instrumentation.langchain import LangChainInstrumentor  # noqa: E402


def make_tools(box: scenario.ToolBox) -> list[BaseTool]:
    """The six tools, typed, described by ``scenario.TOOL_DOCS``, returning the ToolBox's strings."""

    def search(query: str) -> str:
        return box.search(query)

    def fetch_url(url: str) -> str:
        return box.fetch_url(url)

    def start_job(name: str) -> str:
        return box.start_job(name)

    def job_status(job_id: str) -> str:
        return box.job_status(job_id)

    def list_orders(customer: str, page: int) -> str:
        return box.list_orders(customer, page)

    def get_order(order_id: str) -> str:
        return box.get_order(order_id)

    functions = (search, fetch_url, start_job, job_status, list_orders, get_order)
    return [
        StructuredTool.from_function(func=f, name=f.__name__, description=scenario.TOOL_DOCS[f.__name__])
        for f in functions
    ]


def main() -> None:
    args = driver_common.parse_args()
    provider = driver_common.tracer_provider(args, service="fw-langgraph")
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        model = ChatOpenAI(model="gpt-4o-mini", base_url=args.base_url, api_key="sk-test", max_retries=0)
        agent = create_agent(model, tools=make_tools(scenario.ToolBox()), checkpointer=InMemorySaver())
        for i in args.run_list:
            config = {"configurable": {"thread_id": f"run-{i}"}, "recursion_limit": 30}
            result = agent.invoke({"messages": [{"role": "user", "content": scenario.task(i)}]}, config)
            print(f"run {i}: {result['messages'][-1].content}", file=sys.stderr)
    finally:
        instrumentor.uninstrument()
        provider.shutdown()


if __name__ == "__main__":
    main()
