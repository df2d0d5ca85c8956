"""Format detection and the converters of every other trace format to OTLP/JSON ``TracesData``.

Expected numbers for the real files (tests/data/external, see its README) are computed in
the tests straight from the raw JSON, independently of the converters, and pinned too.

The Collector file exporter's proto framing follows its README
(https://github.com/open-telemetry/opentelemetry-collector-contrib/blob/main/exporter/fileexporter/README.md,
"File Format"): "each encoded object is preceded by 4 bytes (an unsigned 32 bit integer)
which represent the number of bytes contained in the encoded object"; its
``file_writer.go`` writes that length big-endian (``binary.BigEndian.PutUint32``).
"""

from __future__ import annotations

import json
import random
import re
import shutil
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers import flagged_by_sql, real_trajectory_texts
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as ProtoResource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, TracesData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from treellm.analysis import explorer
from treellm.derive.foreign import result_read_sql
from treellm.derive.formats import (
    detect_format,
    iter_traces_data,
    proto_to_traces_data,
    sdk_json_to_traces_data,
    trajectories_to_traces_data,
)
from treellm.engine.repeats import ToolRule, is_failure
from treellm.errors import IngestError
from treellm.otlp import spans_to_traces_data, traces_data_line
from treellm.signature import canonical_json, parse_arguments
from treellm.store import ingest, open_store
from treellm.telemetry import redaction
from treellm.telemetry.conventions import unwrap_result

DATA = Path(__file__).parent / "data" / "external"
OPENAI = DATA / "any-agent-OPENAI_trace.json"
SMOLAGENTS = DATA / "any-agent-SMOLAGENTS_trace.json"
TAU = DATA / "tau-bench-gpt-4o-airline-excerpt.json"
HEX32 = re.compile(r"[0-9a-f]{32}")
HEX16 = re.compile(r"[0-9a-f]{16}")
T0 = 1_717_000_000_123_456_000  # whole microseconds: the SDK's ISO times keep exactly these
US = 1_000


# --- helpers ----------------------------------------------------------------------------------------


def all_spans(traces_data: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        span
        for resource_spans in traces_data["resourceSpans"]
        for scope_spans in resource_spans["scopeSpans"]
        for span in scope_spans["spans"]
    ]


def attrs(span: dict[str, Any]) -> dict[str, Any]:
    """Attribute values of an OTLP/JSON span, scalars unwrapped from their AnyValue."""
    return {a["key"]: next(iter(a["value"].values()), None) for a in span["attributes"]}


def without_flags(value: Any) -> Any:
    """A copy without ``flags`` (the proto encoder leaves out the W3C trace-flag bits)."""
    if isinstance(value, dict):
        return {k: without_flags(v) for k, v in value.items() if k != "flags"}
    if isinstance(value, list):
        return [without_flags(v) for v in value]
    return value


