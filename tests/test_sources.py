"""Which source a reader opens: one rule for the command line and the dashboard."""

from __future__ import annotations

from pathlib import Path

import pytest

from treellm.store import open_store
from treellm.store.sources import Source, choose_source, describe_source, open_source


def test_parquet_then_clickhouse_then_the_duckdb_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TREELLM_CLICKHOUSE", raising=False)
    monkeypatch.setenv("TREELLM_DB", str(tmp_path / "env.duckdb"))
    assert choose_source() == Source("db", (str(tmp_path / "env.duckdb"),))
    assert choose_source(db="a.duckdb") == Source("db", ("a.duckdb",))
    assert choose_source(db="a.duckdb", parquet=["p1", "p2"]) == Source("parquet", ("p1", "p2"))
    url = "http://u:secret@host:8123/"
    assert choose_source(clickhouse=url, table="spans", database="tl") == Source("clickhouse", (url,), "spans", "tl")
    monkeypatch.setenv("TREELLM_CLICKHOUSE", url)
    assert choose_source() == Source("clickhouse", (url,), "otel_traces")  # the environment's URL
    assert choose_source(db="a.duckdb") == Source("db", ("a.duckdb",))  # a file named wins over it
    assert choose_source(parquet=["p"]).kind == "parquet"
    shown = describe_source(choose_source())
    assert shown == "ClickHouse: http://u:***@host:8123/ (otel_traces)" and "secret" not in shown


def test_a_source_opens_read_only(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    open_store(db).close()
    con = open_source(choose_source(db=str(db)))
    try:
        assert con.execute("SELECT count(*) FROM spans").fetchone() == (0,)
        with pytest.raises(Exception, match="read-only"):
            con.execute("CREATE TABLE x (a INTEGER)")
    finally:
        con.close()
