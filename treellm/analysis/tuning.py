"""What-if replay of limits and tuning candidates per tool, and the TOML limits file.

- **loss** of a limit N for a tool = its productive repeats that N would prune (ordinal > N)
  / all its productive repeats. The **recommended** limit is the smallest N >= 1 whose loss
  stays within ``tolerance`` (default 5%).
- **verdict**: ``insufficient_data`` (fewer than ``min_samples`` executed repeats), else
  ``mutates`` (the repeats are productive after another tool's successful call and wasted
  without it: that tool should be marked ``mutates``), else ``keep`` / ``raise`` / ``lower``
  (recommended against current limit).
- The what-if replay uses executed calls only: calls that a *lower* limit would prune are
  known (shadow-mode runs record them too); calls that were pruned and a *higher* limit
  would let run have no recorded outcome, and are counted apart as ``unknown``.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import tomli_w

from treellm.analysis.filters import Filters
from treellm.analysis.measures import CALLS_SQL, REPEATS_SQL
from treellm.shell import DEFAULT_SHELL_TOOLS
from treellm.store.backend import StoreConnection, as_connection

__all__ = [
    "DEFAULT_MIN_PRODUCTIVE",
    "limit_text",
    "limits_toml",
    "tuning_by_tool",
    "what_if_by_tool_limit",
    "wilson_interval",
]

DEFAULT_TOLERANCE = 0.05
VERDICT_ORDER = {"raise": 0, "lower": 1, "mutates": 2, "keep": 3, "insufficient_data": 4}
"""Actionable verdicts first."""
DEFAULT_MIN_SAMPLES = 10


def limit_text(current: Any) -> str:
    """A tool's current limit as people read it: the number, or ``none`` when the agent never ran
    with one (a missing ``current_max_repeats``); the tune table and the dashboard show it so."""
    return "none" if current is None or pd.isna(current) else str(int(current))


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% by default)."""
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def _current_limits(con: StoreConnection, f: Filters) -> pd.DataFrame:
    where, params = f.where("c")
    engine = as_connection(con)
    if engine.dialect == "clickhouse":  # mode(x): the most frequent non-NULL value, NULL when none
        return engine.df(
            f"""SELECT c.tool AS tool,
                       if(count(c."limit") = 0, NULL, topKIf(1)(c."limit", c."limit" IS NOT NULL)[1]) AS current_limit,
                       if(count(c.limit_source) = 0, NULL,
                          topKIf(1)(c.limit_source, c.limit_source IS NOT NULL)[1]) AS limit_source,
                       count(*) AS calls
                FROM ({CALLS_SQL}) c WHERE {where} GROUP BY c.tool""",
            params,
        )
    return engine.df(
        f"""SELECT c.tool, mode(c."limit") AS current_limit, mode(c.limit_source) AS limit_source,
                   count(*) AS calls
            FROM ({CALLS_SQL}) c WHERE {where} GROUP BY c.tool""",
        params,
    )


def _samples(con: StoreConnection, f: Filters) -> pd.DataFrame:
    """The executed repeats as the tuning weighs them, counted where the data is: per ``tool``,
    ``unknown`` (its outcome), ``productive`` and ``ordinal``, how many (``n``) and their results'
    characters (``chars``). Every figure of the tuning and the what-if replay is a sum over these
    groups; one row per repeat (927k at 10M spans) cost 0.1 s to fetch over chDB and as much to
    split per tool. :func:`_evidence` reads the few calls it quotes."""
    where, params = f.where("c")
    unknown = "coalesce(c.outcome = 'unknown', false)"
    productive = "coalesce(c.productive, false)"
    frame = as_connection(con).df(
        f"""SELECT c.tool AS tool, {unknown} AS unknown, {productive} AS productive, c.ordinal AS ordinal,
                   count(*) AS n, coalesce(sum(c.result_chars), 0) AS chars
            FROM ({REPEATS_SQL.format(where=where)}) c
            GROUP BY c.tool, {unknown}, {productive}, c.ordinal""",
        params,
    )
    return frame.astype({"unknown": bool, "productive": bool})  # ClickHouse's may be 0/1: ~ must negate


def _weight(samples: pd.DataFrame, mask: Any = None) -> int:
    """How many repeats the groups of :func:`_samples` (those of ``mask``) hold."""
    return int((samples["n"] if mask is None else samples.loc[mask, "n"]).sum())


