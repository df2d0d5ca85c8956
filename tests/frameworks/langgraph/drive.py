"""LangGraph driver: the scripted workload through a LangGraph agent of the shape asked for.

Shapes (``--shape``), each with ``ChatOpenAI`` against the fake OpenAI-compatible server:

- ``default``: ``langchain.agents.create_agent`` (the LangGraph agent that replaced
  ``langgraph.prebuilt.create_react_agent`` in LangGraph 1.x).
- ``react``: ``langgraph.prebuilt.create_react_agent`` (deprecated in LangGraph 1.x, still
  shipped and widely used): its model node is named ``agent``.
- ``stategraph``: a ``StateGraph`` written by hand, as the LangGraph tutorials do: a node
  named ``agent`` that calls the model, the prebuilt ``ToolNode`` as ``tools``,
  ``tools_condition`` between them.
- ``subgraph``: that graph compiled and added as the node ``worker`` of an outer graph,
  after a ``triage`` node that asks no model.
- ``supervisor``: a supervisor written by hand (``langgraph-supervisor`` is not pinned): an
  outer graph whose ``supervisor`` node routes (no model call) to one of two sub-agents,
  ``research_agent`` (runs of kind wasted, flaky, same_turn) or ``orders_agent`` (poll,
  paging); each is a node function that invokes its own compiled hand-written graph
  (named like the node), then hands back to the supervisor, which ends the run.

Traced by OpenInference's ``LangChainInstrumentor`` on the provider of
``driver_common.tracer_provider``. One invocation of the outer graph per run,
sequentially, each with its own ``thread_id``. Every tool call the model asks for runs
(the tool node runs the calls of one turn concurrently; ``ToolBox`` is thread-safe),
nothing is cached.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Nothing leaves loopback: LangSmith tracing off whatever the environment says.
for _name in ("LANGSMITH_TRACING", "LANGSMITH_TRACING_V2", "LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING"):
    os.environ[_name] = "false"
os.environ.pop("LANGSMITH_API_KEY", None)
os.environ.pop("LANGCHAIN_API_KEY", None)

import driver_common  # noqa: E402  (sets the no-telemetry environment first)
import scenario  # noqa: E402
from langchain.agents import create_agent  # noqa: E402
from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.tools import BaseTool, StructuredTool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode, tools_condition  # noqa: E402
from openinference.instrumentation.langchain import LangChainInstrumentor  # noqa: E402


def make_tools(box: scenario.ToolBox) -> list[BaseTool]:
    """The six tools, typed, described by ``scenario.TOOL_DOCS``, returning the ToolBox's strings."""

    return [
        StructuredTool.from_function(func=f, name=f.__name__, description=scenario.TOOL_DOCS[f.__name__])
        for f in scenario.tool_functions(box)
    ]


def hand_written(model: BaseChatModel, tools: list[BaseTool], name: str | None = None) -> Any:
    """The tutorial graph: ``agent`` (the model) -> ``tools`` (ToolNode) -> ``agent`` ... -> END."""
    bound = model.bind_tools(tools)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(name=name) if name else graph.compile()


def with_subgraph(model: BaseChatModel, tools: list[BaseTool]) -> Any:
    """``triage`` (no model) -> ``worker`` (the hand-written graph, compiled, as a node) -> END."""

    def triage(state: MessagesState) -> dict[str, Any]:
        return {"messages": []}

    graph = StateGraph(MessagesState)
    graph.add_node("triage", triage)
    graph.add_node("worker", hand_written(model, tools))
    graph.add_edge(START, "triage")
    graph.add_edge("triage", "worker")
    graph.add_edge("worker", END)
    return graph.compile(checkpointer=InMemorySaver())


ORDERS_KINDS = ("poll", "paging")


def supervisor(model: BaseChatModel, tools: list[BaseTool]) -> Any:
    """A supervisor routing each run to one of two sub-agent graphs (see the module docstring)."""
    subs = {name: hand_written(model, tools, name=name) for name in ("research_agent", "orders_agent")}

    def route(state: MessagesState) -> str:
        first = str(state["messages"][0].content)
        if any(m.type == "ai" for m in state["messages"]):
            return END  # a sub-agent answered: the supervisor ends the run
        return "orders_agent" if any(f"] {kind}:" in first for kind in ORDERS_KINDS) else "research_agent"

    def supervise(state: MessagesState) -> dict[str, Any]:
        return {"messages": []}

    def sub_agent(name: str) -> Any:
        def call(state: MessagesState) -> dict[str, Any]:
            done = subs[name].invoke({"messages": state["messages"]}, {"recursion_limit": 30})
            return {"messages": done["messages"][len(state["messages"]) :]}

        call.__name__ = name
        return call

    graph = StateGraph(MessagesState)
    graph.add_node("supervisor", supervise)
    for name in subs:
        graph.add_node(name, sub_agent(name))
        graph.add_edge(name, "supervisor")
    graph.add_edge(START, "supervisor")
    graph.add_conditional_edges("supervisor", route, [*subs, END])
    return graph.compile(checkpointer=InMemorySaver())


def build(shape: str, model: BaseChatModel, tools: list[BaseTool]) -> Any:
    if shape == "default":
        return create_agent(model, tools=tools, checkpointer=InMemorySaver())
    if shape == "react":
        from langgraph.prebuilt import create_react_agent

        return create_react_agent(model, tools, checkpointer=InMemorySaver())
    if shape == "stategraph":
        return hand_written(model, tools)
    if shape == "subgraph":
        return with_subgraph(model, tools)
    if shape == "supervisor":
        return supervisor(model, tools)
    raise SystemExit(f"unknown shape {shape!r}")


def main() -> None:
    args = driver_common.parse_args()
    provider = driver_common.tracer_provider(args, service="fw-langgraph")
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        model = ChatOpenAI(model="gpt-4o-mini", base_url=args.base_url, api_key="sk-test", max_retries=0)
        agent = build(args.shape, model, make_tools(scenario.ToolBox()))
        for i in args.run_list:
            config = {"configurable": {"thread_id": f"run-{i}"}, "recursion_limit": 30}
            result = agent.invoke({"messages": [{"role": "user", "content": scenario.task(i)}]}, config)
            print(f"run {i}: {result['messages'][-1].content}", file=sys.stderr)
    finally:
        instrumentor.uninstrument()
        provider.shutdown()


if __name__ == "__main__":
    main()
