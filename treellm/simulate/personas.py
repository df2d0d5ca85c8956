"""Simulated agents with planted behaviour: their tools, their habits, and the truth they plant.

Three personas (a coding agent, a research agent, an ops agent). Each run of a persona
gets fresh tool state and a seeded policy behind ``ScriptedModel``: the policy reads
the tool results in the request (as a model would) and reacts: it retries a flaky
fetch, polls a job until it is done, re-runs the tests after an edit. On top of that
it has habits: exact repeats, near repeats (a limit bumped by one, a query rephrased,
a file read page by page), cycles, parallel calls, skills, malformed arguments.

Every tool's behaviour is planted, so the verdict the tuning should reach for it is
known in advance (:data:`PLANTED`): deterministic tools whose repeats are wasted
(``keep`` at limit 1, ``lower`` where the code sets a higher limit), a flaky fetch and a
polled job whose repeats are productive (``raise``), tests whose result changes after
an edit the code forgot to mark as mutating (``mutates``), and tools repeated too
rarely to judge (``insufficient_data``).

Determinism: every random choice comes from ``random.Random`` seeded by (seed, run,
node or call), never from call order or time; handlers are async (no threads).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from treellm.config import TreeConfig
from treellm.engine.tools import Skill, Tool
from treellm.models.base import ModelRequest, ModelTurn, ToolCall, Usage

__all__ = ["PERSONAS", "PLANTED", "Persona", "PersonaRun", "PlantedTool", "Verdict", "persona_run"]

Verdict = Literal["keep", "raise", "lower", "mutates", "insufficient_data"]


@dataclass(frozen=True, slots=True)
class PlantedTool:
    """What a simulated tool does and the verdict the tuning should reach for it."""

    persona: str
    tool: str
    behaviour: Literal["deterministic", "flaky", "state-dependent", "polling", "mutating"]
    current_limit: int
    verdict: Verdict
    why: str


PLANTED: tuple[PlantedTool, ...] = (
    PlantedTool("coder", "read_file", "deterministic", 1, "keep",
                "re-reads return the same text: repeats are wasted, limit 1 is right"),
    PlantedTool("coder", "grep", "deterministic", 3, "lower",
                "the code allows 3, but a repeated search returns the same matches"),
    PlantedTool("coder", "list_dir", "deterministic", 1, "insufficient_data", "listed once per run: no repeats"),
    PlantedTool("coder", "edit_file", "mutating", 1, "insufficient_data",
                "changes the code (not declared mutating); never repeated"),
    PlantedTool("coder", "run_tests", "state-dependent", 1, "mutates",
                "re-running the tests after edit_file gives a new result"),
    PlantedTool("researcher", "web_search", "deterministic", 2, "lower",
                "the code allows 2, but the same query returns the same hits"),
    PlantedTool("researcher", "fetch_url", "flaky", 1, "raise",
                "fails with 503 half the time; a retry often succeeds"),
    PlantedTool("researcher", "summarize", "deterministic", 1, "insufficient_data", "summarises once per run"),
    PlantedTool("operator", "check_job_status", "polling", 1, "raise",
                "a job is done after 2-4 polls: each poll tells something new"),
    PlantedTool("operator", "get_metrics", "deterministic", 1, "keep",
                "re-reading the same metrics in a cycle is wasted"),
    PlantedTool("operator", "restart_service", "mutating", 1, "insufficient_data",
                "declared mutating; restarted at most once"),
)  # fmt: skip


def _rng(*parts: object) -> random.Random:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big"))


def _tool_results(request: ModelRequest) -> list[str]:
    """The tool results after the last assistant message (what the model just saw)."""
    out: list[str] = []
    for message in reversed(request.messages):
        if message.get("role") != "tool":
            break
        out.append(str(message.get("content") or ""))
    return list(reversed(out))


def _calls_so_far(request: ModelRequest) -> list[tuple[str, str]]:
    """(tool, arguments text) of every call in the context so far."""
    out = []
    for message in request.messages:
        for call in message.get("tool_calls") or []:
            out.append((call["function"]["name"], call["function"]["arguments"]))
    return out


def _usage(request: ModelRequest, turn: ModelTurn) -> ModelTurn:
    size = sum(len(str(m.get("content") or "")) for m in request.messages)
    return ModelTurn(turn.text, turn.tool_calls, Usage(size // 4 + 50, 20 + 15 * len(turn.tool_calls)))


def _done(result: str, summary: str = "") -> ModelTurn:
    return ModelTurn(tool_calls=[ToolCall("task_complete", {"result": result, "summary": summary})])


@dataclass(frozen=True, slots=True)
class PersonaRun:
    """Everything one simulated run needs: tools, skills, config, the policy and the task."""

    persona: str
    service: str
    task: str
    tools: list[Tool]
    skills: list[Skill]
    config: TreeConfig
    responder: Callable[[ModelRequest], ModelTurn]


@dataclass(frozen=True, slots=True)
class Persona:
    name: str
    service: str
    build: Callable[[int, int, TreeConfig], PersonaRun]
    tools: tuple[str, ...] = field(default=())


# -- the coding agent ----------------------------------------------------------------------------


def _coder(seed: int, run: int, config: TreeConfig) -> PersonaRun:
    r = _rng(seed, run, "coder")
    files = {
        "src/app.py": "\n".join(f"line {i}: handler code" for i in range(1, 121)),
        "src/handler.py": "def handler(event):\n    return broken(event)\n",
        "README.md": "# service\n",
    }
    state = {"edited": False}

    async def read_file(args: dict[str, Any]) -> str:
        text = files.get(str(args.get("path")))
        if text is None:
            raise FileNotFoundError(f"no such file: {args.get('path')}")
        lines = text.splitlines()
        offset, limit = int(args.get("offset", 1)), int(args.get("limit", 200))
        return "\n".join(lines[offset - 1 : offset - 1 + limit]) or "(end of file)"

    async def list_dir(args: dict[str, Any]) -> str:
        return "\n".join(sorted(files))

    async def grep(args: dict[str, Any]) -> str:
        pattern = str(args.get("pattern", "")).strip().lower()
        hits = [f"{p}:{i}" for p, t in files.items() for i, line in enumerate(t.splitlines(), 1) if pattern[:6] in line]
        return "\n".join(hits[:5]) or "no matches"

    async def edit_file(args: dict[str, Any]) -> str:
        files[str(args["path"])] = str(args.get("text", ""))
        state["edited"] = True
        return "edited"

    async def run_tests(args: dict[str, Any]) -> str:
        return "12 passed" if state["edited"] else "2 failed: test_handler, test_event"

    tools = [
        Tool("read_file", "Read a file; offset and limit page through it.", handler=read_file),
        Tool("list_dir", "List the project.", handler=list_dir),
        Tool("grep", "Search the code.", handler=grep, max_repeats=3),
        Tool("edit_file", "Replace a file's text.", handler=edit_file),
        Tool("run_tests", "Run the test suite.", handler=run_tests),
    ]
    repeat_read = r.random() < 0.5
    repeat_grep = r.randint(0, 2)
    page = r.random() < 0.5
    malformed = r.random() < 0.1
    rephrase = r.random() < 0.3

    def respond(request: ModelRequest) -> ModelTurn:
        calls = _calls_so_far(request)
        results = _tool_results(request)
        names = [c[0] for c in calls]
        step = len([m for m in request.messages if m.get("role") == "assistant"])
        if step == 0:
            return ModelTurn(text="Let me look around.", tool_calls=[
                ToolCall("list_dir", {"path": "."}), ToolCall("read_file", {"path": "src/app.py"})])  # fmt: skip
        if step == 1:
            return ModelTurn(tool_calls=[ToolCall("grep", {"pattern": "def handler"})])
        if step == 2 and repeat_grep:  # the same search again: wasted
            return ModelTurn(tool_calls=[ToolCall("grep", {"pattern": "def handler"})])
        if step in (2, 3) and repeat_read and names.count("read_file") == 1:  # a wasted re-read
            return ModelTurn(tool_calls=[ToolCall("read_file", {"path": "src/app.py"})])
        if step == 3 and repeat_grep == 2:  # a cycle: read, search, read, search
            return ModelTurn(tool_calls=[ToolCall("grep", {"pattern": "def handler"})])
        if "run_tests" not in names:
            if page and "offset" not in " ".join(a for _, a in calls):
                return ModelTurn(tool_calls=[ToolCall("read_file", {"path": "src/app.py", "offset": 1, "limit": 60})])
            if page and names.count("read_file") == 2 + repeat_read:  # the next page: progress, not a loop
                return ModelTurn(tool_calls=[ToolCall("read_file", {"path": "src/app.py", "offset": 61, "limit": 60})])
            if malformed and not any(a.startswith('{"path": "src/handler.py"') for _, a in calls):
                return ModelTurn(tool_calls=[ToolCall("read_file", '{"path": "src/handler.py"')])
            if rephrase and names.count("grep") < 4:
                return ModelTurn(tool_calls=[ToolCall("grep", {"pattern": "def  Handler("})])
            return ModelTurn(tool_calls=[ToolCall("run_tests", {})])
        if results and "failed" in results[-1] and "edit_file" not in names:
            return ModelTurn(tool_calls=[ToolCall("edit_file", {"path": "src/handler.py", "text": "def handler(e):\n"
                                                                  "    return e\n"})])  # fmt: skip
        if results and results[-1] == "edited":
            return ModelTurn(tool_calls=[ToolCall("run_tests", {})])  # after an edit: productive
        return _done("Fixed src/handler.py; the tests pass." if "12 passed" in " ".join(results) else "Gave up.")

    return PersonaRun("coder", "coding-agent", "Fix the failing tests", tools, [], config,
                      lambda req: _usage(req, respond(req)))  # fmt: skip


# -- the research agent ----------------------------------------------------------------------------


def _researcher(seed: int, run: int, config: TreeConfig) -> PersonaRun:
    r = _rng(seed, run, "researcher")
    attempts: dict[str, int] = {}

    async def web_search(args: dict[str, Any]) -> str:
        query = str(args.get("query", ""))
        slug = hashlib.blake2b(query.encode(), digest_size=2).hexdigest()
        return json.dumps([f"https://example.org/{slug}/{i}" for i in range(int(args.get("limit", 3)))])

    async def fetch_url(args: dict[str, Any]) -> str:
        url = str(args.get("url"))
        attempts[url] = attempts.get(url, 0) + 1
        if _rng(seed, run, "fetch", url, attempts[url]).random() < 0.5:
            raise ConnectionError("503 Service Unavailable")
        return f"<article>{url}: findings {len(url)}</article>"

    async def summarize(args: dict[str, Any]) -> str:
        return f"summary of {len(str(args.get('text', '')))} chars"

    tools = [
        Tool("web_search", "Search the web.", handler=web_search, max_repeats=2),
        Tool("fetch_url", "Fetch a page.", handler=fetch_url),
        Tool("summarize", "Summarise text.", handler=summarize),
    ]
    topic = r.choice(["loop detection", "tree search", "tool calling", "agent tracing"])
    bump = r.random() < 0.4
    repeat_search = r.random() < 0.6
    use_skill = r.random() < 0.3
    skill = Skill("deep_read", "Read one page carefully.", "You read pages and report what matters.")

    def respond(request: ModelRequest) -> ModelTurn:
        calls = _calls_so_far(request)
        results = _tool_results(request)
        names = [c[0] for c in calls]
        if request.skill_stack:
            if not calls:
                return ModelTurn(tool_calls=[ToolCall("fetch_url", {"url": "https://example.org/deep"})])
            if results and "503" in results[-1] and names.count("fetch_url") < 3:
                return ModelTurn(tool_calls=[ToolCall("fetch_url", {"url": "https://example.org/deep"})])
            return _done("deep read: ok")
        if not calls:
            return ModelTurn(tool_calls=[ToolCall("web_search", {"query": topic, "limit": 9})])
        if bump and names.count("web_search") == 1:  # a near repeat: the limit bumped by one
            return ModelTurn(tool_calls=[ToolCall("web_search", {"query": topic, "limit": 10})])
        if repeat_search and names.count("web_search") < 3 and "fetch_url" not in names:
            return ModelTurn(tool_calls=[ToolCall("web_search", {"query": topic, "limit": 9})])  # wasted
        if results and "503" in results[-1] and names.count("fetch_url") < 5:
            return ModelTurn(tool_calls=[ToolCall("fetch_url", json.loads(calls[-1][1]))])  # retry: productive
        if "fetch_url" not in names:
            if config.branching == "fork":  # parallel fetches, each its own branch
                return ModelTurn(tool_calls=[ToolCall("fetch_url", {"url": f"https://example.org/{topic}/{i}"})
                                             for i in range(2)])  # fmt: skip
            return ModelTurn(tool_calls=[ToolCall("fetch_url", {"url": f"https://example.org/{topic}/0"})])
        if use_skill and "skill_deep_read" not in names:
            return ModelTurn(tool_calls=[ToolCall("skill_deep_read", {"task": "read the main source"})])
        if "summarize" not in names:
            return ModelTurn(tool_calls=[ToolCall("summarize", {"text": " ".join(results)})])
        return _done(f"Findings on {topic}.")

    return PersonaRun("researcher", "research-agent", f"Research {topic}", tools, [skill], config,
                      lambda req: _usage(req, respond(req)))  # fmt: skip


# -- the ops agent ------------------------------------------------------------------------------------


def _operator(seed: int, run: int, config: TreeConfig) -> PersonaRun:
    r = _rng(seed, run, "operator")
    polls_needed = r.choice([2, 3, 4]) if r.random() > 0.1 else 10_000  # some jobs never finish
    polls = {"n": 0}
    restarted = {"done": False}

    async def check_job_status(args: dict[str, Any]) -> str:
        polls["n"] += 1
        if polls["n"] >= polls_needed:
            return "done"
        return f"running ({100 * polls['n'] // max(polls_needed, 1)}%)"

    async def get_metrics(args: dict[str, Any]) -> str:
        return f"{args.get('service')}: p99 {412 if not restarted['done'] else 95} ms, errors 3%"

    async def restart_service(args: dict[str, Any]) -> str:
        restarted["done"] = True
        return "restarted"

    tools = [
        Tool("check_job_status", "Status of a deploy job.", handler=check_job_status),
        Tool("get_metrics", "Latency and errors of a service.", handler=get_metrics),
        Tool("restart_service", "Restart a service.", handler=restart_service, mutates=True),
    ]
    cycle = r.random() < 0.5
    restart = r.random() < 0.4

    def respond(request: ModelRequest) -> ModelTurn:
        calls = _calls_so_far(request)
        results = _tool_results(request)
        names = [c[0] for c in calls]
        if not calls:
            return ModelTurn(tool_calls=[ToolCall("check_job_status", {"job_id": "deploy-42"}),
                                         ToolCall("get_metrics", {"service": "api"})])  # fmt: skip
        if results and any(x.startswith("running") for x in results):
            turn = [ToolCall("check_job_status", {"job_id": "deploy-42"})]  # polling: productive
            if cycle and names.count("get_metrics") < 3:
                turn.append(ToolCall("get_metrics", {"service": "api"}))  # a cycle: wasted
            return ModelTurn(tool_calls=turn)
        if restart and "restart_service" not in names:
            return ModelTurn(tool_calls=[ToolCall("restart_service", {"service": "api"})])
        if restart and names.count("get_metrics") < 2 + cycle * 2 and results == ["restarted"]:
            return ModelTurn(tool_calls=[ToolCall("get_metrics", {"service": "api"})])  # new after a restart
        return _done("Deploy finished." if "done" in " ".join(results) else "Deploy checked.")

    return PersonaRun("operator", "ops-agent", "Watch deploy-42", tools, [], config,
                      lambda req: _usage(req, respond(req)))  # fmt: skip


PERSONAS: dict[str, Persona] = {
    "coder": Persona("coder", "coding-agent", _coder, ("read_file", "list_dir", "grep", "edit_file", "run_tests")),
    "researcher": Persona("researcher", "research-agent", _researcher, ("web_search", "fetch_url", "summarize")),
    "operator": Persona("operator", "ops-agent", _operator, ("check_job_status", "get_metrics", "restart_service")),
}


def persona_run(persona: str, seed: int, run: int) -> PersonaRun:
    """The run ``run`` of ``persona`` under ``seed``: its config varies by run (shadow mode
    for about 30%, fork branching for some researcher runs, a small node budget for some)."""
    r = _rng(seed, run, "config")
    config = TreeConfig(
        retry_max_attempts=1,
        shadow=r.random() < 0.3,
        branching="fork" if persona == "researcher" and r.random() < 0.3 else "collapse",
        node_budget=12 if r.random() < 0.08 else 60,
    )
    return PERSONAS[persona].build(seed, run, config)