def _by_tool(samples: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """``samples`` split per tool, once (a mask per tool over every repeat cost 0.4 s at 10M spans)."""
    return {str(tool): group for tool, group in samples.groupby("tool", sort=False)}


def _afresh(con: StoreConnection, f: Filters) -> dict[str, int]:
    """Per tool: identical calls (same signature in the run as an earlier one) that a state
    change between made count afresh (ordinal 1): re-runs after a write, not loops. Counted per
    run and signature where the data is (the ``call_signatures`` view; a table of ClickHouse's)."""
    where, params = f.where("c")
    frame = as_connection(con).df(
        f"""SELECT c.tool AS tool, sum(c.afresh) AS afresh FROM call_signatures c WHERE {where} GROUP BY c.tool""",
        params,
    )
    return {str(tool): int(count) for tool, count in zip(frame["tool"], frame["afresh"], strict=True)}


def _pruned_counts(con: StoreConnection, f: Filters) -> pd.DataFrame:
    """The calls a limit pruned (not in shadow mode), per tool and the count at which each was
    caught: ``tool``, ``count``, ``pruned``."""
    where, params = f.where("l")
    return as_connection(con).df(
        f"""SELECT l.tool AS tool, l.count AS count, count(*) AS pruned FROM loop_events l
            WHERE NOT l.shadow AND {where} GROUP BY l.tool, l.count""",
        params,
    )


def _single_tool_turns(con: StoreConnection, f: Filters) -> pd.DataFrame:
    """The turns that call one tool only (the ``call_turns`` view: a turn is the ThinkNode that
    asked, a call alone when unknown), counted per tool and smallest ordinal (a missing ordinal
    counts as 1): ``tool``, ``min_ordinal``, ``turns``. A limit L of tool X ends a branch at a turn
    when every call of the turn is X with an ordinal above L: the turn calls X only and its
    smallest ordinal is above L. Every tool's calls make the turns, whatever the tool filter. One
    tool: its smallest and largest name are one."""
    where, params = f.where("t", tool_column=None)
    return as_connection(con).df(
        f"""SELECT t.first_tool AS tool, t.min_ordinal AS min_ordinal, count(*) AS turns
            FROM call_turns t WHERE {where} AND t.first_tool = t.last_tool
            GROUP BY t.first_tool, t.min_ordinal""",
        params,
    )


def _ends(turns: pd.DataFrame, tool: str, limit: int) -> int:
    """How many turns of :func:`_single_tool_turns` a limit of ``limit`` on ``tool`` ends."""
    mine = turns[(turns["tool"] == tool) & (turns["min_ordinal"] > limit)]
    return int(mine["turns"].sum())


def what_if_by_tool_limit(
    con: StoreConnection, filters: Filters | None = None, *, max_limit: int | None = None
) -> pd.DataFrame:
    """For each tool and limit L in 1..N: executed calls L would prune, split into wasted
    (saved) and productive (lost), the branches that would end (turns whose every call L
    prunes), and calls pruned in the data that L would let run (``unknown``: no outcome).
    ``current_limit`` is the limit the data ran under, ``<NA>`` when it never ran under one."""
    f = filters or Filters()
    samples = _samples(con, f)
    limits = _current_limits(con, f)
    pruned = _pruned_counts(con, f)
    turns = _single_tool_turns(con, f)
    per_tool, none = _by_tool(samples), samples.iloc[0:0]
    rows: list[dict[str, Any]] = []
    for tool in sorted(limits["tool"]):
        found = limits.loc[limits["tool"] == tool, "current_limit"].iloc[0]
        observed = int(found) if pd.notna(found) else None  # None: the data never ran under a limit
        current = observed or 1
        mine = per_tool.get(str(tool), none)
        top = max_limit or max(current + 2, int(mine["ordinal"].max()) if not mine.empty else 1, 3)
        mine_pruned = pruned[pruned["tool"] == tool]
        for limit in range(1, top + 1):
            caught = mine[mine["ordinal"] > limit]
            would_prune, lost = _weight(caught), _weight(caught, caught["productive"])
            ends = _ends(turns, tool, limit)
            unknown = int(mine_pruned.loc[mine_pruned["count"] < limit, "pruned"].sum()) if limit > current else 0
            rows.append(
                {"tool": tool, "limit": limit, "current_limit": observed, "would_prune": would_prune,
                 "saved": would_prune - lost, "lost": lost, "branches_ended": ends, "unknown": unknown,
                 "note": (f"{unknown} call(s) pruned in the data would run at this limit: their outcome is unknown"
                          if unknown else "")}
            )  # fmt: skip
    table = pd.DataFrame(
        rows,
        columns=["tool", "limit", "current_limit", "would_prune", "saved", "lost", "branches_ended", "unknown", "note"],
    )
    table["current_limit"] = table["current_limit"].astype("Int64")  # <NA>: no limit observed
    return table


_CAUSES_SQL = """
SELECT m.tool AS tool, m.mutating AS mutating, count(*) AS n_with,
       sum(CASE WHEN m.productive THEN 1 ELSE 0 END) AS productive_with
FROM (SELECT b.tool AS tool, b.productive AS productive, {each} AS mutating
      FROM repeat_between b WHERE {where} AND b.outcome != 'unknown') m
GROUP BY m.tool, m.mutating"""
"""Per tool and each tool M whose other calls succeeded between a repeat and its twin (the
store's ``repeat_between``, which carries each repeat's outcome): the tool's repeats with a
known outcome that had M between (``n_with``), and how many of them were productive. ``{each}``
unnests the list: DuckDB's ``unnest``, ClickHouse's ``arrayJoin``."""


def _causes(con: StoreConnection, f: Filters) -> pd.DataFrame:
    """:data:`_CAUSES_SQL` over the filtered data, counted where the data is."""
    engine = as_connection(con)
    where, params = f.where("b")
    each = "arrayJoin(b.tools)" if engine.dialect == "clickhouse" else "unnest(b.tools)"
    return engine.df(_CAUSES_SQL.format(where=where, each=each), params)


def _mutating_cause(causes: pd.DataFrame, n: int, productive: int) -> tuple[str, int, float, float] | None:
    """(tool M, productive repeats after M, productive rate with M, without M) when M explains
    the productive repeats of a tool: ``causes`` are its rows of :func:`_causes`, ``n`` its
    repeats with a known outcome and ``productive`` how many of them were productive."""
    if productive == 0:
        return None
    best = None
    row: Any
    for row in causes[causes["productive_with"] > 0].sort_values("mutating").itertuples(index=False):
        n_with, p_with = int(row.n_with), int(row.productive_with)
        n_without = n - n_with
        rate_with = p_with / n_with
        rate_without = (productive - p_with) / n_without if n_without else 0.0
        share = p_with / productive
        if rate_with >= 0.8 and share >= 0.95 and (n_without == 0 or rate_without <= 0.2):
            score = (share, p_with)
            if best is None or score > best[0]:
                best = (score, (str(row.mutating), p_with, rate_with, rate_without))
    return best[1] if best else None


DEFAULT_MIN_PRODUCTIVE = 5
"""A ``raise`` needs at least this many productive repeats. A limit is a trade between
productive repeats lost and wasted ones saved; on one or two productive repeats (tau-bench's
single re-booking after a cancel, against nine identical failing retries) that trade rests
on chance: with 2 productive of 10, the 95% Wilson interval of the productive rate spans
6%-51%. Five is the fewest at which the interval's lower bound clears 10% in a sample of
ten, and the fewest a reviewer can read as a pattern."""
MAX_EVIDENCE = 3


def _evidence(con: StoreConnection, f: Filters, currents: dict[str, int]) -> dict[str, list[dict[str, Any]]]:
    """Per tool of ``currents`` (tool -> its current limit): the first :data:`MAX_EVIDENCE`
    productive repeats that its limit would prune (by run, then start), as quotable calls. One
    query, each tool's first calls a part of it (``UNION ALL``): at 10M spans over chDB 0.11 s
    for two tools against 0.07 s a tool asked apart, and 0.32 s numbered by a window instead."""
    if not currents:
        return {}
    where, params = f.where("c")
    part = f"""SELECT * FROM (
        SELECT c.tool AS tool, c.run_id AS run_id, c.node_id AS node_id, c.ordinal AS ordinal,
               c.arguments AS arguments, c.start_ns AS start_ns
        FROM repeat_outcomes c
        WHERE {where} AND c.tool = ? AND c.outcome != 'unknown' AND c.productive AND c.ordinal > ?
        ORDER BY c.run_id, c.start_ns, c.node_id LIMIT {MAX_EVIDENCE}) p"""
    driving = as_connection(con).df(
        f"SELECT e.* FROM ({' UNION ALL '.join([part] * len(currents))}) e "
        "ORDER BY e.tool, e.run_id, e.start_ns, e.node_id",
        [value for tool, current in currents.items() for value in (*params, tool, current)],
    )
    out: dict[str, list[dict[str, Any]]] = {tool: [] for tool in currents}
    row: Any
    for row in driving.itertuples(index=False):
        out[str(row.tool)].append(
            {"run_id": str(row.run_id), "node_id": str(row.node_id), "ordinal": int(row.ordinal),
             "arguments": _quote(row.arguments), "link": f"run?run={row.run_id}&node={row.node_id}"}
        )  # fmt: skip
    return out


def _quote(value: Any, limit: int = 120) -> str:
    text = "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def tuning_by_tool(
    con: StoreConnection,
    filters: Filters | None = None,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    min_productive: int = DEFAULT_MIN_PRODUCTIVE,
    glance: bool = False,
) -> pd.DataFrame:
    """Per tool: current and recommended limit, verdict, evidence and reason.

    ``raise`` needs ``min_productive`` productive repeats; data that never ran under a limit
    says so (``observed_limit`` false and ``current_max_repeats`` missing, ``<NA>`` in its
    nullable integer column: none observed; the advice rests on what-if replay at limit 1); the evidence
    names the branches a limit would end and quotes the calls that drive a raise; a tool
    whose productive repeats follow its own other calls (it reads and writes) gets
    ``mutates`` with its state-change rule instead of a higher limit.

    ``glance``: the same verdicts and limits without what explains them (no ``reason``,
    ``evidence`` or ``branches_ended``: three queries fewer, a call 0.43-0.62 s against
    0.75-0.78 s at 10M spans over chDB): the dashboard overview's table.
    """
    f = filters or Filters()
    samples = _samples(con, f)
    limits = _current_limits(con, f)
    pruned = _pruned_counts(con, f)
    turns = None if glance else _single_tool_turns(con, f)
    afresh = {} if glance else _afresh(con, f)
    causes = _causes(con, f)
    is_unknown = samples["unknown"]
    per_tool, none = _by_tool(samples[~is_unknown]), samples.iloc[0:0]
    unknowns = samples[is_unknown].groupby("tool")["n"].sum()
    rows: list[dict[str, Any]] = []
    raised: dict[str, int] = {}
    item: Any
    for item in limits.itertuples(index=False):
        tool = str(item.tool)
        observed = pd.notna(item.current_limit)
        current = int(item.current_limit) if observed else 1
        mine = per_tool.get(tool, none)
        unknown = int(unknowns.get(tool, 0))
        n = _weight(mine)
        productive = _weight(mine, mine["productive"])
        low, high = wilson_interval(productive, n)
        pruned_here = int(pruned.loc[pruned["tool"] == tool, "pruned"].sum())
        recommended = _recommend(mine, tolerance)
        pruned_wasted = (~mine["productive"]) & (mine["ordinal"] > recommended)
        saved = _weight(mine, pruned_wasted)
        tokens = int(mine.loc[pruned_wasted, "chars"].sum())
        verdict, reason, mutating = _verdict(
            causes[causes["tool"] == tool],
            mine,
            tool=tool,
            n=n,
            current=current,
            recommended=recommended,
            pruned=pruned_here,
            unknown=unknown,
            min_samples=min_samples,
            min_productive=min_productive,
            tolerance=tolerance,
        )
        if verdict in ("insufficient_data", "mutates", "keep"):
            recommended = current
        if verdict == "raise":
            raised[tool] = current  # its evidence: the calls this limit prunes, all tools' in one query
        ends = None if turns is None else _ends(turns, tool, recommended)
        if not observed:
            reason = f"no observed limit (the agent never ran with one): what-if replay at limit {current}; {reason}"
        if ends is not None:
            reason += f"; limit {recommended} would end {ends} branch(es) (turns whose every call it prunes)"
        if unknown:
            reason += f"; {unknown} repeat(s) with no captured result left out"
        if afresh.get(tool):
            reason += (
                f"; {afresh[tool]} identical call(s) came after a state change (a write, or a program that may "
                "write) and counted afresh: needed re-runs, not loops, so they argue for no higher limit"
            )
        rows.append(
            {"tool": tool, "current_max_repeats": current if observed else None,
             "limit_source": item.limit_source if isinstance(item.limit_source, str) else ("default" if observed
                                                                                          else "none"),
             "observed_limit": bool(observed), "recommended_max_repeats": recommended, "verdict": verdict,
             "samples": n, "productive": productive, "unknown": unknown,
             "productive_rate": productive / n if n else 0.0, "productive_rate_low": low, "productive_rate_high": high,
             "calls": int(item.calls), "pruned": pruned_here, "calls_saved": saved,
             "tokens_saved_est": tokens // 4, "mutating_tool": mutating,
             "branches_ended": ends, "evidence": [],
             "reason": reason}
        )  # fmt: skip
    if not rows:
        return pd.DataFrame()
    evidence = {} if glance else _evidence(con, f, raised)
    for row in rows:
        row["evidence"] = evidence.get(row["tool"], [])
    frame = pd.DataFrame(rows)
    if glance:
        frame = frame.drop(columns=["reason", "evidence", "branches_ended"])
    frame["current_max_repeats"] = frame["current_max_repeats"].astype("Int64")
    frame["_order"] = frame["verdict"].map(VERDICT_ORDER)
    return frame.sort_values(["_order", "samples", "tool"], ascending=[True, False, True], ignore_index=True).drop(
        columns="_order"
    )


