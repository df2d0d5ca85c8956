"""The OpenTelemetry-free tree executor and its result.

:class:`Engine` holds only what does not change between runs (model, tools,
skills, config, observers, injected clock/sleep/id sources); each task gets its
own :class:`~treellm.engine.run.Run`. ``stream`` yields chunks as they happen,
``arun`` awaits the :class:`RunResult`, ``run`` is the sync form (it refuses to
run inside a running event loop: use ``arun`` there).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from treellm.config import TreeConfig
from treellm.engine.events import (
    Chunk,
    Event,
    Observer,
    Outcome,
    RunComplete,
    RunStart,
    RunStats,
    check_observer,
)
from treellm.engine.nodes import Node, PrunedCall
from treellm.engine.run import Branch, Clock, Run, Sleep, SubTree, tree_outcome
from treellm.engine.tools import TASK_COMPLETE, Skill, Tool
from treellm.errors import ConfigError, ToolDefinitionError
from treellm.loop import PathSignatures
from treellm.models.base import ChatModel

__all__ = ["BranchAnswer", "Engine", "RunResult"]


@dataclass(frozen=True, slots=True)
class BranchAnswer:
    """The answer a branch ended with (``node_id`` is its last ThinkNode)."""

    node_id: str
    answer: str
    summary: str | None = None


@dataclass(frozen=True, slots=True, repr=False)
class RunResult:
    """Everything a run produced. Its repr is a one-line summary (the whole is large)."""

    run_id: str
    task: str
    answer: str | None
    """The answer of the completed branch created first (None when none completed)."""
    answers: tuple[BranchAnswer, ...]
    outcome: Outcome
    nodes: tuple[Node, ...]
    pruned_calls: tuple[PrunedCall, ...]
    chunks: tuple[Chunk, ...]
    events: tuple[Event, ...]
    stats: RunStats

    def __repr__(self) -> str:
        # Kept short on purpose: asyncio reprs a finished main task's result (Python 3.11's
        # signal handling in asyncio.run does), and a full dataclass repr of thousands of
        # nodes and events cost more than the run itself.
        answer = self.answer if self.answer is None or len(self.answer) <= 60 else self.answer[:57] + "..."
        return (
            f"RunResult(run_id={self.run_id!r}, outcome={self.outcome!r}, answer={answer!r}, "
            f"nodes={len(self.nodes)}, pruned_calls={len(self.pruned_calls)}, events={len(self.events)})"
        )

    def node(self, node_id: str) -> Node:
        return next(n for n in self.nodes if n.id == node_id)

    def children(self, node_id: str | None) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.parent_id == node_id)


def _check_tools(tools: Sequence[Tool], skills: Sequence[Skill]) -> None:
    seen: set[str] = set()
    for tool in tools:
        if not isinstance(tool, Tool):
            raise ToolDefinitionError(f"expected a treellm.Tool, got {tool!r}", tool=str(tool))
        if tool.name in seen:
            raise ToolDefinitionError(f"two tools are named {tool.name!r}", tool=tool.name)
        seen.add(tool.name)
    for skill in skills:
        if skill.tool_name in seen or skill.tool_name == TASK_COMPLETE:
            raise ToolDefinitionError(f"two tools or skills are named {skill.tool_name!r}", tool=skill.tool_name)
        seen.add(skill.tool_name)


def _node_order(node_id: str) -> int:
    return int(node_id[1:]) if node_id[1:].isdigit() else 0


class Engine:
    """Runs tasks as trees of think, tool and collapse nodes (no telemetry attached)."""

    def __init__(
        self,
        model: ChatModel,
        tools: Sequence[Tool] = (),
        config: TreeConfig | None = None,
        *,
        name: str = "agent",
        skills: Sequence[Skill] = (),
        observers: Sequence[Observer] = (),
        clock: Clock = time.time_ns,
        sleep: Sleep = asyncio.sleep,
        run_ids: Callable[[], str] = lambda: uuid.uuid4().hex,
    ) -> None:
        if config is not None and not isinstance(config, TreeConfig):
            raise ConfigError(f"config: expected a TreeConfig, got {type(config).__name__}", setting="config")
        _check_tools(tools, skills)
        self.model = model
        self.tools = tuple(tools)
        self.skills = tuple(skills)
        self.config = config or TreeConfig()
        self.name = name
        self.observers: list[Observer] = [check_observer(o) for o in observers]
        self.clock = clock
        self.sleep = sleep
        self.run_ids = run_ids

    def add_observer(self, observer: Observer) -> None:
        """Attach an observer to every run started from now on.

        Raises ``ConfigError`` for an async observer (they are never awaited: see
        ``treellm.engine.events.Observer``).
        """
        self.observers.append(check_observer(observer))

    async def _execute(self, task: str, on_chunk: Callable[[Chunk], None] | None) -> RunResult:
        run = Run(
            run_id=self.run_ids(),
            task=task,
            agent=self.name,
            model=self.model,
            config=self.config,
            observers=self.observers,
            clock=self.clock,
            sleep=self.sleep,
            on_chunk=on_chunk,
        )
        tree = SubTree.build(self.config, self.tools, self.skills, self.config.system_prompt)
        run.emit(RunStart(task, self.name, self.model.model_name, self.config))
        messages = ({"role": "system", "content": tree.system_prompt}, {"role": "user", "content": task})
        try:
            await run.think(Branch(tree, messages, PathSignatures.empty(), 0, None))
        except (Exception, asyncio.CancelledError) as exc:
            # Our bug, a script that ran out, or a cancellation: close the run for the
            # observers (telemetry ends its spans), then let it propagate.
            run.emit(RunComplete("failed", None, run.stats(), f"{type(exc).__name__}: {exc}"))
            raise
        ends = sorted(tree.ends, key=lambda e: _node_order(e.node_id))
        answers = tuple(BranchAnswer(e.node_id, e.answer, e.summary) for e in ends if e.answer is not None)
        outcome = tree_outcome(tree.ends)
        answer = answers[0].answer if answers else None
        stats = run.stats()
        run.emit(RunComplete(outcome, answer, stats))
        return RunResult(
            run_id=run.run_id,
            task=task,
            answer=answer,
            answers=answers,
            outcome=outcome,
            nodes=tuple(sorted(run.nodes.values(), key=lambda n: _node_order(n.id))),
            pruned_calls=tuple(run.pruned),
            chunks=tuple(run.chunks),
            events=tuple(run.events),
            stats=stats,
        )

    async def arun(self, task: str) -> RunResult:
        """Run ``task`` to the end and return its result."""
        return await self._execute(task, None)

    def run(self, task: str) -> RunResult:
        """The sync form of :meth:`arun` (not from inside a running event loop)."""
        return asyncio.run(self._execute(task, None))

    async def stream(self, task: str) -> AsyncIterator[Chunk]:
        """Yield the run's chunks as they happen; errors of the run propagate at the end."""
        queue: asyncio.Queue[Chunk | None] = asyncio.Queue()
        job = asyncio.ensure_future(self._execute(task, queue.put_nowait))
        job.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (chunk := await queue.get()) is not None:
                yield chunk
            job.result()
        finally:
            if not job.done():
                job.cancel()
