"""Report functions: ``(connection, filters) -> DataFrame``, each one SQL query over the store.

Words mean what ``docs/architecture.md`` defines: an executed call is a tool span; a
pruned call is a non-shadow ``loop:detected`` event; prune rate = pruned / (executed +
pruned); an executed call with ordinal >= 2 is a repeat, **productive** when its result
hash differs from every earlier identical call on its path (the calls its count counted),
or the last of them failed while it succeeded; **unknown** when it or one of those calls
has no captured result (missing results never compare equal); **wasted** otherwise. A
failed repeat is wasted.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from treellm.analysis.filters import Filters
from treellm.store.backend import Connection, StoreConnection, as_connection
from treellm.telemetry.conventions import content_switch

__all__ = [
    "CALLS_SQL",
    "CLICKHOUSE_SETTINGS",
    "REPEATS_SQL",
    "REPEATS_SQL_CLICKHOUSE",
    "content_by_tool",
    "cost_by_tool",
    "prune_rate_by_model",
    "prune_rate_by_tool",
    "repeat_outcome_by_tool",
    "repeat_samples",
    "runs_by_day",
    "shape_by_run",
    "shape_distribution",
    "totals",
]

# Executed calls, straight from the spans table (the tool_calls view adds a window we do
# not need here). Framework-internal tools (smolagents' final_answer...) are not counted.
CALLS_SQL = """
SELECT run_id, coalesce(node_id, span_id) AS node_id, node_parent_id AS parent_id, tool_name AS tool, signature,
       ordinal, limit_n AS "limit", limit_source, result_hash, coalesce(shadow_caught, false) AS shadow_caught,
       CASE WHEN status_code = 2 OR node_status = 'failed' THEN 'failed' ELSE 'completed' END AS status,
       arguments, result, start_ns, end_ns, end_ns - start_ns AS duration_ns, earlier_node_ids, trace_id, span_id,
       convention, scope_name, repeat_chain
FROM spans
WHERE tool_name IS NOT NULL AND (operation = 'execute_tool' OR node_kind = 'tool') AND run_id IS NOT NULL
  AND NOT coalesce(internal, false)
