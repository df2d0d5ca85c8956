"""Typed events and streamed chunks of a run.

Every event carries the run id, the node it concerns, that node's parent and
depth, the skill stack, the time (ns, from the run's injected clock) and a typed
payload; ``event.type`` is a str-valued name such as ``"loop:detected"``.
Observers are plain callables ``(Event) -> None`` called synchronously, in
order, on the run's event loop thread (see :data:`Observer`); one that raises
is logged and detached; async observers are refused (:func:`check_observer`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from treellm.config import TreeConfig
from treellm.engine.nodes import PrunedCall, ToolErrorType
from treellm.errors import ConfigError
from treellm.loop import LimitSource
from treellm.models.base import Usage

__all__ = [
    "BudgetExhausted",
    "Chunk",
    "ChunkType",
    "CollapseComplete",
    "CollapseStart",
    "Event",
    "EventType",
    "LoopDetected",
    "Observer",
    "Outcome",
    "Payload",
    "RunComplete",
    "RunStart",
    "RunStats",
    "SkillComplete",
    "SkillStart",
    "TaskComplete",
    "ThinkComplete",
    "ThinkStart",
    "ThinkToken",
    "ToolComplete",
    "ToolError",
    "ToolRetry",
    "ToolStart",
    "check_observer",
    "notify",
]

logger = logging.getLogger(__name__)

Outcome = Literal["completed", "budget_exhausted", "pruned_out", "failed"]


class EventType(StrEnum):
    RUN_START = "run:start"
    THINK_START = "think:start"
    THINK_TOKEN = "think:token"
    THINK_COMPLETE = "think:complete"
    TOOL_START = "tool:start"
    TOOL_COMPLETE = "tool:complete"
    TOOL_ERROR = "tool:error"
    TOOL_RETRY = "tool:retry"
    COLLAPSE_START = "collapse:start"
    COLLAPSE_COMPLETE = "collapse:complete"
    SKILL_START = "skill:start"
    SKILL_COMPLETE = "skill:complete"
    BUDGET_EXHAUSTED = "budget:exhausted"
    LOOP_DETECTED = "loop:detected"
    TASK_COMPLETE = "task:complete"
    RUN_COMPLETE = "run:complete"


@dataclass(frozen=True, slots=True)
class RunStats:
    nodes: int = 0
    think_nodes: int = 0
    tool_nodes: int = 0
    collapse_nodes: int = 0
    max_depth: int = 0
    loops_detected: int = 0
    pruned: int = 0
    retries: int = 0
    compressions: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class RunStart:
    task: str
    agent: str
    model: str
    config: TreeConfig
    guard: bool = False
    """True for runs recorded by a LoopGuard (no tree executor, one path)."""


@dataclass(frozen=True, slots=True)
class ThinkStart:
    model: str
    messages: int


@dataclass(frozen=True, slots=True)
class ThinkToken:
    text: str


@dataclass(frozen=True, slots=True)
class ThinkComplete:
    text: str
    requested_calls: int
    accepted_calls: int
    usage: Usage | None
    ended_by: str
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ToolStart:
    tool: str
    call_id: str
    arguments: Any
    raw_arguments: str
    signature: str
    ordinal: int
    limit: int
    limit_source: LimitSource
    shadow_caught: bool
    earlier_node_ids: tuple[str, ...] = ()
    """The earlier identical calls on the path that the count counted (ordinal - 1 of them)."""


@dataclass(frozen=True, slots=True)
class ToolComplete:
    tool: str
    result: str
    result_hash: str
    attempts: int
    duration_ns: int


@dataclass(frozen=True, slots=True)
class ToolError:
    tool: str
    error: str
    result: str
    result_hash: str
    attempts: int
    duration_ns: int
    error_type: ToolErrorType = "tool_error"
    """Why the call failed: ``tool_error``, ``timeout``, ``arguments_too_large`` or ``unserializable_result``."""


@dataclass(frozen=True, slots=True)
class ToolRetry:
    tool: str
    attempt: int
    error: str
    delay_s: float


@dataclass(frozen=True, slots=True)
class CollapseStart:
    merged: tuple[str, ...]
    size_before: int


@dataclass(frozen=True, slots=True)
class CollapseComplete:
    merged: tuple[str, ...]
    compressed: bool
    size_before: int
    size_after: int
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class SkillStart:
    skill: str
    task: str


@dataclass(frozen=True, slots=True)
class SkillComplete:
    skill: str
    answer: str | None
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class BudgetExhausted:
    budget: Literal["node", "depth"]
    limit: int
    used: int


@dataclass(frozen=True, slots=True)
class LoopDetected:
    call: PrunedCall


@dataclass(frozen=True, slots=True)
class TaskComplete:
    answer: str
    summary: str | None


@dataclass(frozen=True, slots=True)
class RunComplete:
    outcome: Outcome
    answer: str | None
    stats: RunStats
    error: str | None = None


Payload = (
    RunStart
    | ThinkStart
    | ThinkToken
    | ThinkComplete
    | ToolStart
    | ToolComplete
    | ToolError
    | ToolRetry
    | CollapseStart
    | CollapseComplete
    | SkillStart
    | SkillComplete
    | BudgetExhausted
    | LoopDetected
    | TaskComplete
    | RunComplete
)

EVENT_TYPES: dict[type[Any], EventType] = {
    RunStart: EventType.RUN_START,
    ThinkStart: EventType.THINK_START,
    ThinkToken: EventType.THINK_TOKEN,
    ThinkComplete: EventType.THINK_COMPLETE,
    ToolStart: EventType.TOOL_START,
    ToolComplete: EventType.TOOL_COMPLETE,
    ToolError: EventType.TOOL_ERROR,
    ToolRetry: EventType.TOOL_RETRY,
    CollapseStart: EventType.COLLAPSE_START,
    CollapseComplete: EventType.COLLAPSE_COMPLETE,
    SkillStart: EventType.SKILL_START,
    SkillComplete: EventType.SKILL_COMPLETE,
    BudgetExhausted: EventType.BUDGET_EXHAUSTED,
    LoopDetected: EventType.LOOP_DETECTED,
    TaskComplete: EventType.TASK_COMPLETE,
    RunComplete: EventType.RUN_COMPLETE,
}


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened in a run."""

    type: EventType
    run_id: str
    node_id: str | None
    parent_id: str | None
    depth: int
    skill_stack: tuple[str, ...]
    time_ns: int
    payload: Payload


