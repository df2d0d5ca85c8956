"""The scripted workload through Google ADK, traced by ADK's built-in OpenTelemetry tracing.

Runs in ``.venv-fw/adk``. One ``LlmAgent`` with the six ``scenario.ToolBox`` tools (plain
typed functions whose docstrings are the scenario descriptions; ADK wraps each as a
``FunctionTool``) on ADK's LiteLLM wrapper (``LiteLlm("openai/gpt-4o-mini")``: non-streamed
OpenAI chat completions against the fake server at ``--base-url``; ``num_retries=0``, which
litellm hands to the OpenAI client as ``max_retries=0``), one ``InMemoryRunner`` (with its
``InMemorySessionService``), a new session and one ``Runner.run_async`` per run index, in
order; a run ends when the model answers with text. The task is the ``user`` message.

Tracing: ``google.adk.telemetry`` takes its tracer from the *global* provider
(``trace.get_tracer``); there is no way to pass one, so the provider of
``driver_common.tracer_provider`` is installed globally (``trace.set_tracer_provider``)
before ADK is imported. No other instrumentor (litellm's callbacks stay off). ADK 2.x emits
its telemetry schema 2 (the default of ``ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN``, GenAI
semconv aligned; the driver unsets ADK's telemetry knobs so the shape is the default one).
Scope ``gcp.vertex.agent``. One trace per run: ``invoke_workflow support_agent``
(``gen_ai.operation.name`` = ``invoke_workflow``) -> ``invoke_agent support_agent``
(``invoke_agent``) -> children in order: ``generate_content openai/gpt-4o-mini``
(``generate_content``, one per model request) and ``execute_tool <tool>`` (``execute_tool``,
one per call). No span events in either mode.

``--capture default``: ADK as it comes: ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``
unset is ``NO_CONTENT``. An ``execute_tool`` span carries ``gen_ai.tool.name``,
``gen_ai.tool.call.id`` (the model's id, e.g. ``call_17_0``), ``gen_ai.tool.description``,
``gen_ai.tool.type`` (``FunctionTool``), ``gen_ai.agent.name`` and ``gcp.vertex.agent.event_id``,
but the arguments and the result are nowhere (no attribute, no event; the
``generate_content`` spans carry no messages either). The legacy
``gcp.vertex.agent.tool_call_args`` / ``gcp.vertex.agent.tool_response`` attributes, and their
default-on knob ``ADK_CAPTURE_MESSAGE_CONTENT_IN_SPANS``, belong to schema 1 only.

``--capture on``: ADK's content switch, the OpenTelemetry GenAI env var
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY`` (set here before ADK is
imported; ``true``/``1`` would mean ``EVENT_ONLY``: content on log records, none on spans).
An ``execute_tool`` span then also carries the span attributes ``gen_ai.tool.call.arguments``
(JSON, ``{"query": "refund policy"}``) and ``gen_ai.tool.call.result`` (JSON of ADK's
wrapped return value, ``{"result": "running"}``); the ``generate_content`` spans carry
``gen_ai.input.messages``, ``gen_ai.output.messages`` (the tool calls with their arguments),
``gen_ai.system_instructions`` and the full ``gen_ai.tool.definitions``.

Not tool calls: when the model asks for several calls in one turn (the ``same_turn`` runs),
ADK runs them in parallel and, after the one ``execute_tool search`` span per call, adds a
summary sibling span ``execute_tool (merged)`` with ``gen_ai.operation.name`` =
``execute_tool``, ``gen_ai.tool.name`` = ``(merged tools)`` and ``gen_ai.tool.call.id`` = the
merged event's id (a UUID), no arguments in either mode. ADK adds no framework-internal
tools here (no final-answer or structured-output tool: the output is plain text), and
builds no span outside the runs.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import driver_common  # also sets the no-telemetry environment
import scenario

# Nothing leaves 127.0.0.1: litellm reads its model cost map (and its other remote configs)
# from the package, not GitHub; ADK loads no .env file.
for _name, _value in {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_LOCAL_BLOG_POSTS": "True",
    "ADK_DISABLE_LOAD_DOTENV": "1",
}.items():
    os.environ.setdefault(_name, _value)
# ADK's telemetry as it comes: none of its own knobs may reshape the spans.
for _name in (
    "ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN",
    "ADK_CAPTURE_MESSAGE_CONTENT_IN_SPANS",
    "ADK_TELEMETRY_IGNORE_RUN_CONFIG",
    "ADK_EXPERIMENTAL_TELEMETRY",
    "ADK_EXPERIMENTAL_TELEMETRY_FEATURES",
    "OTEL_SEMCONV_STABILITY_OPT_IN",
):
    os.environ.pop(_name, None)

APP = "treellm_adk"
USER = "customer"
MODEL = "openai/gpt-4o-mini"
MAX_LLM_CALLS = 10
CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


def make_tools(box: scenario.ToolBox) -> list[object]:
    """The six tools as plain typed functions; ADK takes each description from the docstring."""

    return list(scenario.tool_functions(box))


async def drive(args: object, box: scenario.ToolBox) -> None:
    import litellm
    from google.adk.agents import LlmAgent
    from google.adk.agents.run_config import RunConfig
    from google.adk.models.lite_llm import LiteLlm
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    litellm.num_retries = 0
    # num_retries=0: litellm passes it to the OpenAI client as max_retries (a retried request
    # would take the next scripted turn).
    model = LiteLlm(model=MODEL, api_base=args.base_url, api_key="sk-test", num_retries=0)  # type: ignore[attr-defined]
    agent = LlmAgent(
        name="support_agent",
        model=model,
        description="Helps the customer.",
        instruction="Help the customer. Use the tools.",
        tools=make_tools(box),
    )
    runner = InMemoryRunner(agent=agent, app_name=APP)
    config = RunConfig(max_llm_calls=MAX_LLM_CALLS)
    try:
        for i in args.run_list:  # type: ignore[attr-defined]
            session = await runner.session_service.create_session(
                app_name=APP, user_id=USER, session_id=f"run-{i}-{uuid.uuid4().hex[:8]}"
            )
            message = types.Content(role="user", parts=[types.Part(text=scenario.task(i))])
            answer = ""
            async for event in runner.run_async(
                user_id=USER, session_id=session.id, new_message=message, run_config=config
            ):
                if event.is_final_response() and event.content and event.content.parts:
                    answer = "".join(p.text or "" for p in event.content.parts)
            print(f"run {i}: {answer}", file=sys.stderr)
    finally:
        await runner.close()


def main() -> None:
    args = driver_common.parse_args()
    if args.capture == "on":
        os.environ[CAPTURE_ENV] = "SPAN_ONLY"
    else:
        os.environ.pop(CAPTURE_ENV, None)
    from opentelemetry import trace

    provider = driver_common.tracer_provider(args, service="fw-adk")
    # ADK's telemetry only uses the global provider (trace.get_tracer at import).
    trace.set_tracer_provider(provider)
    try:
        asyncio.run(drive(args, scenario.ToolBox()))
    finally:
        provider.force_flush()
        provider.shutdown()


if __name__ == "__main__":
    main()
