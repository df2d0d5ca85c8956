"""The dashboard: chart builders (pure) and every page through Streamlit's AppTest on a real store."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from streamlit.testing.v1 import AppTest

from dashboard import charts
from dashboard.text import literal
from treellm import (
    ModelRequest,
    ModelTurn,
    OTLPJsonlSpanExporter,
    ScriptedModel,
    Tool,
    ToolCall,
    TreeConfig,
    TreeExecutor,
)
from treellm import analysis as A
from treellm.analysis import Filters
from treellm.store import ingest, open_store

ROOT = Path(__file__).resolve().parent.parent
VIEWS = ROOT / "dashboard" / "views"


@pytest.fixture(scope="module")
def sample_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("dash") / "samples.duckdb"
    ingest(db, [ROOT / "sample_traces"])
    return db


def page(name: str, db: Path, monkeypatch: pytest.MonkeyPatch, **query: str) -> AppTest:
    monkeypatch.setenv("TREELLM_DASHBOARD_DB", str(db))
    monkeypatch.delenv("TREELLM_DASHBOARD_PARQUET", raising=False)
    at = AppTest.from_file(str(VIEWS / f"{name}.py"), default_timeout=120)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    import streamlit as st

    st.cache_data.clear()
    yield
    st.cache_data.clear()


# -- charts ---------------------------------------------------------------------------------------


def test_charts_escape_markup_from_traces() -> None:
    nodes = pd.DataFrame([
        {"node_id": "n1", "kind": "think", "parent_id": None, "depth": 0, "status": "completed", "tool": None,
         "ordinal": None, "limit": None, "limit_source": None, "arguments": None, "skill_stack": None},
        {"node_id": "n2", "kind": "tool", "parent_id": "n1", "depth": 0, "status": "completed", "tool": "<b>x</b>",
         "ordinal": 1, "limit": 1, "limit_source": "default", "arguments": '{"q":"<script>alert(1)</script>"}',
         "skill_stack": None},
    ])  # fmt: skip
    loops = pd.DataFrame([
        {"node_id": "n1", "tool": "<b>x</b>", "count": 1, "limit": 1, "limit_source": "default", "action": "prune",
         "shadow": False, "arguments": "<i>", "earlier_node_ids": '{"values":[{"stringValue":"n2"}]}'}
    ])  # fmt: skip
    tree = charts.tree_chart(nodes, loops, "n2")
    rows = _vega_rows(tree)
    drawn = {r["node"]: r for r in rows if r["part"] == "node"}
    assert drawn["n2"]["label"] == "<b>x</b> #1.0" and drawn["n2"]["size"] > drawn["n1"]["size"]  # text; selected
    assert drawn["n2"]["call"] == '<b>x</b> {"q":"<script>alert(1)</script>"}'  # Vega shows text as text
    ghost = drawn["caught under n1"]  # the ghost node under the think node that asked, tied to the call it repeated
    assert ghost["kind"] == "pruned call" and ghost["label"] == "<b>x</b>"
    (repeat,) = [r for r in rows if r["part"] == "repeat"]
    assert (repeat["x"], repeat["y"], repeat["x2"], repeat["y2"]) == (ghost["x"], ghost["y"], drawn["n2"]["x"],
                                                                      drawn["n2"]["y"])  # fmt: skip
    edges = {((r["x"], r["y"]), (r["x2"], r["y2"])) for r in rows if r["part"] == "edge"}
    assert edges == {((drawn["n1"]["x"], drawn["n1"]["y"]), (d["x"], d["y"])) for d in (drawn["n2"], ghost)}
    assert "<b>" not in _vega_outside_data(tree.to_dict())  # trace text only as data
    boxes = _vega_rows(charts.tree_icicle(nodes, loops))
    assert sorted((b["kind"], b["y"], b["x"], b["x2"]) for b in boxes) == [  # a row per depth, as wide as its leaves
        ("pruned call", 1, 1.0, 2.0), ("think", 0, 0.0, 2.0), ("tool", 1, 0.0, 1.0)]  # fmt: skip
    assert {b["label"] for b in boxes} == {"think", "<b>x</b> #1.0", "✂ <b>x</b>"}  # text, never markup


def test_the_icicle_draws_each_node_once_as_wide_as_its_leaves() -> None:
    # items: 0 root, 1 and 2 under 0, 3 under 1; 4 and 5 a cycle; 6 its own parent; 7 a ghost under 0
    boxes = {item: (depth, x, width) for item, depth, x, width in
             charts._partition([None, 0, 0, 1, 5, 4, 6, 0], first_ghost=7)}  # fmt: skip
    assert sorted(boxes) == list(range(8))  # every item once, the cycle's too
    assert boxes[0] == (0, 0.0, 3.0) and boxes[1] == (1, 0.0, 1.0) and boxes[3] == (2, 0.0, 1.0)
    assert boxes[2] == (1, 1.0, 1.0) and boxes[7] == (1, 2.0, 1.0)  # the ghost after the node's own children
    assert boxes[6] == (0, 3.0, 1.0)  # its own parent: a root
    assert {boxes[4][0], boxes[5][0]} == {0, 1} and boxes[4][1] == boxes[5][1] == 4.0  # the cycle cut once


def _vega_rows(chart: object) -> list[dict[str, object]]:
    """The rows a Vega-Lite chart draws (its one dataset), as Streamlit sends them."""
    datasets = chart.to_dict()["datasets"]  # type: ignore[attr-defined]
    assert len(datasets) == 1
    return list(next(iter(datasets.values())))


def test_charts_draw_empty_data_as_a_message() -> None:
    for chart, message in ((charts.prune_rate_chart(pd.DataFrame()), "no tool calls"),
                           (charts.shape_chart(pd.DataFrame()), "no runs"),
                           (charts.what_if_chart(pd.DataFrame({"tool": []}), "t"), "no calls of this tool"),
                           (charts.tree_chart(pd.DataFrame(), pd.DataFrame()), "no nodes"),
                           (charts.timeline_chart(pd.DataFrame()), "no spans"),
                           (charts.repeat_outcomes_chart(pd.DataFrame()), "no executed repeats (ordinal >= 2)"),
                           (charts.runs_over_time_chart(pd.DataFrame()), "no runs")):  # fmt: skip
        assert chart.to_dict()["mark"]["type"] == "text" and _vega_rows(chart) == [{"message": message}]


def test_what_if_chart_marks_the_current_limit() -> None:
    table = pd.DataFrame({"tool": ["t"] * 3, "limit": [1, 2, 3], "current_limit": [2] * 3, "saved": [5, 2, 0],
                          "lost": [3, 1, 0], "unknown": [0, 0, 4], "branches_ended": [4, 1, 0]})  # fmt: skip
    chart = charts.what_if_chart(table, "t")
    rows = _vega_rows(chart)
    bars = {(r["limit"], r["series"]): r["calls"] for r in rows if r["part"] == "bar"}
    assert bars[(1, "saved (wasted repeats pruned)")] == 5 and bars[(1, "lost (productive repeats pruned)")] == 3
    assert bars[(3, "unknown (pruned in the data, would run)")] == 4
    assert [(r["limit"], r["calls"]) for r in rows if r["part"] == "line"] == [(1, 4), (2, 1), (3, 0)]
    assert [(r["limit"], r["series"]) for r in rows if r["part"] == "current"] == [(2, "current limit 2")]
    assert len(chart.to_dict()["layer"]) == 4  # bars, the line, the current limit's rule and its note
    table["current_limit"] = pd.array([pd.NA] * 3, dtype="Int64")  # the data never ran under a limit
    spec = charts.what_if_chart(table, "t").to_dict()
    assert len(spec["layer"]) == 2 and spec["title"]["subtitle"] == ["no limit observed in the data"]


def test_prune_rate_chart_stacks_actions() -> None:
    rates = pd.DataFrame({"tool": ["a", "b", "c"], "calls": [10, 5, 7], "pruned": [3, 0, 1], "pruned_prune": [2, 0, 1],
                          "pruned_nudge": [1, 0, 0], "pruned_cache": [0, 0, 0]})  # fmt: skip
    chart = charts.prune_rate_chart(rates, top=2)
    spec, rows = chart.to_dict(), _vega_rows(chart)
    assert spec["encoding"]["y"]["sort"] == ["a", "c"]  # most caught first; b (none caught, fewest calls) cut
    assert spec["encoding"]["color"]["scale"]["domain"] == ["executed", "pruned", "nudged", "cached"]
    assert spec["encoding"]["x"]["stack"] == "zero" and spec["encoding"]["order"]["field"] == "order"
    drawn = {(r["tool"], r["kind"]): r["calls"] for r in rows}
    assert drawn == {("a", "executed"): 10, ("a", "pruned"): 2, ("a", "nudged"): 1, ("a", "cached"): 0,
                     ("c", "executed"): 7, ("c", "pruned"): 1, ("c", "nudged"): 0, ("c", "cached"): 0}  # fmt: skip


def test_the_pages_get_each_chart_as_its_validated_spec_without_a_fixed_size() -> None:
    rates = pd.DataFrame({"tool": ["a"], "calls": [10], "pruned": [3], "pruned_prune": [2], "pruned_nudge": [1],
                          "pruned_cache": [0]})  # fmt: skip
    by_day = pd.DataFrame({"day": ["2026-01-01"], "runs": [3], "tool_calls": [9], "pruned": [1], "wasted": [0],
                           "prune_rate": [0.1]})  # fmt: skip
    what_if = pd.DataFrame({"tool": ["t"] * 2, "limit": [1, 2], "current_limit": [1] * 2, "saved": [5, 2],
                            "lost": [3, 1], "unknown": [0, 0], "branches_ended": [4, 1]})  # fmt: skip
    shapes = pd.DataFrame({"max_depth": [1, 3], "max_breadth": [2, 1], "runs": [10, 1], "nodes": [3.0, 4.5],
                           "agent": ["a", "b"], "example": ["r1", "r2"]})  # fmt: skip
    calls = {"ordinal": 1, "limit": 1, "limit_source": "default", "arguments": "{}", "skill_stack": None}
    nodes = _spans().dropna(subset=["node_id"]).assign(parent_id=None, depth=0, **calls)
    for chart in (
        charts.prune_rate_chart(rates),
        charts.runs_over_time_chart(by_day),
        charts.prune_rate_chart(rates[:0]),
        charts.timeline_chart(_spans()),
        charts.tree_chart(nodes, pd.DataFrame()),
        charts.what_if_chart(what_if, "t"),
        charts.what_if_chart(what_if.assign(current_limit=None), "t"),
        charts.shape_chart(shapes, "agent"),
    ):
        # raises when the spec breaks Vega-Lite's schema; fit to the width, the plot's own height
        validated = chart.properties(autosize=alt.AutoSizeParams(**charts.AUTOSIZE)).to_dict()
        del validated["config"]["view"]  # Altair's default 300 x 300: Streamlit sizes the chart
        assert charts.vega_spec(chart) == {k: v for k, v in validated.items() if v != {} or k != "config"}
        assert charts.vega_spec(chart)["autosize"] == {"type": "fit-x", "contains": "padding"}


def test_repeat_outcomes_chart_stacks_productive_and_wasted_most_wasted_first() -> None:
    outcomes = pd.DataFrame({"tool": ["x", "y", "x"], "ordinal": [2, 2, 3], "productive": [1, 4, 0],
                             "wasted": [2, 1, 3]})  # fmt: skip
    chart = charts.repeat_outcomes_chart(outcomes)
    assert chart.to_dict()["encoding"]["x"]["sort"] == ["x", "y"]
    drawn = {(r["tool"], r["outcome"]): r["repeats"] for r in _vega_rows(chart)}
    assert drawn == {("x", "productive"): 1, ("x", "wasted"): 5, ("y", "productive"): 4, ("y", "wasted"): 1}


def test_the_time_axis_holds_dates_and_the_prune_rate_never_reads_below_zero() -> None:
    by_day = pd.DataFrame({"day": [pd.Timestamp("2026-01-01").date(), pd.Timestamp("2026-01-05").date()],
                           "runs": [3, 1], "tool_calls": [9, 2], "pruned": [0, 0], "wasted": [0, 1],
                           "prune_rate": [0.0, 0.0]})  # fmt: skip
    spec = charts.runs_over_time_chart(by_day).to_dict()
    counts, rate = spec["layer"]
    assert counts["mark"]["type"] == "bar" and counts["encoding"]["xOffset"]["field"] == "series"
    assert counts["encoding"]["x"]["timeUnit"] == "utcyearmonthdate" and counts["encoding"]["x"]["type"] == "temporal"
    assert counts["encoding"]["y"]["scale"] == {"domainMin": 0}
    assert rate["encoding"]["y"]["scale"]["domain"][0] == 0 and rate["encoding"]["y"]["scale"]["domain"][1] > 0
    assert rate["encoding"]["y"]["axis"]["orient"] == "right" and spec["resolve"]["scale"]["y"] == "independent"
    rows = spec["datasets"][counts["data"]["name"]]
    assert {r["day"] for r in rows} == {"2026-01-01", "2026-01-05"}  # UTC days as dates, no time of day
    assert {(r["day"], r["series"]): r["count"] for r in rows}[("2026-01-05", "wasted")] == 1
    years = charts.runs_over_time_chart(by_day.assign(day=pd.to_datetime(["2024-01-01", "2026-11-30"])))
    assert years.to_dict()["layer"][0]["mark"]["type"] == "line"  # a day's bar would be a hairline over two years
    assert years.to_dict()["layer"][1]["encoding"]["x"].get("bandPosition", 0) == 0  # beside lines: at the day


def test_lines_over_time_break_where_days_without_runs_fall_between() -> None:
    # two years apart: the prune rate's line drew a trend from the first day to the next across them
    by_day = pd.DataFrame({"day": pd.to_datetime(["2026-11-30", "2024-01-01", "2026-11-29", "2026-12-02"]),
                           "runs": [5, 2, 4, 1], "tool_calls": [9, 3, 8, 2], "pruned": [1, 0, 2, 0],
                           "wasted": [1, 0, 1, 0], "prune_rate": [0.1, 0.0, 0.2, 0.0]})  # fmt: skip
    spec = charts.runs_over_time_chart(by_day).to_dict()
    counts, rate = spec["layer"]
    assert counts["mark"]["type"] == "line"
    assert counts["encoding"]["detail"]["field"] == rate["encoding"]["detail"]["field"] == "segment"
    days = {r["day"]: r["segment"] for r in spec["datasets"][rate["data"]["name"]]}
    # a line per run of consecutive days: 2024-01-01 alone, Nov 29-30 together, Dec 2 alone
    assert days == {"2024-01-01": 0, "2026-11-29": 1, "2026-11-30": 1, "2026-12-02": 2}
    drawn = {(r["day"], r["series"]): (r["count"], r["segment"]) for r in spec["datasets"][counts["data"]["name"]]}
    assert drawn[("2026-11-30", "runs")] == (5, 1) and drawn[("2024-01-01", "tool calls")] == (3, 0)


def test_one_day_of_runs_has_one_date_on_its_axis_and_its_rate_over_its_bars() -> None:
    # trajectories' synthetic times put a whole file on one day: Vega's own ticks fell on its hours,
    # each labelled with the same date, and the rate's axis showed 0% and 1% three times each
    by_day = pd.DataFrame({"day": [pd.Timestamp("2024-01-01").date()], "runs": [262], "tool_calls": [3906],
                           "pruned": [0], "wasted": [36], "prune_rate": [0.0]})  # fmt: skip
    counts, rate = charts.runs_over_time_chart(by_day).to_dict()["layer"]
    assert counts["mark"]["type"] == "bar"
    assert counts["encoding"]["x"]["axis"]["tickCount"] == {"interval": "day", "step": 1}
    assert rate["encoding"]["x"]["bandPosition"] == 0.5
    assert rate["encoding"]["y"]["axis"]["format"] == ".1~%"  # 0.2%, 0.4%...: ticks below 1% read apart


def _spans() -> pd.DataFrame:
    rows = [  # span, parent, name, node, kind, start, end, status: given out of tree order
        ("c", "a", "execute_tool <b>t</b>", "n2", "tool", 30, 60, "failed"),
        ("a", None, "invoke_agent", None, None, 0, 100, "ok"),
        ("b", "a", "chat m", "n1", "think", 10, 20, "ok"),
        ("d", "b", "chat m", "n3", "think", 70, 90, "ok"),
        ("e", "zz", "orphan", None, None, 5, 6, "ok"),
    ]
    frame = pd.DataFrame(rows, columns=["span_id", "parent_span_id", "name", "node_id", "kind", "start_ns",
                                        "end_ns", "status"])  # fmt: skip
    return frame.assign(start_ns=frame["start_ns"] * 1_000_000, end_ns=frame["end_ns"] * 1_000_000, tool=None,
                        operation=None)  # fmt: skip


def test_the_timeline_draws_spans_in_tree_order_from_the_runs_start() -> None:
    spans = _spans()
    assert [spans["span_id"].iloc[i] for i in charts.timeline_order(spans)] == ["a", "b", "d", "c", "e"]
    loops = pd.DataFrame([{"node_id": "n1", "tool": "<i>t</i>", "count": 2, "limit": 1, "limit_source": "default",
                           "action": "prune", "shadow": False, "arguments": "{}", "time_ns": 15_000_000}])  # fmt: skip
    rows = _vega_rows(charts.timeline_chart(spans, loops))
    bars = [r for r in rows if r["part"] == "span"]
    assert [r["row"] for r in bars] == [0, 1, 2, 3, 4] and len({r["label"] for r in bars}) == 5  # never merged
    assert {r["kind"] for r in bars} == {"other span", "think", "tool"}
    tool = next(r for r in bars if r["kind"] == "tool")
    assert (tool["start"], tool["end"], tool["failed"]) == (30.0, 60.0, True)  # ms since the first span; outlined
    assert tool["label"] == "4 · execute_tool <b>t</b>"  # numbered, the name as text
    (caught,) = [r for r in rows if r["part"] == "caught"]
    assert (caught["start"], caught["row"]) == (15.0, 1)  # on the row of the think node that asked
    assert caught["call"] == "<i>t</i> {}" and caught["label"] == bars[1]["label"]
    chart = charts.timeline_chart(spans, loops).to_dict()
    assert all(layer["encoding"]["y"]["sort"] == {"field": "row", "op": "min"} for layer in chart["layer"])


def test_a_cycle_of_parents_draws_each_span_once() -> None:
    spans = _spans().assign(parent_span_id=["b", "c", "a", None, None])
    assert sorted(charts.timeline_order(spans)) == [0, 1, 2, 3, 4]


# -- pages ------------------------------------------------------------------------------------------


def test_overview_shows_the_key_numbers(sample_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = page("overview", sample_store, monkeypatch)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Runs"] == "309" and metrics["Pruned calls"] == "233"
    con = open_store(sample_store, read_only=True)
    calls = con.execute("SELECT count(*) FROM tool_calls WHERE NOT internal").fetchone()
    con.close()
    assert calls is not None and metrics["Tool calls (executed)"] == f"{calls[0]:,}"
    verdicts = at.dataframe[0].value
    assert {"raise", "lower", "mutates", "keep"} <= set(verdicts["verdict"])


def test_the_whole_time_range_filters_nothing_and_a_narrower_one_filters_runs(
    sample_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dashboard import data

    seen: list[Filters] = []
    real = data.query

    def spy(name: str, filters: Filters, *extra: object) -> object:
        seen.append(filters)
        return real(name, filters, *extra)

    monkeypatch.setattr(data, "query", spy)
    at = page("overview", sample_store, monkeypatch)
    assert seen and all(f.since is None and f.until is None for f in seen)  # the default: every run
    first, last = at.date_input(key="f_window").value
    assert first < last
    seen.clear()
    at.date_input(key="f_window").set_value((last, last)).run()
    assert not at.exception
    assert seen and all(f.since is not None and f.until is not None for f in seen)
    runs = {m.label: m.value for m in at.metric}["Runs"]
    assert 0 < int(runs.replace(",", "")) < 309  # only the runs that started on the last day


def test_run_explorer_opens_the_run_and_node_of_a_deep_link(
    sample_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = page("run_explorer", sample_store, monkeypatch, run="sample-nudge_and_cache", node="n2")
    assert at.query_params["run"] == "sample-nudge_and_cache" and at.code[0].value == "sample-nudge_and_cache"
    assert at.selectbox(key="node_pick").value == "n2"
    assert {m.label: m.value for m in at.metric}["Caught calls"] == "2"
    caught = at.dataframe[1].value
    assert sorted(caught["action"]) == ["cache", "nudge"]
    assert any("record 7" in c.value for c in at.code)  # the node's captured result, as text


def test_a_foreign_run_is_drawn_as_a_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spans of another framework (LangGraph through OpenInference) get their tree back from span
    parents: think nodes chained one level apart, tool nodes under the think node that asked."""
    from test_browser import first_langgraph_run

    db = tmp_path / "foreign.duckdb"
    ingest(db, [ROOT / "tests" / "data" / "frameworks" / "langgraph.pb"])
    run_id = first_langgraph_run()
    at = page("run_explorer", db, monkeypatch, run=run_id)
    assert at.query_params["run"] == run_id
    assert int({m.label: m.value for m in at.metric}["Nodes"]) == 7  # 4 thinks, 3 search calls
    con = open_store(db, read_only=True)
    nodes = con.execute(
        "SELECT node_id, kind, parent_id, depth FROM nodes WHERE run_id = ? ORDER BY start_ns", [run_id]
    ).fetchall()
    con.close()
    import json

    tree = next(s for s in _vega_specs(at) if "Run tree" in json.dumps(s.get("title")))
    rows = next(iter(tree["datasets"].values()))
    assert sum(r["part"] == "edge" for r in rows) == len(nodes) - 1  # one root, every other node under a parent
    assert [(kind, depth) for _, kind, _, depth in nodes] == [
        ("think", 0),
        ("tool", 0),
        ("think", 1),
        ("tool", 1),
        ("think", 2),
        ("tool", 2),
        ("think", 3),
    ]