def make_spans(name: str = "batch") -> list[ReadableSpan]:
    """Two scopes, a parent and a child with every attribute type, an event, a link, an error."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "foreign-test", "host.cores": 2}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    outer = provider.get_tracer("scope-a", "1.2")
    inner = provider.get_tracer("scope-b")
    root = outer.start_span(f"{name} root", kind=SpanKind.SERVER, start_time=T0, attributes={"n": 1})
    context = root.get_span_context()
    child = inner.start_span(
        f"{name} child",
        context=trace.set_span_in_context(root),
        kind=SpanKind.CLIENT,
        start_time=T0 + 5 * US,
        links=[Link(context, {"relation": "caused_by"})],
        attributes={
            "str": "naïve ✓",
            "int": -(2**62),
            "float": 1.25,
            "nan": float("nan"),
            "inf": float("-inf"),
            "bool": True,
            "strs": ["a", "b"],
            "ints": [1, 2],
            "floats": [0.5],
            "bools": [True, False],
        },
    )
    child.add_event("retry", {"attempt": 2}, timestamp=T0 + 7 * US)
    child.set_status(Status(StatusCode.ERROR, "boom"))
    child.end(end_time=T0 + 9 * US)
    root.end(end_time=T0 + 11 * US)
    provider.shutdown()
    return list(exporter.get_finished_spans())


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def repeats(calls: list[tuple[str, str]]) -> int:
    """Calls whose (tool, canonical arguments) already appeared earlier in the same list."""
    seen: set[tuple[str, str]] = set()
    count = 0
    for name, arguments in calls:
        key = (name, canonical_json(parse_arguments(arguments)))
        count += key in seen
        seen.add(key)
    return count


def raw_calls(run: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (call["function"]["name"], call["function"]["arguments"])
        for message in run["traj"]
        if message["role"] == "assistant"
        for call in message.get("tool_calls") or []
    ]


def tool_spans(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spans = [s for s in all_spans(doc) if attrs(s).get("gen_ai.operation.name") == "execute_tool"]
    return sorted(spans, key=lambda s: int(s["startTimeUnixNano"]))


# --- detection -----------------------------------------------------------------------------------------


@pytest.fixture
def spans() -> list[ReadableSpan]:
    return make_spans()


def test_detects_otlp_json_lines(tmp_path: Path, spans: list[ReadableSpan]) -> None:
    path = tmp_path / "traces.jsonl"
    path.write_bytes(traces_data_line(spans) * 2)
    assert detect_format(path) == "otlp-jsonl"


def test_detects_a_pretty_printed_otlp_json_object_and_reads_concatenated_ones(
    tmp_path: Path, spans: list[ReadableSpan]
) -> None:
    doc = spans_to_traces_data(spans)
    path = tmp_path / "traces.json"
    path.write_text(json.dumps(doc, indent=2) + "\n" + json.dumps(doc, indent=2))
    assert detect_format(path) == "otlp-json"
    records = list(iter_traces_data(path, "otlp-json"))
    assert [index for index, _ in records] == [0, 1]
    assert records[1][1] == json.loads(json.dumps(doc))


def test_detects_protobuf_bare_and_length_prefixed(tmp_path: Path, spans: list[ReadableSpan]) -> None:
    payload = encode_spans(spans).SerializeToString()
    bare, framed = tmp_path / "bare.pb", tmp_path / "framed.pb"
    bare.write_bytes(payload)
    framed.write_bytes(frame(payload) + frame(payload))
    assert detect_format(bare) == "otlp-proto"
    assert detect_format(framed) == "otlp-proto"


def test_detects_protobuf_whose_first_length_byte_looks_like_a_json_brace(tmp_path: Path) -> None:
    # 0x0a (field 1: resource_spans) is whitespace to a JSON sniffer; a length of 123 is "{".
    for filler in range(200):
        resource_spans = ResourceSpans(
            resource=ProtoResource(attributes=[KeyValue(key="k", value=AnyValue(string_value="x" * filler))]),
            scope_spans=[ScopeSpans(spans=[Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="s")])],
        )
        if resource_spans.ByteSize() == ord("{"):
            break
    data = TracesData(resource_spans=[resource_spans]).SerializeToString()
    assert data[:2] == b"\n{"
    path = tmp_path / "brace.pb"
    path.write_bytes(data)
    assert detect_format(path) == "otlp-proto"
    [(_, doc)] = list(iter_traces_data(path, "otlp-proto"))
    assert all_spans(doc)[0]["spanId"] == "02" * 8


def test_detects_sdk_json_and_trajectories(tmp_path: Path, spans: list[ReadableSpan]) -> None:
    assert detect_format(OPENAI) == "sdk-json"
    assert detect_format(SMOLAGENTS) == "sdk-json"
    assert detect_format(TAU) == "trajectory"
    cases: dict[str, object] = {
        "bare-spans.json": [json.loads(s.to_json()) for s in spans],
        "one-line-spans.json": {"spans": [json.loads(s.to_json()) for s in spans]},
        "messages.json": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        "object.json": {"task_id": "t", "messages": [{"role": "user", "content": "hi"}]},
        "runs-of-lists.json": [[{"role": "user", "content": "hi"}], []],
        "no-runs.json": [],
    }
    expected = {"bare-spans.json": "sdk-json", "one-line-spans.json": "sdk-json"}
    for name, obj in cases.items():
        path = tmp_path / name
        path.write_text(json.dumps(obj, indent=None if name.startswith("one-line") else 2))
        assert detect_format(path) == expected.get(name, "trajectory"), name


def test_a_json_lines_file_with_a_broken_first_line_goes_to_the_line_reader(
    tmp_path: Path, spans: list[ReadableSpan]
) -> None:
    line = traces_data_line(spans)
    path = tmp_path / "torn.jsonl"
    path.write_bytes(line[: len(line) // 2] + b"\n" + line)
    assert detect_format(path) == "otlp-jsonl"


def test_a_single_sdk_span_object_is_sdk_json(tmp_path: Path, spans: list[ReadableSpan]) -> None:
    path = tmp_path / "span.json"
    path.write_text(spans[0].to_json())
    assert detect_format(path) == "sdk-json"
    [(_, doc)] = list(iter_traces_data(path, "sdk-json"))
    assert [s["name"] for s in all_spans(doc)] == [spans[0].name]


def test_detection_reads_past_a_large_value_before_the_deciding_key(tmp_path: Path) -> None:
    raw = json.loads(OPENAI.read_text())
    path = tmp_path / "late-spans.json"
    path.write_text(json.dumps({"final_output": "x" * 300_000, "spans": raw["spans"]}, indent=2))
    assert detect_format(path) == "sdk-json"


@pytest.mark.parametrize("content", [b"", b"  \n\t\n"])
def test_an_empty_or_blank_file_is_otlp_json_lines(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    assert detect_format(path) == "otlp-jsonl"


def test_an_unknown_json_shape_names_the_file_and_its_keys(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"foo": 1, "bar": [1, 2]}, indent=2))
    with pytest.raises(IngestError) as caught:
        detect_format(path)
    assert caught.value.path == str(path)
    assert str(caught.value).startswith(str(path))
    assert "'bar', 'foo'" in str(caught.value)


def test_garbage_bytes_are_not_a_format(tmp_path: Path) -> None:
    path = tmp_path / "garbage.bin"
    path.write_bytes(random.Random(7).randbytes(300))
    with pytest.raises(IngestError) as caught:
        detect_format(path)
    assert caught.value.path == str(path)
    assert "unrecognised input" in caught.value.reason


def test_iter_traces_data_refuses_json_lines(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="otlp-jsonl"):
        list(iter_traces_data(tmp_path / "x.jsonl", "otlp-jsonl"))


# --- OTLP protobuf ----------------------------------------------------------------------------------


def test_protobuf_converts_to_the_same_otlp_json_as_the_sdk_encoder(spans: list[ReadableSpan]) -> None:
    payload = encode_spans(spans).SerializeToString()
    [converted] = list(proto_to_traces_data(payload, path="batch.pb"))
    expected = spans_to_traces_data(spans)
    assert without_flags(converted) == without_flags(json.loads(json.dumps(expected)))
    child = next(s for s in all_spans(converted) if s["name"] == "batch child")
    assert HEX32.fullmatch(child["traceId"]) and HEX16.fullmatch(child["parentSpanId"])
    assert child["kind"] == 3
    assert child["status"] == {"code": 2, "message": "boom"}
    assert attrs(child)["int"] == str(-(2**62))
    assert attrs(child)["nan"] == "NaN"
    assert child["flags"] & 0x100  # the encoder's "has is_remote" bit survives


def test_protobuf_any_values_bytes_kvlist_and_empty() -> None:
    span = Span(
        trace_id=b"\x01" * 16,
        span_id=b"\x02" * 8,
        name="s",
        start_time_unix_nano=2**62,
        end_time_unix_nano=2**62,  # an end before the start is rejected (treellm.otlp.validate)
        attributes=[
            KeyValue(key="bytes", value=AnyValue(bytes_value=b"\x00\xff")),
            KeyValue(
                key="kv",
                value=AnyValue(
                    kvlist_value=KeyValueList(values=[KeyValue(key="n", value=AnyValue(int_value=-(2**63)))])
                ),
            ),
            KeyValue(key="empty", value=AnyValue()),
            KeyValue(
                key="array",
                value=AnyValue(
                    array_value=ArrayValue(values=[AnyValue(string_value="x"), AnyValue(double_value=0.25)])
                ),
            ),
        ],
    )
    data = TracesData(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])]).SerializeToString()
    [doc] = list(proto_to_traces_data(data, path="x.pb"))
    [converted] = all_spans(doc)
    assert converted["startTimeUnixNano"] == str(2**62)
    assert "parentSpanId" not in converted
    assert converted["attributes"] == [
        {"key": "bytes", "value": {"bytesValue": "AP8="}},
        {
            "key": "kv",
            "value": {"kvlistValue": {"values": [{"key": "n", "value": {"intValue": str(-(2**63))}}]}},
        },
        {"key": "empty", "value": {}},
        {"key": "array", "value": {"arrayValue": {"values": [{"stringValue": "x"}, {"doubleValue": 0.25}]}}},
    ]


def test_collector_length_prefixed_file_with_three_messages(tmp_path: Path) -> None:
    batches = [make_spans(f"batch{i}") for i in range(3)]
    path = tmp_path / "collector.pb"
    path.write_bytes(b"".join(frame(encode_spans(batch).SerializeToString()) for batch in batches))
    assert detect_format(path) == "otlp-proto"
    records = list(iter_traces_data(path, "otlp-proto"))
    assert [index for index, _ in records] == [0, 1, 2]
    for (_, doc), batch in zip(records, batches, strict=True):
        assert without_flags(doc) == without_flags(json.loads(json.dumps(spans_to_traces_data(batch))))


def test_a_truncated_collector_file_names_the_broken_message() -> None:
    payloads = [encode_spans(make_spans(f"b{i}")).SerializeToString() for i in range(3)]
    data = b"".join(frame(p) for p in payloads)[:-10]
    converted = []
    with pytest.raises(IngestError) as caught:
        for doc in proto_to_traces_data(data, path="cut.pb"):
            converted.append(doc)
    assert len(converted) == 2
    assert caught.value.record == 2
    assert "truncated" in caught.value.reason
    assert str(caught.value).startswith("cut.pb (record 2): ")


def test_a_truncated_single_message_names_record_zero(spans: list[ReadableSpan]) -> None:
    payload = encode_spans(spans).SerializeToString()
    with pytest.raises(IngestError) as caught:
        list(proto_to_traces_data(payload[: len(payload) // 2], path="half.pb"))
    assert caught.value.record == 0
    assert caught.value.path == "half.pb"
    assert "truncated or corrupt" in caught.value.reason


def test_random_garbage_is_not_protobuf() -> None:
    with pytest.raises(IngestError) as caught:
        list(proto_to_traces_data(random.Random(7).randbytes(300), path="garbage.bin"))
    assert caught.value.record == 0
    assert str(caught.value).startswith("garbage.bin (record 0): ")


def test_a_protobuf_span_with_a_short_id_is_rejected() -> None:
    span = Span(trace_id=b"\x01" * 3, span_id=b"\x02" * 8, name="s")
    data = TracesData(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])]).SerializeToString()
    with pytest.raises(IngestError, match=r"traceId: expected 32 hex digits, not all zero") as caught:
        list(proto_to_traces_data(frame(data) + frame(data), path="ids.pb"))
    assert caught.value.record == 0


# --- OpenTelemetry SDK span JSON ----------------------------------------------------------------------


@pytest.mark.parametrize(("path", "tool_calls"), [(OPENAI, 2), (SMOLAGENTS, 3)])
def test_any_agent_tool_spans_match_an_independent_count(path: Path, tool_calls: int) -> None:
    raw = json.loads(path.read_text())["spans"]
    expected = sum(
        1
        for s in raw
        if s["attributes"].get("gen_ai.operation.name") == "execute_tool" or "gen_ai.tool.name" in s["attributes"]
    )
    assert expected == tool_calls
    [(index, doc)] = list(iter_traces_data(path, detect_format(path)))
    assert index == 0
    spans = all_spans(doc)
    assert len(spans) == len(raw)
    converted = [
        s for s in spans if attrs(s).get("gen_ai.operation.name") == "execute_tool" or "gen_ai.tool.name" in attrs(s)
    ]
    assert len(converted) == tool_calls
    assert {s["name"] for s in converted} == {s["name"] for s in raw if "gen_ai.tool.name" in s["attributes"]}


@pytest.mark.parametrize("path", [OPENAI, SMOLAGENTS])
def test_any_agent_integer_ids_become_hex(path: Path) -> None:
    raw = json.loads(path.read_text())["spans"]
    spans = all_spans(sdk_json_to_traces_data(json.loads(path.read_text()), path=str(path)))
    for before, after in zip(raw, spans, strict=True):
        assert after["traceId"] == f"{before['context']['trace_id']:032x}"
        assert after["spanId"] == f"{before['context']['span_id']:016x}"
        parent = (before.get("parent") or {}).get("span_id")
        assert after.get("parentSpanId") == (None if parent is None else f"{parent:016x}")
        assert after["startTimeUnixNano"] == str(before["start_time"])
        assert after["kind"] == 1
        assert "treellm.ingest.orphan_parent" not in attrs(after)
    if path == OPENAI:
        assert spans[0]["traceId"] == "4bedea77bb33b9c5f280371eae21ea97"
    root = next(s for s in spans if "parentSpanId" not in s)
    assert root["name"] == "invoke_agent [any_agent]"
    assert root["status"] == {"code": 0}
    assert all(s["status"] == {"code": 1} for s in spans if s is not root)
    assert {s["traceId"] for s in spans} == {root["traceId"]}


def test_sdk_to_json_spans_convert_like_the_otlp_encoder(spans: list[ReadableSpan]) -> None:
    dumped = [json.loads(span.to_json()) for span in spans]
    converted = all_spans(sdk_json_to_traces_data({"spans": dumped}, path="dump.json"))
    expected = all_spans(json.loads(json.dumps(spans_to_traces_data(spans))))
    by_name = {s["name"]: s for s in expected}
    assert len(converted) == len(expected)
    for span in converted:
        assert without_flags(span) == without_flags(by_name[span["name"]])
    doc = sdk_json_to_traces_data(dumped, path="dump.json")
    assert [rs["resource"] for rs in doc["resourceSpans"]] == [
        rs["resource"] for rs in json.loads(json.dumps(spans_to_traces_data(spans)))["resourceSpans"]
    ]


def test_a_span_whose_parent_is_missing_becomes_a_flagged_root(tmp_path: Path) -> None:
    trace_id = 0x1234_5678_9ABC_DEF0_1234_5678_9ABC_DEF0
    spans = [
        {
            "name": "root",
            "context": {
                "trace_id": f"0x{trace_id:032x}",
                "span_id": "0x00000000000000a1",
                "trace_state": "[]",
            },
            "kind": "SpanKind.INTERNAL",
            "parent_id": None,
            "start_time": "2024-05-01T12:00:00.123456789+02:00",
            "end_time": "2024-05-01T10:00:01Z",
            "status": {"status_code": "OK"},
            "attributes": {},
            "resource": {"service.name": "flat"},
        },
        {
            "name": "child",
            "context": {"trace_id": trace_id, "span_id": 0xA2},
            "kind": "client",
            "parent": {"trace_id": trace_id, "span_id": 0xA1, "is_remote": False},
            "start_time": 1_714_557_600_500_000_000,
            "end_time": "1714557600600000000",
        },
        {
            "name": "orphan",
            "context": {"trace_id": f"{trace_id:X}", "span_id": "00000000000000A3"},
            "parent_id": "0x00000000000000ff",
            "start_time": 1_714_557_600_700_000_000,
            "end_time": None,
            "status": {"status_code": "ERROR", "description": "lost"},
        },
    ]
    path = tmp_path / "orphan.json"
    path.write_text(json.dumps(spans, indent=2))
    assert detect_format(path) == "sdk-json"
    [(_, doc)] = list(iter_traces_data(path, "sdk-json"))
    root, child, orphan = all_spans(doc)
    assert doc["resourceSpans"][0]["resource"] == {
        "attributes": [{"key": "service.name", "value": {"stringValue": "flat"}}]
    }
    assert {root["traceId"], child["traceId"], orphan["traceId"]} == {f"{trace_id:032x}"}
    assert "parentSpanId" not in root and "treellm.ingest.orphan_parent" not in attrs(root)
    assert child["parentSpanId"] == "00000000000000a1"
    assert child["flags"] == 0x100 and child["kind"] == 3
    assert "parentSpanId" not in orphan
    assert attrs(orphan)["treellm.ingest.orphan_parent"] == "00000000000000ff"
    assert orphan["status"] == {"code": 2, "message": "lost"}
    assert orphan["endTimeUnixNano"] == orphan["startTimeUnixNano"]
    noon_utc = int(datetime(2024, 5, 1, 10, tzinfo=UTC).timestamp()) * 10**9
    assert root["startTimeUnixNano"] == str(noon_utc + 123_456_789)
    assert root["endTimeUnixNano"] == str(noon_utc + 10**9)
    assert child["endTimeUnixNano"] == "1714557600600000000"


def test_a_malformed_sdk_span_names_its_record() -> None:
    good = json.loads(OPENAI.read_text())["spans"][0]
    with pytest.raises(IngestError) as caught:
        sdk_json_to_traces_data({"spans": [good, {"name": "no context", "start_time": 1}]}, path="bad.json")
    assert caught.value.record == 1
    assert "context.trace_id" in caught.value.reason
    with pytest.raises(IngestError, match=r"start_time: expected an ISO 8601 time") as caught:
        sdk_json_to_traces_data([{**good, "start_time": "yesterday"}], path="bad.json")
    assert caught.value.record == 0


# --- OpenAI chat-format trajectories -------------------------------------------------------------------


def test_tau_bench_excerpt_runs_calls_and_repeats_match_an_independent_count() -> None:
    raw = json.loads(TAU.read_text())
    expected_calls = [raw_calls(run) for run in raw]
    expected_repeats = [repeats(calls) for calls in expected_calls]
    reused_ids = [
        any(n > 1 for n in Counter(c["id"] for m in run["traj"] for c in m.get("tool_calls") or []).values())
        for run in raw
    ]
    # The excerpt is fit for purpose: repeats in at least two runs, a reused id somewhere.
    assert (len(raw), sum(map(len, expected_calls)), sum(expected_repeats)) == (20, 143, 9)
    assert sum(1 for n in expected_repeats if n) >= 2
    assert any(reused_ids)

    records = list(iter_traces_data(TAU, detect_format(TAU)))
    assert [index for index, _ in records] == list(range(len(raw)))
    for (_, doc), calls, repeated in zip(records, expected_calls, expected_repeats, strict=True):
        spans = all_spans(doc)
        assert len({s["traceId"] for s in spans}) == 1
        got = [(attrs(s)["gen_ai.tool.name"], attrs(s)["gen_ai.tool.call.arguments"]) for s in tool_spans(doc)]
        assert got == calls
        assert repeats(got) == repeated
    whole = trajectories_to_traces_data(raw, path=str(TAU))
    assert len(tool_spans(whole)) == 143
    assert sum(1 for s in all_spans(whole) if "parentSpanId" not in s) == 20


def test_tau_bench_results_pair_with_the_message_after_each_call() -> None:
    # In tau-bench every assistant message holds at most one call and its answer follows it.
    raw = json.loads(TAU.read_text())
    for (_, doc), run in zip(iter_traces_data(TAU, "trajectory"), raw, strict=True):
        traj = run["traj"]
        expected = []
        for j, message in enumerate(traj):
            calls = message.get("tool_calls") or []
            assert len(calls) <= 1
            if calls:
                answer = traj[j + 1] if j + 1 < len(traj) and traj[j + 1]["role"] == "tool" else None
                expected.append(None if answer is None else answer["content"])
        assert [attrs(s).get("gen_ai.tool.call.result") for s in tool_spans(doc)] == expected


def test_results_pair_by_order_when_a_tool_call_id_repeats() -> None:
    [(_, doc), *_] = list(iter_traces_data(TAU, "trajectory"))
    by_arguments = {attrs(s)["gen_ai.tool.call.arguments"]: attrs(s) for s in tool_spans(doc)}
    first = by_arguments['{"user_id":"mia_li_3668"}']
    second = by_arguments['{"expression":"152 + 103"}']
    assert first["gen_ai.tool.call.id"] == second["gen_ai.tool.call.id"] == "call_oIHazX6yQrB8hUwl4cRilFKj"
    assert first["gen_ai.tool.name"] == "get_user_details"
    assert first["gen_ai.tool.call.result"].startswith('{"name": {"first_name": "Mia", "last_name": "Li"}')
    assert second["gen_ai.tool.name"] == "calculate"
    assert second["gen_ai.tool.call.result"] == "255.0"


def call(call_id: str | None, name: str, arguments: str) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id is not None:
        out["id"] = call_id
    return out


RUN: dict[str, Any] = {
    "task_id": "t-1",
    "reward": 0.5,
    "solved": True,
    "info": {"nested": "not kept"},
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("x", "a", '{"q": 1,  "r":2}'), call("x", "b", "")],
        },
        {"role": "tool", "tool_call_id": "x", "content": "ra"},
        {
            "role": "tool",
            "tool_call_id": "x",
            "content": [{"type": "text", "text": "r"}, {"type": "text", "text": "b"}],
        },
        {
            "role": "assistant",
            "content": "again",
            "tool_calls": [call("x", "c", "not json"), call(None, "d", "{}")],
        },
        {"role": "tool", "content": "rd"},
        {"role": "assistant", "content": "done"},
    ],
}


def test_a_trajectory_run_becomes_a_root_with_chat_and_tool_children() -> None:
    doc = trajectories_to_traces_data(RUN, path="/somewhere/my-agent.json")
    [resource_spans] = doc["resourceSpans"]
    assert attrs({"attributes": resource_spans["resource"]["attributes"]}) == {"service.name": "my-agent"}
    spans = resource_spans["scopeSpans"][0]["spans"]
    root, *children = spans
    assert [s["name"] for s in spans] == [
        "invoke_agent trajectory",
        "chat",
        "execute_tool a",
        "execute_tool b",
        "chat",
        "execute_tool c",
        "execute_tool d",
        "chat",
    ]
    assert attrs(root) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "my-agent",
        "treellm.run.id": f"{root['traceId']}:{root['spanId']}",
        "treellm.trajectory.index": "0",
        "treellm.trajectory.task_id": "t-1",
        "treellm.trajectory.reward": 0.5,
        "treellm.trajectory.solved": True,
        "treellm.run.outcome": "failure",  # a reward below 1 (trajectory.run_result)
    }
    assert all(s["parentSpanId"] == root["spanId"] and s["traceId"] == root["traceId"] for s in children)
    assert [s["kind"] for s in spans] == [1, 3, 1, 1, 3, 1, 1, 3]
    starts = [int(s["startTimeUnixNano"]) for s in spans]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)
    assert all(int(s["endTimeUnixNano"]) <= int(root["endTimeUnixNano"]) for s in children)
    tools = {s["name"].removeprefix("execute_tool "): attrs(s) for s in children if s["name"] != "chat"}
    assert tools["a"] == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "a",
        "gen_ai.tool.call.id": "x",
        "gen_ai.tool.type": "function",
        "gen_ai.tool.call.arguments": '{"q": 1,  "r":2}',
        "gen_ai.tool.call.result": "ra",
    }
    assert tools["b"]["gen_ai.tool.call.result"] == "rb"
    assert tools["b"]["gen_ai.tool.call.arguments"] == ""
    assert "gen_ai.tool.call.result" not in tools["c"]  # the third call with id x is never answered
    assert tools["c"]["gen_ai.tool.call.arguments"] == "not json"
    assert "gen_ai.tool.call.id" not in tools["d"]
    assert tools["d"]["gen_ai.tool.call.result"] == "rd"
    assert all(attrs(s) == {"gen_ai.operation.name": "chat"} for s in children if s["name"] == "chat")


def test_trajectory_ids_depend_on_content_and_index_not_on_the_path(tmp_path: Path) -> None:
    copies = [tmp_path / "a" / TAU.name, tmp_path / "b" / TAU.name, tmp_path / "c" / "renamed.json"]
    for copy in copies:
        copy.parent.mkdir()
        shutil.copy(TAU, copy)
    docs = [[doc for _, doc in iter_traces_data(copy, "trajectory")] for copy in copies]
    assert docs[0] == docs[1]

    def ids(records: list[dict[str, Any]]) -> list[tuple[str, str, str | None]]:
        return [(s["traceId"], s["spanId"], s.get("parentSpanId")) for doc in records for s in all_spans(doc)]

    assert ids(docs[0]) == ids(docs[2])
    assert len(set(ids(docs[0]))) == len(ids(docs[0]))
    twice = trajectories_to_traces_data([RUN, RUN], path="twice.json")
    roots = [s for s in all_spans(twice) if "parentSpanId" not in s]
    assert len({s["traceId"] for s in roots}) == 2


def test_a_malformed_run_names_its_record() -> None:
    with pytest.raises(IngestError) as caught:
        trajectories_to_traces_data([[{"role": "user", "content": "hi"}], 5], path="runs.json")
    assert caught.value.record == 1
    bad_call = {"messages": [{"role": "assistant", "tool_calls": [{"id": "x", "function": {"arguments": "{}"}}]}]}
    with pytest.raises(IngestError, match=r"message 0, tool call 0: no function name") as caught:
        trajectories_to_traces_data([RUN, bad_call], path="runs.json")
    assert caught.value.record == 1


def test_files_that_are_not_json_report_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('[\n  {"role": "user",\n  oops\n]')
    with pytest.raises(IngestError) as caught:
        list(iter_traces_data(path, "trajectory"))
    assert caught.value.line == 3


def iter_names(records: Iterator[tuple[int, dict[str, Any]]]) -> list[str]:
    return [s["name"] for _, doc in records for s in all_spans(doc)]


def test_a_bare_message_list_is_one_run(tmp_path: Path) -> None:
    path = tmp_path / "bare.json"
    path.write_text(json.dumps(RUN["messages"]))
    assert detect_format(path) == "trajectory"
    names = iter_names(iter_traces_data(path, "trajectory"))
    assert names.count("invoke_agent trajectory") == 1
    assert names.count("chat") == 3


# --- the stored key of each call of another framework (derive/foreign.py) ------------------------------

STORED_PATHS = ["/", ".", "..", "../up", "~/notes", "~", "src", "src/main.py", "src/main", "/srv/main/settings.ini",
                "/srv/main", "/srv/mains", "main/settings.ini", "/etc", "settings.ini", "/srv//main/./x"]  # fmt: skip


def test_stored_target_paths_are_digests_that_overlap_as_the_paths_do() -> None:
    from treellm.derive.foreign import _path_digest
    from treellm.shell import paths_overlap

    for a in STORED_PATHS:
        for b in STORED_PATHS:
            assert paths_overlap(_path_digest(a), _path_digest(b)) == paths_overlap(a, b), (a, b)
    names = {part for path in STORED_PATHS for part in path.split("/")} - {"", ".", ".."}
    assert [name for name in names if any(name in _path_digest(path) for path in STORED_PATHS)] == []


def genai_span(index: int, name: str, attributes: dict[str, str]) -> dict[str, Any]:
    out = {
        "traceId": "ab" * 16, "spanId": f"{index + 1:016x}", "name": name, "kind": 1,
        "startTimeUnixNano": str(T0 + index * 1000 * US), "endTimeUnixNano": str(T0 + index * 1000 * US + 500 * US),
        "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attributes.items()],
    }  # fmt: skip
    return out | ({"parentSpanId": f"{1:016x}"} if index else {})


def genai_calls(calls: list[tuple[str, str]], *, first: int = 0) -> list[dict[str, Any]]:
    """A chat span before each tool call (GenAI attributes), under the root of :func:`genai_file`."""
    spans = []
    for n, (tool, arguments) in enumerate(calls, start=first):
        spans.append(genai_span(2 * n + 1, "chat m", {"gen_ai.operation.name": "chat"}))
        spans.append(genai_span(2 * n + 2, f"execute_tool {tool}", {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool, "gen_ai.tool.call.arguments": arguments,
        }))  # fmt: skip
    return spans


def genai_file(path: Path, spans: list[dict[str, Any]]) -> Path:
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "other-agent"}}]}
    doc = {"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": {"name": "other"}, "spans": spans}]}]}
    path.write_text(json.dumps(doc) + "\n", encoding="utf-8")
    return path


SETTINGS = ("read_file", '{"path": "/srv/main/settings.ini"}')
STORED_CALLS = [
    SETTINGS,
    ("read_file", '{ "path":"/srv/main/settings.ini" }'),  # the same call, other spacing
    ("bash", '{"command": "sed -i s/a/b/ /srv/main/settings.ini"}'),  # writes what read_file reads
    SETTINGS,
    ("bash", '{"command": "ls /srv"}'),
    SETTINGS,
    ("bash", '{"command": "ls /srv"}'),
]
ROOT_SPAN = genai_span(0, "invoke_agent a", {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"})


def stored_calls(db: Path) -> list[tuple[Any, ...]]:
    con = open_store(db, read_only=True)
    try:
        return con.execute(
            "SELECT span_id, tool_name, ordinal, earlier_node_ids, call_digest, call_targets FROM spans "
            "WHERE tool_name IS NOT NULL ORDER BY span_id"
        ).fetchall()
    finally:
        con.close()


def ingest_in_two(tmp_path: Path, name: str, between: str) -> Path:
    """The calls in two transactions, with ``between`` run on the store in the meantime."""
    db = tmp_path / f"{name}.duckdb"
    ingest(db, [genai_file(tmp_path / f"{name}-1.jsonl", [ROOT_SPAN, *genai_calls(STORED_CALLS[:3])])], capture="full")
    con = open_store(db)
    con.execute(between)
    con.close()
    later = genai_calls(STORED_CALLS[3:], first=3)
    ingest(db, [genai_file(tmp_path / f"{name}-2.jsonl", later)], capture="full")
    return db


@pytest.fixture
def placed_at_once(tmp_path: Path) -> list[tuple[Any, ...]]:
    db = tmp_path / "once.duckdb"
    ingest(db, [genai_file(tmp_path / "once.jsonl", [ROOT_SPAN, *genai_calls(STORED_CALLS)])], capture="full")
    return stored_calls(db)


def test_a_call_stores_the_digest_of_its_key_and_its_targets(placed_at_once: list[tuple[Any, ...]]) -> None:
    import hashlib

    assert [(row[1], row[2]) for row in placed_at_once] == [
        ("read_file", 1),
        ("read_file", 2),
        ("bash", 1),
        ("read_file", 1),
        ("bash", 1),
        ("read_file", 2),
        ("bash", 2),
    ]  # sed writes what read_file reads: its count restarts; ls writes nothing: it counts on
    canonical = canonical_json(parse_arguments(SETTINGS[1]))
    assert (
        placed_at_once[0][4] == placed_at_once[1][4] == hashlib.sha256(f"read_file\x00{canonical}".encode()).hexdigest()
    )
    sed = json.loads(placed_at_once[2][5])
    assert sed["changes_state"] is True and len(sed["reads"]) == len(sed["writes"]) == 1
    assert not [t for t in (placed_at_once[2][5], placed_at_once[0][5]) if "srv" in t or "settings" in t]


def test_a_trace_placed_again_keys_its_stored_calls_on_their_stored_keys(
    tmp_path: Path, placed_at_once: list[tuple[Any, ...]]
) -> None:
    """What is stored of the arguments may have been rewritten since (redaction): never read again."""
    assert stored_calls(ingest_in_two(tmp_path, "rewritten", "UPDATE spans SET arguments = '{}'")) == placed_at_once


def test_calls_stored_without_a_key_are_keyed_on_their_stored_arguments(
    tmp_path: Path, placed_at_once: list[tuple[Any, ...]]
) -> None:
    """A store from before migration 0007: its calls are keyed as before, and keep their keys."""
    older = ingest_in_two(tmp_path, "older", "UPDATE spans SET call_digest = NULL, call_targets = NULL")
    assert stored_calls(older) == placed_at_once


def test_a_frame_handed_to_duckdb_inside_a_transaction_is_not_kept_until_the_commit() -> None:
    """DuckDB keeps a frame registered inside a transaction alive until the transaction ends, even
    once unregistered; an ingest (one transaction per file) hands it a frame per batch, so those
    piled up over a large file. The ingest's way keeps none."""
    import gc
    import weakref

    import pandas as pd

    from treellm.derive.foreign import columns, frames_as_tables

    con = duckdb.connect()
    con.execute("CREATE TEMP TABLE sink (a VARCHAR)")
    con.execute("BEGIN TRANSACTION")

    def handed(way: str) -> weakref.ref[Any]:
        if way == "register":  # the way DuckDB keeps it: the control of this test
            frame = pd.DataFrame({"a": pd.array(["x", "y"], dtype="string[python]")})
            con.register("frame_view", frame)
            con.execute("INSERT INTO sink SELECT a FROM frame_view")
            con.unregister("frame_view")
            return weakref.ref(frame)
        typed = columns({"a": ["x", "y"]})
        held = weakref.ref(typed["a"][1])
        with frames_as_tables(con, handed_frame=typed):
            con.execute("INSERT INTO sink SELECT a FROM handed_frame")
        return held

    kept = {way: handed(way) for way in ("register", "tables")}
    gc.collect()
    assert kept["register"]() is not None
    assert kept["tables"]() is None
    assert con.execute("SELECT count(*) FROM sink").fetchone() == (4,)
    con.execute("COMMIT")


