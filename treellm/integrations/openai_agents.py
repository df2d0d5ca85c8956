"""LoopGuard for the OpenAI Agents SDK (``openai-agents``).

One line for an agent, or for its tools::

    guard = LoopGuard(max_repeats=2, on_repeat="nudge")
    agent = loop_guard(Agent(name="support", tools=tools), guard)     # a guarded copy
    agent = Agent(name="support", tools=guard_tools(tools, guard))    # the same, per tool

Each function tool gets a tool input guardrail that checks the call before it runs
(answering a caught call with ``ToolGuardrailFunctionOutput.reject_content``: the model
gets ``decision.answer`` for ``nudge``/``cache`` and a note that it was pruned for
``prune``, and the tool body never runs) and a tool output guardrail that records the
result (paired by the tool call id). The SDK runs a turn's calls concurrently and checks
each inside its own task before its body runs: the guard's reservations make identical
calls of one turn count against each other. A result that is the SDK's error text (the
tool raised and its failure function answered) is recorded as a failed call. The tools
keep any guardrails they had (the input check runs last, the output record first).

**The path** (the guard's conversation) is ``context.conversation_id`` when the run's
context (``Runner.run(..., context=...)``) has one (an attribute or a mapping key: a
conversation across runs; end it with ``guard.end(conversation_id)``), else the SDK trace
of the run (one per ``Runner.run``, or the ``trace(...)`` block around several), which
ends the conversation when it ends; ``path=`` (a function of the ``ToolContext``)
overrides both. With the SDK's tracing disabled there is no trace: give a conversation
id, or every run shares the guard's default conversation.

The guardrails run inside the SDK's function span, so with an instrumentor
(OpenInference's ``OpenAIAgentsInstrumentor``) the guard writes on its tool span and makes
no span of its own; without one it makes its own run and tool spans.

The SDK is imported inside the functions: importing this module never needs it.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import weakref
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from treellm.integrations import caught_answer

if TYPE_CHECKING:
    from treellm.guard import LoopGuard

__all__ = ["conversation_path", "guard_tools", "loop_guard"]

PathFunction = Callable[[Any], Hashable]

GUARDRAIL_NAME = "treellm_loop_guard"

_SDK_ERROR = "An error occurred while running the tool"
"""The start of the SDK's default failure text (``default_tool_error_function``)."""


def conversation_path(ctx: Any) -> Hashable:
    """The conversation of a tool call's ``ToolContext``: ``context.conversation_id`` of the
    run's context when it has one, else the id of the SDK trace of the run, else None."""
    context = getattr(ctx, "context", None)
    given = (
        context.get("conversation_id") if isinstance(context, Mapping) else getattr(context, "conversation_id", None)
    )
    if given is not None:
        return str(given) if not isinstance(given, Hashable) else given
    return _trace_id()


def _trace_id() -> str | None:
    from agents.tracing import get_current_trace  # type: ignore[import-not-found, unused-ignore]

    current = get_current_trace()
    trace_id = getattr(current, "trace_id", None)
    return trace_id if trace_id and trace_id != "no-op" else None


def loop_guard(agent: Any, guard: LoopGuard, *, path: PathFunction | None = None) -> Any:
    """A copy of ``agent`` (``agent.clone``) whose function tools are guarded (:func:`guard_tools`)."""
    return agent.clone(tools=guard_tools(agent.tools, guard, path=path))


def guard_tools(tools: Iterable[Any], guard: LoopGuard, *, path: PathFunction | None = None) -> list[Any]:
    """Copies of ``tools`` whose function tools check each call with ``guard`` before it
    runs and record it after (other tools, and tools guarded already, are returned as
    they are)."""
    from agents import FunctionTool  # type: ignore[import-not-found, unused-ignore]

    _ending(guard)
    find_path = path or conversation_path
    before, after = _guardrails(guard, find_path)
    out = []
    for tool in tools:
        if not isinstance(tool, FunctionTool) or any(g.get_name() == GUARDRAIL_NAME for g in _inputs(tool)):
            out.append(tool)
            continue
        out.append(  # the SDK's way to copy a tool: its invoker is bound to the copy
            dataclasses.replace(
                tool,
                tool_input_guardrails=[*_inputs(tool), before],
                tool_output_guardrails=[after, *(tool.tool_output_guardrails or ())],
            )
        )
    return out


