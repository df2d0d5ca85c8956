"""The views, written once: each view's columns and what it reads, from which the DuckDB store's
views are generated, and through them ClickHouse's tables.

Contract:

- :data:`VIEWS` lists ``nodes``, ``tool_calls``, ``loop_events``, ``runs``, ``run_shapes``,
  ``repeat_outcomes``, ``repeat_between``, ``call_turns`` and ``call_signatures`` in creation
  order (each reads only the ones before it). Each view's rows of a trace depend on that trace's
  spans alone (a run lies in one trace). A :class:`View` is its columns, in order, and the rest
  of its query: what it reads (``source``: ``FROM ... WHERE ...``) and the common table
  expressions before it (``head``). A :class:`Column` is its name and its expression.
- :func:`duckdb_views` is the DDL of the DuckDB store (``schema.VIEWS``: ``CREATE OR REPLACE VIEW``,
  or ``TEMP`` views for a reader of a store that holds another version).
- ClickHouse runs no copy of them: ``treellm derive`` computes the views' rows of each trace in
  DuckDB and writes them into one table per view (``clickhouse_views.py``), whose columns and
  types it reads from these views. A column added to a view is one :class:`Column` here.
- Pure: text in, text out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from treellm.derive.near import PAIR_CANDIDATE_COLUMNS
from treellm.derive.transform import result_sql

__all__ = [
    "CALLS_SQL",
    "INTERNAL_CALLS_SQL",
    "NEAR_CANDIDATES_SQL",
    "REPEAT_CALLS_SQL",
    "REPEAT_NODES_SQL",
    "VIEWS",
    "Column",
    "View",
    "duckdb_views",
]

_QUOTED: Final = frozenset({"limit"})
"""Column names that are keywords: quoted."""


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    expression: str

    def text(self) -> str:
        name = f'"{self.name}"' if self.name in _QUOTED else self.name
        return f"{self.expression} AS {name}"


@dataclass(frozen=True, slots=True)
class View:
    name: str
    columns: tuple[Column, ...]
    source: str
    head: str = ""

    def query(self) -> str:
        """The view's SELECT."""
        columns = ",\n    ".join(column.text() for column in self.columns)
        return f"{self.head}SELECT\n    {columns}\n{self.source}".strip()


def _same(*names: str, alias: str = "s") -> tuple[Column, ...]:
    """Columns read as they are from the relation ``alias``."""
    return tuple(Column(name, f"{alias}.{name}") for name in names)


def _event(name: str, key: str) -> Column:
    """An attribute of a ``loop:detected`` event: NULL when the event does not carry it."""
    return Column(name, f"e.attributes['{key}']")


def _event_integer(name: str, key: str) -> Column:
    """An integer attribute of a ``loop:detected`` event: NULL when missing or not an integer."""
    return Column(name, f"TRY_CAST(e.attributes['{key}'] AS INTEGER)")


_STATUS_FAILED: Final = "s.status_code = 2 OR s.node_status = 'failed'"
_TOOL_SPANS: Final = """FROM spans s
WHERE s.tool_name IS NOT NULL AND (s.operation = 'execute_tool' OR s.node_kind = 'tool')"""

NODES: Final = View(
    "nodes",
    (
        *_same("run_id", "trace_id", "span_id", "parent_span_id"),
        Column("node_id", "coalesce(s.node_id, s.span_id)"),
        Column(
            "kind",
            "coalesce(s.node_kind, CASE s.operation WHEN 'execute_tool' THEN 'tool' WHEN 'chat' THEN 'think' END)",
        ),
        Column("depth", "s.node_depth"),
        Column("parent_id", "s.node_parent_id"),
        Column(
            "status",
            "coalesce(s.node_status, CASE WHEN s.status_code = 2 THEN 'failed' ELSE 'completed' END)",
        ),
        Column("tool", "s.tool_name"),
        *_same("signature", "ordinal"),
        Column("limit", "s.limit_n"),
        *_same("limit_source", "result_hash", "attempts", "shadow_caught", "skill_stack", "start_ns", "end_ns"),
        *_same("service_name", "agent_name", "model", "day", "source"),
    ),
    """FROM spans s
WHERE s.node_kind IS NOT NULL OR s.operation IN ('execute_tool', 'chat')""",
)
"""treellm's node spans and other frameworks' tool and chat spans."""

