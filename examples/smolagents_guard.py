"""A smolagents agent whose tool calls go through treellm's LoopGuard.

Runs against any OpenAI-compatible endpoint (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``,
``OPENAI_MODEL``). Needs ``smolagents`` and ``openai`` beside treellm:

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 python examples/smolagents_guard.py

The model may ask for the same search again and again; with ``max_repeats=1`` and
``on_repeat="nudge"`` the tool body runs once and every repeat is answered with a note
that the call was already made. Prints what each search gave the model (the first line
of its observation), how many times the tool ran and the answer.
"""

from __future__ import annotations

import os

from smolagents import LogLevel, OpenAIServerModel, ToolCallingAgent, tool
from smolagents.memory import ActionStep

from treellm import LoopGuard
from treellm.integrations.smolagents import guard_agent

ran = [0]  # how many times the tool body ran


@tool
def search(query: str) -> str:
    """Search the help centre.

    Args:
        query: What to search for.
    """
    ran[0] += 1
    return f"3 articles match {query!r}: Returns, Refunds, Shipping."


def main() -> None:
    model = OpenAIServerModel(
        model_id=os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
        api_base=os.environ.get("OPENAI_BASE_URL"),
        api_key=os.environ.get("OPENAI_API_KEY", "sk-none"),
        client_kwargs={"max_retries": 0},
    )
    guard = LoopGuard(max_repeats=1, on_repeat="nudge", telemetry=False)
    agent = guard_agent(ToolCallingAgent(tools=[search], model=model, max_steps=6, verbosity_level=LogLevel.OFF), guard)
    answer = agent.run("What is the refund policy?")
    for step in agent.memory.steps:
        if isinstance(step, ActionStep) and step.tool_calls and step.tool_calls[0].name == "search":
            print(f"search -> {(step.observations or '').splitlines()[0]}")
    print(f"search ran {ran[0]} time(s)")
    print(f"answer: {answer}")


if __name__ == "__main__":
    main()
