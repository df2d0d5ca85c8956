"""What the dashboard browses (``treellm.analysis.explorer``), on DuckDB: filter choices, run
lists, one run's nodes and caught calls, and a data version read from the views."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from treellm.analysis import Filters
from treellm.analysis.explorer import (
    RUN_TABLE_COLUMNS,
    ChatMessage,
    DataVersion,
    RunQuery,
    actions_by_tool,
    attribute_text,
    chat_messages,
    data_version,
    filter_options,
    id_list_text,
    like_pattern,
    node_attributes,
    outcomes,
    run_list,
    run_loop_events,
    run_nodes,
    run_row,
    run_spans,
    run_table,
    think_chat,
)
from treellm.analysis.measures import repeat_samples
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
    assert run_table(con).empty and list(run_table(con).columns) == list(RUN_TABLE_COLUMNS)
    assert run_spans(con, "x").empty and node_attributes(con, "x", "n1").empty and outcomes(con) == ()
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


# -- the run list -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("explorer") / "samples.duckdb"
    ingest(db, [SAMPLES, ROOT / "tests" / "data" / "frameworks" / "langgraph.pb"])
    return db


def test_the_run_list_counts_wasted_repeats_per_run_as_the_repeats_query_does(samples: Path) -> None:
    con = open_store(samples, read_only=True)
    try:
        table = run_table(con, query=RunQuery(limit=10_000))
        judged = repeat_samples(con)
        expected = judged[judged["outcome"] == "wasted"].groupby("run_id").size()
        got = table.set_index("run_id")["wasted"]
        assert got.sum() == expected.sum() > 0
        assert all(got[run] == count for run, count in expected.items())
        runs = run_list(con, limit=10_000).set_index("run_id")
        assert (table.set_index("run_id")["pruned"] == runs["pruned_calls"]).all()
        assert (table["matching"] == len(runs)).all()
    finally:
        con.close()


def test_the_run_list_sorts_by_each_key_both_ways(samples: Path) -> None:
    con = open_store(samples, read_only=True)
    try:
        for sort, column in (("wasted", "wasted"), ("duration", "duration_ns"), ("calls", "calls"),
                             ("pruned", "pruned"), ("nodes", "nodes"), ("start", "start_ns")):  # fmt: skip
            down = run_table(con, query=RunQuery(sort=sort, limit=40))  # type: ignore[arg-type]
            assert list(down[column]) == sorted(down[column], reverse=True), sort
            up = run_table(con, query=RunQuery(sort=sort, descending=False, limit=40))  # type: ignore[arg-type]
            assert list(up[column]) == sorted(up[column]), sort
        top = run_table(con, query=RunQuery(sort="wasted", limit=1))
        assert int(top["wasted"].iloc[0]) == int(run_table(con, query=RunQuery(limit=10_000))["wasted"].max())
    finally:
        con.close()


def test_the_run_list_finds_runs_by_text_in_arguments_and_results(samples: Path) -> None:
    con = open_store(samples, read_only=True)
    try:
        by_argument = run_table(con, query=RunQuery(text="REFUND"))  # case-insensitive
        calls = con.execute("""SELECT run_id FROM tool_calls WHERE arguments ILIKE '%refund%' OR result ILIKE '%refund%'
                               UNION SELECT run_id FROM loop_events WHERE arguments ILIKE '%refund%'""").fetchall()
        assert set(by_argument["run_id"]) == {r for (r,) in calls} and len(calls) >= 2
        assert (by_argument["matching"] == len(calls)).all()
        assert len(run_table(con, query=RunQuery(text="refund policy"))) == 1  # in one run's arguments only
        by_result = run_table(con, query=RunQuery(text="record 7: status"))
        assert "sample-nudge_and_cache" in set(by_result["run_id"])
        percent = run_table(con, query=RunQuery(text="%", limit=10_000))  # a wildcard is a character
        literal = con.execute("""SELECT run_id FROM tool_calls WHERE contains(arguments, '%') OR contains(result, '%')
                                 UNION SELECT run_id FROM loop_events WHERE contains(arguments, '%')""").fetchall()
        assert set(percent["run_id"]) == {r for (r,) in literal}
        assert 0 < len(percent) < len(run_table(con, query=RunQuery(limit=10_000)))
        assert run_table(con, query=RunQuery(text="record_7")).empty
        assert run_table(con, query=RunQuery(text="'; DROP TABLE spans; --")).empty
        sorted_ = run_table(con, query=RunQuery(text="refund", sort="wasted"))
        assert list(sorted_["wasted"]) == sorted(sorted_["wasted"], reverse=True)
    finally:
        con.close()


def test_the_run_list_finds_a_run_by_its_id_its_trace_and_its_file(samples: Path) -> None:
    con = open_store(samples, read_only=True)
    try:
        runs = con.execute("SELECT run_id, trace_id, source FROM runs ORDER BY run_id").df()
        every = set(runs["run_id"])
        run_id, trace_id = runs["run_id"].iloc[0], runs["trace_id"].iloc[-1]
        by_id = run_table(con, query=RunQuery(text=run_id.upper(), limit=10_000))  # case-insensitive
        assert run_id in set(by_id["run_id"]) and len(by_id) < len(every)
        by_trace = run_table(con, query=RunQuery(text=trace_id[4:20], limit=10_000))
        assert set(runs.loc[runs["trace_id"] == trace_id, "run_id"]) <= set(by_trace["run_id"])
        files = runs.dropna(subset=["source"])
        name = Path(files["source"].iloc[0]).name  # a file name, as people remember it
        by_file = run_table(con, query=RunQuery(text=name, limit=10_000))
        assert set(by_file["run_id"]) == set(files.loc[files["source"].str.contains(name, regex=False), "run_id"])
        assert 0 < len(by_file) < len(every)
    finally:
        con.close()


def test_the_run_list_filters_by_outcome_tool_and_the_shared_filters(samples: Path) -> None:
    con = open_store(samples, read_only=True)
    try:
        assert {"completed", "budget_exhausted"} <= set(outcomes(con))
        exhausted = run_table(con, query=RunQuery(outcome="budget_exhausted", limit=10_000))
        assert len(exhausted) > 0 and set(exhausted["outcome"]) == {"budget_exhausted"}
        fetching = run_table(con, Filters(tool="fetch_url"), RunQuery(limit=10_000))
        callers = con.execute("SELECT DISTINCT run_id FROM tool_calls WHERE tool = 'fetch_url'").fetchall()
        assert set(fetching["run_id"]) == {r for (r,) in callers}
        coder = run_table(con, Filters(agent="coder"), RunQuery(limit=10_000))
        assert set(coder["agent"]) == {"coder"} and len(coder) == 100
    finally:
        con.close()


def test_a_run_query_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="sort key"):
        RunQuery(sort="cost")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit >= 1"):
        RunQuery(limit=0)


def test_like_patterns_match_text_as_it_is() -> None:
    assert like_pattern("a%b_c\\d") == "%a\\%b\\_c\\\\d%"
    assert like_pattern("") == "%%"


# -- one run's spans and a think node's chat ----------------------------------------------------------


def test_a_runs_spans_and_a_nodes_attributes(samples: Path) -> None:
    con = open_store(samples, read_only=True)
    try:
        spans = run_spans(con, "sample-nudge_and_cache")
        assert list(spans["node_id"].fillna("-")) == ["-", "n1", "n2", "n3", "n4", "n5", "n6", "n7"]
        assert spans["kind"].iloc[0] is None or pd.isna(spans["kind"].iloc[0])
        assert list(spans["start_ns"]) == sorted(spans["start_ns"]) and set(spans["status"]) == {"ok"}
        attributes = node_attributes(con, "sample-nudge_and_cache", "n1")
        assert list(attributes["key"]) == sorted(attributes["key"])
        values = dict(zip(attributes["key"], attributes["value"], strict=True))
        assert values["gen_ai.response.finish_reasons"] == '["tool_calls"]'  # an array, as ClickHouse holds it
        nodes, loops = run_nodes(con, "sample-nudge_and_cache"), run_loop_events(con, "sample-nudge_and_cache")
        chat = think_chat(values, nodes, loops, "n1")
        assert [(m.role, m.tool, m.arguments, m.text) for m in chat] == [
            ("tool", "lookup", '{"id":7}', "record 7: status shipped"),
            ("tool", "quote", '{"sku":"A-1"}', "A-1: 12 EUR"),
        ]
        caught = [m for n in ("n5", "n7") for m in think_chat({}, nodes, loops, n) if m.role == "caught"]
        assert sorted(str(m.status) for m in caught) == ["cache", "nudge"]
    finally:
        con.close()


def test_a_langgraph_think_node_reads_as_a_chat(samples: Path) -> None:
    from test_browser import first_langgraph_run

    con = open_store(samples, read_only=True)
    try:
        run_id = first_langgraph_run()
        nodes = run_nodes(con, run_id)
        think = nodes[nodes["kind"] == "think"]["node_id"].iloc[0]
        frame = node_attributes(con, run_id, think)
        chat = think_chat(dict(zip(frame["key"], frame["value"], strict=True)), nodes, run_loop_events(con, run_id),
                          think)  # fmt: skip
        assert [m.role for m in chat] == ["user", "assistant", "tool"]
        assert chat[1].tool == "search" and chat[1].arguments == '{"query": "refund policy"}'
        assert chat[2].tool == "search" and "refund policy" in chat[2].text and chat[2].status == "completed"
    finally:
        con.close()


def test_chat_messages_of_each_convention() -> None:
    openinference = {
        "llm.input_messages.0.message.role": "system", "llm.input_messages.0.message.content": "be brief",
        "llm.input_messages.1.message.role": "user",
        "llm.input_messages.1.message.contents.0.message_content.text": "hi",
        "llm.output_messages.0.message.role": "assistant", "llm.output_messages.0.message.content": "calling",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "grep",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": '{"p": "x"}',
        "llm.input_messages.10.message.role": "tool", "llm.input_messages.10.message.content": "tenth",
    }  # fmt: skip
    assert chat_messages(openinference) == (
        ChatMessage("system", "be brief", stored_role="system"),
        ChatMessage("user", "hi", stored_role="user"),
        ChatMessage("tool", "tenth", stored_role="tool"),  # by number, not by text: 10 after 1
        ChatMessage("assistant", "calling", stored_role="assistant"),
        ChatMessage("assistant", "", "grep", '{"p": "x"}', "assistant"),
    )
    traceloop = {"gen_ai.prompt.0.role": "human", "gen_ai.prompt.0.content": "q",
                 "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.tool_calls.0.name": "ls",
                 "gen_ai.completion.0.tool_calls.0.arguments": "{}"}  # fmt: skip
    assert chat_messages(traceloop) == (ChatMessage("user", "q", stored_role="human"),
                                        ChatMessage("assistant", "", "ls", "{}", "assistant"))  # fmt: skip
    genai = {
        "gen_ai.system_instructions": '[{"type": "text", "content": "rules"}]',
        "gen_ai.input.messages": '[{"role": "user", "parts": [{"type": "text", "content": "go"}]},'
                                 ' {"role": "tool", "parts": [{"type": "tool_call_response", "response": "ok"}]}]',
        "gen_ai.output.messages": '[{"role": "assistant", "parts": [{"type": "tool_call", "name": "cat",'
                                  ' "arguments": {"f": "a"}}]}]',
    }  # fmt: skip
    assert chat_messages(genai) == (
        ChatMessage("system", "rules"),
        ChatMessage("user", "go", stored_role="user"),
        ChatMessage("tool", "ok", stored_role="tool"),
        ChatMessage("assistant", "", "cat", '{"f": "a"}', "assistant"),
    )
    assert chat_messages({"gen_ai.input.messages": "not json", "gen_ai.output": "plain answer"}) == (
        ChatMessage("user", "not json"), ChatMessage("assistant", "plain answer"))  # fmt: skip
    assert chat_messages({"treellm.think.text": "done"}) == (ChatMessage("assistant", "done"),)
    assert chat_messages({"gen_ai.operation.name": "chat"}) == ()
    odd = chat_messages({"gen_ai.input.messages": '[{"role": "<b>x</b>", "content": "**m**"}]'})
    assert odd == (ChatMessage("user", "**m**", stored_role="<b>x</b>"),)  # an unknown role: user, kept as stored


def test_array_attributes_read_alike_from_both_stores() -> None:
    assert attribute_text('{"values":[{"stringValue":"a"},{"intValue":"2"},{"boolValue":true}]}') == '["a",2,true]'
    assert attribute_text('{"values":[{"arrayValue":{"values":[{"stringValue":"x"}]}}]}') == '[["x"]]'
    assert attribute_text('["a"]') == '["a"]' and attribute_text("plain") == "plain"
    assert attribute_text('{"values": 3}') == '{"values": 3}' and attribute_text('{"values":[{"other":1}]}') == (
        '{"values":[{"other":1}]}')  # fmt: skip


def test_a_runs_rows_are_read_from_every_trace_that_holds_it() -> None:
    """Over ClickHouse a run's rows are read by its traces (the derived tables' key): all of them, so a
    run id that two traces hold (ids reused across agents) loses neither trace's rows."""
    from types import SimpleNamespace

    from treellm.analysis.explorer import _in_run

    clickhouse, duck = SimpleNamespace(dialect="clickhouse"), SimpleNamespace(dialect="duckdb")
    sql, params = _in_run(clickhouse, "s", "r1", ("t1", "t2"))  # type: ignore[arg-type]
    assert sql == "s.trace_id IN (?, ?) AND s.run_id = ?" and params == ["t1", "t2", "r1"]
    sql, params = _in_run(clickhouse, "s", "r1")  # type: ignore[arg-type]
    assert "SELECT r.trace_id FROM runs r WHERE r.run_id = ?" in sql and params == ["r1", "r1"]
    assert _in_run(duck, "s", "r1", ("t1",)) == ("s.run_id = ?", ["r1"])  # type: ignore[arg-type]