TOOL_CALLS: Final = View(
    "tool_calls",
    (
        *_same("run_id", "trace_id", "span_id"),
        Column("node_id", "coalesce(s.node_id, s.span_id)"),
        Column("parent_id", "s.node_parent_id"),
        Column("depth", "s.node_depth"),
        Column("tool", "s.tool_name"),
        Column("call_id", "s.tool_call_id"),
        *_same("signature", "ordinal"),
        Column("limit", "s.limit_n"),
        *_same("limit_source", "result_hash", "attempts"),
        Column("shadow_caught", "coalesce(s.shadow_caught, false)"),
        Column(
            "status",
            f"CASE WHEN {_STATUS_FAILED} THEN 'failed' ELSE 'completed' END",
        ),
        Column("arguments", "s.arguments"),
        Column("result", result_sql("s")),
        *_same("start_ns", "end_ns"),
        Column("duration_ns", "(s.end_ns - s.start_ns)"),
        *_same("service_name", "agent_name", "model", "skill_stack", "day", "source", "earlier_node_ids"),
        Column("internal", "coalesce(s.internal, false)"),
        Column("convention", "s.convention"),
        Column("orphan", "s.orphan_parent IS NOT NULL"),
        Column("path_position", "row_number() OVER (PARTITION BY s.run_id ORDER BY s.start_ns, s.span_id)"),
        *_same("scope_name", "repeat_chain"),
    ),
    _TOOL_SPANS,
)
"""The executed calls, in path order."""

LOOP_EVENTS: Final = View(
    "loop_events",
    (
        Column("run_id", "s.run_id"),
        Column("trace_id", "e.trace_id"),
        Column("span_id", "e.span_id"),
        Column(
            "node_id",
            "coalesce(e.attributes['treellm.node.id'], s.node_id, "
            "CASE WHEN s.node_kind IS NOT NULL THEN s.span_id END, s.anchor_node_id)",
        ),
        Column("time_ns", "e.time_ns"),
        _event("tool", "treellm.loop.tool"),
        _event("signature", "treellm.loop.signature"),
        _event("call_id", "treellm.loop.call_id"),
        Column(
            "count",
            "TRY_CAST(e.attributes['treellm.loop.count'] AS INTEGER)",
        ),
        Column(
            "limit",
            "TRY_CAST(e.attributes['treellm.loop.limit'] AS INTEGER)",
        ),
        _event("limit_source", "treellm.loop.limit_source"),
        _event("action", "treellm.loop.action"),
        Column(
            "shadow",
            "coalesce(TRY_CAST(e.attributes['treellm.loop.shadow'] AS BOOLEAN), false)",
        ),
        _event("arguments", "treellm.loop.arguments"),
        _event("earlier_node_ids_raw", "treellm.loop.earlier_node_ids"),
        _event("earlier_span_ids_raw", "treellm.loop.earlier_span_ids"),
        *_same("service_name", "agent_name", "model", "day", "skill_stack"),
    ),
    """FROM span_events e
JOIN spans s USING (trace_id, span_id)
WHERE e.name = 'loop:detected'""",
)
"""The caught calls: one row per ``loop:detected`` event."""

