"""LoopGuard for LangGraph / LangChain 1.x agents.

``create_agent`` (``langchain.agents``) takes it as a middleware::

    guard = LoopGuard(max_repeats=2, on_repeat="nudge")
    agent = create_agent(model, tools, middleware=[loop_guard_middleware(guard)])

and a hand-built graph's ``ToolNode`` (``langgraph.prebuilt``) as its tool-call wrapper::

    node = ToolNode(tools, wrap_tool_call=wrap_tool_call(guard), awrap_tool_call=awrap_tool_call(guard))

Each tool call is checked before it runs (``request.tool_call``: name, args, id) and
recorded after, paired by its tool call id; a turn's calls, which the tool node runs
concurrently, count against each other. A caught call is answered with a ``ToolMessage``
for its ``tool_call_id`` (LangGraph needs an answer per call): ``decision.answer`` for
``nudge``/``cache``, a note that it was pruned (``status="error"``) for ``prune``.

**The path** (the guard's conversation) is the run's ``thread_id`` (``configurable`` of
the config, as the checkpointer uses it), else the run id of the config, else the id of
the conversation's first message. The middleware ends the conversation when the agent
finishes an invocation (``after_agent``; ``end_runs=False`` keeps counting across the
invocations of a thread, then call ``guard.end(thread_id)`` yourself); with ``ToolNode``
call ``guard.end(thread_id)`` when the conversation is over.

**Spans.** LangChain instrumentors trace through callbacks without making their spans
current, so around its ``check``/``record`` the adapter makes current the span that the
run's callback handler keeps for the node running the calls (a handler with
``get_span(run_id)``: OpenInference's ``LangChainInstrumentor``); the guard then writes its
catches there and makes no span of its own (one run, each call once). With no
instrumentor the guard makes its own run and tool spans.

LangGraph is imported inside the functions: importing this module never needs it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable, Hashable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from treellm.integrations import caught_answer

if TYPE_CHECKING:
    from treellm.guard import LoopGuard

__all__ = ["awrap_tool_call", "conversation_path", "loop_guard_middleware", "wrap_tool_call"]

Handler = Callable[[Any], Any]
AsyncHandler = Callable[[Any], Awaitable[Any]]


def conversation_path(config: Mapping[str, Any] | None, execution_info: Any = None, state: Any = None) -> Hashable:
    """The conversation of a run: its ``thread_id``, else its run id, else the id of its
    first message, else None (the guard's one default conversation)."""
    configurable = (config or {}).get("configurable") or {}
    thread = configurable.get("thread_id") or getattr(execution_info, "thread_id", None)
    if thread is not None:
        return str(thread)
    run = (config or {}).get("run_id") or getattr(execution_info, "run_id", None)
    if run is not None:
        return str(run)
    messages = state.get("messages") if isinstance(state, Mapping) else getattr(state, "messages", None)
    if messages:
        first = getattr(messages[0], "id", None)
        if first:
            return f"message:{first}"
    return None


def _request_path(request: Any) -> Hashable:
    runtime = getattr(request, "runtime", None)
    config = getattr(runtime, "config", None)
    return conversation_path(config, getattr(runtime, "execution_info", None), getattr(request, "state", None))


def _framework_span(config: Mapping[str, Any] | None) -> Any:
    """The instrumentor's span of the current LangChain run, when no span is current.

    LangChain instrumentors trace through callbacks and do not make their spans current
    (OpenInference's ``LangChainInstrumentor``), so the guard would see no span and make
    spans of its own: a second run in a second trace. The run's callback handlers that
    keep a span per run (``get_span(run_id)``) give the span of the node running the calls
    (the ``tools`` node), on which the guard then writes its facts."""
    if trace.get_current_span().is_recording():
        return None
    manager = (config or {}).get("callbacks")
    run_id = getattr(manager, "parent_run_id", None)
    if run_id is None:
        return None
    for handler in getattr(manager, "handlers", None) or ():
        get_span = getattr(handler, "get_span", None)
        if callable(get_span):
            try:
                span = get_span(run_id)
            except Exception:  # noqa: BLE001  (another library's handler: never fail the call)
                continue
            if isinstance(span, trace.Span) and span.is_recording():
                return span
    return None


@contextlib.contextmanager
def _in_framework_span(config: Mapping[str, Any] | None) -> Iterator[None]:
    """Makes the instrumentor's span current for the guard's calls (see :func:`_framework_span`)."""
    span = _framework_span(config)
    if span is None:
        yield
        return
    with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
        yield


def _caught_message(request: Any, decision: Any) -> Any:
    from langchain_core.messages import ToolMessage  # type: ignore[import-not-found, unused-ignore]

    call = request.tool_call
    status = "success" if decision.answer is not None else "error"
    return ToolMessage(content=caught_answer(decision), tool_call_id=call["id"], name=call["name"], status=status)


def _outcome(result: Any, call_id: str | None) -> tuple[Any, bool]:
    """(the result to record, whether it failed) of what the tool node returned."""
    from langchain_core.messages import ToolMessage  # type: ignore[import-not-found, unused-ignore]

    message = result
    if not isinstance(result, ToolMessage):  # a Command: its ToolMessage for this call, if any
        update = getattr(result, "update", None)
        messages = update.get("messages", ()) if isinstance(update, Mapping) else ()
        message = next((m for m in messages if isinstance(m, ToolMessage) and m.tool_call_id == call_id), None)
        if message is None:
            return str(update if update is not None else result), False
    return message.content, message.status == "error"


class _Guarded:
    """The check / run / record of one tool call (shared by the middleware and ToolNode wrappers)."""

    def __init__(self, guard: LoopGuard, request: Any) -> None:
        call = request.tool_call
        self.guard = guard
        self.request = request
        self.tool: str = call["name"]
        self.arguments: Any = call.get("args") or {}
        self.call_id: str | None = call.get("id")
        self.path = _request_path(request)
        self.config: Mapping[str, Any] | None = getattr(getattr(request, "runtime", None), "config", None)
        with _in_framework_span(self.config):
            self.decision = guard.check(self.tool, self.arguments, self.path, call_id=self.call_id)

    def caught(self) -> Any:
        return _caught_message(self.request, self.decision)

    def done(self, result: Any) -> Any:
        content, failed = _outcome(result, self.call_id)
        with _in_framework_span(self.config):
            self.guard.record(self.tool, self.arguments, content, self.path, call_id=self.call_id, error=failed)
        return result

    def failed(self, error: BaseException) -> None:
        from langgraph.errors import GraphBubbleUp  # type: ignore[import-not-found, unused-ignore]

        if isinstance(error, GraphBubbleUp) or not isinstance(error, Exception):
            self.guard.release(self.decision)  # an interrupt or a cancellation: it did not run
        else:
            with _in_framework_span(self.config):
                self.guard.record(self.tool, self.arguments, str(error), self.path, call_id=self.call_id, error=True)


def wrap_tool_call(guard: LoopGuard) -> Callable[[Any, Handler], Any]:
    """A ``ToolNode(wrap_tool_call=...)`` wrapper guarding each call (see the module docstring)."""

    def wrapper(request: Any, handler: Handler) -> Any:
        call = _Guarded(guard, request)
        if not call.decision.allowed:
            return call.caught()
        try:
            result = handler(request)
        except BaseException as error:
            call.failed(error)
            raise
        return call.done(result)

    return wrapper


def awrap_tool_call(guard: LoopGuard) -> Callable[[Any, AsyncHandler], Awaitable[Any]]:
    """A ``ToolNode(awrap_tool_call=...)`` wrapper guarding each call (see the module docstring)."""

    async def wrapper(request: Any, handler: AsyncHandler) -> Any:
        call = _Guarded(guard, request)
        if not call.decision.allowed:
            return call.caught()
        try:
            result = await handler(request)
        except BaseException as error:
            call.failed(error)
            raise
        return call.done(result)

    return wrapper


def loop_guard_middleware(guard: LoopGuard, *, end_runs: bool = True) -> Any:
    """An ``AgentMiddleware`` for ``create_agent(..., middleware=[...])`` guarding every tool
    call; with ``end_runs`` it ends the conversation when the agent finishes an invocation."""
    return _middleware_class()(guard, end_runs=end_runs)


@functools.cache
def _middleware_class() -> type:
    from langchain.agents.middleware import AgentMiddleware  # type: ignore[import-not-found, unused-ignore]
    from langgraph.config import get_config  # type: ignore[import-not-found, unused-ignore]

    sync_wrapper = wrap_tool_call
    async_wrapper = awrap_tool_call

    class LoopGuardMiddleware(AgentMiddleware):  # type: ignore[misc, type-arg, unused-ignore]
        """treellm's loop detection around every tool call of the agent."""

        def __init__(self, guard: LoopGuard, *, end_runs: bool = True) -> None:
            super().__init__()
            self.guard = guard
            self.end_runs = end_runs
            self._wrap = sync_wrapper(guard)
            self._awrap = async_wrapper(guard)

        def wrap_tool_call(self, request: Any, handler: Handler) -> Any:
            return self._wrap(request, handler)

        async def awrap_tool_call(self, request: Any, handler: AsyncHandler) -> Any:
            return await self._awrap(request, handler)

        def _end(self, state: Any, runtime: Any) -> None:
            if not self.end_runs:
                return
            try:
                config: Mapping[str, Any] | None = get_config()
            except RuntimeError:  # not inside a runnable context
                config = None
            self.guard.end(conversation_path(config, getattr(runtime, "execution_info", None), state))

        def after_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
            self._end(state, runtime)
            return None

        async def aafter_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
            self._end(state, runtime)
            return None

    return LoopGuardMiddleware
