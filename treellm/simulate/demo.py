"""The scripted demonstration behind ``treellm demo`` (no model, no network).

A small coding agent, driven by a ScriptedModel with async tools (so the run,
its node ids and its tree are the same every time), that shows the loop detector
at work: an exact repeat pruned on one fork branch but not on its sibling, a
same-turn duplicate, a nudge, a retried flaky tool, an edit that makes a re-read
legitimate, and a skill sub-tree.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from treellm.agent import TreeExecutor
from treellm.config import TreeConfig
from treellm.engine.events import Observer
from treellm.engine.executor import RunResult
from treellm.engine.tools import Skill, Tool
from treellm.models.base import ModelRequest, ModelTurn, ToolCall
from treellm.models.scripted import ScriptedModel

__all__ = ["demo_executor", "run_demo"]

FILES = {"app.py": "def main():\n    return fetch_config()\n", "config.toml": "retries = 3\n"}


def _responder(request: ModelRequest) -> ModelTurn:
    last_tool = next((str(m.get("content")) for m in reversed(request.messages) if m.get("role") == "tool"), "")
    if request.skill_stack:  # the "review" skill's sub-tree
        if request.depth == 0:
            return ModelTurn(tool_calls=[ToolCall("read_file", {"path": "app.py"})])
        return ModelTurn(tool_calls=[ToolCall("task_complete", {"result": "review: main() is fine"})])
    if request.depth == 0:  # fork: read two files at once, the second twice in one turn
        return ModelTurn(
            text="Let me look at the code and the config.",
            tool_calls=[
                ToolCall("read_file", {"path": "app.py"}),
                ToolCall("read_file", {"path": "config.toml"}),
                ToolCall("read_file", {"path": "config.toml"}),
            ],
        )
    if request.depth == 1 and "fetch_config" in last_tool:  # branch app.py
        return ModelTurn(tool_calls=[ToolCall("read_file", {"path": "config.toml"})])
    if request.depth == 1:  # branch config.toml: re-reads what it just read: pruned
        return ModelTurn(tool_calls=[ToolCall("read_file", {"path": "config.toml"})])
    if request.depth == 2:
        return ModelTurn(tool_calls=[ToolCall("run_tests", {}), ToolCall("search", {"query": "fetch_config"})])
    if request.depth == 3:
        return ModelTurn(tool_calls=[ToolCall("search", {"query": "fetch_config"})])
    if request.depth == 4:
        return ModelTurn(tool_calls=[ToolCall("edit_file", {"path": "app.py", "text": "fixed"})])
    if request.depth == 5:
        return ModelTurn(
            tool_calls=[
                ToolCall("read_file", {"path": "app.py"}),
                ToolCall("skill_review", {"task": "review app.py"}),
            ]
        )
    return ModelTurn(tool_calls=[ToolCall("task_complete", {"result": "Fixed app.py; tests pass.", "summary": "demo"})])


def demo_executor(observers: list[Observer], **kwargs: Any) -> TreeExecutor:
    files = dict(FILES)
    flaky = itertools.count()

    async def read_file(args: dict[str, Any]) -> str:
        return files.get(str(args.get("path")), "no such file")

    async def edit_file(args: dict[str, Any]) -> str:
        files[str(args["path"])] = str(args["text"])
        return "edited"

    async def run_tests(_: dict[str, Any]) -> str:
        if next(flaky) == 0:
            raise ConnectionError("test runner busy")
        return "4 passed"

    async def search(args: dict[str, Any]) -> str:
        return f"app.py:2: return {args.get('query')}()"

    tools = [
        Tool("read_file", "Read a file.", handler=read_file),
        Tool("edit_file", "Edit a file.", handler=edit_file, mutates=True),
        Tool("run_tests", "Run the tests.", handler=run_tests),
        Tool("search", "Search the code.", handler=search, on_repeat="nudge"),
    ]

    async def no_wait(_: float) -> None:
        await asyncio.sleep(0)

    return TreeExecutor(
        ScriptedModel(_responder, model_name="scripted-demo"),
        tools,
        TreeConfig(branching="fork", retry_base_delay_s=0.5),
        name="demo-coder",
        skills=[Skill("review", "Review a file.", "You review code.")],
        observers=observers,
        sleep=no_wait,
        **kwargs,
    )


def run_demo(observers: list[Observer], **kwargs: Any) -> RunResult:
    """Run the demonstration task once."""
    return demo_executor(observers, **kwargs).run("Fix the failing config loading in app.py")
