"""treellm's tables and views in ClickHouse, beside the Collector exporter's ``otel_traces`` table.

The views are the contract: ``spans``, ``nodes``, ``tool_calls``, ``loop_events`` and ``runs``
have the columns of the DuckDB store's table and views (:mod:`treellm.store.views`), read from
DuckDB itself. Nothing is derived here, and no view computes anything: ``treellm derive``
(:mod:`treellm.store.clickhouse_derive`) reads the spans that arrived in ``otel_traces``, derives
them with the one pipeline that DuckDB ingest runs (the validator, the conventions, runs and
trees, signatures and ordinals with the state-change rule, the redaction of other frameworks'
values, then the DuckDB views themselves), and writes each trace's rows into treellm's tables:

- ``treellm_spans``: one row per span with the columns of the DuckDB ``spans`` table and its
  events as arrays;
- ``treellm_nodes``, ``treellm_tool_calls``, ``treellm_loop_events``, ``treellm_runs``: the rows
  of the DuckDB view of that name, computed over the trace's spans, numbered within the trace
  (``row``), with ``is_deleted`` set on the rows a trace derived again no longer has;
- ``treellm_traces``: per trace, the distinct spans ``otel_traces`` held when it was derived, the
  ``version`` of that derivation and the ``schema`` it was derived under (:func:`derived_schema`);
  a trace whose count or schema changed since is derived again.

Every row carries the ``version`` of the pass that wrote it, and the views read the tables
``FINAL``: of each (trace, span) or (trace, row) key, the newest version, unless it is a
deletion. So a trace derived again (a late span, a late root that renames its run) is replaced
as a whole: its rows are renumbered from 1, and the numbers its earlier derivation used beyond
its new count get a deletion (``ReplacingMergeTree(version, is_deleted)``). A pass stopped
half-way leaves its traces' counts unrecorded: the next pass derives them again and replaces
what it wrote. Every table is partitioned by the day its traces were first derived
(:data:`BUCKET`, which leads each sorting key) on a server; a chDB folder's tables are one
partition each. Queries read plain columns (``FINAL`` over ``ReplacingMergeTree`` merges parts ordered
by the key, cheap beside any filter on the trace), never a Map, nothing aggregated at read
time.

Pure: :func:`view_queries`, :func:`create_view` and the DDL functions return SQL text.

Ownership: the tables and views live in treellm's own database (``treellm`` unless told
otherwise), never beside the spans table, and each carries the comment :func:`marker`
(``treellm:view:N`` or ``treellm:table:N``, N the :data:`SCHEMA_VERSION` of the SQL here).
``clickhouse.py`` replaces a view, or adds a table's missing columns, only when its comment says
it is treellm's; a name that holds anything else is refused, never replaced.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Final

from treellm.errors import ConfigError
from treellm.store.judged import JUDGED, rules_digest
from treellm.store.views import VIEWS, duckdb_views

__all__ = [
    "BUCKET", "DAILY", "DEFAULT_TABLE", "DERIVED_SPANS", "DERIVED_TRACES", "DERIVED_VIEWS", "EVENT_COLUMNS",
    "LOW_CARDINALITY", "OTEL_TRACES_DDL", "SCHEMA_VERSION", "SPANS_TABLE_COLUMNS", "TABLE_NAMES", "VIEW_NAMES",
    "WHOLE", "Column",
    "check_names", "clickhouse_type", "create_view", "derived_schema", "derived_spans_ddl", "derived_traces_ddl",
    "derived_view_ddl", "is_marked", "marker", "TRACES_COLUMNS", "view_columns_wanted", "view_queries",
]  # fmt: skip

DEFAULT_TABLE: Final = "otel_traces"
SCHEMA_VERSION: Final = 7
"""The version of the SQL below, in each object's comment: bump it when the SQL changes."""
DERIVED_SPANS: Final = "treellm_spans"
DERIVED_TRACES: Final = "treellm_traces"
DERIVED_VIEWS: Final = {name: f"treellm_{name}" for name in (*(view.name for view in VIEWS), *JUDGED)}
"""Each DuckDB view's table, and each judgement's (:mod:`treellm.store.judged`): its rows per
trace, as ``treellm derive`` computed them."""
TABLE_NAMES: Final = (DERIVED_SPANS, DERIVED_TRACES, *DERIVED_VIEWS.values())
"""treellm's tables in its database, created before the views."""

