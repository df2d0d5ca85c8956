"""The scripted workload through Strands Agents, traced by its built-in OpenTelemetry tracing.

Runs in ``.venv-fw/strands``. One agent (``strands.Agent``) with the six ``scenario.ToolBox``
tools (``@strands.tool``, typed, with their scenario descriptions) on
``strands.models.openai.OpenAIModel`` against the fake server (``--base-url``;
``client_args`` with ``max_retries=0``, and the agent's own ``retry_strategy=None``, so no
request is ever repeated), streaming. One agent invocation per run index, in order; each run
gets a fresh ``Agent`` on the same model and tools, since an agent keeps its conversation
history between calls (a reused one would send the previous run's ``[run N]`` first). Strands
runs a turn's tool calls with its default ``ConcurrentToolExecutor``, so the two identical
``search`` calls of a same_turn run execute concurrently. No callback handler (nothing
printed), no tools loaded from a directory, no framework-internal tools (no structured
output is asked for, so Strands adds no ``StructuredOutputTool``).

Tracing: Strands' ``strands.telemetry.tracer.Tracer`` (one per process, ``get_tracer()``) takes
the **global** tracer provider (``opentelemetry.trace.get_tracer_provider()``; a provider
given to ``StrandsTelemetry(tracer_provider=...)`` is only kept, not used by the tracer), so
the provider of ``driver_common.tracer_provider`` is installed globally with
``trace.set_tracer_provider`` before any agent exists. Strands also calls
``ThreadingInstrumentor().instrument()`` (context crosses its threads). Strands has no
telemetry of its own that leaves the process; nothing leaves 127.0.0.1.

Content capture: Strands records tool arguments and results in both modes (there is no
content on/off switch; its only content control is redaction, the opt-in token
``gen_ai_unredacted_attributes=...``, unused here). What changes is where they are:

- ``--capture default``: ``OTEL_SEMCONV_STABILITY_OPT_IN`` unset (removed from the
  environment). Each ``execute_tool <name>`` span has the attributes
  ``gen_ai.operation.name=execute_tool``, ``gen_ai.system=strands-agents``,
  ``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``gen_ai.tool.description``,
  ``gen_ai.tool.json_schema``, ``gen_ai.tool.status`` (``success`` or ``error``) but no
  arguments or result as attributes: the arguments are in the span event
  ``gen_ai.tool.message`` (attributes ``role=tool``, ``content`` = the arguments as JSON,
  e.g. ``{"query": "refund policy"}``, ``id`` = the call id) and the result in the span
  event ``gen_ai.choice`` (``message`` = the tool result's content blocks as JSON, e.g.
  ``[{"text": "3 articles match ..."}]``, ``id``). Events of the same names also sit on the
  ``chat`` and ``execute_event_loop_cycle`` spans, holding conversation messages (a
  ``gen_ai.tool.message`` there is a list of ``toolResult`` blocks fed back to the model,
  a ``gen_ai.choice`` the model's ``toolUse`` blocks): they are not tool calls.
- ``--capture on``: ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` (Strands'
  documented switch to the latest GenAI semantic conventions). The tool span has
  ``gen_ai.provider.name=strands-agents`` instead of ``gen_ai.system`` and the attributes
  ``gen_ai.tool.call.arguments`` (JSON) and ``gen_ai.tool.call.result`` (the content blocks
  as JSON; left out when the tool's status is ``error``), plus two span events named
  ``gen_ai.client.inference.operation.details``: the first with ``gen_ai.input.messages``
  (``[{"role": "tool", "parts": [{"type": "tool_call", "name", "id", "arguments"}]}]``),
  the second with ``gen_ai.output.messages`` (``[{"role": "tool", "parts":
  [{"type": "tool_call_response", "id", "response"}]}]``). The ``chat`` spans' events carry
  ``gen_ai.system_instructions``, ``gen_ai.input.messages`` and ``gen_ai.output.messages``
  (the model's ``tool_call`` parts with their arguments): again not tool calls.

Spans per run, either mode: one ``invoke_agent support_agent`` root, one
``execute_event_loop_cycle`` child per model turn, under each cycle one ``chat`` span and the
``execute_tool <name>`` spans of that turn; one trace per run, all spans INTERNAL.

The environment variable is read when Strands' tracer is first made, so it is set here
before ``strands`` is imported.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import driver_common  # also sets the no-telemetry environment
import scenario
from opentelemetry import trace

MODEL = "gpt-4o-mini"
SWITCH = "OTEL_SEMCONV_STABILITY_OPT_IN"
LATEST = "gen_ai_latest_experimental"


def make_tools(box: scenario.ToolBox) -> list[Any]:
    """The six tools, typed, with their scenario descriptions; every call runs the ToolBox."""
    from strands import tool

    return [
        tool(fn, name=fn.__name__, description=scenario.TOOL_DOCS[fn.__name__]) for fn in scenario.tool_functions(box)
    ]


def main() -> None:
    args = driver_common.parse_args()
    if args.shape != "default":
        raise SystemExit(f"unknown shape {args.shape!r}")
    if args.capture == "on":
        os.environ[SWITCH] = LATEST
    else:
        os.environ.pop(SWITCH, None)
    provider = driver_common.tracer_provider(args, service="fw-strands")
    # Strands' tracer only uses the global provider.
    trace.set_tracer_provider(provider)

    from strands import Agent
    from strands.models.openai import OpenAIModel
    from strands.telemetry.tracer import get_tracer

    if get_tracer().use_latest_genai_conventions != (args.capture == "on"):
        raise SystemExit(f"{SWITCH} was not taken: {os.environ.get(SWITCH)!r}")

    # max_retries=0: an HTTP request retried by the SDK would take the next scripted turn.
    model = OpenAIModel(
        client_args={"base_url": args.base_url, "api_key": "sk-test", "max_retries": 0},
        model_id=MODEL,
    )
    tools = make_tools(scenario.ToolBox())
    try:
        for i in args.run_list:
            agent = Agent(
                model=model,
                tools=tools,
                system_prompt="Help the customer. Use the tools.",
                name="support_agent",
                callback_handler=None,
                retry_strategy=None,  # no model call retried (a retry would take the next turn)
            )
            result = agent(scenario.task(i))
            print(f"run {i}: {str(result).strip()}", file=sys.stderr)
    finally:
        provider.shutdown()


if __name__ == "__main__":
    main()
