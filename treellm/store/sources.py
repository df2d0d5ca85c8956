"""Where the readers read: one rule for ``report``, ``tune`` and the dashboard.

A source is Parquet folders, a ClickHouse URL and its spans table, or a DuckDB file, chosen
in that order of precedence (:func:`choose_source`):

- Parquet folders when any are given;
- else a ClickHouse URL when one is given, or ``$TREELLM_CLICKHOUSE`` when no DuckDB file is
  given either (a DuckDB file named on the command line wins over the environment's URL);
- else the DuckDB file given, else ``$TREELLM_DB``, else ``./treellm.duckdb``.

:func:`open_source` opens a source for reading (read-only; a ClickHouse table is opened as it
is, never created) and :func:`describe_source` names it in one line, a URL's password masked.
The command line (``treellm.cli``) and the dashboard (``dashboard.data``) choose and open their
sources here. (``ingest`` writes: it writes into ``--clickhouse`` or the DuckDB file, never into
the environment's URL.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

from treellm import settings
from treellm.store.backend import StoreConnection
from treellm.store.clickhouse_views import DEFAULT_TABLE as DEFAULT_CLICKHOUSE_TABLE
from treellm.store.connection import default_db_path, open_parquet, open_store
from treellm.urls import display_url

__all__ = ["DEFAULT_CLICKHOUSE_TABLE", "Source", "choose_source", "describe_source", "open_source"]


class Source(NamedTuple):
    """Where a reader reads: a DuckDB ``db`` file (``paths[0]``), ``parquet`` folders, or a
    ``clickhouse`` URL (``paths[0]``) with its spans ``table`` and treellm's ``database``
    (None: ``$TREELLM_CLICKHOUSE_DATABASE``, else ``treellm``). Hashable: a cache key."""

    kind: Literal["db", "parquet", "clickhouse"]
    paths: tuple[str, ...]
    table: str = DEFAULT_CLICKHOUSE_TABLE
    database: str | None = None


def choose_source(
    *,
    db: str | None = None,
    parquet: Sequence[str] = (),
    clickhouse: str | None = None,
    table: str | None = None,
    database: str | None = None,
) -> Source:
    """The source the arguments name, by the precedence of the module docstring."""
    if parquet:
        return Source("parquet", tuple(str(p) for p in parquet))
    url = clickhouse or (None if db else settings.get(settings.TREELLM_CLICKHOUSE))
    if url:
        return Source("clickhouse", (url,), table or DEFAULT_CLICKHOUSE_TABLE, database)
    return Source("db", (str(db or default_db_path()),))


def open_source(src: Source, *, retries: int = 20, attach: bool = True) -> StoreConnection:
    """A read-only connection to ``src`` (``retries``: waits for a busy DuckDB file; ``attach``:
    set ClickHouse's views up first, which a reader that did so already in this process skips)."""
    kind, paths, table, database = src
    if kind == "parquet":
        return open_parquet(list(paths))
    if kind == "clickhouse":
        from treellm.store.clickhouse import open_clickhouse

        return open_clickhouse(paths[0], table=table, database=database, attach=attach)
    return open_store(paths[0], read_only=True, retries=retries)


def describe_source(src: Source) -> str:
    """``src`` as one line of text (a URL's password masked)."""
    kind, paths, table, _ = src
    if kind == "parquet":
        return f"Parquet: {', '.join(paths)}"
    if kind == "clickhouse":
        return f"ClickHouse: {display_url(paths[0])} ({table})"
    return f"store: {paths[0]}"
