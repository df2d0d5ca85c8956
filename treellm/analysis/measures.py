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

from collections.abc import Sequence
from typing import Any

import pandas as pd

from treellm.analysis.filters import Filters
from treellm.store.backend import Connection, StoreConnection, as_connection
from treellm.store.views import CALLS_SQL, INTERNAL_CALLS_SQL
from treellm.telemetry.conventions import content_switch

__all__ = [
    "CALLS_SQL",
    "CLICKHOUSE_SETTINGS",
    "REPEATS_SQL",
    "content_by_tool",
    "cost_by_tool",
    "internal_calls_by_tool",
    "prune_rate_by_model",
    "prune_rate_by_tool",
    "repeat_outcome_by_tool",
    "repeat_samples",
    "runs_by_day",
    "shape_by_run",
    "SHAPE_GROUPS",
    "SHAPE_MEASURES",
    "shape_distribution",
    "shape_groups",
    "shape_values",
    "totals",
]

# Every executed repeat with its outcome: the store's view (its rule, written once in
# store/views.py and derived per trace), the filter choosing runs and tools (``{where}`` over
# alias ``c``: an outcome depends on its own run's calls only, so the filter never changes one).
REPEATS_SQL = """SELECT * FROM repeat_outcomes c WHERE {where}"""

# ClickHouse: unmatched outer-join rows read NULL (as in DuckDB), not the type's default.
CLICKHOUSE_SETTINGS = "\nSETTINGS join_use_nulls = 1"


def _df(con: StoreConnection | Connection, sql: str, params: list[Any]) -> pd.DataFrame:
    return as_connection(con).df(sql, params)


def _dialect(con: StoreConnection) -> str:
    return as_connection(con).dialect


def repeat_samples(con: StoreConnection, filters: Filters | None = None) -> pd.DataFrame:
    """One row per executed repeat: run, node, tool, ordinal, status, productive, duration."""
    where, params = (filters or Filters()).where("c")
    return _df(con, REPEATS_SQL.format(where=where), params)


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
    if {"agent", "model"} & set(group):  # a run's agent and model: joined only when grouped by them
        calls = f"SELECT c.*, r.agent AS agent, r.model AS model FROM ({CALLS_SQL}) c LEFT JOIN runs r USING (run_id)"
        events = (f"SELECT l.* {'EXCEPT' if clickhouse else 'EXCLUDE'} (model), r.agent AS agent, r.model AS model "
                  "FROM loop_events l LEFT JOIN runs r USING (run_id)")  # fmt: skip
    else:  # per tool: no join of every call to its run
        calls, events = f"SELECT c.* FROM ({CALLS_SQL}) c", "SELECT l.* FROM loop_events l"
    sql = f"""
    WITH executed AS (
        SELECT {", ".join(f"x.{g}" for g in group)}, count(*) AS calls,
               count(*) FILTER (WHERE x.shadow_caught) AS shadow_catches
        FROM ({calls} WHERE {where}) x
        GROUP BY ALL
    ),
    pruned AS (
        SELECT {", ".join(f"x.{g}" for g in group)},
               count(*) FILTER (WHERE x.action = 'prune') AS pruned_prune,
               count(*) FILTER (WHERE x.action = 'nudge') AS pruned_nudge,
               count(*) FILTER (WHERE x.action = 'cache') AS pruned_cache
        FROM ({events} WHERE NOT l.shadow AND {loop_where}) x
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


def internal_calls_by_tool(con: StoreConnection, filters: Filters | None = None) -> pd.DataFrame:
    """Per framework-internal tool (``internal``: smolagents' ``final_answer``..., as
    ``TREELLM_INTERNAL_TOOLS`` said when the spans were stored), its calls in runs
    (:data:`INTERNAL_CALLS_SQL`): those that :data:`CALLS_SQL`, and so every count of the analysis,
    leaves out. Columns ``tool``, ``calls``."""
    where, params = (filters or Filters()).where("c")
    frame = _df(
        con,
        f"""SELECT c.tool AS tool, count(*) AS calls
            FROM ({INTERNAL_CALLS_SQL}) c WHERE {where}
            GROUP BY c.tool ORDER BY c.tool""",
        params,
    )
    return frame[["tool", "calls"]].astype({"calls": int})


_OUTCOME_COLUMNS = ["tool", "ordinal", "repeats", "productive", "wasted", "failed", "unknown"]
_OUTCOMES_SQL = """
SELECT c.tool AS tool, c.ordinal AS ordinal, CAST(count(*) AS BIGINT) AS repeats,
       CAST(sum(CASE WHEN c.productive THEN 1 ELSE 0 END) AS BIGINT) AS productive,
       CAST(sum(CASE WHEN c.outcome = 'wasted' THEN 1 ELSE 0 END) AS BIGINT) AS wasted,
       CAST(sum(CASE WHEN c.status = 'failed' THEN 1 ELSE 0 END) AS BIGINT) AS failed,
       CAST(sum(CASE WHEN c.outcome = 'unknown' THEN 1 ELSE 0 END) AS BIGINT) AS unknown
