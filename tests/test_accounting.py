"""Every span accounted for: ingest says where each new span went, and the counts add up.

On every real source in ``tests/data`` the places (run roots, nodes, other spans in runs,
placed nowhere) add up to the spans in the file, and the tool calls to the calls counted
in the file independently of the readers. Spans that place nowhere are a warning naming
the reason and the first span; treellm's own spans without its run id fall back to the
GenAI conventions; a caught call that names no tool is ``(unknown tool)`` in the report.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import recorded_requests

from treellm.analysis.report import report
from treellm.store import ingest, open_store
from treellm.store.ingest import UNKNOWN_TOOL, Accounting

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
SAMPLE = ROOT / "sample_traces" / "branch_local_loop.jsonl"
RECORDED = sorted((DATA / "frameworks").rglob("*.pb"))
MINI_SWE = sorted((DATA / "mini-swe-agent").rglob("*.traj.json"))


def _adds_up(accounting: Accounting, spans: int) -> None:
    assert accounting.runs + accounting.nodes + accounting.in_run + accounting.placed_nowhere == spans
    assert accounting.spans == spans
    assert accounting.tool_calls <= accounting.nodes


def _count(db: Path, sql: str) -> Any:
    con = open_store(db, read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_a_recorded_framework_trace_is_accounted_for_span_by_span(path: Path, tmp_path: Path) -> None:
    spans = sum(
        len(ss.spans) for record in recorded_requests(path) for rs in record.resource_spans for ss in rs.scope_spans
    )
    db = tmp_path / "t.duckdb"
    result = ingest(db, [path])
    assert result.spans == spans
    accounting = result.accounting
    _adds_up(accounting, spans)
    if path.stem == "autogen" and path.parent.name == "frameworks":
        # AutoGen's own tracing: `create_agent` at construction is a trace of its own, no run
        assert [(u.reason, u.spans) for u in accounting.unplaced] == [("no call", 1)]
        assert "span 'create_agent support_agent'" in result.warnings[0]
    else:
        assert accounting.placed_nowhere == 0 and not result.warnings
    assert accounting.runs == _count(db, "SELECT count(*) FROM runs")[0][0] == 5
    assert accounting.tool_calls == _count(db, "SELECT count(*) FROM tool_calls")[0][0]


def test_tau_bench_files_account_for_every_span_and_every_call(tmp_path: Path) -> None:
    for path in sorted((DATA / "external").glob("tau-bench-*.json")):
        runs = json.loads(path.read_text(encoding="utf-8"))
        calls = sum(len(m.get("tool_calls") or []) for run in runs for m in run["traj"])
        result = ingest(tmp_path / f"{path.stem}.duckdb", [path])
        _adds_up(result.accounting, result.spans)
        assert result.accounting.tool_calls == calls
        assert result.accounting.runs == len(runs)
        assert result.accounting.placed_nowhere == 0


def test_any_agent_files_account_for_every_span_and_every_call(tmp_path: Path) -> None:
    for path in sorted((DATA / "external").glob("any-agent-*.json")):
        spans = json.loads(path.read_text(encoding="utf-8"))["spans"]
        calls = sum(1 for s in spans if (s.get("attributes") or {}).get("gen_ai.operation.name") == "execute_tool")
        result = ingest(tmp_path / f"{path.stem}.duckdb", [path])
        assert result.spans == len(spans)
        _adds_up(result.accounting, len(spans))
        assert (result.accounting.tool_calls, result.accounting.runs, result.accounting.placed_nowhere) == (calls, 1, 0)


def test_mini_swe_agent_trajectories_account_for_every_call(tmp_path: Path) -> None:
    assert len(MINI_SWE) == 29
    result = ingest(tmp_path / "t.duckdb", MINI_SWE)
    assert result.files == 29
    for detail in result.details:
        messages = json.loads(Path(detail.path).read_text(encoding="utf-8"))["messages"]
        calls = sum(len(m.get("tool_calls") or []) for m in messages if m["role"] == "assistant")
        _adds_up(detail.accounting, detail.spans)
        assert detail.accounting.tool_calls == calls, detail.path
        assert (detail.accounting.runs, detail.accounting.placed_nowhere) == (1, 0)
    assert result.accounting.spans == result.spans


# -- spans that place nowhere, and treellm's own spans without its attributes -------------------------


def _rewrite(source: Path, target: Path, *, drop_keys: tuple[str, ...] = (), drop_span: str | None = None) -> Path:
    """``source`` with the attributes (and event attributes) starting with ``drop_keys`` removed,
    and without the span named ``drop_span``."""
    with source.open(encoding="utf-8") as lines, target.open("w", encoding="utf-8") as out:
        for line in lines:
            document = json.loads(line)
            for resource_spans in document["resourceSpans"]:
                for scope_spans in resource_spans["scopeSpans"]:
                    kept = []
                    for span in scope_spans["spans"]:
                        if span["name"] == drop_span:
                            continue
                        span["attributes"] = [a for a in span["attributes"] if not a["key"].startswith(drop_keys)]
                        for event in span.get("events", []):
                            event["attributes"] = [
                                a for a in event.get("attributes", []) if not a["key"].startswith(drop_keys)
                            ]
                        kept.append(span)
                    scope_spans["spans"] = kept
            out.write(json.dumps(document) + "\n")
    return target


def _figures(db: Path) -> tuple[Any, ...]:
    con = open_store(db, read_only=True)
    try:
        data = report(con)
    finally:
        con.close()
    return data["runs"], data["tool_calls"], data["pruned"], sorted((t["tool"], t["calls"]) for t in data["tools"])


def test_treellm_spans_without_its_run_id_fall_back_to_the_genai_conventions(tmp_path: Path) -> None:
    whole = tmp_path / "whole.duckdb"
    ingest(whole, [SAMPLE])
    stripped = _rewrite(SAMPLE, tmp_path / "no-run-id.jsonl", drop_keys=("treellm.run.id",))
    db = tmp_path / "t.duckdb"
    result = ingest(db, [stripped])
    assert result.runs == 1 and not result.warnings
    assert result.accounting.placed_nowhere == 0
    _adds_up(result.accounting, 35)
    assert (result.accounting.runs, result.accounting.tool_calls) == (1, 14)
    assert _figures(db) == _figures(whole)
    # read by the conventions: one tree, every node in the run, parented within it
    assert _count(db, "SELECT count(*) FROM nodes WHERE run_id IS NULL") == [(0,)]
    assert _count(
        db, "SELECT count(*) FROM nodes n WHERE parent_id IS NOT NULL AND parent_id NOT IN (SELECT node_id FROM nodes)"
    ) == [(0,)]


def test_spans_whose_run_root_never_arrived_are_a_warning_naming_the_first(tmp_path: Path) -> None:
    rootless = _rewrite(SAMPLE, tmp_path / "rootless.jsonl", drop_span="invoke_agent demo-coder")
    result = ingest(tmp_path / "t.duckdb", [rootless])
    accounting = result.accounting
    _adds_up(accounting, 34)
    assert [(u.reason, u.spans) for u in accounting.unplaced] == [("no run root", 34)]
    (warning,) = result.warnings
    assert warning.startswith(f"{rootless}: 34 span(s) stored but placed nowhere: no run root (first: span 'chat ")
    assert "of trace 40272e80d51e72edb4e10ea6a4129711" in warning


def test_a_run_root_without_its_operation_is_a_missing_attribute(tmp_path: Path) -> None:
    stripped = _rewrite(SAMPLE, tmp_path / "no-operation.jsonl", drop_keys=("gen_ai.operation.name",))
    result = ingest(tmp_path / "t.duckdb", [stripped])
    _adds_up(result.accounting, 35)
    assert [(u.reason, u.spans) for u in result.accounting.unplaced] == [("missing attribute", 35)]
    assert "without the gen_ai.operation.name of its run's root" in result.warnings[0]


def test_spans_no_convention_reads_are_an_unknown_convention(tmp_path: Path) -> None:
    span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "GET /health", "kind": 2,
            "startTimeUnixNano": "1795942800000000000", "endTimeUnixNano": "1795942800100000000",
            "attributes": [{"key": "http.method", "value": {"stringValue": "GET"}}]}  # fmt: skip
    child = dict(span, spanId="ef" * 8, parentSpanId="cd" * 8, name="SELECT users")
    line = {"resourceSpans": [{"resource": {"attributes": []},
                               "scopeSpans": [{"scope": {"name": "http"}, "spans": [span, child]}]}]}  # fmt: skip
    path = tmp_path / "http.jsonl"
    path.write_text(json.dumps(line) + "\n", encoding="utf-8")
    result = ingest(tmp_path / "t.duckdb", [path])
    _adds_up(result.accounting, 2)
    assert [(u.reason, u.spans) for u in result.accounting.unplaced] == [("unknown convention", 2)]
    assert "first: span 'GET /health' (cdcdcdcdcdcdcdcd)" in result.warnings[0]


def test_a_caught_call_without_a_tool_is_the_unknown_tool_never_none_or_nan(tmp_path: Path) -> None:
    stripped = _rewrite(SAMPLE, tmp_path / "no-loop-tool.jsonl", drop_keys=("treellm.loop.tool",))
    db = tmp_path / "t.duckdb"
    result = ingest(db, [stripped])
    assert (result.accounting.loop_events, result.accounting.unknown_tool_catches) == (3, 3)
    assert any(UNKNOWN_TOOL in w for w in result.warnings)
    shown = subprocess.run(
        [sys.executable, "-m", "treellm", "report", "--db", str(db), "--format", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    tools = {t["tool"]: t for t in json.loads(shown.stdout)["tools"]}
    assert tools[UNKNOWN_TOOL]["pruned"] == 3
    assert not {"None", "nan", None} & set(tools)
    table = subprocess.run(
        [sys.executable, "-m", "treellm", "report", "--db", str(db)], capture_output=True, text=True, check=True
    )
    assert UNKNOWN_TOOL in table.stdout and "None" not in table.stdout and "nan" not in table.stdout


def test_the_cli_prints_where_the_spans_went_and_the_json_carries_it(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    rootless = _rewrite(SAMPLE, tmp_path / "rootless.jsonl", drop_span="invoke_agent demo-coder")
    shown = subprocess.run(
        [sys.executable, "-m", "treellm", "ingest", str(SAMPLE), str(rootless), "--db", str(tmp_path / "p.duckdb")],
        capture_output=True, text=True, check=True, env={"COLUMNS": "200", "PATH": ""},
    )  # fmt: skip
    assert "spans: 1 run root(s), 32 node(s) (14 tool call(s)), 2 other span(s) in runs; 3 caught call(s)" in (
        shown.stdout
    )
    as_json = subprocess.run(
        [sys.executable, "-m", "treellm", "ingest", str(rootless), "--db", str(db), "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    counts = json.loads(as_json.stdout)["accounting"]
    assert counts["placed_nowhere"] == {"no run root": 34}
    assert counts["runs"] + counts["nodes"] + counts["in_run"] + sum(counts["placed_nowhere"].values()) == 34
    assert "34 span(s) stored but placed nowhere: no run root" in as_json.stderr


def test_the_report_names_the_framework_internal_calls_that_ingest_counts_and_it_leaves_out(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    result = ingest(db, [DATA / "external" / "any-agent-SMOLAGENTS_trace.json"])
    assert result.accounting.tool_calls == 3  # the ingest counts every tool span, final_answer among them
    con = open_store(db, read_only=True)
    try:
        data = report(con)
    finally:
        con.close()
    assert data["tool_calls"] == 2 == sum(t["calls"] for t in data["tools"])
    assert data["internal_calls"] == 1 and data["internal_tools"] == [{"tool": "final_answer", "calls": 1}]
    assert "final_answer" not in {t["tool"] for t in data["tools"]}
    assert data["tool_calls"] + data["internal_calls"] == result.accounting.tool_calls
    table = subprocess.run(
        [sys.executable, "-m", "treellm", "report", "--db", str(db)],
        capture_output=True, text=True, check=True, env={"COLUMNS": "200", "PATH": ""},
    )  # fmt: skip
    assert "left out of every count: final_answer (1 call); TREELLM_INTERNAL_TOOLS" in table.stdout
    one_tool = subprocess.run(
        [sys.executable, "-m", "treellm", "report", "--db", str(db), "--tool", "write_file", "--format", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(one_tool.stdout)["internal_tools"] == []  # the filters hold for them too