Observer = Callable[[Event], None]
"""The observer seam: a plain (synchronous) callable ``(Event) -> None``.

Contract: called synchronously, in event order, on the thread that emits (the
run's event loop thread for the executor; the caller's thread for a LoopGuard),
so it must return quickly and must not block. Its return value is ignored. One
that raises is logged and detached for the rest of the run; it never stops the
agent.

Async observers are refused, not awaited: events are emitted synchronously in
the middle of the run's steps (and from threads without an event loop by a
LoopGuard), and awaiting an observer there would let a slow observer stall or
reorder the run. An ``async def`` observer (or an object whose ``__call__`` is
one) raises ``ConfigError`` when it is attached (:func:`check_observer`); a
plain callable that returns an awaitable anyway is detected at the first event:
the awaitable is closed, never awaited, and the observer is logged and detached.
To do async work, schedule it from a plain observer, e.g.
``lambda e: loop.call_soon_threadsafe(queue.put_nowait, e)``.
"""


def check_observer(observer: object) -> Observer:
    """``observer`` when it can be an observer; raises ``ConfigError`` when it is not
    callable or is a coroutine function (see :data:`Observer`)."""
    if not callable(observer):
        raise ConfigError(f"observers: expected a callable (Event) -> None, got {observer!r}", setting="observers")
    call = getattr(observer, "__call__", None)  # noqa: B004 -- a callable object's method, not callable()
    if inspect.iscoroutinefunction(observer) or inspect.iscoroutinefunction(call):
        raise ConfigError(
            f"observers: expected a plain callable (Event) -> None, got the async observer {observer!r}: "
            "observers are called synchronously and never awaited (schedule async work from a plain observer)",
            setting="observers",
        )
    return observer


def notify(observers: list[Observer], event: Event) -> None:
    """Call each observer with ``event``, in order; one that raises, or returns an
    awaitable (an async observer slipped through), is logged and removed from
    ``observers`` (an observer's bug must never stop the agent)."""
    for observer in list(observers):
        try:
            returned: object = observer(event)
        except Exception:  # an observer's bug must never stop the agent
            logger.exception("observer %r raised on %s; detached", observer, event.type)
            observers.remove(observer)
            continue
        if inspect.isawaitable(returned):
            if inspect.iscoroutine(returned):
                returned.close()  # never awaited: closed so that it does not warn
            logger.error(
                "observer %r returned an awaitable on %s (async observers are not awaited); detached",
                observer,
                event.type,
            )
            observers.remove(observer)


class ChunkType(StrEnum):
    TEXT = "text"
    TOOL_CALL = "toolCall"
    TOOL_RESULT = "toolResult"
    TOOL_ERROR = "toolError"
    LOOP_DETECTED = "loopDetected"
    BUDGET_EXHAUSTED = "budgetExhausted"
    COLLAPSE = "collapse"
    SKILL = "skill"
    TASK_COMPLETE = "taskComplete"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of user-visible output streamed while the run goes."""

    type: ChunkType
    content: str
    node_id: str | None = None
