"""The scripted workload that every framework driver runs, and its truth.

Plain Python with no dependencies: it is imported by the tests (main virtual
environment) and by each framework's driver (``tests/frameworks/<name>/drive.py``,
run in that framework's own virtual environment).

- ``RUNS``: 25 runs, each a list of turns, each turn the tool calls the model asks for
  (the fake OpenAI-compatible server answers turn k of run i with ``RUNS[i][k]``, then
  with a final answer). Five kinds of run, five of each: wasted repeats, a flaky tool
  retried, a polled job, paging, two identical calls in one turn.
- ``ToolBox``: the tools, deterministic from their arguments and how often those
  arguments were seen before (each run uses its own url, job and customer, so one
  process can run every run).
- ``Responder``: the server side. It finds the run from the marker ``[run N]`` in the
  first user message and answers that run's requests in order, one turn each;
  framework-internal final-answer tools (smolagents' ``final_answer``) are used for the
  last turn when the request offers them. A request that offers none of the six tools
  but some other one (an Agents SDK handoff ``transfer_to_...``, a smolagents managed
  agent) comes from an agent that delegates: its first such request in a run calls that
  tool once (a handoff with no arguments, a managed agent with the run's task), the next
  one answers; neither takes a turn of the run.
- ``TRUTH``: what a correct import of the traces says, counted by hand from ``RUNS``
  and the tools (see the comments), checked against ``truth_from_script()``.
  ``without_arguments(truth)`` is what a correct import says of traces whose tool spans
  hold no arguments (a framework's content capture off): the same runs and calls, every
  call's arguments unknown, so no repeat, no paging and no verdict.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "KINDS",
    "RUNS",
    "TASK_MARK",
    "TOOL_DOCS",
    "TRUTH",
    "Responder",
    "ScriptCall",
    "ToolBox",
    "task",
    "tool_functions",
    "truth_from_script",
    "without_arguments",
]

TASK_MARK = re.compile(r"\[run (\d+)\]")


@dataclass(frozen=True)
class ScriptCall:
    tool: str
    arguments: Mapping[str, Any]


KINDS = ("wasted", "flaky", "poll", "paging", "same_turn")


def _run(i: int) -> list[list[ScriptCall]]:
    kind = KINDS[i % len(KINDS)]
    if kind == "wasted":  # the same search three times: two wasted repeats
        q = ScriptCall("search", {"query": "refund policy"})
        return [[q], [q], [q]]
    if kind == "flaky":  # a fetch that fails, then succeeds on its retry: one productive repeat
        f = ScriptCall("fetch_url", {"url": f"https://shop.example/orders/{i}"})
        return [[f], [f]]
    if kind == "poll":  # a job polled until done: running, running (wasted), done (productive)
        job = f"job-{i}"
        s = ScriptCall("job_status", {"job_id": job})
        return [[ScriptCall("start_job", {"name": f"export-{i}"})], [s], [s], [s]]
    if kind == "paging":  # three pages of one list: no exact repeat, two paging moves
        return [[ScriptCall("list_orders", {"customer": f"c{i}", "page": page})] for page in (1, 2, 3)]
    # same_turn: two identical calls in one turn (one wasted repeat), then a different call
    s = ScriptCall("search", {"query": f"order {i} status"})
    return [[s, s], [ScriptCall("get_order", {"order_id": f"o-{i}"})]]


RUNS: tuple[list[list[ScriptCall]], ...] = tuple(_run(i) for i in range(25))


def task(i: int) -> str:
    """The user message of run ``i`` (the marker tells the server which run asks)."""
    return f"[run {i}] {KINDS[i % len(KINDS)]}: help the customer, using the tools."


TOOL_DOCS = {
    "search": "Search the help centre.",
    "fetch_url": "Fetch a web page.",
    "start_job": "Start an export job.",
    "job_status": "The status of an export job.",
    "list_orders": "One page of a customer's orders.",
    "get_order": "One order.",
}


class ToolBox:
    """The tools. Thread-safe: frameworks run a turn's calls concurrently."""

    def __init__(self) -> None:
        self._seen: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _count(self, key: str) -> int:
        with self._lock:
            self._seen[key] += 1
            return self._seen[key]

    def search(self, query: str) -> str:
        return f"3 articles match {query!r}: Returns, Refunds, Shipping."

    def fetch_url(self, url: str) -> str:
        if self._count(f"fetch:{url}") == 1:
            return "Error: upstream timed out"
        return f"<html><body>Order page {url.rsplit('/', 1)[-1]}: shipped.</body></html>"

    def start_job(self, name: str) -> str:
        return f"started job-{name.removeprefix('export-')}"

    def job_status(self, job_id: str) -> str:
        return "running" if self._count(f"job:{job_id}") < 3 else f"{job_id} done: 42 rows"

    def list_orders(self, customer: str, page: int) -> str:
        first = (int(page) - 1) * 2 + 1
        return f"{customer} orders {first}-{first + 1}: o-{first}, o-{first + 1}"

    def get_order(self, order_id: str) -> str:
        return f"{order_id}: 2 items, shipped"

    def call(self, tool: str, arguments: Mapping[str, Any]) -> str:
        return str(getattr(self, tool)(**arguments))


