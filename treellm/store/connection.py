"""The one place that connects to a store: a DuckDB file, or Parquet folders read in place.

DuckDB allows one writing process or many read-only ones, never both at once. So:

- writers (:func:`open_store` with ``read_only=False``) hold the connection only while
  they write and close it right after; opening one applies pending migrations;
- readers open a read-only connection per command or page render and never cache it;
  both retry with backoff while another process holds the lock, then raise
  :class:`~treellm.errors.StoreBusyError`.

treellm owns only what it creates: a DuckDB file that is not a treellm store (it holds
tables but no treellm migrations table, or a migrations table that is not treellm's) is
refused with :class:`NotOwnedError` naming it, by writers and readers alike, and left
unchanged; a new or empty file becomes a store (a reader refuses an empty one).

:func:`open_parquet` gives a reader over exported, hive-partitioned Parquet folders
(one or several, e.g. one per collector) with the same tables and views.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Final

import duckdb

from treellm import settings
from treellm.errors import StoreBusyError, StoreError
from treellm.store.schema import (
    MIGRATIONS,
    MIGRATIONS_TABLE,
    MIGRATIONS_TABLE_COLUMNS,
    MIGRATIONS_TABLE_SQL,
    VIEWS,
    VIEWS_RECORD,
    VIEWS_RECORD_PREFIX,
    recorded_views,
)
from treellm.store.views import duckdb_views

__all__ = [
    "DEFAULT_DB", "ENV_DB", "NotOwnedError", "apply_migrations", "connect_quietly", "default_db_path",
    "foreign_store_reason",
    "open_parquet", "open_store", "unmigrated_reason",
]  # fmt: skip

DEFAULT_DB = str(settings.get(settings.TREELLM_DB, {}))
ENV_DB = settings.TREELLM_DB.name


def default_db_path() -> Path:
    """``$TREELLM_DB``, else ``treellm.duckdb`` in the current folder."""
    return settings.get(settings.TREELLM_DB)


class NotOwnedError(StoreError):
    """A store, or a name in it, belongs to someone else: treellm refuses to change it.

    ``name`` is what was refused: a DuckDB file's path, or a ClickHouse object as
    ``database.name``. (It belongs beside ``StoreError`` in ``treellm.errors``' tree.)"""

    def __init__(self, message: str, *, name: str, path: str | None = None) -> None:
        super().__init__(message, path=path)
        self.name = name


def foreign_store_reason(
    objects: Collection[tuple[str, str]],
    migrations_columns: Sequence[tuple[str, str]],
    recorded: Collection[str],
) -> str | None:
    """Why a DuckDB database is not a treellm store, or ``None`` when it is one or is empty (pure).

    ``objects`` are its tables and views as (schema, name); ``migrations_columns`` the
    (name, type) columns of ``main.schema_migrations`` (empty when there is none);
    ``recorded`` the migration names it records. A treellm store's migrations table has
    treellm's columns and records treellm's first migration (or, after a first migration
    interrupted, records nothing and is the only object)."""
    if not objects:
        return None
    if ("main", MIGRATIONS_TABLE) not in objects:
        shown = ", ".join(sorted(name if schema == "main" else f"{schema}.{name}" for schema, name in objects)[:5])
        return f"it holds tables ({shown}{', ...' if len(objects) > 5 else ''}) but no treellm migrations table"
    if tuple(migrations_columns) != MIGRATIONS_TABLE_COLUMNS:
        return f"its {MIGRATIONS_TABLE} table is not treellm's (other columns)"
    if MIGRATIONS[0][0] in recorded or (not recorded and len(objects) == 1):
        return None
    return f"its {MIGRATIONS_TABLE} table records no treellm migration"


def unmigrated_reason(recorded: Collection[str]) -> str | None:
    """Why a treellm store that records the migrations ``recorded`` cannot be read as it is,
    or ``None`` when every migration is recorded (pure). A reader never migrates, so a store
    whose migrations were interrupted (or that an older treellm wrote) needs a writer first;
    views of another version are no reason: a reader reads its own as temporary views."""
    missing = [name for name, _ in MIGRATIONS if name not in recorded]
    if missing:
        done = len(MIGRATIONS) - len(missing)
        return f"it records {done} of {len(MIGRATIONS)} migrations (the next is {missing[0]})"
    return None


def _refuse_foreign_store(con: duckdb.DuckDBPyConnection, target: Path, *, read_only: bool) -> set[str]:
    """Raise :class:`NotOwnedError` unless ``con`` is a treellm store (or, for a writer, empty),
    and, for a reader, :class:`StoreError` unless its migrations are all recorded; returns the
    names its migrations table records."""
    objects = {
        (str(schema), str(name))
        for schema, name in con.execute(
            "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = current_database() "
            "UNION ALL SELECT schema_name, view_name FROM duckdb_views() "
            "WHERE database_name = current_database() AND NOT internal"
        ).fetchall()
    }
    columns: list[tuple[str, str]] = []
    recorded: set[str] = set()
    if ("main", MIGRATIONS_TABLE) in objects:
        columns = [
            (str(name), str(kind))
            for name, kind in con.execute(
                "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = current_database() "
                "AND schema_name = 'main' AND table_name = ? ORDER BY column_index",
                [MIGRATIONS_TABLE],
            ).fetchall()
        ]
        if columns and columns[0][0] == "name":
            recorded = {str(row[0]) for row in con.execute(f"SELECT name FROM main.{MIGRATIONS_TABLE}").fetchall()}
    reason = foreign_store_reason(objects, columns, recorded)
    if reason is None and read_only and not objects:
        reason = "it is empty (run `treellm ingest` first)"
    if reason is not None:
        raise NotOwnedError(
            f"{target} is not a treellm store: {reason}; treellm leaves it unchanged (give another path: --db or "
            f"${ENV_DB})",
            name=str(target),
            path=str(target),
        )
    unmigrated = unmigrated_reason(recorded) if read_only else None
    if unmigrated is not None:
        raise StoreError(
            f"{target} is not migrated: {unmigrated}; a reader does not migrate, so run `treellm ingest` on it "
            "(a writer applies the pending migrations first), then read it again",
            path=str(target),
        )
    return recorded


def _is_lock_conflict(exc: Exception) -> bool:
    """Another process holds the lock, or (in this process) a connection of the other mode is open."""
    text = str(exc)
    return "Could not set lock" in text or "Conflicting lock" in text or "different configuration" in text


TEMPORARY_VIEWS: Final = duckdb_views(temporary=True)


def apply_migrations(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Apply the migrations not yet recorded, each in its own transaction, and recreate the views
    from :data:`~treellm.store.schema.VIEWS` unless the store records them (in the last
    migration's transaction, else in one of their own); returns the migrations' names."""
    con.execute(MIGRATIONS_TABLE_SQL)
    done = {row[0] for row in con.execute(f"SELECT name FROM {MIGRATIONS_TABLE}").fetchall()}
    pending = [(name, sql) for name, sql in MIGRATIONS if name not in done]
    views_due = VIEWS_RECORD not in done
    for index, (name, sql) in enumerate(pending):
        last = index == len(pending) - 1
        _transaction(con, f"migration {name}", sql, name, views=last and views_due)
    if not pending and views_due:
        _transaction(con, "recreating the views", "", None, views=True)
    return [name for name, _ in pending]


def _transaction(con: duckdb.DuckDBPyConnection, what: str, sql: str, name: str | None, *, views: bool) -> None:
    """``sql``, the migration ``name`` recorded, and the views recreated when ``views``: one transaction."""
    con.execute("BEGIN TRANSACTION")
    try:
        if sql.strip():
            con.execute(sql)
        if name is not None:
            con.execute(f"INSERT INTO {MIGRATIONS_TABLE} VALUES (?, ?)", [name, dt.datetime.now(dt.UTC)])
        if views:
            con.execute(VIEWS)
            con.execute(f"DELETE FROM {MIGRATIONS_TABLE} WHERE starts_with(name, ?)", [VIEWS_RECORD_PREFIX])
            con.execute(f"INSERT INTO {MIGRATIONS_TABLE} VALUES (?, ?)", [VIEWS_RECORD, dt.datetime.now(dt.UTC)])
        con.execute("COMMIT")
    except duckdb.Error as exc:
        con.execute("ROLLBACK")
        raise StoreError(f"{what} failed: {exc}") from exc


def connect_quietly(database: str = ":memory:", *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """``duckdb.connect`` without DuckDB's own progress bar, which its Python client draws on stdout for
    any query past two seconds, on a terminal or not (a pipe, JSON output or a log then fills with
    bars): treellm says its own progress, a bar on a terminal and one line otherwise."""
    con = duckdb.connect(database, read_only=read_only)
    try:
        con.execute("SET enable_progress_bar = false")
    except BaseException:
        con.close()
        raise
    return con


def open_store(
    path: str | os.PathLike[str] | None = None,
    read_only: bool = False,
    *,
    retries: int = 20,
    backoff_s: float = 0.05,
    on_busy: Callable[[int], None] | None = None,
) -> duckdb.DuckDBPyConnection:
    """Connect to the store at ``path`` (default: :func:`default_db_path`).

    A writer gets the schema migrated. A lock held by another process is retried
    ``retries`` times with exponential backoff (``on_busy(attempt)`` is told each
    time, so a UI can say "store busy, retrying"), then :class:`StoreBusyError`.
    A read-only open of a missing file, or of a store whose migrations are not all recorded
    (interrupted, or an older treellm's), is a :class:`StoreError` naming it; a file that is
    not a treellm store is a :class:`NotOwnedError` naming it, never migrated.
    """
    target = Path(path) if path is not None else default_db_path()
    if read_only and not target.exists():
        raise StoreError(f"no store at {target}: run `treellm ingest` (or `treellm demo`) first", path=str(target))
    if not read_only:
        target.parent.mkdir(parents=True, exist_ok=True)
    attempt = 0
    while True:
        try:
            con = connect_quietly(str(target), read_only=read_only)
            break
        except duckdb.Error as exc:
            if not _is_lock_conflict(exc):
                raise StoreError(f"cannot open the store {target}: {exc}", path=str(target)) from exc
            if attempt >= retries:
                raise StoreBusyError(
                    f"the store {target} is busy: another process holds its write lock", path=str(target)
                ) from exc
            attempt += 1
            if on_busy is not None:
                on_busy(attempt)
            time.sleep(min(backoff_s * 2 ** (attempt - 1), 1.0))
    try:
        recorded = _refuse_foreign_store(con, target, read_only=read_only)
        if not read_only:
            apply_migrations(con)
        elif recorded_views(recorded) != VIEWS_RECORD:
            con.execute(TEMPORARY_VIEWS)  # another version's views: this one's, for this connection only
    except BaseException:
        con.close()
        raise
    return con


_EXPORTED_TABLES = ("spans", "span_events", "span_links")
_PARTITION_COLUMNS = ("service_name", "day")


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _parquet_view(con: duckdb.DuckDBPyConnection, table: str, globs: list[str]) -> str:
    """``CREATE VIEW table`` over the Parquet files ``globs`` with the migrated table's columns,
    in its order and types: a column that older files lack reads NULL (``union_by_name``
    across files, then the migrated shape), and a column only the files have comes last."""
    columns = con.execute(
        "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = ? AND NOT internal "
        "ORDER BY column_index",
        [table],
    ).fetchall()
    files = ", ".join("'" + g.replace("'", "''") + "'" for g in globs)
    types = {name: kind for name, kind in columns}
    hive = ", ".join(f"'{c}': '{types[c]}'" for c in _PARTITION_COLUMNS if c in types)
    source = f"read_parquet([{files}], hive_partitioning = true, union_by_name = true" + (
        f", hive_types = {{{hive}}})" if hive else ")"
    )
    present = {
        str(row[0]): str(row[1])
        for row in con.execute(f"SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM {source})").fetchall()
    }
    select = []
    for name, kind in columns:
        if name not in present:
            select.append(f"CAST(NULL AS {kind}) AS {_quoted(name)}")
        elif present[name] != kind:
            select.append(f"CAST({_quoted(name)} AS {kind}) AS {_quoted(name)}")
        else:
            select.append(_quoted(name))
    select += [_quoted(name) for name in present if name not in types]
    return f"CREATE VIEW {table} AS SELECT {', '.join(select)} FROM {source}"


def open_parquet(folders: Sequence[str | os.PathLike[str]]) -> duckdb.DuckDBPyConnection:
    """An in-memory reader whose ``spans``, ``span_events`` and ``span_links`` are the
    hive-partitioned Parquet files under ``folders``, with the store's views on top.

    The reader is a fully migrated in-memory store whose exported tables are replaced by
    views over the files: every table has the columns of the last migration, whether
    it has no files (an export with no spans, no events or no links: an empty table),
    or files written before a migration added a column (read as NULL)."""
    if not folders:
        raise StoreError("no Parquet folder given")
    found: dict[str, list[str]] = {}
    for table in _EXPORTED_TABLES:
        globs = []
        for folder in folders:
            base = Path(folder) / table
            if not base.is_dir():
                raise StoreError(f"{folder} has no {table}/ folder: not a `treellm export` output", path=str(folder))
            if next(base.rglob("*.parquet"), None) is not None:
                globs.append(str(base / "**" / "*.parquet"))
        found[table] = globs
    con = connect_quietly()
    try:
        apply_migrations(con)  # every table and view at its latest shape
        for table, globs in found.items():
            if globs:  # else the migrated empty table stays
                statement = _parquet_view(con, table, globs)
                con.execute(f"DROP TABLE {table}")
                con.execute(statement)
    except BaseException:
        con.close()
        raise
    return con
