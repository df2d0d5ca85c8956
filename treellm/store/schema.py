"""The store's schema as named, ordered migrations, and the views of the definitions.

Raw tables (the source of truth), keyed by (trace_id, span_id):

- ``spans``: one row per span, the attributes that the analysis filters and groups
  on promoted to typed columns, every attribute kept in ``attributes`` (a MAP of
  text), resource attributes, scope, ``service_name``, ``day`` and ``source``. A call of
  another framework holds its result once: ``result`` is NULL where it equals the attribute it
  was read from (read a span's result through ``derive.transform.result_sql``).
- ``span_events`` and ``span_links``: keyed by their span and position; each row
  carries its span's ``service_name`` and ``day`` so the three tables partition alike.

Views (``docs/architecture.md`` definitions): ``runs``, ``nodes``, ``tool_calls``,
``loop_events``. Spans from other agents (GenAI semantic conventions, OpenInference)
are mapped into the same promoted columns at ingest, so the views treat them alike.

Hard rule: never change what an applied migration does to the tables; add a new one. The
applied ones are recorded in :data:`MIGRATIONS_TABLE`, whose shape and first recorded name are
how ``open_store`` knows a file for a treellm store (it refuses any other DuckDB file instead of
migrating it).

The views are not migrations: they are defined once (:mod:`treellm.store.views`, which
ClickHouse's views are generated from too) and :data:`VIEWS` is their DDL. A writer recreates
them, in the transaction of the last migration it applies or in one of their own, whenever the
store does not record their digest (:data:`VIEWS_RECORD`, a row of the migrations table); a
reader of a store that records another digest reads temporary views of this version instead
(it never writes). So a column added to a view is a change in one place.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from typing import Final

from treellm.store.metric_points import METRIC_POINTS_SQL
from treellm.store.views import duckdb_views

__all__ = [
    "MIGRATIONS",
    "MIGRATIONS_TABLE",
    "MIGRATIONS_TABLE_COLUMNS",
    "MIGRATIONS_TABLE_SQL",
    "SPAN_COLUMNS",
    "VIEWS",
    "VIEWS_RECORD",
    "recorded_views",
    "views_record",
]

SPAN_COLUMNS: Final = (
    "trace_id",
    "span_id",
    "parent_span_id",
    "name",
    "kind",
    "start_ns",
    "end_ns",
    "status_code",
    "status_message",
    "service_name",
    "day",
    "source",
    "operation",
    "agent_name",
    "model",
    "run_id",
    "node_id",
    "node_kind",
    "node_depth",
    "node_parent_id",
    "node_status",
    "skill_name",
    "skill_stack",
    "tool_name",
    "tool_call_id",
    "signature",
    "ordinal",
    "limit_n",
    "limit_source",
    "result_hash",
    "attempts",
    "shadow_caught",
    "arguments",
    "result",
    "input_tokens",
    "output_tokens",
    "outcome",
    "orphan_parent",
    "attributes",
    "resource_attributes",
    "scope_name",
    "scope_version",
    "earlier_node_ids",
    "convention",
    "internal",
    "anchor_node_id",
)

_RAW_TABLES = """
CREATE TABLE spans (
    trace_id VARCHAR NOT NULL,
    span_id VARCHAR NOT NULL,
    parent_span_id VARCHAR,
    name VARCHAR NOT NULL,
    kind TINYINT,
    start_ns BIGINT NOT NULL,
    end_ns BIGINT NOT NULL,
    status_code TINYINT,
    status_message VARCHAR,
    service_name VARCHAR NOT NULL,
    day DATE NOT NULL,
    source VARCHAR,
    operation VARCHAR,
    agent_name VARCHAR,
    model VARCHAR,
    run_id VARCHAR,
    node_id VARCHAR,
    node_kind VARCHAR,
    node_depth INTEGER,
    node_parent_id VARCHAR,
    node_status VARCHAR,
    skill_name VARCHAR,
    skill_stack VARCHAR,
    tool_name VARCHAR,
    tool_call_id VARCHAR,
    signature VARCHAR,
    ordinal INTEGER,
    limit_n INTEGER,
    limit_source VARCHAR,
    result_hash VARCHAR,
    attempts INTEGER,
    shadow_caught BOOLEAN,
    arguments VARCHAR,
    result VARCHAR,
    input_tokens BIGINT,
    output_tokens BIGINT,
    outcome VARCHAR,
    orphan_parent VARCHAR,
    attributes MAP(VARCHAR, VARCHAR),
    resource_attributes MAP(VARCHAR, VARCHAR),
    scope_name VARCHAR,
    scope_version VARCHAR
);
CREATE TABLE span_events (
    trace_id VARCHAR NOT NULL,
    span_id VARCHAR NOT NULL,
    event_index INTEGER NOT NULL,
    name VARCHAR NOT NULL,
    time_ns BIGINT,
    service_name VARCHAR NOT NULL,
    day DATE NOT NULL,
    attributes MAP(VARCHAR, VARCHAR)
);
CREATE TABLE span_links (
    trace_id VARCHAR NOT NULL,
    span_id VARCHAR NOT NULL,
    link_index INTEGER NOT NULL,
    linked_trace_id VARCHAR NOT NULL,
    linked_span_id VARCHAR NOT NULL,
    service_name VARCHAR NOT NULL,
    day DATE NOT NULL,
    attributes MAP(VARCHAR, VARCHAR)
);
CREATE TABLE ingested_files (
    source VARCHAR NOT NULL,
    content_hash VARCHAR NOT NULL,
    spans BIGINT NOT NULL,
    ingested_at TIMESTAMP NOT NULL
);
"""

VIEWS: Final = duckdb_views()
"""The DDL of the views, generated from their one definition (:mod:`treellm.store.views`)."""

VIEWS_RECORD_PREFIX: Final = "views "


def views_record(ddl: str) -> str:
    """The row of the migrations table that says a store's views are ``ddl``: ``views <digest>``."""
    return VIEWS_RECORD_PREFIX + hashlib.sha256(ddl.encode()).hexdigest()[:16]


