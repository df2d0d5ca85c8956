"""Repeats split by how their run ended: do the runs that failed repeat more than the others?

A run's outcome is the ``runs`` view's: how treellm's tree ended (``completed``, ``failed``,
``budget_exhausted``, ``pruned_out``), or the result the data records (``success``,
``failure``: tau-bench's reward, SWE-bench's resolved flag, an exit status; see
:mod:`treellm.derive.formats.trajectory`). Pure over a store connection: one query of the
views valid in both dialects, plus :func:`~treellm.analysis.measures.repeat_samples`.
"""

from __future__ import annotations

import pandas as pd

from treellm.analysis.filters import Filters
from treellm.analysis.measures import repeat_samples
from treellm.store.backend import StoreConnection, as_connection

__all__ = ["repeats_by_run_outcome"]

_COLUMNS = ["run_outcome", "runs", "runs_with_repeats", "repeats", "productive", "wasted", "unknown"]


def repeats_by_run_outcome(con: StoreConnection, filters: Filters | None = None) -> pd.DataFrame:
    """Per run outcome: runs, runs with an executed identical repeat, executed repeats (ordinal
    >= 2) split into productive, wasted and unknown, and ``wasted_per_run``; most runs first.

    ``filters`` select the runs (and, with ``tool``, the repeats counted)."""
    f = filters or Filters()
    where, params = f.run_condition("r")
    runs = as_connection(con).df(f"SELECT r.run_id AS run_id, r.outcome AS run_outcome FROM runs r WHERE {where}",
                                 params)  # fmt: skip
    if runs.empty:
        return pd.DataFrame(columns=[*_COLUMNS, "wasted_per_run"])
    runs["run_outcome"] = runs["run_outcome"].fillna("unknown").astype(str)
    out = runs.groupby("run_outcome").size().rename("runs").to_frame()
    samples = repeat_samples(con, f)
    if not samples.empty:
        mine = samples.merge(runs, on="run_id")
        by = mine.groupby("run_outcome")
        out = out.join(
            pd.DataFrame(
                {
                    "runs_with_repeats": by["run_id"].nunique(),
                    "repeats": by.size(),
                    "productive": by["productive"].sum(),
                    "wasted": (mine["outcome"] == "wasted").groupby(mine["run_outcome"]).sum(),
                    "unknown": (mine["outcome"] == "unknown").groupby(mine["run_outcome"]).sum(),
                }
            )
        )
    out = out.reindex(columns=_COLUMNS[1:]).fillna(0).astype("int64").reset_index()
    out["wasted_per_run"] = out["wasted"] / out["runs"]
    return out.sort_values(["runs", "run_outcome"], ascending=[False, True], ignore_index=True)
