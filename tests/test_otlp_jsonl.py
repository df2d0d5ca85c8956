"""OTLP/JSON encoding of SDK spans and the append-only JSONL exporter.

The acceptance test: every line the exporter writes through a real SDK pipeline parses
as ``opentelemetry.proto.trace.v1.trace_pb2.TracesData`` with protobuf's JSON parser
(after its hex ids are turned into the base64 that the protobuf JSON mapping expects).
"""

from __future__ import annotations

import base64
import errno
import io
import json
import logging
import math
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from treellm.exporters import jsonl
from treellm.exporters.jsonl import OTLPJsonlSpanExporter
from treellm.otlp import spans_to_traces_data, traces_data_line

ATTRIBUTES: dict[str, Any] = {
    "str": "naïve text ✓",
    "bool": False,
    "int": 2**62,
    "negative": -7,
    "float": 1.25,
    "nan": float("nan"),
    "inf": float("inf"),
    "strs": ["a", "b"],
    "bools": [True, False],
    "ints": [1, -(2**62)],
    "floats": [0.5, float("-inf")],
}
RESOURCE = Resource({"service.name": "treellm-test", "host.cores": 2, "deployment.canary": True})
HEX32 = re.compile(r"[0-9a-f]{32}")
HEX16 = re.compile(r"[0-9a-f]{16}")


def read_lines(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.decode("utf-8").splitlines()]


