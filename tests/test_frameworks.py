"""Other agents' traces, counted right: real frameworks through their real instrumentors.

Each framework of ``tests/frameworks/`` runs the scripted workload of
``tests/frameworks/scenario.py`` in its own virtual environment (built by the Makefile,
or here when it is missing: never skipped) against the fake OpenAI-compatible server,
and sends its spans to ``treellm collect`` and to a file. What treellm counts (runs,
calls per tool, exact repeats, productive and wasted, paging, tune verdicts) must equal
the script's truth. The recorded traces under ``tests/data/frameworks/`` (runs 0-4,
``tests/frameworks/record.py`` regenerates them) pin the same figures without the
frameworks, including spans that arrive before their run's root.

The agent shapes of ``harness.SHAPES`` (LangGraph's ``create_react_agent``, whose model
node is named ``agent``, a hand-written ``StateGraph``, a subgraph, a supervisor with two
sub-agent graphs, an Agents SDK handoff, a smolagents managed agent) play the same script:
one run per scripted run, whatever the graph (``docs/architecture.md``, "Where a run
starts"); ``tests/data/frameworks/shapes/`` holds their recorded traces.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import recorded_requests
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from treellm.collector import Collector, CollectorConfig
from treellm.store import ingest, open_store
from treellm.telemetry.conventions import event_attributes, read_span

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "frameworks"))

from harness import (  # noqa: E402
    CAPTURE_SWITCHED,
    SHAPES,
    WITHOUT_ARGUMENTS,
    figures,
    frameworks,
    run_driver,
    scenario_server,
    truth,
)
from scenario import RUNS, TOOL_DOCS, TRUTH, ToolBox, truth_from_script  # noqa: E402

RECORDED = ROOT / "tests" / "data" / "frameworks"
RECORDED_SHAPES = RECORDED / "shapes"
RECORDED_CAPTURE = RECORDED / "capture"
EXPECTED = {"adk", "agents", "autogen", "crewai", "langgraph", "llamaindex", "openllmetry", "pydanticai", "smolagents",
            "strands"}  # fmt: skip
PLAYED = [(name, "default") for name in sorted(EXPECTED)] + [(name, "on") for name in CAPTURE_SWITCHED]
"""(framework, capture): each framework as its instrumentation comes, and with its content switch on."""
RECORDINGS = (
    [(RECORDED / f"{name}.pb", name, "default") for name in sorted(EXPECTED)]
    + [(RECORDED_SHAPES / f"{name}-{shape}.pb", name, "default") for name, shape in SHAPES]
    + [(RECORDED_CAPTURE / f"{name}.pb", name, "on") for name in CAPTURE_SWITCHED]
)


def _id(item: tuple[Any, ...]) -> str:
    path, _, capture = item
    return path.stem + ("@on" if capture == "on" else "")


def test_every_framework_has_a_driver_and_a_recorded_trace() -> None:
    assert set(frameworks()) == EXPECTED
    assert {p.stem for p in RECORDED.glob("*.pb")} == EXPECTED
    assert {p.stem for p in RECORDED_SHAPES.glob("*.pb")} == {f"{name}-{shape}" for name, shape in SHAPES}
    assert {p.stem for p in RECORDED_CAPTURE.glob("*.pb")} == set(CAPTURE_SWITCHED)


def test_the_stated_truth_is_what_the_script_does() -> None:
    computed = truth_from_script()
    assert {k: TRUTH[k] for k in computed} == computed


def _figures(db: Path) -> dict[str, Any]:
    con = open_store(db, read_only=True)
    try:
        return figures(con)
    finally:
        con.close()


@pytest.mark.parametrize(("name", "capture"), PLAYED, ids=[f"{n}@{c}" for n, c in PLAYED])
def test_a_framework_through_the_collector_counts_like_its_script(name: str, capture: str, tmp_path: Path) -> None:
    db = tmp_path / "store.duckdb"
    with scenario_server() as server, Collector(db, CollectorConfig(port=0, flush_interval_s=0.2)) as collector:
        run_driver(name, server.base_url, otlp_endpoint=collector.url.removesuffix("/v1/traces"), capture=capture)
        assert sum(1 for r in server.requests if r.status == 200) == sum(len(t) + 1 for t in RUNS)
    assert _figures(db) == truth(name, capture)


@pytest.mark.parametrize(("name", "capture"), PLAYED, ids=[f"{n}@{c}" for n, c in PLAYED])
def test_a_framework_through_a_file_counts_like_its_script(name: str, capture: str, tmp_path: Path) -> None:
    spans = tmp_path / "spans.pb"
    with scenario_server() as server:
        run_driver(name, server.base_url, otlp_file=spans, capture=capture)
    db = tmp_path / "store.duckdb"
    expected = truth(name, capture)
    assert ingest(db, [spans]).runs == TRUTH["runs"]
    assert _figures(db) == expected
    tuned = subprocess.run(
        [sys.executable, "-m", "treellm", "tune", "--db", str(db)], capture_output=True, text=True, check=True
    )
    verdicts = {row["tool"]: row["verdict"] for row in json.loads(tuned.stdout)["tools"] if row["samples"]}
    assert verdicts == expected["verdicts"]
    reported = subprocess.run(
        [sys.executable, "-m", "treellm", "report", "--db", str(db), "--format", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    tools = {row["tool"]: row for row in json.loads(reported.stdout)["tools"]}
    assert {t: r["arguments_unknown"] for t, r in tools.items() if r["arguments_unknown"]} == expected[
        "arguments_unknown_by_tool"
    ]
    switches = {r["capture_switch"]["framework"] for r in tools.values() if r["arguments_unknown"]}
    assert len(switches) == (1 if expected["arguments_unknown_by_tool"] else 0)


@pytest.mark.parametrize(("name", "shape"), SHAPES, ids=[f"{n}-{s}" for n, s in SHAPES])
def test_an_agent_shape_through_the_collector_is_one_run_per_scripted_run(
    name: str, shape: str, tmp_path: Path
) -> None:
    """Nodes named like agents, subgraphs, sub-agents and handoffs start no run of their own;
    the batch exporter sends each trace's spans in several exports, its root last."""
    db = tmp_path / "store.duckdb"
    with scenario_server() as server, Collector(db, CollectorConfig(port=0, flush_interval_s=0.2)) as collector:
        run_driver(name, server.base_url, otlp_endpoint=collector.url.removesuffix("/v1/traces"), shape=shape)
    assert _figures(db) == TRUTH