def test_the_run_list_is_searched_and_sorted(sample_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = page("run_explorer", sample_store, monkeypatch)
    listed = at.dataframe[0].value
    assert len(listed) == 309 and list(listed["started"]) == sorted(listed["started"], reverse=True)
    at.selectbox(key="run_sort").select("wasted repeats").run()
    listed = at.dataframe[0].value
    assert list(listed["wasted"]) == sorted(listed["wasted"], reverse=True) and listed["wasted"].iloc[0] > 0
    assert at.query_params["sort"] == "wasted repeats"
    at.text_input(key="run_search").input("record 7").run()
    listed = at.dataframe[0].value
    assert "sample-nudge_and_cache" in set(listed["run_id"]) and len(listed) < 309
    assert at.query_params["q"] == "record 7"
    assert all(link.startswith("run?run=") and "view=timeline" in link for link in listed["timeline"])
    at.text_input(key="run_search").input("no call holds this").run()
    assert at.dataframe[0].value.empty and any("No run's calls hold this text" in i.value for i in at.info)


def test_a_link_opens_a_runs_timeline_and_a_think_nodes_chat(sample_store: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    at = page("run_explorer", sample_store, monkeypatch, run="sample-nudge_and_cache", view="timeline")
    assert at.segmented_control(key="view").value == "timeline"
    timeline = next(s for s in _vega_specs(at) if "Span timeline" in json.dumps(s.get("title")))
    rows = next(iter(timeline["datasets"].values()))
    assert sum(r["part"] == "span" for r in rows) == 8 and sum(r["part"] == "caught" for r in rows) == 2
    assert not at.get("plotly_chart")  # every chart is Vega-Lite
    chat = page("run_explorer", sample_store, monkeypatch, run="sample-nudge_and_cache", view="chat", node="n2")
    assert chat.selectbox(key="node_pick").value == "n1"  # a tool node's chat is its think node's
    assert chat.query_params["node"] == "n1" and chat.query_params["view"] == "chat"
    texts = [c.value for c in chat.code]
    assert '{"id":7}' in texts and "record 7: status shipped" in texts and "A-1: 12 EUR" in texts
    caught = page("run_explorer", sample_store, monkeypatch, run="sample-nudge_and_cache", view="chat", node="n5")
    assert any("caught" in c.value for c in caught.caption)


def test_a_run_without_prunes_says_so(sample_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = page("run_explorer", sample_store, monkeypatch, run="sample-retries")
    assert any("No repeated call was caught" in s.value for s in at.success)


def test_shapes_compare_two_agents_side_by_side(sample_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = page("shapes", sample_store, monkeypatch)
    at.selectbox(key="left").select("coder").run()
    at.selectbox(key="right").select("operator").run()
    labels = {m.label: m.value for m in at.metric}
    assert labels == {"agent: coder": "100 runs", "agent: operator": "100 runs"}


def test_tools_and_tuning_pages(sample_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = page("tools", sample_store, monkeypatch)
    rates = tools.dataframe[0].value
    assert rates.loc[rates["tool"] == "fetch_url", "pruned"].iloc[0] == 47
    tuning = page("tuning", sample_store, monkeypatch)
    table = tuning.dataframe[0].value.set_index("tool")
    assert table.loc["fetch_url", "verdict"] == "raise" and table.loc["grep", "verdict"] == "lower"
    assert tuning.selectbox(key="what_if_tool").value == table.index[0]
    # the limit each tool ran under, "none" where the agent never ran with one (as `treellm tune` says)
    con = open_store(sample_store, read_only=True)
    limits = A.tuning_by_tool(con).set_index("tool")["current_max_repeats"]
    con.close()
    assert limits.isna().any() and limits.notna().any()
    assert table["current_max_repeats"].to_dict() == {t: "none" if pd.isna(v) else str(v) for t, v in limits.items()}
    overview = page("overview", sample_store, monkeypatch).dataframe[0].value.set_index("tool")
    assert overview["current_max_repeats"].to_dict() == table["current_max_repeats"].to_dict()


def test_the_tables_of_calls_show_their_first_rows_and_say_of_how_many(
    sample_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dashboard import data

    every = page("tools", sample_store, monkeypatch)
    assert not any(c.value.startswith("The first ") for c in every.caption)  # the sample's tables are whole
    con = open_store(sample_store, read_only=True)
    total = len(A.repeats(con))
    con.close()
    monkeypatch.setattr(data, "TABLE_ROWS", 2)
    data.st.cache_data.clear()
    short = page("tools", sample_store, monkeypatch)
    assert f"The first 2 of {total:,}, by run: narrow the filters to see others." in [c.value for c in short.caption]
    assert any(len(frame.value) == 2 and "reason" in frame.value.columns for frame in short.dataframe)


def test_the_tools_page_names_calls_without_arguments_and_the_switch_that_records_them(
    sample_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Google ADK as it comes records no tool arguments or results: the page says so per tool."""
    own = page("tools", sample_store, monkeypatch)
    assert "Calls without arguments or results" not in [h.value for h in own.subheader]
    db = tmp_path / "adk.duckdb"
    ingest(db, [ROOT / "tests" / "data" / "frameworks" / "adk.pb"])
    tools = page("tools", db, monkeypatch)
    assert "Calls without arguments or results" in [h.value for h in tools.subheader]
    assert tools.warning and "never counted as repeats" in tools.warning[0].value
    lacking = tools.dataframe[1].value.set_index("tool")
    assert lacking["arguments_unknown"].to_dict() == {
        "fetch_url": 2, "get_order": 1, "job_status": 3, "list_orders": 3, "search": 5, "start_job": 1,
    }  # fmt: skip
    assert (lacking["arguments_unknown"] == lacking["results_unknown"]).all()
    assert set(lacking["framework"]) == {"Google ADK"}
    assert set(lacking["switch"]) == {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY"}


def test_an_empty_store_is_shown_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "empty.duckdb"
    open_store(db).close()
    for name in ("overview", "run_explorer", "shapes", "tools", "tuning"):
        at = page(name, db, monkeypatch)
        assert at.info, name


def traced_run(tmp_path: Path, turns: Any, tools: list[Tool], config: TreeConfig) -> Path:
    path = tmp_path / "run.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPJsonlSpanExporter(path)))
    TreeExecutor(ScriptedModel(turns), tools, config, tracer_provider=provider, run_ids=lambda: "big").run("t")
    provider.shutdown()
    db = tmp_path / "run.duckdb"
    ingest(db, [path])
    return db


def test_markup_in_a_tool_argument_is_shown_as_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def echo(args: dict[str, Any]) -> str:
        return str(args["q"])

    markup = "<img src=x onerror=alert(1)> **bold** <b>b</b>"
    turns = [ModelTurn(tool_calls=[ToolCall("echo", {"q": markup})]), ModelTurn(text="ok")]
    db = traced_run(tmp_path, turns, [Tool("echo", "e", handler=echo)], TreeConfig())
    at = page("run_explorer", db, monkeypatch, run="big", node="n2")
    assert any(markup in c.value for c in at.code)
    assert not any(markup in m.value for m in at.markdown)


def test_a_run_of_a_thousand_nodes_renders_as_an_icicle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def t(_: dict[str, Any]) -> str:
        return "ok"

    def wide(request: ModelRequest) -> ModelTurn:
        if request.depth >= 110:
            return ModelTurn(text="done")
        return ModelTurn(tool_calls=[ToolCall("t", {"d": request.depth, "i": i}) for i in range(8)])

    db = traced_run(tmp_path, wide, [Tool("t", "t", handler=t)], TreeConfig(depth_limit=200, node_budget=5000))
    at = page("run_explorer", db, monkeypatch, run="big")
    assert int({m.label: m.value for m in at.metric}["Nodes"]) > 1000
    assert at.segmented_control(key="view").value == "icicle"


def test_the_busy_state_while_a_writer_holds_the_store(sample_store: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    db = tmp_path / "busy.duckdb"
    db.write_bytes(sample_store.read_bytes())
    script = f"import duckdb, sys; c = duckdb.connect({str(db)!r}); print('held', flush=True); sys.stdin.readline()"
    with subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as holder:  # fmt: skip
        assert holder.stdout is not None
        try:
            assert holder.stdout.readline().strip() == "held"
            at = page("overview", db, monkeypatch)
            assert any("Store busy, retrying" in w.value for w in at.warning)
        finally:
            holder.communicate("\n", timeout=30)
    at = page("overview", db, monkeypatch)
    assert {m.label: m.value for m in at.metric}["Runs"] == "309"


# -- untrusted text -------------------------------------------------------------------------------

PLAIN_TEXT_FIELDS = {("Selectbox", "options"), ("Code", "code_text"), ("Text", "body"), ("Json", "body")}
"""Where Streamlit shows a string as it is: anything else is parsed as Markdown."""
MARKUP = ("![x](", "**bold**", "[link](", "<img", "<b>", "<a ")


def _strings(message: Any, owner: str = "") -> Iterator[tuple[str, str, Any]]:
    """Every (element type, field, value) of a protobuf element, nested messages included."""
    from google.protobuf.message import Message

    owner = owner or type(message).__name__
    for field, value in message.ListFields():
        for item in value if isinstance(value, Iterable) and not isinstance(value, str | bytes | Message) else [value]:
            if isinstance(item, Message):
                yield from _strings(item, owner)
            else:
                yield owner, field.name, item


def _elements(at: AppTest) -> Iterator[Any]:
    stack: list[Any] = [at.main, at.sidebar]
    while stack:
        node = stack.pop()
        stack += list(getattr(node, "children", {}).values())
        if getattr(node, "proto", None) is not None:
            yield node.proto


def _vega_specs(at: AppTest) -> list[dict[str, Any]]:
    """Every Vega-Lite chart of the page: its spec, with the datasets Streamlit sends apart (Arrow)
    put back under ``datasets`` as rows."""
    import pyarrow as pa

    specs = []
    for proto in _elements(at):
        if type(proto).__name__ == "VegaLiteChart":
            spec = json.loads(proto.spec)
            spec["datasets"] = {d.name: pa.ipc.open_stream(d.data.data).read_all().to_pylist() for d in proto.datasets}
            specs.append(spec)
    return specs


def _vega_outside_data(spec: dict[str, Any]) -> str:
    """A Vega-Lite spec without what Vega draws as text only: its datasets' values, the data values
    an axis is sorted by and its title (the what-if chart names its tool there, through
    ``chart_text``). Asserts that no layer links or shows an image (``href``, ``url``, ``image``)."""
    spec = {k: v for k, v in spec.items() if k not in ("datasets", "title")}
    for layer in [spec, *spec.get("layer", [])]:
        encoding = layer.get("encoding", {})
        assert not {"href", "url", "image"} & set(encoding), encoding
        for channel in encoding.values():
            if isinstance(channel, dict) and isinstance(channel.get("sort"), list):
                channel["sort"] = []
    return json.dumps(spec, ensure_ascii=False)


def assert_trace_text_is_never_markup(at: AppTest) -> int:
    """No element renders a trace string as Markdown or HTML; returns how many fields held one."""
    held = 0
    for proto in _elements(at):
        for owner, field, value in _strings(proto):
            assert not ("allow_html" in field and value), (owner, field)
            if not isinstance(value, str):
                continue
            if owner == "VegaLiteChart" and field == "spec":
                shown = _vega_outside_data(json.loads(value))
                assert not any(markup in shown for markup in MARKUP), shown[:300]
            elif (owner, field) not in PLAIN_TEXT_FIELDS:
                unescaped = re.sub(r"\\.", "", value)  # a backslash-escaped character is text
                assert not any(markup in unescaped for markup in MARKUP), (owner, field, value)
            held += any(markup in value for markup in MARKUP) or "&lt;b&gt;" in value
    return held


@pytest.fixture(scope="module")
def hostile_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from test_untrusted_text import hostile_store

    return hostile_store(tmp_path_factory.mktemp("hostile"))


def test_no_page_renders_trace_text_or_the_url_as_markup(hostile_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_untrusted_text import AGENTS, MISSING_RUN, RUN_IDS, node_id

    for name in ("overview", "shapes", "tools", "tuning"):
        assert assert_trace_text_is_never_markup(page(name, hostile_db, monkeypatch)), name
    at = page("run_explorer", hostile_db, monkeypatch, run=RUN_IDS[0], node=node_id("n2"))
    assert at.query_params["run"] == RUN_IDS[0] and at.selectbox(key="node_pick").value == node_id("n2")
    assert assert_trace_text_is_never_markup(at)
    missing = page("run_explorer", hostile_db, monkeypatch, run=MISSING_RUN)
    assert any("not in the store" in w.value for w in missing.warning)
    assert any(c.value == MISSING_RUN for c in missing.code)  # the URL's value, as text
    assert assert_trace_text_is_never_markup(missing)
    shapes = page("shapes", hostile_db, monkeypatch)
    labels = [m.label for m in shapes.metric]
    assert sorted(labels) == [f"agent: {literal(agent)}" for agent in AGENTS]  # escaped Markdown: shown as typed


def test_the_dashboard_reads_the_views_through_the_analysis_only() -> None:
    """No SQL of its own and no file of the store read behind the engine's back: the
    dashboard calls typed analysis functions, so it reads DuckDB, Parquet and ClickHouse alike."""
    for path in (ROOT / "dashboard").rglob("*.py"):
        source = path.read_text(encoding="utf-8")
        for forbidden in (".execute(", ".df(", ".sql(", "SELECT ", ".wal", "import duckdb", "st_mtime"):
            assert forbidden not in source, (path.name, forbidden)