def all_spans(traces_data: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for resource_spans in traces_data["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            yield from scope_spans["spans"]


def hex_ids_to_base64(traces_data: dict[str, Any]) -> dict[str, Any]:
    """OTLP/JSON writes ids as hex; protobuf's own JSON mapping expects base64."""

    def b64(value: str) -> str:
        return base64.b64encode(bytes.fromhex(value)).decode("ascii")

    converted: dict[str, Any] = json.loads(json.dumps(traces_data))
    for span in all_spans(converted):
        for key in ("traceId", "spanId", "parentSpanId"):
            if span.get(key):
                span[key] = b64(span[key])
        for link in span.get("links", []):
            link["traceId"] = b64(link["traceId"])
            link["spanId"] = b64(link["spanId"])
    return converted


def attribute_map(key_values: Any) -> dict[str, Any]:
    return {kv.key: kv.value for kv in key_values}


def id_bytes(value: int, size: int) -> bytes:
    return value.to_bytes(size, "big")


def finished_spans(count: int, *, payload: str = "x") -> tuple[ReadableSpan, ...]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("treellm.test", "1.0")
    for i in range(count):
        with tracer.start_as_current_span(f"span-{i}", attributes={"i": i, "payload": payload}):
            pass
    provider.shutdown()
    return memory.get_finished_spans()


# --- the acceptance test: a real SDK pipeline, parsed back by protobuf ---------------------


def test_every_line_from_a_real_pipeline_parses_as_protobuf_traces_data(tmp_path: Path) -> None:
    path = tmp_path / "traces" / "spans.jsonl"
    exporter = OTLPJsonlSpanExporter(path)
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60_000))
    tracer_a = provider.get_tracer("treellm.test.a", "1.0")
    tracer_b = provider.get_tracer("treellm.test.b", "2.0")
    try:
        with tracer_a.start_as_current_span("root", kind=SpanKind.SERVER, attributes=ATTRIBUTES) as root:
            root.add_event("started", {"step": 1, "ratio": 0.5, "tags": ["x", "y"]})
            with tracer_a.start_as_current_span("child", kind=SpanKind.CLIENT) as child:
                child.set_status(Status(StatusCode.ERROR, "boom"))
        assert provider.force_flush()
        root_ctx, child_ctx = root.get_span_context(), child.get_span_context()
        with tracer_b.start_as_current_span(
            "linked", kind=SpanKind.PRODUCER, links=[Link(child_ctx, {"why": "merged"})]
        ) as linked:
            linked.set_status(Status(StatusCode.OK))
        with tracer_b.start_as_current_span("consumer", kind=SpanKind.CONSUMER):
            pass
        with tracer_a.start_as_current_span("internal"):
            pass
    finally:
        provider.shutdown()

    lines = read_lines(path)
    assert len(lines) >= 2  # one per export call: the forced flush, then shutdown
    assert exporter.exported_spans == 5 and exporter.failures == 0

    # The OTLP/JSON shape, checked on the raw JSON.
    raw = {span["name"]: span for line in lines for span in all_spans(line)}
    assert set(raw) == {"root", "child", "linked", "consumer", "internal"}
    for span in raw.values():
        assert HEX32.fullmatch(span["traceId"]) and HEX16.fullmatch(span["spanId"])
        assert isinstance(span["startTimeUnixNano"], str) and span["startTimeUnixNano"].isdigit()
        assert isinstance(span["endTimeUnixNano"], str) and span["endTimeUnixNano"].isdigit()
    assert "parentSpanId" not in raw["root"]
    assert raw["child"]["parentSpanId"] == f"{root_ctx.span_id:016x}"
    kinds = {name: span["kind"] for name, span in raw.items()}
    assert kinds == {"internal": 1, "root": 2, "child": 3, "linked": 4, "consumer": 5}
    assert raw["child"]["status"] == {"code": 2, "message": "boom"}
    assert raw["linked"]["status"] == {"code": 1}
    assert raw["root"]["status"] == {"code": 0}
    root_attrs = {kv["key"]: kv["value"] for kv in raw["root"]["attributes"]}
    assert root_attrs["int"] == {"intValue": str(2**62)}
    assert root_attrs["nan"] == {"doubleValue": "NaN"}
    assert root_attrs["inf"] == {"doubleValue": "Infinity"}
    assert root_attrs["ints"] == {"arrayValue": {"values": [{"intValue": "1"}, {"intValue": str(-(2**62))}]}}
    assert root_attrs["floats"]["arrayValue"]["values"][1] == {"doubleValue": "-Infinity"}
    assert isinstance(raw["root"]["events"][0]["timeUnixNano"], str)
    assert raw["linked"]["links"][0]["spanId"] == f"{child_ctx.span_id:016x}"

    # The acceptance test: protobuf parses every line.
    parsed = [json_format.Parse(json.dumps(hex_ids_to_base64(line)), trace_pb2.TracesData()) for line in lines]
    spans = {}
    scopes = set()
    for traces_data in parsed:
        for resource_spans in traces_data.resource_spans:
            resource = attribute_map(resource_spans.resource.attributes)
            assert resource["service.name"].string_value == "treellm-test"
            assert resource["host.cores"].int_value == 2
            assert resource["deployment.canary"].bool_value is True
            for scope_spans in resource_spans.scope_spans:
                scopes.add((scope_spans.scope.name, scope_spans.scope.version))
                spans.update({span.name: span for span in scope_spans.spans})
    assert scopes == {("treellm.test.a", "1.0"), ("treellm.test.b", "2.0")}
    assert set(spans) == set(raw)

    root_pb, child_pb, linked_pb = spans["root"], spans["child"], spans["linked"]
    assert root_pb.trace_id == id_bytes(root_ctx.trace_id, 16)
    assert root_pb.span_id == id_bytes(root_ctx.span_id, 8)
    assert root_pb.parent_span_id == b""
    assert child_pb.parent_span_id == root_pb.span_id
    assert child_pb.trace_id == root_pb.trace_id
    assert root_pb.kind == trace_pb2.Span.SPAN_KIND_SERVER
    assert child_pb.kind == trace_pb2.Span.SPAN_KIND_CLIENT
    assert spans["internal"].kind == trace_pb2.Span.SPAN_KIND_INTERNAL
    assert child_pb.status.code == trace_pb2.Status.STATUS_CODE_ERROR
    assert child_pb.status.message == "boom"
    assert linked_pb.status.code == trace_pb2.Status.STATUS_CODE_OK
    assert child_pb.end_time_unix_nano >= child_pb.start_time_unix_nano > 0

    attrs = attribute_map(root_pb.attributes)
    assert attrs["str"].string_value == "naïve text ✓"
    assert attrs["bool"].HasField("bool_value") and attrs["bool"].bool_value is False
    assert attrs["int"].int_value == 2**62
    assert attrs["negative"].int_value == -7
    assert attrs["float"].double_value == 1.25
    assert math.isnan(attrs["nan"].double_value)
    assert attrs["inf"].double_value == math.inf
    assert [v.string_value for v in attrs["strs"].array_value.values] == ["a", "b"]
    assert [v.bool_value for v in attrs["bools"].array_value.values] == [True, False]
    assert [v.int_value for v in attrs["ints"].array_value.values] == [1, -(2**62)]
    assert [v.double_value for v in attrs["floats"].array_value.values] == [0.5, -math.inf]

    assert [event.name for event in root_pb.events] == ["started"]
    event_attrs = attribute_map(root_pb.events[0].attributes)
    assert event_attrs["step"].int_value == 1 and event_attrs["ratio"].double_value == 0.5
    assert root_pb.events[0].time_unix_nano >= root_pb.start_time_unix_nano

    (link,) = linked_pb.links
    assert link.trace_id == id_bytes(child_ctx.trace_id, 16)
    assert link.span_id == id_bytes(child_ctx.span_id, 8)
    assert attribute_map(link.attributes)["why"].string_value == "merged"