@pytest.mark.parametrize(("name", "shape"), SHAPES, ids=[f"{n}-{s}" for n, s in SHAPES])
def test_an_agent_shape_through_a_file_is_one_run_per_scripted_run(name: str, shape: str, tmp_path: Path) -> None:
    spans = tmp_path / "spans.pb"
    with scenario_server() as server:
        run_driver(name, server.base_url, otlp_file=spans, shape=shape)
    db = tmp_path / "store.duckdb"
    assert ingest(db, [spans]).runs == TRUTH["runs"]
    assert _figures(db) == TRUTH


# -- the recorded traces: fast, no framework needed -------------------------------------------------------


def _attributes(span: Any) -> dict[str, str]:
    out = {}
    for kv in span.attributes:
        value = kv.value
        kind = value.WhichOneof("value")
        out[kv.key] = str(getattr(value, kind)).lower() if kind == "bool_value" else str(getattr(value, kind))
    return out


def _write(path: Path, records: list[TracesData]) -> Path:
    with path.open("wb") as handle:
        for record in records:
            data = record.SerializeToString()
            handle.write(len(data).to_bytes(4, "big") + data)
    return path


FIVE = truth_from_script(range(5))


def _five(name: str, capture: str) -> dict[str, Any]:
    return truth(name, capture, of=FIVE)


def _one_run_per_trace(db: Path) -> None:
    """Each driver runs one scripted run per trace: every span of a trace is in its one run."""
    con = open_store(db, read_only=True)
    try:
        assert con.execute("SELECT count(DISTINCT trace_id), count(*) FROM runs").fetchone() == (5, 5)
        split = con.execute(
            "SELECT count(*) FROM (SELECT trace_id FROM spans GROUP BY trace_id HAVING count(DISTINCT run_id) > 1)"
        ).fetchone()
        assert split == (0,)
    finally:
        con.close()


