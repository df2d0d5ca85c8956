"""Per-call answers: every executed repeat with its outcome and a short reason.

One row per executed call with ordinal >= 2 (``docs/architecture.md``): its trace and span
ids, run, tool, tool call id, ordinal, its **twin** (the most recent earlier identical call
its count counted), the outcome and why:

- ``productive``: its twin failed and it succeeded, or its result differs from every
  earlier identical call it counted;
- ``unknown``: it or one of those calls has no captured result (missing results never
  compare equal);
- ``wasted``: it failed, or it returned what an earlier identical call returned with no
  state change between (state changes restart counts, so there was none).
"""

from __future__ import annotations

from typing import Any

import orjson
import pandas as pd

from treellm.analysis.filters import Filters
from treellm.analysis.metrics import CALLS_SQL
from treellm.store.engine import DuckDBConnection, StoreConnection, as_connection

__all__ = ["REPEAT_COLUMNS", "judge_repeat", "repeats"]

REPEAT_COLUMNS = [
    "trace_id", "span_id", "run_id", "node_id", "tool", "call_id", "ordinal", "twin_node_id", "twin_call_id",
    "twin_span_id", "outcome", "reason", "arguments",
]  # fmt: skip


def _earlier(raw: Any) -> list[str]:
    if not isinstance(raw, str) or not raw:
        return []
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return []
    return [str(v) for v in value] if isinstance(value, list) else []


def judge_repeat(*, status: str, result_hash: str | None, twins: list[tuple[str | None, str]]) -> tuple[str, str]:
    """(outcome, reason) of one repeat from its status, its result hash and its earlier
    identical calls' ``(result_hash, status)``, oldest first (pure: the rule, in one place)."""
    if status == "failed":
        if twins and twins[-1][1] == "failed":
            return "wasted", "failed again, as its twin did"
        return "wasted", "failed"
    if twins and twins[-1][1] == "failed":
        return "productive", "its twin failed; this one succeeded (a retry that worked)"
    if result_hash is None or any(h is None for h, _ in twins):
        return "unknown", "no captured result for this call or an earlier identical call"
    if all(h != result_hash for h, _ in twins):
        return "productive", "a new result: differs from every earlier identical call"
    same = sum(1 for h, _ in twins if h == result_hash)
    return "wasted", f"same result as {same} earlier identical call(s), nothing changed state between"


def repeats(con: StoreConnection, filters: Filters | None = None) -> pd.DataFrame:
    """One row per executed repeat (``REPEAT_COLUMNS``), in run and time order."""
    where, params = (filters or Filters()).where("c")
    engine = as_connection(con)
    sql = f"""SELECT c.trace_id, c.span_id, c.run_id, c.node_id, c.tool, c.ordinal, c.status, c.result_hash,
                   c.earlier_node_ids, c.arguments, s.tool_call_id AS call_id
            FROM ({CALLS_SQL}) c JOIN spans s USING (trace_id, span_id)
            WHERE {where} AND c.run_id IN (SELECT run_id FROM ({CALLS_SQL}) x WHERE x.ordinal >= 2)
            ORDER BY c.run_id, c.start_ns, c.span_id"""
    calls: list[tuple[Any, ...]]
    if isinstance(engine, DuckDBConnection):
        calls = engine.raw.execute(sql, params).fetchall()
    else:
        frame = engine.df(sql, params).astype(object)
        calls = list(frame.where(frame.notna(), None).itertuples(index=False, name=None))
    by_node = {(row[2], row[3]): row for row in calls}
    out: list[tuple[Any, ...]] = []
    for row in calls:
        trace_id, span_id, run_id, node_id, tool, ordinal, status, digest, earlier_raw, arguments, call_id = row
        if ordinal is None or ordinal < 2:
            continue
        earlier = [by_node[(run_id, e)] for e in _earlier(earlier_raw) if (run_id, e) in by_node]
        outcome, reason = judge_repeat(status=status, result_hash=digest, twins=[(e[7], e[6]) for e in earlier])
        twin = earlier[-1] if earlier else None
        out.append(
            (trace_id, span_id, run_id, node_id, tool, call_id, int(ordinal), twin[3] if twin else None,
             twin[10] if twin else None, twin[1] if twin else None, outcome, reason, arguments)
        )  # fmt: skip
    return pd.DataFrame(out, columns=REPEAT_COLUMNS)