# --- the pure encoding ------------------------------------------------------------------


def test_spans_are_grouped_by_resource_then_scope_in_first_seen_order() -> None:
    memory = InMemorySpanExporter()
    other_memory = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    other = TracerProvider(resource=Resource({"service.name": "other"}))
    other.add_span_processor(SimpleSpanProcessor(other_memory))
    try:
        tracer_a, tracer_b = provider.get_tracer("a"), provider.get_tracer("b", "2")
        for name, tracer in [("a1", tracer_a), ("b1", tracer_b), ("a2", tracer_a)]:
            tracer.start_span(name).end()
        other.get_tracer("c").start_span("c1").end()
    finally:
        provider.shutdown()
        other.shutdown()
    first, second, third = memory.get_finished_spans()
    (foreign,) = other_memory.get_finished_spans()

    data = spans_to_traces_data([first, second, foreign, third])

    resource_spans = data["resourceSpans"]
    assert len(resource_spans) == 2
    assert [kv["key"] for kv in resource_spans[1]["resource"]["attributes"]] == ["service.name"]
    scopes = resource_spans[0]["scopeSpans"]
    assert [s["scope"] for s in scopes] == [{"name": "a"}, {"name": "b", "version": "2"}]
    assert [[span["name"] for span in s["spans"]] for s in scopes] == [["a1", "a2"], ["b1"]]
    assert [span["name"] for span in resource_spans[1]["scopeSpans"][0]["spans"]] == ["c1"]


