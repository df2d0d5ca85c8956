"""The store seam: the analysis reads the views through a :class:`Connection`.

The views (``runs``, ``nodes``, ``tool_calls``, ``loop_events``) and the ``spans``
relation are the contract; an engine is whatever answers SQL over them. Two engines:

- **DuckDB** (the default): :class:`DuckDBConnection` wraps a
  ``duckdb.DuckDBPyConnection`` from ``open_store`` / ``open_parquet``; every analysis
  function also takes the raw DuckDB connection (:func:`as_connection` wraps it);
- **ClickHouse** (``treellm.store.clickhouse``): a server over HTTP(S) or the embedded
  chDB engine on a local folder, reading the Collector exporter's ``otel_traces`` through
  views in treellm's own database (``treellm`` by default), where every query runs: the
  analysis names ``runs``, the engine reads ``treellm.runs``, never a user's ``default.runs``.

Contract of :meth:`Connection.df`: it blocks until the query finishes and returns a
DataFrame; SQL is written in the connection's :attr:`~Connection.dialect` with ``?``
positional placeholders; an engine error propagates as the engine's own exception
(a bad query is our bug). It is called from the thread that opened the connection.

Why two kept dialects rather than one SQL text transpiled with SQLGlot: measured on
seven of treellm's real queries, SQLGlot 30.31 (DuckDB -> ClickHouse) produced SQL that
chDB refused for four: the repeat judgement (``from_json`` kept as is), the tree shapes
(``list(k ORDER BY depth)``), the current limits (``mode``) and the ``runs`` view
(``any_value(...) FILTER``); its ``?`` placeholders became invalid text too. The three
that ran still need ``join_use_nulls`` and Map missing-key semantics that a transpiler
cannot know. So each query whose dialects differ keeps a DuckDB text and a ClickHouse
text side by side, checked equal by ``tests/test_clickhouse.py``; queries valid in both
keep one text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

import duckdb
import pandas as pd

__all__ = [
    "Connection",
    "Dialect",
    "DuckDBConnection",
    "StoreConnection",
    "as_connection",
    "fetch_columns",
    "fetch_rows",
]

Dialect: TypeAlias = Literal["duckdb", "clickhouse"]


@runtime_checkable
class Connection(Protocol):
    """A read connection to a store: its SQL dialect, ``df`` and ``close``."""

    @property
    def dialect(self) -> Dialect:
        """``"duckdb"`` or ``"clickhouse"``: which SQL text the analysis sends."""
        ...

    def df(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        """Run one query with ``?`` positional parameters; the result as a DataFrame."""
        ...

    def close(self) -> None:
        """Release the connection (idempotent)."""
        ...


class DuckDBConnection:
    """A :class:`Connection` over a DuckDB connection (the default engine)."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.raw = con

    @property
    def dialect(self) -> Dialect:
        return "duckdb"

    def df(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        return self.raw.execute(sql, list(params)).df()

    def close(self) -> None:
        self.raw.close()


StoreConnection: TypeAlias = duckdb.DuckDBPyConnection | Connection
"""What the analysis functions take: a DuckDB connection or any :class:`Connection`."""


def as_connection(con: StoreConnection) -> Connection:
    """The :class:`Connection` for ``con`` (a raw DuckDB connection is wrapped)."""
    if isinstance(con, duckdb.DuckDBPyConnection):
        return DuckDBConnection(con)
    return con


def fetch_rows(con: StoreConnection, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """One query's rows as tuples of Python values (None for NULL): straight from DuckDB, without a
    DataFrame (what a rule that walks the rows in Python wants); through a frame otherwise."""
    engine = as_connection(con)
    if isinstance(engine, DuckDBConnection):
        return engine.raw.execute(sql, list(params)).fetchall()
    return list(_values(engine, sql, params).itertuples(index=False, name=None))


def _values(engine: Connection, sql: str, params: Sequence[Any]) -> pd.DataFrame:
    """The frame of ``engine.df`` as Python values, None for NULL (NaN, NaT, pd.NA)."""
    frame = engine.df(sql, params).astype(object)
    return frame.where(frame.notna(), None)


def fetch_columns(con: StoreConnection, sql: str, params: Sequence[Any] = ()) -> list[list[Any]]:
    """One query's columns, each a list of Python values (None for NULL), in the query's order:
    :func:`fetch_rows` without a tuple per row (from DuckDB, one NumPy array per column: 729,569
    rows of three text columns in 0.2 s against 0.45 s as tuples), for a rule that walks the
    columns side by side (``zip(*columns)``)."""
    engine = as_connection(con)
    if isinstance(engine, DuckDBConnection):
        return [column.tolist() for column in engine.raw.execute(sql, list(params)).fetchnumpy().values()]
    return [list(values) for _, values in _values(engine, sql, params).items()]
