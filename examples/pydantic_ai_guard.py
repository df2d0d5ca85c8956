"""A Pydantic AI agent whose tool calls go through treellm's LoopGuard.

Runs against any OpenAI-compatible endpoint (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``,
``OPENAI_MODEL``). Needs ``pydantic-ai-slim[openai]`` beside treellm:

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 python examples/pydantic_ai_guard.py

The model may ask for the same search again and again; with ``max_repeats=1`` and
``on_repeat="nudge"`` the tool body runs once and every repeat is answered with a note
that the call was already made. Prints what each search returned to the model (the first
line of its tool result), how many times the tool ran and the answer.
"""

from __future__ import annotations

import os

from pydantic_ai import Agent
from pydantic_ai.messages import ModelRequest, ToolReturnPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings

from treellm import LoopGuard
from treellm.integrations.pydantic_ai import loop_guard

ran = [0]  # how many times the tool body ran


def search(query: str) -> str:
    """Search the help centre."""
    ran[0] += 1
    return f"3 articles match {query!r}: Returns, Refunds, Shipping."


def main() -> None:
    provider = OpenAIProvider(
        base_url=os.environ.get("OPENAI_BASE_URL"), api_key=os.environ.get("OPENAI_API_KEY", "sk-none")
    )
    model = OpenAIChatModel(
        os.environ.get("OPENAI_MODEL", "gpt-4o-mini"), provider=provider, settings=ModelSettings(max_retries=0)
    )
    guard = LoopGuard(max_repeats=1, on_repeat="nudge", telemetry=False)
    agent = Agent(model, tools=[search], capabilities=[loop_guard(guard)])
    result = agent.run_sync("What is the refund policy?")
    for message in result.all_messages():
        for part in message.parts if isinstance(message, ModelRequest) else ():
            if isinstance(part, ToolReturnPart):
                print(f"{part.tool_name} -> {str(part.content).splitlines()[0]}")
    print(f"search ran {ran[0]} time(s)")
    print(f"answer: {result.output}")


if __name__ == "__main__":
    main()