FROM repeat_outcomes c WHERE c.tool IS NOT NULL AND {where}
GROUP BY c.tool, c.ordinal
"""
"""Each tool's and ordinal's executed repeats counted where they are (both engines), not fetched.
A repeat of a call naming no tool is left out, as the pandas grouping before left it out
(``identical_repeats_by_tool`` gives it a group of its own)."""


def repeat_outcome_by_tool(con: StoreConnection, filters: Filters | None = None) -> pd.DataFrame:
    """Per tool and ordinal: executed repeats, productive, wasted (and failed among wasted), unknown."""
    where, params = (filters or Filters()).where("c")
    out = _df(con, _OUTCOMES_SQL.format(where=where), params)
    if out.empty:
        return pd.DataFrame(columns=_OUTCOME_COLUMNS)
    for column in _OUTCOME_COLUMNS[2:]:
        out[column] = out[column].astype("int64")
    return out.sort_values(["tool", "ordinal"]).reset_index(drop=True)


def cost_by_tool(con: StoreConnection, filters: Filters | None = None) -> pd.DataFrame:
    """Time and (estimated) tokens spent in wasted repeats, per tool.

    Tokens are estimated as captured result characters / 4 (what the model had to read): 0 when
    content capture was off (no result captured).
    """
    where, params = (filters or Filters()).where("c")
    out = _df(
        con,
        f"""SELECT c.tool AS tool, count(*) AS wasted_repeats, coalesce(sum(c.duration_ns), 0) AS wasted_ns,
                   coalesce(sum(c.result_chars), 0) AS chars
            FROM ({REPEATS_SQL.format(where=where)}) c WHERE c.outcome = 'wasted'
            GROUP BY c.tool ORDER BY wasted_repeats DESC, tool""",
        params,
    )  # counted where the repeats are: every repeat's row (926,980 at 10M spans) cost 0.9-1.0 s over chDB
    if out.empty:
        return pd.DataFrame(columns=["tool", "wasted_repeats", "wasted_seconds", "wasted_tokens_est"])
    out["wasted_repeats"] = out["wasted_repeats"].astype("int64")  # ClickHouse's count() is unsigned
    out["wasted_seconds"] = out["wasted_ns"].astype(float) / 1e9
    out["wasted_tokens_est"] = (out["chars"].astype(float) / 4).round().astype("Int64")
    return out[["tool", "wasted_repeats", "wasted_seconds", "wasted_tokens_est"]]


_SHAPE_SQL = """
SELECT r.run_id AS run_id, r.agent AS agent, r.service AS service, r.model AS model, r.start_ns AS start_ns,
       r.day AS day, r.duration_ns AS duration_ns, r.outcome AS outcome, r.nodes AS nodes,
       r.think_nodes AS think_nodes, r.tool_nodes AS tool_nodes, r.collapse_nodes AS collapse_nodes,
       r.max_depth AS max_depth, coalesce(s.max_breadth, 0) AS max_breadth,
       coalesce(s.breadth_per_depth, []) AS breadth_per_depth, coalesce(s.branching_factor, 0) AS branching_factor,
       coalesce(s.leaves, 0) AS leaves, r.pruned_calls AS pruned_calls, r.shadow_catches AS shadow_catches
