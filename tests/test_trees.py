"""Where a run starts (``derive/trees.py``, pure): the framework's own invocation of the whole
agent or graph, whatever the graph, however the spans arrive (``docs/architecture.md``,
"Where a run starts")."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from treellm.derive.trees import Placement, SpanFacts, place_trace, place_traces
from treellm.loop import CallKey, PathSignatures

T = "t1"


class Trace:
    """A trace written as a tree: ``add(id, parent, role)`` in time order, each span 10 ns
    after the previous one and ending when its last child does (set by ``spans()``)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str | None, str, str | None, CallKey | None]] = []

    def add(
        self, span_id: str, parent: str | None, role: str, *, agent: str | None = None, tool: str | None = None
    ) -> Trace:
        key = CallKey(tool, "{}", raw=True) if tool else None
        self.rows.append((span_id, parent, role, agent, key))
        return self

    def spans(self, *, missing: Sequence[str] = ()) -> list[SpanFacts]:
        start = {sid: 10 * i for i, (sid, *_) in enumerate(self.rows)}
        end = dict(start)
        for sid, parent, *_ in reversed(self.rows):
            end[sid] = max(end[sid], start[sid] + 5)
            if parent is not None:
                end[parent] = max(end[parent], end[sid] + 1)
        return [
            SpanFacts(T, sid, parent, start[sid], end[sid], role, key, agent)
            for sid, parent, role, agent, key in self.rows
            if sid not in missing
        ]


def runs(placed: Sequence[Placement]) -> dict[str, set[str]]:
    """Run root -> the spans of that run."""
    out: dict[str, set[str]] = {}
    for p in placed:
        if p.run_id is not None:
            out.setdefault(p.run_id.split(":", 1)[1], set()).add(p.span_id)
    return out


def react_graph(trace: Trace, root: str, parent: str | None, turns: int, *, role: str = "workflow") -> Trace:
    """LangGraph's hand-written graph under OpenInference: a CHAIN root, an ``agent`` node
    (AGENT because of its name) per turn with its model call, a ``tools`` CHAIN node between."""
    trace.add(root, parent, role)
    for turn in range(turns):
        trace.add(f"{root}.agent{turn}", root, "agent").add(f"{root}.llm{turn}", f"{root}.agent{turn}", "llm")
        trace.add(f"{root}.cond{turn}", f"{root}.agent{turn}", "workflow")
        trace.add(f"{root}.tools{turn}", root, "workflow")
        trace.add(f"{root}.call{turn}", f"{root}.tools{turn}", "tool", tool="search")
    trace.add(f"{root}.agent{turns}", root, "agent").add(f"{root}.llm{turns}", f"{root}.agent{turns}", "llm")
    return trace


def test_a_hand_written_graph_is_one_run_not_one_per_node_named_agent() -> None:
    placed = place_trace(react_graph(Trace(), "graph", None, 3).spans())
    assert set(runs(placed)) == {"graph"}
    ordinals = [p.ordinal for p in placed if p.ordinal is not None]
    assert ordinals == [1, 2, 3]  # one path: the repeats count


def test_a_graph_with_no_agent_span_is_one_run_at_its_root() -> None:
    trace = Trace().add("graph", None, "workflow").add("model", "graph", "workflow").add("llm", "model", "llm")
    trace.add("tools", "graph", "workflow").add("call", "tools", "tool", tool="search")
    assert set(runs(place_trace(trace.spans()))) == {"graph"}


def test_a_subgraph_and_a_graph_invoked_in_a_node_stay_in_the_outer_run() -> None:
    trace = Trace().add("outer", None, "workflow").add("triage", "outer", "workflow")
    react_graph(trace, "worker", "outer", 2)  # a compiled graph as a node
    trace.add("node", "outer", "workflow")
    react_graph(trace, "inner", "node", 1)  # a graph invoked inside a node function
    placed = place_trace(trace.spans())
    assert set(runs(placed)) == {"outer"}
    assert [p.ordinal for p in placed if p.ordinal is not None] == [1, 2, 3]


def test_a_supervisor_with_sub_agents_is_one_run_with_the_sub_agents_as_subtrees() -> None:
    trace = Trace().add("supervisor_graph", None, "workflow").add("route", "supervisor_graph", "workflow")
    trace.add("research", "supervisor_graph", "agent", agent="research_agent")
    react_graph(trace, "research.graph", "research", 1, role="agent")
    trace.add("orders", "supervisor_graph", "agent", agent="orders_agent")
    react_graph(trace, "orders.graph", "orders", 1, role="agent")
    placed = {p.span_id: p for p in place_trace(trace.spans())}
    assert set(runs(placed.values())) == {"supervisor_graph"}
    # each named sub-agent is a path of its own, its first think node at depth 0
    assert placed["research.graph.llm0"].depth == placed["orders.graph.llm0"].depth == 0
    assert placed["orders.graph.call0"].ordinal == 1  # not a repeat of the research agent's call
    assert placed["orders.graph.llm0"].node_parent_id == placed["research.graph.llm1"].span_id


def test_several_runs_under_one_http_server_span_are_several_runs() -> None:
    trace = Trace().add("http", None, "other")
    react_graph(trace, "first", "http", 2)
    trace.add("format_prompt", "http", "workflow")  # a chain that calls no model: no run
    react_graph(trace, "second", "http", 1)
    placed = runs(place_trace(trace.spans()))
    assert set(placed) == {"first", "second"}
    # spans outside every run join the run whose time window holds their start, else the first
    assert {"http", "format_prompt"} <= placed["first"]


