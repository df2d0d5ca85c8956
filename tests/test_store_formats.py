"""Every input format ingests into the same views; real files' counts match an independent count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from treellm.signature import canonical_json, parse_arguments
from treellm.simulate.demo import demo_executor
from treellm.store import ingest, open_store
from treellm.store.connection import open_parquet
from treellm.store.maintenance import export_parquet

DATA = Path(__file__).parent / "data" / "external"


def count(db: Path, sql: str) -> Any:
    con = open_store(db, read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def tau_counts(runs: list[dict[str, Any]]) -> tuple[int, int]:
    """Tool calls and exact repeats (same tool, same canonical arguments, earlier in the run)."""
    calls = repeats = 0
    for run in runs:
        seen: set[tuple[str, str]] = set()
        for message in run["traj"]:
            for call in message.get("tool_calls") or []:
                fn = call["function"]
                key = (fn["name"], canonical_json(parse_arguments(fn["arguments"])))
                calls += 1
                repeats += key in seen
                seen.add(key)
    return calls, repeats


def test_real_trajectories_ingest_with_their_tool_calls_and_exact_repeats(tmp_path: Path) -> None:
    path = DATA / "tau-bench-gpt-4o-airline-excerpt.json"
    runs = json.loads(path.read_text(encoding="utf-8"))
    expected_calls, expected_repeats = tau_counts(runs)
    db = tmp_path / "t.duckdb"
    report = ingest(db, [path])
    assert report.runs == len(runs) == 20
    assert count(db, "SELECT count(*) FROM tool_calls") == [(expected_calls,)]
    assert count(db, "SELECT count(*) FROM tool_calls WHERE ordinal >= 2") == [(expected_repeats,)]
    assert count(db, "SELECT count(*) FROM runs") == [(20,)]
    # re-ingesting, even a copy from another path, adds nothing
    copy = tmp_path / "copy.json"
    copy.write_bytes(path.read_bytes())
    again = ingest(db, [copy])
    assert (again.spans, again.runs) == (0, 0)


def test_real_sdk_span_json_from_two_frameworks(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    expected = 0
    for name in ("any-agent-OPENAI_trace.json", "any-agent-SMOLAGENTS_trace.json"):
        spans = json.loads((DATA / name).read_text(encoding="utf-8"))["spans"]
        expected += sum(1 for s in spans if (s.get("attributes") or {}).get("gen_ai.operation.name") == "execute_tool")
        ingest(db, [DATA / name])
    assert count(db, "SELECT count(*) FROM tool_calls") == [(expected,)] == [(5,)]
    # smolagents' final_answer is a framework-internal tool: marked, never counted or tuned
    assert count(db, "SELECT tool FROM tool_calls WHERE internal") == [("final_answer",)]
    rows = count(db, "SELECT tool, signature, ordinal, run_id, result FROM tool_calls WHERE NOT internal")
    assert len(rows) == 4
    assert all(sig and sig.startswith(f"{tool}:") and ordinal == 1 and run for tool, sig, ordinal, run, _ in rows)
    # results are read from gen_ai.output (the older GenAI name), so no two missing results compare equal
    assert all(result is not None for *_, result in rows)
    assert count(db, "SELECT count(*) FROM runs") == [(2,)]
    # each file is one run, drawn as a tree: think nodes chained, tool nodes under the think that asked
    tree = count(db, "SELECT kind, depth FROM nodes WHERE run_id = (SELECT min(run_id) FROM runs) ORDER BY start_ns")
    assert [k for k, _ in tree] == ["think", "tool", "think", "tool", "think"][: len(tree)]
    assert max(d for _, d in tree) >= 1


def test_foreign_spans_that_lost_their_parents_still_form_one_run(tmp_path: Path) -> None:
    for name in ("any-agent-OPENAI_trace.json", "any-agent-SMOLAGENTS_trace.json"):
        document = json.loads((DATA / name).read_text(encoding="utf-8"))
        for span in document["spans"]:
            span["parent"] = None  # every parent lost
        orphaned = tmp_path / f"orphaned-{name}"
        orphaned.write_text(json.dumps(document), encoding="utf-8")
        db = tmp_path / f"{name}.duckdb"
        report = ingest(db, [orphaned])
        assert report.runs == 1
        assert count(db, "SELECT count(*) FROM runs") == [(1,)]
        assert count(db, "SELECT count(DISTINCT run_id) FROM spans") == [(1,)]
        missing = tmp_path / f"missing-{name}"
        document = json.loads((DATA / name).read_text(encoding="utf-8"))
        document["spans"] = [s for s in document["spans"] if s["name"].startswith("invoke_agent") is False]
        missing.write_text(json.dumps(document), encoding="utf-8")
        db = tmp_path / f"missing-{name}.duckdb"
        assert ingest(db, [missing]).runs == 1  # the run's root never arrived: its spans still form one run
        assert count(db, "SELECT count(*) FROM tool_calls WHERE orphan") == count(db, "SELECT count(*) FROM tool_calls")


def demo_spans() -> list[Any]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    demo_executor([], tracer_provider=provider, run_ids=lambda: "proto-run").run("t")
    provider.shutdown()
    return list(memory.get_finished_spans())


def test_otlp_protobuf_and_a_single_json_document_give_the_same_views(tmp_path: Path) -> None:
    spans = demo_spans()
    proto = tmp_path / "run.pb"
    proto.write_bytes(encode_spans(spans).SerializeToString())
    from treellm.otlp import spans_to_traces_data

    document = tmp_path / "run.json"
    document.write_text(json.dumps(spans_to_traces_data(spans), indent=2), encoding="utf-8")
    results = []
    for name, path in (("proto", proto), ("json", document)):
        db = tmp_path / f"{name}.duckdb"
        report = ingest(db, [path])
        assert report.details[0].input_format == {"proto": "otlp-proto", "json": "otlp-json"}[name]
        results.append(
            count(db, "SELECT node_id, kind, parent_id, tool, signature, ordinal FROM nodes ORDER BY node_id")
        )
        assert count(db, "SELECT pruned_calls, nodes FROM runs") == [(3, 32)]
    assert results[0] == results[1] and len(results[0]) == 32


def test_a_folder_ingest_skips_files_that_are_not_traces(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "README.md").write_text("# notes\n", encoding="utf-8")
    (folder / "a.json").write_bytes((DATA / "any-agent-OPENAI_trace.json").read_bytes())
    report = ingest(tmp_path / "t.duckdb", [folder])
    assert report.files == 1 and report.spans == 6


def test_two_parquet_folders_read_as_one_store(tmp_path: Path) -> None:
    first, second = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    ingest(first, [DATA / "any-agent-OPENAI_trace.json"])
    ingest(second, [DATA / "tau-bench-gpt-4o-airline-excerpt.json"])
    export_parquet(first, tmp_path / "pa")
    export_parquet(second, tmp_path / "pb")
    both = tmp_path / "both.duckdb"
    ingest(both, [DATA / "any-agent-OPENAI_trace.json", DATA / "tau-bench-gpt-4o-airline-excerpt.json"])
    con = open_parquet([tmp_path / "pa", tmp_path / "pb"])
    from_parquet = con.execute("SELECT count(*), sum(tool_nodes) FROM runs").fetchall()
    con.close()
    assert from_parquet == count(both, "SELECT count(*), sum(tool_nodes) FROM runs")
