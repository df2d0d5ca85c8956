"""treellm's views in ClickHouse SQL over the Collector exporter's ``otel_traces`` table.

The views are the contract: ``spans`` (the promoted-column shape of the DuckDB ``spans``
table), ``nodes``, ``tool_calls``, ``loop_events`` and ``runs`` have the columns of the
DuckDB views (``schema.py``, migrations 0004 and 0006), derived inside ClickHouse from
the exporter's columns (``SpanAttributes`` Map, ``Events`` Nested arrays): nothing is
pulled into Python. Pure: :func:`view_queries` and :func:`create_view` return SQL text.

Hard rules: a Map lookup of a missing key gives ``''`` in ClickHouse, so every optional
attribute is read through ``mapContains`` (NULL when absent, as in DuckDB); ``runs``
aggregates with ``join_use_nulls = 1`` so that unmatched LEFT JOIN rows read NULL.

Rows written by ``treellm ingest --clickhouse`` (trajectories, SDK dumps, other
frameworks' traces in files) carry what ingest derived as ``treellm.derived.<column>``
attributes and the marker ``treellm.derived.source``; a marked row's columns are read
from those attributes only (:data:`DERIVED_COLUMNS`), so they report what DuckDB
reports. Not covered: *foreign* spans that the Collector writes itself (other
frameworks' spans without ``treellm.*`` attributes, sent straight to the Collector):
their run ids, node trees, signatures and ordinals with the state-change rule need the
conventions, the canonical argument text and the shell classifier, which are not in
ClickHouse SQL; they appear in ``spans`` but not in ``runs`` or the repeat analysis.
treellm's own spans carry their columns as attributes and work fully.

Ownership: the views live in treellm's own database (``treellm`` unless told otherwise),
never beside the spans table, and each carries the comment :func:`marker` (``treellm:view:N``,
N the :data:`SCHEMA_VERSION` of the SQL here). ``clickhouse.py`` replaces an object only when
its comment says it is treellm's; a name that holds anything else is refused, never replaced.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

from treellm.errors import ConfigError
from treellm.store.transform import PROMOTED_KEYS

__all__ = [
    "DEFAULT_TABLE", "DERIVED_COLUMNS", "DERIVED_PREFIX", "OTEL_TRACES_DDL", "SCHEMA_VERSION", "SOURCE_KEY",
    "SPANS_TABLE_COLUMNS", "VIEW_NAMES", "check_names", "create_view", "is_marked", "marker", "view_queries",
]  # fmt: skip

DEFAULT_TABLE: Final = "otel_traces"
SCHEMA_VERSION: Final = 2
"""The version of the views' SQL below, in each view's comment: bump it when the SQL changes."""
# ``treellm ingest --clickhouse`` (``clickhouse_ingest``) writes what ingest derived for a span as
# these attributes, and marks the row with SOURCE_KEY (the file it came from).
DERIVED_PREFIX: Final = "treellm.derived."
SOURCE_KEY: Final = DERIVED_PREFIX + "source"

# The spans table's columns that ingest fills (promoted from attributes for treellm's own
# spans, derived by the conventions and trees for other frameworks' spans), by type.
DERIVED_COLUMNS: Final[dict[str, str]] = {
    "operation": "text", "agent_name": "text", "model": "text", "run_id": "text", "node_id": "text",
    "node_kind": "text", "node_depth": "int32", "node_parent_id": "text", "node_status": "text",
    "skill_name": "text", "skill_stack": "text", "tool_name": "text", "tool_call_id": "text",
    "signature": "text", "ordinal": "int32", "limit_n": "int32", "limit_source": "text", "result_hash": "text",
    "attempts": "int32", "shadow_caught": "bool", "arguments": "text", "result": "text", "input_tokens": "int64",
    "output_tokens": "int64", "outcome": "text", "orphan_parent": "text", "earlier_node_ids": "text",
    "convention": "text", "internal": "bool", "anchor_node_id": "text", "call_digest": "text",
    "call_targets": "text",
}  # fmt: skip

VIEW_NAMES: Final = ("spans", "nodes", "tool_calls", "loop_events", "runs")
"""In creation order: each view reads only the ones before it."""
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SYSTEM_DATABASES: Final = frozenset({"system", "information_schema"})

# The columns of the spans table that the views read (the exporter's DDL below has them all).
SPANS_TABLE_COLUMNS: Final = (
    "Timestamp", "TraceId", "SpanId", "ParentSpanId", "SpanName", "SpanKind", "ServiceName", "ResourceAttributes",
    "ScopeName", "ScopeVersion", "SpanAttributes", "Duration", "StatusCode", "StatusMessage", "Events.Timestamp",
    "Events.Name", "Events.Attributes",
)  # fmt: skip

# The table the OpenTelemetry Collector (contrib) ClickHouse exporter creates with its defaults
# (create_schema: true, Map attribute columns): exporter/clickhouseexporter/internal/sqltemplates/
# traces_table.sql at commit f92a5763be13aeb59ecf6f8b47e31d54109191bb (the template of releases
# v0.12x-v0.13x), rendered with database "default", engine MergeTree(), no TTL, no cluster. Newer
# templates (PR #50878) keep the same columns and add text indexes: the views read either.
OTEL_TRACES_DDL: Final = """
CREATE TABLE IF NOT EXISTS {table} (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ParentSpanId String CODEC(ZSTD(1)),
    TraceState String CODEC(ZSTD(1)),
    SpanName LowCardinality(String) CODEC(ZSTD(1)),
    SpanKind LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)),
    ScopeVersion String CODEC(ZSTD(1)),
    SpanAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    Duration UInt64 CODEC(ZSTD(1)),
    StatusCode LowCardinality(String) CODEC(ZSTD(1)),
    StatusMessage String CODEC(ZSTD(1)),
    Events Nested (
                      Timestamp DateTime64(9),
    Name LowCardinality(String),
    Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    Links Nested (
                     TraceId String,
                     SpanId String,
                     TraceState String,
                     Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_res_attr_value mapValues(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_value mapValues(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1
    ) ENGINE = MergeTree()
    PARTITION BY toDate(Timestamp)
    ORDER BY (ServiceName, SpanName, toDateTime(Timestamp))
    SETTINGS index_granularity=8192, ttl_only_drop_parts = 1
"""


def _a(key: str, m: str = "SpanAttributes") -> str:
    """The attribute, NULL when absent."""
    return f"if(mapContains({m}, '{key}'), {m}['{key}'], NULL)"


def _co(*keys: str) -> str:
    return "coalesce(" + ", ".join(_a(k) for k in keys) + ")"


def _boolean(expr: str) -> str:
    """DuckDB's ``TRY_CAST(x AS BOOLEAN)`` for the spellings OTLP attributes use."""
    return f"multiIf(lower({expr}) IN ('true', 't', '1'), true, lower({expr}) IN ('false', 'f', '0'), false, NULL)"


_MARKED = f"mapContains(SpanAttributes, '{SOURCE_KEY}')"
_CONVERT: Final[dict[str, Callable[[str], str]]] = {
    "int32": lambda e: f"toInt32OrNull({e})",
    "int64": lambda e: f"toInt64OrNull({e})",
    "bool": _boolean,
    "text": lambda e: e,
}


def _derived(column: str, expression: str) -> str:
    """``column`` of a row that ``treellm ingest --clickhouse`` wrote: what ingest derived
    (NULL when it derived nothing), else what the span's own attributes say."""
    value = _CONVERT[DERIVED_COLUMNS[column]](_a(DERIVED_PREFIX + column))
    return f"if({_MARKED}, {value}, {expression}) AS {column}"


_INPUT_TOKENS = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt")
_OUTPUT_TOKENS = ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "llm.token_count.completion")


def _spans(table: str) -> str:
    promoted = "[" + ", ".join(f"'{k}'" for k in PROMOTED_KEYS) + "]"
    own = {
        "operation": _a("gen_ai.operation.name"),
        "agent_name": _co("gen_ai.agent.name", "agent.name"),
        "model": _co("gen_ai.request.model", "gen_ai.response.model", "llm.model_name"),
        "run_id": _a("treellm.run.id"),
        "node_id": _a("treellm.node.id"),
        "node_kind": _a("treellm.node.kind"),
        "node_depth": f"toInt32OrNull({_a('treellm.node.depth')})",
        "node_parent_id": f"nullIf({_a('treellm.node.parent_id')}, '')",
        "node_status": _a("treellm.node.status"),
        "skill_name": _a("treellm.skill.name"),
        "skill_stack": _a("treellm.node.skill_stack"),
        "tool_name": f"""coalesce({_a("gen_ai.tool.name")},
             if(SpanAttributes['gen_ai.operation.name'] = 'execute_tool' AND startsWith(name, 'execute_tool '),
                substring(name, 14), NULL))""",
        "tool_call_id": _a("gen_ai.tool.call.id"),
        "signature": _a("treellm.tool.signature"),
        "ordinal": f"toInt32OrNull({_a('treellm.tool.ordinal')})",
        "limit_n": f"toInt32OrNull({_a('treellm.tool.limit')})",
        "limit_source": _a("treellm.tool.limit_source"),
        "result_hash": _a("treellm.tool.result_hash"),
        "attempts": f"toInt32OrNull({_a('treellm.tool.attempts')})",
        "shadow_caught": _boolean(_a("treellm.tool.shadow_caught")),
        "arguments": _a("gen_ai.tool.call.arguments"),
        "result": _a("gen_ai.tool.call.result"),
        "input_tokens": f"toInt64OrNull({_co(*_INPUT_TOKENS)})",
        "output_tokens": f"toInt64OrNull({_co(*_OUTPUT_TOKENS)})",
        "outcome": _a("treellm.run.outcome"),
        "orphan_parent": _a("treellm.ingest.orphan_parent"),
        "earlier_node_ids": _a("treellm.tool.earlier_node_ids"),
        "convention": "CAST(NULL AS Nullable(String))",
        "internal": "CAST(NULL AS Nullable(Bool))",
        "anchor_node_id": "CAST(NULL AS Nullable(String))",
        "call_digest": "CAST(NULL AS Nullable(String))",
        "call_targets": "CAST(NULL AS Nullable(String))",
    }
    columns = ",\n    ".join(_derived(c, own[c]) for c in DERIVED_COLUMNS)
    attributes = f"""mapFilter((k, v) -> NOT startsWith(k, '{DERIVED_PREFIX}'),
           if(mapContains(SpanAttributes, 'treellm.run.id'),
              mapFilter((k, v) -> NOT has({promoted}, k), SpanAttributes), SpanAttributes))"""
    return f"""
SELECT
    TraceId AS trace_id, SpanId AS span_id, nullIf(ParentSpanId, '') AS parent_span_id,
    toString(SpanName) AS name,
    toInt8(multiIf(SpanKind IN ('Internal', 'SPAN_KIND_INTERNAL'), 1, SpanKind IN ('Server', 'SPAN_KIND_SERVER'), 2,
                   SpanKind IN ('Client', 'SPAN_KIND_CLIENT'), 3, SpanKind IN ('Producer', 'SPAN_KIND_PRODUCER'), 4,
                   SpanKind IN ('Consumer', 'SPAN_KIND_CONSUMER'), 5, 0)) AS kind,
    toInt64(toUnixTimestamp64Nano(Timestamp)) AS start_ns,
    start_ns + toInt64(Duration) AS end_ns,
    toInt8(multiIf(StatusCode IN ('Error', 'STATUS_CODE_ERROR'), 2,
                   StatusCode IN ('Ok', 'STATUS_CODE_OK'), 1, 0)) AS status_code,
    nullIf(StatusMessage, '') AS status_message,
    if(ServiceName = '', 'unknown_service', toString(ServiceName)) AS service_name,
    toDate(Timestamp) AS day,
    if({_MARKED}, SpanAttributes['{SOURCE_KEY}'], 'clickhouse') AS source,
    {columns},
    {attributes} AS attributes,
    ResourceAttributes AS resource_attributes, ScopeName AS scope_name, ScopeVersion AS scope_version,
    Events.Name AS event_names, Events.Timestamp AS event_times, Events.Attributes AS event_attributes
FROM {table}
"""


_NODES = """
SELECT
    s.run_id, s.trace_id, s.span_id, s.parent_span_id,
    coalesce(s.node_id, s.span_id) AS node_id,
    coalesce(s.node_kind, multiIf(s.operation = 'execute_tool', 'tool', s.operation = 'chat', 'think', NULL)) AS kind,
    s.node_depth AS depth, s.node_parent_id AS parent_id,
    coalesce(s.node_status, if(s.status_code = 2, 'failed', 'completed')) AS status,
    s.tool_name AS tool, s.signature, s.ordinal, s.limit_n AS `limit`, s.limit_source, s.result_hash,
    s.attempts, s.shadow_caught, s.skill_stack, s.start_ns, s.end_ns,
    s.service_name, s.agent_name, s.model, s.day, s.source
FROM {db}.spans s
WHERE s.node_kind IS NOT NULL OR s.operation IN ('execute_tool', 'chat')
"""

_TOOL_CALLS = """
SELECT
    s.run_id, s.trace_id, s.span_id, coalesce(s.node_id, s.span_id) AS node_id, s.node_parent_id AS parent_id,
    s.node_depth AS depth, s.tool_name AS tool, s.tool_call_id AS call_id, s.signature, s.ordinal,
    s.limit_n AS `limit`, s.limit_source, s.result_hash, s.attempts, coalesce(s.shadow_caught, false) AS shadow_caught,
    if(s.status_code = 2 OR s.node_status = 'failed', 'failed', 'completed') AS status,
    s.arguments, s.result, s.start_ns, s.end_ns, (s.end_ns - s.start_ns) AS duration_ns,
    s.service_name, s.agent_name, s.model, s.skill_stack, s.day, s.source, s.earlier_node_ids,
    coalesce(s.internal, false) AS internal, s.convention, s.orphan_parent IS NOT NULL AS orphan,
    row_number() OVER (PARTITION BY s.run_id ORDER BY s.start_ns, s.span_id) AS path_position
FROM {db}.spans s
WHERE s.tool_name IS NOT NULL AND (s.operation = 'execute_tool' OR s.node_kind = 'tool')
"""

# The events are arrays on the span row (Nested): one pass, no join back to the span.
_LOOP_EVENTS = """
SELECT
    s.run_id, s.trace_id, s.span_id,
    coalesce(if(mapContains(ea, 'treellm.node.id'), ea['treellm.node.id'], NULL), s.node_id,
             if(s.node_kind IS NOT NULL, s.span_id, NULL), s.anchor_node_id) AS node_id,
    toInt64(toUnixTimestamp64Nano(et)) AS time_ns,
    if(mapContains(ea, 'treellm.loop.tool'), ea['treellm.loop.tool'], NULL) AS tool,
    if(mapContains(ea, 'treellm.loop.signature'), ea['treellm.loop.signature'], NULL) AS signature,
    if(mapContains(ea, 'treellm.loop.call_id'), ea['treellm.loop.call_id'], NULL) AS call_id,
    toInt32OrNull(ea['treellm.loop.count']) AS count,
    toInt32OrNull(ea['treellm.loop.limit']) AS `limit`,
    if(mapContains(ea, 'treellm.loop.limit_source'), ea['treellm.loop.limit_source'], NULL) AS limit_source,
    if(mapContains(ea, 'treellm.loop.action'), ea['treellm.loop.action'], NULL) AS action,
    ea['treellm.loop.shadow'] = 'true' AS shadow,
    if(mapContains(ea, 'treellm.loop.arguments'), ea['treellm.loop.arguments'], NULL) AS arguments,
    if(mapContains(ea, 'treellm.loop.earlier_node_ids'), ea['treellm.loop.earlier_node_ids'], NULL)
        AS earlier_node_ids_raw,
    if(mapContains(ea, 'treellm.loop.earlier_span_ids'), ea['treellm.loop.earlier_span_ids'], NULL)
        AS earlier_span_ids_raw,
    s.service_name, s.agent_name, s.model, s.day, s.skill_stack
FROM {db}.spans s
ARRAY JOIN s.event_names AS en, s.event_times AS et, s.event_attributes AS ea
WHERE en = 'loop:detected'
"""

_RUNS = """
WITH run_spans AS (
    SELECT * FROM {db}.spans
    WHERE run_id IS NOT NULL AND skill_name IS NULL
      AND (span_id = splitByChar(':', assumeNotNull(run_id))[2]
           OR (convention IS NULL AND operation = 'invoke_agent' AND node_id IS NULL))
),
node_counts AS (
    SELECT run_id,
        countIf(kind = 'think') AS think_nodes, countIf(kind = 'tool') AS tool_nodes,
        countIf(kind = 'collapse') AS collapse_nodes, max(depth) AS max_depth,
        any(model) AS node_model
    FROM {db}.nodes GROUP BY run_id
),
prunes AS (
    SELECT run_id, countIf(NOT shadow) AS pruned_calls, countIf(shadow) AS shadow_catches
    FROM {db}.loop_events GROUP BY run_id
)
SELECT
    r.run_id AS run_id, r.trace_id AS trace_id, r.span_id AS span_id, coalesce(r.agent_name, r.name) AS agent,
    r.service_name AS service, coalesce(r.model, c.node_model) AS model,
    r.start_ns, r.end_ns, (r.end_ns - r.start_ns) AS duration_ns, r.day,
    coalesce(c.think_nodes, 0) AS think_nodes, coalesce(c.tool_nodes, 0) AS tool_nodes,
    coalesce(c.collapse_nodes, 0) AS collapse_nodes,
    coalesce(c.think_nodes, 0) + coalesce(c.tool_nodes, 0) + coalesce(c.collapse_nodes, 0) AS nodes,
    coalesce(c.max_depth, 0) AS max_depth,
    coalesce(p.pruned_calls, 0) AS pruned_calls, coalesce(p.shadow_catches, 0) AS shadow_catches,
    coalesce(r.outcome, if(r.status_code = 2, 'failed', 'completed')) AS outcome,
    coalesce(r.attributes['treellm.run.guard'] = 'true', false) AS guard,
    r.source
FROM run_spans r
LEFT JOIN node_counts c USING (run_id)
LEFT JOIN prunes p USING (run_id)
SETTINGS join_use_nulls = 1
"""


def check_names(table: str, database: str) -> None:
    """Refuse a spans table or a views database that is no plain ClickHouse name, or that
    lies in a system database, or a spans table named like one of treellm's views in its
    database; a :class:`ConfigError` quoting the value (pure)."""
    parts = table.split(".")
    if len(parts) > 2 or not all(_NAME.fullmatch(p) for p in parts):
        raise ConfigError(f"expected a ClickHouse table name such as otel_traces or otel.otel_traces, got {table!r}")
    if not _NAME.fullmatch(database):
        raise ConfigError(f"expected a ClickHouse database name such as treellm, got {database!r}")
    for kind, value, db in (("table", table, parts[0] if len(parts) == 2 else ""), ("database", database, database)):
        if db.lower() in _SYSTEM_DATABASES:
            raise ConfigError(f"expected a ClickHouse {kind} outside the system databases, got {value!r}")
    if len(parts) == 2 and parts[0] == database and parts[1] in VIEW_NAMES:
        raise ConfigError(f"expected a spans table that is not one of treellm's views, got {table!r}")


def marker(kind: str) -> str:
    """The comment on every ClickHouse object treellm creates: ``treellm:<kind>:<SCHEMA_VERSION>``."""
    return f"treellm:{kind}:{SCHEMA_VERSION}"


def is_marked(comment: str, kind: str) -> bool:
    """Whether ``comment`` is treellm's marker of ``kind``, of any schema version (pure)."""
    return re.fullmatch(rf"treellm:{re.escape(kind)}:\d+", comment.strip()) is not None


def view_queries(table: str, database: str) -> dict[str, str]:
    """The SELECT of each of treellm's views, by name in :data:`VIEW_NAMES` order: the views in
    ``database`` over the spans table ``table`` (qualified: ``db.name``), every name qualified."""
    check_names(table, database)
    derived = (body.format(db=database) for body in (_NODES, _TOOL_CALLS, _LOOP_EVENTS, _RUNS))
    return dict(zip(VIEW_NAMES, (_spans(table), *derived), strict=True))


def create_view(database: str, name: str, query: str, *, replace: bool) -> str:
    """``CREATE VIEW`` (``CREATE OR REPLACE VIEW`` when ``replace``) of ``database.name`` with
    treellm's marker; a plain CREATE fails if the name was taken meanwhile (pure)."""
    verb = "CREATE OR REPLACE VIEW" if replace else "CREATE VIEW"
    return f"{verb} {database}.{name} AS {query.strip()}\nCOMMENT '{marker('view')}'"
