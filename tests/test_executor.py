"""Scenario tests of the tree executor with ScriptedModel: each behaviour of issue 3 pinned."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import assert_valid_history, by_depth, last_tool_results

from treellm import (
    ChunkType,
    ModelRequest,
    ModelTurn,
    NodeStatus,
    RawArguments,
    ScriptedModel,
    ScriptExhaustedError,
    Skill,
    ThinkNode,
    Tool,
    ToolCall,
    ToolNode,
    TreeConfig,
    TreeExecutor,
    Usage,
)


class Counter:
    """A tool handler that counts its calls and echoes its arguments."""

    def __init__(self, name: str = "tool") -> None:
        self.name = name
        self.calls: list[dict[str, Any]] = []

    def __call__(self, args: dict[str, Any]) -> str:
        self.calls.append(args)
        return f"{self.name} result {len(self.calls)} for {json.dumps(args, sort_keys=True)}"


def executor(model: ScriptedModel, tools: list[Tool], config: TreeConfig | None = None, **kw: Any) -> TreeExecutor:
    return TreeExecutor(model, tools, config, telemetry=False, **kw)


def call(name: str, **args: Any) -> ToolCall:
    return ToolCall(name, args)


def tool_nodes(result: Any) -> list[ToolNode]:
    return [n for n in result.nodes if isinstance(n, ToolNode)]


def check_histories(model: ScriptedModel) -> None:
    for request in model.requests:
        assert_valid_history(request.messages)


# -- completion --------------------------------------------------------------------------------


def test_a_text_answer_with_no_tool_calls_completes_the_run() -> None:
    result = executor(ScriptedModel([ModelTurn(text="42")]), []).run("question")
    assert (result.outcome, result.answer) == ("completed", "42")
    assert [n.kind for n in result.nodes] == ["think"]
    assert result.nodes[0].status == NodeStatus.COMPLETED


def test_task_complete_ends_the_branch_with_its_result_and_summary() -> None:
    model = ScriptedModel([ModelTurn(tool_calls=[call("task_complete", result="done", summary="short")])])
    result = executor(model, []).run("t")
    assert result.answer == "done" and result.answers[0].summary == "short"
    assert [e.type for e in result.events][-2:] == ["task:complete", "run:complete"]


def test_the_model_is_offered_the_tools_skills_and_task_complete() -> None:
    model = ScriptedModel([ModelTurn(text="ok")])
    skill = Skill("research", "look things up", "You research.")
    executor(model, [Tool("a", "tool a", handler=Counter())], skills=[skill]).run("t")
    assert [t.name for t in model.requests[0].tools] == ["a", "skill_research", "task_complete"]
    assert model.requests[0].purpose == "think" and model.requests[0].depth == 0


# -- the loop check ----------------------------------------------------------------------------


def test_an_exact_repeat_on_the_path_is_pruned_before_it_runs() -> None:
    handler = Counter()
    model = ScriptedModel(
        [
            ModelTurn(tool_calls=[call("search", q="x")]),
            ModelTurn(tool_calls=[call("search", q="x")]),
        ]
    )
    result = executor(model, [Tool("search", "s", handler=handler)]).run("t")
    assert len(handler.calls) == 1
    assert result.outcome == "pruned_out"
    pruned = result.pruned_calls[0]
    assert (pruned.tool, pruned.count, pruned.limit, pruned.limit_source, pruned.action) == (
        "search",
        1,
        1,
        "default",
        "prune",
    )
    assert pruned.earlier_node_ids == (tool_nodes(result)[0].id,)
    chunk = next(c for c in result.chunks if c.type == ChunkType.LOOP_DETECTED)
    assert chunk.content == '[tree] Loop detected: search({"q":"x"}) already in path — pruning branch'
    last = result.nodes[-1]
    assert isinstance(last, ThinkNode) and last.status == NodeStatus.COMPLETED and last.pruned
    assert not result.children(last.id)
    check_histories(model)


def test_the_same_call_twice_in_one_turn_runs_once() -> None:
    handler = Counter()
    model = ScriptedModel(
        [ModelTurn(tool_calls=[call("search", q="x"), call("search", q="x")]), ModelTurn(text="done")]
    )
    result = executor(model, [Tool("search", "s", handler=handler)]).run("t")
    assert len(handler.calls) == 1
    assert len(result.pruned_calls) == 1
    assert result.pruned_calls[0].earlier_node_ids == (tool_nodes(result)[0].id,)
    assert result.outcome == "completed"
    check_histories(model)
    # the pruned duplicate was removed from the assistant message that went back
    assistant = next(m for m in model.requests[1].messages if m["role"] == "assistant")
    assert len(assistant["tool_calls"]) == 1


def test_key_order_in_the_model_arguments_does_not_hide_a_repeat() -> None:
    model = ScriptedModel(
        [
            ModelTurn(tool_calls=[ToolCall("s", '{"a": 1, "b": 2}')]),
            ModelTurn(tool_calls=[ToolCall("s", '{"b":2,"a":1}')]),
        ]
    )
    result = executor(model, [Tool("s", "s", handler=Counter())]).run("t")
    assert result.outcome == "pruned_out" and len(result.pruned_calls) == 1


def test_per_tool_max_repeats_overrides_the_default_and_the_limits_file_overrides_both(
    tmp_path: Path,
) -> None:
    turns = [ModelTurn(tool_calls=[call("fetch", url="u")]) for _ in range(4)]
    flaky = Counter()
    result = executor(ScriptedModel(turns), [Tool("fetch", "f", handler=flaky, max_repeats=3)]).run("t")
    assert len(flaky.calls) == 3
    assert (result.pruned_calls[0].limit, result.pruned_calls[0].limit_source) == (3, "tool")
    assert [n.ordinal for n in tool_nodes(result)] == [1, 2, 3]

    limits = tmp_path / "limits.toml"
    limits.write_text("[tools.fetch]\nmax_repeats = 2\n", encoding="utf-8")
    config = TreeConfig.from_file(limits, max_repeats_per_signature=5)
    again = Counter()
    result = executor(ScriptedModel(turns), [Tool("fetch", "f", handler=again, max_repeats=3)], config).run("t")
    assert len(again.calls) == 2
    assert (result.pruned_calls[0].limit, result.pruned_calls[0].limit_source) == (2, "file")


def test_the_default_limit_comes_from_the_config() -> None:
    turns = [ModelTurn(tool_calls=[call("s", q=1)]) for _ in range(3)]
    handler = Counter()
    config = TreeConfig(max_repeats_per_signature=2)
    result = executor(ScriptedModel(turns), [Tool("s", "s", handler=handler)], config).run("t")
    assert len(handler.calls) == 2 and result.pruned_calls[0].limit_source == "default"


# -- fork: path-local counting -----------------------------------------------------------------


def fork_responder(request: ModelRequest) -> ModelTurn:
    """Root: two calls. Each branch then calls B(y) once; branches see only their own call."""
    if request.depth == 0:
        return ModelTurn(tool_calls=[call("a", v="x"), call("b", v="y")])
    if request.depth == 1:
        return ModelTurn(tool_calls=[call("b", v="y")])
    return ModelTurn(tool_calls=[call("task_complete", result=f"answer at {request.node_id}")])


def test_fork_counts_each_branch_apart_from_its_siblings() -> None:
    a, b = Counter("a"), Counter("b")
    model = ScriptedModel(fork_responder)
    config = TreeConfig(branching="fork")
    result = executor(model, [Tool("a", "a", handler=a), Tool("b", "b", handler=b)], config).run("t")
    # branch a: b(y) is new on its path and runs; branch b: b(y) repeats its own call and is pruned
    assert len(b.calls) == 2 and len(a.calls) == 1
    assert len(result.pruned_calls) == 1
    root_tools = [n for n in tool_nodes(result) if n.depth == 0]
    branch_of_b = next(n for n in root_tools if n.tool_name == "b")
    pruned_node = next(n for n in result.nodes if isinstance(n, ThinkNode) and n.pruned)
    assert pruned_node.parent_id == branch_of_b.id
    assert result.outcome == "completed"
    assert len(result.answers) == 1
    check_histories(model)


def test_fork_children_are_tool_children_and_each_context_holds_only_its_call() -> None:
    model = ScriptedModel(by_depth({0: ModelTurn(tool_calls=[call("a", v=1), call("a", v=2)])}))
    result = executor(model, [Tool("a", "a", handler=Counter())], TreeConfig(branching="fork")).run("t")
    children = [n for n in result.nodes if isinstance(n, ThinkNode) and n.depth == 1]
    assert {c.parent_id for c in children} == {n.id for n in tool_nodes(result)}
    for request in model.requests[1:]:
        assert len(last_tool_results(request)) == 1
    # every branch answered; the answer is the one of the branch created first
    assert len(result.answers) == 2 and result.answer == "done"
    assert result.answers[0].node_id == min((c.id for c in children), key=lambda i: int(i[1:]))
    check_histories(model)


def test_fork_keeps_a_valid_history_after_prunes_and_nudges() -> None:
    def respond(request: ModelRequest) -> ModelTurn:
        if request.depth == 0:
            return ModelTurn(tool_calls=[call("a", v=1), call("n", v=1)])
        if request.depth == 1:  # each branch repeats both calls and adds a new one
            return ModelTurn(tool_calls=[call("a", v=1), call("n", v=1), call("a", v=2), call("a", v=2)])
        return ModelTurn(text="done")

    model = ScriptedModel(respond)
    tools = [Tool("a", "a", handler=Counter("a")), Tool("n", "n", handler=Counter("n"), on_repeat="nudge")]
    result = executor(model, tools, TreeConfig(branching="fork")).run("t")
    assert result.outcome == "completed"
    actions = sorted(p.action for p in result.pruned_calls)
    # branch a: a(1) pruned, a(2) dup pruned; branch n: n(1) nudged, a(2) dup pruned
    assert actions == ["nudge", "prune", "prune", "prune"]
    check_histories(model)
    for request in model.requests[3:]:
        assistant = [m for m in request.messages if m["role"] == "assistant"][-1]
        names = [c["function"]["name"] for c in assistant["tool_calls"]]
        assert names.count("a") <= 2 and len(names) == len(last_tool_results(request))


# -- repeat actions ----------------------------------------------------------------------------


def test_nudge_answers_the_model_without_running_the_tool() -> None:
    handler = Counter()
    model = ScriptedModel(
        [
            ModelTurn(tool_calls=[call("s", q="x")]),
            ModelTurn(tool_calls=[call("s", q="x")]),
            ModelTurn(text="ok"),
        ]
    )
    result = executor(model, [Tool("s", "s", handler=handler, on_repeat="nudge")]).run("t")
    assert len(handler.calls) == 1 and result.outcome == "completed"
    nudge = last_tool_results(model.requests[2])[0]
    assert "already called once" in nudge and "tool result 1" in nudge
    assert result.pruned_calls[0].action == "nudge" and result.pruned_calls[0].answer == nudge
    assert "answering with a nudge" in next(c for c in result.chunks if c.type == "loopDetected").content
    check_histories(model)


def test_cache_returns_the_earlier_result_without_running() -> None:
    handler = Counter()
    model = ScriptedModel(
        [
            ModelTurn(tool_calls=[call("s", q="x")]),
            ModelTurn(tool_calls=[call("s", q="x")]),
            ModelTurn(text="ok"),
        ]
    )
    result = executor(model, [Tool("s", "s", handler=handler, on_repeat="cache")]).run("t")
    assert len(handler.calls) == 1
    assert last_tool_results(model.requests[2]) == [tool_nodes(result)[0].result]
    check_histories(model)


def test_the_limits_file_sets_the_action_and_mutates(tmp_path: Path) -> None:
    limits = tmp_path / "l.toml"
    limits.write_text('[tools.s]\non_repeat = "cache"\n', encoding="utf-8")
    model = ScriptedModel(
        [ModelTurn(tool_calls=[call("s", q=1)]), ModelTurn(tool_calls=[call("s", q=1)]), ModelTurn(text="ok")]
    )
    result = executor(model, [Tool("s", "s", handler=Counter())], TreeConfig.from_file(limits)).run("t")
    assert result.pruned_calls[0].action == "cache"


def test_shadow_mode_runs_every_call_and_reports_the_would_be_catch() -> None:
    handler = Counter()
    model = ScriptedModel(
        [
            ModelTurn(tool_calls=[call("s", q="x")]),
            ModelTurn(tool_calls=[call("s", q="x")]),
            ModelTurn(text="ok"),
        ]
    )
    result = executor(model, [Tool("s", "s", handler=handler)], TreeConfig(shadow=True)).run("t")
    assert len(handler.calls) == 2 and result.outcome == "completed"
    event = next(e for e in result.events if e.type == "loop:detected")
    assert event.payload.call.shadow is True and event.payload.call.action == "prune"  # type: ignore[union-attr]
    assert [n.shadow_caught for n in tool_nodes(result)] == [False, True]
    assert [n.ordinal for n in tool_nodes(result)] == [1, 2]
    assert result.stats.pruned == 0 and result.stats.loops_detected == 1
    assert not any(c.type == "loopDetected" for c in result.chunks)


def test_a_successful_mutating_call_restarts_other_tools_counts() -> None:
    read, edit = Counter("read"), Counter("edit")
    model = ScriptedModel(
        [
            ModelTurn(tool_calls=[call("read_file", path="a")]),
            ModelTurn(tool_calls=[call("edit_file", path="a")]),
            ModelTurn(tool_calls=[call("read_file", path="a")]),
            ModelTurn(tool_calls=[call("read_file", path="a")]),
        ]
    )
    tools = [Tool("read_file", "r", handler=read), Tool("edit_file", "e", handler=edit, mutates=True)]
    result = executor(model, tools).run("t")
    assert len(read.calls) == 2  # re-read after the edit runs; the third read is a loop
    assert result.pruned_calls[0].earlier_node_ids == (tool_nodes(result)[-1].id,)


def test_a_failed_mutating_call_does_not_restart_counts() -> None:
    def broken(_: dict[str, Any]) -> str:
        raise OSError("disk full")

    read = Counter("read")
    model = ScriptedModel(
        [
            ModelTurn(tool_calls=[call("read_file", path="a")]),
            ModelTurn(tool_calls=[call("edit_file", path="a")]),
            ModelTurn(tool_calls=[call("read_file", path="a")]),
        ]
    )
    tools = [Tool("read_file", "r", handler=read), Tool("edit_file", "e", handler=broken, mutates=True)]
    config = TreeConfig(retry_max_attempts=1)
    result = executor(model, tools, config).run("t")
    assert len(read.calls) == 1 and result.outcome == "pruned_out"


# -- malformed arguments, unknown tools, retries -----------------------------------------------


def test_malformed_arguments_go_back_as_an_error_and_count_under_their_raw_text() -> None:
    handler = Counter()
    model = ScriptedModel(
        [
            ModelTurn(tool_calls=[ToolCall("s", '{"q": "x"')]),
            ModelTurn(tool_calls=[ToolCall("s", '{"q": "y"'), ToolCall("s", '{"q": "x"')]),
            ModelTurn(text="gave up"),
        ]
    )
    result = executor(model, [Tool("s", "s", handler=handler)]).run("t")
    assert not handler.calls
    first = tool_nodes(result)[0]
    assert first.status == NodeStatus.FAILED and isinstance(first.args, RawArguments)
    feedback = last_tool_results(model.requests[1])[0]
    assert "not valid JSON" in feedback and "line 1 column" in feedback
    # the second, different malformed text is a new call; the repeat of the first is pruned
    assert len(tool_nodes(result)) == 2 and len(result.pruned_calls) == 1
    check_histories(model)


def test_an_unknown_tool_gets_an_error_result_naming_the_available_tools() -> None:
    model = ScriptedModel([ModelTurn(tool_calls=[call("nope", x=1)]), ModelTurn(text="ok")])
    result = executor(model, [Tool("s", "s", handler=Counter())]).run("t")
    text = last_tool_results(model.requests[1])[0]
    assert "unknown tool 'nope'" in text and "s, task_complete" in text
    assert tool_nodes(result)[0].status == NodeStatus.FAILED


def test_a_failing_handler_is_retried_with_exponential_backoff() -> None:
    attempts: list[int] = []
    slept: list[float] = []

    def flaky(_: dict[str, Any]) -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise TimeoutError("upstream timed out")
        return "finally"

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    model = ScriptedModel([ModelTurn(tool_calls=[call("f")]), ModelTurn(text="ok")])
    config = TreeConfig(retry_max_attempts=3, retry_base_delay_s=0.5)
    result = executor(model, [Tool("f", "f", handler=flaky)], config, sleep=fake_sleep).run("t")
    node = tool_nodes(result)[0]
    assert (node.status, node.attempts, node.result) == (NodeStatus.COMPLETED, 3, "finally")
    assert slept == [0.5, 1.0]
    assert [e.type for e in result.events].count("tool:retry") == 2
    assert result.stats.retries == 2


def test_a_handler_that_keeps_failing_sends_its_error_to_the_model() -> None:
    def broken(_: dict[str, Any]) -> str:
        raise ValueError("bad input")

    async def no_sleep(_: float) -> None:
        return None

    model = ScriptedModel([ModelTurn(tool_calls=[call("f")]), ModelTurn(text="ok")])
    result = executor(model, [Tool("f", "f", handler=broken)], sleep=no_sleep).run("t")
    node = tool_nodes(result)[0]
    assert node.status == NodeStatus.FAILED and node.attempts == 3
    assert "ValueError: bad input" in last_tool_results(model.requests[1])[0]
    assert any(e.type == "tool:error" for e in result.events)


# -- budgets -----------------------------------------------------------------------------------


def test_the_node_budget_stops_the_tree_cleanly() -> None:
    model = ScriptedModel(lambda r: ModelTurn(tool_calls=[call("s", n=r.depth)]))
    result = executor(model, [Tool("s", "s", handler=Counter())], TreeConfig(node_budget=7)).run("t")
    assert result.outcome == "budget_exhausted"
    assert len(result.nodes) <= 7
    event = next(e for e in result.events if e.type == "budget:exhausted")
    assert event.payload.budget == "node" and event.payload.limit == 7  # type: ignore[union-attr]
    assert any(c.type == "budgetExhausted" for c in result.chunks)
    check_histories(model)


def test_the_depth_limit_stops_the_branch() -> None:
    model = ScriptedModel(lambda r: ModelTurn(tool_calls=[call("s", n=r.depth)]))
    result = executor(model, [Tool("s", "s", handler=Counter())], TreeConfig(depth_limit=3)).run("t")
    assert result.outcome == "budget_exhausted"
    assert max(n.depth for n in result.nodes) == 2
    event = next(e for e in result.events if e.type == "budget:exhausted")
    assert event.payload.budget == "depth"  # type: ignore[union-attr]


# -- collapse ----------------------------------------------------------------------------------


def test_collapse_merges_results_and_compresses_above_the_threshold() -> None:
    def big(args: dict[str, Any]) -> str:
        return "x" * 300 + str(args["i"])

    def respond(request: ModelRequest) -> ModelTurn:
        if request.purpose == "collapse":
            return ModelTurn(text="SUMMARY", usage=Usage(10, 2))
        if request.depth == 0:
            return ModelTurn(tool_calls=[call("big", i=1), call("big", i=2)])
        return ModelTurn(text="done")

    model = ScriptedModel(respond)
    config = TreeConfig(collapse_threshold=500)
    result = executor(model, [Tool("big", "b", handler=big)], config).run("task text")
    collapse = next(n for n in result.nodes if n.kind == "collapse")
    assert collapse.compressed and collapse.size_before == 602 and collapse.size_after == 7  # type: ignore[union-attr]
    assert set(collapse.merged) == {n.id for n in tool_nodes(result)}  # type: ignore[union-attr]
    child_request = model.requests[-1]
    assert [m["role"] for m in child_request.messages] == ["system", "user", "assistant"]
    assert child_request.messages[1]["content"] == "task text"
    assert "SUMMARY" in child_request.messages[2]["content"]
    assert result.stats.compressions == 1 and result.stats.input_tokens == 10
    collapse_request = next(r for r in model.requests if r.purpose == "collapse")
    assert collapse_request.tools == ()


# -- skills ------------------------------------------------------------------------------------


def test_a_skill_runs_a_sub_tree_with_its_own_path_depth_and_stack() -> None:
    handler = Counter()

    def respond(request: ModelRequest) -> ModelTurn:
        if request.skill_stack == ("research",):
            if request.depth == 0:  # the same call as the parent made: a new path, so it runs
                return ModelTurn(tool_calls=[call("s", q="x")])
            return ModelTurn(tool_calls=[call("task_complete", result="skill answer")])
        if request.depth == 0:
            return ModelTurn(tool_calls=[call("s", q="x")])
        if request.depth == 1:
            return ModelTurn(tool_calls=[call("skill_research", task="dig")])
        return ModelTurn(text=f"final: {last_tool_results(request)[0]}")

    model = ScriptedModel(respond)
    skill = Skill("research", "research", "You research.")
    result = executor(model, [Tool("s", "s", handler=handler)], skills=[skill]).run("t")
    assert result.answer == "final: skill answer"
    assert len(handler.calls) == 2
    skill_nodes = [n for n in result.nodes if n.skill_stack == ("research",)]
    assert min(n.depth for n in skill_nodes) == 0
    skill_tool = next(n for n in tool_nodes(result) if n.tool_name == "skill_research")
    skill_root = next(n for n in skill_nodes if n.depth == 0 and n.kind == "think")
    assert skill_root.parent_id == skill_tool.id
    skill_request = next(r for r in model.requests if r.skill_stack)
    assert skill_request.messages[0] == {"role": "system", "content": "You research."}
    assert skill_request.messages[1] == {"role": "user", "content": "dig"}
    types = [e.type for e in result.events]
    assert "skill:start" in types and "skill:complete" in types
    check_histories(model)


# -- concurrency, streaming, observers ---------------------------------------------------------


def test_sibling_calls_run_concurrently() -> None:
    first, second = asyncio.Event(), asyncio.Event()

    async def a(_: dict[str, Any]) -> str:
        first.set()
        await asyncio.wait_for(second.wait(), 2)
        return "a"

    async def b(_: dict[str, Any]) -> str:
        second.set()
        await asyncio.wait_for(first.wait(), 2)
        return "b"

    model = ScriptedModel([ModelTurn(tool_calls=[call("a"), call("b")]), ModelTurn(text="ok")])
    result = executor(model, [Tool("a", "a", handler=a), Tool("b", "b", handler=b)]).run("t")
    assert [n.result for n in tool_nodes(result)] == ["a", "b"]


def test_one_executor_runs_many_tasks_at_once_without_sharing_state() -> None:
    model = ScriptedModel(
        lambda r: ModelTurn(text="done") if r.depth else ModelTurn(tool_calls=[call("s", q=r.messages[1]["content"])])
    )
    ex = executor(model, [Tool("s", "s", handler=Counter())])

    async def main() -> list[Any]:
        return list(await asyncio.gather(*(ex.arun(f"task {i}") for i in range(5))))

    results = asyncio.run(main())
    assert len({r.run_id for r in results}) == 5
    assert all(r.outcome == "completed" and len(r.nodes) == 4 for r in results)
    assert all([n.id for n in r.nodes] == ["n1", "n2", "n3", "n4"] for r in results)


def test_stream_yields_chunks_as_the_run_goes() -> None:
    model = ScriptedModel([ModelTurn(text="thinking", tool_calls=[call("s")]), ModelTurn(text="the end")], chunk_size=3)
    ex = executor(model, [Tool("s", "s", handler=Counter())])

    async def collect() -> list[Any]:
        return [c async for c in ex.stream("t")]

    chunks = asyncio.run(collect())
    assert [c.content for c in chunks if c.type == "text"] == ["thi", "nki", "ng", "the", " en", "d"]
    assert [c.type for c in chunks][-1] == "taskComplete"


def test_an_observer_that_raises_is_detached_and_the_run_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []

    def broken(_: Any) -> None:
        raise RuntimeError("observer bug")

    model = ScriptedModel([ModelTurn(tool_calls=[call("s")]), ModelTurn(text="ok")])
    ex = executor(model, [Tool("s", "s", handler=Counter())], observers=[broken, lambda e: seen.append(e.type)])
    result = ex.run("t")
    assert result.outcome == "completed"
    assert seen[0] == "run:start" and seen[-1] == "run:complete"
    assert "observer bug" in caplog.text or "detached" in caplog.text


def test_events_carry_run_node_parent_depth_and_time() -> None:
    ticks = iter(range(1000, 100000, 10))
    model = ScriptedModel([ModelTurn(tool_calls=[call("s")]), ModelTurn(text="ok")])
    result = executor(model, [Tool("s", "s", handler=Counter())], clock=lambda: next(ticks), run_ids=lambda: "r1").run(
        "t"
    )
    tool_start = next(e for e in result.events if e.type == "tool:start")
    assert (tool_start.run_id, tool_start.node_id, tool_start.parent_id, tool_start.depth) == (
        "r1",
        "n2",
        "n1",
        0,
    )
    times = [e.time_ns for e in result.events]
    assert times == sorted(times) and times[0] >= 1000


def test_a_script_that_runs_out_raises_a_clear_error() -> None:
    model = ScriptedModel([ModelTurn(tool_calls=[call("s")])])
    with pytest.raises(ScriptExhaustedError, match="ran out of turns: request 2"):
        executor(model, [Tool("s", "s", handler=Counter())]).run("t")


def test_a_model_error_fails_the_branch_as_data() -> None:
    from treellm import ModelError

    class Failing:
        model_name = "failing"

        async def stream(self, request: ModelRequest) -> Any:
            raise ModelError("HTTP 500 from server", status=500)
            yield  # pragma: no cover

    result = TreeExecutor(Failing(), [], telemetry=False).run("t")
    assert result.outcome == "failed"
    assert result.nodes[0].status == NodeStatus.FAILED and "HTTP 500" in (result.nodes[0].error or "")


def test_a_deep_collapse_tree_runs_without_hitting_the_recursion_limit() -> None:
    depth = 1500  # a chain of 1,500 turns: iterative, never one coroutine nested per level

    async def t(_: dict[str, Any]) -> str:
        return "ok"

    model = ScriptedModel(
        lambda r: ModelTurn(text="done") if r.depth >= depth else ModelTurn(tool_calls=[call("t", d=r.depth)])
    )
    config = TreeConfig(depth_limit=depth + 1, node_budget=10 * depth)
    result = executor(model, [Tool("t", "t", handler=t)], config).run("deep")
    assert result.outcome == "completed" and result.stats.max_depth == depth
