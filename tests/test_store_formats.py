"""Every input format ingests into the same views; real files' counts match an independent count;
the registry of input formats is the one source of the CLI choices and the README table."""

from __future__ import annotations

import argparse
import importlib
import json
import typing
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from treellm.errors import IngestError
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


# --- the registry of input formats ------------------------------------------------------------------


def test_every_format_module_exposes_name_sniff_and_convert_and_the_registry_orders_them() -> None:
    from treellm.derive import formats

    assert typing.get_args(formats.InputFormat) == formats.NAMES
    assert len(set(formats.NAMES)) == len(formats.NAMES)
    for fmt in formats.FORMATS:
        module = importlib.import_module(f"treellm.derive.formats.{fmt.name.replace('-', '_')}")
        assert (module.NAME, module.sniff, module.convert) == (fmt.name, fmt.sniff, fmt.convert)
        assert module.__doc__ and f"``{fmt.name}``" in module.__doc__


def test_the_cli_choices_and_the_ingest_type_are_the_registry_names() -> None:
    from treellm import cli
    from treellm.derive import formats
    from treellm.store.ingest import InputFormatChoice

    assert typing.get_args(InputFormatChoice) == ("auto", *formats.NAMES)
    assert ("auto", *formats.NAMES) == cli.INPUT_FORMATS
    parser = cli.build_parser()
    ingest_parser = next(
        action.choices["ingest"] for action in parser._actions if isinstance(action, argparse._SubParsersAction)
    )
    [choices] = [action.choices for action in ingest_parser._actions if action.dest == "input_format"]
    assert tuple(choices) == ("auto", *formats.NAMES)


def test_the_readme_table_of_recognised_inputs_is_the_registry() -> None:
    from treellm.derive.formats import readme_table

    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    assert readme_table() in readme


# --- the OpenTelemetry SDK's console output and its JSON lines ------------------------------------------


T0 = 1_717_000_000_123_456_000  # whole microseconds: the SDK's ISO times keep exactly these
US = 1_000


