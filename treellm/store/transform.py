"""The SQL that flattens OTLP/JSON ``TracesData`` lines into span, event and link rows.

DuckDB parses and unnests the JSON itself (``read_json`` with explicit columns: no
schema-detection pass, no Python loop over spans), maps the attributes of treellm,
the GenAI semantic conventions and OpenInference onto the promoted columns, and keeps
every attribute in a ``MAP(VARCHAR, VARCHAR)``. Pure: functions return SQL text.
"""

from __future__ import annotations

from typing import Final

from treellm.otlp.validate import validate_sql
from treellm.telemetry import conventions as conv
from treellm.telemetry import semconv as sc

__all__ = ["MACROS", "READ_COLUMNS", "stage_sql"]

_ANY = (
    "STRUCT(stringValue VARCHAR, intValue VARCHAR, doubleValue VARCHAR, boolValue BOOLEAN, "
    "arrayValue VARCHAR, kvlistValue VARCHAR, bytesValue VARCHAR)"
)
_KV = f"STRUCT(key VARCHAR, value {_ANY})[]"
_SPAN = (
    "STRUCT(traceId VARCHAR, spanId VARCHAR, parentSpanId VARCHAR, name VARCHAR, kind INTEGER, "
    "startTimeUnixNano VARCHAR, endTimeUnixNano VARCHAR, "
    f"attributes {_KV}, "
    f"events STRUCT(timeUnixNano VARCHAR, name VARCHAR, attributes {_KV})[], "
    f"links STRUCT(traceId VARCHAR, spanId VARCHAR, attributes {_KV})[], "
    "status STRUCT(code INTEGER, message VARCHAR))"
)
_RESOURCE_SPANS = (
    f"STRUCT(resource STRUCT(attributes {_KV}), "
    f"scopeSpans STRUCT(scope STRUCT(name VARCHAR, version VARCHAR), spans {_SPAN}[])[])[]"
)
READ_COLUMNS: Final = "{'resourceSpans': '" + _RESOURCE_SPANS + "'}"

# Attribute values as text. Scalars become their text; arrays and key-value lists keep
# their OTLP/JSON text (``{"values": [...]}``) in the MAP, which is cheap, and the few
# promoted columns that hold one (the skill stack, a mapping of arguments) are turned
# into plain JSON (a list of scalars, an object) by the macros below.
MACROS: Final = """
CREATE OR REPLACE TEMP MACRO treellm_scalar(v) AS
    coalesce(v->>'stringValue', v->>'intValue', v->>'doubleValue', v->>'boolValue', v->>'bytesValue');
CREATE OR REPLACE TEMP MACRO treellm_text(v) AS coalesce(
    v.stringValue, v.intValue, v.doubleValue, CAST(v.boolValue AS VARCHAR), v.bytesValue,
    CAST(v.arrayValue AS VARCHAR), CAST(v.kvlistValue AS VARCHAR));
CREATE OR REPLACE TEMP MACRO treellm_attrs(kvs) AS
    map_from_entries(list_transform(kvs, lambda a: struct_pack(k := a.key, v := treellm_text(a.value))));
CREATE OR REPLACE TEMP MACRO treellm_list(text) AS CASE WHEN starts_with(text, '{"values"')
    THEN CAST(to_json(list_transform(CAST(coalesce(CAST(text AS JSON)->'values', '[]') AS JSON[]),
                                     lambda x: treellm_scalar(x))) AS VARCHAR)
    ELSE text END;
CREATE OR REPLACE TEMP MACRO treellm_object(text) AS CASE WHEN starts_with(text, '{"values":[{"key"')
    THEN CAST(to_json(map_from_entries(list_transform(CAST(CAST(text AS JSON)->'values' AS JSON[]),
        lambda e: struct_pack(k := e->>'key', v := coalesce(treellm_scalar(e->'value'),
                                                           CAST(e->'value' AS VARCHAR)))))) AS VARCHAR)
    ELSE text END;
"""


def _coalesce(keys: tuple[str, ...] | list[str]) -> str:
    return "coalesce(" + ", ".join(f"a['{k}']" for k in keys) + ")"


