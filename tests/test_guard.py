"""LoopGuard around a plain hand-written agent loop (no tree executor)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from treellm import (
    Event,
    LoopGuard,
    ModelRequest,
    ModelTurn,
    ScriptedModel,
    ToolCall,
    TreeConfig,
    parse_arguments,
)


def hand_written_agent(model: ScriptedModel, tools: dict[str, Any], guard: LoopGuard, task: str) -> str:
    """The simplest agent loop there is, with the guard's two calls added."""
    import asyncio

    from treellm.models.base import assemble

    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    for step in range(10):
        request = ModelRequest(messages, (), f"step{step}", 0)

        async def turn(request: ModelRequest = request) -> ModelTurn:
            return assemble([d async for d in model.stream(request)])

        reply = asyncio.run(turn())
        if not reply.tool_calls:
            guard.end(outcome="completed", answer=reply.text)
            return reply.text
        kept, answers = [], []
        for i, call in enumerate(reply.tool_calls):
            args = parse_arguments(call.arguments)  # raw JSON text from the model
            decision = guard.check(call.name, args)
            if decision.allowed:
                result = tools[call.name](args)
                guard.record(call.name, args, result)
            elif decision.answer is not None:
                result = decision.answer
            else:
                continue  # pruned: drop it from the assistant message
            kept.append({"id": f"c{step}{i}", "type": "function", "function": {"name": call.name, "arguments": "{}"}})
            answers.append({"role": "tool", "tool_call_id": f"c{step}{i}", "content": result})
        if not kept:
            guard.end(outcome="pruned_out")
            return "pruned out"
        messages += [{"role": "assistant", "content": None, "tool_calls": kept}, *answers]
    return "gave up"


def test_the_guard_prunes_a_repeat_in_a_hand_written_loop_and_reports_events() -> None:
    events: list[Event] = []
    calls: list[Any] = []

    def search(args: Any) -> str:
        calls.append(args)
        return f"results for {json.dumps(args)}"

    model = ScriptedModel(
        [
            ModelTurn(tool_calls=[ToolCall("search", {"q": "x"})]),
            ModelTurn(tool_calls=[ToolCall("search", {"q": "y"})]),
            ModelTurn(tool_calls=[ToolCall("search", {"q": "x"})]),
        ]
    )
    guard = LoopGuard(observers=[events.append], run_ids=lambda: "g1")
    assert hand_written_agent(model, {"search": search}, guard, "find") == "pruned out"
    assert calls == [{"q": "x"}, {"q": "y"}]
    types = [e.type for e in events]
    assert types == [
        "run:start",
        "tool:start",
        "tool:complete",
        "tool:start",
        "tool:complete",
        "loop:detected",
        "run:complete",
    ]
    caught = events[5].payload.call  # type: ignore[union-attr]
    assert (caught.tool, caught.count, caught.limit, caught.action) == ("search", 1, 1, "prune")
    assert caught.earlier_node_ids == ("n1",)
    assert events[-1].payload.outcome == "pruned_out"  # type: ignore[union-attr]
    assert {e.run_id for e in events} == {"g1"}


def test_per_tool_limits_nudge_and_a_limits_file(tmp_path: Path) -> None:
    model = ScriptedModel(
        [ModelTurn(tool_calls=[ToolCall("fetch", {"u": 1})]) for _ in range(3)] + [ModelTurn(text="ok")]
    )
    fetched: list[Any] = []
    guard = LoopGuard(limits={"fetch": 2}, on_repeat="nudge")
    answer = hand_written_agent(model, {"fetch": lambda a: fetched.append(a) or "page"}, guard, "t")
    assert answer == "ok" and len(fetched) == 2
    last = model.requests[3].messages[-1]["content"]
    assert "already called 2 times" in last and "page" in last

    limits = tmp_path / "limits.toml"
    limits.write_text("[tools.fetch]\nmax_repeats = 1\n", encoding="utf-8")
    filed = LoopGuard(limits={"fetch": 5}, config=TreeConfig.from_file(limits))
    filed.record("fetch", {"u": 1}, "page")
    decision = filed.check("fetch", {"u": 1})
    assert not decision.allowed and (decision.limit, decision.limit_source) == (1, "file")


def test_conversations_are_separate_paths_and_mutating_tools_restart_counts() -> None:
    guard = LoopGuard(mutates=["edit"])
    guard.record("read", {"p": "a"}, "v1", path="alice")
    assert guard.check("read", {"p": "a"}, path="bob").allowed
    assert not guard.check("read", {"p": "a"}, path="alice").allowed
    guard.record("edit", {"p": "a"}, "ok", path="alice")
    assert guard.check("read", {"p": "a"}, path="alice").allowed
    guard.record("edit", {"p": "b"}, "failed", path="bob", error=True)
    guard.record("read", {"p": "a"}, "v1", path="bob")
    assert not guard.check("read", {"p": "a"}, path="bob").allowed


def test_shadow_mode_allows_the_call_but_reports_it() -> None:
    events: list[Event] = []
    guard = LoopGuard(shadow=True, observers=[events.append])
    guard.record("s", {}, "r")
    decision = guard.check("s", {})
    assert decision.allowed and decision.shadow and decision.action == "prune"
    assert events[-1].type == "loop:detected" and events[-1].payload.call.shadow  # type: ignore[union-attr]