RUNS: Final = View(
    "runs",
    (
        *_same("run_id", "trace_id", "span_id", alias="r"),
        Column("agent", "coalesce(r.agent_name, r.name)"),
        Column("service", "r.service_name"),
        Column("model", "coalesce(r.model, c.node_model)"),
        *_same("start_ns", "end_ns", alias="r"),
        Column("duration_ns", "(r.end_ns - r.start_ns)"),
        Column("day", "r.day"),
        Column("think_nodes", "coalesce(c.think_nodes, 0)"),
        Column("tool_nodes", "coalesce(c.tool_nodes, 0)"),
        Column("collapse_nodes", "coalesce(c.collapse_nodes, 0)"),
        Column("nodes", "coalesce(c.think_nodes, 0) + coalesce(c.tool_nodes, 0) + coalesce(c.collapse_nodes, 0)"),
        Column("max_depth", "coalesce(c.max_depth, 0)"),
        Column("pruned_calls", "coalesce(p.pruned_calls, 0)"),
        Column("shadow_catches", "coalesce(p.shadow_catches, 0)"),
        Column(
            "outcome",
            "coalesce(r.outcome, CASE WHEN r.status_code = 2 THEN 'failed' ELSE 'completed' END)",
        ),
        Column("guard", "coalesce(r.attributes['treellm.run.guard'] = 'true', false)"),
        Column("source", "r.source"),
    ),
    """FROM run_spans r
LEFT JOIN node_counts c USING (run_id)
LEFT JOIN prunes p USING (run_id)""",
    head="""WITH run_spans AS (
    SELECT * FROM spans
    WHERE run_id IS NOT NULL AND skill_name IS NULL
      AND (span_id = split_part(run_id, ':', 2)
           OR (convention IS NULL AND operation = 'invoke_agent' AND node_id IS NULL))
),
node_counts AS (
    SELECT run_id,
        count(*) FILTER (WHERE kind = 'think') AS think_nodes,
        count(*) FILTER (WHERE kind = 'tool') AS tool_nodes,
        count(*) FILTER (WHERE kind = 'collapse') AS collapse_nodes,
        max(depth) AS max_depth,
        any_value(model) FILTER (WHERE model IS NOT NULL) AS node_model
    FROM nodes GROUP BY run_id
),
prunes AS (
    SELECT run_id,
        count(*) FILTER (WHERE NOT shadow) AS pruned_calls,
        count(*) FILTER (WHERE shadow) AS shadow_catches
    FROM loop_events GROUP BY run_id
)
""",
)
"""One row per run: treellm's root ``invoke_agent`` span, or for other frameworks the outermost
agent span, else the trace root (``run_id`` says which)."""

_IN_A_RUN = "run_id IS NOT NULL"
"""The calls of ``tool_calls`` that the analysis reads: those in a run (ingest reports the rest as
placed nowhere)."""

CALLS_SQL: Final = f"""
SELECT run_id, node_id, parent_id, tool, signature, ordinal, "limit", limit_source, result_hash, shadow_caught,
       status, arguments, result, start_ns, end_ns, duration_ns, earlier_node_ids, trace_id, span_id, call_id,
       convention, scope_name, repeat_chain
FROM tool_calls
WHERE {_IN_A_RUN} AND NOT internal
"""
"""The executed calls the analysis counts: ``tool_calls`` without framework-internal tools
(smolagents' ``final_answer``...) and calls outside any run. ``path_position`` is not selected,
so its window is not computed."""

INTERNAL_CALLS_SQL: Final = f"SELECT run_id, tool FROM tool_calls WHERE {_IN_A_RUN} AND internal"
"""The calls in runs that :data:`CALLS_SQL` leaves out: those of framework-internal tools."""