# --- a result stored once ---------------------------------------------------------------------------


def _kv(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "value": {"stringValue": value}}


def _result_spans() -> list[dict[str, Any]]:
    """An agent whose calls hold their results every way the conventions read one."""
    trace = "ab" * 16

    def span(n: int, name: str, attributes: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
        return {"traceId": trace, "spanId": f"{n:016x}", "parentSpanId": "" if n == 1 else f"{1:016x}", "name": name,
                "kind": 1, "startTimeUnixNano": str(T0 + n * US), "endTimeUnixNano": str(T0 + n * US + 1),
                "attributes": attributes, **more}  # fmt: skip

    tool = [_kv("openinference.span.kind", "TOOL"), _kv("tool.name", "search")]
    envelope = json.dumps({"type": "tool", "data": {"content": "3 rows", "tool_call_id": "call_2", "id": "m2"}})
    message = {"timeUnixNano": str(T0), "name": "gen_ai.choice", "attributes": [_kv("message", "from the event")]}
    return [
        span(1, "agent", [_kv("openinference.span.kind", "AGENT"), _kv("agent.name", "finder")]),
        span(2, "search", [*tool, _kv("input.value", '{"q": "a"}'), _kv("output.value", "plain quokka rows")]),
        span(3, "search", [*tool, _kv("input.value", '{"q": "b"}'), _kv("output.value", envelope)]),
        span(4, "execute_tool search", [_kv("gen_ai.operation.name", "execute_tool"), _kv("gen_ai.tool.name", "search"),
                                        _kv("gen_ai.tool.call.arguments", '{"q": "c"}')], events=[message]),
        span(5, "search", [*tool, _kv("input.value", '{"q": "d"}'), _kv("gen_ai.tool.call.result", "first key"),
                           _kv("output.value", "second key")]),
        span(6, "llm", [_kv("openinference.span.kind", "LLM"), _kv("llm.token_count.prompt", "3"),
                        _kv("output.value", "the model's answer")]),
    ]  # fmt: skip


_RESULT_EDGES = [
    "plain prose of 42 words", "42", " 42 \n", "-1.5e3", "42 files found", "1\n2", "-", "true", "trueish",
    " null ", "nullable", "", " ", "(1, 2)", "[1]", "\t{\"a\": 1}", "\"quoted\"", "x [1]", "{not json",
    "content='3 rows' name='search' tool_call_id='call_3'", "content='3 rows' name='search'",
    "<returncode>1</returncode>", "<returncode>0</returncode>", "Traceback (most recent call last):\n  x",
    "Error: x", "\u00a0error: x", "\x0bError: x", "\x1cError: x", "\u2003Error: x", "the error: x",
    "done: changes have NOT been applied yet", "an error occurred", '{"error": "x"}', ' {"data": 1, "error": {}}',
    '{"lc": 1, "type": "constructor", "id": ["ToolMessage"], "kwargs": {"content": "3 rows", "tool_call_id": "c"}}',
    '{"result": "from adk"}', "[{'type': 'text', 'text': 'a block'}]",
]  # fmt: skip
"""Results at each edge of the rules: texts that may be JSON or a Python literal, envelopes, a
LangChain ``repr``, each default failure pattern (after whitespace Python's ``\\s`` knows and RE2's
does not), and plain texts close to them."""


def test_sql_sends_python_every_result_that_is_not_its_own_text_or_may_have_failed() -> None:
    """The SQL that keeps plain results from Python (``result_read_sql``) passes over no result
    whose content or call id an envelope gives, and none that the default failure rule fails."""
    texts = real_trajectory_texts() + _RESULT_EDGES
    read = flagged_by_sql(texts, result_read_sql)
    changed = [i for i, text in enumerate(texts) if unwrap_result(text) != (text, None)]
    failed = [i for i, text in enumerate(texts) if is_failure(ToolRule(), text)]
    assert len(changed) > 1_000 and len(failed) > 100  # the texts do hold both
    assert [texts[i] for i in (*changed, *failed) if i not in read] == []
    passed_over = len(texts) - len(read)
    assert passed_over > len(texts) // 4  # most plain texts never reach Python
    assert {text for i, text in enumerate(_RESULT_EDGES, len(texts) - len(_RESULT_EDGES)) if i not in read} == {
        "plain prose of 42 words", "42 files found", "1\n2", "trueish", "nullable", " ", "x [1]", "an error occurred",
        "content='3 rows' name='search'",
    }  # fmt: skip


@pytest.mark.parametrize("capture", ["full", "redacted", "none"])
def test_a_result_is_stored_once_and_read_back_as_the_conventions_read_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capture: str
) -> None:
    """A call's result that equals the attribute it was read from is held by that attribute alone
    (the ``result`` column is NULL); an envelope's content and an event's text are stored. Every
    reader takes the same result: the ``tool_calls`` view, the run explorer and its search; a
    model's output is no call's result. Under ``none`` the attribute's hash is the result's."""
    monkeypatch.setenv("TREELLM_CAPTURE", capture)
    monkeypatch.setattr(redaction, "_default", None)
    source = tmp_path / "results.jsonl"
    scope = {"scope": {"name": "openinference.test"}, "spans": _result_spans()}
    doc = {"resourceSpans": [{"resource": {"attributes": [_kv("service.name", "finder")]}, "scopeSpans": [scope]}]}
    source.write_text(json.dumps(doc) + "\n", encoding="utf-8")
    db = tmp_path / "r.duckdb"
    ingest(db, [source])
    seen = {"full": lambda t: t, "redacted": lambda t: t, "none": redaction.content_hash}[capture]
    con = open_store(db, read_only=True)
    try:
        stored = dict(con.execute("SELECT span_id, result FROM spans").fetchall())
        assert {k[-1]: v for k, v in stored.items()} == {
            "1": None,
            "2": None,
            "3": seen("3 rows"),
            "4": seen("from the event"),
            "5": None,
            "6": None,
        }
        read = dict(con.execute("SELECT span_id, result FROM tool_calls").fetchall())
        expected = {"2": "plain quokka rows", "3": "3 rows", "4": "from the event", "5": "first key"}
        assert {k[-1]: v for k, v in read.items()} == {k: seen(v) for k, v in expected.items()}
        (run_id,) = con.execute("SELECT run_id FROM runs").fetchone() or ("",)
        nodes = explorer.run_nodes(con, run_id)
        shown = {str(s)[-1]: r for s, r in zip(nodes["span_id"], nodes["result"], strict=True) if isinstance(r, str)}
        assert shown == {k: seen(v) for k, v in expected.items()}  # the model's node shows no result
        found = explorer.run_table(con, query=explorer.RunQuery(text="quokka"))
        assert list(found["run_id"]) == ([run_id] if capture != "none" else [])
        assert explorer.run_table(con, query=explorer.RunQuery(text="model's answer")).empty
    finally:
        con.close()