# treellm's own spans are read here; spans of other frameworks get the same columns from
# :mod:`treellm.telemetry.conventions` in the ingest's second pass (their role, tool call,
# arguments without schemas, results without envelopes), so only GenAI names are read here.
_PROMOTED = f"""
    a['{sc.GEN_AI_OPERATION_NAME}'] AS operation,
    {_coalesce(conv.AGENT_NAME_KEYS[:2])} AS agent_name,
    {_coalesce(conv.MODEL_KEYS)} AS model,
    a['{sc.RUN_ID}'] AS run_id,
    a['{sc.NODE_ID}'] AS node_id,
    a['{sc.NODE_KIND}'] AS node_kind,
    TRY_CAST(a['{sc.NODE_DEPTH}'] AS INTEGER) AS node_depth,
    nullif(a['{sc.NODE_PARENT_ID}'], '') AS node_parent_id,
    a['{sc.NODE_STATUS}'] AS node_status,
    a['{sc.SKILL_NAME}'] AS skill_name,
    treellm_list(a['{sc.NODE_SKILL_STACK}']) AS skill_stack,
    coalesce(a['{sc.GEN_AI_TOOL_NAME}'],
             CASE WHEN a['{sc.GEN_AI_OPERATION_NAME}'] = '{sc.OP_EXECUTE_TOOL}' AND name LIKE '{sc.OP_EXECUTE_TOOL} %'
                  THEN substr(name, {len(sc.OP_EXECUTE_TOOL) + 2}) END) AS tool_name,
    a['{sc.GEN_AI_TOOL_CALL_ID}'] AS tool_call_id,
    a['{sc.TOOL_SIGNATURE}'] AS signature,
    TRY_CAST(a['{sc.TOOL_ORDINAL}'] AS INTEGER) AS ordinal,
    TRY_CAST(a['{sc.TOOL_LIMIT}'] AS INTEGER) AS limit_n,
    a['{sc.TOOL_LIMIT_SOURCE}'] AS limit_source,
    a['{sc.TOOL_RESULT_HASH}'] AS result_hash,
    TRY_CAST(a['{sc.TOOL_ATTEMPTS}'] AS INTEGER) AS attempts,
    TRY_CAST(a['{sc.TOOL_SHADOW_CAUGHT}'] AS BOOLEAN) AS shadow_caught,
    treellm_object(a['{sc.GEN_AI_TOOL_CALL_ARGUMENTS}']) AS arguments,
    a['{sc.GEN_AI_TOOL_CALL_RESULT}'] AS result,
    TRY_CAST({_coalesce(conv.INPUT_TOKEN_KEYS)} AS BIGINT) AS input_tokens,
    TRY_CAST({_coalesce(conv.OUTPUT_TOKEN_KEYS)} AS BIGINT) AS output_tokens,
    a['{sc.RUN_OUTCOME}'] AS outcome,
    a['{sc.INGEST_ORPHAN_PARENT}'] AS orphan_parent,
    treellm_list(a['{sc.TOOL_EARLIER_NODE_IDS}']) AS earlier_node_ids,
    CAST(NULL AS VARCHAR) AS convention,
    CAST(NULL AS BOOLEAN) AS internal,
    CAST(NULL AS VARCHAR) AS anchor_node_id
"""


# Attributes promoted 1:1 to columns: not repeated in the ``attributes`` MAP.
PROMOTED_KEYS: Final = (
    "gen_ai.operation.name", "gen_ai.agent.name", "gen_ai.request.model", "gen_ai.tool.name",
    "gen_ai.tool.call.id", "gen_ai.tool.call.arguments", "gen_ai.tool.call.result",
    "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
    "treellm.run.id", "treellm.run.outcome", "treellm.node.id", "treellm.node.kind", "treellm.node.depth",
    "treellm.node.parent_id", "treellm.node.status", "treellm.node.skill_stack", "treellm.skill.name",
    "treellm.tool.signature", "treellm.tool.ordinal", "treellm.tool.limit", "treellm.tool.limit_source",
    "treellm.tool.result_hash", "treellm.tool.attempts", "treellm.tool.shadow_caught",
    "treellm.ingest.orphan_parent", "treellm.tool.earlier_node_ids",
)  # fmt: skip
_PROMOTED_LIST = "[" + ", ".join(f"'{k}'" for k in PROMOTED_KEYS) + "]"


def stage_sql(read_expression: str) -> str:
    """A SELECT of stage rows (span columns plus ``events`` and ``links`` lists) from a
    relation with a ``resourceSpans`` column (``read_expression``, e.g. a ``read_json``)."""
    return f"""
WITH docs AS (SELECT unnest(resourceSpans) AS r FROM {read_expression}),
scopes AS (SELECT treellm_attrs(r.resource.attributes) AS res, unnest(r.scopeSpans) AS ss FROM docs),
raw AS (SELECT res, ss.scope AS scope, unnest(ss.spans) AS sp FROM scopes),
flat AS (
    SELECT
        lower(sp.traceId) AS trace_id,
        lower(sp.spanId) AS span_id,
        nullif(lower(sp.parentSpanId), '') AS parent_span_id,
        sp.name AS name,
        sp.kind AS kind,
        CAST(sp.startTimeUnixNano AS BIGINT) AS start_ns,
        CAST(sp.endTimeUnixNano AS BIGINT) AS end_ns,
        coalesce(sp.status.code, 0) AS status_code,
        nullif(sp.status.message, '') AS status_message,
        coalesce(res['service.name'], 'unknown_service') AS service_name,
        treellm_attrs(sp.attributes) AS a,
        CASE WHEN list_contains(list_transform(sp.attributes, lambda kv: kv.key), '{sc.RUN_ID}')
             THEN treellm_attrs(list_filter(sp.attributes, lambda kv: NOT list_contains({_PROMOTED_LIST}, kv.key)))
             ELSE treellm_attrs(sp.attributes) END AS rest,
        res AS resource_attributes,
        scope.name AS scope_name,
        scope.version AS scope_version,
        sp.events AS events,
        sp.links AS links
    FROM raw
)
SELECT
    trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code, status_message,
    service_name, CAST(make_timestamp(start_ns // 1000) AS DATE) AS day, $source AS source,
    {_PROMOTED},
    rest AS attributes, resource_attributes, scope_name, scope_version, events, links
FROM flat
"""


VALIDATE_SQL: Final = validate_sql("stage")
"""A row of the stage that breaks a rule of :mod:`treellm.otlp.validate`, generated from its rule
table (never written here): any row sends the file through the one validator, which decides."""