def _inputs(tool: Any) -> list[Any]:
    return list(tool.tool_input_guardrails or ())


def _guardrails(guard: LoopGuard, find_path: PathFunction) -> tuple[Any, Any]:
    """The input guardrail (check) and the output guardrail (record) of one guard."""
    from agents import ToolGuardrailFunctionOutput, ToolInputGuardrail, ToolOutputGuardrail  # type: ignore[import-not-found, unused-ignore]

    def check(data: Any) -> Any:
        ctx = data.context
        where = find_path(ctx)
        if where is not None and where == _trace_id():
            _ending(guard).watch(where)
        decision = guard.check(ctx.tool_name, ctx.tool_arguments, where, call_id=ctx.tool_call_id)
        if decision.allowed:
            return ToolGuardrailFunctionOutput.allow()
        return ToolGuardrailFunctionOutput.reject_content(caught_answer(decision), output_info=decision)

    def record(data: Any) -> Any:
        ctx = data.context
        output = data.output
        failed = isinstance(output, str) and output.startswith(_SDK_ERROR)
        guard.record(ctx.tool_name, ctx.tool_arguments, output, find_path(ctx), call_id=ctx.tool_call_id, error=failed)
        return ToolGuardrailFunctionOutput.allow()

    return (
        ToolInputGuardrail(guardrail_function=check, name=GUARDRAIL_NAME),
        ToolOutputGuardrail(guardrail_function=record, name=GUARDRAIL_NAME),
    )


# -- ending a run's conversation when its SDK trace ends ------------------------------------------


def _ending(guard: LoopGuard) -> Any:
    """The trace processor that ends ``guard``'s trace conversations (one per guard)."""
    processors = _processors()
    found = processors.get(guard)
    if found is None:
        found = _processor_class()(guard)
        processors[guard] = found
        found.register()
    return found


@functools.cache
def _processors() -> weakref.WeakKeyDictionary[Any, Any]:
    return weakref.WeakKeyDictionary()


@functools.cache
def _processor_class() -> type:
    from agents import add_trace_processor  # type: ignore[import-not-found, unused-ignore]
    from agents.tracing import TracingProcessor  # type: ignore[import-not-found, unused-ignore]

    class EndConversations(TracingProcessor):  # type: ignore[misc, unused-ignore]
        """Ends a guard's conversation when the SDK trace that is its path ends.

        Registered with the SDK (``add_trace_processor``) when tools are guarded. An
        instrumentor may replace the SDK's processors afterwards (OpenInference's does), so
        a call in a trace this processor did not see start registers it again."""

        def __init__(self, guard: LoopGuard) -> None:
            self._guard = weakref.ref(guard)
            self._lock = threading.Lock()
            self._started: set[str] = set()
            self._watched: set[str] = set()

        def register(self) -> None:
            add_trace_processor(self)

        def watch(self, trace_id: str) -> None:
            with self._lock:
                if trace_id in self._watched:
                    return
                self._watched.add(trace_id)
                missing = trace_id not in self._started
            if missing:  # not registered when this trace started: put back
                self.register()

        def on_trace_start(self, trace: Any) -> None:
            with self._lock:
                self._started.add(trace.trace_id)

        def on_trace_end(self, trace: Any) -> None:
            with self._lock:
                self._started.discard(trace.trace_id)
                watched = trace.trace_id in self._watched
                self._watched.discard(trace.trace_id)
            guard = self._guard()
            if watched and guard is not None:
                guard.end(trace.trace_id)

        def on_span_start(self, span: Any) -> None:
            pass

        def on_span_end(self, span: Any) -> None:
            pass

        def shutdown(self) -> None:
            pass

        def force_flush(self) -> None:
            pass

    return EndConversations