def _recommend(samples: pd.DataFrame, tolerance: float) -> int:
    """The smallest limit whose loss (productive repeats past it / all productive) stays within
    ``tolerance``; 1 when none was productive."""
    productive = samples[samples["productive"]]
    total = _weight(productive)
    if total == 0:
        return 1
    limit = 1
    while _weight(productive, productive["ordinal"] > limit) / total > tolerance:
        limit += 1
    return limit


def _verdict(
    causes: pd.DataFrame,
    samples: pd.DataFrame,
    *,
    tool: str,
    n: int,
    current: int,
    recommended: int,
    pruned: int,
    unknown: int,
    min_samples: int,
    min_productive: int,
    tolerance: float,
) -> tuple[str, str, str | None]:
    if n == pruned == unknown == 0:
        return "insufficient_data", "no call of it repeated in the data: no repeat to judge, the limit stays", None
    if n < min_samples:
        advice = (
            f"only {n} executed repeat(s) with a known outcome (need {min_samples}); {pruned} repeat(s) were pruned "
            "with no outcome: collect more, for instance in shadow mode (TreeConfig(shadow=True)), which runs them "
            "and reports them"
        )
        return "insufficient_data", advice, None
    productive = _weight(samples, samples["productive"])
    cause = _mutating_cause(causes, n, productive)
    if cause is not None:
        mutating, count, rate_with, rate_without = cause
        if mutating == tool:
            advice = (
                f"{count} repeat(s) were productive after another call of {tool} itself ({rate_with:.0%} productive "
                f"with one, {rate_without:.0%} without): {tool} both reads and writes; give it a state-change rule "
                f'(classifier = "shell" for a shell tool, else mutates_when on the arguments that write) instead '
                "of a higher limit"
            )
        else:
            advice = (
                f"{count} repeat(s) were productive after a successful {mutating} call ({rate_with:.0%} productive "
                f"with it, {rate_without:.0%} without): mark {mutating} as mutates=true instead of raising the limit"
            )
        return "mutates", advice, mutating
    share = f"{productive}/{n} repeats productive"
    if recommended > current and productive < min_productive:
        return (
            "keep",
            f"{share}: too few productive repeats to raise the limit (need {min_productive}); limit {current} "
            f"would prune {_weight(samples, samples['productive'] & (samples['ordinal'] > current))} of them",
            None,
        )
    if recommended == current:
        return "keep", f"{share}; limit {current} loses at most {tolerance:.0%} of the productive ones", None
    if recommended > current:
        lost = _weight(samples, samples["productive"] & (samples["ordinal"] > current))
        return (
            "raise",
            f"{share}; limit {current} would prune {lost} productive repeat(s): {recommended} keeps them",
            None,
        )
    return "lower", f"{share}; repeats past {recommended} are wasted, limit {current} lets them run", None


