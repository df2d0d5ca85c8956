"""The whole report and the whole tuning as plain data (what ``treellm report`` and
``treellm tune`` print), assembled from the ``*_by_*`` functions."""

from __future__ import annotations

from typing import Any

import pandas as pd

from treellm.analysis.filters import Filters
from treellm.analysis.measures import (
    content_by_tool,
    internal_calls_by_tool,
    prune_rate_by_tool,
    repeat_outcome_by_tool,
    totals,
)
from treellm.analysis.near import near_repeats_by_tool
from treellm.analysis.repeats import identical_repeats_by_tool
from treellm.analysis.rules import rules_by_tool
from treellm.analysis.tuning import DEFAULT_MIN_PRODUCTIVE, DEFAULT_MIN_SAMPLES, DEFAULT_TOLERANCE, tuning_by_tool
from treellm.store.backend import StoreConnection
from treellm.store.ingest import UNKNOWN_TOOL

__all__ = ["report", "tune"]


def report(con: StoreConnection, filters: Filters | None = None) -> dict[str, Any]:
    """``{"runs", "tool_calls", "pruned", "tools": [...]}``, one item per tool with ``calls``,
    ``pruned``, ``prune_rate``, ``identical_repeats`` (every call identical to an earlier call
    on its path, :func:`~treellm.analysis.repeats`) with the ``identical_productive`` and
    ``identical_wasted`` among them, ``exact_repeats`` (those the limit's rule counts) with
    ``productive_repeats``, ``wasted_repeats`` and ``unknown_repeats`` among them,
    ``near_repeats``, and the calls whose spans hold no arguments (``arguments_unknown``: never
    a repeat) or no result (``results_unknown``), with ``capture_switch`` (``framework`` and
    ``switch``, the setting that records them) when there are any. ``internal_tools`` lists the
    calls that no count includes, per framework-internal tool (``tool``, ``calls``), and
    ``internal_calls`` sums them: ``treellm ingest`` counts them among its tool calls."""
    f = filters or Filters()
    out: dict[str, Any] = totals(con, f)
    rates: dict[Any, dict[Any, Any]] = prune_rate_by_tool(con, f).set_index("tool").to_dict("index")
    repeats: dict[Any, dict[Any, Any]] = (
        repeat_outcome_by_tool(con, f)
        .groupby("tool")[["repeats", "productive", "wasted", "unknown"]]
        .sum()
        .to_dict("index")
    )
    near: dict[Any, dict[Any, Any]] = near_repeats_by_tool(con, f).set_index("tool").to_dict("index")
    by_tool = identical_repeats_by_tool(con, f)
    identical = {_tool_name(t): row for t, row in by_tool.set_index("tool").to_dict("index").items()}
    content: dict[Any, dict[Any, Any]] = content_by_tool(con, f).set_index("tool").to_dict("index")
    none = {"repeats": 0, "productive": 0, "wasted": 0, "unknown": 0}
    tools = []
    for tool, r in rates.items():
        rep = repeats.get(tool, none)
        lacking = content.get(tool, {})
        tools.append(
            {"tool": _tool_name(tool), "calls": int(r["calls"]), "pruned": int(r["pruned"]),
             "prune_rate": round(float(r["prune_rate"]), 4), "exact_repeats": int(rep["repeats"]),
             "productive_repeats": int(rep["productive"]), "wasted_repeats": int(rep["wasted"]),
             "unknown_repeats": int(rep["unknown"]),
             **{k: int(identical.get(_tool_name(tool), {}).get(k, 0))
                for k in ("identical_repeats", "identical_productive", "identical_wasted")},
             "near_repeats": int(near.get(tool, {}).get("near_repeats", 0)),
             "arguments_unknown": int(lacking.get("arguments_unknown", 0)),
             "results_unknown": int(lacking.get("results_unknown", 0)),
             "capture_switch": {"framework": lacking["framework"], "switch": lacking["switch"]} if lacking else None}
        )  # fmt: skip
    out["tools"] = tools
    out["identical_repeats"] = int(by_tool["identical_repeats"].sum())
    internal = internal_calls_by_tool(con, f)
    out["internal_tools"] = [
        {"tool": _tool_name(t), "calls": int(n)} for t, n in zip(internal["tool"], internal["calls"], strict=True)
    ]
    out["internal_calls"] = int(internal["calls"].sum())
    return out


def _tool_name(tool: Any) -> str:
    """A tool as the report names it: a span that names no tool (None, or NaN from a DataFrame
    over ClickHouse) is :data:`~treellm.store.ingest.UNKNOWN_TOOL`, never ``None`` or ``nan``."""
    if tool is None or tool == "" or (not isinstance(tool, str) and pd.isna(tool)):
        return UNKNOWN_TOOL
    return str(tool)


def tune(
    con: StoreConnection,
    filters: Filters | None = None,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    min_productive: int = DEFAULT_MIN_PRODUCTIVE,
) -> dict[str, Any]:
    """``{"tools": [...]}``: per tool the current and recommended ``max_repeats``, verdict,
    samples, productive rate, whether a limit was observed, the branches the limit would end,
    the calls that drive a raise (with deep links), the reason, and for shell tools the
    ``read_only`` rules that would let the limit see the wasted repeats the state-change
    rule hides (``rules``: pattern, hidden and newly seen wasted repeats, productive ones it
    would prune, whether it is advised; ``analysis.rules``)."""
    frame = tuning_by_tool(con, filters, tolerance=tolerance, min_samples=min_samples, min_productive=min_productive)
    rows: list[Any] = list(frame.itertuples(index=False))
    advice = rules_by_tool(con, filters)
    rules: dict[str, list[dict[str, Any]]] = {}
    rule: Any
    for rule in advice.itertuples(index=False):
        rules.setdefault(str(rule.tool), []).append(
            {"read_only": rule.read_only, "hidden_wasted": int(rule.hidden_wasted),
             "wasted_seen": int(rule.wasted_seen), "productive_pruned": int(rule.productive_pruned),
             "advised": bool(rule.advised), "advised_wasted_seen": int(rule.advised_wasted_seen),
             "advised_productive_pruned": int(rule.advised_productive_pruned), "examples": list(rule.examples)}
        )  # fmt: skip
    tools = [
        {"tool": row.tool,
         "current_max_repeats": None if pd.isna(row.current_max_repeats) else int(row.current_max_repeats),
         "recommended_max_repeats": int(row.recommended_max_repeats), "verdict": row.verdict,
         "samples": int(row.samples), "productive_rate": round(float(row.productive_rate), 4),
         "productive_rate_ci95": [round(float(row.productive_rate_low), 4), round(float(row.productive_rate_high), 4)],
         "calls_saved": int(row.calls_saved), "tokens_saved_est": int(row.tokens_saved_est),
         "mutating_tool": row.mutating_tool, "observed_limit": bool(row.observed_limit),
         "branches_ended": int(row.branches_ended), "unknown_outcomes": int(row.unknown),
         "evidence": list(row.evidence), "reason": row.reason, "rules": rules.get(str(row.tool), [])}
        for row in rows
    ]  # fmt: skip
    return {"tools": tools}
