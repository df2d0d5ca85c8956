"""smolagents driver: the scripted workload through a real ``ToolCallingAgent``.

Runs in ``.venv-fw/smolagents``. The model is ``OpenAIServerModel`` pointed at the fake
server (``--base-url``); spans come from OpenInference's ``SmolagentsInstrumentor``.
One fresh agent per run, no planning step (the server counts requests per run), and the
run ends with smolagents' own ``final_answer`` tool, which the server calls last.
``--shape managed``: that agent is the managed agent ``support_agent`` of a manager
``ToolCallingAgent`` with no tools of its own, which hands it the run's task and then
answers with its report (``scenario.Responder``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from driver_common import parse_args, tracer_provider  # first: sets HF_HUB_OFFLINE etc.
from openinference.instrumentation.smolagents import SmolagentsInstrumentor
from scenario import RUNS, TOOL_DOCS, ToolBox, task
from smolagents import OpenAIServerModel, Tool, ToolCallingAgent

Inputs = dict[str, dict[str, str]]


class _BoxTool(Tool):
    """A smolagents tool answered by the shared ``ToolBox``."""

    output_type = "string"

    def __init__(self, box: ToolBox) -> None:
        super().__init__()
        self.box = box


class SearchTool(_BoxTool):
    name = "search"
    description = TOOL_DOCS["search"]
    inputs: ClassVar[Inputs] = {"query": {"type": "string", "description": "What to search for."}}

    def forward(self, query: str) -> str:
        return self.box.search(query)


class FetchUrlTool(_BoxTool):
    name = "fetch_url"
    description = TOOL_DOCS["fetch_url"]
    inputs: ClassVar[Inputs] = {"url": {"type": "string", "description": "The page's address."}}

    def forward(self, url: str) -> str:
        return self.box.fetch_url(url)


class StartJobTool(_BoxTool):
    name = "start_job"
    description = TOOL_DOCS["start_job"]
    inputs: ClassVar[Inputs] = {"name": {"type": "string", "description": "The job's name."}}

    def forward(self, name: str) -> str:
        return self.box.start_job(name)


class JobStatusTool(_BoxTool):
    name = "job_status"
    description = TOOL_DOCS["job_status"]
    inputs: ClassVar[Inputs] = {"job_id": {"type": "string", "description": "The job's id."}}

    def forward(self, job_id: str) -> str:
        return self.box.job_status(job_id)


class ListOrdersTool(_BoxTool):
    name = "list_orders"
    description = TOOL_DOCS["list_orders"]
    inputs: ClassVar[Inputs] = {
        "customer": {"type": "string", "description": "The customer's id."},
        "page": {"type": "integer", "description": "The page number, from 1."},
    }

    def forward(self, customer: str, page: int) -> str:
        return self.box.list_orders(customer, page)


class GetOrderTool(_BoxTool):
    name = "get_order"
    description = TOOL_DOCS["get_order"]
    inputs: ClassVar[Inputs] = {"order_id": {"type": "string", "description": "The order's id."}}

    def forward(self, order_id: str) -> str:
        return self.box.get_order(order_id)


TOOLS = (SearchTool, FetchUrlTool, StartJobTool, JobStatusTool, ListOrdersTool, GetOrderTool)


def main() -> int:
    args = parse_args()
    provider = tracer_provider(args, service="fw-smolagents")
    SmolagentsInstrumentor().instrument(tracer_provider=provider)
    box = ToolBox()
    try:
        for i in args.run_list:
            model = OpenAIServerModel(
                model_id="gpt-4o-mini",
                api_base=args.base_url,
                api_key="sk-test",
                client_kwargs={"max_retries": 0},  # a retried request would shift the script
            )
            agent = ToolCallingAgent(
                tools=[cls(box) for cls in TOOLS],
                model=model,
                max_steps=10,
                planning_interval=None,
                verbosity_level=0,
            )
            worker = agent
            if args.shape == "managed":
                agent.name = "support_agent"
                agent.description = "Helps a customer with the shop's tools."
                agent = ToolCallingAgent(
                    tools=[], model=model, managed_agents=[worker], max_steps=5, planning_interval=None,
                    verbosity_level=0,
                )  # fmt: skip
            elif args.shape != "default":
                raise SystemExit(f"unknown shape {args.shape!r}")
            answer = agent.run(task(i))
            steps = sum(1 for s in worker.memory.steps if type(s).__name__ == "ActionStep")
            expected = f"Done with run {i}."
            if answer != expected or steps != len(RUNS[i]) + 1:
                raise SystemExit(f"run {i}: answer {answer!r} after {steps} steps, expected {expected!r}")
            print(f"run {i}: {answer}", file=sys.stderr)
    finally:
        SmolagentsInstrumentor().uninstrument()
        provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
