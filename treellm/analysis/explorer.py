"""What the dashboard browses, read from the views: filter choices, the run list (sorted,
filtered, searched), one run's nodes, spans and caught calls, a think node's chat, the
actions taken per tool, and a version stamp of the data.

Every function takes a store connection (DuckDB, Parquet through DuckDB, or ClickHouse:
``treellm.store.backend.StoreConnection``) and reads the views and the ``spans`` relation
only, never files; where the dialects differ each query keeps a DuckDB and a ClickHouse
text side by side. Pure functions of the connection: no caching, no connection opened.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd

from treellm.analysis.filters import Filters
from treellm.analysis.measures import CLICKHOUSE_SETTINGS, REPEATS_SQL
from treellm.derive.transform import result_sql
from treellm.store.backend import Connection, StoreConnection, as_connection
from treellm.store.clickhouse_views import DERIVED_SPANS

__all__ = [
    "RUN_SORTS",
    "RUN_TABLE_COLUMNS",
    "ChatMessage",
    "ChatRole",
    "DataVersion",
    "FilterOptions",
    "RunQuery",
    "RunSort",
    "actions_by_tool",
    "attribute_text",
    "chat_messages",
    "data_version",
    "filter_options",
    "id_list_text",
    "like_pattern",
    "node_attributes",
    "outcomes",
    "run_detail",
    "run_list",
    "run_loop_events",
    "run_nodes",
    "run_row",
    "run_spans",
    "run_traces",
    "run_table",
    "think_chat",
]


@dataclass(frozen=True, slots=True)
class FilterOptions:
    """The values the filters can take: services, agents and models of the runs (sorted),
    the tools called, and the first and last run start (ns since the epoch; None: no run)."""

    services: tuple[str, ...]
    agents: tuple[str, ...]
    models: tuple[str, ...]
    tools: tuple[str, ...]
    first_ns: int | None
    last_ns: int | None


@dataclass(frozen=True, slots=True)
class DataVersion:
    """A stamp that changes whenever the stored spans do: how many there are and the
    earliest start and latest end (ns). An ingest adds spans; a gc removes them."""

    spans: int
    first_start_ns: int | None
    last_end_ns: int | None


def _int(value: Any) -> int | None:
    return None if value is None or pd.isna(value) else int(value)


def data_version(con: StoreConnection) -> DataVersion:
    """The :class:`DataVersion` of the data behind ``con``: one aggregate over ``spans``; over
    ClickHouse, over the rows of ``treellm_spans`` as written, without ``FINAL`` (every derive
    pass adds rows, so the stamp changes whenever one writes; ClickHouse answers from its parts'
    counts and minmax indexes, in milliseconds where the view took 0.4 s at 10M spans)."""
    c = as_connection(con)
    table = DERIVED_SPANS if c.dialect == "clickhouse" else "spans"
    frame = c.df(f"SELECT count(*) AS spans, min(start_ns) AS first, max(end_ns) AS last FROM {table}")
    spans = int(frame["spans"].iloc[0])  # column by column: a row of mixed ints would become floats
    if not spans:
        return DataVersion(0, None, None)
    return DataVersion(spans, _int(frame["first"].iloc[0]), _int(frame["last"].iloc[0]))


def _texts(values: pd.Series) -> tuple[str, ...]:
    return tuple(sorted({str(v) for v in values.dropna()}))


def filter_options(con: StoreConnection) -> FilterOptions:
    """The choices of the dashboard's filters (two small queries: runs grouped, tools)."""
    c = as_connection(con)
    runs = c.df(
        "SELECT r.service AS service, r.agent AS agent, r.model AS model, min(r.start_ns) AS first, "
        "max(r.start_ns) AS last FROM runs r GROUP BY r.service, r.agent, r.model"
    )
    tools = c.df("SELECT DISTINCT t.tool AS tool FROM tool_calls t WHERE t.tool IS NOT NULL")
    has_runs = len(runs) > 0
    return FilterOptions(
        services=_texts(runs["service"]),
        agents=_texts(runs["agent"]),
        models=_texts(runs["model"]),
        tools=_texts(tools["tool"]),
        first_ns=_int(runs["first"].min()) if has_runs else None,
        last_ns=_int(runs["last"].max()) if has_runs else None,
    )