def tool_functions(box: ToolBox) -> tuple[Callable[..., str], ...]:
    """The six tools as plain functions of ``box``, typed (``list_orders(customer: str, page:
    int)``), named as the script names them and documented (``__doc__``) by ``TOOL_DOCS``: what
    the drivers hand their framework, which reads a function's name, signature and docstring."""

    def search(query: str) -> str:
        return box.search(query)

    def fetch_url(url: str) -> str:
        return box.fetch_url(url)

    def start_job(name: str) -> str:
        return box.start_job(name)

    def job_status(job_id: str) -> str:
        return box.job_status(job_id)

    def list_orders(customer: str, page: int) -> str:
        return box.list_orders(customer, page)

    def get_order(order_id: str) -> str:
        return box.get_order(order_id)

    functions = (search, fetch_url, start_job, job_status, list_orders, get_order)
    for function in functions:
        function.__doc__ = TOOL_DOCS[function.__name__]
    return functions


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return " ".join(str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content)
    return ""


@dataclass
class Responder:
    """The fake model: ``reply(body)`` -> ``{"text": ...}`` or ``{"calls": [(name, arguments), ...]}``.

    Stateful per run: the k-th request that carries ``[run N]`` gets turn k of run N.
    """

    served: Counter[int] = field(default_factory=Counter)
    delegated: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def reply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        run = None
        for message in body.get("messages") or ():
            if message.get("role") == "user":
                found = TASK_MARK.search(_text(message.get("content")))
                if found:
                    run = int(found.group(1))
                    break
        if run is None:
            return {"text": "no run marker"}
        answer = f"Done with run {run}."
        names = {t.get("function", {}).get("name") for t in body.get("tools") or () if isinstance(t, Mapping)}
        delegates = sorted(str(n) for n in names if n and n not in TOOL_DOCS and n != "final_answer")
        if delegates and not names & TOOL_DOCS.keys():
            with self._lock:
                first = run not in self.delegated
                self.delegated.add(run)
            if first:
                tool = delegates[0]
                return {"calls": [(tool, {} if tool.startswith("transfer_to_") else {"task": task(run)})]}
        else:
            with self._lock:
                turn = self.served[run]
                self.served[run] += 1
            turns = RUNS[run]
            if turn < len(turns):
                return {"calls": [(c.tool, dict(c.arguments)) for c in turns[turn]]}
        if "final_answer" in names:
            return {"calls": [("final_answer", {"answer": answer})]}
        return {"text": answer}


# The truth, counted by hand. Per five runs: wasted 3 calls (2 wasted repeats), flaky 2
# (1 productive: the error, then the page), poll 4 (job_status running, running = wasted,
# done = productive), paging 3 (no repeat; 2 paging moves), same_turn 3 (1 wasted).
TRUTH: dict[str, Any] = {
    "runs": 25,
    "calls": 75,
    "calls_by_tool": {
        "search": 25,  # 5 x 3 + 5 x 2
        "fetch_url": 10,
        "start_job": 5,
        "job_status": 15,
        "list_orders": 15,
        "get_order": 5,
    },
    "repeats_by_tool": {"search": 15, "fetch_url": 5, "job_status": 10},
    "productive_by_tool": {"search": 0, "fetch_url": 5, "job_status": 5},
    "wasted_by_tool": {"search": 15, "fetch_url": 0, "job_status": 5},
    "paging_by_tool": {"list_orders": 10},
    "verdicts": {"search": "keep", "fetch_url": "insufficient_data", "job_status": "raise"},
    "arguments_unknown_by_tool": {},
}


def without_arguments(truth: Mapping[str, Any]) -> dict[str, Any]:
    """``truth`` for traces whose tool spans hold no arguments: missing is never equal."""
    none: dict[str, Any] = {"repeats_by_tool": {}, "productive_by_tool": {}, "wasted_by_tool": {}, "paging_by_tool": {}}
    if "verdicts" in truth:
        none["verdicts"] = {}
    return {**truth, **none, "arguments_unknown_by_tool": dict(truth["calls_by_tool"])}


def truth_from_script(runs: Sequence[int] | None = None) -> dict[str, Any]:
    """The same figures computed from ``RUNS`` and ``ToolBox`` (a check on ``TRUTH``), for
    every run or the runs given (verdicts apart: those are stated by hand in ``TRUTH``)."""
    chosen = [RUNS[i] for i in (range(len(RUNS)) if runs is None else runs)]
    box = ToolBox()
    calls: Counter[str] = Counter()
    repeats: Counter[str] = Counter()
    productive: Counter[str] = Counter()
    wasted: Counter[str] = Counter()
    paging: Counter[str] = Counter()
    for turns in chosen:
        seen: dict[tuple[str, str], list[str]] = {}
        previous: ScriptCall | None = None
        for turn in turns:
            for call in turn:
                calls[call.tool] += 1
                key = (call.tool, json.dumps(call.arguments, sort_keys=True))
                result = box.call(call.tool, call.arguments)
                earlier = seen.setdefault(key, [])
                if earlier:
                    repeats[call.tool] += 1
                    failed_before = earlier[-1].startswith("Error:") and not result.startswith("Error:")
                    if result not in earlier or failed_before:
                        productive[call.tool] += 1
                    else:
                        wasted[call.tool] += 1
                earlier.append(result)
                if (
                    previous is not None
                    and previous.tool == call.tool
                    and "page" in call.arguments
                    and previous.arguments.get("page") != call.arguments.get("page")
                ):
                    paging[call.tool] += 1
                previous = call
    return {
        "runs": len(chosen),
        "calls": sum(calls.values()),
        "calls_by_tool": dict(calls),
        "repeats_by_tool": dict(repeats),
        "productive_by_tool": {t: productive[t] for t in repeats},
        "wasted_by_tool": {t: wasted[t] for t in repeats},
        "paging_by_tool": dict(paging),
        "arguments_unknown_by_tool": {},
    }
