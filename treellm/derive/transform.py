"""The SQL that flattens OTLP/JSON ``TracesData`` lines into span, event and link rows.

DuckDB parses and unnests the JSON itself (``read_json`` with explicit columns: no
schema-detection pass, no Python loop over spans), maps the attributes of treellm,
the GenAI semantic conventions and OpenInference onto the promoted columns, and keeps
every attribute in a ``MAP(VARCHAR, VARCHAR)``. Pure: functions return SQL text.

Also the SQL of the redaction step (:mod:`treellm.store.ingest` runs it after the placement
of other frameworks' spans): which stored rows it covers, the distinct keys and values it
hands to Python (a prefilter in SQL first), and the updates that write back only what changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

from treellm.otlp.validate import unique_keys_sql, validate_sql
from treellm.telemetry import conventions as conv
from treellm.telemetry import semconv as sc
from treellm.telemetry.redaction import BASE64_WORD_PATTERN, PREFILTER_PATTERN

__all__ = [
    "MACROS",
    "READ_COLUMNS",
    "REDACT_CHANGED_PLACES_SQL",
    "REDACT_KEYS_SQL",
    "REDACT_PLACES",
    "REDACT_RULE_REWRITES",
    "REDACT_TARGETS_SQL",
    "REDACT_TEXT_COLUMNS",
    "RESULT_ATTRIBUTE_KEYS",
    "attribute_result_sql",
    "may_hold_secret_sql",
    "redact_candidates_sql",
    "redact_map_sql",
    "redact_text_sql",
    "result_sql",
    "stage_sql",
]

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


def _get(key: str) -> str:
    """The span attribute ``key``'s text, NULL when the span has none: read from the stage's lists of
    the span's keys (``ak``) and values (``av``), not from a MAP (:func:`stage_sql` says why)."""
    return f"av[list_position(ak, '{key}')]"


def _coalesce(keys: tuple[str, ...] | list[str]) -> str:
    return "coalesce(" + ", ".join(_get(k) for k in keys) + ")"


