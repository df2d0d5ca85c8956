"""The judgements a store can keep beside its views: identical repeats and near pairs.

Each is a rule in Python (:mod:`treellm.derive.repeats`, :mod:`treellm.derive.near`) over a
run's calls, not a view: DuckDB's analysis runs it at query time. ClickHouse keeps its rows per
trace instead, so a report over millions of spans judges nothing at read time: ``treellm
derive`` ingests a pass's traces into a private DuckDB store, and :func:`create_judged` adds
there, beside the views, a table per judgement holding that store's rows (the rule's columns,
and ``seq``: the rule's order, by run and time). The pass then copies them like the views'
rows (``store/clickhouse_derive.py``). The tables' columns are the one definition of
ClickHouse's ``treellm_identical_repeats`` and ``treellm_near_pairs``.

A judgement is per run, and a run lies in one trace, so judging a pass's traces alone gives
the rows that judging the whole store gives.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
from collections.abc import Sequence
from typing import Any, Final

import duckdb
import pandas as pd

from treellm._version import __version__
from treellm.derive.near import DEFAULT_SIMILARITY, PAIR_TYPES, near_pairs
from treellm.derive.repeats import REPEAT_TYPES, judge_runs
from treellm.store.backend import StoreConnection, fetch_columns, fetch_rows
from treellm.store.views import NEAR_CANDIDATES_SQL, REPEAT_CALLS_SQL, REPEAT_NODES_SQL

__all__ = ["JUDGED", "create_judged", "identical_repeats_of", "near_pairs_of", "rules_digest"]

JUDGED: Final = {
    "identical_repeats": (*REPEAT_TYPES, ("seq", "BIGINT")),
    "near_pairs": (*PAIR_TYPES, ("seq", "BIGINT")),
}
"""Each judgement's table: (column, DuckDB type), the rule's columns and its order."""


_RULES: Final = (
    "treellm.derive.repeats", "treellm.derive.near", "treellm.engine.repeats", "treellm.shell.targets",
    "treellm.shell._effect", "treellm.signature",
)  # fmt: skip
"""The modules whose code decides what the judgements say."""


@functools.cache
def rules_digest() -> str:
    """A digest of the judgements' rules: the source of :data:`_RULES` (an installation without
    sources: the module names and treellm's version). A store that keeps judgements records it,
    so any change to a rule judges the traces again, with no version to remember to bump."""
    digest = hashlib.sha256()
    for name in _RULES:
        try:
            digest.update(inspect.getsource(importlib.import_module(name)).encode("utf-8"))
        except (OSError, TypeError):
            digest.update(f"{name}:{__version__}".encode())
    return digest.hexdigest()[:16]


def _table(con: duckdb.DuckDBPyConnection, name: str, rows: Sequence[tuple[Any, ...]]) -> None:
    columns = JUDGED[name]
    body = ", ".join(f'"{column}" {kind}' for column, kind in columns)
    con.execute(f"CREATE OR REPLACE TEMP TABLE {name} ({body})")
    if not rows:
        return
    names = [column for column, _ in columns]
    frame = pd.DataFrame([(*row, seq) for seq, row in enumerate(rows, 1)], columns=names).astype(object)
    con.register("judged_frame", frame)
    try:
        casts = ", ".join(f'CAST("{column}" AS {kind})' for column, kind in columns)
        con.execute(f"INSERT INTO {name} SELECT {casts} FROM judged_frame")
    finally:
        con.unregister("judged_frame")


def identical_repeats_of(con: StoreConnection, where: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Every identical repeat (rows of ``REPEAT_TYPES``) of the runs whose calls ``where`` keeps (SQL
    on alias ``c`` of the analysis' calls, with ``params``), judged now: those runs' calls, then the
    nodes their lines can pass, then :func:`~treellm.derive.repeats.judge_runs`."""
    calls = fetch_rows(con, REPEAT_CALLS_SQL.format(where=where), params)
    if not calls:
        return []
    think = zip(*fetch_columns(con, REPEAT_NODES_SQL.format(where=where), params), strict=True)
    return judge_runs(calls, think)  # every tool of the runs chosen: the calls between count


def near_pairs_of(
    con: StoreConnection,
    where: str,
    params: Sequence[Any] = (),
    *,
    similarity: float = DEFAULT_SIMILARITY,
    shell_tools: frozenset[str] | None = None,
) -> list[tuple[Any, ...]]:
    """Every close pair (rows of ``PAIR_TYPES``) of the calls ``where`` keeps, judged now: the pairs
    ``NEAR_CANDIDATES_SQL`` chooses, then :func:`~treellm.derive.near.near_pairs`."""
    candidates = fetch_rows(con, NEAR_CANDIDATES_SQL.format(where=where), params)
    return near_pairs(candidates, similarity=similarity, shell_tools=shell_tools)


def create_judged(con: duckdb.DuckDBPyConnection, where: str = "TRUE") -> None:
    """Create (or replace) a TEMP table per judgement in the DuckDB store ``con``, holding the
    rows of the runs whose calls ``where`` keeps (SQL on alias ``c`` of the analysis' calls, such
    as ``c.trace_id IN (SELECT trace_id FROM chosen)``)."""
    _table(con, "identical_repeats", identical_repeats_of(con, where))
    _table(con, "near_pairs", near_pairs_of(con, where))
