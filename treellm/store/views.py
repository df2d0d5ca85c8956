"""The views, written once: each view's columns and what it reads, from which the DuckDB store's
and ClickHouse's SQL are generated.

Contract:

- :data:`VIEWS` lists ``nodes``, ``tool_calls``, ``loop_events`` and ``runs`` in creation order
  (each reads only the ones before it). A :class:`View` is its columns, in order, and the rest
  of its query: what it reads (``source``: ``FROM ... WHERE ...``) and the common table
  expressions before it (``head``). A :class:`Column` is its name and its expression, with the
  ClickHouse expression beside it where the dialects differ (``CASE`` against ``multiIf``, a
  map lookup that reads NULL for a missing key, the event arrays of a span row).
- ``{db}`` in a text is where the views' own database goes: nothing in DuckDB, ``<database>.``
  in ClickHouse, where every name is qualified.
- :func:`duckdb_views` is the DDL of the DuckDB store (``schema.VIEWS``: ``CREATE OR REPLACE VIEW``,
  or ``TEMP`` views for a reader of a store that holds another version);
  :func:`clickhouse_query` is the SELECT of one view in ClickHouse (``clickhouse_views.py``
  wraps it in its DDL). A column added to a view is one :class:`Column` here, for both.
- Pure: text in, text out. ``tests/test_clickhouse*.py`` check the two dialects give equal rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["VIEWS", "Column", "View", "clickhouse_query", "duckdb_views"]

Dialect = Literal["duckdb", "clickhouse"]
_QUOTED: Final = frozenset({"limit"})
"""Column names that are keywords: quoted as the dialect quotes names."""


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    expression: str
    clickhouse: str | None = None
    """ClickHouse's expression when it is not :attr:`expression`."""

    def text(self, dialect: Dialect) -> str:
        expression = self.clickhouse if dialect == "clickhouse" and self.clickhouse is not None else self.expression
        quote = "`" if dialect == "clickhouse" else '"'
        name = f"{quote}{self.name}{quote}" if self.name in _QUOTED else self.name
        return f"{expression} AS {name}"


@dataclass(frozen=True, slots=True)
class View:
    name: str
    columns: tuple[Column, ...]
    source: str
    clickhouse_source: str | None = None
    head: str = ""
    clickhouse_head: str | None = None

    def query(self, dialect: Dialect, db: str) -> str:
        """The view's SELECT in ``dialect``, its own views read from ``db`` (``""`` or ``"name."``)."""
        clickhouse = dialect == "clickhouse"
        head = self.clickhouse_head if clickhouse and self.clickhouse_head is not None else self.head
        source = self.clickhouse_source if clickhouse and self.clickhouse_source is not None else self.source
        columns = ",\n    ".join(column.text(dialect) for column in self.columns)
        return f"{head.format(db=db)}SELECT\n    {columns}\n{source.format(db=db)}".strip()


def _same(*names: str, alias: str = "s") -> tuple[Column, ...]:
    """Columns read as they are from the relation ``alias``."""
    return tuple(Column(name, f"{alias}.{name}") for name in names)


def _event(name: str, key: str) -> Column:
    """An attribute of a ``loop:detected`` event: NULL when the event does not carry it."""
    return Column(name, f"e.attributes['{key}']", f"if(mapContains(ea, '{key}'), ea['{key}'], NULL)")


def _event_integer(name: str, key: str) -> Column:
    """An integer attribute of a ``loop:detected`` event: NULL when missing or not an integer."""
    return Column(name, f"TRY_CAST(e.attributes['{key}'] AS INTEGER)", f"toInt32OrNull(ea['{key}'])")


_STATUS_FAILED: Final = "s.status_code = 2 OR s.node_status = 'failed'"
_TOOL_SPANS: Final = """FROM {db}spans s
WHERE s.tool_name IS NOT NULL AND (s.operation = 'execute_tool' OR s.node_kind = 'tool')"""

