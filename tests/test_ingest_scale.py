"""Ingest at scale: the set-based reading of other frameworks' spans, long records, long repeats.

- The conventions are read once per distinct key in :mod:`treellm.derive.foreign`; each span's
  stored columns must equal what :func:`treellm.telemetry.conventions.read_span` says of it,
  span by span (the oracle below is the per-span reading it replaced).
- A converted record longer than ``LINE_SPANS`` is written as several lines, and a call
  repeated many times records all its earlier identical calls (views of one list, written back
  in batches); a DuckDB error inside the placement is reported as itself.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from treellm.analysis import repeat_outcome_by_tool
from treellm.derive import foreign
from treellm.derive.transform import result_sql
from treellm.derive.trees import EarlierIds
from treellm.engine import repeats
from treellm.engine.tools import result_hash
from treellm.errors import IngestError, StoreError
from treellm.store import ingest, open_store
from treellm.store.ingest import LINE_SPANS, split_traces_data
from treellm.telemetry import conventions

ingest_module = importlib.import_module("treellm.store.ingest")  # the package re-exports a function of that name

TRACE = "0af7651916cd43dd8448eb211c80319c"
ROOT = "b7ad6b7169203331"
T0 = 1_717_000_000_000_000_000
RULE = repeats.ToolRule()
OPERATIONS = {"tool": "execute_tool", "llm": "chat", "agent": "invoke_agent", "workflow": "invoke_workflow"}

ENVELOPE = json.dumps({"lc": 1, "type": "constructor", "kwargs": {"content": "42 rows", "tool_call_id": "call_lc"}})
TRACELOOP_IN = json.dumps({"inputs": {"q": "weather"}, "kwargs": {"tool_call_id": "call_tl"}, "tags": []})
TRACELOOP_OUT = json.dumps({"outputs": "sunny", "kwargs": {}})
SCHEMA = json.dumps({"type": "object", "properties": {"q": {"type": "string"}}})

STRANDS_IN = json.dumps(
    [
        {
            "role": "tool",
            "parts": [{"type": "tool_call", "name": "search", "id": "t2", "arguments": {"query": "refunds"}}],
        }
    ]
)
STRANDS_OUT = json.dumps(
    [{"role": "tool", "parts": [{"type": "tool_call_response", "id": "t2", "response": [{"text": "3 articles"}]}]}]
)
Event = str | tuple[str, dict[str, str]]

# (name, attributes, status code, events: a name, or a name and its attributes)
CASES: list[tuple[str, dict[str, str], int, tuple[Event, ...]]] = [
    ("execute_tool grep", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "grep",
                           "gen_ai.tool.call.id": "c1", "gen_ai.tool.call.arguments": '{"q": "x", "n": 1}',
                           "gen_ai.tool.call.result": "found"}, 0, ()),
    ("execute_tool grep", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "grep",
                           "gen_ai.tool.call.arguments": '{"n": 1, "q": "x"}',
                           "gen_ai.tool.call.result": "<returncode>1</returncode>"}, 0, ()),
    ("execute_tool bash", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "bash",
                           "gen_ai.tool.call.arguments": '{"command": "cat a.py"}'}, 2, ()),
    ("execute_tool bash", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "bash",
                           "gen_ai.tool.call.arguments": '{"command": "cat a.py"}'}, 0, ("exception",)),
    ("execute_tool bash", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "bash",
                           "gen_ai.tool.call.arguments": '{"command": "rm -rf b"}'}, 0, ("loop:detected",)),
    ("execute_tool final_answer", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "final_answer",
                                   "gen_ai.tool.call.arguments": '{"answer": "done"}'}, 0, ()),
    ("execute_tool x", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "", "tool.name": "lookup",
                        "tool_call.id": "c9", "gen_ai.tool.args": "{'city': 'Paris'}"}, 0, ()),
    ("execute_tool from_name", {"gen_ai.operation.name": "execute_tool"}, 0, ()),
    ("chat gpt-4o", {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o"}, 0, ()),
    ("invoke_agent helper", {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "helper"}, 0, ()),
    ("workflow", {"gen_ai.operation.name": "invoke_workflow"}, 0, ()),
    ("search", {"openinference.span.kind": "TOOL", "tool.name": "search", "input.value": '{"q": "cats"}',
                "output.value": ENVELOPE, "tool.parameters": SCHEMA}, 0, ()),
    ("search", {"openinference.span.kind": "TOOL", "tool.name": "search", "tool.parameters": SCHEMA}, 0, ()),
    ("ChatOpenAI", {"openinference.span.kind": "LLM", "llm.model_name": "gpt-4o-mini",
                    "llm.output_messages.0.message.role": "assistant"}, 0, ()),
    ("prepare", {"openinference.span.kind": "LLM", "llm.model_name": "gpt-4o-mini"}, 0, ()),
    ("agent", {"openinference.span.kind": "AGENT", "agent.name": "writer"}, 0, ()),
    ("LangGraph", {"openinference.span.kind": "CHAIN"}, 0, ()),
    ("step", {"openinference.span.kind": "retriever"}, 0, ()),
    ("weather.tool", {"traceloop.span.kind": "tool", "traceloop.entity.name": "weather",
                      "traceloop.entity.input": TRACELOOP_IN, "traceloop.entity.output": TRACELOOP_OUT}, 0, ()),
    ("plan.task", {"traceloop.span.kind": "task", "traceloop.entity.name": "plan"}, 0, ()),
    ("odd.kind", {"traceloop.span.kind": ""}, 0, ()),
    ("openai.chat", {"llm.request.type": "chat", "gen_ai.request.model": "gpt-4o"}, 0, ()),
    ("running tool: fetch", {"logfire.msg": "running tool: fetch", "tool_arguments": '{"url": "https://x.org"}',
                             "tool_response": "page"}, 0, ()),
    ("agent run", {"logfire.span_type": "span", "agent_name": "pyd"}, 0, ()),
    ("chat claude", {}, 0, ()),
    ("execute_tool plain", {}, 0, ()),
    ("GET /health", {"http.method": "GET"}, 0, ()),
    ("execute_tool search", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search",
                             "gen_ai.tool.call.id": "t1"},
     0, (("gen_ai.tool.message", {"role": "tool", "content": '{"query": "refunds"}', "id": "t1"}),
         ("gen_ai.choice", {"message": '[{"text": "3 articles"}]', "id": "t1"}))),
    ("execute_tool search", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search"},
     0, (("gen_ai.client.inference.operation.details", {"gen_ai.input.messages": STRANDS_IN}),
         ("gen_ai.client.inference.operation.details", {"gen_ai.output.messages": STRANDS_OUT}))),
    ("execute_tool search", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search"},
     0, (("gen_ai.tool.message", {"role": "tool"}), "gen_ai.choice")),
    ("execute_tool (merged)", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "(merged tools)"}, 0, ()),
]  # fmt: skip


def _value(text: str) -> dict[str, Any]:
    return {"stringValue": text}


def _event(event: Event) -> tuple[str, dict[str, str]]:
    return (event, {}) if isinstance(event, str) else event


def _span(index: int, name: str, attributes: dict[str, str], status: int, events: tuple[Event, ...]) -> dict[str, Any]:
    return {
        "traceId": TRACE,
        "spanId": f"{index + 1:016x}",
        "parentSpanId": ROOT,
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(T0 + (index + 1) * 1_000_000),
        "endTimeUnixNano": str(T0 + (index + 1) * 1_000_000 + 500_000),
        "attributes": [{"key": k, "value": _value(v)} for k, v in attributes.items()],
        "events": [
            {
                "timeUnixNano": str(T0 + (index + 1) * 1_000_000),
                "name": e,
                "attributes": [{"key": k, "value": _value(v)} for k, v in a.items()],
            }
            for e, a in map(_event, events)
        ],
        "status": {"code": status},
    }


def _oracle(name: str, attributes: dict[str, str], status: int, events: tuple[Event, ...]) -> dict[str, Any]:
    """What the per-span reading (before the set-based one) stored for a span."""
    pairs = [_event(e) for e in events]
    names = [e for e, _ in pairs]
    facts = conventions.read_span(
        name, {**attributes, **conventions.event_attributes(pairs)}, status_code=status, event_names=names
    )
    if facts.role == "tool" and "loop:detected" in names:
        facts = conventions.ForeignSpan(role="other", family=facts.family)
    failed, digest, sig = facts.failed, None, None
    if facts.role == "tool" and facts.result is not None:
        failed = failed or repeats.is_failure(RULE, facts.result)
        digest = result_hash(facts.result)
    if facts.role == "tool" and facts.tool_name and facts.arguments is not None:  # unknown arguments: none
        sig = foreign._signature(facts.tool_name, facts.arguments)
    else:
        digest = None
    operation = OPERATIONS.get(facts.role)
    return {
        "convention": facts.family or "otel",
        "operation": operation,
        "tool_name": facts.tool_name,
        "tool_call_id": facts.call_id,
        "arguments": facts.arguments,
        "result": facts.result,
        "signature": sig,
        "result_hash": digest,
        "internal": facts.tool_name in foreign.DEFAULT_INTERNAL if facts.tool_name else None,
        "node_status": "failed" if failed and operation == "execute_tool" else None,
        # the stage promotes the first model and agent name it finds; the conventions fill a gap
        "model": _promoted(attributes, conventions.MODEL_KEYS) or facts.model,
        "agent_name": _promoted(attributes, conventions.AGENT_NAME_KEYS[:2]) or facts.agent_name,
    }


def _promoted(attributes: dict[str, str], keys: tuple[str, ...]) -> str | None:
    return next((attributes[k] for k in keys if k in attributes), None)


def _write(path: Path, spans: list[dict[str, Any]]) -> Path:
    doc = {"resourceSpans": [{"resource": {"attributes": []},
                              "scopeSpans": [{"scope": {"name": "other.framework"}, "spans": spans}]}]}  # fmt: skip
    path.write_text(json.dumps(doc) + "\n", encoding="utf-8")
    return path


def test_each_span_stores_what_read_span_says_of_it(tmp_path: Path) -> None:
    root = _span(-1, "invoke_agent main", {"gen_ai.operation.name": "invoke_agent"}, 0, ())
    root["spanId"] = ROOT
    del root["parentSpanId"]
    spans = [root] + [_span(i, *case) for i, case in enumerate(CASES)]
    db = tmp_path / "store.duckdb"
    ingest(db, [_write(tmp_path / "spans.jsonl", spans)], capture="full")
    columns = list(_oracle(*CASES[0]))
    con = open_store(db, read_only=True)
    try:
        read = ", ".join(f"{result_sql('s')} AS result" if c == "result" else f"s.{c}" for c in columns)  # stored once
        rows = con.execute(f"SELECT s.span_id, {read} FROM spans s WHERE s.span_id <> '{ROOT}'").fetchall()
    finally:
        con.close()
    stored = {row[0]: dict(zip(columns, row[1:], strict=True)) for row in rows}
    for i, case in enumerate(CASES):
        assert stored[f"{i + 1:016x}"] == _oracle(*case), case[0]


def test_a_long_record_is_split_into_lines_of_its_resource_and_scope() -> None:
    spans = [{"spanId": str(i)} for i in range(2 * LINE_SPANS + 5)]
    doc = {"resourceSpans": [{"resource": {"attributes": [1]}, "schemaUrl": "r",
                              "scopeSpans": [{"scope": {"name": "s"}, "schemaUrl": "s", "spans": spans}]}]}  # fmt: skip
    parts = list(split_traces_data(doc))
    assert [len(p["resourceSpans"][0]["scopeSpans"][0]["spans"]) for p in parts] == [LINE_SPANS, LINE_SPANS, 5]
    assert all(p["resourceSpans"][0]["resource"] == {"attributes": [1]} for p in parts)
    assert all(p["resourceSpans"][0]["schemaUrl"] == "r" for p in parts)
    assert all(p["resourceSpans"][0]["scopeSpans"][0]["scope"] == {"name": "s"} for p in parts)
    assert [s for p in parts for s in p["resourceSpans"][0]["scopeSpans"][0]["spans"]] == spans
    small = {"resourceSpans": []}
    assert list(split_traces_data(small)) == [small]


def test_earlier_ids_are_a_view_equal_to_the_tuple() -> None:
    ids = ["a", "b", "c"]
    view = EarlierIds(ids, 1, 3)
    ids.append("d")  # appended after the view was taken: not in it
    assert view == ("b", "c") and ("b", "c") == view  # noqa: SIM300 (the tuple on the left, too)
    assert len(view) == 2 and list(view) == ["b", "c"] and view[0] == "b" and view[-1] == "c"
    assert view != ("b",) and hash(view) == hash(("b", "c")) and repr(view) == "('b', 'c')"


def test_a_long_trajectory_of_one_repeated_call_is_one_chain_judged_without_its_square(tmp_path: Path) -> None:
    """A loop of k identical calls stores k rows of k facts each, not k²/2 earlier ids: each call
    names its chain (the first call) and its 64 most recent earlier calls; each repeat is judged
    against every earlier call of its chain all the same."""
    calls = LINE_SPANS // 2 + 100  # more spans than one line holds
    results = ["same" if k % 10 else f"changed {k // 20}" for k in range(calls)]  # some come back
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for k in range(calls):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": '{"command": "cat a"}'}}
        messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"c{k}", "content": results[k]}]  # fmt: skip
    path = tmp_path / "long.traj.json"
    path.write_text(json.dumps({"messages": messages}), encoding="utf-8")
    db = tmp_path / "store.duckdb"
    report = ingest(db, [path])
    assert report.accounting.tool_calls == calls and report.runs == 1
    con = open_store(db, read_only=True)
    try:
        rows = con.execute(
            "SELECT span_id, ordinal, earlier_node_ids, repeat_chain FROM spans WHERE operation = 'execute_tool' "
            "ORDER BY start_ns"
        ).fetchall()
        outcomes = repeat_outcome_by_tool(con)
    finally:
        con.close()
    assert [ordinal for _, ordinal, _, _ in rows] == list(range(1, calls + 1))
    span_ids = [span_id for span_id, _, _, _ in rows]
    assert {chain for _, _, _, chain in rows} == {span_ids[0]}
    assert rows[0][2] is None and json.loads(rows[1][2]) == span_ids[:1]
    assert json.loads(rows[-1][2]) == span_ids[-1 - foreign.EARLIER_KEPT : -1]
    # productive when its result differs from every earlier one of the chain, else wasted
    seen: set[str] = set()
    productive = 0
    for k, result in enumerate(results):
        productive += k > 0 and result not in seen
        seen.add(result)
    totals = outcomes[["repeats", "productive", "wasted", "unknown"]].sum().to_dict()
    assert totals == {"repeats": calls - 1, "productive": productive, "wasted": calls - 1 - productive, "unknown": 0}


def test_a_duckdb_error_inside_the_placement_is_reported_as_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = "CREATE OR REPLACE TEMP TABLE place_batches AS SELECT CAST(name AS INTEGER) AS batch FROM incoming"
    monkeypatch.setattr(foreign, "_PLACE_BATCHES", failing)
    root = _span(0, "invoke_agent main", {"gen_ai.operation.name": "invoke_agent"}, 0, ())
    del root["parentSpanId"]
    with pytest.raises(StoreError) as caught:
        ingest(tmp_path / "store.duckdb", [_write(tmp_path / "spans.jsonl", [root])])
    assert "Conversion Error" in str(caught.value)
    assert "transaction is aborted" not in str(caught.value)
    assert not isinstance(caught.value, IngestError)  # no bad line: the file is not sent to the validator


_PLACED_COLUMNS = ("run_id", "node_kind", "node_parent_id", "node_depth", "ordinal", "convention", "operation",
                   "tool_name", "signature", "result_hash", "node_status")  # fmt: skip


def _placed_rows(db: Path) -> dict[str, tuple[Any, ...]]:
    con = open_store(db, read_only=True)
    try:
        rows = con.execute(f"SELECT span_id, {', '.join(_PLACED_COLUMNS)} FROM spans").fetchall()
    finally:
        con.close()
    return {row[0]: row[1:] for row in rows}


def test_a_file_prepared_before_its_transaction_is_prepared_again_when_the_store_changed_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ingest reads the conventions of its first chunk before its transaction begins (their
    working tables are freed then). Spans that another connection of the process deletes in
    between are new again inside the transaction: they are read, placed and stored as a clean
    ingest stores them, never stored raw."""
    root = _span(-1, "invoke_agent main", {"gen_ai.operation.name": "invoke_agent"}, 0, ())
    root["spanId"] = ROOT
    del root["parentSpanId"]
    spans = [root] + [_span(i, *case) for i, case in enumerate(CASES)]
    clean = tmp_path / "clean.duckdb"
    whole = _write(tmp_path / "spans.jsonl", spans)
    ingest(clean, [whole], capture="full")
    db = tmp_path / "store.duckdb"
    half = len(spans) // 2
    ingest(db, [_write(tmp_path / "half.jsonl", spans[:half])], capture="full")
    prepared: list[tuple[int, int]] = []
    prepare = ingest_module._prepare_staged

    def prepared_then_deleted(con: Any) -> tuple[int, int]:
        counts = prepare(con)
        if not prepared:  # before the transaction: another connection deletes the stored half
            other = con.cursor()
            for table in ("spans", "span_events", "span_links"):
                other.execute(f"DELETE FROM {table}")
            other.close()
        prepared.append(counts)
        return counts

    monkeypatch.setattr(ingest_module, "_prepare_staged", prepared_then_deleted)
    report = ingest(db, [whole], capture="full")
    assert prepared == [(len(spans) - half, half), (len(spans), 0)]  # prepared again: every span is new
    assert report.spans == len(spans) and report.duplicates == 0 and report.runs == 1
    assert _placed_rows(db) == _placed_rows(clean)
    assert all(row[_PLACED_COLUMNS.index("convention")] is not None for row in _placed_rows(db).values())


