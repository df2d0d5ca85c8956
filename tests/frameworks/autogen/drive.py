"""The scripted workload through AutoGen AgentChat, traced by AutoGen's own telemetry, or
(``--capture on``) by OpenInference's AutoGen AgentChat instrumentor instead.

Runs in ``.venv-fw/autogen``. One ``AssistantAgent`` with the six ``scenario.ToolBox`` tools
(``FunctionTool``, typed, with their scenario descriptions) on ``OpenAIChatCompletionClient``
against the fake server (``--base-url``, ``max_retries=0``: a retried request would take the
next scripted turn), one ``agent.run(task=...)`` per run index, in order, with
``agent.on_reset`` in between (the agent keeps its chat history otherwise, and the server
finds the run from the first user message). ``max_tool_iterations=10`` lets the agent loop
over the tool turns; ``reflect_on_tool_use=False``: the model's plain text answer ends the
run, with no extra request. A turn's calls run concurrently (``asyncio.gather``).

``--capture default``: AutoGen's built-in GenAI spans (``autogen_core._telemetry._genai``:
``trace_create_agent_span``, ``trace_invoke_agent_span``, ``trace_tool_span``). These take
their tracer from the *global* provider (``trace.get_tracer("autogen-core")``, no way to pass
one to ``AssistantAgent``; only the agent runtimes take a ``tracer_provider``, and
``AssistantAgent.run`` uses none), so this mode installs the provider of
``driver_common.tracer_provider`` globally with ``trace.set_tracer_provider``, before the agent
is built. Spans (tracer ``autogen-core``):

- ``create_agent support_agent`` (``gen_ai.operation.name=create_agent``, SpanKind CLIENT),
  made by ``BaseChatAgent.__init__``: a trace of its own, holding no model or tool call;
- ``invoke_agent support_agent`` (``invoke_agent``), one per run, the root of its trace;
- ``execute_tool <tool>`` (``execute_tool``, INTERNAL), a child of it per tool call, with
  ``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``gen_ai.tool.description``,
  ``gen_ai.system=autogen``. **No tool arguments and no results anywhere** (no attribute,
  no event), and no span at all for the model requests (the OpenAI client is not traced).

AutoGen (0.7.5) has no switch that records tool-call content: ``trace_tool_span`` never sets
the arguments or result (``BaseTool.run_json`` only logs them, as a ``ToolCallEvent`` on the
``autogen_core.events`` logger); its only telemetry environment variable,
``AUTOGEN_DISABLE_RUNTIME_TRACING=true``, turns the runtime's messaging spans off (a runtime
``AssistantAgent.run`` does not use); there is no GenAI content-capture setting. So:

``--capture on``: ``openinference.instrumentation.autogen_agentchat.AutogenAgentChatInstrumentor``
(package ``openinference-instrumentation-autogen-agentchat``; ``instrument(tracer_provider=...)``
with the provider passed, default ``TraceConfig``: inputs and outputs recorded) *instead of*
AutoGen's own spans: the global provider is left unset, so AutoGen's spans (``create_agent``
included) go to the no-op provider and each tool call is traced once. OpenInference spans
(tracer ``openinference.instrumentation.autogen_agentchat``), all attributes, no events:

- ``support_agent.on_messages_stream`` (``openinference.span.kind=AGENT``), one per run, the
  root of its trace: ``input.value`` (a Python repr of the messages), ``graph.node.id``,
  ``graph.node.parent_id``; no ``output.value``;
- ``OpenAIChatCompletionClient.create`` (``LLM``), one per model request, child of the agent
  span: ``llm.model_name``, ``llm.input_messages.*`` (tool results as role ``function`` with
  JSON in ``llm.input_messages.N.function.M``), ``llm.output_messages.0.message.tool_calls.N.
  tool_call.{id,function.name,function.arguments}``, ``output.value`` (JSON), token counts;
  no ``llm.tools.*``;
- ``support_agent.<tool>`` (``TOOL``), one per tool call, a sibling of the LLM spans under the
  agent span: ``tool.name``, ``tool.description``, ``tool.parameters`` and ``input.value``
  (the arguments, JSON), ``output.value`` (the result, ``output.mime_type=text/plain``).
  No call id on the tool span (only on the LLM span's ``...tool_call.id``).

No framework-internal tools: no final-answer or structured-output tool (``output_content_type``
unset, no handoffs). AutoGen sends no telemetry of its own; nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import driver_common  # also sets the no-telemetry environment
import scenario
from autogen_agentchat.agents import AssistantAgent
from autogen_core import CancellationToken
from autogen_core.models import ModelFamily, ModelInfo
from autogen_core.tools import FunctionTool
from autogen_ext.models.openai import OpenAIChatCompletionClient
from opentelemetry import trace

MODEL = "gpt-4o-mini"
MAX_TOOL_ITERATIONS = 10
MODEL_INFO = ModelInfo(
    vision=False,
    function_calling=True,
    json_output=False,
    family=ModelFamily.GPT_4O,
    structured_output=False,
    multiple_system_messages=True,
)


def make_tools(box: scenario.ToolBox) -> list[FunctionTool]:
    """The six tools, typed, with their scenario descriptions; every call runs the ToolBox."""

    return [
        FunctionTool(fn, description=scenario.TOOL_DOCS[fn.__name__], name=fn.__name__)
        for fn in scenario.tool_functions(box)
    ]


async def drive(args: argparse.Namespace, box: scenario.ToolBox) -> None:
    client = OpenAIChatCompletionClient(
        model=MODEL,
        base_url=args.base_url,
        api_key="sk-test",
        max_retries=0,
        model_info=MODEL_INFO,
    )
    agent = AssistantAgent(
        "support_agent",
        model_client=client,
        tools=make_tools(box),  # type: ignore[arg-type]
        system_message="Help the customer. Use the tools.",
        reflect_on_tool_use=False,
        max_tool_iterations=MAX_TOOL_ITERATIONS,
    )
    try:
        for i in args.run_list:
            result = await agent.run(task=scenario.task(i))
            print(f"run {i}: {result.messages[-1].to_text()}", file=sys.stderr)
            await agent.on_reset(CancellationToken())
    finally:
        await client.close()


def main() -> None:
    args = driver_common.parse_args()
    provider = driver_common.tracer_provider(args, service="fw-autogen")
    if args.capture == "on":
        from openinference.instrumentation.autogen_agentchat import AutogenAgentChatInstrumentor

        AutogenAgentChatInstrumentor().instrument(tracer_provider=provider)
    else:
        # AutoGen's GenAI spans use the global provider only.
        trace.set_tracer_provider(provider)
    try:
        asyncio.run(drive(args, scenario.ToolBox()))
    finally:
        provider.shutdown()


if __name__ == "__main__":
    main()