VIEW_NAMES: Final = ("spans", *DERIVED_VIEWS)
"""The views over treellm's tables, each reading its own table and ``treellm_traces``."""
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
    and nullability, ``MAP(VARCHAR, VARCHAR)`` is a ``Map(String, String)`` and a list an
    ``Array`` (both empty for NULL)."""
    if duckdb_type == "MAP(VARCHAR, VARCHAR)":
        return "Map(String, String)"
    if duckdb_type.endswith("[]"):  # a list: an Array (never Nullable in ClickHouse: empty for NULL)
        return f"Array({clickhouse_type(duckdb_type[:-2], nullable=False)})"
    try:
        scalar = _CLICKHOUSE_TYPES[duckdb_type]
    except KeyError:
        raise ValueError(f"expected a DuckDB column type with a ClickHouse twin, got {duckdb_type!r}") from None
    return f"Nullable({scalar})" if nullable else scalar


Column = tuple[str, str, bool]
"""A column of the store's ``spans`` table: (name, DuckDB type, nullable), as ``DESCRIBE spans`` says."""

# What a derived span row carries beyond the store's ``spans`` columns: its events as arrays
# (the spans view shows them beside the span) and the version of the pass that wrote it (the
# derive pass's start, ns).
EVENT_COLUMNS: Final = (
    ("event_names", "Array(String)"), ("event_times", "Array(DateTime64(9))"),
    ("event_attributes", "Array(Map(String, String))"),
)  # fmt: skip
BUCKET: Final = ("bucket", "Date")
"""What partitions every row of treellm's tables: the day (UTC) its trace was first derived. A
trace derived again (a late span) keeps it, as ``treellm_traces`` recorded it, so its rows always
replace their earlier versions in one partition. Fresh traces fill the newest partition: a merge
(:meth:`~treellm.store.clickhouse.ClickHouseConnection.compact`) rewrites the partitions that
grew, never the older ones, and ``FINAL`` reads a merged partition without merging it (the
partition key is a function of the sorting key's first column, so ClickHouse deduplicates each
partition on its own)."""
DAILY: Final = "bucket"
"""A server's partitions: one a day, so a merge rewrites the days that grew, never the months
before."""
WHOLE: Final = "tuple()"
"""A chDB folder's tables: one partition each. chDB loads every part's metadata whenever a
process opens the folder (13 tables of 300 partitions each: 0.6 s against 0.04 s for one
partition each), and reads each part cold (the dashboard's first loads at 10M spans: 0.1-0.6 s
slower over 10 partitions a table, BENCHMARKS.md); a folder on one machine is merged whole."""


def _keys(partition: str, key: str) -> str:
    return f"PARTITION BY {partition}\nORDER BY (bucket, {key})\n"


def derived_spans_ddl(database: str, columns: Sequence[Column], *, partition: str = DAILY) -> str:
    """``CREATE TABLE IF NOT EXISTS`` of ``database.treellm_spans``: one row per span with the
    columns of the store's ``spans`` table (``columns``, read from DuckDB: the one definition),
    its events, its :data:`BUCKET` and ``version``; merges keep the newest version of a (trace,
    span); ``partition``: :data:`DAILY` or :data:`WHOLE` (pure)."""
    body = [f"`{name}` {clickhouse_type(kind, nullable=nullable)}" for name, kind, nullable in columns]
    body += [f"`{name}` {kind}" for name, kind in (*EVENT_COLUMNS, BUCKET)]
    body.append("`version` UInt64")
    lines = ",\n    ".join(body)
    return (
        f"CREATE TABLE IF NOT EXISTS {database}.{DERIVED_SPANS} (\n    {lines}\n)\n"
        f"ENGINE = ReplacingMergeTree(version)\n{_keys(partition, 'trace_id, span_id')}"
        f"COMMENT '{marker('table')}'"
    )


TRACES_COLUMNS: Final = (
    ("trace_id", "String"), ("spans", "UInt64"), ("last_ns", "Int64"), ("derived_ns", "Int64"), ("shard", "String"),
    ("version", "UInt64"), ("schema", "String"), BUCKET,
)  # fmt: skip


def derived_traces_ddl(database: str, *, partition: str = DAILY) -> str:
    """``CREATE TABLE IF NOT EXISTS`` of ``database.treellm_traces``: per trace, how many distinct
    spans the spans table held when it was derived (a trace whose count has changed since is
    derived again), its last span end, the worker's shard and when, the schema it was derived
    under (:func:`derived_schema`); the newest version wins (pure)."""
    body = ",\n    ".join(f"{name} {kind}" for name, kind in TRACES_COLUMNS)
    return (
        f"CREATE TABLE IF NOT EXISTS {database}.{DERIVED_TRACES} (\n    {body}\n)\n"
        f"ENGINE = ReplacingMergeTree(version)\n{_keys(partition, 'trace_id')}"
        f"COMMENT '{marker('table')}'"
    )


