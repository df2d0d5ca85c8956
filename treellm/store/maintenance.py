"""Store maintenance: Parquet export (how a store outgrows one machine) and garbage collection."""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass
from pathlib import Path

from treellm.errors import ConfigError
from treellm.store.connection import open_store

__all__ = ["GcReport", "export_parquet", "gc", "parse_age"]

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


_AGE = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> dt.timedelta:
    """``30d``, ``12h``, ``2w``... as a timedelta."""
    match = _AGE.match(text)
    if match is None:
        raise ConfigError(f"--older-than: expected a number and a unit (s, m, h, d, w) such as 30d, got {text!r}")
    return dt.timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


@dataclass(frozen=True, slots=True)
class GcReport:
    runs: int
    spans: int
    bytes_before: int
    bytes_after: int


def gc(db: str | os.PathLike[str], older_than: dt.timedelta, *, now: dt.datetime | None = None) -> GcReport:
    """Delete runs that started before ``now - older_than`` (and their spans, events and
    links) in one transaction, then checkpoint to reclaim space."""
    cutoff = (now or dt.datetime.now(dt.UTC)) - older_than
    cutoff_ns = int(cutoff.timestamp() * 1e9)
    path = Path(db)
    before = path.stat().st_size if path.exists() else 0
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
    finally:
        con.close()
    after = path.stat().st_size if path.exists() else 0
    return GcReport(int(runs_row[0]) if runs_row else 0, int(spans_row[0]) if spans_row else 0, before, after)