# treellm's own spans are read here; spans of other frameworks get the same columns from
# :mod:`treellm.telemetry.conventions` in the ingest's second pass (their role, tool call,
# arguments without schemas, results without envelopes), so only GenAI names are read here, and
# the arguments and the result only of a span with treellm's run id: the conventions read another
# framework's from its attributes, and the stage held each result twice (the stage of 300k spans:
# 448 MB, 382 MB without the copies; BENCHMARKS.md, "Batched ingest").
_PROMOTED = f"""
    {_get(sc.GEN_AI_OPERATION_NAME)} AS operation,
    {_coalesce(conv.AGENT_NAME_KEYS[:2])} AS agent_name,
    {_coalesce(conv.MODEL_KEYS)} AS model,
    {_get(sc.RUN_ID)} AS run_id,
    {_get(sc.NODE_ID)} AS node_id,
    {_get(sc.NODE_KIND)} AS node_kind,
    TRY_CAST({_get(sc.NODE_DEPTH)} AS INTEGER) AS node_depth,
    nullif({_get(sc.NODE_PARENT_ID)}, '') AS node_parent_id,
    {_get(sc.NODE_STATUS)} AS node_status,
    {_get(sc.SKILL_NAME)} AS skill_name,
    treellm_list({_get(sc.NODE_SKILL_STACK)}) AS skill_stack,
    coalesce({_get(sc.GEN_AI_TOOL_NAME)},
             CASE WHEN {_get(sc.GEN_AI_OPERATION_NAME)} = '{sc.OP_EXECUTE_TOOL}' AND name LIKE '{sc.OP_EXECUTE_TOOL} %'
                  THEN substr(name, {len(sc.OP_EXECUTE_TOOL) + 2}) END) AS tool_name,
    {_get(sc.GEN_AI_TOOL_CALL_ID)} AS tool_call_id,
    {_get(sc.TOOL_SIGNATURE)} AS signature,
    TRY_CAST({_get(sc.TOOL_ORDINAL)} AS INTEGER) AS ordinal,
    TRY_CAST({_get(sc.TOOL_LIMIT)} AS INTEGER) AS limit_n,
    {_get(sc.TOOL_LIMIT_SOURCE)} AS limit_source,
    {_get(sc.TOOL_RESULT_HASH)} AS result_hash,
    TRY_CAST({_get(sc.TOOL_ATTEMPTS)} AS INTEGER) AS attempts,
    TRY_CAST({_get(sc.TOOL_SHADOW_CAUGHT)} AS BOOLEAN) AS shadow_caught,
    CASE WHEN {_get(sc.RUN_ID)} IS NOT NULL THEN treellm_object({_get(sc.GEN_AI_TOOL_CALL_ARGUMENTS)}) END AS arguments,
    CASE WHEN {_get(sc.RUN_ID)} IS NOT NULL THEN {_get(sc.GEN_AI_TOOL_CALL_RESULT)} END AS result,
    TRY_CAST({_coalesce(conv.INPUT_TOKEN_KEYS)} AS BIGINT) AS input_tokens,
    TRY_CAST({_coalesce(conv.OUTPUT_TOKEN_KEYS)} AS BIGINT) AS output_tokens,
    {_get(sc.RUN_OUTCOME)} AS outcome,
    {_get(sc.INGEST_ORPHAN_PARENT)} AS orphan_parent,
    treellm_list({_get(sc.TOOL_EARLIER_NODE_IDS)}) AS earlier_node_ids,
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
_KEYS_NOT_A_MAP = "the attributes of a span repeat a key or hold one without a name"
"""The stage's refusal of such a span of treellm's own (DuckDB's own, for a MAP: "Map keys must be unique")."""

WRITTEN_BACK: Final = {
    "operation": sc.GEN_AI_OPERATION_NAME, "agent_name": "gen_ai.agent.name", "model": "gen_ai.request.model",
    "run_id": sc.RUN_ID, "node_id": sc.NODE_ID, "node_kind": sc.NODE_KIND, "node_depth": sc.NODE_DEPTH,
    "node_parent_id": sc.NODE_PARENT_ID, "node_status": sc.NODE_STATUS, "skill_name": sc.SKILL_NAME,
    "skill_stack": sc.NODE_SKILL_STACK, "tool_name": sc.GEN_AI_TOOL_NAME, "tool_call_id": sc.GEN_AI_TOOL_CALL_ID,
    "signature": sc.TOOL_SIGNATURE, "ordinal": sc.TOOL_ORDINAL, "limit_n": sc.TOOL_LIMIT,
    "limit_source": sc.TOOL_LIMIT_SOURCE, "result_hash": sc.TOOL_RESULT_HASH, "attempts": sc.TOOL_ATTEMPTS,
    "shadow_caught": sc.TOOL_SHADOW_CAUGHT, "arguments": sc.GEN_AI_TOOL_CALL_ARGUMENTS,
    "result": sc.GEN_AI_TOOL_CALL_RESULT, "input_tokens": "gen_ai.usage.input_tokens",
    "output_tokens": "gen_ai.usage.output_tokens", "outcome": sc.RUN_OUTCOME,
    "orphan_parent": sc.INGEST_ORPHAN_PARENT, "earlier_node_ids": sc.TOOL_EARLIER_NODE_IDS,
}  # fmt: skip
"""The promoted column of treellm's own spans -> the attribute it came from, for writing a stored
span back out as attributes (``ingest --clickhouse``); read again, each gives the same column."""


def stage_sql(read_expression: str) -> str:
    """A SELECT of stage rows (span columns plus ``events`` and ``links`` lists) from a
    relation with a ``resourceSpans`` column (``read_expression``, e.g. a ``read_json``).

    A span's attributes become one MAP, the one stored: building a MAP is most of what they cost
    (DuckDB checks its keys), so the promoted columns read the lists of keys and values instead
    (:func:`_get`). Of treellm's own spans the stored MAP leaves the promoted keys out; that MAP
    would no longer refuse a repeated or unnamed key among them, so the validator's rule for
    unique keys does (:func:`~treellm.otlp.validate.unique_keys_sql`, raised by ``error``), and the
    file goes through the one validator as before (the last value wins). Building both
    MAPs made the stage of 300,000 own spans 1.3-1.9 s slower (BENCHMARKS.md, "Ingest")."""
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
        list_transform(sp.attributes, lambda kv: kv.key) AS ak,
        list_transform(sp.attributes, lambda kv: treellm_text(kv.value)) AS av,
        CASE WHEN NOT list_contains(ak, '{sc.RUN_ID}') THEN map(ak, av)
             WHEN NOT {unique_keys_sql("ak")} THEN error('{_KEYS_NOT_A_MAP}')
             ELSE treellm_attrs(list_filter(sp.attributes, lambda kv: NOT list_contains({_PROMOTED_LIST}, kv.key)))
             END AS rest,
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


# -- a result stored once ----------------------------------------------------------------------------
# A tool call of another framework records its result as an attribute, which ``attributes`` keeps.
# Its ``result`` column holds the result the conventions read only where that differs from the
# attribute (an envelope unwrapped, a result from an event): else it is NULL, and a reader takes
# the attribute through :func:`result_sql`. Held twice, the results made such a store 16-30% larger
# (BENCHMARKS.md, "Batched ingest").

RESULT_ATTRIBUTE_KEYS: Final = tuple(key for key in conv.RESULT_KEYS if key not in conv.EVENT_SOURCES)
"""The span attributes that a result is read from, in the conventions' order (an event's come after them)."""


def attribute_result_sql(alias: str, *, clickhouse: bool = False) -> str:
    """The first of :data:`RESULT_ATTRIBUTE_KEYS` that the attributes of the spans row ``alias``
    hold, else NULL (ClickHouse reads a missing key as '': ``mapContains`` tells them apart)."""
    if clickhouse:
        found = ", ".join(
            f"mapContains({alias}.attributes, '{k}'), {alias}.attributes['{k}']" for k in RESULT_ATTRIBUTE_KEYS
        )
        return f"multiIf({found}, NULL)"
    return "coalesce(" + ", ".join(f"{alias}.attributes['{k}']" for k in RESULT_ATTRIBUTE_KEYS) + ")"


def result_sql(alias: str, *, clickhouse: bool = False) -> str:
    """The result of the spans row ``alias`` as every reader takes it: its ``result`` column, else,
    for a tool call of another framework, the attribute it was read from (:func:`attribute_result_sql`;
    the ingest stores the column NULL only where the attribute holds the result)."""
    return (
        f"CASE WHEN {alias}.convention IS NOT NULL AND {alias}.operation = '{sc.OP_EXECUTE_TOOL}' "
        f"THEN coalesce({alias}.result, {attribute_result_sql(alias, clickhouse=clickhouse)}) "
        f"ELSE {alias}.result END"
    )


VALIDATE_SQL: Final = validate_sql("stage")
"""A row of the stage that breaks a rule of :mod:`treellm.otlp.validate`, generated from its rule
table (never written here): any row sends the file through the one validator, which decides."""


# -- redaction of other frameworks' spans ----------------------------------------------------------
# Runs inside the ingest's transaction, after the placement derived signatures, call keys and
# ordinals from the raw values: it rewrites what is stored, never what was derived from it.

REDACT_PLACES: Final = {
    "attributes": ("spans", "attributes", ()),
    "resource_attributes": ("spans", "resource_attributes", ()),
    "events": ("span_events", "attributes", ("event_index",)),
    "links": ("span_links", "attributes", ("link_index",)),
}
"""Each map of attributes redacted: (table, column, the columns that key a row past the span's)."""

_ENTRIES = " UNION ALL ".join(
    f"SELECT '{place}' AS place, unnest(map_keys({column})) AS k, unnest(map_values({column})) AS v "
    f"FROM {table} SEMI JOIN redact_spans USING (trace_id, span_id)"
    for place, (table, column, _) in REDACT_PLACES.items()
)

REDACT_TARGETS_SQL: Final = f"""
CREATE OR REPLACE TEMP TABLE redact_spans AS
SELECT trace_id, span_id FROM fresh WHERE scope_name IS DISTINCT FROM '{sc.INSTRUMENTATION_NAME}';
CREATE OR REPLACE TEMP TABLE redact_calls AS
SELECT trace_id, span_id FROM redact_spans
UNION
SELECT s.trace_id, s.span_id FROM spans s SEMI JOIN (SELECT DISTINCT trace_id FROM redact_spans) USING (trace_id)
WHERE s.convention IS NOT NULL AND s.scope_name IS DISTINCT FROM '{sc.INSTRUMENTATION_NAME}';
CREATE OR REPLACE TEMP TABLE redact_entries AS
SELECT DISTINCT place, k, v FROM ({_ENTRIES}) WHERE v IS NOT NULL;
"""
"""``redact_spans``: the new spans not from treellm's own instrumentation scope. ``redact_calls``:
those and the stored spans of other frameworks in their traces, whose derived ``arguments`` the
placement may have just rewritten (a call whose parent arrived later takes its arguments from it).
``redact_entries``: every distinct (place, key, value) of the attributes of ``redact_spans``."""


REDACT_KEYS_SQL: Final = "SELECT DISTINCT place, k FROM redact_entries"
"""The distinct keys of each place's maps."""


def may_hold_secret_sql(value: str) -> str:
    """:func:`treellm.telemetry.redaction.may_hold_secret` in SQL over the expression ``value`` (the
    same words, in RE2): true for every text the Python prefilter lets through."""
    return (
        f"(length({value}) >= 8 AND (regexp_matches({value}, '{PREFILTER_PATTERN}') OR "
        f"(lower({value}) <> {value} AND upper({value}) <> {value} AND "
        f"len(list_filter(regexp_extract_all({value}, '{BASE64_WORD_PATTERN}'), "
        "lambda w: lower(w) <> w AND upper(w) <> w)) > 0)))"
    )


REDACT_TEXT_COLUMNS: Final[dict[str, tuple[str, Literal["text", "content", "status"]]]] = {
    "name": ("redact_spans", "text"), "status_message": ("redact_spans", "status"),
    "arguments": ("redact_calls", "content"), "result": ("redact_calls", "content"),
}  # fmt: skip
"""Each span column of text redacted -> (the table of the spans whose values it rewrites, what the
capture takes its values for: :meth:`~treellm.telemetry.redaction.ForeignCapture.rewrite_of`)."""

REDACT_RULE_REWRITES: Final = {"redact": "text", "hash": "hash"}
"""How a value under a key of each rule is rewritten (:meth:`~treellm.telemetry.redaction.ForeignCapture.rewrite`;
a ``mask`` needs no value)."""

_REWRITE_OF_RULE = "CASE {rule} " + " ".join(f"WHEN '{r}' THEN '{h}'" for r, h in REDACT_RULE_REWRITES.items()) + " END"

_ENTRY_RULE = (
    "CASE WHEN {place} = 'resource_attributes' AND rk.rule = 'hash' THEN 'redact' ELSE coalesce(rk.rule, 'redact') END"
)
"""The rule of an entry of the place ``{place}`` whose key's rule is ``rk.rule`` (``redact_keys rk``; absent:
``redact``; a resource attribute is never hashed)."""

_RULED_ENTRIES = f"""
SELECT e.place, e.v, {_ENTRY_RULE.format(place="e.place")} AS rule
FROM redact_entries e LEFT JOIN redact_keys rk ON rk.k = e.k
"""
"""Each distinct entry of ``redact_entries`` with its rule (:data:`_ENTRY_RULE`)."""


def redact_candidates_sql(column_rewrites: Mapping[str, str]) -> str:
    """Every distinct (``how``, ``v``) that the capture may change, each to cross into Python once:
    the values of each column of :data:`REDACT_TEXT_COLUMNS`, rewritten as ``column_rewrites`` says,
    and the values of the maps' entries, rewritten as their keys' rules say
    (:data:`REDACT_RULE_REWRITES`). Redaction (``text``) changes only what may hold a secret, so of
    those only the values that pass :func:`may_hold_secret_sql` (run in DuckDB)."""
    columns = [
        f"SELECT '{how}' AS how, {column} AS v FROM spans SEMI JOIN {REDACT_TEXT_COLUMNS[column][0]} "
        f"USING (trace_id, span_id) WHERE {column} IS NOT NULL"
        for column, how in column_rewrites.items()
    ]
    entries = f"SELECT {_REWRITE_OF_RULE.format(rule='rule')} AS how, v FROM ({_RULED_ENTRIES}) WHERE rule <> 'mask'"
    return (
        f"SELECT DISTINCT how, v FROM ({' UNION ALL '.join([*columns, entries])}) "
        f"WHERE v IS NOT NULL AND (how <> 'text' OR {may_hold_secret_sql('v')})"
    )


REDACT_CHANGED_PLACES_SQL: Final = f"""
SELECT DISTINCT e.place FROM ({_RULED_ENTRIES}) e
SEMI JOIN redact_done d ON d.how = {_REWRITE_OF_RULE.format(rule="e.rule")} AND d.v = e.v
"""
"""The places of :data:`REDACT_PLACES` with an entry whose value ``redact_done(how, v, r)`` rewrites."""


def redact_text_sql(column: str, how: str) -> str:
    """Write the rewrites ``how`` of ``redact_done(how, v, r)`` into ``column`` of the targeted spans."""
    targets, _ = REDACT_TEXT_COLUMNS[column]
    return f"""
UPDATE spans SET {column} = u.r
FROM (SELECT s.trace_id, s.span_id, t.r FROM spans s SEMI JOIN {targets} USING (trace_id, span_id)
      JOIN redact_done t ON t.how = '{how}' AND t.v = s.{column}) u
WHERE spans.trace_id = u.trace_id AND spans.span_id = u.span_id
"""


def redact_map_sql(place: str, *, mask: str) -> str:
    """Rebuild the maps of ``place`` (:data:`REDACT_PLACES`) that change: each entry's rule is
    :data:`_ENTRY_RULE`, its value's rewrite from ``redact_done(how, v, r)`` (absent: unchanged)
    or ``mask`` for a masked key."""
    table, column, index = REDACT_PLACES[place]
    keys = ", ".join(("trace_id", "span_id", *index))
    rule = _ENTRY_RULE.format(place=f"'{place}'")
    where = " AND ".join(f"{table}.{key} = u.{key}" for key in ("trace_id", "span_id", *index))
    return f"""
UPDATE {table} SET {column} = u.m FROM (
    SELECT {keys}, map_from_entries(list(struct_pack(k := k, v := v) ORDER BY i)) AS m
    FROM (
        SELECT {keys}, e.i, e.k, CASE WHEN e.rule = 'mask' THEN '{mask}' ELSE coalesce(x.r, e.v) END AS v,
               e.rule = 'mask' OR x.r IS NOT NULL AS changed
        FROM (
            SELECT e.*, {rule} AS rule
            FROM (SELECT {keys}, generate_subscripts(map_keys({column}), 1) AS i,
                         unnest(map_keys({column})) AS k, unnest(map_values({column})) AS v
                  FROM {table} SEMI JOIN redact_spans USING (trace_id, span_id)) e
            LEFT JOIN redact_keys rk ON rk.k = e.k
        ) e
        LEFT JOIN redact_done x ON x.how = {_REWRITE_OF_RULE.format(rule="e.rule")} AND x.v = e.v
    )
    GROUP BY ALL HAVING bool_or(changed)
) u
WHERE {where}
"""
