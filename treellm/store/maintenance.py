"""Store maintenance: Parquet export (how a store outgrows one machine) and garbage collection.

:func:`gc` deletes old runs in one transaction and checkpoints; DuckDB then reuses the freed
blocks but never shrinks its file, so when blocks are free gc writes a compacted copy and swaps
it in. Hard rules of that swap: the copy is written beside the store (same filesystem) while gc
still holds the store's write lock, fsync'd, and renamed over the store atomically (then the
folder is fsync'd); the rename happens before the lock is released, so no other writer can
write to the old file in between; any failure before the rename leaves the store as it was
(with the deletions committed) and removes the copy; a copy that is not smaller is dropped.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path

import duckdb

from treellm import settings
from treellm.errors import ConfigError, StoreError
from treellm.store.connection import open_store

__all__ = ["GcReport", "compact", "export_parquet", "gc", "parse_age", "store_bytes"]

_TABLES = ("spans", "span_events", "span_links")


def export_parquet(db: str | os.PathLike[str], folder: str | os.PathLike[str]) -> dict[str, int]:
    """Write the raw tables as hive-partitioned Parquet (``<folder>/<table>/service_name=.../day=...``).

    Existing partitions of the same service and day are replaced, so exporting again
    after more ingests refreshes the folder. Returns the rows written per table.
    """
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    con = open_store(db, read_only=True)
    counts: dict[str, int] = {}
    try:
        for table in _TABLES:
            target = (out / table).as_posix().replace("'", "''")
            row = con.execute(f"SELECT count(*) FROM {table}").fetchone()
            counts[table] = int(row[0]) if row else 0
            if counts[table] == 0:
                (out / table).mkdir(parents=True, exist_ok=True)
                continue
            con.execute(
                f"COPY (SELECT * FROM {table} ORDER BY trace_id) TO '{target}' "
                "(FORMAT parquet, PARTITION_BY (service_name, day), OVERWRITE_OR_IGNORE true, "
                "FILENAME_PATTERN 'part_{i}')"
            )
    finally:
        con.close()
    return counts


def parse_age(text: str) -> dt.timedelta:
    """``30d``, ``12h``, ``2w``... as a timedelta (:func:`treellm.settings.age`)."""
    found = settings.age(text)
    if found is None:
        raise ConfigError(f"--older-than: expected a number and a unit (s, m, h, d, w) such as 30d, got {text!r}")
    return found


@dataclass(frozen=True, slots=True)
class GcReport:
    """What :func:`gc` deleted, and the store's size on disk (its file and WAL) before and after."""

    runs: int
    spans: int
    bytes_before: int
    bytes_after: int
    compacted: bool = False
    """Whether a compacted copy replaced the store's file."""

    @property
    def bytes_freed(self) -> int:
        return max(0, self.bytes_before - self.bytes_after)


_COPY_ALIAS = "treellm_gc_compacted_copy"


def store_bytes(path: Path) -> int:
    """The bytes a DuckDB store takes on disk: its file and its write-ahead log."""
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + ".wal")) if p.exists())


def _free_blocks(con: duckdb.DuckDBPyConnection) -> int:
    row = con.execute("SELECT free_blocks FROM pragma_database_size() WHERE database_name = current_database()")
    found = row.fetchone()
    return int(found[0]) if found and found[0] is not None else 0


def _fsync(path: Path, *, folder: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if folder else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def compact(con: duckdb.DuckDBPyConnection, path: Path) -> bool:
    """Replace the store at ``path`` (open as ``con``, a writer holding its lock, checkpointed)
    with a compacted copy when the copy is smaller; returns whether it did (see the module
    docstring for the rules). Raises :class:`StoreError` when the copy or the swap fails, the
    store left as it was."""
    copy = path.with_name(f".{path.name}.gc-{os.getpid()}.tmp")
    leftovers = (copy, copy.with_name(copy.name + ".wal"))
    swapped = False
    try:
        for stale in leftovers:
            stale.unlink(missing_ok=True)
        name = con.execute("SELECT current_database()").fetchone()
        source = str(name[0]) if name else "main"
        con.execute(f"ATTACH {_sql_text(str(copy))} AS {_COPY_ALIAS}")
        try:
            con.execute(f'COPY FROM DATABASE "{source.replace(chr(34), chr(34) * 2)}" TO {_COPY_ALIAS}')
        finally:
            con.execute(f"DETACH {_COPY_ALIAS}")  # checkpoints the copy: one file, no WAL
        if copy.with_name(copy.name + ".wal").exists() or store_bytes(copy) >= store_bytes(path):
            return False
        _fsync(copy)
        os.replace(copy, path)
        swapped = True
        _fsync(path.parent, folder=True)
        return True
    except (duckdb.Error, OSError) as exc:
        state = "the compacted copy is in place" if swapped else "the store is unchanged"
        raise StoreError(f"gc: the old runs are deleted, but compacting {path} failed ({exc}); {state}",
                         path=str(path)) from exc  # fmt: skip
    finally:
        if not swapped:
            for leftover in leftovers:
                leftover.unlink(missing_ok=True)


def gc(db: str | os.PathLike[str], older_than: dt.timedelta, *, now: dt.datetime | None = None) -> GcReport:
    """Delete runs that started before ``now - older_than`` (and their spans, events and
    links) in one transaction, checkpoint, then, when blocks are free, swap in a compacted
    copy (:func:`compact`) so that the file shrinks. Sizes are the file and its WAL."""
    cutoff = (now or dt.datetime.now(dt.UTC)) - older_than
    cutoff_ns = int(cutoff.timestamp() * 1e9)
    path = Path(db)
    before = store_bytes(path)
    compacted = False
    con = open_store(db)
    try:
        con.execute("BEGIN TRANSACTION")
        con.execute(
            "CREATE OR REPLACE TEMP TABLE old_runs AS SELECT DISTINCT run_id FROM runs WHERE start_ns < ?",
            [cutoff_ns],
        )
        con.execute(
            "CREATE OR REPLACE TEMP TABLE doomed AS SELECT trace_id, span_id FROM spans "
            "WHERE run_id IN (SELECT run_id FROM old_runs) OR (run_id IS NULL AND start_ns < ?)",
            [cutoff_ns],
        )
        runs_row = con.execute("SELECT count(*) FROM old_runs").fetchone()
        spans_row = con.execute("SELECT count(*) FROM doomed").fetchone()
        for table in _TABLES:
            con.execute(f"DELETE FROM {table} USING doomed WHERE {table}.trace_id = doomed.trace_id "
                        f"AND {table}.span_id = doomed.span_id")  # fmt: skip
        con.execute("COMMIT")
        con.execute("CHECKPOINT")
        if _free_blocks(con) > 0:
            compacted = compact(con, path)
    finally:
        con.close()
    runs, spans = int(runs_row[0]) if runs_row else 0, int(spans_row[0]) if spans_row else 0
    return GcReport(runs, spans, before, store_bytes(path), compacted)