"""

# Every executed repeat (ordinal >= 2) with its outcome, judged against the earlier identical calls
# that its count counted: for treellm's own calls those its ``earlier_node_ids`` name (its path in
# the tree, branches apart); for another framework's calls the calls of its ``repeat_chain`` of
# lower ordinal (their paths have no branches: ``derive/trees.py``), by window functions, so a loop
# of k identical calls costs k rows, never k²/2 pairs.
_JUDGED = """run_id, node_id, tool, ordinal, status, shadow_caught, duration_ns, result_chars, start_ns, {limit},
       signature, arguments, all_differ, missing_result, last_status, last_earlier, has_earlier"""
_CHAINS = """chains AS (
    SELECT c.run_id AS run_id, c.node_id AS node_id, c.repeat_chain AS repeat_chain, c.ordinal AS ordinal,
           c.status AS status, c.result_hash AS result_hash,
           min(CASE WHEN c.result_hash IS NULL THEN c.ordinal END)
               OVER (PARTITION BY c.run_id, c.repeat_chain) AS first_missing,
           min(c.ordinal) OVER (PARTITION BY c.run_id, c.repeat_chain, c.result_hash) AS first_same
    FROM calls c
    WHERE c.repeat_chain IS NOT NULL
      AND c.run_id IN (SELECT run_id FROM picked WHERE ordinal >= 2 AND repeat_chain IS NOT NULL)
),"""
"""Per call of a repeat chain (of the runs that hold a chained repeat): the lowest ordinal of the
chain without a result and the lowest with its own result hash. The same SQL in both dialects."""
REPEATS_SQL = f"""
WITH calls AS ({CALLS_SQL}),
picked AS (SELECT * FROM calls c WHERE {{where}}),
reps AS (
    SELECT p.*, from_json(coalesce(p.earlier_node_ids, '[]'), '["VARCHAR"]') AS earlier
    FROM picked p WHERE p.ordinal >= 2 AND p.repeat_chain IS NULL
),
pairs AS (
    SELECT r.run_id, r.node_id, e.result_hash AS e_hash, e.status AS e_status, e.node_id AS e_node,
           list_position(r.earlier, u.eid) AS pos
    FROM reps r CROSS JOIN unnest(r.earlier) AS u(eid)
    JOIN calls e ON e.run_id = r.run_id AND e.node_id = u.eid
),
listed AS (
    SELECT r.run_id, r.node_id, any_value(r.tool) AS tool, any_value(r.ordinal) AS ordinal,
           any_value(r.status) AS status, any_value(r.shadow_caught) AS shadow_caught,
           any_value(r.duration_ns) AS duration_ns, any_value(length(r.result)) AS result_chars,
           any_value(r.start_ns) AS start_ns, any_value(r."limit") AS "limit",
           any_value(r.signature) AS signature, any_value(r.arguments) AS arguments,
           coalesce(bool_and(p.e_hash IS DISTINCT FROM r.result_hash), true) AS all_differ,
           any_value(r.result_hash) IS NULL OR coalesce(bool_or(p.e_hash IS NULL), false) AS missing_result,
           arg_max(p.e_status, p.pos) AS last_status,
           arg_max(p.e_node, p.pos) AS last_earlier,
           arg_max(p.pos, p.pos) IS NOT NULL AS has_earlier
    FROM reps r LEFT JOIN pairs p USING (run_id, node_id)
    GROUP BY r.run_id, r.node_id
),
{_CHAINS}
chained AS (
    SELECT r.run_id, r.node_id, r.tool, r.ordinal, r.status, r.shadow_caught, r.duration_ns,
           length(r.result) AS result_chars, r.start_ns, r."limit", r.signature, r.arguments,
           k.first_same = r.ordinal AS all_differ,
           r.result_hash IS NULL OR coalesce(k.first_missing < r.ordinal, false) AS missing_result,
           e.status AS last_status, e.node_id AS last_earlier, e.node_id IS NOT NULL AS has_earlier
    FROM picked r JOIN chains k ON k.run_id = r.run_id AND k.node_id = r.node_id
    LEFT JOIN chains e ON e.run_id = r.run_id AND e.repeat_chain = r.repeat_chain AND e.ordinal = r.ordinal - 1
    WHERE r.ordinal >= 2
),
judged AS (
    SELECT {_JUDGED.format(limit='"limit"')} FROM listed
    UNION ALL
    SELECT {_JUDGED.format(limit='"limit"')} FROM chained
)
SELECT *,
       CASE WHEN status = 'failed' THEN 'wasted'
            WHEN last_status = 'failed' THEN 'productive'
            WHEN missing_result THEN 'unknown'
            WHEN all_differ THEN 'productive'
            ELSE 'wasted' END AS outcome,
       status = 'completed' AND (last_status = 'failed' OR (all_differ AND NOT missing_result)) AS productive