ROW_COLUMNS: Final = (("row", "UInt32"), ("version", "UInt64"), ("is_deleted", "UInt8"), BUCKET)
"""What a row of a view's table carries beyond the view's columns: its number within its trace
(with the trace, the key that merges replace), the version of the pass that wrote it, whether
it deletes the row of that number (a trace derived again into fewer rows), and its trace's
:data:`BUCKET`."""


LOW_CARDINALITY: Final = frozenset({
    "kind", "status", "last_status", "tool", "first_tool", "last_tool", "limit_source", "action", "outcome",
    "service_name", "agent_name", "model", "agent", "service", "source", "convention", "scope_name",
})  # fmt: skip
"""The text columns of the views' tables with few distinct values (names of tools, agents, models,
kinds, statuses, outcomes): ``LowCardinality`` in ClickHouse, a dictionary a part, so what groups or
filters by them reads and hashes small numbers. At 10M spans over chDB: the tools' names of 3.4M
calls 0.15 s -> 0.02 s, the calls per tool 0.10 s -> 0.06 s (BENCHMARKS.md, "Dashboard"). The
values and what every query returns are the same."""


def _view_type(name: str, duckdb_type: str) -> str:
    if name == "trace_id":
        return "String"  # the key: never NULL
    kind = clickhouse_type(duckdb_type, nullable=True)
    return f"LowCardinality({kind})" if name in LOW_CARDINALITY and kind == "Nullable(String)" else kind


def view_columns_wanted(columns: Sequence[Column]) -> list[tuple[str, str]]:
    """The ClickHouse columns of a view's table, given the DuckDB view's ``columns`` (pure):
    ``trace_id`` is the key (never NULL), every other column nullable as the view's values are,
    the text columns of :data:`LOW_CARDINALITY` as ``LowCardinality``."""
    return [*((n, _view_type(n, k)) for n, k, _ in columns), *ROW_COLUMNS]


def derived_view_ddl(database: str, view: str, columns: Sequence[Column], *, partition: str = DAILY) -> str:
    """``CREATE TABLE IF NOT EXISTS`` of the table of the DuckDB view ``view``: its ``columns``
    (read from DuckDB: the one definition) and :data:`ROW_COLUMNS`; ``partition``: :data:`DAILY`
    or :data:`WHOLE` (pure)."""
    body = ",\n    ".join(f"`{name}` {kind}" for name, kind in view_columns_wanted(columns))
    return (
        f"CREATE TABLE IF NOT EXISTS {database}.{DERIVED_VIEWS[view]} (\n    {body}\n)\n"
        f"ENGINE = ReplacingMergeTree(version, is_deleted)\n{_keys(partition, 'trace_id, row')}"
        f"COMMENT '{marker('table')}'"
    )


def derived_schema(spans: Sequence[Column], views: Mapping[str, Sequence[Column]]) -> str:
    """What a trace is derived under: a digest of the store's ``spans`` columns, its views'
    columns and their SQL, and the code of the judgements' rules
    (:func:`~treellm.store.judged.rules_digest`). ``treellm_traces`` records it per trace; a trace
    recorded under another digest (an upgrade that changed a view or a rule) is derived again."""
    text = json.dumps([list(spans), {k: list(v) for k, v in sorted(views.items())}, duckdb_views(), rules_digest()])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _select(database: str, table: str, names: Sequence[str]) -> str:
    quoted = ", ".join(f"`{name}`" for name in names)
    return f"""
SELECT {quoted}
FROM {database}.{table} FINAL
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


def view_queries(
    table: str, database: str, columns: Sequence[Column], views: Mapping[str, Sequence[Column]]
) -> dict[str, str]:
    """The SELECT of each of treellm's views, by name in :data:`VIEW_NAMES` order: the views in
    ``database`` over its tables (``columns``: the store's ``spans`` columns; ``views``: each
    DuckDB view's), every name qualified; ``table`` (the spans table they were derived from) is
    checked, not read."""
    check_names(table, database)
    spans = [name for name, _, _ in columns] + [name for name, _ in EVENT_COLUMNS]
    queries = {"spans": _select(database, DERIVED_SPANS, spans)}
    for view, table_name in DERIVED_VIEWS.items():
        queries[view] = _select(database, table_name, [name for name, _, _ in views[view]])
    return queries


def create_view(database: str, name: str, query: str, *, replace: bool) -> str:
    """``CREATE VIEW`` (``CREATE OR REPLACE VIEW`` when ``replace``) of ``database.name`` with
    treellm's marker; a plain CREATE fails if the name was taken meanwhile (pure)."""
    verb = "CREATE OR REPLACE VIEW" if replace else "CREATE VIEW"
    return f"{verb} {database}.{name} AS {query.strip()}\nCOMMENT '{marker('view')}'"