def console_spans(formatter: Any | None, path: Path) -> list[ReadableSpan]:
    """The same spans written by a real ``ConsoleSpanExporter`` to ``path`` and kept in memory:
    a root, a child with every attribute type, an event, a link and an error, a grandchild."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "console-test", "host.cores": 2}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with path.open("w", encoding="utf-8") as out:
        exporter = (
            ConsoleSpanExporter(out=out) if formatter is None else ConsoleSpanExporter(out=out, formatter=formatter)
        )
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("scope-a", "1.2")
        root = tracer.start_span("root", kind=SpanKind.SERVER, start_time=T0, attributes={"n": 1})
        child = tracer.start_span(
            "child",
            context=trace.set_span_in_context(root),
            kind=SpanKind.CLIENT,
            start_time=T0 + 5 * US,
            links=[Link(root.get_span_context(), {"relation": "caused_by"})],
            attributes={
                "str": "naïve ✓ \u2028",
                "int": -(2**62),
                "float": 1.25,
                "nan": float("nan"),
                "bool": True,
                "strs": ["a", "b"],
                "ints": [1, 2],
                "bools": [True, False],
            },
        )
        child.add_event("retry", {"attempt": 2, "why": "busy"}, timestamp=T0 + 7 * US)
        child.set_status(Status(StatusCode.ERROR, "boom"))
        grandchild = tracer.start_span("grandchild", context=trace.set_span_in_context(child), start_time=T0 + 8 * US)
        grandchild.set_status(Status(StatusCode.OK))
        grandchild.end(end_time=T0 + 8 * US + US)
        child.end(end_time=T0 + 9 * US)
        root.end(end_time=T0 + 11 * US)
        provider.shutdown()
    return list(memory.get_finished_spans())


def compact(span: ReadableSpan) -> str:
    return span.to_json(indent=None) + "\n"


ROW_QUERIES = {
    "spans": "SELECT * EXCLUDE (source, scope_name, scope_version) FROM spans ORDER BY span_id",
    "events": "SELECT * FROM span_events ORDER BY span_id, event_index",
    "links": "SELECT * FROM span_links ORDER BY span_id, link_index",
}


def rows(db: Path) -> dict[str, Any]:
    return {name: count(db, sql) for name, sql in ROW_QUERIES.items()}


@pytest.mark.parametrize(
    ("formatter", "expected"),
    [(None, "sdk-console"), (compact, "sdk-jsonl"), (lambda s: s.to_json(indent=2), "sdk-console")],
    ids=["console-default", "console-jsonl", "console-no-separator"],
)
def test_console_exporter_files_ingest_exactly_like_the_same_spans_as_otlp(
    tmp_path: Path, formatter: Any, expected: str
) -> None:
    from treellm.derive.formats import detect_format, iter_traces_data

    path = tmp_path / "console.txt"
    spans = console_spans(formatter, path)
    text = path.read_text(encoding="utf-8")
    assert not text.lstrip().startswith("[") and text.count('"parent_id"') == 3
    assert detect_format(path) == expected
    records = list(iter_traces_data(path, expected))
    assert [index for index, _ in records] == [0, 1, 2]  # one record per span
    otlp = tmp_path / "same.pb"
    otlp.write_bytes(encode_spans(spans).SerializeToString())
    from_console, from_otlp = tmp_path / "console.duckdb", tmp_path / "otlp.duckdb"
    report = ingest(from_console, [path])
    assert report.details[0].input_format == expected and report.spans == 3
    ingest(from_otlp, [otlp])
    got, want = rows(from_console), rows(from_otlp)
    assert got == want
    assert len(want["events"]) == 1 and len(want["links"]) == 1
    parents = count(
        from_console, "SELECT name, parent_span_id IS NULL, status_code, status_message FROM spans ORDER BY name"
    )
    assert parents == [("child", False, 2, "boom"), ("grandchild", False, 1, None), ("root", True, 0, None)]


def test_console_detection_tells_the_json_shapes_apart(tmp_path: Path) -> None:
    from treellm.derive.formats import detect_format
    from treellm.otlp import spans_to_traces_data

    path = tmp_path / "console.txt"
    spans = console_spans(None, path)
    doc = spans_to_traces_data(spans)
    one = json.loads(spans[0].to_json())
    cases = {
        "otlp-jsonl": json.dumps(doc) + "\n" + json.dumps(doc) + "\n",
        "otlp-json": json.dumps(doc, indent=2) + "\n" + json.dumps(doc, indent=2),
        "sdk-jsonl": compact(spans[0]) + compact(spans[1]),
        "sdk-console": spans[0].to_json() + "\n" + spans[1].to_json() + "\n",
        "sdk-json": json.dumps({"spans": [one]}, indent=4),
        "trajectory": json.dumps([{"role": "user", "content": "hi"}]),
    }
    for name, content in cases.items():
        target = tmp_path / f"{name}.json"
        target.write_text(content, encoding="utf-8")
        assert detect_format(target) == name, name
    for content in (spans[0].to_json(), compact(spans[0]), json.dumps([one, one], indent=4)):
        target = tmp_path / "single.json"
        target.write_text(content, encoding="utf-8")
        assert detect_format(target) == "sdk-json"  # one span, or a list: one document, as before


def test_a_corrupt_console_file_names_the_file_and_the_record_and_skip_bad_keeps_the_rest(tmp_path: Path) -> None:
    source = tmp_path / "console.txt"
    spans = console_spans(None, source)
    objects = [s.to_json() for s in spans]  # grandchild, child, root (the order they ended)
    broken_json = objects[1].replace('"name": "child",', '"name": "child"', 1)  # a comma missing
    bad_span = objects[1].replace('"kind": "SpanKind.CLIENT"', '"kind": "SpanKind.SIDEWAYS"', 1)
    assert broken_json != objects[1] and bad_span != objects[1]
    for label, corrupt in (("json", broken_json), ("span", bad_span)):
        path = tmp_path / f"corrupt-{label}.txt"
        path.write_text("\n".join([objects[0], corrupt, objects[2]]) + "\n", encoding="utf-8")
        with pytest.raises(IngestError) as caught:
            ingest(tmp_path / f"strict-{label}.duckdb", [path])
        assert caught.value.path == str(path) and caught.value.record == 1
        assert str(caught.value).startswith(f"{path} (record 1): span object at line")
        db = tmp_path / f"skip-{label}.duckdb"
        report = ingest(db, [path], skip_bad=True)
        assert [(b.path, b.record) for b in report.bad_records] == [(str(path), 1)]
        assert count(db, "SELECT name FROM spans ORDER BY name") == [("grandchild",), ("root",)]


def test_a_corrupt_sdk_json_lines_file_names_the_line_and_skip_bad_reports_each_bad_one(tmp_path: Path) -> None:
    source = tmp_path / "console.jsonl"
    spans = console_spans(compact, source)
    lines = source.read_text(encoding="utf-8").splitlines()
    lines[1] = lines[1][: len(lines[1]) // 2]  # a torn span
    lines.append('{"name": "no context", "start_time": 1}')
    path = tmp_path / "corrupt.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(IngestError) as caught:
        ingest(tmp_path / "strict.duckdb", [path])
    assert (caught.value.path, caught.value.line, caught.value.record) == (str(path), 2, 1)
    assert str(caught.value).startswith(f"{path}:2: invalid JSON")
    db = tmp_path / "skip.duckdb"
    report = ingest(db, [path], skip_bad=True)
    assert [(b.line, b.record) for b in report.bad_records] == [(2, 1), (4, 3)]
    assert "context.trace_id" in report.bad_records[1].reason
    assert count(db, "SELECT name FROM spans ORDER BY name") == [("grandchild",), ("root",)]
    assert len(spans) == 3


def test_a_short_file_cut_inside_a_key_names_the_line_and_column_where_it_ends(tmp_path: Path) -> None:
    run = json.loads((DATA / "tau-bench-gpt-4o-airline-excerpt.json").read_text(encoding="utf-8"))[0]
    # the keys that decide the format come after a large value, and the cut lands inside a key before them
    document = json.dumps({"task_id": run["task_id"], "info": run["info"], "source": "user", "traj": run["traj"]},
                          indent=1)  # fmt: skip
    cut = document[: document.index('"source"') + 3]
    path = tmp_path / "cut.json"
    path.write_text(cut, encoding="utf-8")
    assert 1000 < path.stat().st_size < 64 << 10  # whole within the sniffed prefix, as in the report
    line = cut.count("\n") + 1
    column = cut.splitlines()[-1].rindex('"so') + 1  # where the unterminated string opens
    with pytest.raises(IngestError) as caught:
        ingest(tmp_path / "t.duckdb", [path])
    assert f'line {line}, column {column}: the file ends inside the string "so' in str(caught.value)
    assert cut.splitlines()[line - 1][column - 1 :] == '"so'


def test_json_that_breaks_inside_its_first_object_names_the_line_and_column(tmp_path: Path) -> None:
    for content, where in (
        ('{"a": 1, "b": ]', "line 1, column 15: unexpected b']'"),
        ('{\n  "a": 1,\n  "b": 2,\n ', "line 4, column 2: the file ends early"),
        ('\ufeff{"é": "ü", "b" 2}', "line 1, column 16: unexpected b'2'"),  # characters, not bytes; a BOM is none
    ):
        path = tmp_path / "bad.json"
        path.write_text(content, encoding="utf-8")
        with pytest.raises(IngestError) as caught:
            ingest(tmp_path / "t.duckdb", [path])
        assert f"it starts like JSON but is not ({where})" in str(caught.value), content