_RUNS_WITH: Final = f"""
WITH calls AS ({CALLS_SQL}),
runs_with AS (SELECT DISTINCT run_id FROM calls c WHERE {{where}} AND c.signature IS NOT NULL
              GROUP BY run_id, tool, signature HAVING count(*) >= 2)
"""
REPEAT_CALLS_SQL: Final = (
    _RUNS_WITH
    + """
SELECT c.trace_id, c.span_id, c.run_id, c.node_id, c.parent_id, c.tool, c.signature, c.ordinal, c.status,
       c.result_hash, c.arguments, c.call_id, CASE WHEN c.arguments LIKE '%"ls%' THEN c.result END AS listing
FROM calls c
WHERE c.run_id IN (SELECT run_id FROM runs_with)
ORDER BY c.run_id, c.start_ns, c.span_id
"""
)
"""Every executed call of the runs whose calls that ``{where}`` keeps (alias ``c``) hold an
identical signature twice, in run and time order: what the identical-repeat judgement reads
(:func:`treellm.derive.repeats.judge_runs`); ``listing`` is the result of a call whose argument
text holds a value that starts with ``ls``, every call that :func:`treellm.shell.lists_names` can
call a listing among them (the judgement reads which names a listing shows)."""
REPEAT_NODES_SQL: Final = (
    _RUNS_WITH
    + """
SELECT run_id, node_id, parent_id FROM nodes WHERE run_id IN (SELECT run_id FROM runs_with)
"""
)
"""The think nodes of the same runs, chosen again in SQL by the same ``{where}`` (never sent back
as one parameter per run: tens of thousands of them overflow a query's size)."""
NEAR_CANDIDATES_SQL: Final = f"""
SELECT {", ".join(PAIR_CANDIDATE_COLUMNS)}
FROM (
    SELECT c.run_id, c.tool, c.signature, c.arguments, c.result_hash, c.node_id, c.parent_id, c.call_id, c.span_id,
           c.trace_id, c.start_ns, row_number() OVER w AS nth,
           lag(c.signature) OVER w AS earlier_signature, lag(c.arguments) OVER w AS earlier_arguments,
           lag(c.result_hash) OVER w AS earlier_result_hash, lag(c.node_id) OVER w AS earlier_node_id,
           lag(c.parent_id) OVER w AS earlier_parent_id, lag(c.call_id) OVER w AS earlier_call_id,
           lag(c.span_id) OVER w AS earlier_span_id
    FROM ({CALLS_SQL}) c
    WHERE {{where}} AND c.arguments IS NOT NULL
    WINDOW w AS (PARTITION BY c.run_id, c.tool ORDER BY c.start_ns, c.span_id)
) p
WHERE nth > 1 AND earlier_signature IS DISTINCT FROM signature AND NOT coalesce(parent_id = earlier_parent_id, false)
ORDER BY run_id, tool, start_ns, span_id"""
"""The pairs the near-repeat rule judges (:func:`treellm.derive.near.near_pairs`), by run, tool and
time: each call with captured arguments that ``{where}`` keeps (alias ``c``) and the call before it
of its tool in its run, when the two have different signatures (an identical call is no near
repeat) and do not share a turn (one turn's calls are parallel, not repeats). Paired here, so only
those pairs cross into Python; ``nth``, not a NULL ``lag``, tells a run's first call of a tool (an
engine may give a type's default there)."""

RUN_SHAPES: Final = View(
    "run_shapes",
    (
        *_same("run_id", "trace_id", alias="r"),
        Column("max_breadth", "coalesce(b.max_breadth, 0)"),
        Column("breadth_per_depth", "coalesce(b.breadth_per_depth, [])"),
        Column("branching_factor", "coalesce(f.branching_factor, 0)"),
        Column("leaves", "coalesce(l.leaves, 0)"),
    ),
    """FROM runs r
LEFT JOIN breadth b USING (run_id)
LEFT JOIN fan f USING (run_id)
LEFT JOIN leaves l USING (run_id)""",
    head="""WITH n AS (SELECT run_id, node_id, parent_id, kind, depth FROM nodes WHERE run_id IS NOT NULL),
children AS (SELECT run_id, parent_id, count(*) AS k FROM n WHERE parent_id IS NOT NULL GROUP BY ALL),
leaves AS (
    SELECT n.run_id, count(*) AS leaves FROM n
    LEFT JOIN children c ON c.run_id = n.run_id AND c.parent_id = n.node_id
    WHERE c.parent_id IS NULL GROUP BY n.run_id
),
breadth AS (
    SELECT run_id, list(k ORDER BY depth) AS breadth_per_depth, max(k) AS max_breadth
    FROM (SELECT run_id, depth, count(*) AS k FROM n WHERE kind = 'think' AND depth IS NOT NULL GROUP BY ALL)
    GROUP BY run_id
),
fan AS (SELECT run_id, avg(k) AS branching_factor FROM children GROUP BY run_id)
""",
)
"""Per run, the shape of its tree: the most ThinkNodes at one depth and the count at each depth,
the mean children of a node with children, the leaves."""

_JUDGED: Final = """run_id, trace_id, node_id, tool, ordinal, status, shadow_caught, duration_ns, result_chars,
       start_ns, "limit", signature, arguments, all_differ, missing_result, last_status, last_earlier, has_earlier"""

