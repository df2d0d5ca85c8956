"""LoopGuard in a Pydantic AI agent: N identical calls of one tool, through the real framework.

Runs in ``.venv-fw/pydanticai`` (pydantic-ai-slim and treellm's core). One agent on
``OpenAIChatModel`` against the fake server of ``tests/test_integrations_smol_pydantic.py``
(which asks for the calls: one per turn, ``sequential``, or N in one turn, ``parallel``,
which Pydantic AI runs concurrently; then a text answer), guarded by the capability
``loop_guard(LoopGuard(max_repeats=L, on_repeat=ACTION))``; ``--runs R`` ``run_sync``
calls, each its own conversation (the run id; ``--conversation``: ``per="conversation"`` and
every run after the first continues the previous one's ``message_history``). With ``--instrument`` Pydantic AI's own
``Instrumentation`` capability traces the agent and the guard writes on its spans; without
it the guard makes its own spans. Spans go where the ``driver_common`` options say (the
guard gets the same tracer provider). Prints a JSON summary: how many times the tool body
ran, per run what each call returned to the model (its ``ToolReturnPart``), and how many
conversations the guard started and ended.

    guard_drive.py --base-url URL --otlp-file PATH --mode sequential|parallel --calls N
                   --limit L --action prune|nudge|cache [--runs 0-R] [--instrument] [--conversation]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import driver_common  # also sets the no-telemetry environment
from pydantic_ai import Agent, InstrumentationSettings
from pydantic_ai.capabilities import Instrumentation
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import UsageLimits

from treellm import LoopGuard
from treellm.engine.events import Event
from treellm.integrations.pydantic_ai import loop_guard

RESULT = "3 articles match 'refund policy': Returns, Refunds, Shipping."


def guard_args() -> tuple[argparse.Namespace, argparse.Namespace]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("sequential", "parallel"), required=True)
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--limit", type=int, required=True)
    parser.add_argument("--action", choices=("prune", "nudge", "cache"), required=True)
    parser.add_argument("--instrument", action="store_true")
    parser.add_argument("--conversation", action="store_true", help="per='conversation'; runs continue the history")
    ours, rest = parser.parse_known_args()
    return ours, driver_common.parse_args(rest)


def task(mode: str, calls: int, run: int) -> str:
    """The user message; the fake server reads the mode and the number of calls from it."""
    return f"[guard {mode} {calls} run {run}] look up the refund policy."


def main() -> None:
    ours, args = guard_args()
    provider = driver_common.tracer_provider(args, service="guard-pydanticai")
    started: list[str] = []
    ended: list[str] = []
    bodies = 0
    lock = threading.Lock()

    def observe(event: Event) -> None:
        if event.type == "run:start":
            started.append(event.run_id)
        elif event.type == "run:complete":
            ended.append(event.run_id)

    guard = LoopGuard(
        max_repeats=ours.limit, on_repeat=ours.action, tracer_provider=provider, observers=[observe], name="support"
    )
    openai_provider = OpenAIProvider(base_url=args.base_url, api_key="sk-test")
    # max_retries=0: an HTTP request retried by the SDK would take the next scripted turn.
    model = OpenAIChatModel("gpt-4o-mini", provider=openai_provider, settings=ModelSettings(max_retries=0))
    instrumentation = [Instrumentation(settings=InstrumentationSettings(tracer_provider=provider))]
    agent: Agent[None, str] = Agent(
        model,
        name="support_agent",
        instructions="Help the customer. Use the tools.",
        output_type=str,
        capabilities=[
            *(instrumentation if ours.instrument else []),
            loop_guard(guard, per="conversation" if ours.conversation else "run"),
        ],
    )

    @agent.tool_plain(name="search", description="Search the help centre.")
    def search(query: str) -> str:
        nonlocal bodies
        with lock:
            bodies += 1
        return RESULT

    runs: list[list[dict[str, Any]]] = []
    history: list[ModelMessage] | None = None
    try:
        for i in args.run_list:
            result = agent.run_sync(
                task(ours.mode, ours.calls, i),
                usage_limits=UsageLimits(request_limit=ours.calls + 3),
                message_history=history,
            )
            if ours.conversation:
                history = result.all_messages()
            if result.output != "Done.":
                raise SystemExit(f"run {i}: answer {result.output!r}")
            runs.append(
                [
                    {"content": str(part.content), "call_id": part.tool_call_id}
                    for message in result.new_messages()
                    if isinstance(message, ModelRequest)
                    for part in message.parts
                    if isinstance(part, ToolReturnPart)
                ]
            )
        print(json.dumps({"bodies": bodies, "runs": runs, "started": len(started), "ended": len(ended)}))
    finally:
        guard.close()
        provider.shutdown()


if __name__ == "__main__":
    main()
