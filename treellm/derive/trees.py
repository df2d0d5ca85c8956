"""Runs, trees and paths of spans from other frameworks (pure; ``docs/architecture.md``).

- **run** (``docs/architecture.md``, "Where a run starts"): the framework's own invocation
  of a whole agent or graph, that is the outermost *invocation* span (role ``agent`` or
  ``workflow``: an agent, a chain, a graph, a workflow) that holds a model or tool call.
  Invocations nested inside it (graph nodes, a node an instrumentor marks as an agent
  because of its name, subgraphs, sub-agents, handoffs) are not runs; spans of other roles
  above it (an HTTP server span, a caller's span) do not count, so several invocations
  under one of them are several runs. With no invocation holding a call, the outermost
  invocations are the runs; with no invocation at all, the trace root, when the trace holds a
  model or tool call: a trace of neither (an agent's construction, a health check) is no run,
  its spans are placed nowhere. A span whose parent
  is missing from the trace (or that a converter flagged ``orphan_parent``) is flagged and
  is a run only when no anchored run exists (then only the first such: the rest of its
  graph is probably still to come); a span outside every run joins the run whose time
  window holds its start, else the first run.
- **path**: the tool calls in time order under the nearest enclosing agent span that
  starts a path (the run's root, or a sub-agent: an agent span whose agent name differs
  from its enclosing agent's); a graph node marked as an agent with the same agent (or no
  name) stays on its run's path.
- **tree**, rebuilt like treellm's own: in time order on a path, an LLM span is a think
  node; the tool spans after it are its tool nodes (same depth); the next think node is
  the previous think node's child (depth + 1). A sub-agent's nodes start again at depth
  0 under the node that was current when it started. Tool calls before any LLM span
  hang from the run (parent ``None``, depth 0).
- **ordinal**: 1 + the earlier calls on the path with the same key (the tool name and the
  canonical text of its arguments, or the SHA-256 of both that ingest stores: never the
  32-bit signature) that count: counted by
  :class:`treellm.loop.PathSignatures`, the runtime's own rule (a state change restarts
  the counts of the calls that read what it wrote; ``docs/architecture.md``);
  ``earlier`` names them (span ids), and ``repeat_chain`` the first of them (the chain of
  identical calls that count: ordinals 1, 2, ... on the path, until a restart).
  Framework-internal calls have no key and no ordinal.

Input order does not matter: a run's spans that arrived before its root are placed
again when the root arrives (the caller recomputes whole traces).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Literal, overload

from treellm.loop import CallKey, Paths, PathSignatures
from treellm.telemetry.conventions import INVOCATION_ROLES

__all__ = ["EarlierIds", "Placement", "SpanFacts", "place_trace", "place_traces"]

NodeKind = Literal["think", "tool"]


@dataclass(frozen=True, slots=True)
class SpanFacts:
    """One span of a trace as the placement needs it. ``role`` is the conventions' role;
    ``call_key`` is the key of a counted tool call; ``reads`` and ``writes`` its targets
    (``treellm.engine.repeats.call_targets``; None: cannot be known)."""

    trace_id: str
    span_id: str
    parent_id: str | None
    start_ns: int
    end_ns: int
    role: str
    call_key: CallKey | None = None
    agent_name: str | None = None
    flagged_orphan: bool = False
    changes_state: bool = False
    """A successful call that changed state (the tool's state-change rule): it restarts the
    counts of the other call keys on its path that read what it wrote; its own key keeps counting."""
    reads: Paths = None
    writes: Paths = None


class EarlierIds(Sequence[str]):
    """The span ids of a call's earlier identical calls that count, oldest first: the ids
    ``start:stop`` of the list of its key's calls on the path. The list is shared by every call
    of the key and only appended to, so a run that repeats one call k times holds k ids, not the
    k²/2 of a tuple per call; equal to any sequence of the same ids (a tuple among them)."""

    __slots__ = ("_ids", "_start", "_stop")

    def __init__(self, ids: list[str], start: int, stop: int) -> None:
        self._ids, self._start, self._stop = ids, start, stop

    def __len__(self) -> int:
        return self._stop - self._start

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...
    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        return tuple(self)[index]

    def __iter__(self) -> Iterator[str]:
        return islice(self._ids, self._start, self._stop)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))


@dataclass(frozen=True, slots=True)
class Placement:
    trace_id: str
    span_id: str
    run_id: str | None
    """``None``: the span's trace holds no run (no invocation and no call)."""
    node_kind: NodeKind | None
    node_parent_id: str | None
    depth: int | None
    ordinal: int | None
    earlier: Sequence[str]
    """The span ids of the earlier identical calls that count (an :class:`EarlierIds`, or ``()``)."""
    orphan: bool
    anchor: str | None = None
    """For a span that is not a node: the think node current on its run when it started
    (a caught call's event on it hangs there)."""

    @property
    def repeat_chain(self) -> str | None:
        """The first call of the counted call's chain of identical calls (its oldest earlier one
        that counts, else itself; None for a span that is no counted call). On a path of another
        framework (linear: no branches) the earlier calls that count are exactly the chain's calls
        of lower ordinal, ordinals 1 to ``ordinal - 1``: a query can judge a repeat against them
        without the list (``store.views.REPEAT_OUTCOMES``)."""
        if self.ordinal is None:
            return None
        return self.earlier[0] if self.earlier else self.span_id


def _chain(span: SpanFacts, by_id: dict[str, SpanFacts]) -> list[SpanFacts]:
    """The span and its ancestors, nearest first, up to a root or a missing parent."""
    out = [span]
    seen = {span.span_id}
    node = span
    while node.parent_id is not None and not node.flagged_orphan:
        parent = by_id.get(node.parent_id)
        if parent is None or parent.span_id in seen:
            break
        out.append(parent)
        seen.add(parent.span_id)
        node = parent
    return out


def _anchored(chain: Sequence[SpanFacts]) -> bool:
    top = chain[-1]
    return top.parent_id is None and not top.flagged_orphan


def _order(span: SpanFacts) -> tuple[int, int, str]:
    return (span.start_ns, -span.end_ns, span.span_id)


_INVOKES: frozenset[str] = INVOCATION_ROLES
_CALLS = frozenset({"llm", "tool"})


def _run_roots(
    spans: Sequence[SpanFacts], chains: dict[str, list[SpanFacts]], orphan: dict[str, bool]
) -> list[SpanFacts]:
    """The outermost invocations that hold a model or tool call (else every outermost one);
    floating ones (a missing parent above them) only when no anchored one exists, and then
    only the first; with no invocation, the trace root when the trace holds a call, else none."""
    outermost = [s for s in spans if s.role in _INVOKES and all(a.role not in _INVOKES for a in chains[s.span_id][1:])]
    if len(outermost) > 1:
        working = {a.span_id for s in spans if s.role in _CALLS for a in chains[s.span_id]}
        outermost = [s for s in outermost if s.span_id in working] or outermost
    anchored = sorted((s for s in outermost if not orphan[s.span_id]), key=_order)
    roots = anchored or sorted(outermost, key=_order)[:1]
    if roots:
        return roots
    if not any(s.role in _CALLS for s in spans):
        return []
    tops = {chains[s.span_id][-1].span_id: chains[s.span_id][-1] for s in spans}
    true_tops = sorted((t for t in tops.values() if not orphan[t.span_id]), key=_order)
    return true_tops[:1] or sorted(tops.values(), key=_order)[:1]


def _scope_of(chain: Sequence[SpanFacts], root: SpanFacts) -> str:
    """The span that starts the path of the first span of ``chain``: the run root or a sub-agent."""
    for index, ancestor in enumerate(chain):
        if ancestor.span_id == root.span_id:
            return root.span_id
        if ancestor.role == "agent" and ancestor.agent_name:
            enclosing = next((a for a in chain[index + 1 :] if a.role == "agent"), None)
            if enclosing is None or (enclosing.agent_name or "") != ancestor.agent_name:
                return ancestor.span_id
    return root.span_id


_Node = tuple[NodeKind, str | None, int, int | None, Sequence[str]]


def _place_path(members: Sequence[SpanFacts], base_parent: str | None) -> dict[str, _Node]:
    """Think and tool nodes of one path in time order (see the module docstring)."""
    placed: dict[str, _Node] = {}
    think: str | None = None
    depth = 0
    # No call on the path changes state: no count restarts, a call's count is the number of the
    # earlier calls of its key (what PathSignatures would say, without its persistent map).
    path = PathSignatures.empty() if any(span.changes_state for span in members) else None
    calls: dict[CallKey, list[str]] = {}  # each key's span ids on the path, in order (what ``path`` holds)
    for span in sorted(members, key=_order):
        parent = think if think is not None else base_parent
        if span.role == "llm":
            depth = 0 if think is None else depth + 1
            placed[span.span_id] = ("think", parent, depth, None, ())
            think = span.span_id
            continue
        ordinal: int | None = None
        before: Sequence[str] = ()
        if span.call_key is not None:
            # path.earlier(key) is the last path.count(key) of the key's ids: a view, never a copy
            ids = calls.setdefault(span.call_key, [])
            count = len(ids) if path is None else path.count(span.call_key)
            before = EarlierIds(ids, len(ids) - count, len(ids)) if count else ()
            ordinal = count + 1
            if path is not None:
                path = path.extend(
                    span.call_key, span.span_id, mutates=span.changes_state, reads=span.reads, writes=span.writes
                )
            ids.append(span.span_id)
        placed[span.span_id] = ("tool", parent, depth if think is not None else 0, ordinal, before)
    return placed


def place_trace(spans: Sequence[SpanFacts]) -> list[Placement]:
    """The run, node and ordinal of every span of one trace (see the module docstring)."""
    if not spans:
        return []
    by_id = {s.span_id: s for s in spans}
    chains = {s.span_id: _chain(s, by_id) for s in spans}
    orphan = {s.span_id: not _anchored(chains[s.span_id]) for s in spans}
    roots = _run_roots(spans, chains, orphan)
    if not roots:  # no invocation and no call: placed nowhere
        return [Placement(s.trace_id, s.span_id, None, None, None, None, None, (), False, None) for s in spans]
    root_ids = {r.span_id for r in roots}

    def run_of(span: SpanFacts) -> SpanFacts:
        for ancestor in chains[span.span_id]:
            if ancestor.span_id in root_ids:
                return ancestor
        return next((r for r in roots if r.start_ns <= span.start_ns <= r.end_ns), roots[0])

    run = {s.span_id: run_of(s) for s in spans}
    paths: dict[str, list[SpanFacts]] = {}
    for span in spans:
        if span.role in ("llm", "tool") and span.span_id not in root_ids:
            paths.setdefault(_scope_of(chains[span.span_id], run[span.span_id]), []).append(span)

    placed: dict[str, _Node] = {}
    ordered = sorted(paths, key=lambda sid: _order(by_id[sid]))
    for scope in ordered:
        base_parent = None
        if scope not in root_ids:  # a sub-agent hangs from the node current when it started
            started = by_id[scope].start_ns
            current = [s for s in placed if by_id[s].start_ns <= started]
            base_parent = max(current, key=lambda s: _order(by_id[s])) if current else None
        placed.update(_place_path(paths[scope], base_parent))

    # the think nodes of each run in time order, for the anchors of the spans that are not nodes
    thinks: dict[str, tuple[list[int], list[str]]] = {}
    for think in sorted((by_id[s] for s, node in placed.items() if node[0] == "think"), key=_order):
        starts, ids = thinks.setdefault(run[think.span_id].span_id, ([], []))
        starts.append(think.start_ns)
        ids.append(think.span_id)

    def anchor_of(span: SpanFacts) -> str | None:
        """The last think node of the span's run (in time order) that started no later than it."""
        starts, ids = thinks.get(run[span.span_id].span_id, ([], []))
        index = bisect_right(starts, span.start_ns)
        return ids[index - 1] if index else None

    out: list[Placement] = []
    append = out.append
    for span in spans:
        sid = span.span_id
        node = placed.get(sid)
        orphaned = orphan[sid] and sid not in root_ids
        run_id = f"{span.trace_id}:{run[sid].span_id}"
        if node is None:
            append(Placement(span.trace_id, sid, run_id, None, None, None, None, (), orphaned, anchor_of(span)))
        else:
            kind, parent, depth, ordinal, earlier = node
            append(Placement(span.trace_id, sid, run_id, kind, parent, depth, ordinal, earlier, orphaned, None))
    return out


def place_traces(spans: Iterable[SpanFacts]) -> list[Placement]:
    """:func:`place_trace` for every trace among ``spans``."""
    traces: dict[str, list[SpanFacts]] = {}
    for span in spans:
        traces.setdefault(span.trace_id, []).append(span)
    out: list[Placement] = []
    for trace in traces.values():
        out.extend(place_trace(trace))
    return out