FROM runs r LEFT JOIN run_shapes s ON s.run_id = r.run_id
WHERE {run_where}
"""


SHAPE_COLUMNS = ("run_id", "agent", "service", "model", "start_ns", "day", "duration_ns", "outcome", "nodes",
                 "think_nodes", "tool_nodes", "collapse_nodes", "max_depth", "max_breadth", "breadth_per_depth",
                 "branching_factor", "leaves", "pruned_calls", "shadow_catches")  # fmt: skip
"""The columns of :func:`shape_by_run`, in order."""


def shape_by_run(
    con: StoreConnection, filters: Filters | None = None, *, columns: Sequence[str] | None = None
) -> pd.DataFrame:
    """Per run: nodes by kind, max depth, breadth per depth (ThinkNodes), branching factor
    (mean children of a node with children), leaves, pruned calls, outcome; only ``columns``
    (of :data:`SHAPE_COLUMNS`) when given. Every run's ``breadth_per_depth`` list is most of
    the cost of fetching: at 10M spans (676,900 runs over chDB) 2.8 s with it, 0.4 s without."""
    unknown = sorted(set(columns or ()) - set(SHAPE_COLUMNS))
    if unknown:
        raise ValueError(f"no shape column {', '.join(unknown)}; expected some of {', '.join(SHAPE_COLUMNS)}")
    run_where, params = (filters or Filters()).run_condition("r")
    if columns is None:
        return _df(con, _SHAPE_SQL.format(run_where=run_where) + "ORDER BY r.start_ns", params)
    chosen = ", ".join(f"s.{c} AS {c}" for c in columns)
    return _df(con, f"SELECT {chosen} FROM ({_SHAPE_SQL.format(run_where=run_where)}) s ORDER BY s.start_ns", params)


SHAPE_MEASURES = ("nodes", "max_depth", "max_breadth", "branching_factor", "leaves", "pruned_calls")
"""The measures of a run's shape that :func:`shape_distribution` summarises."""
SHAPE_GROUPS = ("agent", "model", "day", "outcome")
"""What runs' shapes are grouped and compared by (:func:`shape_groups`, :func:`shape_values`)."""
Among = tuple[str, str]
"""(column of :data:`SHAPE_GROUPS`, value as text): only the runs whose column is that value."""


def _shape_text(con: StoreConnection, column: str) -> str:
    """A run's ``column`` of :data:`SHAPE_GROUPS` (on the shape rows ``s``) as text, NULL when none:
    a day as its date."""
    if column not in SHAPE_GROUPS:
        raise ValueError(f"no shape group {column}; expected one of {', '.join(SHAPE_GROUPS)}")
    return f"toString(s.{column})" if _dialect(con) == "clickhouse" else f"CAST(s.{column} AS VARCHAR)"


def _shapes_among(con: StoreConnection, filters: Filters | None, among: Among | None) -> tuple[str, list[Any]]:
    """The shape rows ``s`` of the filtered runs (those whose ``among`` column is its value)."""
    run_where, params = (filters or Filters()).run_condition("r")
    shapes = f"({_SHAPE_SQL.format(run_where=run_where)}) s"
    if among is None:
        return shapes, params
    return f"{shapes} WHERE {_shape_text(con, among[0])} = ?", [*params, among[1]]


