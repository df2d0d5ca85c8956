"""Analysis and tuning: planted verdicts recovered, real repeats counted, what-if and mutates pinned."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from treellm import ModelTurn, OTLPJsonlSpanExporter, ScriptedModel, Tool, ToolCall, TreeConfig, TreeExecutor
from treellm.analysis import (
    Filters,
    classify_pair,
    cost_by_tool,
    limits_toml,
    near_repeats,
    near_repeats_by_tool,
    prune_rate_by_model,
    prune_rate_by_tool,
    repeat_outcome_by_tool,
    repeat_samples,
    report,
    shape_by_run,
    shape_distribution,
    shape_groups,
    shape_values,
    tuning_by_tool,
    what_if_by_tool_limit,
    wilson_interval,
)
from treellm.analysis.measures import SHAPE_GROUPS
from treellm.signature import canonical_json, parse_arguments
from treellm.simulate import PLANTED
from treellm.store import export_parquet, ingest, open_parquet, open_store

ROOT = Path(__file__).resolve().parent.parent
DAY = ROOT / "sample_traces" / "production_day.jsonl"
TAU = ROOT / "tests" / "data" / "external" / "tau-bench-gpt-4o-airline-excerpt.json"


@pytest.fixture(scope="module")
def day_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("day") / "day.duckdb"
    ingest(db, [DAY])
    return db


@pytest.fixture
def day(day_store: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    con = open_store(day_store, read_only=True)
    yield con
    con.close()


def test_the_tuning_recovers_every_planted_verdict(day: duckdb.DuckDBPyConnection) -> None:
    tuning = tuning_by_tool(day).set_index("tool")
    for planted in PLANTED:
        row = tuning.loc[planted.tool]
        assert row["verdict"] == planted.verdict, (planted.tool, row["reason"])
        assert row["current_max_repeats"] == planted.current_limit, planted.tool
    assert tuning.loc["run_tests", "mutating_tool"] == "edit_file"
    assert tuning.loc["fetch_url", "recommended_max_repeats"] > 1
    assert tuning.loc["check_job_status", "recommended_max_repeats"] > 1
    assert tuning.loc["grep", "recommended_max_repeats"] == 1
    # listed once per run: no call of it repeated, so there is nothing to collect more of
    assert "no call of it repeated in the data" in tuning.loc["list_dir", "reason"]
    assert "shadow mode" not in tuning.loc["list_dir", "reason"]


def test_too_few_repeats_to_judge_is_advice_to_collect_more_in_shadow_mode(day: duckdb.DuckDBPyConnection) -> None:
    tuning = tuning_by_tool(day, min_samples=1000).set_index("tool")
    row = tuning.loc["read_file"]  # 12 repeats ran, 40 were pruned
    assert row["verdict"] == "insufficient_data" and row["samples"] == 12
    assert "only 12 executed repeat(s) with a known outcome (need 1000); 40 repeat(s) were pruned" in row["reason"]
    assert "shadow mode" in row["reason"]
    assert "no call of it repeated" in tuning.loc["list_dir", "reason"]


def test_each_raise_quotes_the_first_productive_repeats_its_limit_prunes(day: duckdb.DuckDBPyConnection) -> None:
    tuning = tuning_by_tool(day).set_index("tool")
    raised = tuning[tuning["verdict"] == "raise"]
    assert len(raised) >= 2  # one query serves every tool to raise, each at its own limit
    calls = day.execute(
        "SELECT tool, run_id, node_id, ordinal, start_ns FROM repeat_outcomes WHERE outcome != 'unknown' AND productive"
    ).df()
    for tool, row in raised.iterrows():
        mine = calls[(calls["tool"] == tool) & (calls["ordinal"] > row["current_max_repeats"])]
        first = mine.sort_values(["run_id", "start_ns", "node_id"]).head(3)
        quoted = [(e["run_id"], e["node_id"], e["ordinal"]) for e in row["evidence"]]
        assert (
            quoted == list(zip(first["run_id"], first["node_id"], first["ordinal"], strict=True)) and len(quoted) == 3
        )
        assert all(e["link"] == f"run?run={e['run_id']}&node={e['node_id']}" for e in row["evidence"])
    assert all(evidence == [] for evidence in tuning.loc[tuning["verdict"] != "raise", "evidence"])


def test_the_glance_gives_the_same_verdicts_without_what_explains_them(day: duckdb.DuckDBPyConnection) -> None:
    full = tuning_by_tool(day)
    glance = tuning_by_tool(day, glance=True)
    explained = ["reason", "evidence", "branches_ended"]
    assert list(glance.columns) == [c for c in full.columns if c not in explained]
    pd.testing.assert_frame_equal(glance, full.drop(columns=explained))
    assert set(glance["verdict"]) == {p.verdict for p in PLANTED} | set(full["verdict"])


def test_the_limits_file_loads_into_tree_config(day: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    path = tmp_path / "limits.toml"
    path.write_text(limits_toml(tuning_by_tool(day)), encoding="utf-8")
    config = TreeConfig.from_file(path)
    assert config.tool_limits["grep"].max_repeats == 1
    assert config.tool_limits["fetch_url"].max_repeats == 4
    assert config.tool_limits["edit_file"].mutates is True
    assert "run_tests" not in config.tool_limits


def test_prune_rates_add_up(day: duckdb.DuckDBPyConnection) -> None:
    rates = prune_rate_by_tool(day).set_index("tool")
    summary = report(day)
    assert rates["calls"].sum() == summary["tool_calls"] and rates["pruned"].sum() == summary["pruned"]
    row = rates.loc["fetch_url"]
    assert row["prune_rate"] == pytest.approx(row["pruned"] / (row["calls"] + row["pruned"]))
    assert row["shadow_catches"] > 0 and row["pruned_prune"] == row["pruned"]
    by_model = prune_rate_by_model(day)
    assert set(by_model["model"]) == {"sim-coder-1", "sim-research-1", "sim-ops-1"}
    assert by_model["pruned"].sum() == summary["pruned"]


def test_repeat_outcomes_split_productive_and_wasted_by_ordinal(day: duckdb.DuckDBPyConnection) -> None:
    outcomes = repeat_outcome_by_tool(day)
    run_tests = outcomes[outcomes["tool"] == "run_tests"]
    assert list(run_tests["ordinal"]) == [2] and run_tests["wasted"].sum() == 0
    grep = outcomes[outcomes["tool"] == "grep"]
    assert grep["productive"].sum() == 0 and grep["repeats"].sum() == grep["wasted"].sum() > 0
    fetch = outcomes[outcomes["tool"] == "fetch_url"]
    assert fetch["failed"].sum() > 0 and fetch["productive"].sum() > 0  # retries after a 503
    cost = cost_by_tool(day).set_index("tool")
    assert cost.loc["grep", "wasted_repeats"] == grep["wasted"].sum() and cost.loc["grep", "wasted_seconds"] > 0
    wasted = repeat_samples(day).query("outcome == 'wasted'").groupby("tool")  # counted in SQL: the samples' sums
    assert cost["wasted_seconds"].to_dict() == pytest.approx((wasted["duration_ns"].sum() / 1e9).to_dict())
    assert cost["wasted_tokens_est"].to_dict() == (wasted["result_chars"].sum() / 4).round().astype(int).to_dict()
    assert list(cost["wasted_repeats"]) == sorted(cost["wasted_repeats"], reverse=True)


def test_shapes_per_run_and_their_distribution(day: duckdb.DuckDBPyConnection) -> None:
    shapes = shape_by_run(day)
    assert len(shapes) == 300
    first = shapes.iloc[0]
    assert first["nodes"] == first["think_nodes"] + first["tool_nodes"] + first["collapse_nodes"]
    assert first["leaves"] >= 1 and len(first["breadth_per_depth"]) == first["max_depth"] + 1
    forked = shapes[shapes["max_breadth"] > 1]
    assert not forked.empty and (forked["agent"] == "researcher").all()
    dist = shape_distribution(day).set_index("measure")
    assert dist.loc["nodes", "runs"] == 300 and dist.loc["nodes", "max"] >= dist.loc["nodes", "p90"]
    for measure, row in dist.iterrows():  # computed in SQL: what pandas computes over the runs
        values = shapes[str(measure)].astype(float)
        expected = [values.mean(), values.quantile(0.5), values.quantile(0.9), values.max()]
        assert [row["mean"], row["p50"], row["p90"], row["max"]] == pytest.approx(expected, rel=1e-12)
    assert shape_distribution(day, Filters(service="no-such-service")).empty


@pytest.mark.parametrize("by", SHAPE_GROUPS)
def test_shapes_grouped_where_the_runs_are_are_those_of_every_runs_shape(day: duckdb.DuckDBPyConnection,
                                                                         by: str) -> None:  # fmt: skip
    shapes = shape_by_run(day).sort_values("start_ns", kind="stable")
    shapes[by] = shapes[by].astype(str).where(shapes[by].notna(), "(none)")
    counted = {"runs": ("run_id", "size"), "nodes": ("nodes", "mean"), "example": ("run_id", "first")}
    expected = shapes.groupby(["max_depth", "max_breadth", by]).agg(**counted).reset_index()
    grouped = shape_groups(day, by=by)
    assert list(grouped.columns) == ["max_depth", "max_breadth", by, "runs", "nodes", "example"]
    exact = ["max_depth", "max_breadth", by, "runs", "example"]
    assert grouped[exact].values.tolist() == expected[exact].values.tolist()
    assert grouped["nodes"].tolist() == pytest.approx(expected["nodes"].tolist())
    values = shape_values(day, by=by)
    assert values == sorted(v for v in shapes[by].unique() if v != "(none)") and len(values) >= 1
    among = shapes[shapes[by] == values[0]]
    dist = shape_distribution(day, among=(by, values[0])).set_index("measure")
    assert dist["runs"].iloc[0] == len(among) and dist.loc["nodes", "mean"] == pytest.approx(among["nodes"].mean())
    assert shape_groups(day, by="outcome", among=(by, values[0]))["runs"].sum() == len(among)
    with pytest.raises(ValueError, match="no shape group service"):
        shape_groups(day, by="service")


def test_filters_select_runs_and_tools(day: duckdb.DuckDBPyConnection) -> None:
    ops = report(day, Filters(service="ops-agent"))
    assert ops["runs"] == 100
    assert {t["tool"] for t in ops["tools"]} == {"check_job_status", "get_metrics", "restart_service"}
    only = report(day, Filters(tool="grep"))
    assert [t["tool"] for t in only["tools"]] == ["grep"]
    import datetime as dt

    late = report(day, Filters(since=dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)))
    assert 140 <= late["runs"] <= 160


def test_paging_is_told_apart_from_near_repeats(day: duckdb.DuckDBPyConnection) -> None:
    assert classify_pair({"path": "a", "offset": 1, "limit": 50}, {"path": "a", "offset": 51, "limit": 50}) == "paging"
    assert classify_pair({"q": "x", "limit": 9}, {"q": "x", "limit": 10}) == "number_step"
    assert classify_pair({"query": "Loop detection!"}, {"query": "loop  detection"}) == "string_similar"
    assert classify_pair({"q": "x"}, {"q": "x", "lang": "en"}) == "key_added"
    assert classify_pair({"q": "x", "lang": "en"}, {"q": "x"}) == "key_dropped"
    assert classify_pair({"q": "cats"}, {"q": "quantum physics"}) is None
    near = near_repeats_by_tool(day).set_index("tool")
    assert near.loc["read_file", "paging"] > 0 and near.loc["read_file", "near_repeats"] == 0
    assert near.loc["web_search", "number_step"] > 0 and near.loc["grep", "string_similar"] > 0
    assert "limit" in near.loc["web_search", "examples"][0]


def record(tmp_path: Path, turns: list[ModelTurn], config: TreeConfig, tools: list[Tool]) -> duckdb.DuckDBPyConnection:
    path = tmp_path / "run.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPJsonlSpanExporter(path)))
    TreeExecutor(ScriptedModel(turns), tools, config, tracer_provider=provider).run("t")
    provider.shutdown()
    db = tmp_path / "run.duckdb"
    ingest(db, [path])
    return open_store(db, read_only=True)


async def same(args: dict[str, Any]) -> str:
    return "the same result"


def test_near_repeats_pair_each_call_with_the_one_before_it_of_its_tool_outside_its_turn(tmp_path: Path) -> None:
    def search(limit: int) -> ToolCall:
        return ToolCall("search", {"q": "x", "limit": limit})

    turns = [
        ModelTurn(tool_calls=[search(9)]),
        ModelTurn(tool_calls=[search(10), search(11)]),  # one turn: the second is no repeat of the first
        ModelTurn(tool_calls=[ToolCall("fetch", {"u": 1})]),  # another tool between: blocked by tool
        ModelTurn(tool_calls=[search(12)]),
        ModelTurn(tool_calls=[search(12)]),  # identical to the one before: no near repeat
        ModelTurn(tool_calls=[search(13)]),
        ModelTurn(text="done"),
    ]
    tools = [Tool("search", "s", handler=same), Tool("fetch", "f", handler=same)]
    con = record(tmp_path, turns, TreeConfig(max_repeats_per_signature=3), tools)
    pairs = near_repeats(con)
    shown = pairs[["earlier_arguments", "arguments", "kind", "detail", "same_result"]]
    got = [(json.loads(a)["limit"], json.loads(b)["limit"], kind, detail, same)
           for a, b, kind, detail, same in shown.itertuples(index=False, name=None)]  # fmt: skip
    assert sorted(got) == [(9, 10, "near", "number_step", True), (11, 12, "near", "number_step", True),
                           (12, 13, "near", "number_step", True)]  # fmt: skip
    assert near_repeats_by_tool(con).set_index("tool").loc["search", "near_repeats"] == 3


def test_what_if_counts_the_branches_a_lower_limit_would_end(tmp_path: Path) -> None:
    turns = [
        ModelTurn(tool_calls=[ToolCall("search", {"q": "x"})]),
        ModelTurn(tool_calls=[ToolCall("search", {"q": "x"})]),  # a turn of repeats only: ends at limit 1
        ModelTurn(tool_calls=[ToolCall("search", {"q": "x"}), ToolCall("fetch", {"u": 1})]),  # fetch keeps it alive
        ModelTurn(text="done"),
    ]
    tools = [Tool("search", "s", handler=same), Tool("fetch", "f", handler=same)]
    con = record(tmp_path, turns, TreeConfig(shadow=True), tools)
    table = what_if_by_tool_limit(con).set_index(["tool", "limit"])
    assert table.loc[("search", 1), ["would_prune", "saved", "lost", "branches_ended"]].tolist() == [2, 2, 0, 1]
    assert table.loc[("search", 2), ["would_prune", "branches_ended"]].tolist() == [1, 0]
    assert table.loc[("search", 3), ["would_prune", "branches_ended", "unknown"]].tolist() == [0, 0, 0]
    con.close()


def test_what_if_says_when_a_higher_limit_cannot_be_judged(day: duckdb.DuckDBPyConnection) -> None:
    table = what_if_by_tool_limit(day).set_index(["tool", "limit"])
    assert table.loc[("fetch_url", 1), "unknown"] == 0
    raised = table.loc[("fetch_url", 2)]
    assert raised["unknown"] > 0 and "outcome is unknown" in raised["note"]


def test_a_mutating_tool_is_found_from_the_calls_between_repeats(tmp_path: Path) -> None:
    state = {"edits": 0}

    async def edit(args: dict[str, Any]) -> str:
        state["edits"] += 1
        return "edited"

    async def tests(args: dict[str, Any]) -> str:
        return f"{state['edits']} edits: {'pass' if state['edits'] else 'fail'} #{state['edits']}"

    turns: list[ModelTurn] = []
    for _ in range(12):
        turns += [ModelTurn(tool_calls=[ToolCall("run_tests", {})]), ModelTurn(tool_calls=[ToolCall("edit", {})])]
    turns.append(ModelTurn(text="done"))
    tools = [Tool("run_tests", "t", handler=tests, max_repeats=20), Tool("edit", "e", handler=edit, max_repeats=20)]
    con = record(tmp_path, turns, TreeConfig(depth_limit=60, node_budget=200), tools)
    tuning = tuning_by_tool(con).set_index("tool")
    assert tuning.loc["run_tests", "verdict"] == "mutates"
    assert tuning.loc["run_tests", "mutating_tool"] == "edit"
    assert "mark edit as mutates=true" in tuning.loc["run_tests", "reason"]
    con.close()


def tau_exact_repeats() -> tuple[int, int, int]:
    runs = json.loads(TAU.read_text(encoding="utf-8"))
    calls = repeats = 0
    for run in runs:
        seen: list[tuple[str, str]] = []
        for message in run["traj"]:
            for call in message.get("tool_calls") or []:
                key = (call["function"]["name"], canonical_json(parse_arguments(call["function"]["arguments"])))
                calls += 1
                repeats += key in seen
                seen.append(key)
    return len(runs), calls, repeats


def test_the_report_on_real_trajectories_counts_their_exact_repeats(tmp_path: Path) -> None:
    db = tmp_path / "tau.duckdb"
    ingest(db, [TAU])
    con = open_store(db, read_only=True)
    data = report(con)
    runs, calls, repeats = tau_exact_repeats()
    assert (data["runs"], data["tool_calls"], data["pruned"]) == (runs, calls, 0)
    assert sum(t["exact_repeats"] for t in data["tools"]) == repeats == 9
    assert sum(t["productive_repeats"] + t["wasted_repeats"] for t in data["tools"]) == repeats
    con.close()


def test_wilson_interval() -> None:
    low, high = wilson_interval(15, 22)
    assert 0.47 < low < 0.5 and 0.83 < high < 0.87
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_cli_report_and_tune_print_the_documented_json(day_store: Path, tmp_path: Path) -> None:
    def cli(*args: str) -> Any:
        result = subprocess.run([sys.executable, "-m", "treellm", *args], capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr
        return result.stdout

    data = json.loads(cli("report", "--db", str(day_store), "--format", "json"))
    assert set(data) == {"runs", "tool_calls", "pruned", "identical_repeats", "tools", "internal_tools",
                         "internal_calls"}  # fmt: skip
    # the day store holds treellm's own spans: none internal
    assert (data["internal_tools"], data["internal_calls"]) == ([], 0)
    assert set(data["tools"][0]) == {"tool", "calls", "pruned", "prune_rate", "exact_repeats", "productive_repeats",
                                     "wasted_repeats", "unknown_repeats", "near_repeats", "identical_repeats",
                                     "identical_productive", "identical_wasted", "arguments_unknown",
                                     "results_unknown", "capture_switch"}  # fmt: skip
    assert {(t["arguments_unknown"], t["results_unknown"], t["capture_switch"]) for t in data["tools"]} == {
        (0, 0, None)
    }  # treellm's own spans hold both
    tuned = json.loads(cli("tune", "--db", str(day_store), "--format", "json", "--tolerance", "0.05"))
    assert {"tool", "current_max_repeats", "recommended_max_repeats", "verdict", "samples", "productive_rate",
            "reason"} <= set(tuned["tools"][0])  # fmt: skip
    toml = cli("tune", "--db", str(day_store), "--format", "toml")
    (tmp_path / "limits.toml").write_text(toml, encoding="utf-8")
    assert TreeConfig.from_file(tmp_path / "limits.toml").tool_limits["grep"].max_repeats == 1
    export_parquet(day_store, tmp_path / "pq")
    assert json.loads(cli("report", "--parquet", str(tmp_path / "pq"), "--format", "json")) == data
    con = open_parquet([tmp_path / "pq"])
    assert report(con) == data
    con.close()
