"""Near repeats and paging: consecutive calls of one tool on one path that are close.

The rule (``paging``, the near kinds, a different question) is :mod:`treellm.derive.near`:
pure, over a run's calls. Here it is read from a store: over DuckDB it pairs the calls at
query time; ClickHouse keeps the pairs ``treellm derive`` found per trace with the same rule
(the ``near_pairs`` view) for the default similarity and shell tools. A near repeat is
*wasted* when its result equals the earlier call's. Needs captured arguments (capture
``redacted`` or ``full``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Final

import pandas as pd

from treellm.analysis.filters import Filters, check_limit
from treellm.derive.near import DEFAULT_SIMILARITY, NEAR_KINDS, PAIR_COLUMNS, classify_commands, classify_pair
from treellm.shell import DEFAULT_SHELL_TOOLS
from treellm.store.backend import Connection, StoreConnection, as_connection
from treellm.store.judged import near_pairs_of

__all__ = ["classify_commands", "classify_pair", "near_repeat_pairs", "near_repeats", "near_repeats_by_tool"]

_STORED_SQL: Final = (
    f"SELECT {', '.join(f'c.{name}' for name in PAIR_COLUMNS)} FROM near_pairs c "
    "WHERE {where} ORDER BY NOT (c.kind = 'near' AND c.same_result), c.run_id, c.seq"
)


def near_repeats(
    con: StoreConnection,
    filters: Filters | None = None,
    *,
    similarity: float = DEFAULT_SIMILARITY,
    shell_tools: frozenset[str] | None = None,
    limit: int | None = None,
) -> pd.DataFrame:
    """One row per close pair of consecutive calls of one tool in one run: both calls (node,
    call and span ids), ``kind`` (``near`` or ``paging``), ``detail`` (the near kind), and
    whether the later call returned the same result. Near repeats with the same result come
    first (the wasted ones), then the rest, in run order (the first ``limit``, when given)."""
    check_limit(limit)
    engine = as_connection(con)
    where, params = (filters or Filters()).where("c")
    stored = similarity == DEFAULT_SIMILARITY and shell_tools in (None, frozenset(DEFAULT_SHELL_TOOLS))
    if engine.dialect == "clickhouse" and stored:
        frame = engine.df(_STORED_SQL.format(where=where) + ("" if limit is None else f" LIMIT {int(limit)}"), params)
        frame = frame.astype(object).where(frame.notna(), None)
        frame["same_result"] = frame["same_result"].astype(bool)
        return frame.reset_index(drop=True)
    pairs = _pairs(engine, where, params, similarity=similarity, shell_tools=shell_tools)
    return pd.DataFrame(pairs if limit is None else pairs[:limit], columns=PAIR_COLUMNS)


_KIND, _SAME, _RUN = (PAIR_COLUMNS.index(name) for name in ("kind", "same_result", "run_id"))


def _pairs(
    engine: Connection, where: str, params: list[Any], *, similarity: float, shell_tools: frozenset[str] | None
) -> list[tuple[Any, ...]]:
    """The pairs of the calls ``where`` keeps (rows of ``PAIR_COLUMNS``), judged over DuckDB, in
    :func:`near_repeats` order: near repeats with the same result first, then by run (stable)."""
    pairs = near_pairs_of(engine, where, params, similarity=similarity, shell_tools=shell_tools)
    return sorted(pairs, key=lambda p: (not (p[_KIND] == "near" and p[_SAME]), p[_RUN]))


_COUNTS: Final = ", ".join(
    f"countIf(c.kind = 'near' AND c.detail = '{kind}') AS {kind}" for kind in (*NEAR_KINDS, "window_repeated")
)
_BY_TOOL_SQL_CLICKHOUSE: Final = f"""
SELECT c.tool AS tool, countIf(c.kind = 'near') AS near_repeats, countIf(c.kind = 'near' AND c.same_result) AS wasted,
    {_COUNTS}, countIf(c.kind = 'paging') AS paging,
    arrayMap(x -> x.4, groupArraySortedIf({{examples}})(
        (NOT c.same_result, c.run_id, c.seq, concat(c.earlier_arguments, ' -> ', c.arguments)), c.kind = 'near'))
        AS examples