def run_list(con: StoreConnection, filters: Filters | None = None, *, limit: int = 500) -> pd.DataFrame:
    """The latest ``limit`` runs of the selection (the ``runs`` view's columns), newest first."""
    if limit < 1:
        raise ValueError(f"expected a limit >= 1, got {limit}")
    where, params = (filters or Filters()).run_condition("r")
    return as_connection(con).df(
        f"SELECT * FROM runs r WHERE {where} ORDER BY r.start_ns DESC, r.run_id LIMIT {int(limit)}", params
    )


def run_row(con: StoreConnection, run_id: str) -> pd.DataFrame:
    """The ``runs`` row of one run (empty when the store has no such run)."""
    return as_connection(con).df("SELECT * FROM runs r WHERE r.run_id = ?", [run_id])


def run_detail(con: StoreConnection, run_id: str) -> dict[str, pd.DataFrame]:
    """One run as the run explorer shows it: its ``runs`` row (``run``), :func:`run_nodes`
    (``nodes``), :func:`run_loop_events` (``loops``) and :func:`run_spans` (``spans``), its trace
    found once (each query finding it again cost 0.1 s of the 0.4-0.5 s of a run at 10M spans over
    chDB). Empty frames when the store has no such run."""
    row = run_row(con, run_id)
    found = run_traces(row) or None  # a run id that two traces hold (ids reused across agents) reads both
    return {
        "run": row,
        "nodes": run_nodes(con, run_id, trace_ids=found),
        "loops": run_loop_events(con, run_id, trace_ids=found),
        "spans": run_spans(con, run_id, trace_ids=found),
    }


def run_traces(run: pd.DataFrame) -> tuple[str, ...]:
    """The traces that hold a run, from its ``runs`` rows (:func:`run_row`, ``run_detail(...)["run"]``):
    each once, in order; none for a run the store does not have."""
    return tuple(dict.fromkeys(str(t) for t in run["trace_id"])) if "trace_id" in run.columns else ()


_NODE_COLUMNS = """n.node_id AS node_id, n.kind AS kind, n.parent_id AS parent_id, n.depth AS depth,
       n.status AS status, n.tool AS tool, n.signature AS signature, n.ordinal AS ordinal, n.{limit} AS {limit},
       n.limit_source AS limit_source, n.result_hash AS result_hash, n.attempts AS attempts,
       n.skill_stack AS skill_stack, n.start_ns AS start_ns, n.end_ns AS end_ns, s.name AS span_name,
       s.arguments AS arguments, s.result AS result, s.input_tokens AS input_tokens,
       s.output_tokens AS output_tokens, {text} AS text, s.span_id AS span_id"""

_RUN_NODES_SQL = f"""
SELECT {_NODE_COLUMNS.format(limit='"limit"', text="s.attributes['treellm.think.text']")}
FROM nodes n
JOIN (SELECT x.trace_id, x.span_id, x.name, x.arguments, {result_sql("x")} AS result, x.input_tokens,
             x.output_tokens, x.attributes
      FROM spans x WHERE {{in_run_x}}) s USING (trace_id, span_id)
WHERE {{in_run_n}}
ORDER BY n.start_ns, n.node_id
"""

# ClickHouse: a missing Map key reads '' (so mapContains makes it NULL), and `limit` is quoted.
_RUN_NODES_SQL_CLICKHOUSE = _RUN_NODES_SQL.replace(
    _NODE_COLUMNS.format(limit='"limit"', text="s.attributes['treellm.think.text']"),
    _NODE_COLUMNS.format(
        limit="`limit`",
        text="if(mapContains(s.attributes, 'treellm.think.text'), s.attributes['treellm.think.text'], NULL)",
    ),
).replace(result_sql("x"), result_sql("x", clickhouse=True))