REPEAT_OUTCOMES: Final = View(
    "repeat_outcomes",
    (
        *_same(
            "run_id",
            "trace_id",
            "node_id",
            "tool",
            "ordinal",
            "status",
            "shadow_caught",
            "duration_ns",
            "result_chars",
            "start_ns",
            "limit",
            "signature",
            "arguments",
            "all_differ",
            "missing_result",
            "last_status",
            "last_earlier",
            "has_earlier",
            alias="j",
        ),
        Column(
            "outcome",
            """CASE WHEN j.status = 'failed' THEN 'wasted'
            WHEN j.last_status = 'failed' THEN 'productive'
            WHEN j.missing_result THEN 'unknown'
            WHEN j.all_differ THEN 'productive'
            ELSE 'wasted' END""",
        ),
        Column(
            "productive",
            "j.status = 'completed' AND (j.last_status = 'failed' OR (j.all_differ AND NOT j.missing_result))",
        ),
    ),
    "FROM judged j",
    head=f"""WITH calls AS ({CALLS_SQL}),
reps AS (
    SELECT c.*, from_json(coalesce(c.earlier_node_ids, '[]'), '["VARCHAR"]') AS earlier
    FROM calls c WHERE c.ordinal >= 2 AND c.repeat_chain IS NULL
),
pairs AS (
    SELECT r.run_id, r.node_id, e.result_hash AS e_hash, e.status AS e_status, e.node_id AS e_node,
           list_position(r.earlier, u.eid) AS pos
    FROM reps r CROSS JOIN unnest(r.earlier) AS u(eid)
    JOIN calls e ON e.run_id = r.run_id AND e.node_id = u.eid
),
listed AS (
    SELECT r.run_id, any_value(r.trace_id) AS trace_id, r.node_id, any_value(r.tool) AS tool,
           any_value(r.ordinal) AS ordinal, any_value(r.status) AS status,
           any_value(r.shadow_caught) AS shadow_caught, any_value(r.duration_ns) AS duration_ns,
           any_value(length(r.result)) AS result_chars, any_value(r.start_ns) AS start_ns,
           any_value(r."limit") AS "limit", any_value(r.signature) AS signature,
           any_value(r.arguments) AS arguments,
           coalesce(bool_and(p.e_hash IS DISTINCT FROM r.result_hash), true) AS all_differ,
           any_value(r.result_hash) IS NULL OR coalesce(bool_or(p.e_hash IS NULL), false) AS missing_result,
           arg_max(p.e_status, p.pos) AS last_status,
           arg_max(p.e_node, p.pos) AS last_earlier,
           arg_max(p.pos, p.pos) IS NOT NULL AS has_earlier
    FROM reps r LEFT JOIN pairs p USING (run_id, node_id)
    GROUP BY r.run_id, r.node_id
),
chains AS (
    SELECT c.run_id, c.node_id, c.repeat_chain, c.ordinal, c.status, c.result_hash,
           min(CASE WHEN c.result_hash IS NULL THEN c.ordinal END)
               OVER (PARTITION BY c.run_id, c.repeat_chain) AS first_missing,
           min(c.ordinal) OVER (PARTITION BY c.run_id, c.repeat_chain, c.result_hash) AS first_same
    FROM calls c
    WHERE c.repeat_chain IS NOT NULL
      AND c.run_id IN (SELECT run_id FROM calls WHERE ordinal >= 2 AND repeat_chain IS NOT NULL)
),
chained AS (
    SELECT r.run_id, r.trace_id, r.node_id, r.tool, r.ordinal, r.status, r.shadow_caught, r.duration_ns,
           length(r.result) AS result_chars, r.start_ns, r."limit", r.signature, r.arguments,
           k.first_same = r.ordinal AS all_differ,
           r.result_hash IS NULL OR coalesce(k.first_missing < r.ordinal, false) AS missing_result,
           e.status AS last_status, e.node_id AS last_earlier, e.node_id IS NOT NULL AS has_earlier
    FROM calls r JOIN chains k ON k.run_id = r.run_id AND k.node_id = r.node_id
    LEFT JOIN chains e ON e.run_id = r.run_id AND e.repeat_chain = r.repeat_chain AND e.ordinal = r.ordinal - 1
    WHERE r.ordinal >= 2
),
judged AS (
    SELECT {_JUDGED} FROM listed
    UNION ALL
    SELECT {_JUDGED} FROM chained
)
""",
)
"""Every executed repeat (ordinal >= 2) with its outcome, judged against the earlier identical
calls that its count counted: for treellm's own calls those its ``earlier_node_ids`` name (its
path in the tree, branches apart); for another framework's calls the calls of its
``repeat_chain`` of lower ordinal (their paths have no branches: ``derive/trees.py``), by window
functions, so a loop of k identical calls costs k rows, never k²/2 pairs. A repeat is wasted when
it failed, or repeated an earlier result without a failure before it; productive when it
followed a failure or brought a result none of its earlier calls had; unknown without results."""

