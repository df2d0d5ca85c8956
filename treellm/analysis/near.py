"""Near repeats: calls of one tool on one path that are not identical but close.

The seed's honest limitation: exact signatures miss an agent that rephrases a query or
bumps ``limit: 9`` to ``limit: 10``. This finds such pairs among *consecutive* calls of
the same tool in the same run (blocked by run and tool, so it is linear in the calls;
calls of one turn are parallel, not repeats of each other, and are not paired):

- ``number_step``: the same arguments but one number, changed by a small step
  (at most ``max(1, 10%)``);
- ``string_similar``: the same arguments but one string, nearly equal after normalising
  case, spaces and punctuation (similarity >= ``similarity``);
- ``key_added`` / ``key_dropped``: the same arguments with one key more or less.

**Paging is not looping**: when the changed number is a position (offset, page, start,
line, cursor, skip...) or the pair moves an offset/limit window forward, and the result
differs, the pair is progress: it is counted as ``paging`` and not as a near repeat.
A near repeat is *wasted* when its result hash equals the earlier call's.
Needs captured arguments (capture ``redacted`` or ``full``).
"""

from __future__ import annotations

import difflib
import re
from collections import defaultdict
from typing import Any

import duckdb
import orjson
import pandas as pd

from treellm.analysis.filters import Filters
from treellm.analysis.metrics import CALLS_SQL

__all__ = ["classify_pair", "near_repeat_pairs", "near_repeats_by_tool"]

PAGING_KEYS = frozenset(
    {"offset", "page", "start", "start_line", "line", "from", "cursor", "skip", "page_number", "after", "begin"}
)
_PUNCT = re.compile(r"[^\w\s]")
_SPACE = re.compile(r"\s+")


def _normal(text: str) -> str:
    return _SPACE.sub(" ", _PUNCT.sub(" ", text.lower())).strip()


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def classify_pair(before: Any, after: Any, *, similarity: float = 0.85) -> str | None:
    """How two argument objects are close: a near-repeat kind, ``"paging"``, or None."""
    if not isinstance(before, dict) or not isinstance(after, dict) or before == after:
        return None
    keys_before, keys_after = set(before), set(after)
    if keys_before != keys_after:
        if len(keys_before ^ keys_after) != 1:
            return None
        common = keys_before & keys_after
        if any(before[k] != after[k] for k in common):
            return None
        return "key_added" if len(keys_after) > len(keys_before) else "key_dropped"
    changed = [k for k in before if before[k] != after[k]]
    if len(changed) == 2 and all(_number(before[k]) and _number(after[k]) for k in changed):
        if any(k.lower() in PAGING_KEYS and after[k] > before[k] for k in changed):
            return "paging"
        return None
    if len(changed) != 1:
        return None
    key = changed[0]
    old, new = before[key], after[key]
    if _number(old) and _number(new):
        if key.lower() in PAGING_KEYS and new > old:
            return "paging"
        return "number_step" if abs(new - old) <= max(1.0, 0.1 * abs(old)) else None
    if isinstance(old, str) and isinstance(new, str):
        a, b = _normal(old), _normal(new)
        if a == b:
            return "string_similar"
        if min(len(a), len(b)) >= 0.5 * max(len(a), len(b), 1):
            matcher = difflib.SequenceMatcher(None, a, b)
            if matcher.real_quick_ratio() < similarity or matcher.quick_ratio() < similarity:
                return None
            return "string_similar" if matcher.ratio() >= similarity else None
    return None


def _load(con: duckdb.DuckDBPyConnection, f: Filters) -> pd.DataFrame:
    where, params = f.where("c")
    return con.execute(
        f"""SELECT c.run_id, c.tool, c.signature, c.arguments, c.result_hash, c.node_id, c.parent_id
            FROM ({CALLS_SQL}) c WHERE {where} AND c.arguments IS NOT NULL
            ORDER BY c.run_id, c.tool, c.start_ns, c.span_id""",
        params,
    ).df()


def near_repeat_pairs(
    con: duckdb.DuckDBPyConnection, filters: Filters | None = None, *, similarity: float = 0.85
) -> pd.DataFrame:
    """Every close pair of consecutive calls of one tool in one run, with its kind and outcome."""
    calls = _load(con, filters or Filters())
    rows: list[tuple[Any, ...]] = []
    previous: tuple[Any, ...] | None = None
    parsed_previous: Any = None
    # plain Python lists: iterating Arrow-backed columns row by row costs more than the rest
    for row in zip(*(calls[column].tolist() for column in calls.columns), strict=True):
        run_id, tool, sig, arguments, result_hash, node_id, parent_id = row
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            parsed = None
        same_turn = previous is not None and parent_id is not None and previous[6] == parent_id
        if (
            previous is not None
            and previous[0] == run_id
            and previous[1] == tool
            and previous[2] != sig
            and not same_turn
        ):
            kind = classify_pair(parsed_previous, parsed, similarity=similarity)
            if kind is not None:
                same_result = result_hash is not None and result_hash == previous[4]
                rows.append((run_id, tool, kind, same_result, previous[5], node_id, previous[3], arguments))
        previous, parsed_previous = row, parsed
    frame = pd.DataFrame(
        rows,
        columns=["run_id", "tool", "kind", "same_result", "earlier_node_id", "node_id", "earlier_arguments",
                 "arguments"],
    )  # fmt: skip
    # paging that returns the same result again is not progress: it is a wasted near repeat
    frame.loc[(frame["kind"] == "paging") & frame["same_result"], "kind"] = "number_step"
    return frame


def near_repeats_by_tool(
    con: duckdb.DuckDBPyConnection, filters: Filters | None = None, *, similarity: float = 0.85, examples: int = 3
) -> pd.DataFrame:
    """Per tool: near repeats by kind, how many were wasted, paging pairs apart, and examples."""
    pairs = near_repeat_pairs(con, filters, similarity=similarity)
    columns = ["tool", "near_repeats", "wasted", "number_step", "string_similar", "key_added", "key_dropped",
               "paging", "examples"]  # fmt: skip
    if pairs.empty:
        return pd.DataFrame(columns=columns)
    out: dict[str, dict[str, Any]] = defaultdict(lambda: {c: 0 for c in columns[1:-1]} | {"examples": []})
    row: Any
    for row in pairs.itertuples(index=False):
        entry = out[row.tool]
        entry[row.kind] += 1
        if row.kind != "paging":
            entry["near_repeats"] += 1
            entry["wasted"] += int(bool(row.same_result))
            if len(entry["examples"]) < examples:
                entry["examples"].append(f"{row.earlier_arguments} -> {row.arguments}")
    frame = pd.DataFrame([{"tool": tool, **values} for tool, values in out.items()], columns=columns)
    return frame.sort_values(["near_repeats", "tool"], ascending=[False, True], ignore_index=True)
