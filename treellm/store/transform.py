"""The SQL that flattens OTLP/JSON ``TracesData`` lines into span, event and link rows.

DuckDB parses and unnests the JSON itself (``read_json`` with explicit columns: no
schema-detection pass, no Python loop over spans), maps the attributes of treellm,
the GenAI semantic conventions and OpenInference onto the promoted columns, and keeps
every attribute in a ``MAP(VARCHAR, VARCHAR)``. Pure: functions return SQL text.
"""

from __future__ import annotations

from typing import Final

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

_PROMOTED = """
    coalesce(a['gen_ai.operation.name'],
             CASE upper(a['openinference.span.kind'])
                 WHEN 'TOOL' THEN 'execute_tool' WHEN 'LLM' THEN 'chat' WHEN 'AGENT' THEN 'invoke_agent' END)
        AS operation,
    coalesce(a['gen_ai.agent.name'], a['agent.name']) AS agent_name,
    coalesce(a['gen_ai.request.model'], a['gen_ai.response.model'], a['llm.model_name']) AS model,
    a['treellm.run.id'] AS run_id,
    a['treellm.node.id'] AS node_id,
    a['treellm.node.kind'] AS node_kind,
    TRY_CAST(a['treellm.node.depth'] AS INTEGER) AS node_depth,
    nullif(a['treellm.node.parent_id'], '') AS node_parent_id,
    a['treellm.node.status'] AS node_status,
    a['treellm.skill.name'] AS skill_name,
    treellm_list(a['treellm.node.skill_stack']) AS skill_stack,
    coalesce(a['gen_ai.tool.name'], a['tool.name'],
             CASE WHEN a['gen_ai.operation.name'] = 'execute_tool' AND name LIKE 'execute_tool %'
                  THEN substr(name, 14) END) AS tool_name,
    coalesce(a['gen_ai.tool.call.id'], a['tool_call.id']) AS tool_call_id,
    a['treellm.tool.signature'] AS signature,
    TRY_CAST(a['treellm.tool.ordinal'] AS INTEGER) AS ordinal,
    TRY_CAST(a['treellm.tool.limit'] AS INTEGER) AS limit_n,
    a['treellm.tool.limit_source'] AS limit_source,
    a['treellm.tool.result_hash'] AS result_hash,
    TRY_CAST(a['treellm.tool.attempts'] AS INTEGER) AS attempts,
    TRY_CAST(a['treellm.tool.shadow_caught'] AS BOOLEAN) AS shadow_caught,
    treellm_object(coalesce(a['gen_ai.tool.call.arguments'], a['gen_ai.tool.args'], a['tool.parameters'],
             a['tool_call.function.arguments'],
             CASE WHEN upper(a['openinference.span.kind']) = 'TOOL' THEN a['input.value'] END)) AS arguments,
    coalesce(a['gen_ai.tool.call.result'], a['gen_ai.tool.output'],
             CASE WHEN upper(a['openinference.span.kind']) = 'TOOL' THEN a['output.value'] END) AS result,
    TRY_CAST(coalesce(a['gen_ai.usage.input_tokens'], a['gen_ai.usage.prompt_tokens'],
                      a['llm.token_count.prompt']) AS BIGINT) AS input_tokens,
    TRY_CAST(coalesce(a['gen_ai.usage.output_tokens'], a['gen_ai.usage.completion_tokens'],
                      a['llm.token_count.completion']) AS BIGINT) AS output_tokens,
    a['treellm.run.outcome'] AS outcome,
    a['treellm.ingest.orphan_parent'] AS orphan_parent,
    treellm_list(a['treellm.tool.earlier_node_ids']) AS earlier_node_ids
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
        treellm_attrs(list_filter(sp.attributes, lambda kv: NOT list_contains({_PROMOTED_LIST}, kv.key))) AS rest,
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


VALIDATE_SQL: Final = """
SELECT trace_id, span_id, name, start_ns, end_ns FROM stage
WHERE trace_id IS NULL OR span_id IS NULL OR name IS NULL OR start_ns IS NULL OR end_ns IS NULL
   OR NOT regexp_full_match(trace_id, '[0-9a-f]{32}') OR NOT regexp_full_match(span_id, '[0-9a-f]{16}')
   OR (parent_span_id IS NOT NULL AND NOT regexp_full_match(parent_span_id, '[0-9a-f]{16}'))
   OR trace_id = '00000000000000000000000000000000' OR span_id = '0000000000000000'
   OR kind NOT BETWEEN 0 AND 5 OR status_code NOT BETWEEN 0 AND 2
LIMIT 1
"""
