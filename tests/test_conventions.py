"""The conventions module: where each instrumentation family keeps a tool call's facts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from treellm.store import ingest, open_store
from treellm.telemetry.conventions import INVOCATION_ROLES, family, parent_call, read_span, unwrap_result

SCHEMA = json.dumps({"type": "object", "properties": {"page": {"type": "integer"}}, "required": ["page"]})


def test_a_tool_schema_is_never_taken_for_the_arguments() -> None:
    span = read_span(
        "list_orders",
        {"openinference.span.kind": "TOOL", "tool.name": "list_orders", "tool.parameters": SCHEMA,
         "input.value": '{"page": 2}', "output.value": "orders 3-4"},
    )  # fmt: skip
    assert (span.role, span.tool_name, span.arguments, span.result) == (
        "tool",
        "list_orders",
        '{"page": 2}',
        "orders 3-4",
    )
    only_schema = read_span("t", {"openinference.span.kind": "TOOL", "tool.name": "t", "tool.parameters": SCHEMA})
    assert only_schema.arguments is None
    smolagents_specs = json.dumps({"query": {"type": "string", "description": "What to search for."}})
    assert read_span("t", {"openinference.span.kind": "TOOL", "tool.parameters": smolagents_specs}).arguments is None


@pytest.mark.parametrize(
    ("attributes", "arguments", "call_id"),
    [
        ({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.arguments": '{"q": 1}'}, '{"q": 1}', None),
        ({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.args": '{"q": 1}'}, '{"q": 1}', None),
        ({"gen_ai.operation.name": "execute_tool", "tool_arguments": '{"q": 1}'}, '{"q": 1}', None),
        ({"openinference.span.kind": "TOOL", "input.value": "{'q': 1}"}, '{"q": 1}', None),  # a Python repr
        ({"openinference.span.kind": "TOOL",
          "input.value": '{"args": [], "sanitize_inputs_outputs": true, "kwargs": {"q": 1}}'}, '{"q": 1}', None),
        ({"openinference.span.kind": "TOOL", "input.value": '{"kwargs": {"q": 1}}'}, '{"q": 1}', None),
        ({"traceloop.span.kind": "tool", "traceloop.entity.input": json.dumps(
            {"input_str": "{'q': 1}", "tags": [], "metadata": {"run": "x"}, "inputs": {"q": 1},
             "kwargs": {"tool_call_id": "call_7"}})}, '{"q": 1}', "call_7"),
    ],
)  # fmt: skip
def test_arguments_are_the_calls_values_inside_any_envelope(
    attributes: dict[str, str], arguments: str, call_id: str | None
) -> None:
    span = read_span("x", {"gen_ai.tool.name": "search", **attributes})
    assert span.role == "tool"
    assert json.loads(span.arguments or "null") == json.loads(arguments)
    assert span.call_id == call_id


@pytest.mark.parametrize(
    ("text", "content", "call_id"),
    [
        ('{"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", "ToolMessage"], '
         '"kwargs": {"content": "3 rows", "tool_call_id": "call_1", "status": "success"}}', "3 rows", "call_1"),
        ('{"type": "tool", "data": {"content": "3 rows", "tool_call_id": "call_2", "id": null}}', "3 rows", "call_2"),
        ("content='3 rows' name='search' tool_call_id='call_3'", "3 rows", "call_3"),
        ('{"output": {"lc": 1, "type": "constructor", "id": ["ToolMessage"], "kwargs": {"content": "3 rows", '
         '"tool_call_id": "call_4"}}, "kwargs": {"name": "search"}}', "3 rows", "call_4"),
        ('{"blocks": [{"text": "3 rows"}], "tool_name": "search", "raw_output": "3 rows", "is_error": false}',
         "3 rows", None),
        ("3 rows", "3 rows", None),
        ('{"output": "kept"}', '{"output": "kept"}', None),  # a tool's own JSON is not an envelope
    ],
)  # fmt: skip
def test_a_result_is_the_content_inside_a_frameworks_envelope(text: str, content: str, call_id: str | None) -> None:
    got, found = unwrap_result(text)
    assert (got if content.startswith("{") is False else json.loads(got)) == (
        content if not content.startswith("{") else json.loads(content)
    )
    assert found == call_id


def test_two_identical_langchain_results_compare_equal_despite_their_unique_ids() -> None:
    first = read_span("search", {"openinference.span.kind": "TOOL", "output.value": json.dumps(
        {"type": "tool", "data": {"content": "same", "tool_call_id": "call_1", "id": "a1"}})})  # fmt: skip
    second = read_span("search", {"openinference.span.kind": "TOOL", "output.value": json.dumps(
        {"type": "tool", "data": {"content": "same", "tool_call_id": "call_2", "id": "b2"}})})  # fmt: skip
    assert first.result == second.result == "same"


def test_roles_in_order_of_trust() -> None:
    assert read_span("x", {"gen_ai.operation.name": "call_llm"}).role == "llm"
    assert read_span("x", {"openinference.span.kind": "AGENT"}).role == "agent"
    assert read_span("x", {"openinference.span.kind": "CHAIN"}).role == "workflow"
    assert read_span("x", {"openinference.span.kind": "RETRIEVER"}).role == "other"
    assert read_span("x", {"openinference.span.kind": "LLM"}).role == "other"  # asked no model
    assert read_span("x", {"openinference.span.kind": "LLM", "llm.token_count.prompt": "3"}).role == "llm"
    assert read_span("x", {"traceloop.span.kind": "workflow"}).role == "workflow"
    assert read_span("x", {"traceloop.span.kind": "task"}).role == "other"  # a step of a workflow
    assert read_span("x", {"gen_ai.operation.name": "invoke_workflow"}).role == "workflow"
    assert {"agent", "workflow"} == INVOCATION_ROLES
    assert read_span("running tool: search", {"logfire.msg": "running tool: search"}).tool_name == "search"
    assert read_span("x", {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}).agent_name == "a"
    assert family({"openinference.span.kind": "TOOL"}) == "openinference"
    assert family({"traceloop.span.kind": "tool"}) == "traceloop"
    assert family({"gen_ai.tool.name": "t"}) == "genai"
    assert family({}) is None


def test_failures_come_from_status_exception_events_and_the_result_rule() -> None:
    assert read_span("t", {"gen_ai.operation.name": "execute_tool"}, status_code=2).failed
    assert read_span("t", {"gen_ai.operation.name": "execute_tool"}, event_names=["exception"]).failed
    rule = read_span("t", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.result": "Error: boom"},
                     is_failure=lambda text: text.startswith("Error:"))  # fmt: skip
    assert rule.failed


def test_a_parent_that_records_the_call_gives_keyed_arguments() -> None:
    parent = {"input.value": '[{"name": "search", "args": {"query": "x"}, "id": "call_9", "type": "tool_call"}]'}
    assert parent_call(parent, "search") == ('{"query": "x"}', "call_9")
    assert parent_call(parent, "other") is None
    assert parent_call({"input.value": "plain"}, "search") is None


def test_internal_tools_are_marked_and_the_list_can_be_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = Path(__file__).parent / "data" / "external" / "any-agent-SMOLAGENTS_trace.json"
    db = tmp_path / "a.duckdb"
    ingest(db, [source])
    con = open_store(db, read_only=True)
    assert con.execute("SELECT tool FROM tool_calls WHERE internal").fetchall() == [("final_answer",)]
    con.close()
    monkeypatch.setenv("TREELLM_INTERNAL_TOOLS", "write_file")
    db2 = tmp_path / "b.duckdb"
    ingest(db2, [source])
    con = open_store(db2, read_only=True)
    assert con.execute("SELECT tool FROM tool_calls WHERE internal").fetchall() == [("write_file",)]
    con.close()
