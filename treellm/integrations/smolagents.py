"""LoopGuard for smolagents (``ToolCallingAgent``; ``CodeAgent`` calls its tools the same way).

One line for an agent, after building it::

    guard = LoopGuard(max_repeats=2, on_repeat="nudge")
    agent = guard_agent(ToolCallingAgent(tools=tools, model=model), guard)

:func:`guard_agent` replaces each of the agent's tools (``agent.tools``) with a guarded
copy (:func:`guard_tools`: a ``Tool`` keeping the name, description, inputs and output
type, whose ``forward`` checks the call, runs the original tool's ``forward`` and records
it) and wraps the agent's ``run``. ``final_answer`` (smolagents' own end-of-run tool) is
never guarded, nor are managed agents (guard each agent itself).

**The path** (the guard's conversation) is a run id that the wrapped ``run`` makes,
``"<agent name>:<hex>"``, and sets in a context variable for the run; smolagents runs a
step's tool calls in a thread pool with a copy of that context, so concurrent identical
calls of one step count against each other (the guard's reservations). The conversation
is ended when ``run`` returns or raises (for ``run(..., stream=True)``, when the stream is
exhausted or closed). With ``end_runs=False`` it follows the agent's memory instead: a
``run(..., reset=False)`` continues the previous run's conversation, a run that resets the
memory (the default) ends the previous one and starts a new one; end the last with
``guard.end(conversation_path(agent))`` (or ``guard.close()``). Tools guarded by
:func:`guard_tools` alone, in an agent whose ``run`` is not wrapped, share the guard's
default conversation (``path=None``).

**A caught call** never runs: its observation is ``decision.answer`` for ``nudge`` and
``cache``, and for ``prune`` a note that the repeat was pruned
(:func:`treellm.integrations.caught_answer`). A tool that raises is recorded as a failed
call and the error goes on to smolagents as before. smolagents passes no tool call id to a
tool, so a record pairs with the oldest running identical call of the path (identical
calls are interchangeable).

The check and the record run inside the tool's ``__call__``, so with OpenInference's
``SmolagentsInstrumentor`` the guard writes on its TOOL span (a caught call's span carries
``loop:detected`` and is not counted as a call that ran); the guarded copy keeps the
original class name, the instrumentor's span name. Without an instrumentor the guard makes
its own run and tool spans.

smolagents is imported inside the functions: importing this module never needs it.
"""

from __future__ import annotations

import functools
import inspect
import threading
import uuid
from collections.abc import Hashable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from treellm.integrations import caught_answer

if TYPE_CHECKING:
    from treellm.guard import LoopGuard

__all__ = ["conversation_path", "guard_agent", "guard_tools"]

FINAL_ANSWER = "final_answer"
"""smolagents' end-of-run tool: never guarded."""

_PATH: ContextVar[Hashable] = ContextVar("treellm_smolagents_path", default=None)
_STATE = "_treellm_loop_guard"


class _Caught(str):
    """A caught call's answer: given to the model as it is (never turned into an image or audio)."""

    __slots__ = ()


def conversation_path(agent: Any = None) -> Hashable:
    """The guard path of ``agent``'s current (or last) run, or, with no agent, of the run
    this code runs in (None outside a guarded run)."""
    if agent is None:
        return _PATH.get()
    state = getattr(agent, _STATE, None)
    return state.path if state is not None else None


def guard_agent(agent: Any, guard: LoopGuard, *, end_runs: bool = True) -> Any:
    """Guard ``agent`` in place (its tools and its ``run``) and return it. Guarding an
    agent again changes nothing."""
    if getattr(agent, _STATE, None) is not None:
        return agent
    agent.tools = dict(zip(agent.tools, guard_tools(agent.tools.values(), guard), strict=True))
    state = _Runs(agent, guard, end_runs)
    setattr(agent, _STATE, state)
    agent.run = state.run  # an instance attribute: looks the class's (maybe instrumented) run up per call
    return agent


def guard_tools(tools: Iterable[Any], guard: LoopGuard) -> list[Any]:
    """Guarded copies of smolagents ``Tool`` instances (``final_answer``, tools guarded
    already and anything that is not a ``Tool`` are returned as they are)."""
    from smolagents import Tool  # type: ignore[import-not-found, unused-ignore]

    out = []
    for tool in tools:
        if not isinstance(tool, Tool) or tool.name == FINAL_ANSWER or isinstance(tool, _guarded_base()):
            out.append(tool)
        else:
            out.append(_guarded_class(type(tool).__name__)(tool, guard))
    return out


