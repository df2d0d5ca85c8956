"""LoopGuard for Pydantic AI (``pydantic-ai`` / ``pydantic-ai-slim``), as a capability.

One line for an agent::

    guard = LoopGuard(max_repeats=2, on_repeat="nudge")
    agent = Agent(model, tools=tools, capabilities=[loop_guard(guard)])

(or per run: ``agent.run_sync(prompt, capabilities=[loop_guard(guard)])``). The capability's
``wrap_tool_execute`` checks each function tool call before it runs (with the call's
``tool_call_id``) and records it after; a caught call never runs and its tool result is
``decision.answer`` for ``nudge`` and ``cache``, and for ``prune`` a note that the repeat
was pruned (:func:`treellm.integrations.caught_answer`). A tool that raises (``ModelRetry``,
``ToolFailed`` or any error) is recorded as a failed call and the exception goes on to
Pydantic AI as before; a call deferred for approval (``CallDeferred``, ``ApprovalRequired``)
or skipped never ran and is released. Output tools (``final_result``) are never guarded.
Pydantic AI runs a step's tool calls concurrently: the guard's reservations make identical
calls of one step count against each other.

**The path** (the guard's conversation) comes from the ``RunContext``: ``per="run"`` (the
default) is ``ctx.run_id``, one conversation per ``Agent.run``/``run_sync``/``iter``,
ended by the capability's ``wrap_run`` when the run ends (``failed`` when it raised);
``per="conversation"`` is ``ctx.conversation_id``, so runs that continue a conversation
(``message_history=`` or ``conversation_id=``) count together; the capability never ends
those: call ``guard.end(conversation_id)``.

Pydantic AI's ``Instrumentation`` capability is always outermost, so the check and record
run inside its ``execute_tool`` span: the guard writes on that span (a caught call's span
carries ``loop:detected`` and is not counted as a call that ran) and makes no span of its
own. Without instrumentation the guard makes its own run and tool spans.

Pydantic AI is imported inside the functions: importing this module never needs it.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from treellm.integrations import caught_answer

if TYPE_CHECKING:
    from treellm.guard import LoopGuard

__all__ = ["INTERNAL_TOOLS", "conversation_path", "loop_guard"]

Per = Literal["run", "conversation"]

INTERNAL_TOOLS = frozenset({"final_result"})
"""Tool names never guarded (Pydantic AI's output tool), whatever their kind."""


def conversation_path(ctx: Any, per: Per = "run") -> Hashable:
    """The guard path of a ``RunContext``: its ``run_id`` (``per="run"``) or its
    ``conversation_id`` (``per="conversation"``)."""
    return getattr(ctx, "conversation_id" if per == "conversation" else "run_id", None)


def loop_guard(guard: LoopGuard, *, per: Per = "run") -> Any:
    """A Pydantic AI capability that guards every function tool call of a run with ``guard``."""
    if per not in ("run", "conversation"):
        raise ValueError(f"per must be 'run' or 'conversation', not {per!r}")
    return _capability_class()(guard=guard, per=per)


@functools.cache
def _capability_class() -> type:
    from pydantic_ai.capabilities import AbstractCapability  # type: ignore[import-not-found, unused-ignore]
    from pydantic_ai.exceptions import (  # type: ignore[import-not-found, unused-ignore]
        ApprovalRequired,
        CallDeferred,
        SkipToolExecution,
    )

    not_run = (ApprovalRequired, CallDeferred, SkipToolExecution)

    @dataclass
    class LoopGuardCapability(AbstractCapability[Any]):  # type: ignore[misc, unused-ignore]
        """Checks and records each function tool call with a ``LoopGuard`` (see the module docstring)."""

        guard: LoopGuard
        per: Per = "run"

        @classmethod
        def get_serialization_name(cls) -> str | None:
            return None  # holds a live guard: not for agent specs

        async def wrap_run(self, ctx: Any, *, handler: Any) -> Any:
            if self.per != "run":
                return await handler()
            try:
                result = await handler()
            except BaseException:
                self.guard.end(conversation_path(ctx, "run"), "failed")
                raise
            self.guard.end(conversation_path(ctx, "run"))
            return result

        async def wrap_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any) -> Any:
            name = call.tool_name
            if getattr(tool_def, "kind", None) == "output" or name in INTERNAL_TOOLS:
                return await handler(args)
            path = conversation_path(ctx, self.per)
            arguments = call.args_as_dict()
            call_id = call.tool_call_id
            decision = self.guard.check(name, arguments, path, call_id=call_id)
            if not decision.allowed:
                return caught_answer(decision)
            try:
                result = await handler(args)
            except not_run:
                self.guard.release(decision)
                raise
            except Exception as exc:
                self.guard.record(name, arguments, _error_text(exc), path, call_id=call_id, error=True)
                raise
            except BaseException:  # cancelled: it did not finish
                self.guard.release(decision)
                raise
            self.guard.record(name, arguments, result, path, call_id=call_id)
            return result

    return LoopGuardCapability


def _error_text(exc: BaseException) -> str:
    message = getattr(exc, "message", None) or str(exc)
    return f"Error: {type(exc).__name__}: {message}"
