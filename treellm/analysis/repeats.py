"""Every identical call, shown and judged by the evidence (``docs/architecture.md``).

The rule is :mod:`treellm.derive.repeats` (one row per identical repeat, its twin, whether
the limit counts it, its outcome and the evidence): pure, over a run's calls. Here it is read
from a store: over DuckDB it judges the runs that hold a repeat at query time; ClickHouse keeps
the judgements ``treellm derive`` made per trace with the same rule (the ``identical_repeats``
view), so nothing is judged at read time there.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Final

import pandas as pd

from treellm.analysis.filters import Filters, check_limit
from treellm.derive.repeats import CODE_WRITES, REPEAT_COLUMNS, CallFacts, judge_repeat
from treellm.store.backend import Connection, StoreConnection, as_connection, fetch_rows
from treellm.store.judged import identical_repeats_of
from treellm.store.views import REPEAT_CALLS_SQL

__all__ = [
    "CODE_WRITES",
    "REPEAT_COLUMNS",
    "CallFacts",
    "identical_repeats_by_tool",
    "judge_repeat",
    "load_calls",
    "repeats",
]

_STORED_SQL: Final = (
    f"SELECT {', '.join(f'c.{name}' for name in REPEAT_COLUMNS)} FROM identical_repeats c "
    "WHERE {where} ORDER BY c.run_id, c.seq"
)


def _where(filters: Filters | None, tools: Collection[str] | None) -> tuple[str, list[Any]]:
    """The condition on the calls (alias ``c``) of ``filters``, and of ``tools`` when given."""
    where, params = (filters or Filters()).where("c")
    if tools is None:
        return where, params
    chosen = sorted(tools)
    if not chosen:
        return "FALSE", []
    return f"{where} AND c.tool IN ({', '.join('?' for _ in chosen)})", [*params, *chosen]


def load_calls(
    con: StoreConnection, filters: Filters | None = None, *, tools: Collection[str] | None = None
) -> list[tuple[Any, ...]]:
    """The executed calls of the runs that hold an identical repeat (of one of ``tools``, when
    given), every call of those runs, in run and time order: (trace_id, span_id, run_id,
    node_id, parent_id, tool, signature, ordinal, status, result_hash, arguments, call_id)."""
    where, params = _where(filters, tools)
    return fetch_rows(con, REPEAT_CALLS_SQL.format(where=where), params)


def repeats(
    con: StoreConnection,
    filters: Filters | None = None,
    *,
    limit: int | None = None,
    tools: Collection[str] | None = None,
) -> pd.DataFrame:
    """One row per identical repeat (``REPEAT_COLUMNS``) of the runs and tool ``filters`` keep
    (and of ``tools``, when given), in run and time order (the first ``limit``, when given)."""
    check_limit(limit)
    f = filters or Filters()
    engine = as_connection(con)
    where, params = _where(f, tools)
    if engine.dialect == "clickhouse":
        first = "" if limit is None else f" LIMIT {int(limit)}"
        frame = engine.df(_STORED_SQL.format(where=where) + first, params)
        frame = frame.astype(object).where(frame.notna(), None)
        frame["counted"] = frame["counted"].astype(bool)
        return frame.reset_index(drop=True)
    kept = _judged(engine, f, tools)
    return pd.DataFrame(kept if limit is None else kept[:limit], columns=REPEAT_COLUMNS)


_TOOL, _OUTCOME, _COUNTED = (REPEAT_COLUMNS.index(name) for name in ("tool", "outcome", "counted"))


def _judged(engine: Connection, f: Filters, tools: Collection[str] | None) -> list[tuple[Any, ...]]:
    """Over DuckDB, the identical repeats (rows of ``REPEAT_COLUMNS``) that :func:`repeats` gives,
    judged at query time."""
    judged = identical_repeats_of(engine, *_where(f, tools))
    return [r for r in judged if (f.tool is None or r[_TOOL] == f.tool) and (tools is None or r[_TOOL] in tools)]


IDENTICAL_COLUMNS = [
    "tool", "identical_repeats", "identical_productive", "identical_wasted", "identical_unknown", "counted",
    "counted_wasted",
]  # fmt: skip
_BY_TOOL_SQL: Final = """
SELECT c.tool AS tool, count(*) AS identical_repeats, sum(CASE WHEN c.outcome = 'productive' THEN 1 ELSE 0 END)
    AS identical_productive, sum(CASE WHEN c.outcome = 'wasted' THEN 1 ELSE 0 END) AS identical_wasted,
    sum(CASE WHEN c.outcome = 'unknown' THEN 1 ELSE 0 END) AS identical_unknown,
    sum(CASE WHEN c.counted THEN 1 ELSE 0 END) AS counted,
    sum(CASE WHEN c.counted AND c.outcome = 'wasted' THEN 1 ELSE 0 END) AS counted_wasted
FROM identical_repeats c
WHERE {where}
GROUP BY c.tool
ORDER BY c.tool"""


def identical_repeats_by_tool(con: StoreConnection, filters: Filters | None = None) -> pd.DataFrame:
    """Per tool (``IDENTICAL_COLUMNS``): every identical repeat and its outcomes beside those
    the limit's rule counts; repeats of a call that names no tool in a group of their own. Over
    ClickHouse, counted where the judgements are kept, without fetching them."""
    engine = as_connection(con)
    if engine.dialect == "clickhouse":
        where, params = (filters or Filters()).where("c")
        counts = engine.df(_BY_TOOL_SQL.format(where=where), params)
        return counts[IDENTICAL_COLUMNS].astype({c: int for c in IDENTICAL_COLUMNS[1:]}).reset_index(drop=True)
    return _identical_by_tool(_judged(engine, filters or Filters(), None))


def identical_repeats_and_rows(
    con: StoreConnection, filters: Filters | None = None, *, limit: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(:func:`identical_repeats_by_tool`, :func:`repeats` with ``limit``) as one page shows them:
    over DuckDB from one judgement of the calls (at 1M spans each took 2.1-2.3 s), over ClickHouse
    each counted or fetched where the judgements are kept."""
    if as_connection(con).dialect == "clickhouse":
        return identical_repeats_by_tool(con, filters), repeats(con, filters, limit=limit)
    check_limit(limit)
    judged = _judged(as_connection(con), filters or Filters(), None)
    return _identical_by_tool(judged), pd.DataFrame(judged[:limit], columns=REPEAT_COLUMNS)


def _identical_by_tool(judged: list[tuple[Any, ...]]) -> pd.DataFrame:
    """Per tool (sorted; a call that names no tool last), the counts of ``IDENTICAL_COLUMNS``."""
    counts: dict[Any, list[int]] = {}
    for row in judged:
        entry = counts.get(row[_TOOL])
        if entry is None:
            entry = counts[row[_TOOL]] = [0, 0, 0, 0, 0, 0]
        outcome, counted = row[_OUTCOME], bool(row[_COUNTED])
        entry[0] += 1
        entry[1] += outcome == "productive"
        entry[2] += outcome == "wasted"
        entry[3] += outcome == "unknown"
        entry[4] += counted
        entry[5] += counted and outcome == "wasted"
    named = sorted(tool for tool in counts if tool is not None)
    order = named + ([None] if None in counts else [])
    return pd.DataFrame([[tool, *counts[tool]] for tool in order], columns=IDENTICAL_COLUMNS)