def test_root_span_flags_trace_state_and_empty_fields() -> None:
    (span,) = finished_spans(1)
    encoded = spans_to_traces_data([span])["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    flags = encoded["flags"]
    assert flags & 0x01  # W3C "sampled"
    assert flags & 0x300 == 0x100  # "has is_remote", and the parent (none) is not remote
    for absent in ("parentSpanId", "traceState", "droppedAttributesCount", "droppedEventsCount"):
        assert absent not in encoded
    assert encoded["events"] == [] and encoded["links"] == []


def test_lone_surrogates_become_replacement_characters_and_pairs_are_joined() -> None:
    (span,) = finished_spans(1, payload="bad\udc80 pair\ud83d\ude00 end")
    line = traces_data_line([span])
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    text = line.decode("utf-8")  # strict: the line is valid UTF-8
    value = json.loads(text)["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"][1]["value"]
    assert value == {"stringValue": "bad\ufffd pair\U0001f600 end"}


def test_empty_batch_encodes_to_empty_traces_data() -> None:
    assert traces_data_line([]) == b'{"resourceSpans":[]}\n'


# --- the exporter's file handling -------------------------------------------------------


def test_a_torn_last_line_is_truncated_before_appending(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "spans.jsonl"
    old = traces_data_line(finished_spans(1)) + traces_data_line(finished_spans(2))
    torn = b'{"resourceSpans":[{"torn-by-a-crash'
    path.write_bytes(old + torn)
    exporter = OTLPJsonlSpanExporter(path)
    try:
        with caplog.at_level(logging.WARNING, logger="treellm.exporters.jsonl"):
            assert exporter.export(finished_spans(3)) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()

    data = path.read_bytes()
    assert data.startswith(old)
    assert b"torn-by-a-crash" not in data
    lines = read_lines(path)
    assert [len(list(all_spans(line))) for line in lines] == [1, 2, 3]
    assert any(str(path) in r.getMessage() and f"{len(torn)} bytes" in r.getMessage() for r in caplog.records)


def test_a_file_holding_only_a_torn_line_is_emptied_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    path.write_bytes(b'{"resourceSpans":[{"reso')
    exporter = OTLPJsonlSpanExporter(path)
    try:
        assert exporter.export(finished_spans(1)) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
    assert len(read_lines(path)) == 1


def test_complete_existing_lines_are_kept_and_appended_to(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    old = traces_data_line(finished_spans(2))
    path.write_bytes(old)
    exporter = OTLPJsonlSpanExporter(path, fsync=True)
    try:
        assert exporter.export(finished_spans(1)) is SpanExportResult.SUCCESS
        assert exporter.force_flush()
    finally:
        exporter.shutdown()
    assert path.read_bytes().startswith(old)
    assert len(read_lines(path)) == 2
    assert exporter.exported_spans == 1


def test_export_after_shutdown_fails_without_raising(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    exporter = OTLPJsonlSpanExporter(path)
    assert exporter.export(finished_spans(1)) is SpanExportResult.SUCCESS
    exporter.shutdown()
    exporter.shutdown()  # idempotent

    assert exporter.export(finished_spans(1)) is SpanExportResult.FAILURE
    assert exporter.failures == 1 and exporter.exported_spans == 1
    assert len(read_lines(path)) == 1


def test_an_unwritable_path_fails_counts_and_does_not_raise(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for path in (tmp_path, blocker / "spans.jsonl"):
        exporter = OTLPJsonlSpanExporter(path)
        try:
            assert exporter.export(finished_spans(1)) is SpanExportResult.FAILURE
            assert exporter.export(finished_spans(1)) is SpanExportResult.FAILURE
            assert exporter.failures == 2 and exporter.exported_spans == 0
            assert exporter.force_flush()
        finally:
            exporter.shutdown()


def test_an_unwritable_path_through_the_sdk_pipeline_never_reaches_the_caller(tmp_path: Path) -> None:
    exporter = OTLPJsonlSpanExporter(tmp_path)  # a folder: every open fails
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        with provider.get_tracer("t").start_as_current_span("work"):
            pass
    finally:
        provider.shutdown()
    assert exporter.failures == 1


class DiskFullOnce:
    """A file that writes half of the first line it is given, then fails like a full disk."""

    def __init__(self, file: io.BufferedRandom) -> None:
        self.file = file
        self.failed = False

    def write(self, data: bytes) -> int:
        if not self.failed:
            self.failed = True
            self.file.write(data[: len(data) // 2])
            self.file.flush()
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.file.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)


def test_a_failed_write_reopens_and_repairs_the_file_on_the_next_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "spans.jsonl"
    real_open = jsonl._open_for_append
    opened: list[Path] = []

    def open_full_disk_first(p: Path) -> Any:
        opened.append(p)
        return DiskFullOnce(real_open(p)) if len(opened) == 1 else real_open(p)

    monkeypatch.setattr(jsonl, "_open_for_append", open_full_disk_first)
    exporter = OTLPJsonlSpanExporter(path)
    try:
        assert exporter.export(finished_spans(1)) is SpanExportResult.FAILURE
        assert exporter.failures == 1
        assert not path.read_bytes().endswith(b"\n")  # the torn half line
        assert exporter.export(finished_spans(2)) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
    assert [len(list(all_spans(line))) for line in read_lines(path)] == [2]
    assert exporter.exported_spans == 2
    assert len(opened) == 2  # the failed file was closed, then reopened and repaired


def test_concurrent_exports_write_whole_lines_only(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    batches = [finished_spans(3, payload=str(i) * 20_000) for i in range(4)]  # lines beyond any buffer size
    exporter = OTLPJsonlSpanExporter(path)
    results: list[SpanExportResult] = []

    def work(batch: tuple[ReadableSpan, ...]) -> None:
        for _ in range(25):
            results.append(exporter.export(batch))

    threads = [threading.Thread(target=work, args=(batch,)) for batch in batches for _ in range(2)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        exporter.shutdown()

    assert results == [SpanExportResult.SUCCESS] * 200
    lines = read_lines(path)
    assert len(lines) == 200
    for line in lines:
        payloads = {
            kv["value"]["stringValue"]
            for span in all_spans(line)
            for kv in span["attributes"]
            if kv["key"] == "payload"
        }
        assert len(payloads) == 1 and len(payloads.pop()) == 20_000
    assert exporter.exported_spans == 600


def test_the_exporter_accepts_a_span_context_link_with_trace_state(tmp_path: Path) -> None:
    remote = SpanContext(
        trace_id=0x1234,
        span_id=0x5678,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "value")]),
    )
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    try:
        provider.get_tracer("t").start_span("linked", links=[Link(remote)]).end()
    finally:
        provider.shutdown()
    (span,) = memory.get_finished_spans()
    line = json.loads(traces_data_line([span]))
    (link,) = next(all_spans(line))["links"]
    assert link == {
        "traceId": f"{0x1234:032x}",
        "spanId": f"{0x5678:016x}",
        "attributes": [],
        "flags": 0x301,  # sampled, has is_remote, is remote
        "traceState": "vendor=value",
    }
    json_format.Parse(json.dumps(hex_ids_to_base64(line)), trace_pb2.TracesData())