@pytest.mark.parametrize(("path", "name", "capture"), RECORDINGS, ids=map(_id, RECORDINGS))
def test_a_recorded_trace_counts_like_its_script(path: Path, name: str, capture: str, tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    assert ingest(db, [path]).runs == 5
    got, expected = _figures(db), _five(name, capture)
    assert {k: got[k] for k in expected} == expected
    _one_run_per_trace(db)


@pytest.mark.parametrize(("path", "name", "capture"), RECORDINGS, ids=map(_id, RECORDINGS))
def test_spans_that_arrive_before_their_root_join_its_run(path: Path, name: str, capture: str, tmp_path: Path) -> None:
    """A batch exporter often sends children first: the roots arrive last, in a second file."""
    children, roots = [], []
    for record in recorded_requests(path):
        for resource_spans in record.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    one = TracesData()
                    rs = one.resource_spans.add()
                    rs.resource.CopyFrom(resource_spans.resource)
                    ss = rs.scope_spans.add()
                    ss.scope.CopyFrom(scope_spans.scope)
                    ss.spans.add().CopyFrom(span)
                    (roots if not span.parent_span_id else children).append(one)
    assert roots and children
    db = tmp_path / "t.duckdb"
    ingest(db, [_write(tmp_path / "children.pb", list(reversed(children)))])
    ingest(db, [_write(tmp_path / "roots.pb", roots)])
    got, expected = _figures(db), _five(name, capture)
    assert {k: got[k] for k in expected} == expected
    _one_run_per_trace(db)
    con = open_store(db, read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM tool_calls WHERE orphan").fetchone() == (0,)
    finally:
        con.close()


@pytest.mark.parametrize(("path", "name", "capture"), RECORDINGS, ids=map(_id, RECORDINGS))
def test_a_trace_whose_first_half_arrives_alone_is_one_run_once_the_rest_arrives(
    path: Path, name: str, capture: str, tmp_path: Path
) -> None:
    """Two collector batches cut each trace in time order: the first holds no root, the
    second the rest (its root last); the first placement is provisional, the second final."""
    spans = [(record, rs, ss, span) for record in recorded_requests(path) for rs in record.resource_spans
             for ss in rs.scope_spans for span in ss.spans]  # fmt: skip
    ordered = sorted(spans, key=lambda item: item[3].end_time_unix_nano)
    first, second = ordered[: len(ordered) // 2], ordered[len(ordered) // 2 :]
    db = tmp_path / "t.duckdb"
    for number, part in enumerate((first, second)):
        data = TracesData()
        for _, rs, ss, span in part:
            out = data.resource_spans.add()
            out.resource.CopyFrom(rs.resource)
            scope = out.scope_spans.add()
            scope.scope.CopyFrom(ss.scope)
            scope.spans.add().CopyFrom(span)
        ingest(db, [_write(tmp_path / f"part{number}.pb", [data])])
    got, expected = _figures(db), _five(name, capture)
    assert {k: got[k] for k in expected} == expected
    _one_run_per_trace(db)


CONTENT_RECORDINGS = [r for r in RECORDINGS if r[0].parent != RECORDED_SHAPES]


@pytest.mark.parametrize(("path", "name", "capture"), CONTENT_RECORDINGS, ids=map(_id, CONTENT_RECORDINGS))
def test_the_conventions_read_each_tool_span_as_the_call_the_script_made(path: Path, name: str, capture: str) -> None:
    """Arguments and results wherever the conventions put them (attributes, GenAI span events);
    a span that holds no arguments reads as arguments unknown (``None``), never as ``{}``."""
    box = ToolBox()
    expected_results = set()
    expected_calls = set()
    for i in range(5):
        for turn in RUNS[i]:
            for call in turn:
                expected_calls.add((call.tool, json.dumps(dict(call.arguments), sort_keys=True)))
                expected_results.add(box.call(call.tool, call.arguments))
    unknown = (name, capture) in WITHOUT_ARGUMENTS
    seen = 0
    for record in recorded_requests(path):
        for resource_spans in record.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    events = [(e.name, _attributes(e)) for e in span.events]
                    attributes = {**_attributes(span), **event_attributes(events)}
                    facts = read_span(span.name, attributes, status_code=span.status.code)
                    if facts.role != "tool" or facts.tool_name == "final_answer":
                        continue
                    seen += 1
                    assert facts.tool_name in TOOL_DOCS
                    if unknown:
                        assert facts.arguments is None
                        continue
                    assert facts.result in expected_results, facts.result
                    if name == "langgraph" and not (facts.arguments or "").startswith("{"):
                        continue  # a bare value: the parent `tools` span records the call (tested by the counts)
                    arguments = json.loads(facts.arguments or "null")
                    assert (facts.tool_name, json.dumps(arguments, sort_keys=True)) in expected_calls
    assert seen == FIVE["calls"]
