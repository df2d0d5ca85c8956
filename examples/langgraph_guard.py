"""A LangGraph agent whose tool calls go through treellm's LoopGuard.

Runs against any OpenAI-compatible endpoint (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``,
``OPENAI_MODEL``). Needs ``langchain``, ``langchain-openai`` and ``langgraph`` beside treellm:

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 python examples/langgraph_guard.py

The model may ask for the same search again and again; with ``max_repeats=1`` and
``on_repeat="nudge"`` the tool body runs once and every repeat is answered with a note
that the call was already made. Prints how many times the tool ran and the answer.
"""

from __future__ import annotations

import os

from langchain.agents import create_agent
from langchain_core.tools import StructuredTool
from langchain_openai import ChatOpenAI

from treellm import LoopGuard
from treellm.integrations.langgraph import loop_guard_middleware

ran = [0]  # how many times the tool body ran


def search(query: str) -> str:
    """Search the help centre."""
    ran[0] += 1
    return f"3 articles match {query!r}: Returns, Refunds, Shipping."


def main() -> None:
    model = ChatOpenAI(
        model=os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
        base_url=os.environ.get("OPENAI_BASE_URL"),
        api_key=os.environ.get("OPENAI_API_KEY", "sk-none"),
        max_retries=0,
    )
    tool = StructuredTool.from_function(func=search, name="search", description="Search the help centre.")
    guard = LoopGuard(max_repeats=1, on_repeat="nudge", telemetry=False)
    agent = create_agent(model, tools=[tool], middleware=[loop_guard_middleware(guard)])
    state = agent.invoke(
        {"messages": [{"role": "user", "content": "What is the refund policy?"}]},
        {"configurable": {"thread_id": "support-1"}},
    )
    print(f"search ran {ran[0]} time(s)")
    print(f"answer: {state['messages'][-1].content}")


if __name__ == "__main__":
    main()
