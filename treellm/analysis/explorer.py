"""What the dashboard browses, read from the views: filter choices, the run list, one run's
nodes and caught calls, the actions taken per tool, and a version stamp of the data.

Every function takes a store connection (DuckDB, Parquet through DuckDB, or ClickHouse:
``treellm.store.engine.StoreConnection``) and reads the views and the ``spans`` relation
only, never files; where the dialects differ each query keeps a DuckDB and a ClickHouse
text side by side. Pure functions of the connection: no caching, no connection opened.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pandas as pd

from treellm.analysis.filters import Filters
from treellm.store.engine import StoreConnection, as_connection

__all__ = [
    "DataVersion",
    "FilterOptions",
    "actions_by_tool",
    "data_version",
    "filter_options",
    "id_list_text",
    "run_list",
    "run_loop_events",
    "run_nodes",
    "run_row",
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
    """The :class:`DataVersion` of the data behind ``con`` (one aggregate over ``spans``)."""
    frame = as_connection(con).df("SELECT count(*) AS spans, min(start_ns) AS first, max(end_ns) AS last FROM spans")
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


_NODE_COLUMNS = """n.node_id AS node_id, n.kind AS kind, n.parent_id AS parent_id, n.depth AS depth,
       n.status AS status, n.tool AS tool, n.signature AS signature, n.ordinal AS ordinal, n.{limit} AS {limit},
       n.limit_source AS limit_source, n.result_hash AS result_hash, n.attempts AS attempts,
       n.skill_stack AS skill_stack, n.start_ns AS start_ns, n.end_ns AS end_ns, s.name AS span_name,
       s.arguments AS arguments, s.result AS result, s.input_tokens AS input_tokens,
       s.output_tokens AS output_tokens, {text} AS text, s.span_id AS span_id"""

_RUN_NODES_SQL = f"""
SELECT {_NODE_COLUMNS.format(limit='"limit"', text="s.attributes['treellm.think.text']")}
FROM nodes n
JOIN (SELECT trace_id, span_id, name, arguments, result, input_tokens, output_tokens, attributes
      FROM spans WHERE run_id = ?) s USING (trace_id, span_id)
WHERE n.run_id = ?
ORDER BY n.start_ns, n.node_id
"""

# ClickHouse: a missing Map key reads '' (so mapContains makes it NULL), and `limit` is quoted.
_RUN_NODES_SQL_CLICKHOUSE = _RUN_NODES_SQL.replace(
    _NODE_COLUMNS.format(limit='"limit"', text="s.attributes['treellm.think.text']"),
    _NODE_COLUMNS.format(
        limit="`limit`",
        text="if(mapContains(s.attributes, 'treellm.think.text'), s.attributes['treellm.think.text'], NULL)",
    ),
)


def run_nodes(con: StoreConnection, run_id: str) -> pd.DataFrame:
    """One run's nodes in start order, with the captured content of their spans (arguments,
    result, model text) and the span's name and token counts."""
    c = as_connection(con)
    sql = _RUN_NODES_SQL_CLICKHOUSE if c.dialect == "clickhouse" else _RUN_NODES_SQL
    return c.df(sql, [run_id, run_id])


_RUN_LOOPS_SQL = """
SELECT l.node_id AS node_id, l.tool AS tool, l.signature AS signature, l.{count} AS {count}, l.{limit} AS {limit},
       l.limit_source AS limit_source, l.action AS action, l.shadow AS shadow, l.arguments AS arguments,
       l.earlier_node_ids_raw AS earlier_node_ids, l.time_ns AS time_ns
FROM loop_events l WHERE l.run_id = ? ORDER BY l.time_ns
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


def run_loop_events(con: StoreConnection, run_id: str) -> pd.DataFrame:
    """One run's caught calls (``loop:detected`` events) in time order; ``earlier_node_ids``
    is a JSON list of node ids and ``shadow`` a bool on every engine."""
    c = as_connection(con)
    quote = "`" if c.dialect == "clickhouse" else '"'
    frame = c.df(_RUN_LOOPS_SQL.format(count=f"{quote}count{quote}", limit=f"{quote}limit{quote}"), [run_id])
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