FROM judged
"""

# ClickHouse: unmatched outer-join rows read NULL (as in DuckDB), not the type's default.
CLICKHOUSE_SETTINGS = "\nSETTINGS join_use_nulls = 1"

# REPEATS_SQL in ClickHouse: JSONExtract for from_json, ARRAY JOIN for unnest, indexOf for
# list_position, isNotDistinctFrom for IS DISTINCT FROM, lengthUTF8 for length (characters).
REPEATS_SQL_CLICKHOUSE = f"""
WITH calls AS ({CALLS_SQL}),
picked AS (SELECT * FROM calls c WHERE {{where}}),
reps AS (
    SELECT p.*, JSONExtract(coalesce(p.earlier_node_ids, '[]'), 'Array(String)') AS earlier
    FROM picked p WHERE p.ordinal >= 2 AND p.repeat_chain IS NULL
),
pairs AS (
    SELECT r.run_id AS run_id, r.node_id AS node_id, e.result_hash AS e_hash, e.status AS e_status,
           e.node_id AS e_node, indexOf(r.earlier, eid) AS pos
    FROM reps r ARRAY JOIN r.earlier AS eid
    JOIN calls e ON e.run_id = r.run_id AND e.node_id = eid
),
listed AS (
    SELECT r.run_id AS run_id, r.node_id AS node_id, any(r.tool) AS tool, any(r.ordinal) AS ordinal,
           any(r.status) AS status, any(r.shadow_caught) AS shadow_caught,
           any(r.duration_ns) AS duration_ns, any(lengthUTF8(r.result)) AS result_chars,
           any(r.start_ns) AS start_ns, any(r.`limit`) AS `limit`,
           any(r.signature) AS signature, any(r.arguments) AS arguments,
           toBool(coalesce(min(NOT isNotDistinctFrom(p.e_hash, r.result_hash)), true)) AS all_differ,
           toBool(any(r.result_hash) IS NULL OR coalesce(max(p.e_hash IS NULL AND p.node_id IS NOT NULL), false))
               AS missing_result,
           argMax(p.e_status, p.pos) AS last_status,
           argMax(p.e_node, p.pos) AS last_earlier,
           toBool(argMax(p.pos, p.pos) IS NOT NULL) AS has_earlier
    FROM reps r LEFT JOIN pairs p ON p.run_id = r.run_id AND p.node_id = r.node_id
    GROUP BY r.run_id, r.node_id
),
{_CHAINS}
chained AS (
    SELECT r.run_id AS run_id, r.node_id AS node_id, r.tool AS tool, r.ordinal AS ordinal, r.status AS status,
           r.shadow_caught AS shadow_caught, r.duration_ns AS duration_ns, lengthUTF8(r.result) AS result_chars,
           r.start_ns AS start_ns, r.`limit` AS `limit`, r.signature AS signature, r.arguments AS arguments,
           toBool(k.first_same = r.ordinal) AS all_differ,
           toBool(r.result_hash IS NULL OR coalesce(k.first_missing < r.ordinal, false)) AS missing_result,
           e.status AS last_status, e.node_id AS last_earlier, toBool(e.node_id IS NOT NULL) AS has_earlier
    FROM picked r JOIN chains k ON k.run_id = r.run_id AND k.node_id = r.node_id
    LEFT JOIN chains e ON e.run_id = r.run_id AND e.repeat_chain = r.repeat_chain AND e.ordinal = r.ordinal - 1
    WHERE r.ordinal >= 2
),
judged AS (
    SELECT {_JUDGED.format(limit="`limit`")} FROM listed
    UNION ALL
    SELECT {_JUDGED.format(limit="`limit`")} FROM chained
)
SELECT *,
       multiIf(status = 'failed', 'wasted', last_status = 'failed', 'productive', missing_result, 'unknown',
               all_differ, 'productive', 'wasted') AS outcome,
       toBool(status = 'completed' AND (last_status = 'failed' OR (all_differ AND NOT missing_result))) AS productive