def test_invocations_that_call_nothing_are_runs_when_nothing_else_is() -> None:
    trace = Trace().add("http", None, "other").add("a", "http", "agent").add("b", "http", "agent")
    assert set(runs(place_trace(trace.spans()))) == {"a", "b"}
    called = Trace().add("root", None, "other").add("x", "root", "other").add("c", "x", "llm")
    assert set(runs(place_trace(called.spans()))) == {"root"}


def test_a_trace_of_no_invocation_and_no_call_is_no_run() -> None:
    """AutoGen's ``create_agent`` at construction, a health check: stored, placed nowhere."""
    placed = place_trace(Trace().add("create_agent", None, "other").add("x", "create_agent", "other").spans())
    assert [p.run_id for p in placed] == [None, None]
    assert not any(p.node_kind or p.orphan for p in placed)


def test_a_run_split_across_batches_is_one_run_once_its_root_arrives() -> None:
    trace = react_graph(Trace(), "graph", None, 3)
    # first batch: everything but the root (a batch exporter sends children first)
    early = runs(place_trace(trace.spans(missing=["graph"])))
    assert len(early) == 1  # provisionally the first node, not one run per node
    assert all(p.orphan for p in place_trace(trace.spans(missing=["graph"])) if p.span_id == "graph.tools0")
    # every later placement sees the whole trace again
    final = place_trace(trace.spans())
    assert set(runs(final)) == {"graph"}
    assert not any(p.orphan for p in final)


def test_several_runs_under_an_http_span_split_across_batches_are_right_once_all_arrive() -> None:
    trace = Trace().add("http", None, "other")
    react_graph(trace, "first", "http", 1)
    react_graph(trace, "second", "http", 1)
    assert len(runs(place_trace(trace.spans(missing=["http"])))) == 1  # provisional
    assert len(runs(place_trace(trace.spans(missing=["first"])))) == 1  # the anchored one
    assert set(runs(place_trace(trace.spans()))) == {"first", "second"}


def test_a_middle_span_arriving_late_leaves_the_run_at_the_root() -> None:
    trace = react_graph(Trace(), "graph", None, 2)
    placed = place_trace(trace.spans(missing=["graph.agent1", "graph.tools0"]))
    assert set(runs(placed)) == {"graph"}
    orphans = {p.span_id for p in placed if p.orphan}
    assert orphans == {"graph.llm1", "graph.cond1", "graph.call0"}


def test_traces_are_placed_each_on_their_own() -> None:
    one = react_graph(Trace(), "graph", None, 1).spans()
    other = [
        SpanFacts("t2", s.span_id, s.parent_id, s.start_ns, s.end_ns, s.role, s.call_key, s.agent_name) for s in one
    ]
    placed = place_traces([*one, *other])
    assert {p.run_id for p in placed} == {"t1:graph", "t2:graph"}


def _counted_by_path_signatures(calls: Sequence[SpanFacts]) -> dict[str, tuple[int, tuple[str, ...]]]:
    """(ordinal, earlier ids) of each call of one path in time order, as the runtime's own
    PathSignatures counts them."""
    path = PathSignatures.empty()
    out = {}
    for span in calls:
        assert span.call_key is not None
        out[span.span_id] = (path.count(span.call_key) + 1, tuple(str(i) for i in path.earlier(span.call_key)))
        path = path.extend(
            span.call_key, span.span_id, mutates=span.changes_state, reads=span.reads, writes=span.writes
        )
    return out


@pytest.mark.parametrize("seed", range(6))
def test_ordinals_and_earlier_calls_are_the_runtimes_count_with_and_without_state_changes(seed: int) -> None:
    rng = random.Random(seed)
    keys = [CallKey("read_file", f'{{"path": "{name}"}}', raw=True) for name in "abc"]
    writer = CallKey("write_file", '{"path": "a"}', raw=True)
    mutating = seed % 2 == 1  # every other path holds state changes: the counts restart at them
    spans = [SpanFacts(T, "root", None, 0, 10_000, "agent")]
    for i in range(60):
        if i % 7 == 0:
            spans.append(SpanFacts(T, f"llm{i}", "root", 10 * i + 1, 10 * i + 5, "llm"))
            continue
        if mutating and rng.random() < 0.15:
            key, facts = writer, {"changes_state": True, "reads": frozenset(), "writes": frozenset({"a"})}
        else:
            key = rng.choice(keys)
            facts = {"reads": frozenset({key.canonical[10]}), "writes": frozenset()}
        spans.append(SpanFacts(T, f"call{i}", "root", 10 * i + 1, 10 * i + 5, "tool", key, **facts))
    expected = _counted_by_path_signatures([s for s in spans if s.call_key is not None])
    placed = {p.span_id: (p.ordinal, tuple(p.earlier)) for p in place_trace(spans) if p.ordinal is not None}
    assert placed == expected
    assert any(ordinal > 1 for ordinal, _ in placed.values())
    if mutating:  # a restart happened: some call counts fewer than all its key's earlier calls
        seen: dict[CallKey, int] = {}
        restarted = False
        for span in spans:
            if span.call_key is not None:
                restarted |= placed[span.span_id][0] <= seen.get(span.call_key, 0)
                seen[span.call_key] = seen.get(span.call_key, 0) + 1
        assert restarted
