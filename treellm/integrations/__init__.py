"""Glue between :class:`treellm.LoopGuard` and other agent frameworks: a line or two each.

One module per framework. Each imports its framework inside its functions, so importing
``treellm.integrations.<name>`` never needs the framework installed; each takes the
conversation (the guard's ``path``) from the framework's own context and answers a caught
call in the form the framework expects (the model always gets an answer per call).

- :mod:`treellm.integrations.langgraph`: LangGraph / LangChain 1.x.
  ``create_agent(model, tools, middleware=[loop_guard_middleware(guard)])``, or
  ``ToolNode(tools, wrap_tool_call=wrap_tool_call(guard))``; the path is the
  ``thread_id`` of the run's config.
- :mod:`treellm.integrations.openai_agents`: the OpenAI Agents SDK.
  ``loop_guard(agent, guard)`` (or ``Agent(..., tools=guard_tools(tools, guard))``); the
  path is the SDK trace of the run (``context.conversation_id`` when the run's context
  has one).
- :mod:`treellm.integrations.smolagents`: smolagents. ``guard_agent(agent, guard)``
  (or ``guard_tools(tools, guard)``); the path is a run id per ``agent.run``.
- :mod:`treellm.integrations.pydantic_ai`: Pydantic AI. ``Agent(..., capabilities=[loop_guard(guard)])``;
  the path is ``ctx.run_id`` (``per="conversation"``: ``ctx.conversation_id``).
- :mod:`treellm.integrations.mcp`: ``treellm mcp-proxy -- <server command...>``, an MCP
  server over stdio in front of any MCP server; the path is the MCP session.

What the model gets for a caught call: ``decision.answer`` for ``nudge`` and ``cache``,
and for ``prune`` the text of :func:`caught_answer` (frameworks need an answer per call;
LangGraph marks it ``status="error"``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["caught_answer"]


def caught_answer(decision: Any) -> str:
    """The tool result for a call the guard did not allow (a ``GuardDecision``): its
    ``answer`` (``nudge``, ``cache``), else a note that the repeat was pruned (``prune``)."""
    if decision.answer is not None:
        return str(decision.answer)
    times = "once" if decision.count == 1 else f"{decision.count} times"
    return (
        f"[treellm] {decision.tool} was pruned: it was already called {times} on this path with "
        f"these exact arguments (limit {decision.limit}), so it was not run again. "
        "Do not repeat this call; use the earlier result or try something else."
    )