VIEWS_RECORD: Final = views_record(VIEWS)
"""The row of the migrations table that says the store's views are :data:`VIEWS`."""
_VIEWS_BEFORE_RECORDS: Final = VIEWS_RECORD_PREFIX + "64c098dd5a94d7d2"
"""The record of the views that the migrations up to 0008 created, when each migration still wrote
its own: a store written before the views were recorded holds those."""


def recorded_views(recorded: Collection[str]) -> str:
    """The record of the views a store holds, from the names its migrations table records."""
    found = sorted(name for name in recorded if name.startswith(VIEWS_RECORD_PREFIX))
    return found[-1] if found else _VIEWS_BEFORE_RECORDS


# 0003: the earlier identical calls each executed repeat counted (a JSON list of node ids),
# so repeat outcomes compare a call with exactly the calls on its own path (``tool_calls`` shows it).
_EARLIER_CALLS = """
ALTER TABLE spans ADD COLUMN earlier_node_ids VARCHAR;
"""

# 0004: spans of other frameworks read through their conventions (``convention`` names the
# family), framework-internal tools marked (``internal``), and runs that are the outermost
# agent span only: nested agent spans of other frameworks are not runs.
_FOREIGN_TREES = """
ALTER TABLE spans ADD COLUMN convention VARCHAR;
ALTER TABLE spans ADD COLUMN internal BOOLEAN;
"""

# 0006: a caught call of another framework (LoopGuard annotating an instrumentor's spans)
# hangs, as a ghost node, from the node that asked for it: the span that carries the
# event when it is a node, else the think node current on its path (``anchor_node_id``).
_GUARD_ANCHORS = """
ALTER TABLE spans ADD COLUMN anchor_node_id VARCHAR;
"""

# 0007: the stored key of each call of another framework (``derive/foreign.py``): the SHA-256 hex
# of its tool and canonical raw argument text (``call_digest``) and its targets as compact JSON
# with each path component digested (``call_targets``), written when the call is first keyed
# from its raw values, so a trace placed again in a later transaction never keys its calls on
# their stored (redacted) arguments. NULL: not a counted call of another framework, or stored
# before this migration (then keyed on the stored arguments, as before).
_CALL_KEYS = """
ALTER TABLE spans ADD COLUMN call_digest VARCHAR;
ALTER TABLE spans ADD COLUMN call_targets VARCHAR;
"""

# 0008: the chain of identical calls each counted call of another framework belongs to (the span
# id of its oldest earlier call that counts, else its own; ``derive/trees.py``), so a repeat is
# judged against the calls of its chain of lower ordinal instead of a list of every earlier call
# (quadratic in a loop: 10,000 identical calls named 50M earlier ids); ``earlier_node_ids`` of
# such calls keeps the most recent ``EARLIER_KEPT``. Stored calls get theirs from their list.
_REPEAT_CHAINS = """
ALTER TABLE spans ADD COLUMN repeat_chain VARCHAR;
UPDATE spans SET repeat_chain = coalesce(json_extract_string(earlier_node_ids, '$[0]'), span_id)
WHERE convention IS NOT NULL AND ordinal IS NOT NULL;
"""

MIGRATIONS_TABLE: Final = "schema_migrations"
MIGRATIONS_TABLE_COLUMNS: Final = (("name", "VARCHAR"), ("applied_at", "TIMESTAMP"))
"""The migrations table's columns and DuckDB types, in order: part of what marks a treellm store."""
MIGRATIONS_TABLE_SQL: Final = (
    f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (name VARCHAR PRIMARY KEY, applied_at TIMESTAMP)"
)

MIGRATIONS: Final[tuple[tuple[str, str], ...]] = (
    ("0001_raw_tables", _RAW_TABLES),
    ("0002_views", ""),  # the views are VIEWS, recreated after the migrations
    ("0003_earlier_calls", _EARLIER_CALLS),
    ("0004_foreign_trees", _FOREIGN_TREES),
    ("0005_metric_points", METRIC_POINTS_SQL),
    ("0006_guard_anchors", _GUARD_ANCHORS),
    ("0007_call_keys", _CALL_KEYS),
    ("0008_repeat_chains", _REPEAT_CHAINS),
)
