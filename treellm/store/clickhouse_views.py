"""treellm's tables and views in ClickHouse, beside the Collector exporter's ``otel_traces`` table.

The views are the contract: ``spans`` (the DuckDB store's ``spans`` table, its columns read from
DuckDB itself), ``nodes``, ``tool_calls``, ``loop_events`` and ``runs`` have the columns of the
DuckDB views, generated from the same definition (:mod:`treellm.store.views`). Nothing is
derived here. ``treellm derive``
(:mod:`treellm.store.clickhouse_derive`) reads the spans that arrived in ``otel_traces``, derives
them with the one pipeline that DuckDB ingest runs (the validator, the conventions, runs and
trees, signatures and ordinals with the state-change rule, the redaction of other frameworks'
values), and writes the result into two tables of treellm's database:

- ``treellm_spans`` (ReplacingMergeTree): one row per span with the columns of the DuckDB
  ``spans`` table, its events as arrays, and ``version``: a trace derived again (a late span)
  replaces its rows, the newest version wins (the ``spans`` view reads it ``FINAL``);
- ``treellm_traces`` (ReplacingMergeTree): per trace, the distinct spans ``otel_traces`` held
  when it was derived; a trace whose count changed since is derived again.

Pure: :func:`view_queries`, :func:`create_view` and the DDL functions return SQL text.

Ownership: the tables and views live in treellm's own database (``treellm`` unless told
otherwise), never beside the spans table, and each carries the comment :func:`marker`
(``treellm:view:N`` or ``treellm:table:N``, N the :data:`SCHEMA_VERSION` of the SQL here).
``clickhouse.py`` replaces a view, or adds a table's missing columns, only when its comment says
it is treellm's; a name that holds anything else is refused, never replaced.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from treellm.errors import ConfigError
from treellm.store.views import clickhouse_query

__all__ = [
    "DEFAULT_TABLE", "DERIVED_SPANS", "DERIVED_TRACES", "EVENT_COLUMNS", "OTEL_TRACES_DDL", "SCHEMA_VERSION",
    "SPANS_TABLE_COLUMNS", "TABLE_NAMES", "VIEW_NAMES", "Column", "check_names", "clickhouse_type", "create_view",
    "derived_spans_ddl", "derived_traces_ddl", "is_marked", "marker", "view_queries",
]  # fmt: skip

DEFAULT_TABLE: Final = "otel_traces"
SCHEMA_VERSION: Final = 4
"""The version of the SQL below, in each object's comment: bump it when the SQL changes."""
DERIVED_SPANS: Final = "treellm_spans"
DERIVED_TRACES: Final = "treellm_traces"
TABLE_NAMES: Final = (DERIVED_SPANS, DERIVED_TRACES)
"""treellm's tables in its database, created before the views."""

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


_CLICKHOUSE_TYPES: Final = {
    "VARCHAR": "String", "TINYINT": "Int8", "SMALLINT": "Int16", "INTEGER": "Int32", "BIGINT": "Int64",
    "BOOLEAN": "Bool", "DATE": "Date", "DOUBLE": "Float64",
}  # fmt: skip


def clickhouse_type(duckdb_type: str, *, nullable: bool) -> str:
    """The ClickHouse column type of a DuckDB column of the store (pure): scalars keep their width
    and nullability, ``MAP(VARCHAR, VARCHAR)`` is a ``Map(String, String)`` (empty for NULL)."""
    if duckdb_type == "MAP(VARCHAR, VARCHAR)":
        return "Map(String, String)"
    try:
        scalar = _CLICKHOUSE_TYPES[duckdb_type]
    except KeyError:
        raise ValueError(f"expected a DuckDB column type with a ClickHouse twin, got {duckdb_type!r}") from None
    return f"Nullable({scalar})" if nullable else scalar


Column = tuple[str, str, bool]
"""A column of the store's ``spans`` table: (name, DuckDB type, nullable), as ``DESCRIBE spans`` says."""