FROM judged
"""
"""(Without its ``SETTINGS``, so that it nests: append :data:`CLICKHOUSE_SETTINGS` to the outer query.)"""


def _df(con: StoreConnection | Connection, sql: str, params: list[Any]) -> pd.DataFrame:
    return as_connection(con).df(sql, params)


def _dialect(con: StoreConnection) -> str:
    return as_connection(con).dialect


def repeat_samples(con: StoreConnection, filters: Filters | None = None) -> pd.DataFrame:
    """One row per executed repeat: run, node, tool, ordinal, status, productive, duration."""
    where, params = (filters or Filters()).where("c")
    sql = REPEATS_SQL_CLICKHOUSE + CLICKHOUSE_SETTINGS if _dialect(con) == "clickhouse" else REPEATS_SQL
    return _df(con, sql.format(where=where), params)


def totals(con: StoreConnection, filters: Filters | None = None) -> dict[str, int]:
    """Runs, executed calls and pruned calls in the filtered data."""
    f = filters or Filters()
    run_where, run_params = f.run_condition("r")
    where, params = f.where("c")
    loop_where, loop_params = f.where("l")
    frame = _df(
        con,
        f"""
        SELECT (SELECT count(*) FROM runs r WHERE {run_where}) AS runs,
               (SELECT count(*) FROM ({CALLS_SQL}) c WHERE {where}) AS calls,
               (SELECT count(*) FROM loop_events l WHERE NOT l.shadow AND {loop_where}) AS pruned
        """,
        [*run_params, *params, *loop_params],
    )
    runs, calls, pruned = frame.iloc[0].tolist() if len(frame) else (0, 0, 0)
    return {"runs": int(runs), "tool_calls": int(calls), "pruned": int(pruned)}


def prune_rate_by_tool(con: StoreConnection, filters: Filters | None = None) -> pd.DataFrame:
    """Per tool: executed calls, pruned calls by action, shadow catches, prune rate."""
    return _prune_rates(con, filters or Filters(), group=["tool"])


def prune_rate_by_model(con: StoreConnection, filters: Filters | None = None) -> pd.DataFrame:
    """The same as :func:`prune_rate_by_tool`, per agent, model and tool."""
    return _prune_rates(con, filters or Filters(), group=["agent", "model", "tool"])


def _prune_rates(con: StoreConnection, f: Filters, *, group: list[str]) -> pd.DataFrame:
    where, params = f.where("c")
    loop_where, loop_params = f.where("l")
    keys = ", ".join(group)
    clickhouse = _dialect(con) == "clickhouse"
    sql = f"""
    WITH executed AS (
        SELECT {", ".join(f"x.{g}" for g in group)}, count(*) AS calls,
               count(*) FILTER (WHERE x.shadow_caught) AS shadow_catches
        FROM (SELECT c.*, r.agent AS agent, r.model AS model FROM ({CALLS_SQL}) c LEFT JOIN runs r USING (run_id)
              WHERE {where}) x
        GROUP BY ALL
    ),
    pruned AS (
        SELECT {", ".join(f"x.{g}" for g in group)},
               count(*) FILTER (WHERE x.action = 'prune') AS pruned_prune,
               count(*) FILTER (WHERE x.action = 'nudge') AS pruned_nudge,
               count(*) FILTER (WHERE x.action = 'cache') AS pruned_cache
        FROM (SELECT l.* {"EXCEPT" if clickhouse else "EXCLUDE"} (model), r.agent AS agent, r.model AS model
              FROM loop_events l LEFT JOIN runs r USING (run_id)
              WHERE NOT l.shadow AND {loop_where}) x
        GROUP BY ALL
    )
    SELECT {keys},
           coalesce(e.calls, 0) AS calls,
           coalesce(p.pruned_prune, 0) + coalesce(p.pruned_nudge, 0) + coalesce(p.pruned_cache, 0) AS pruned,
           coalesce(p.pruned_prune, 0) AS pruned_prune, coalesce(p.pruned_nudge, 0) AS pruned_nudge,
           coalesce(p.pruned_cache, 0) AS pruned_cache, coalesce(e.shadow_catches, 0) AS shadow_catches
    FROM executed e FULL OUTER JOIN pruned p USING ({keys})
    ORDER BY pruned DESC, calls DESC, {keys}
    {CLICKHOUSE_SETTINGS if clickhouse else ""}
    """
    df = _df(con, sql, [*params, *loop_params])
    total = df["calls"] + df["pruned"]
    df["prune_rate"] = (df["pruned"] / total.where(total > 0)).fillna(0.0)
    return df


CONTENT_COLUMNS = ["tool", "calls", "arguments_unknown", "results_unknown", "framework", "switch"]


def content_by_tool(con: StoreConnection, filters: Filters | None = None) -> pd.DataFrame:
    """Per tool (``CONTENT_COLUMNS``): other frameworks' executed calls whose spans hold no
    arguments (``arguments_unknown``: no signature, so never a repeat) or no result
    (``results_unknown``: a repeat of them is of unknown outcome), and the framework of the first
    such call with its switch that records them (``conventions.content_switch`` of its
    instrumentation scope). Only tools with such calls; treellm's own spans always hold both (as
    hashes when not captured)."""
    where, params = (filters or Filters()).where("c")
    frame = _df(
        con,
        f"""SELECT c.tool AS tool, count(*) AS calls,
                   count(*) FILTER (WHERE c.signature IS NULL) AS arguments_unknown,
                   count(*) FILTER (WHERE c.result_hash IS NULL) AS results_unknown,
                   min(CASE WHEN c.signature IS NULL OR c.result_hash IS NULL THEN c.scope_name END) AS scope_name
            FROM ({CALLS_SQL}) c WHERE {where} AND c.convention IS NOT NULL
            GROUP BY c.tool
            HAVING count(*) FILTER (WHERE c.signature IS NULL OR c.result_hash IS NULL) > 0
            ORDER BY c.tool""",
        params,
    )
    switches = [content_switch(None if pd.isna(scope) else str(scope)) for scope in frame["scope_name"]]
    frame["framework"] = [framework for framework, _ in switches]
    frame["switch"] = [switch for _, switch in switches]
    return frame[CONTENT_COLUMNS].astype({"calls": int, "arguments_unknown": int, "results_unknown": int})


def repeat_outcome_by_tool(con: StoreConnection, filters: Filters | None = None) -> pd.DataFrame:
    """Per tool and ordinal: executed repeats, productive, wasted (and failed among wasted), unknown."""
    samples = repeat_samples(con, filters)
    if samples.empty:
        return pd.DataFrame(columns=["tool", "ordinal", "repeats", "productive", "wasted", "failed", "unknown"])
    samples["wasted"] = samples["outcome"] == "wasted"
    samples["unknown"] = samples["outcome"] == "unknown"
    samples["failed"] = samples["status"] == "failed"
    out = (
        samples.groupby(["tool", "ordinal"])
        .agg(
            repeats=("node_id", "size"),
            productive=("productive", "sum"),
            wasted=("wasted", "sum"),
            failed=("failed", "sum"),
            unknown=("unknown", "sum"),
        )
        .reset_index()
        .sort_values(["tool", "ordinal"])
    )
    return out.reset_index(drop=True)


def cost_by_tool(con: StoreConnection, filters: Filters | None = None) -> pd.DataFrame:
    """Time and (estimated) tokens spent in wasted repeats, per tool.

    Tokens are estimated as captured result characters / 4 (what the model had to read);
    ``None`` when content capture was off.
    """
    samples = repeat_samples(con, filters)
    wasted = samples[samples["outcome"] == "wasted"] if not samples.empty else samples
    if wasted.empty:
        return pd.DataFrame(columns=["tool", "wasted_repeats", "wasted_seconds", "wasted_tokens_est"])
    out = (
        wasted.groupby("tool")
        .agg(wasted_repeats=("node_id", "size"), wasted_ns=("duration_ns", "sum"), chars=("result_chars", "sum"))
        .reset_index()
    )
    out["wasted_seconds"] = out["wasted_ns"] / 1e9
    out["wasted_tokens_est"] = (out["chars"] / 4).round().astype("Int64")
    return out[["tool", "wasted_repeats", "wasted_seconds", "wasted_tokens_est"]].sort_values(
        "wasted_repeats", ascending=False, ignore_index=True
    )


_SHAPE_SQL = """
WITH picked AS (SELECT r.* FROM runs r WHERE {run_where}),
n AS (SELECT nd.* FROM nodes nd SEMI JOIN picked USING (run_id)),
children AS (SELECT run_id, parent_id, count(*) AS k FROM n WHERE parent_id IS NOT NULL GROUP BY ALL),
leaves AS (
    SELECT n.run_id, count(*) AS leaves FROM n
    LEFT JOIN children c ON c.run_id = n.run_id AND c.parent_id = n.node_id
    WHERE c.parent_id IS NULL GROUP BY n.run_id
),
breadth AS (
    SELECT run_id, list(k ORDER BY depth) AS breadth_per_depth, max(k) AS max_breadth
    FROM (SELECT run_id, depth, count(*) AS k FROM n WHERE kind = 'think' AND depth IS NOT NULL GROUP BY ALL)
    GROUP BY run_id
),
fan AS (SELECT run_id, avg(k) AS branching_factor FROM children GROUP BY run_id)
SELECT p.run_id, p.agent, p.service, p.model, p.start_ns, p.day, p.duration_ns, p.outcome,
       p.nodes, p.think_nodes, p.tool_nodes, p.collapse_nodes, p.max_depth,
       coalesce(b.max_breadth, 0) AS max_breadth, coalesce(b.breadth_per_depth, []) AS breadth_per_depth,
       coalesce(f.branching_factor, 0) AS branching_factor, coalesce(l.leaves, 0) AS leaves,
       p.pruned_calls, p.shadow_catches