class _Runs:
    """The wrapped ``run`` of one agent: its conversation and when it ends."""

    def __init__(self, agent: Any, guard: LoopGuard, end_runs: bool) -> None:
        self.agent = agent
        self.guard = guard
        self.end_runs = end_runs
        self.path: Hashable = None
        self._lock = threading.Lock()

    def _begin(self, reset: bool) -> Hashable:
        with self._lock:
            previous = self.path
            if self.end_runs or reset or previous is None:
                self.path = f"{getattr(self.agent, 'name', None) or type(self.agent).__name__}:{uuid.uuid4().hex}"
            path = self.path
        if previous is not None and previous != path and not self.end_runs:
            self.guard.end(previous)  # the memory was reset: that conversation is over
        return path

    def _finish(self, path: Hashable, failed: bool = False) -> None:
        if self.end_runs:
            self.guard.end(path, "failed" if failed else "completed")

    def run(self, *args: Any, **kwargs: Any) -> Any:
        cls = type(self.agent)
        method = cls.run.__get__(self.agent, cls)
        try:
            given = inspect.signature(method).bind(*args, **kwargs).arguments
        except TypeError:
            given = {}
        path = self._begin(bool(given.get("reset", True)))
        token = _PATH.set(path)
        try:
            out = method(*args, **kwargs)
        except BaseException:
            self._finish(path, failed=True)
            raise
        finally:
            _PATH.reset(token)
        if given.get("stream") and inspect.isgenerator(out):
            return self._stream(out, path)
        self._finish(path)
        return out

    def _stream(self, steps: Iterator[Any], path: Hashable) -> Iterator[Any]:
        """The run's steps, each produced inside the run's conversation."""
        failed = True
        try:
            while True:
                token = _PATH.set(path)
                try:
                    step = next(steps)
                except StopIteration:
                    failed = False
                    return
                finally:
                    _PATH.reset(token)
                yield step
        finally:
            close = getattr(steps, "close", None)
            if close is not None:
                close()
            self._finish(path, failed=failed)


def _arguments(inputs: Mapping[str, Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """The call's arguments by name (smolagents passes keywords; positional ones take the inputs' order)."""
    if not args:
        return dict(kwargs)
    return {**dict(zip(inputs, args, strict=False)), **kwargs}


@functools.cache
def _guarded_base() -> type:
    from smolagents import Tool  # type: ignore[import-not-found, unused-ignore]
    from smolagents.agent_types import (  # type: ignore[import-not-found, unused-ignore]
        handle_agent_input_types,
        handle_agent_output_types,
    )

    class GuardedTool(Tool):  # type: ignore[misc, unused-ignore]
        """A guarded copy of a smolagents tool (see the module docstring)."""

        skip_forward_signature_validation = True

        def __init__(self, tool: Any, guard: LoopGuard) -> None:
            self.tool = tool
            self.guard = guard
            self.name = tool.name
            self.description = tool.description
            self.inputs = tool.inputs
            self.output_type = tool.output_type
            self.output_schema = getattr(tool, "output_schema", None)
            super().__init__()

        def setup(self) -> None:
            if not getattr(self.tool, "is_initialized", True):
                self.tool.setup()
            self.is_initialized = True

        def __call__(self, *args: Any, sanitize_inputs_outputs: bool = False, **kwargs: Any) -> Any:
            if sanitize_inputs_outputs:
                args, kwargs = handle_agent_input_types(*args, **kwargs)
            out = super().__call__(*args, **kwargs)  # Tool.__call__: the instrumentor's span, then forward
            if sanitize_inputs_outputs and not isinstance(out, _Caught):
                out = handle_agent_output_types(out, self.output_type)
            return out

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            arguments = _arguments(self.inputs, args, kwargs)
            path = _PATH.get()
            decision = self.guard.check(self.name, arguments, path)
            if not decision.allowed:
                return _Caught(caught_answer(decision))
            try:
                result = self.tool.forward(*args, **kwargs)
            except BaseException as exc:
                if isinstance(exc, Exception):
                    self.guard.record(self.name, arguments, f"Error: {type(exc).__name__}: {exc}", path, error=True)
                else:  # interrupted: it did not finish
                    self.guard.release(decision)
                raise
            self.guard.record(self.name, arguments, result, path)
            return result

    return GuardedTool


@functools.cache
def _guarded_class(name: str) -> type:
    """The guarded tool class named like the original tool's class (the instrumentor's span name)."""
    base = _guarded_base()
    return base if name == base.__name__ else type(name, (base,), {"__module__": __name__})
