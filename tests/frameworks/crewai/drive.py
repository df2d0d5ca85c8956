"""The scripted workload through CrewAI, traced by OpenInference.

Runs in ``.venv-fw/crewai``. One ``Agent`` (role, goal, backstory) with the six
``scenario.ToolBox`` tools (``crewai.tools.tool``-decorated functions, typed, with their
scenario descriptions), one ``Task`` whose description is ``scenario.task(i)`` and one
``Crew(...).kickoff()`` per run index, in order. The model is ``crewai.LLM("openai/gpt-4o-mini")``
on the fake server (``--base-url``): CrewAI 1.15 talks to it through its native OpenAI provider
(the ``openai`` SDK, Chat Completions, not streamed; no litellm), with the SDK's HTTP retries
off (``max_retries=0``) and CrewAI's own retry of a failed agent step off
(``max_retry_limit=0``). Tool use is native OpenAI function calling (``tools`` in the
request, ``tool_calls`` answered by ``role: tool`` messages), not CrewAI's ReAct text
protocol; two calls of one turn run in a thread pool (the copied context keeps their spans
under the agent span). The task reaches the model in the ``user`` message
(``"\\nCurrent Task: [run N] ..."``); the system message holds the role, backstory and goal.
Each run takes exactly one request per scripted turn plus the final answer: no planning,
reasoning, memory, delegation or final-answer tool. CrewAI's tool-result cache is off
(``Crew(cache=False)``, the default in 1.15, and ``Agent(cache=False)``), so a repeated
identical call executes again.

Spans: ``CrewAIInstrumentor().instrument(tracer_provider=...)`` (wrapper mode, the default)
and ``OpenAIInstrumentor().instrument(tracer_provider=...)`` on the provider of
``driver_common.tracer_provider``; no global provider is installed. The CrewAI instrumentor
makes no model spans in wrapper mode, so the OpenAI one gives them. One trace per run::

    Crew_<crew uuid>.kickoff         openinference.span.kind=CHAIN
      <role>._execute_core           AGENT ("Support agent._execute_core")
        ChatCompletion               LLM (openinference.instrumentation.openai)
        <tool>.run                   TOOL, one per executed call ("search.run")
        ...

Content capture: OpenInference records inputs and outputs unless told to hide them; its
documented switches are the ``TraceConfig`` settings ``hide_inputs`` / ``hide_outputs`` /
``hide_input_messages`` / ``hide_output_messages`` (env ``OPENINFERENCE_HIDE_INPUTS``,
``OPENINFERENCE_HIDE_OUTPUTS``, ...), all false by default.

- ``--capture default``: no ``TraceConfig`` passed (the instrumentors build their own from
  the environment, which sets none of these). A tool span carries the arguments in the
  attribute ``input.value`` (JSON, ``{"query": "refund policy"}``, ``input.mime_type``
  ``application/json``), the result in ``output.value`` (text), the name in ``tool.name``;
  no span events. No tool call id on the tool span: the ids are on the LLM spans only
  (``llm.output_messages.0.message.tool_calls.<j>.tool_call.id`` / ``.function.name`` /
  ``.function.arguments``, and ``llm.input_messages.<k>.message.tool_call_id`` on the
  answering tool message of the next request).
- ``--capture on``: the same instrumentors with an explicit ``TraceConfig`` whose hide
  settings above are all ``False`` (overriding any ``OPENINFERENCE_HIDE_*`` in the
  environment). The spans are the same as by default.

Framework-internal tool names: none (no final-answer or structured-output tool with a
plain ``str`` output and no delegation). CrewAI's own anonymous telemetry and its trace
upload are off (``CREWAI_DISABLE_TELEMETRY``, ``CREWAI_DISABLE_TRACKING``,
``CREWAI_TRACING_ENABLED=false``, ``Crew(tracing=False)``), as is its version check on PyPI;
nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import driver_common  # also sets the no-telemetry environment (CREWAI_DISABLE_TELEMETRY=true)
import scenario

# Before crewai is imported: its telemetry, its trace upload to CrewAI's cloud and its
# version check, off; its storage in a scratch folder.
for _name, _value in {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "CREWAI_DISABLE_VERSION_CHECK": "true",
}.items():
    os.environ.setdefault(_name, _value)
_STORAGE = tempfile.TemporaryDirectory(prefix="crewai-")  # its kickoff-outputs SQLite file; removed at exit
os.environ.setdefault("CREWAI_STORAGE_DIR", _STORAGE.name)

from crewai import LLM, Agent, Crew, Process, Task  # noqa: E402
from crewai.tools import BaseTool, tool  # noqa: E402
from openinference.instrumentation import TraceConfig  # noqa: E402
from openinference.instrumentation.crewai import CrewAIInstrumentor  # noqa: E402
from openinference.instrumentation.openai import OpenAIInstrumentor  # noqa: E402

MODEL = "openai/gpt-4o-mini"
MAX_ITER = 10


def make_tools(box: scenario.ToolBox) -> list[BaseTool]:
    """The six tools, typed, with their scenario descriptions; every call runs the ToolBox."""

    tools: list[BaseTool] = []
    for fn in scenario.tool_functions(box):  # the decorator takes the docstring
        tools.append(tool(fn.__name__)(fn))
    return tools


def make_agent(args: object, box: scenario.ToolBox) -> Agent:
    # max_retries=0: an HTTP request retried by the SDK would take the next scripted turn.
    llm = LLM(model=MODEL, base_url=args.base_url, api_key="sk-test", max_retries=0)  # type: ignore[attr-defined]
    return Agent(
        role="Support agent",
        goal="Help the customer. Use the tools.",
        backstory="You answer customers of an online shop.",
        tools=make_tools(box),
        llm=llm,
        cache=False,
        max_iter=MAX_ITER,
        max_retry_limit=0,
        allow_delegation=False,
    )


def main() -> None:
    args = driver_common.parse_args()
    if args.shape != "default":
        raise SystemExit(f"unknown shape {args.shape!r}")
    # CrewAI estimates token counts for every request and warns each time; keep stderr readable.
    logging.getLogger("crewai.llms.base_llm").setLevel(logging.ERROR)
    provider = driver_common.tracer_provider(args, service="fw-crewai")
    options: dict[str, object] = {"tracer_provider": provider}
    if args.capture == "on":
        options["config"] = TraceConfig(
            hide_inputs=False, hide_outputs=False, hide_input_messages=False, hide_output_messages=False
        )
    CrewAIInstrumentor().instrument(**options)
    OpenAIInstrumentor().instrument(**options)
    agent = make_agent(args, scenario.ToolBox())
    try:
        for i in args.run_list:
            task = Task(description=scenario.task(i), expected_output="A short answer.", agent=agent)
            crew = Crew(agents=[agent], tasks=[task], process=Process.sequential, cache=False, tracing=False)
            result = crew.kickoff()
            print(f"run {i}: {result.raw}", file=sys.stderr)
    finally:
        provider.shutdown()


if __name__ == "__main__":
    main()
