"""What the dashboard browses (``treellm.analysis.explorer``), on DuckDB: filter choices, run
lists, one run's nodes and caught calls, and a data version read from the views."""

from __future__ import annotations

from pathlib import Path

import pytest

from treellm.analysis import Filters
from treellm.analysis.explorer import (
    DataVersion,
    actions_by_tool,
    data_version,
    filter_options,
    id_list_text,
    run_list,
    run_loop_events,
    run_nodes,
    run_row,
)
from treellm.store import ingest, open_store

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_traces"


def test_an_empty_store_has_no_choices_and_a_zero_version(tmp_path: Path) -> None:
    db = tmp_path / "empty.duckdb"
    open_store(db).close()
    con = open_store(db, read_only=True)
    options = filter_options(con)
    assert (options.services, options.agents, options.tools, options.first_ns) == ((), (), (), None)
    assert data_version(con) == DataVersion(0, None, None)
    assert run_list(con).empty and run_row(con, "x").empty and actions_by_tool(con).empty
    assert run_nodes(con, "x").empty and run_loop_events(con, "x").empty
    con.close()


def test_the_version_changes_when_spans_arrive(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    ingest(db, [SAMPLES / "retries.jsonl"])
    con = open_store(db, read_only=True)
    before = data_version(con)
    con.close()
    ingest(db, [SAMPLES / "nudge_and_cache.jsonl"])
    con = open_store(db, read_only=True)
    after = data_version(con)
    con.close()
    assert before.spans > 0 and after.spans > before.spans and after != before


def test_runs_nodes_and_caught_calls_of_the_samples(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    ingest(db, [SAMPLES / "nudge_and_cache.jsonl", SAMPLES / "retries.jsonl"])
    con = open_store(db, read_only=True)
    options = filter_options(con)
    assert options.first_ns is not None and options.last_ns is not None and options.first_ns <= options.last_ns
    runs = run_list(con)
    assert set(runs["run_id"]) == {"sample-nudge_and_cache", "sample-retries"}
    assert list(runs["start_ns"]) == sorted(runs["start_ns"], reverse=True)
    assert len(run_list(con, limit=1)) == 1
    assert run_list(con, Filters(agent="no such agent")).empty
    with pytest.raises(ValueError, match="limit >= 1"):
        run_list(con, limit=0)
    nodes = run_nodes(con, "sample-nudge_and_cache")
    assert nodes["node_id"].is_unique and {"arguments", "result", "text", "span_name"} <= set(nodes.columns)
    loops = run_loop_events(con, "sample-nudge_and_cache")
    assert sorted(loops["action"]) == ["cache", "nudge"]
    assert all(text.startswith('["') for text in loops["earlier_node_ids"])
    actions = actions_by_tool(con)
    assert actions["calls"].sum() == len(loops) and actions["shadow"].dtype == bool
    con.close()


def test_earlier_ids_read_alike_from_otlp_json_and_a_json_list() -> None:
    assert id_list_text('{"values":[{"stringValue":"n2"},{"stringValue":"n4"}]}') == '["n2","n4"]'
    assert id_list_text('["n2","n4"]') == '["n2","n4"]'
    assert id_list_text(None) is None and id_list_text("not json") == "not json"
