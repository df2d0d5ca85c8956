"""`treellm export` folders read back by `open_parquet` with the fully migrated shape.

An export with no spans, an export where some tables have no files, and files written
before a migration added a column all read as the store does: every view answers and
`report` / `tune` give the store's figures (0 runs for an empty store).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest

from treellm.analysis import report, tune
from treellm.store import ingest, open_parquet, open_store

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_traces" / "branch_local_loop.jsonl"
NEWER_COLUMNS = ("earlier_node_ids", "convention", "internal", "anchor_node_id")
"""Columns that migrations after the first added to ``spans``."""


def cli(*args: str) -> Any:
    result = subprocess.run([sys.executable, "-m", "treellm", *args], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def columns(con: duckdb.DuckDBPyConnection, relation: str) -> list[tuple[str, str]]:
    return [(str(r[0]), str(r[1])) for r in con.execute(f"DESCRIBE SELECT * FROM {relation}").fetchall()]


VIEWS = ("spans", "span_events", "span_links", "runs", "nodes", "tool_calls", "loop_events")


@pytest.fixture(scope="module")
def sample_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("sample") / "sample.duckdb"
    ingest(db, [SAMPLE])
    return db


def test_an_export_of_an_empty_store_reports_zero_runs(tmp_path: Path) -> None:
    db = tmp_path / "empty.duckdb"
    open_store(db).close()
    assert cli("export", "--db", str(db), "--parquet", str(tmp_path / "pq")) == {
        "parquet": str(tmp_path / "pq"), "spans": 0, "span_events": 0, "span_links": 0,
    }  # fmt: skip
    assert cli("report", "--parquet", str(tmp_path / "pq"), "--format", "json") == {
        "runs": 0, "tool_calls": 0, "pruned": 0, "identical_repeats": 0, "tools": [],
        "internal_tools": [], "internal_calls": 0,
    }  # fmt: skip
    assert cli("tune", "--parquet", str(tmp_path / "pq"), "--format", "json") == {"tools": []}
    con, store = open_parquet([tmp_path / "pq"]), open_store(db, read_only=True)
    for view in VIEWS:  # the migrated shape, column for column
        assert columns(con, view) == columns(store, view), view
        assert con.execute(f"SELECT count(*) FROM {view}").fetchone() == (0,)
    con.close()
    store.close()


def test_an_export_with_spans_reports_what_the_store_reports(sample_store: Path, tmp_path: Path) -> None:
    cli("export", "--db", str(sample_store), "--parquet", str(tmp_path / "pq"))
    from_db = cli("report", "--db", str(sample_store), "--format", "json")
    assert from_db["runs"] == 1 and from_db["pruned"] > 0
    assert cli("report", "--parquet", str(tmp_path / "pq"), "--format", "json") == from_db
    assert cli("tune", "--parquet", str(tmp_path / "pq"), "--format", "json") == cli(
        "tune", "--db", str(sample_store), "--format", "json"
    )
    con, store = open_parquet([tmp_path / "pq"]), open_store(sample_store, read_only=True)
    for view in VIEWS:
        assert columns(con, view) == columns(store, view), view
    con.close()
    store.close()


def test_tables_without_files_read_as_empty_tables_of_the_migrated_shape(sample_store: Path, tmp_path: Path) -> None:
    cli("export", "--db", str(sample_store), "--parquet", str(tmp_path / "pq"))
    for file in (tmp_path / "pq" / "span_events").rglob("*.parquet"):  # an export of the spans only
        file.unlink()
    con = open_parquet([tmp_path / "pq"])
    assert con.execute("SELECT count(*) FROM loop_events").fetchone() == (0,)
    figures = report(con)
    assert figures["runs"] == 1 and figures["pruned"] == 0 and figures["tool_calls"] > 0
    con.close()


def export_before_migrations(db: Path, folder: Path) -> None:
    """Parquet as an export written before migrations 0003-0006 (no newer ``spans`` columns)."""
    con = open_store(db, read_only=True)
    for table in ("spans", "span_events", "span_links"):
        (folder / table).mkdir(parents=True, exist_ok=True)
        drop = f" EXCLUDE ({', '.join(NEWER_COLUMNS)})" if table == "spans" else ""
        if con.execute(f"SELECT count(*) FROM {table}").fetchone() != (0,):
            con.execute(
                f"COPY (SELECT *{drop} FROM {table}) TO '{(folder / table).as_posix()}' "
                "(FORMAT parquet, PARTITION_BY (service_name, day))"
            )
    con.close()


def test_files_from_an_older_export_read_with_the_newer_columns_null(sample_store: Path, tmp_path: Path) -> None:
    export_before_migrations(sample_store, tmp_path / "old")
    con = open_parquet([tmp_path / "old"])
    store = open_store(sample_store, read_only=True)
    assert columns(con, "spans") == columns(store, "spans")
    assert con.execute(f"SELECT count(*) FROM spans WHERE {' OR '.join(f'{c} IS NOT NULL' for c in NEWER_COLUMNS)}")\
        .fetchone() == (0,)  # fmt: skip
    figures = report(con)
    assert (figures["runs"], figures["tool_calls"], figures["pruned"]) == (1, *list(report(store).values())[1:3])
    assert [t["tool"] for t in tune(con)["tools"]] == [t["tool"] for t in tune(store)["tools"]]
    con.close()
    store.close()


def test_an_older_and_a_newer_export_read_as_one_store(sample_store: Path, tmp_path: Path) -> None:
    export_before_migrations(sample_store, tmp_path / "old")
    other = tmp_path / "other.duckdb"
    ingest(other, [ROOT / "sample_traces" / "nudge_and_cache.jsonl"])
    cli("export", "--db", str(other), "--parquet", str(tmp_path / "new"))
    con = open_parquet([tmp_path / "old", tmp_path / "new"])
    assert report(con)["runs"] == 2
    con.close()


def test_a_service_named_with_digits_stays_text(sample_store: Path, tmp_path: Path) -> None:
    db = tmp_path / "digits.duckdb"
    ingest(db, [SAMPLE])
    con = open_store(db)
    con.execute("UPDATE spans SET service_name = '2024'")
    con.execute("UPDATE span_events SET service_name = '2024'")
    con.close()
    cli("export", "--db", str(db), "--parquet", str(tmp_path / "pq"))
    reader = open_parquet([tmp_path / "pq"])
    assert reader.execute("SELECT DISTINCT service FROM runs").fetchall() == [("2024",)]
    reader.close()
