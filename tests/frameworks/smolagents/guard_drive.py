"""LoopGuard in a smolagents agent: N identical calls of one tool, through a real ``ToolCallingAgent``.

Runs in ``.venv-fw/smolagents`` (smolagents and treellm's core). One agent on
``OpenAIServerModel`` against the fake server of
``tests/test_integrations_smol_pydantic.py`` (which asks for the calls: one per step,
``sequential``, or N in one step, ``parallel``, which smolagents runs in a thread pool; then
``final_answer``), guarded by ``guard_agent(agent, LoopGuard(max_repeats=L,
on_repeat=ACTION))``; ``--runs R`` ``agent.run`` calls of that one agent, each its own
conversation (``--stream``: through ``run(..., stream=True)``; ``--keep-memory``:
``guard_agent(..., end_runs=False)`` and every run after the first with ``reset=False``, one
conversation for them all). With ``--instrument`` OpenInference's ``SmolagentsInstrumentor``
traces the agent and the guard writes on its spans; without it the guard makes its own
spans. Spans go where the ``driver_common`` options say (the guard gets the same tracer
provider). Prints a JSON summary: how many times the tool body ran, per run the observation
each call gave the model (``ToolOutput.observation``), and how many conversations the guard
started and ended.

    guard_drive.py --base-url URL --otlp-file PATH --mode sequential|parallel --calls N
                   --limit L --action prune|nudge|cache [--runs 0-R] [--instrument] [--stream]
                   [--keep-memory]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import driver_common  # first: sets HF_HUB_OFFLINE and the no-telemetry environment
from openinference.instrumentation.smolagents import SmolagentsInstrumentor
from smolagents import LogLevel, OpenAIServerModel, Tool, ToolCall, ToolCallingAgent, ToolOutput
from smolagents.memory import ActionStep
from smolagents.models import ChatMessage

from treellm import LoopGuard
from treellm.engine.events import Event
from treellm.integrations.smolagents import guard_agent

RESULT = "3 articles match 'refund policy': Returns, Refunds, Shipping."


def guard_args() -> tuple[argparse.Namespace, argparse.Namespace]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("sequential", "parallel"), required=True)
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--limit", type=int, required=True)
    parser.add_argument("--action", choices=("prune", "nudge", "cache"), required=True)
    parser.add_argument("--instrument", action="store_true")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--keep-memory", action="store_true", help="end_runs=False; runs after the first reset=False")
    ours, rest = parser.parse_known_args()
    return ours, driver_common.parse_args(rest)


def task(mode: str, calls: int, run: int) -> str:
    """The user message; the fake server reads the mode and the number of calls from it."""
    return f"[guard {mode} {calls} run {run}] look up the refund policy."


class SearchTool(Tool):
    name = "search"
    description = "Search the help centre."
    inputs: ClassVar[dict[str, dict[str, str]]] = {"query": {"type": "string", "description": "What to search for."}}
    output_type = "string"

    def __init__(self) -> None:
        super().__init__()
        self.bodies = 0
        self._lock = threading.Lock()

    def forward(self, query: str) -> str:
        with self._lock:
            self.bodies += 1
        return RESULT


class RecordingAgent(ToolCallingAgent):  # type: ignore[misc]
    """Keeps what each tool call gave the model (its observation), final answers apart."""

    seen: list[dict[str, Any]]

    def process_tool_calls(self, chat_message: ChatMessage, memory_step: ActionStep) -> Iterator[ToolCall | ToolOutput]:
        for output in super().process_tool_calls(chat_message, memory_step):
            if isinstance(output, ToolOutput) and not output.is_final_answer:
                self.seen.append({"content": output.observation, "call_id": output.id})
            yield output


def main() -> None:
    ours, args = guard_args()
    provider = driver_common.tracer_provider(args, service="guard-smolagents")
    started: list[str] = []
    ended: list[str] = []

    def observe(event: Event) -> None:
        if event.type == "run:start":
            started.append(event.run_id)
        elif event.type == "run:complete":
            ended.append(event.run_id)

    guard = LoopGuard(
        max_repeats=ours.limit, on_repeat=ours.action, tracer_provider=provider, observers=[observe], name="support"
    )
    tool = SearchTool()
    model = OpenAIServerModel(
        model_id="gpt-4o-mini", api_base=args.base_url, api_key="sk-test", client_kwargs={"max_retries": 0}
    )
    agent = guard_agent(
        RecordingAgent(
            tools=[tool], model=model, max_steps=ours.calls + 3, planning_interval=None, verbosity_level=LogLevel.OFF
        ),
        guard,
        end_runs=not ours.keep_memory,
    )
    instrumentor = SmolagentsInstrumentor() if ours.instrument else None
    if instrumentor is not None:  # after guarding: the guarded run looks the class's run up per call
        instrumentor.instrument(tracer_provider=provider)
    runs = []
    try:
        for n, i in enumerate(args.run_list):
            agent.seen = []
            reset = not (ours.keep_memory and n > 0)
            if ours.stream:
                steps = list(agent.run(task(ours.mode, ours.calls, i), stream=True, reset=reset))
                answer = steps[-1].output
            else:
                answer = agent.run(task(ours.mode, ours.calls, i), reset=reset)
            if answer != "Done.":
                raise SystemExit(f"run {i}: answer {answer!r}")
            runs.append(agent.seen)
        print(json.dumps({"bodies": tool.bodies, "runs": runs, "started": len(started), "ended": len(ended)}))
    finally:
        guard.close()
        if instrumentor is not None:
            instrumentor.uninstrument()
        provider.shutdown()


if __name__ == "__main__":
    main()