FROM near_pairs c
WHERE {{where}}
GROUP BY c.tool"""
"""Per tool over ClickHouse's kept pairs, what the loop of :func:`near_repeats_by_tool` counts."""


def near_repeat_pairs(
    con: StoreConnection, filters: Filters | None = None, *, similarity: float = DEFAULT_SIMILARITY
) -> pd.DataFrame:
    """:func:`near_repeats` with ``kind`` as the detailed kind (``paging`` or a near kind)."""
    pairs = near_repeats(con, filters, similarity=similarity)
    if pairs.empty:
        return pd.DataFrame(columns=PAIR_COLUMNS)
    out = pairs.copy()
    out["kind"] = out["detail"].where(out["kind"] == "near", "paging")
    return out


_BY_TOOL_COLUMNS: Final = ["tool", "near_repeats", "wasted", *NEAR_KINDS, "window_repeated", "paging", "examples"]


def near_repeats_by_tool(
    con: StoreConnection, filters: Filters | None = None, *, similarity: float = DEFAULT_SIMILARITY, examples: int = 3
) -> pd.DataFrame:
    """Per tool: near repeats by kind, how many were wasted, paging pairs apart, and examples
    (the first ``examples`` near repeats in :func:`near_repeats` order). Over ClickHouse, counted
    where the pairs are kept, without fetching them."""
    engine = as_connection(con)
    columns = _BY_TOOL_COLUMNS
    if engine.dialect == "clickhouse" and similarity == DEFAULT_SIMILARITY:
        where, params = (filters or Filters()).where("c")
        counts = engine.df(_BY_TOOL_SQL_CLICKHOUSE.format(where=where, examples=max(int(examples), 1)), params)
        frame = counts[columns].astype({c: int for c in columns[1:-1]})
        frame["examples"] = [list(x)[: max(examples, 0)] for x in frame["examples"]]
        return frame.sort_values(["near_repeats", "tool"], ascending=[False, True], ignore_index=True)
    where, params = (filters or Filters()).where("c")
    return _near_by_tool(_pairs(engine, where, params, similarity=similarity, shell_tools=None), examples)


def near_repeats_and_pairs(
    con: StoreConnection, filters: Filters | None = None, *, limit: int, examples: int = 3
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(:func:`near_repeats_by_tool`, :func:`near_repeats` with ``limit``) as one page shows them:
    over DuckDB from one judgement of the calls (at 1M spans each took 0.9-1.1 s), over ClickHouse
    each counted or fetched where the pairs are kept."""
    if as_connection(con).dialect == "clickhouse":
        return near_repeats_by_tool(con, filters, examples=examples), near_repeats(con, filters, limit=limit)
    check_limit(limit)
    where, params = (filters or Filters()).where("c")
    pairs = _pairs(as_connection(con), where, params, similarity=DEFAULT_SIMILARITY, shell_tools=None)
    return _near_by_tool(pairs, examples), pd.DataFrame(pairs[:limit], columns=PAIR_COLUMNS)


_TOOL, _DETAIL, _EARLIER, _ARGUMENTS = (
    PAIR_COLUMNS.index(name) for name in ("tool", "detail", "earlier_arguments", "arguments")
)


def _near_by_tool(pairs: list[tuple[Any, ...]], examples: int) -> pd.DataFrame:
    """Per tool, the counts and examples of ``pairs`` (in :func:`near_repeats` order)."""
    columns = _BY_TOOL_COLUMNS
    if not pairs:
        return pd.DataFrame(columns=columns)
    out: dict[str, dict[str, Any]] = defaultdict(lambda: {c: 0 for c in columns[1:-1]} | {"examples": []})
    for row in pairs:
        entry = out[row[_TOOL]]
        if row[_KIND] == "paging":
            entry["paging"] += 1
            continue
        entry[row[_DETAIL]] += 1
        entry["near_repeats"] += 1
        entry["wasted"] += int(bool(row[_SAME]))
        if len(entry["examples"]) < examples:
            entry["examples"].append(f"{row[_EARLIER]} -> {row[_ARGUMENTS]}")
    frame = pd.DataFrame([{"tool": tool, **values} for tool, values in out.items()], columns=columns)
    return frame.sort_values(["near_repeats", "tool"], ascending=[False, True], ignore_index=True)