def test_a_file_whose_stored_keys_did_not_change_is_prepared_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _span(-1, "invoke_agent main", {"gen_ai.operation.name": "invoke_agent"}, 0, ())
    root["spanId"] = ROOT
    del root["parentSpanId"]
    spans = [root] + [_span(i, *case) for i, case in enumerate(CASES)]
    db = tmp_path / "store.duckdb"
    half = len(spans) // 2
    ingest(db, [_write(tmp_path / "half.jsonl", spans[:half])], capture="full")
    calls: list[tuple[int, int]] = []
    prepare = ingest_module._prepare_staged
    monkeypatch.setattr(ingest_module, "_prepare_staged", lambda con: calls.append(prepare(con)) or calls[-1])
    report = ingest(db, [_write(tmp_path / "spans.jsonl", spans)], capture="full")
    assert calls == [(len(spans) - half, half)]
    assert report.spans == len(spans) - half and report.duplicates == half


def test_a_file_placed_before_its_transaction_is_placed_again_when_its_traces_gained_spans_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The placement of the first chunk also runs before the transaction, over the stored rows of
    its traces. Children of its run that another ingest of the process stores in between are
    placed in that run, as when they were stored first."""
    root = _span(-1, "invoke_agent main", {"gen_ai.operation.name": "invoke_agent"}, 0, ())
    root["spanId"] = ROOT
    del root["parentSpanId"]
    children = [_span(i, *case) for i, case in enumerate(CASES)]
    first, meanwhile, last = children[:5], children[5:12], [root, *children[12:]]
    files = [_write(tmp_path / f"{name}.jsonl", part) for name, part in (("a", first), ("b", meanwhile), ("c", last))]
    in_turn = tmp_path / "in_turn.duckdb"
    for path in files:
        ingest(in_turn, [path], capture="full")
    db = tmp_path / "store.duckdb"
    ingest(db, [files[0]], capture="full")
    prepared: list[tuple[int, int]] = []
    prepare = ingest_module._prepare_staged

    def prepared_then_stored_elsewhere(con: Any) -> tuple[int, int]:
        counts = prepare(con)
        prepared.append(counts)
        if len(prepared) == 1:  # before the transaction: another ingest of this process stores more children
            monkeypatch.setattr(ingest_module, "_prepare_staged", prepare)
            ingest(db, [files[1]], capture="full")
            monkeypatch.setattr(ingest_module, "_prepare_staged", prepared_then_stored_elsewhere)
        return counts

    monkeypatch.setattr(ingest_module, "_prepare_staged", prepared_then_stored_elsewhere)
    report = ingest(db, [files[2]], capture="full")
    assert prepared == [(len(last), 0), (len(last), 0)]  # prepared again inside the transaction
    assert report.spans == len(last) and report.runs == 1
    rows = _placed_rows(db)
    assert rows == _placed_rows(in_turn)
    run_id = rows[ROOT][_PLACED_COLUMNS.index("run_id")]
    assert run_id is not None and all(rows[span["spanId"]][0] == run_id for span in meanwhile)