REPEAT_BETWEEN: Final = View(
    "repeat_between",
    (
        *_same("run_id", "trace_id", "node_id", "tool", "outcome", "productive", alias="k"),
        Column("tools", "list(DISTINCT c.tool ORDER BY c.tool)"),
    ),
    """FROM repeat_outcomes k
JOIN calls e ON e.run_id = k.run_id AND e.node_id = k.last_earlier
JOIN calls c ON c.run_id = k.run_id AND c.start_ns > e.start_ns AND c.start_ns < k.start_ns
            AND c.status = 'completed' AND c.signature IS DISTINCT FROM k.signature
GROUP BY k.run_id, k.trace_id, k.node_id, k.tool, k.outcome, k.productive""",
    head=f"WITH calls AS ({CALLS_SQL})\n",
)
"""Per repeat with an earlier twin, the tools whose other calls succeeded between the twin and
the repeat (its own tool included, when that tool made other calls: a tool that writes too),
with the repeat's outcome; a repeat with none between has no row. The tuning weighs these rows
alone (``analysis.tuning``), so ClickHouse keeps them per trace and joins nothing at read time."""

CALL_TURNS: Final = View(
    "call_turns",
    (
        *_same("run_id", "trace_id", alias="c"),
        Column("turn", "coalesce(c.parent_id, c.node_id)"),
        Column("first_tool", "min(c.tool)"),
        Column("last_tool", "max(c.tool)"),
        Column("min_ordinal", "min(coalesce(c.ordinal, 1))"),
        Column("calls", "count(*)"),
    ),
    "FROM calls c GROUP BY c.run_id, c.trace_id, coalesce(c.parent_id, c.node_id)",
    head=f"WITH calls AS ({CALLS_SQL})\n",
)
"""Per turn of a run (the ThinkNode that asked; a call alone when unknown): its smallest and largest
tool name (one tool when they are equal: a count of distinct tools ignores a call naming none too)
and its smallest ordinal (a missing one counts as 1). The tuning asks which turns a limit ends
(``analysis.tuning``); kept per trace by derive, so ClickHouse reads these rows, not every call."""

CALL_SIGNATURES: Final = View(
    "call_signatures",
    (
        *_same("run_id", "trace_id", "tool", "signature", alias="c"),
        Column("calls", "count(*)"),
        Column(
            "afresh",
            "count(*) FILTER (WHERE c.ordinal = 1) - CASE WHEN "
            "min(struct_pack(s := c.start_ns, i := c.span_id, one := coalesce(c.ordinal = 1, false))).one "
            "THEN 1 ELSE 0 END",
        ),
    ),
    "FROM calls c WHERE c.signature IS NOT NULL GROUP BY c.run_id, c.trace_id, c.tool, c.signature",
    head=f"WITH calls AS ({CALLS_SQL})\n",
)
"""Per run and signature (a signature names its tool): its calls, and how many of them a state
change made count afresh: ordinal 1, though not the run's first call of the signature (by start,
then span id). Re-runs after a write, not loops (``analysis.tuning``)."""

VIEWS: Final = (
    NODES, TOOL_CALLS, LOOP_EVENTS, RUNS, RUN_SHAPES, REPEAT_OUTCOMES, REPEAT_BETWEEN, CALL_TURNS, CALL_SIGNATURES
)  # fmt: skip


def duckdb_views(*, temporary: bool = False) -> str:
    """The DDL of every view in the DuckDB store (``TEMP`` views: a reader's own, over a store
    that holds another version of them)."""
    verb = "CREATE OR REPLACE TEMP VIEW" if temporary else "CREATE OR REPLACE VIEW"
    return "\n\n".join(f"{verb} {view.name} AS\n{view.query()};" for view in VIEWS) + "\n"