def limits_toml(
    tuning: pd.DataFrame, *, default_max_repeats: int | None = None, rules: pd.DataFrame | None = None
) -> str:
    """The TOML limits file (``TreeConfig.from_file`` / ``treellm run --limits``) of a tuning,
    with the advised ``read_only`` rules of ``rules`` (``analysis.rules.rules_by_tool``)."""
    tools: dict[str, dict[str, Any]] = {}
    if rules is not None and len(rules):
        for tool, group in rules[rules["advised"]].groupby("tool"):
            tools.setdefault(str(tool), {})["read_only"] = [str(p) for p in group["read_only"]]
    row: Any
    for row in tuning.itertuples(index=False):
        if row.verdict in ("keep", "raise", "lower"):
            tools.setdefault(str(row.tool), {})["max_repeats"] = int(row.recommended_max_repeats)
        elif row.verdict == "mutates" and isinstance(row.mutating_tool, str):
            if row.mutating_tool == row.tool and row.tool in DEFAULT_SHELL_TOOLS:
                tools.setdefault(str(row.tool), {})["classifier"] = "shell"
            elif row.mutating_tool != row.tool:
                tools.setdefault(row.mutating_tool, {})["mutates"] = True
    document: dict[str, Any] = {}
    if default_max_repeats is not None:
        document["defaults"] = {"max_repeats_per_signature": default_max_repeats}
    document["tools"] = dict(sorted(tools.items()))
    header = "# Per-tool limits tuned from data by `treellm tune` (limits file > Tool(max_repeats) > default).\n"
    return header + tomli_w.dumps(document)