FROM picked p
LEFT JOIN breadth b USING (run_id) LEFT JOIN fan f USING (run_id) LEFT JOIN leaves l USING (run_id)
ORDER BY p.start_ns
"""

# _SHAPE_SQL in ClickHouse: LEFT SEMI JOIN, and the breadth list as an array sorted by depth.
_SHAPE_SQL_CLICKHOUSE = (
    _SHAPE_SQL.replace("FROM nodes nd SEMI JOIN picked", "FROM nodes nd LEFT SEMI JOIN picked")
    .replace("SELECT p.run_id, p.agent", "SELECT p.run_id AS run_id, p.agent")
    .replace(
        "list(k ORDER BY depth) AS breadth_per_depth",
        "arrayMap(x -> x.2, arraySort(groupArray((depth, k)))) AS breadth_per_depth",
    )
    .rstrip()
    + CLICKHOUSE_SETTINGS
)


def shape_by_run(con: StoreConnection, filters: Filters | None = None) -> pd.DataFrame:
    """Per run: nodes by kind, max depth, breadth per depth (ThinkNodes), branching factor
    (mean children of a node with children), leaves, pruned calls, outcome."""
    run_where, params = (filters or Filters()).run_condition("r")
    sql = _SHAPE_SQL_CLICKHOUSE if _dialect(con) == "clickhouse" else _SHAPE_SQL
    return _df(con, sql.format(run_where=run_where), params)


def shape_distribution(con: StoreConnection, filters: Filters | None = None) -> pd.DataFrame:
    """Distributions across runs: count, mean and percentiles of each shape measure."""
    shapes = shape_by_run(con, filters)
    columns = ["nodes", "max_depth", "max_breadth", "branching_factor", "leaves", "pruned_calls"]
    if shapes.empty:
        return pd.DataFrame(columns=["measure", "runs", "mean", "p50", "p90", "max"])
    rows = []
    for column in columns:
        values = shapes[column].astype(float)
        rows.append({"measure": column, "runs": len(values), "mean": values.mean(), "p50": values.quantile(0.5),
                     "p90": values.quantile(0.9), "max": values.max()})  # fmt: skip
    return pd.DataFrame(rows)


def runs_by_day(con: StoreConnection, filters: Filters | None = None) -> pd.DataFrame:
    """Per day: runs, executed calls, pruned calls, prune rate, wasted repeats (for charts over time)."""
    f = filters or Filters()
    run_where, params = f.run_condition("r")
    df = _df(
        con,
        f"""SELECT r.day, count(*) AS runs, sum(r.tool_nodes) AS tool_calls, sum(r.pruned_calls) AS pruned
            FROM runs r WHERE {run_where} GROUP BY r.day ORDER BY r.day""",
        params,
    )
    samples = repeat_samples(con, f)
    if not samples.empty:
        days = _df(con, "SELECT run_id, day FROM runs", [])
        wasted = samples[samples["outcome"] == "wasted"].merge(days, on="run_id").groupby("day").size()
        df["wasted"] = df["day"].map(wasted).fillna(0).astype(int)
    else:
        df["wasted"] = 0
    total = df["tool_calls"] + df["pruned"]
    df["prune_rate"] = (df["pruned"] / total.where(total > 0)).fillna(0.0)
    return df