NODES: Final = View(
    "nodes",
    (
        *_same("run_id", "trace_id", "span_id", "parent_span_id"),
        Column("node_id", "coalesce(s.node_id, s.span_id)"),
        Column(
            "kind",
            "coalesce(s.node_kind, CASE s.operation WHEN 'execute_tool' THEN 'tool' WHEN 'chat' THEN 'think' END)",
            "coalesce(s.node_kind, multiIf(s.operation = 'execute_tool', 'tool', s.operation = 'chat', 'think', NULL))",
        ),
        Column("depth", "s.node_depth"),
        Column("parent_id", "s.node_parent_id"),
        Column(
            "status",
            "coalesce(s.node_status, CASE WHEN s.status_code = 2 THEN 'failed' ELSE 'completed' END)",
            "coalesce(s.node_status, if(s.status_code = 2, 'failed', 'completed'))",
        ),
        Column("tool", "s.tool_name"),
        *_same("signature", "ordinal"),
        Column("limit", "s.limit_n"),
        *_same("limit_source", "result_hash", "attempts", "shadow_caught", "skill_stack", "start_ns", "end_ns"),
        *_same("service_name", "agent_name", "model", "day", "source"),
    ),
    """FROM {db}spans s
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
            f"if({_STATUS_FAILED}, 'failed', 'completed')",
        ),
        *_same("arguments", "result", "start_ns", "end_ns"),
        Column("duration_ns", "(s.end_ns - s.start_ns)"),
        *_same("service_name", "agent_name", "model", "skill_stack", "day", "source", "earlier_node_ids"),
        Column("internal", "coalesce(s.internal, false)"),
        Column("convention", "s.convention"),
        Column("orphan", "s.orphan_parent IS NOT NULL"),
        Column("path_position", "row_number() OVER (PARTITION BY s.run_id ORDER BY s.start_ns, s.span_id)"),
    ),
    _TOOL_SPANS,
)
"""The executed calls, in path order."""

LOOP_EVENTS: Final = View(
    "loop_events",
    (
        Column("run_id", "s.run_id"),
        Column("trace_id", "e.trace_id", "s.trace_id"),
        Column("span_id", "e.span_id", "s.span_id"),
        Column(
            "node_id",
            "coalesce(e.attributes['treellm.node.id'], s.node_id, "
            "CASE WHEN s.node_kind IS NOT NULL THEN s.span_id END, s.anchor_node_id)",
            "coalesce(if(mapContains(ea, 'treellm.node.id'), ea['treellm.node.id'], NULL), s.node_id, "
            "if(s.node_kind IS NOT NULL, s.span_id, NULL), s.anchor_node_id)",
        ),
        Column("time_ns", "e.time_ns", "toInt64(toUnixTimestamp64Nano(et))"),
        _event("tool", "treellm.loop.tool"),
        _event("signature", "treellm.loop.signature"),
        _event("call_id", "treellm.loop.call_id"),
        Column(
            "count",
            "TRY_CAST(e.attributes['treellm.loop.count'] AS INTEGER)",
            "toInt32OrNull(ea['treellm.loop.count'])",
        ),
        Column(
            "limit",
            "TRY_CAST(e.attributes['treellm.loop.limit'] AS INTEGER)",
            "toInt32OrNull(ea['treellm.loop.limit'])",
        ),
        _event("limit_source", "treellm.loop.limit_source"),
        _event("action", "treellm.loop.action"),
        Column(
            "shadow",
            "coalesce(TRY_CAST(e.attributes['treellm.loop.shadow'] AS BOOLEAN), false)",
            "ea['treellm.loop.shadow'] = 'true'",
        ),
        _event("arguments", "treellm.loop.arguments"),
        _event("earlier_node_ids_raw", "treellm.loop.earlier_node_ids"),
        _event("earlier_span_ids_raw", "treellm.loop.earlier_span_ids"),
        *_same("service_name", "agent_name", "model", "day", "skill_stack"),
    ),
    """FROM {db}span_events e
JOIN {db}spans s USING (trace_id, span_id)
WHERE e.name = 'loop:detected'""",
    # ClickHouse: the events are arrays on the span row (Nested): one pass, no join back to the span.
    """FROM {db}spans s
ARRAY JOIN s.event_names AS en, s.event_times AS et, s.event_attributes AS ea
WHERE en = 'loop:detected'""",
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
            "coalesce(r.outcome, if(r.status_code = 2, 'failed', 'completed'))",
        ),
        Column("guard", "coalesce(r.attributes['treellm.run.guard'] = 'true', false)"),
        Column("source", "r.source"),
    ),
    """FROM run_spans r
LEFT JOIN node_counts c USING (run_id)
LEFT JOIN prunes p USING (run_id)""",
    """FROM run_spans r
LEFT JOIN node_counts c USING (run_id)
LEFT JOIN prunes p USING (run_id)
SETTINGS join_use_nulls = 1""",
    head="""WITH run_spans AS (
    SELECT * FROM {db}spans
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
    FROM {db}nodes GROUP BY run_id
),
prunes AS (
    SELECT run_id,
        count(*) FILTER (WHERE NOT shadow) AS pruned_calls,
        count(*) FILTER (WHERE shadow) AS shadow_catches
    FROM {db}loop_events GROUP BY run_id
)
""",
    clickhouse_head="""WITH run_spans AS (
    SELECT * FROM {db}spans
    WHERE run_id IS NOT NULL AND skill_name IS NULL
      AND (span_id = splitByChar(':', assumeNotNull(run_id))[2]
           OR (convention IS NULL AND operation = 'invoke_agent' AND node_id IS NULL))
),
node_counts AS (
    SELECT run_id,
        countIf(kind = 'think') AS think_nodes, countIf(kind = 'tool') AS tool_nodes,
        countIf(kind = 'collapse') AS collapse_nodes, max(depth) AS max_depth,
        any(model) AS node_model
    FROM {db}nodes GROUP BY run_id
),
prunes AS (
    SELECT run_id, countIf(NOT shadow) AS pruned_calls, countIf(shadow) AS shadow_catches
    FROM {db}loop_events GROUP BY run_id
)
""",
)
"""One row per run: treellm's root ``invoke_agent`` span, or for other frameworks the outermost
agent span, else the trace root (``run_id`` says which)."""

VIEWS: Final = (NODES, TOOL_CALLS, LOOP_EVENTS, RUNS)


def duckdb_views(*, temporary: bool = False) -> str:
    """The DDL of every view in the DuckDB store (``TEMP`` views: a reader's own, over a store
    that holds another version of them)."""
    verb = "CREATE OR REPLACE TEMP VIEW" if temporary else "CREATE OR REPLACE VIEW"
    return "\n\n".join(f"{verb} {view.name} AS\n{view.query('duckdb', '')};" for view in VIEWS) + "\n"


def clickhouse_query(name: str, database: str) -> str:
    """The SELECT of the view ``name`` in ClickHouse, every name qualified with ``database``."""
    view = next(v for v in VIEWS if v.name == name)
    return view.query("clickhouse", f"{database}.")