# What a derived span row carries beyond the store's ``spans`` columns: its events (the loop
# events' view reads them as arrays, one pass, no join) and the version that ReplacingMergeTree
# keeps the newest of (the derive pass's start, ns).
EVENT_COLUMNS: Final = (
    ("event_names", "Array(String)"), ("event_times", "Array(DateTime64(9))"),
    ("event_attributes", "Array(Map(String, String))"),
)  # fmt: skip


def derived_spans_ddl(database: str, columns: Sequence[Column]) -> str:
    """``CREATE TABLE IF NOT EXISTS`` of ``database.treellm_spans``: one row per span with the
    columns of the store's ``spans`` table (``columns``, read from DuckDB: the one definition),
    its events, and ``version``; the newest version of a (trace, span) wins (pure)."""
    body = [f"`{name}` {clickhouse_type(kind, nullable=nullable)}" for name, kind, nullable in columns]
    body += [f"`{name}` {kind}" for name, kind in EVENT_COLUMNS]
    body.append("`version` UInt64")
    lines = ",\n    ".join(body)
    return (
        f"CREATE TABLE IF NOT EXISTS {database}.{DERIVED_SPANS} (\n    {lines}\n)\n"
        "ENGINE = ReplacingMergeTree(version)\nPARTITION BY toYYYYMM(day)\nORDER BY (trace_id, span_id)\n"
        f"COMMENT '{marker('table')}'"
    )


def derived_traces_ddl(database: str) -> str:
    """``CREATE TABLE IF NOT EXISTS`` of ``database.treellm_traces``: per trace, how many distinct
    spans the spans table held when it was derived (a trace whose count has changed since is
    derived again), its last span end, the worker's shard and when; the newest version wins (pure)."""
    return (
        f"CREATE TABLE IF NOT EXISTS {database}.{DERIVED_TRACES} (\n"
        "    trace_id String,\n    spans UInt64,\n    last_ns Int64,\n    derived_ns Int64,\n"
        "    shard String,\n    version UInt64\n)\n"
        "ENGINE = ReplacingMergeTree(version)\nORDER BY trace_id\n"
        f"COMMENT '{marker('table')}'"
    )


def _spans(database: str, columns: Sequence[Column]) -> str:
    names = ", ".join(f"`{name}`" for name, _, _ in columns)
    return f"""
SELECT {names}, event_names, event_times, event_attributes
FROM {database}.{DERIVED_SPANS} FINAL
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
    if len(parts) == 2 and parts[0] == database and parts[1] in (*VIEW_NAMES, *TABLE_NAMES):
        raise ConfigError(f"expected a spans table that is not one of treellm's views or tables, got {table!r}")


def marker(kind: str) -> str:
    """The comment on every ClickHouse object treellm creates: ``treellm:<kind>:<SCHEMA_VERSION>``."""
    return f"treellm:{kind}:{SCHEMA_VERSION}"


def is_marked(comment: str, kind: str) -> bool:
    """Whether ``comment`` is treellm's marker of ``kind``, of any schema version (pure)."""
    return re.fullmatch(rf"treellm:{re.escape(kind)}:\d+", comment.strip()) is not None


def view_queries(table: str, database: str, columns: Sequence[Column]) -> dict[str, str]:
    """The SELECT of each of treellm's views, by name in :data:`VIEW_NAMES` order: the views in
    ``database`` over its derived tables (``columns``: the store's ``spans`` columns), every name
    qualified; ``table`` (the spans table they were derived from) is checked, not read."""
    check_names(table, database)
    derived = (clickhouse_query(name, database) for name in VIEW_NAMES[1:])
    return dict(zip(VIEW_NAMES, (_spans(database, columns), *derived), strict=True))


def create_view(database: str, name: str, query: str, *, replace: bool) -> str:
    """``CREATE VIEW`` (``CREATE OR REPLACE VIEW`` when ``replace``) of ``database.name`` with
    treellm's marker; a plain CREATE fails if the name was taken meanwhile (pure)."""
    verb = "CREATE OR REPLACE VIEW" if replace else "CREATE VIEW"
    return f"{verb} {database}.{name} AS {query.strip()}\nCOMMENT '{marker('view')}'"