def shape_groups(
    con: StoreConnection, filters: Filters | None = None, *, by: str = "agent", among: Among | None = None
) -> pd.DataFrame:
    """The runs' shapes as a scatter draws them: runs counted per (``max_depth``, ``max_breadth``,
    ``by`` as text, ``(none)`` when missing), with their mean ``nodes`` and an ``example`` (the run
    that started first). Counted where the runs are: at 10M spans over chDB, 45 rows for 676,900
    runs in 0.18-0.2 s, where fetching every run's shape took 1.4-1.5 s."""
    key = _shape_text(con, by)
    shapes, params = _shapes_among(con, filters, among)
    first = "argMin" if _dialect(con) == "clickhouse" else "arg_min"
    return _df(
        con,
        f"""SELECT s.max_depth AS max_depth, s.max_breadth AS max_breadth, coalesce({key}, '(none)') AS {by},
                   count(*) AS runs, avg(CAST(s.nodes AS DOUBLE)) AS nodes,
                   {first}(s.run_id, (s.start_ns, s.run_id)) AS example
            FROM {shapes} GROUP BY 1, 2, 3 ORDER BY 1, 2, 3""",
        params,
    )


def shape_values(con: StoreConnection, filters: Filters | None = None, *, by: str = "agent") -> list[str]:
    """The values of ``by`` among the filtered runs, as text (a day as its date), sorted."""
    key = _shape_text(con, by)
    run_where, params = (filters or Filters()).run_condition("r")  # a run's own column: no shape joined
    runs = f"(SELECT r.* FROM runs r WHERE {run_where}) s"
    frame = _df(con, f"SELECT DISTINCT {key} AS v FROM {runs} WHERE {key} IS NOT NULL ORDER BY v", params)
    return [str(v) for v in frame["v"]]


def shape_distribution(
    con: StoreConnection, filters: Filters | None = None, *, among: Among | None = None
) -> pd.DataFrame:
    """Distributions across runs: count, mean and percentiles (linearly interpolated, as
    pandas' ``quantile``) of each shape measure, computed where the runs are."""
    shape, params = _shapes_among(con, filters, among)
    clickhouse = _dialect(con) == "clickhouse"

    def quantile(column: str, level: float) -> str:
        if clickhouse:
            return f"quantileExactInclusive({level})(toFloat64(s.{column}))"
        return f"quantile_cont(CAST(s.{column} AS DOUBLE), {level})"

    parts = [
        f"avg(CAST(s.{c} AS DOUBLE)) AS {c}_mean, {quantile(c, 0.5)} AS {c}_p50, {quantile(c, 0.9)} AS {c}_p90, "
        f"max(CAST(s.{c} AS DOUBLE)) AS {c}_max"
        for c in SHAPE_MEASURES
    ]
    found = _df(con, f"SELECT count(*) AS runs, {', '.join(parts)} FROM {shape}", params)
    runs = int(found["runs"].iloc[0]) if len(found) else 0
    if runs == 0:
        return pd.DataFrame(columns=["measure", "runs", "mean", "p50", "p90", "max"])
    row = found.iloc[0]
    return pd.DataFrame(
        [{"measure": c, "runs": runs, **{k: float(row[f"{c}_{k}"]) for k in ("mean", "p50", "p90", "max")}}
         for c in SHAPE_MEASURES]
    )  # fmt: skip


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
    where, repeat_params = f.where("c")
    wasted = _df(
        con,
        f"""SELECT d.day AS day, count(*) AS wasted FROM repeat_outcomes c JOIN runs d ON d.run_id = c.run_id
            WHERE c.outcome = 'wasted' AND {where} GROUP BY d.day""",
        repeat_params,
    )
    df["wasted"] = df["day"].map(dict(zip(wasted["day"], wasted["wasted"], strict=True))).fillna(0).astype(int)
    total = df["tool_calls"] + df["pruned"]
    df["prune_rate"] = (df["pruned"] / total.where(total > 0)).fillna(0.0)
    return df
