"""LoopGuard in a LangGraph agent: N identical calls of one tool, through the real framework.

Runs in ``.venv-fw/langgraph`` (LangGraph and treellm's core). ``create_agent`` with
``ChatOpenAI`` against the fake server of ``tests/test_integrations.py`` (which asks for
the calls) and ``loop_guard_middleware(LoopGuard(max_repeats=L, on_repeat=ACTION))``;
``--runs R`` invocations, each its own ``thread_id``, with OpenInference's
``LangChainInstrumentor`` on or off (``--instrument``). Spans go where the
``driver_common`` options say (the guard's own spans when nothing else traces). With
``--tool-node`` a hand-built graph instead, its ``ToolNode`` guarded by
``wrap_tool_call``/``awrap_tool_call`` (the conversations ended by hand). Prints a JSON
summary: how many times the tool body ran, per run what each call returned (content and
status of its ``ToolMessage``), and how many guarded calls still counted on the runs'
conversations after the last run (0 when the middleware ended them).

    guard_drive.py --base-url URL --otlp-file PATH --mode sequential|parallel --calls N
                   --limit L --action prune|nudge|cache [--runs R] [--instrument]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

for _name in ("LANGSMITH_TRACING", "LANGSMITH_TRACING_V2", "LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING"):
    os.environ[_name] = "false"
os.environ.pop("LANGSMITH_API_KEY", None)
os.environ.pop("LANGCHAIN_API_KEY", None)

import driver_common  # noqa: E402  (sets the no-telemetry environment first)
from langchain.agents import create_agent  # noqa: E402
from langchain_core.messages import ToolMessage  # noqa: E402
from langchain_core.tools import StructuredTool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode, tools_condition  # noqa: E402
from openinference.instrumentation.langchain import LangChainInstrumentor  # noqa: E402

from treellm import LoopGuard  # noqa: E402
from treellm.integrations.langgraph import awrap_tool_call, loop_guard_middleware, wrap_tool_call  # noqa: E402

RESULT = "3 articles match 'refund policy': Returns, Refunds, Shipping."


def guard_args() -> tuple[argparse.Namespace, argparse.Namespace]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("sequential", "parallel"), required=True)
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--limit", type=int, required=True)
    parser.add_argument("--action", choices=("prune", "nudge", "cache"), required=True)
    parser.add_argument("--instrument", action="store_true")
    parser.add_argument("--asynchronous", action="store_true", help="ainvoke instead of invoke")
    parser.add_argument("--tool-node", action="store_true", help="a hand-built graph with ToolNode(wrap_tool_call=)")
    ours, rest = parser.parse_known_args()
    return ours, driver_common.parse_args(rest)


def task(mode: str, calls: int, run: int) -> str:
    """The user message; the fake server reads the mode and the number of calls from it."""
    return f"[guard {mode} {calls} run {run}] look up the refund policy."


def tool_node_graph(model: ChatOpenAI, tool: StructuredTool, guard: LoopGuard) -> Any:
    """A hand-built ReAct graph whose ``ToolNode`` is guarded by ``wrap_tool_call``."""
    bound = model.bind_tools([tool])

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node(
        "tools", ToolNode([tool], wrap_tool_call=wrap_tool_call(guard), awrap_tool_call=awrap_tool_call(guard))
    )
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=InMemorySaver())


def main() -> None:
    ours, args = guard_args()
    provider = driver_common.tracer_provider(args, service="guard-langgraph")
    instrumentor = LangChainInstrumentor() if ours.instrument else None
    if instrumentor is not None:
        instrumentor.instrument(tracer_provider=provider)
    bodies = 0
    lock = threading.Lock()

    def search(query: str) -> str:
        nonlocal bodies
        with lock:
            bodies += 1
        return RESULT

    tool = StructuredTool.from_function(func=search, name="search", description="Search the help centre.")
    guard = LoopGuard(max_repeats=ours.limit, on_repeat=ours.action, tracer_provider=provider, name="support")
    try:
        model = ChatOpenAI(model="gpt-4o-mini", base_url=args.base_url, api_key="sk-test", max_retries=0)
        if ours.tool_node:
            agent = tool_node_graph(model, tool, guard)
        else:
            agent = create_agent(
                model, tools=[tool], checkpointer=InMemorySaver(), middleware=[loop_guard_middleware(guard)]
            )
        configs: list[Any] = [
            {"configurable": {"thread_id": f"guard-{i}"}, "recursion_limit": 4 * ours.calls + 10} for i in args.run_list
        ]
        states = [{"messages": [{"role": "user", "content": task(ours.mode, ours.calls, i)}]} for i in args.run_list]

        async def invoke_all() -> list[Any]:  # one event loop: the model's async client outlives a run
            return [await agent.ainvoke(state, config) for state, config in zip(states, configs, strict=True)]

        if ours.asynchronous:
            results = asyncio.run(invoke_all())
        else:
            results = [agent.invoke(state, config) for state, config in zip(states, configs, strict=True)]
        left = sum(guard.count("search", {"query": "refund policy"}, f"guard-{i}") for i in args.run_list)
        if ours.tool_node:  # ToolNode has no end of run: the conversation is ended by hand
            for config in configs:
                guard.end(config["configurable"]["thread_id"])
        runs = [
            [
                {"content": m.content, "status": m.status, "call_id": m.tool_call_id}
                for m in result["messages"]
                if isinstance(m, ToolMessage)
            ]
            for result in results
        ]
        print(json.dumps({"bodies": bodies, "runs": runs, "left": left}))
    finally:
        guard.close()
        if instrumentor is not None:
            instrumentor.uninstrument()
        provider.shutdown()


if __name__ == "__main__":
    main()