def _in_run(c: Connection, alias: str, run_id: str, trace_ids: Sequence[str] | None = None) -> tuple[str, list[Any]]:
    """The condition that a row (aliased ``alias``) belongs to the run, with its parameters. Over
    ClickHouse it also names the run's traces (``trace_ids`` when the caller knows them, else a
    lookup in ``runs``), the key of every derived table (``ORDER BY (trace_id, ...)``), so a run's rows are
    read from its trace's granules, not from a scan of every trace; ``treellm derive`` derives a
    trace's runs from that trace alone, so a run there lies in one trace."""
    if c.dialect == "clickhouse" and trace_ids:
        marks = ", ".join("?" for _ in trace_ids)
        return f"{alias}.trace_id IN ({marks}) AND {alias}.run_id = ?", [*trace_ids, run_id]
    if c.dialect == "clickhouse":
        return (
            f"{alias}.trace_id IN (SELECT r.trace_id FROM runs r WHERE r.run_id = ?) AND {alias}.run_id = ?",
            [run_id, run_id],
        )
    return f"{alias}.run_id = ?", [run_id]


def run_nodes(con: StoreConnection, run_id: str, *, trace_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """One run's nodes in start order, with the captured content of their spans (arguments,
    result, model text) and the span's name and token counts; ``trace_ids``: the run's, when known."""
    c = as_connection(con)
    sql = _RUN_NODES_SQL_CLICKHOUSE if c.dialect == "clickhouse" else _RUN_NODES_SQL
    in_run_x, params_x = _in_run(c, "x", run_id, trace_ids)
    in_run_n, params_n = _in_run(c, "n", run_id, trace_ids)
    return c.df(sql.format(in_run_x=in_run_x, in_run_n=in_run_n), [*params_x, *params_n])


_RUN_LOOPS_SQL = """
SELECT l.node_id AS node_id, l.tool AS tool, l.signature AS signature, l.{count} AS {count}, l.{limit} AS {limit},
       l.limit_source AS limit_source, l.action AS action, l.shadow AS shadow, l.arguments AS arguments,
       l.earlier_node_ids_raw AS earlier_node_ids, l.time_ns AS time_ns
FROM loop_events l WHERE {in_run} ORDER BY l.time_ns
"""


def id_list_text(raw: object) -> str | None:
    """The earlier node ids of a caught call as a compact JSON list (pure). The stores keep
    the array attribute as they received it: OTLP JSON (``{"values": [{"stringValue": ...}]}``)
    in DuckDB, the Collector exporter's JSON list in ClickHouse; both read the same here."""
    if not isinstance(raw, str):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    if isinstance(value, dict):
        value = [v.get("stringValue") for v in value.get("values", []) if isinstance(v, dict)]
    if not isinstance(value, list):
        return raw
    return json.dumps([str(v) for v in value if v is not None], separators=(",", ":"), ensure_ascii=False)


def run_loop_events(con: StoreConnection, run_id: str, *, trace_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """One run's caught calls (``loop:detected`` events) in time order; ``earlier_node_ids``
    is a JSON list of node ids and ``shadow`` a bool on every engine; ``trace_ids``: the run's, when known."""
    c = as_connection(con)
    quote = "`" if c.dialect == "clickhouse" else '"'
    in_run, params = _in_run(c, "l", run_id, trace_ids)
    sql = _RUN_LOOPS_SQL.format(count=f"{quote}count{quote}", limit=f"{quote}limit{quote}", in_run=in_run)
    frame = c.df(sql, params)
    frame["earlier_node_ids"] = frame["earlier_node_ids"].map(id_list_text).astype(object)
    frame["shadow"] = frame["shadow"].astype(bool)
    return frame


def actions_by_tool(con: StoreConnection, filters: Filters | None = None) -> pd.DataFrame:
    """Caught calls per tool, action and shadow flag (a bool on every engine), the most frequent first."""
    where, params = (filters or Filters()).where("l")
    frame = as_connection(con).df(
        f"""SELECT l.tool AS tool, l.action AS action, l.shadow AS shadow, count(*) AS calls
            FROM loop_events l WHERE {where}
            GROUP BY l.tool, l.action, l.shadow ORDER BY calls DESC, tool, action, shadow""",
        params,
    )
    frame["shadow"] = frame["shadow"].astype(bool)
    return frame


# -- the run list: sortable, filterable, searchable ---------------------------------------------------

RunSort = Literal["start", "duration", "calls", "wasted", "pruned", "nodes"]
RUN_SORTS: tuple[RunSort, ...] = ("start", "duration", "calls", "wasted", "pruned", "nodes")
"""What the run list sorts by: start time, duration, executed tool calls, wasted repeats,
pruned calls, nodes."""
_SORT_COLUMNS: dict[str, str] = {
    "start": "start_ns", "duration": "duration_ns", "calls": "calls", "wasted": "wasted", "pruned": "pruned",
    "nodes": "nodes",
}  # fmt: skip
RUN_TABLE_COLUMNS = (
    "run_id", "start_ns", "outcome", "service", "agent", "model", "duration_ns", "calls", "wasted", "pruned", "nodes",
    "matching",
)  # fmt: skip
"""The columns of :func:`run_table`, in order (``matching``: how many runs match, whatever the limit)."""


@dataclass(frozen=True, slots=True)
class RunQuery:
    """Which runs the run list shows and in what order, beyond the shared :class:`Filters`:
    ``text`` found (case-insensitive, as a plain substring) in the run's id, its trace id or the
    file it was ingested from, in a tool call's captured arguments or result or in a caught
    call's arguments; an ``outcome``; the sort key and
    direction; and at most ``limit`` rows. Invalid values raise ``ValueError``."""

    text: str | None = None
    outcome: str | None = None
    sort: RunSort = "start"
    descending: bool = True
    limit: int = 500

    def __post_init__(self) -> None:
        if self.sort not in RUN_SORTS:
            raise ValueError(f"expected a sort key among {', '.join(RUN_SORTS)}, got {self.sort!r}")
        if self.limit < 1:
            raise ValueError(f"expected a limit >= 1, got {self.limit}")


def like_pattern(text: str) -> str:
    """``text`` as an ``ILIKE`` pattern that matches it as a plain substring (pure): ``\\``,
    ``%`` and ``_`` escaped with a backslash, the escape character of both dialects' text."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


_RUN_TABLE_SQL = """
WITH wasted_runs AS (
    SELECT x.run_id AS run_id, count(*) AS wasted FROM ({repeats}) x WHERE x.outcome = 'wasted' GROUP BY x.run_id
)
SELECT r.run_id AS run_id, r.start_ns AS start_ns, r.outcome AS outcome, r.service AS service, r.agent AS agent,
       r.model AS model, r.duration_ns AS duration_ns, r.tool_nodes AS calls, coalesce(w.wasted, 0) AS wasted,
       r.pruned_calls AS pruned, r.nodes AS nodes, count(*) OVER () AS matching
FROM runs r LEFT JOIN wasted_runs w ON w.run_id = r.run_id
WHERE {where}
ORDER BY {sort} {direction} NULLS LAST, r.run_id
LIMIT {limit}
"""

# The text search: the run's own ids and the file it came from, then a semi-join on the spans
# (tool calls) and on the caught calls. DuckDB's LIKE has no escape character unless it is named;
# ClickHouse's is the backslash, always.
_TEXT_MATCH = """(r.run_id ILIKE ?{escape} OR r.trace_id ILIKE ?{escape} OR r.source ILIKE ?{escape} OR r.run_id IN (
    SELECT s.run_id FROM spans s
    WHERE s.run_id IS NOT NULL AND s.tool_name IS NOT NULL AND (s.arguments ILIKE ?{escape} OR {result} ILIKE ?{escape})
    UNION ALL
    SELECT l.run_id FROM loop_events l WHERE l.arguments ILIKE ?{escape}))"""


def run_table(con: StoreConnection, filters: Filters | None = None, query: RunQuery | None = None) -> pd.DataFrame:
    """The runs of the selection that match ``query`` (:data:`RUN_TABLE_COLUMNS`), sorted by
    its key (ties by run id), at most ``query.limit`` rows. ``wasted`` counts the run's
    executed repeats judged wasted (``analysis.measures``: the overview's count, per run);
    a tool in ``filters`` keeps the runs that called it. Values reach the SQL as parameters."""
    f, q = filters or Filters(), query or RunQuery()
    c = as_connection(con)
    clickhouse = c.dialect == "clickhouse"
    runs_only = Filters(f.since, f.until, f.service, f.agent, f.model)
    repeat_where, params = runs_only.where("c", tool_column=None)
    where, run_params = runs_only.run_condition("r")
    clauses, params = [where], [*params, *run_params]
    if f.tool is not None:
        clauses.append("r.run_id IN (SELECT s.run_id FROM spans s WHERE s.tool_name = ?)")
        params.append(f.tool)
    if q.outcome is not None:
        clauses.append("r.outcome = ?")
        params.append(q.outcome)
    if q.text:
        clauses.append(
            _TEXT_MATCH.format(
                escape="" if clickhouse else " ESCAPE '\\'", result=result_sql("s", clickhouse=clickhouse)
            )
        )
        params += [like_pattern(q.text)] * _TEXT_MATCH.count("?")  # each place takes the pattern
    sql = _RUN_TABLE_SQL.format(
        repeats=REPEATS_SQL.format(where=repeat_where), where=" AND ".join(clauses), sort=_SORT_COLUMNS[q.sort],
        direction="DESC" if q.descending else "ASC", limit=int(q.limit),
    )  # fmt: skip
    frame = c.df(sql + (CLICKHOUSE_SETTINGS if clickhouse else ""), params)
    for column in ("calls", "wasted", "pruned", "nodes", "matching"):
        frame[column] = frame[column].astype("int64")
    return frame[list(RUN_TABLE_COLUMNS)]


def outcomes(con: StoreConnection) -> tuple[str, ...]:
    """The outcomes the runs have (sorted)."""
    return _texts(as_connection(con).df("SELECT DISTINCT r.outcome AS outcome FROM runs r")["outcome"])


# -- one run's spans (the waterfall) and one node's stored attributes (the chat) ----------------------

_RUN_SPANS_SQL = """
SELECT s.span_id AS span_id, s.parent_span_id AS parent_span_id, s.name AS name, s.operation AS operation,
       CASE WHEN s.node_kind IS NOT NULL OR s.operation IN ('execute_tool', 'chat')
            THEN coalesce(s.node_id, s.span_id) END AS node_id,
       coalesce(s.node_kind, CASE s.operation WHEN 'execute_tool' THEN 'tool' WHEN 'chat' THEN 'think' END) AS kind,
       s.tool_name AS tool, s.start_ns AS start_ns, s.end_ns AS end_ns,
       CASE WHEN s.status_code = 2 OR s.node_status = 'failed' THEN 'failed' ELSE 'ok' END AS status
FROM spans s WHERE {in_run}
ORDER BY s.start_ns, s.span_id
"""


def run_spans(con: StoreConnection, run_id: str, *, trace_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """Every span of one run in start order, for a waterfall: ids, name, operation, node id
    and kind (None: not a node), tool, start and end (ns) and ``ok``/``failed``; ``trace_ids``: the
    run's, when known."""
    c = as_connection(con)
    in_run, params = _in_run(c, "s", run_id, trace_ids)
    return c.df(_RUN_SPANS_SQL.format(in_run=in_run), params)


_NODE_ATTRIBUTES_SQL = """
SELECT a.key AS key, a.value AS value FROM (
    SELECT unnest(map_keys(s.attributes)) AS key, unnest(map_values(s.attributes)) AS value
    FROM spans s WHERE {in_run} AND coalesce(s.node_id, s.span_id) = ?
) a ORDER BY a.key
"""
_NODE_ATTRIBUTES_SQL_CLICKHOUSE = """
SELECT k AS key, v AS value
FROM spans s ARRAY JOIN mapKeys(s.attributes) AS k, mapValues(s.attributes) AS v
WHERE {in_run} AND coalesce(s.node_id, s.span_id) = ?
ORDER BY key
"""


_ANY_VALUE_KEYS = frozenset({"stringValue", "boolValue", "intValue", "doubleValue", "arrayValue"})


def _any_value(value: Any) -> Any:
    if "intValue" in value:
        return int(value["intValue"])
    if "arrayValue" in value:
        return [_any_value(v) for v in value["arrayValue"].get("values", []) if isinstance(v, dict)]
    return next(iter(value.values()))


def attribute_text(raw: str) -> str:
    """An attribute's stored text as the Collector's exporter writes it (pure): an array kept
    as OTLP JSON (``{"values": [{"stringValue": "a"}]}``, as DuckDB stores it) becomes the
    compact JSON list (``["a"]``) that ClickHouse holds; any other text is returned as is."""
    if not raw.startswith('{"values":'):
        return raw
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    items = value.get("values") if isinstance(value, dict) and len(value) == 1 else None
    if not isinstance(items, list) or not all(isinstance(v, dict) and len(v) == 1 and set(v) <= _ANY_VALUE_KEYS
                                              for v in items):  # fmt: skip
        return raw
    return json.dumps([_any_value(v) for v in items], separators=(",", ":"), ensure_ascii=False)


def node_attributes(
    con: StoreConnection, run_id: str, node_id: str, *, trace_ids: Sequence[str] | None = None
) -> pd.DataFrame:
    """The stored attributes (``key``, ``value``, by key) of one node's span: redacted as the
    store keeps them, arrays as JSON lists on every engine (:func:`attribute_text`);
    ``trace_ids``: the run's, when known (:func:`run_traces`)."""
    c = as_connection(con)
    sql = _NODE_ATTRIBUTES_SQL_CLICKHOUSE if c.dialect == "clickhouse" else _NODE_ATTRIBUTES_SQL
    in_run, params = _in_run(c, "s", run_id, trace_ids)
    frame = c.df(sql.format(in_run=in_run), [*params, node_id])
    frame["value"] = frame["value"].map(lambda v: attribute_text(v) if isinstance(v, str) else v).astype(object)
    return frame


# -- a think node as a chat (pure) --------------------------------------------------------------------

ChatRole = Literal["system", "user", "assistant", "tool", "caught"]
_ROLES: dict[str, ChatRole] = {
    "system": "system", "developer": "system", "user": "user", "human": "user", "assistant": "assistant",
    "ai": "assistant", "model": "assistant", "tool": "tool", "function": "tool", "ipython": "tool",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One line of a think node's chat: a message's ``text``, or a tool call (``tool`` and its
    ``arguments``; ``text`` is then its result, or for a caught call what was done).
    ``role`` is one of :data:`ChatRole`; ``stored_role`` the role as the trace spelled it;
    ``status`` a tool call's status (``completed``, ``failed``) or a caught call's action."""

    role: ChatRole
    text: str = ""
    tool: str | None = None
    arguments: str | None = None
    stored_role: str = ""
    status: str | None = None


def _role(value: object, default: ChatRole = "user") -> tuple[ChatRole, str]:
    stored = "" if value is None else str(value)
    return _ROLES.get(stored.lower(), default), stored


_OPENINFERENCE = re.compile(r"llm\.(input|output)_messages\.(\d+)\.message\.(.+)")
_TRACELOOP = re.compile(r"gen_ai\.(prompt|completion)\.(\d+)\.(.+)")
_CALL_FIELD = re.compile(r"tool_calls\.(\d+)\.(?:tool_call\.)?(?:function\.)?(name|arguments)")


def _indexed(attributes: Mapping[str, str], pattern: re.Pattern[str]) -> list[tuple[str, dict[str, str]]]:
    """Flattened messages (``prefix.N.field``) gathered per (side, N), inputs first, by N."""
    grouped: dict[tuple[str, int], dict[str, str]] = {}
    for key, value in attributes.items():
        match = pattern.fullmatch(key)
        if match:
            grouped.setdefault((match[1], int(match[2])), {})[match[3]] = value
    order = {"input": 0, "prompt": 0, "output": 1, "completion": 1}
    return [(side, fields) for (side, _), fields in sorted(grouped.items(), key=lambda i: (order[i[0][0]], i[0][1]))]


def _flat_messages(attributes: Mapping[str, str], pattern: re.Pattern[str]) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    for side, fields in _indexed(attributes, pattern):
        role, stored = _role(fields.get("role"), "assistant" if side in ("output", "completion") else "user")
        text = fields.get("content") or "\n".join(
            v for k, v in sorted(fields.items()) if re.fullmatch(r"contents\.\d+\.message_content\.text", k)
        )
        if text:
            out.append(ChatMessage(role, text, stored_role=stored))
        calls: dict[int, dict[str, str]] = {}
        for key, value in fields.items():
            match = _CALL_FIELD.fullmatch(key)
            if match:
                calls.setdefault(int(match[1]), {})[match[2]] = value
        out += [ChatMessage(role, "", c.get("name", "?"), c.get("arguments"), stored) for _, c in sorted(calls.items())]
    return out


def _text_of(value: object) -> str:
    if isinstance(value, str):
        return value
    return "" if value is None else json.dumps(value, ensure_ascii=False)


def _json_messages(raw: str, default: ChatRole) -> list[ChatMessage]:
    """GenAI's JSON messages (``gen_ai.input.messages``, ``gen_ai.output.messages``): a role
    with ``parts`` (text, tool calls, tool call responses) or a ``content``; text that is no
    such JSON is one message of ``default``'s role."""
    try:
        value = json.loads(raw)
    except ValueError:
        return [ChatMessage(default, raw)]
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        return [ChatMessage(default, _text_of(value))]
    out: list[ChatMessage] = []
    for item in value:
        if not isinstance(item, dict):
            out.append(ChatMessage(default, _text_of(item)))
            continue
        if "tool.name" in item:  # any-agent's gen_ai.output: the calls the model asked for
            out.append(ChatMessage("assistant", "", str(item["tool.name"]), _text_of(item.get("tool.args"))))
            continue
        role, stored = _role(item.get("role"), default)
        parts = item.get("parts")
        if not isinstance(parts, list):
            parts = [{"type": "text", "content": item.get("content")}]
            parts += [c.get("function", c) for c in item.get("tool_calls") or [] if isinstance(c, dict)]
        for part in parts:
            if not isinstance(part, dict):
                continue
            if part.get("type") in ("tool_call", "function") or "arguments" in part:
                out.append(ChatMessage(role, "", str(part.get("name", "?")), _text_of(part.get("arguments")), stored))
            elif part.get("type") == "tool_call_response":
                out.append(ChatMessage("tool", _text_of(part.get("response")), stored_role=stored))
            elif part.get("content") is not None:
                out.append(ChatMessage(role, _text_of(part["content"]), stored_role=stored))
    return out


def chat_messages(attributes: Mapping[str, str]) -> tuple[ChatMessage, ...]:
    """A think node's messages, read from its span's stored attributes (pure): OpenInference's
    ``llm.input_messages`` / ``llm.output_messages``, GenAI's ``gen_ai.system_instructions``,
    ``gen_ai.input.messages`` and ``gen_ai.output.messages`` (JSON), Traceloop's and older
    GenAI's ``gen_ai.prompt.N`` / ``gen_ai.completion.N``, any-agent's ``gen_ai.output``, and
    treellm's ``treellm.think.text``: the first convention found; texts as stored."""
    for pattern in (_OPENINFERENCE, _TRACELOOP):
        flat = _flat_messages(attributes, pattern)
        if flat:
            return tuple(flat)
    out: list[ChatMessage] = []
    if "gen_ai.system_instructions" in attributes:
        out += _json_messages(attributes["gen_ai.system_instructions"], "system")
    if "gen_ai.input.messages" in attributes:
        out += _json_messages(attributes["gen_ai.input.messages"], "user")
    for key in ("gen_ai.output.messages", "gen_ai.output"):
        if key in attributes:
            out += _json_messages(attributes[key], "assistant")
            break
    else:
        if attributes.get("treellm.think.text"):
            out.append(ChatMessage("assistant", attributes["treellm.think.text"]))
    return tuple(out)


def think_chat(attributes: Mapping[str, str], nodes: pd.DataFrame, loops: pd.DataFrame, node_id: str) -> tuple[
    ChatMessage, ...
]:  # fmt: skip
    """The chat of think node ``node_id`` (pure): its messages (:func:`chat_messages`), then
    each tool call it made that ran (``nodes``, as :func:`run_nodes` gives them: arguments
    and result as stored) and each call of it that was caught (``loops``, as
    :func:`run_loop_events` gives them: the action taken)."""
    out = list(chat_messages(attributes))
    if not nodes.empty:
        calls = nodes[(nodes["parent_id"] == node_id) & (nodes["kind"] == "tool")]
        for row in calls.itertuples(index=False):
            result = row.result if isinstance(row.result, str) else ""
            arguments = row.arguments if isinstance(row.arguments, str) else None
            out.append(ChatMessage("tool", result, str(row.tool), arguments, status=str(row.status)))
    if not loops.empty:
        for row in loops[loops["node_id"] == node_id].itertuples(index=False):
            shadow = " (shadow: it ran)" if row.shadow else ""
            what = f"{row.action}{shadow}: count {row.count} reached the limit {row.limit} ({row.limit_source})"
            arguments = row.arguments if isinstance(row.arguments, str) else None
            out.append(ChatMessage("caught", what, str(row.tool), arguments, status=str(row.action)))
    return tuple(out)
