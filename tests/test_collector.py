"""The OTLP/HTTP collector: real clients, status codes, durability under kill -9, a busy store, fuzzing, scale-out."""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from google.protobuf.message import DecodeError
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from treellm.analysis import report
from treellm.collector import Collector, CollectorConfig
from treellm.collector.__main__ import main as collector_main
from treellm.collector.config import parse_size
from treellm.collector.decode import decode_json, decode_protobuf, decompress
from treellm.collector.errors import BadRequest, CollectorError, Overloaded, PayloadTooLarge
from treellm.collector.flusher import Flusher
from treellm.collector.journal import Journal, truncate_torn_tail
from treellm.errors import ConfigError, StoreError
from treellm.simulate import sample_traces_dir
from treellm.store import export_parquet, ingest_file, open_parquet, open_store
from treellm.store.ingest import line_problem

ROOT = Path(__file__).resolve().parent.parent
JS_DIR = ROOT / "tests" / "js"
PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}


# -- helpers -------------------------------------------------------------------------------------------------


def ids(number: int, index: int) -> tuple[bytes, bytes]:
    """A distinct (trace id, span id) for request ``number``, span ``index`` (never zero)."""
    return (number + 1).to_bytes(8, "big") + b"\x7f" * 8, (number + 1).to_bytes(4, "big") + (index + 1).to_bytes(
        4, "big"
    )


def attr(key: str, value: object) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def pb_request(number: int, spans: int = 5, *, service: str = "pb-client") -> ExportTraceServiceRequest:
    """One trace: a root and ``spans - 1`` children, with a few attributes each."""
    out = []
    for i in range(spans):
        trace_id, span_id = ids(number, i)
        out.append(
            Span(
                trace_id=trace_id,
                span_id=span_id,
                parent_span_id=ids(number, 0)[1] if i else b"",
                name="invoke_agent test" if i == 0 else f"execute_tool tool_{i % 3}",
                kind=1,
                start_time_unix_nano=1_700_000_000_000_000_000 + number * 1_000_000 + i,
                end_time_unix_nano=1_700_000_000_000_000_000 + number * 1_000_000 + i + 500,
                attributes=[attr("request", number), attr("index", i), attr("tool", f"tool_{i % 3}")],
            )
        )
    resource = ResourceSpans(scope_spans=[ScopeSpans(spans=out)])
    resource.resource.attributes.append(attr("service.name", service))
    return ExportTraceServiceRequest(resource_spans=[resource])


def json_request(number: int, spans: int = 5) -> dict[str, Any]:
    """The OTLP/JSON form of :func:`pb_request` (hex ids, int64 as strings)."""
    out = []
    for i in range(spans):
        trace_id, span_id = ids(number, i)
        span: dict[str, Any] = {
            "traceId": trace_id.hex().upper() if i % 2 else trace_id.hex(),  # hex is case-insensitive
            "spanId": span_id.hex(),
            "name": f"execute_tool tool_{i % 3}",
            "kind": 1,
            "startTimeUnixNano": str(1_700_000_000_000_000_000 + i),
            "endTimeUnixNano": 1_700_000_000_000_000_500 + i,  # a number is accepted too
            "attributes": [
                {"key": "index", "value": {"intValue": str(i)}},
                {"key": "ratio", "value": {"doubleValue": i / 4}},
                {"key": "tags", "value": {"arrayValue": {"values": [{"stringValue": "a"}, {"boolValue": True}]}}},
            ],
            "status": {"code": 1},
            "someFutureField": {"ignored": True},
        }
        if i:
            span["parentSpanId"] = ids(number, 0)[1].hex()
        out.append(span)
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "json-client"}}]},
                "scopeSpans": [{"scope": {"name": "test", "version": "1"}, "spans": out}],
            }
        ]
    }


def query(db: Path, sql: str, *params: object) -> list[tuple[Any, ...]]:
    """Rows from a short read-only connection, as the dashboard reads. An in-process collector's
    flusher may hold the file a moment (DuckDB refuses a second configuration in one process):
    retried like a busy store."""
    deadline = time.monotonic() + 20
    while True:
        try:
            con = open_store(db, read_only=True, retries=40)
        except StoreError as exc:
            if "different configuration" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
            continue
        try:
            return con.execute(sql, list(params)).fetchall()
        finally:
            con.close()


def span_keys(db: Path) -> list[tuple[str, str]]:
    return [(t, s) for t, s in query(db, "SELECT trace_id, span_id FROM spans")]


def count_spans(db: Path) -> int:
    if not db.exists():
        return 0
    return int(query(db, "SELECT count(*) FROM spans")[0][0])


def wait_until(predicate: Callable[[], bool], timeout: float = 20.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    with Collector(tmp_path / "store.duckdb", CollectorConfig(port=0, flush_interval_s=0.2)) as running:
        yield running


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as session:
        yield session


@contextmanager
def lock_holder(db: Path, *, writer: bool = False) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the file until the block ends: a read-only connection (as a dashboard
    query does) or a writer's (as ``treellm ingest`` does)."""
    script = (
        "import sys, duckdb\n"
        f"con = duckdb.connect(sys.argv[1], read_only={not writer})\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
        "con.close()\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as holder:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "ready"
        try:
            yield holder
        finally:
            holder.stdin.close()
            holder.wait(timeout=30)
            holder.stdout.close()


class CollectorProcess:
    """``python -m treellm.collector`` as a subprocess (stderr to a file, the URL read from it)."""

    def __init__(self, db: Path, log: Path, *extra: str) -> None:
        self.db, self.log = db, log
        self._log = log.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "treellm.collector", "--db", str(db), "--port", "0", "--flush-interval", "0.2",
             *extra],
            stderr=self._log, stdout=subprocess.DEVNULL, cwd=ROOT,
        )  # fmt: skip
        wait_until(lambda: "listening on" in log.read_text() or self.process.poll() is not None, 30, "the collector")
        text = log.read_text()
        assert "listening on" in text, text
        self.url = text.split("listening on ", 1)[1].split()[0]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        self.process.send_signal(sig)
        code = self.process.wait(timeout=timeout)
        self._log.close()
        return code


# -- decoding (pure) -------------------------------------------------------------------------------------


def test_protobuf_spans_with_bad_ids_are_rejected_alone() -> None:
    request = pb_request(1, spans=4)
    spans = request.resource_spans[0].scope_spans[0].spans
    spans[1].trace_id = b"\x01\x02"  # wrong size
    spans[2].span_id = bytes(8)  # all zero
    decoded = decode_protobuf(request.SerializeToString())
    assert (decoded.accepted, decoded.rejected) == (2, 2)
    assert "spans[1].traceId" in decoded.error_message() and "spans[2].spanId" in decoded.error_message()
    assert all(line_problem(line.rstrip(b"\n")) is None for line in decoded.lines)
    kept = [s["spanId"] for line in decoded.lines for rs in orjson.loads(line)["resourceSpans"]
            for ss in rs["scopeSpans"] for s in ss["spans"]]  # fmt: skip
    assert kept == [spans[0].span_id.hex(), spans[3].span_id.hex()]


def test_protobuf_values_the_store_cannot_hold_are_rejected_per_span() -> None:
    request = pb_request(2, spans=4)
    spans = request.resource_spans[0].scope_spans[0].spans
    spans[1].kind = 200  # an unknown enum value survives protobuf parsing
    spans[2].start_time_unix_nano = 2**64 - 1  # above int64
    spans[3].status.code = 7
    decoded = decode_protobuf(request.SerializeToString())
    assert (decoded.accepted, decoded.rejected) == (1, 3)


def test_json_is_normalised_to_the_canonical_encoding() -> None:
    decoded = decode_json(orjson.dumps(json_request(3, spans=3)))
    assert (decoded.accepted, decoded.rejected) == (3, 0)
    doc = orjson.loads(decoded.lines[0])
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][1]
    assert span["traceId"] == ids(3, 1)[0].hex()  # lowercased
    assert span["endTimeUnixNano"] == str(1_700_000_000_000_000_501)
    assert "someFutureField" not in span
    assert span["attributes"][1] == {"key": "ratio", "value": {"doubleValue": 0.25}}
    assert line_problem(decoded.lines[0].rstrip(b"\n")) is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("traceId", "xyz"),
        ("spanId", "0" * 16),
        ("kind", "SPAN_KIND_SERVER"),  # OTLP/JSON forbids enum names
        ("kind", 9),
        ("name", 5),
        ("startTimeUnixNano", str(2**64)),
        ("events", "not a list"),
        ("status", {"code": 200}),
        ("attributes", [{"key": "a", "value": {"boolValue": "yes"}}]),
        ("attributes", [{"key": "a", "value": {"intValue": "12x"}}]),
        ("attributes", [{"key": "a", "value": {"stringValue": "x", "intValue": "1"}}]),
    ],
)
def test_a_json_span_of_the_wrong_shape_is_rejected_and_the_others_kept(field: str, value: object) -> None:
    doc = json_request(4, spans=3)
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][1][field] = value
    decoded = decode_json(orjson.dumps(doc))
    assert (decoded.accepted, decoded.rejected) == (2, 1)
    assert field in decoded.reasons[0]


def test_deeply_nested_attribute_values_are_rejected_not_recursed() -> None:
    value: dict[str, Any] = {"stringValue": "leaf"}
    for _ in range(60):
        value = {"arrayValue": {"values": [value]}}
    doc = json_request(5, spans=2)
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"] = [{"key": "deep", "value": value}]
    decoded = decode_json(orjson.dumps(doc))
    assert (decoded.accepted, decoded.rejected) == (1, 1)
    assert "nested deeper" in decoded.reasons[0]


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[1, 2]", b'{"resourceSpans": 5}', b'{"resourceSpans": [{"scopeSpans": {"spans": []}}]}',
     b'{"resourceSpans": [{"resource": {"attributes": 7}}]}'],
)  # fmt: skip
def test_a_json_body_of_the_wrong_structure_is_a_bad_request(body: bytes) -> None:
    with pytest.raises(BadRequest):
        decode_json(body)


def test_large_requests_become_lines_of_bounded_size() -> None:
    decoded = decode_protobuf(pb_request(6, spans=2500).SerializeToString())
    assert decoded.accepted == 2500 and len(decoded.lines) == 3
    assert all(line_problem(line.rstrip(b"\n")) is None for line in decoded.lines)


def test_decompression_stops_at_the_limit_and_refuses_truncated_streams() -> None:
    bomb = gzip.compress(b"\0" * 10_000_000)
    assert len(bomb) < 20_000
    with pytest.raises(PayloadTooLarge):
        decompress(bomb, "gzip", 1_000_000)
    with pytest.raises(BadRequest, match="truncated"):
        decompress(gzip.compress(b"x" * 1000)[:-12], "gzip", 1_000_000)
    with pytest.raises(BadRequest):
        decompress(b"\x1f\x8bnot gzip at all", "gzip", 1_000_000)
    assert decompress(gzip.compress(b"ab") + gzip.compress(b"cd"), "gzip", 10) == b"abcd"  # several members
    assert decompress(zlib.compress(b"hello"), "deflate", 10) == b"hello"


# -- the journal -----------------------------------------------------------------------------------------


def test_group_commit_shares_one_fsync_among_concurrent_requests(tmp_path: Path) -> None:
    syncs: list[int] = []
    gate = threading.Event()

    def held_sync(fd: int) -> None:  # the first sync lasts until every request is queued
        assert gate.wait(10)
        os.fdatasync(fd)
        syncs.append(fd)

    journal = Journal(tmp_path / "j", max_segment_bytes=2**20, max_pending_bytes=2**20, max_journal_bytes=2**24,
                      sync=held_sync)  # fmt: skip
    journal.open()
    futures = []
    threads = [
        threading.Thread(target=lambda i=i: futures.append(journal.submit(b'{"n":%d}\n' % i))) for i in range(64)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gate.set()
    for future in futures:
        future.result(timeout=10)
    journal.close()
    assert len(syncs) <= 2, f"{len(syncs)} fsyncs for 64 requests queued together: no group commit"
    segments = journal.closed_segments()
    data = b"".join(s.path.read_bytes() for s in segments)
    assert sorted(data.splitlines()) == sorted(b'{"n":%d}' % i for i in range(64))
    for segment in segments:
        journal.remove(segment)
    journal.release()
    assert not (tmp_path / "j").exists()


def test_a_torn_tail_is_cut_on_recovery_and_the_sequence_continues(tmp_path: Path) -> None:
    folder = tmp_path / "j"
    folder.mkdir()
    (folder / "0000000000000007.jsonl").write_bytes(b'{"a":1}\n{"a":2}\n{"a":')
    assert truncate_torn_tail(folder / "0000000000000007.jsonl") == 5
    journal = Journal(folder, max_segment_bytes=2**20, max_pending_bytes=2**20, max_journal_bytes=2**24)
    (recovered,) = journal.open()
    assert recovered.path.read_bytes() == b'{"a":1}\n{"a":2}\n'
    journal.submit(b'{"b":1}\n').result(timeout=10)
    new = journal.cut()
    assert new is not None and new.sequence == 8
    journal.close()
    journal.release()


def test_the_journal_refuses_bytes_over_its_bounds(tmp_path: Path) -> None:
    gate = threading.Event()
    journal = Journal(tmp_path / "j", max_segment_bytes=2**20, max_pending_bytes=100, max_journal_bytes=1000,
                      sync=lambda fd: gate.wait(10))  # fmt: skip
    journal.open()
    first = journal.submit(b"x" * 60 + b"\n")  # taken by the writer, which waits in its sync
    wait_until(lambda: journal.stats().pending_bytes == 61 and not journal._pending, 5, "the write")
    journal.submit(b"y" * 60 + b"\n")
    with pytest.raises(Overloaded) as too_many:
        journal.submit(b"z" * 60 + b"\n")
    assert too_many.value.status == 429
    gate.set()
    first.result(timeout=10)
    wait_until(lambda: journal.stats().pending_bytes == 0, 5, "the second write")
    journal.submit(b"w" * 800 + b"\n").result(timeout=10)
    with pytest.raises(Overloaded) as behind:
        journal.submit(b"v" * 100 + b"\n")
    assert behind.value.status == 503
    journal.close()
    journal.release()


def test_a_second_collector_cannot_take_the_same_journal(tmp_path: Path, collector: Collector) -> None:
    other = Collector(collector.db, CollectorConfig(port=0))
    with pytest.raises(CollectorError, match="in use by another collector"):
        other.start()


# -- real clients ------------------------------------------------------------------------------------------


def _python_sdk_spans(endpoint: str, *, compression: Compression | None = None) -> tuple[str, int]:
    provider = TracerProvider(resource=Resource.create({"service.name": "py-client"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint, compression=compression)))
    tracer = provider.get_tracer("test-tracer", "2.0")
    with tracer.start_as_current_span("invoke_agent py", kind=SpanKind.SERVER, attributes={"run": "r1"}) as root:
        for i in range(3):
            with tracer.start_as_current_span(f"execute_tool t{i}", attributes={"i": i, "ok": True, "x": 1.5}) as s:
                s.add_event("tool:done", {"i": i})
                if i == 2:
                    s.set_status(Status(StatusCode.ERROR, "boom"))
        trace_id = f"{root.get_span_context().trace_id:032x}"
    provider.shutdown()
    return trace_id, 4


@pytest.mark.parametrize("compression", [None, Compression.Gzip])
def test_the_python_exporter_spans_arrive_complete(collector: Collector, compression: Compression | None) -> None:
    trace_id, total = _python_sdk_spans(collector.url, compression=compression)
    wait_until(lambda: count_spans(collector.db) == total, what="the spans in the store")
    spans = query(
        collector.db,
        "SELECT span_id, parent_span_id, name, kind, status_code, status_message, attributes, service_name, "
        "scope_name FROM spans WHERE trace_id = ? ORDER BY start_ns",
        trace_id,
    )
    events = query(collector.db, "SELECT name, attributes['i'] FROM span_events WHERE trace_id = ?", trace_id)
    root = spans[0]
    assert root[2:5] == ("invoke_agent py", 2, 0) and root[1] is None
    assert all(s[1] == root[0] for s in spans[1:])
    assert [s[2] for s in spans[1:]] == ["execute_tool t0", "execute_tool t1", "execute_tool t2"]
    assert spans[3][4:6] == (2, "boom")
    assert spans[2][6] == {"i": "1", "ok": "true", "x": "1.5"}
    assert {s[7] for s in spans} == {"py-client"} and {s[8] for s in spans} == {"test-tracer"}
    assert sorted(events) == [("tool:done", str(i)) for i in range(3)]


def _node_modules_or_skip() -> None:
    if (JS_DIR / "node_modules" / "@opentelemetry" / "exporter-trace-otlp-http").is_dir() and shutil.which("node"):
        return
    if os.environ.get("TREELLM_REQUIRE_NODE") == "1":
        pytest.fail("tests/js/node_modules is missing (TREELLM_REQUIRE_NODE=1): run `npm ci --prefix tests/js`")
    pytest.skip("the JavaScript exporter is not installed: `npm ci --prefix tests/js` (TREELLM_REQUIRE_NODE=1 fails)")


@pytest.mark.parametrize("gzip_flag", [[], ["--gzip"]])
def test_the_javascript_exporter_spans_arrive_complete(collector: Collector, gzip_flag: list[str]) -> None:
    _node_modules_or_skip()
    sent = subprocess.run(["node", str(JS_DIR / "send-spans.js"), collector.url, "40", "--batch", "16", *gzip_flag],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert sent.returncode == 0, sent.stdout + sent.stderr
    summary = json.loads(sent.stdout)
    assert summary["exported"] == 40
    wait_until(lambda: count_spans(collector.db) == 40, what="the JavaScript spans")
    rows = query(
        collector.db,
        "SELECT span_id, parent_span_id, name, tool_name, attributes, service_name FROM spans "
        "WHERE trace_id = ? ORDER BY start_ns",
        summary["traceId"],
    )
    events = query(collector.db, "SELECT count(*) FROM span_events WHERE trace_id = ?", summary["traceId"])[0]
    (root,) = [r for r in rows if r[1] is None]
    children = [r for r in rows if r[1] is not None]
    assert len(rows) == 40 and root[2] == "invoke_agent js-agent"
    assert all(r[1] == root[0] for r in children)
    by_index = {int(r[4]["js.index"]): r for r in children}
    assert sorted(by_index) == list(range(1, 40))
    assert by_index[5][2:4] == ("execute_tool tool_2", "tool_2")
    assert by_index[5][4]["js.ratio"] == "1.25" and by_index[5][4]["js.even"] == "false"
    assert json.loads(by_index[5][4]["js.tags"]) == {"values": [{"stringValue": "alpha"}, {"stringValue": "n5"}]}
    assert {r[5] for r in rows} == {"js-client"} and events == (39,)


# -- the HTTP contract -------------------------------------------------------------------------------------


def test_json_partial_success_keeps_the_good_spans(collector: Collector, client: httpx.Client) -> None:
    doc = json_request(10, spans=4)
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][2]["traceId"] = "not-a-trace-id"
    response = client.post(collector.url, content=orjson.dumps(doc), headers=JSON)
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1" and "traceId" in partial["errorMessage"]
    wait_until(lambda: count_spans(collector.db) == 3)


def test_protobuf_partial_success_is_a_protobuf_response(collector: Collector, client: httpx.Client) -> None:
    request = pb_request(11, spans=3)
    request.resource_spans[0].scope_spans[0].spans[1].trace_id = bytes(16)
    response = client.post(collector.url, content=request.SerializeToString(), headers=PROTOBUF)
    assert response.status_code == 200 and response.headers["content-type"] == "application/x-protobuf"
    message = ExportTraceServiceResponse.FromString(response.content)
    assert message.partial_success.rejected_spans == 1 and "traceId" in message.partial_success.error_message
    full = client.post(collector.url, content=pb_request(12).SerializeToString(), headers=PROTOBUF)
    assert full.status_code == 200 and not ExportTraceServiceResponse.FromString(full.content).HasField(
        "partial_success"
    )
    assert client.post(collector.url, content=b"", headers=PROTOBUF).status_code == 200  # an empty request
    wait_until(lambda: count_spans(collector.db) == 7)


def test_failures_get_the_right_status_and_a_status_body(collector: Collector, client: httpx.Client) -> None:
    bad = client.post(collector.url, content=b"\xff\xff\xff garbage", headers=PROTOBUF)
    assert bad.status_code == 400 and bad.headers["content-type"] == "application/x-protobuf"
    status = status_pb2.Status.FromString(bad.content)
    assert status.code == 3 and "protobuf" in status.message and status.details[0].type_url.endswith("BadRequest")
    bad_json = client.post(collector.url, content=b'{"resourceSpans": 1}', headers=JSON)
    assert bad_json.status_code == 400 and bad_json.json()["details"][0]["fieldViolations"][0]["field"] == (
        "resourceSpans"
    )
    assert client.post(collector.url, content=b"{}", headers={"Content-Type": "text/plain"}).status_code == 415
    assert client.post(collector.url, content=b"x", headers={**PROTOBUF, "Content-Encoding": "br"}).status_code == 415
    assert client.get(collector.url).status_code == 405
    assert client.post(collector.url.replace("/v1/traces", "/v1/logs"), content=b"").status_code == 404
    assert client.get(collector.url.replace("/v1/traces", "/health")).json()["status"] == "ok"
    assert count_spans(collector.db) == 0


def test_bodies_above_the_limit_are_413_before_and_while_reading(tmp_path: Path, client: httpx.Client) -> None:
    config = CollectorConfig(port=0, max_body_bytes=50_000, flush_interval_s=0.2)
    with Collector(tmp_path / "s.duckdb", config) as small:
        declared = client.post(small.url, content=b"\0" * 60_000, headers=PROTOBUF)
        assert declared.status_code == 413
        streamed = client.post(small.url, content=iter([b"\0" * 30_000] * 3), headers=PROTOBUF)  # chunked
        assert streamed.status_code == 413
        bomb = gzip.compress(pb_request(1, spans=2).SerializeToString() + b"\0" * 5_000_000)
        inflated = client.post(small.url, content=bomb, headers={**PROTOBUF, "Content-Encoding": "gzip"})
        assert inflated.status_code == 413 and "decompressed" in status_pb2.Status.FromString(inflated.content).message
        truncated = gzip.compress(pb_request(2).SerializeToString())[:-9]
        cut = client.post(small.url, content=truncated, headers={**PROTOBUF, "Content-Encoding": "gzip"})
        assert cut.status_code == 400
        fine = gzip.compress(pb_request(3).SerializeToString())
        assert client.post(small.url, content=fine, headers={**PROTOBUF, "Content-Encoding": "gzip"}).status_code == 200
        wait_until(lambda: count_spans(small.db) == 5)


def test_a_bearer_token_is_required_when_configured(tmp_path: Path, client: httpx.Client) -> None:
    config = CollectorConfig(port=0, token="s3cret", flush_interval_s=0.2)
    with Collector(tmp_path / "s.duckdb", config) as guarded:
        body = pb_request(1).SerializeToString()
        missing = client.post(guarded.url, content=body, headers=PROTOBUF)
        assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer")
        wrong = client.post(guarded.url, content=body, headers={**PROTOBUF, "Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        right = client.post(guarded.url, content=body, headers={**PROTOBUF, "Authorization": "bearer s3cret"})
        assert right.status_code == 200
        exporter = OTLPSpanExporter(endpoint=guarded.url, headers={"Authorization": "Bearer s3cret"})
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        provider.get_tracer("t").start_span("with token").end()
        provider.shutdown()
        wait_until(lambda: count_spans(guarded.db) == 6)


def test_settings_are_validated_with_expected_and_got() -> None:
    assert parse_size("20MiB") == 20 * 2**20 and parse_size("512kB") == 512_000 and parse_size("7") == 7
    with pytest.raises(ConfigError, match="expected a size"):
        parse_size("lots")
    with pytest.raises(ConfigError, match="max_body_bytes: expected a positive integer"):
        CollectorConfig(max_body_bytes=0)
    with pytest.raises(ConfigError, match="port"):
        CollectorConfig(port=70000)
    assert "s3cret" not in repr(CollectorConfig(token="s3cret"))
    for nice in (-1, 20, True, 1.5):
        with pytest.raises(ConfigError, match="flusher_nice: expected a nice increment 0-19"):
            CollectorConfig(flusher_nice=nice)
    with pytest.raises(ConfigError, match="max_flush_bytes: expected a positive integer"):
        CollectorConfig(max_flush_bytes=0)
    for wait in (-1, True, 601, "5"):
        with pytest.raises(ConfigError, match="admission_wait_s: expected a number of seconds 0-600"):
            CollectorConfig(admission_wait_s=wait)  # type: ignore[arg-type]
    assert CollectorConfig(admission_wait_s=0).admission_wait_s == 0


def test_the_flusher_runs_below_the_receivers_priority(tmp_path: Path) -> None:
    """Under a full load the cores go to acknowledging first: the flusher's thread (and the DuckDB
    threads it starts) runs at a nice value ``flusher_nice`` above the receiver's."""
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    with Collector(tmp_path / "store.duckdb", CollectorConfig(port=0, flusher_nice=7)) as running:
        thread = running.flusher._thread
        assert thread is not None and thread.native_id is not None
        assert running.flusher.running.wait(60)  # the thread lowers its own priority as it starts
        assert os.getpriority(os.PRIO_PROCESS, thread.native_id) == min(19, own + 7)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own  # the receiver's: unchanged


def test_a_backlog_flush_is_bounded_by_max_flush_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Collector(tmp_path / "store.duckdb", CollectorConfig(port=0, max_flush_bytes=3 * 2**20)) as running:
        assert running.flusher.batch_bytes == 3 * 2**20
    served: list[CollectorConfig] = []
    monkeypatch.setattr("treellm.collector.server.serve", lambda db, *, config, **options: served.append(config) or 0)
    assert collector_main(["--db", str(tmp_path / "s.duckdb"), "--max-flush", "64MiB"]) == 0
    assert served[0].max_flush_bytes == 64 * 2**20
    assert collector_main(["--db", str(tmp_path / "s.duckdb")]) == 0
    assert served[1].max_flush_bytes == CollectorConfig().max_flush_bytes == 256 * 2**20
    assert served[1].admission_wait_s == CollectorConfig().admission_wait_s == 5.0
    assert collector_main(["--db", str(tmp_path / "s.duckdb"), "--admission-wait", "0"]) == 0
    assert served[2].admission_wait_s == 0


def test_the_token_env_var_must_be_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.environ.pop("TREELLM_TEST_NO_SUCH_TOKEN", None)
    assert collector_main(["--db", str(tmp_path / "s.duckdb"), "--token-env", "TREELLM_TEST_NO_SUCH_TOKEN"]) == 1
    assert "TREELLM_TEST_NO_SUCH_TOKEN is not set" in capsys.readouterr().err


@pytest.mark.parametrize("writer", [False, True], ids=["reader", "writer"])
def test_a_busy_store_delays_nothing_then_503_over_the_bound_then_recovers(
    tmp_path: Path, client: httpx.Client, writer: bool
) -> None:
    db = tmp_path / "s.duckdb"
    open_store(db).close()
    config = CollectorConfig(port=0, flush_interval_s=0.1, max_journal_bytes=12_000, retry_after_s=3,
                             admission_wait_s=0.05)  # fmt: skip
    with Collector(db, config) as busy:
        with lock_holder(db, writer=writer):
            first = client.post(busy.url, content=pb_request(1).SerializeToString(), headers=PROTOBUF)
            assert first.status_code == 200  # answered while the holder still has the store: it waited for nothing
            statuses = [client.post(busy.url, content=pb_request(n).SerializeToString(), headers=PROTOBUF)
                        for n in range(2, 12)]  # fmt: skip
            refused = [r for r in statuses if r.status_code == 503]
            assert refused and refused[0].headers["retry-after"] == "3"
            assert "not keeping up" in status_pb2.Status.FromString(refused[0].content).message
            accepted = 1 + sum(r.status_code == 200 for r in statuses)
            assert busy.stats().admission_wait_refused == len(refused)  # each waited, the store stayed held
            wait_until(lambda: busy.stats().flusher.busy >= 1, what="the flusher to find the store busy")
            assert busy.stats().flusher.spans_stored == 0
        wait_until(lambda: busy.stats().flusher.spans_stored == accepted * 5, what="the drain once the holder left")
        after = client.post(busy.url, content=pb_request(20).SerializeToString(), headers=PROTOBUF)
        assert after.status_code == 200
    assert count_spans(db) == (accepted + 1) * 5


def test_a_live_reader_sees_new_spans_while_they_arrive_and_slows_no_request(tmp_path: Path) -> None:
    """The default flush interval (1 s), a reader as the dashboard, a steady client. No clock: the
    spans become visible while the client still sends, and requests are answered while a reader
    holds the store (so they never wait for it)."""
    db = tmp_path / "s.duckdb"
    with Collector(db, CollectorConfig(port=0)) as live, httpx.Client(timeout=10) as session:

        def send(numbers: range) -> None:
            for n in numbers:
                body = pb_request(n).SerializeToString()
                assert session.post(live.url, content=body, headers=PROTOBUF).status_code == 200

        send(range(10))
        wait_until(lambda: count_spans(db) == 50, what="the reader to see the first spans while the client sends")
        with lock_holder(db):  # a reader holds the store: every request is answered all the same
            stored = live.stats().flusher.spans_stored
            send(range(10, 20))
            assert live.stats().flusher.spans_stored == stored, "a request waited for the store"
        send(range(20, 30))
        wait_until(lambda: count_spans(db) == 150, what="the reader to see every span")
    assert sorted(span_keys(db)) == sorted(
        (ids(n, i)[0].hex(), ids(n, i)[1].hex()) for n in range(30) for i in range(5)
    )


# -- faults ----------------------------------------------------------------------------------------------------


def test_sigterm_drains_the_journal_and_exits_zero(tmp_path: Path, client: httpx.Client) -> None:
    db = tmp_path / "s.duckdb"
    proc = CollectorProcess(db, tmp_path / "collector.log", "--flush-interval", "30")  # no flush before the signal
    for n in range(5):
        assert client.post(proc.url, content=pb_request(n).SerializeToString(), headers=PROTOBUF).status_code == 200
    assert proc.stop(signal.SIGTERM) == 0
    assert count_spans(db) == 25
    assert not (tmp_path / "s.duckdb.collector").exists()


def test_a_store_busy_past_the_drain_timeout_keeps_the_journal_for_the_next_start(
    tmp_path: Path, client: httpx.Client
) -> None:
    db = tmp_path / "s.duckdb"
    open_store(db).close()
    with lock_holder(db):
        proc = CollectorProcess(db, tmp_path / "first.log", "--drain-timeout", "1")
        for n in range(3):
            assert client.post(proc.url, content=pb_request(n).SerializeToString(), headers=PROTOBUF).status_code == 200
        assert proc.stop(signal.SIGINT) == 75
        assert "stay in the journal" in (tmp_path / "first.log").read_text()
    assert count_spans(db) == 0 and list((tmp_path / "s.duckdb.collector").glob("*.jsonl"))
    again = CollectorProcess(db, tmp_path / "second.log")
    wait_until(lambda: count_spans(db) == 15, what="the replay")
    assert again.stop() == 0


def test_kill_9_mid_stream_loses_no_acknowledged_span(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    proc = CollectorProcess(db, tmp_path / "first.log")
    acknowledged: list[int] = []
    failed: list[int] = []
    stop = threading.Event()

    def stream() -> None:
        with httpx.Client(timeout=10) as session:
            number = 0
            while not stop.is_set():
                body = pb_request(number, spans=20).SerializeToString()
                try:
                    response = session.post(proc.url, content=body, headers=PROTOBUF)
                except httpx.TransportError:
                    failed.append(number)
                    return
                (acknowledged if response.status_code == 200 else failed).append(number)
                number += 1

    clients = [threading.Thread(target=stream) for _ in range(1)]
    for thread in clients:
        thread.start()
    wait_until(lambda: len(acknowledged) >= 150, 30, "a stream of acknowledged requests")
    proc.process.send_signal(signal.SIGKILL)
    proc.process.wait(timeout=10)
    proc._log.close()
    stop.set()
    for thread in clients:
        thread.join()
    assert list((tmp_path / "s.duckdb.collector").glob("*.jsonl")), "nothing left in the journal to replay"
    restarted = CollectorProcess(db, tmp_path / "second.log")
    with httpx.Client(timeout=10) as session:  # clients retry what was not acknowledged, and some of what was
        for number in failed + acknowledged[-10:]:
            body = pb_request(number, spans=20).SerializeToString()
            assert session.post(restarted.url, content=body, headers=PROTOBUF).status_code == 200
    assert restarted.stop() == 0
    stored = span_keys(db)
    assert len(stored) == len(set(stored)), "a span is stored twice"
    expected = {(ids(n, i)[0].hex(), ids(n, i)[1].hex()) for n in acknowledged for i in range(20)}
    assert expected <= set(stored), f"{len(expected - set(stored))} acknowledged spans lost"


def _big_jsonl(path: Path, lines: int, spans_per_line: int = 50) -> int:
    """``lines`` agent runs from another framework (GenAI tool spans without treellm's signatures, so
    the ingester computes signatures and runs in its transaction): one template line, a new trace id each."""
    trace = "ab" * 16
    root = f"{1:016x}"
    spans = []
    for i in range(spans_per_line):
        attributes = [
            ("gen_ai.operation.name", "invoke_agent" if i == 0 else "execute_tool"),
            ("gen_ai.tool.name", f"t{i % 4}"),
            ("gen_ai.tool.call.arguments", json.dumps({"path": f"src/m{i % 9}.py", "line": i % 5})),
            ("gen_ai.tool.call.result", "r" * 40),
        ]
        span: dict[str, Any] = {
            "traceId": trace,
            "spanId": root if i == 0 else f"{i + 1:016x}",
            "name": f"execute_tool t{i % 4}",
            "kind": 1,
            "startTimeUnixNano": str(1_790_000_000_000_000_000 + i),
            "endTimeUnixNano": str(1_790_000_000_000_000_500 + i),
            "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attributes[: 1 if i == 0 else 4]],
            "events": [{"timeUnixNano": "1", "name": "e", "attributes": []}] if i % 10 == 0 else [],
        }
        if i:
            span["parentSpanId"] = root
        spans.append(span)
    doc = {
        "resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"scope": {"name": "t"}, "spans": spans}]}]
    }
    template = orjson.dumps(doc) + b"\n"
    with path.open("wb") as out:
        for n in range(lines):
            out.write(template.replace(trace.encode(), f"{n + 1:032x}".encode()))
    return lines * spans_per_line


def _fingerprint(db: Path) -> tuple[Any, ...]:
    con = open_store(db, read_only=True)
    try:
        return tuple(
            con.execute(f"SELECT count(*), bit_xor(hash(trace_id || ':' || span_id)) FROM {table}").fetchone()
            for table in ("spans", "span_events", "span_links")
        )
    finally:
        con.close()


# ``treellm ingest`` that stops inside its transaction, once the staged spans are inserted, says so and
# waits to be killed: the kill lands mid-ingest by construction, not by timing.
_INGEST_HELD_IN_ITS_TRANSACTION = """
import importlib
import sys
from treellm.cli import main

ingest = importlib.import_module("treellm.store.ingest")  # the module (the package re-exports a function of that name)

insert_prepared = ingest._insert_prepared

def held(con):
    insert_prepared(con)
    print("inserted, not committed", flush=True)
    sys.stdin.read()

ingest._insert_prepared = held
sys.exit(main(sys.argv[1:]))
"""


def test_a_killed_ingest_run_again_ends_as_one_clean_ingest(tmp_path: Path) -> None:
    data = tmp_path / "big.jsonl"
    total = _big_jsonl(data, lines=300)
    clean = tmp_path / "clean.duckdb"
    assert ingest_file(clean, data, "otlp-jsonl").spans == total
    db = tmp_path / "killed.duckdb"
    arguments = ["ingest", str(data), "--db", str(db), "--input-format", "otlp-jsonl"]
    held = [sys.executable, "-c", _INGEST_HELD_IN_ITS_TRANSACTION, *arguments]
    with subprocess.Popen(held, cwd=ROOT, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL) as first:  # fmt: skip
        assert first.stdout is not None and first.stdin is not None
        assert first.stdout.readline().strip() == "inserted, not committed"
        first.kill()
        first.wait(timeout=10)
        first.stdin.close()
        first.stdout.close()
    assert count_spans(db) == 0, "a killed ingest left half a file"
    command = [sys.executable, "-m", "treellm", *arguments]
    again = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert again.returncode == 0, again.stderr
    assert _fingerprint(db) == _fingerprint(clean)


def _fuzz_case(rng: random.Random, number: int) -> tuple[bytes, dict[str, str], set[int], str]:
    """(body, headers, allowed statuses, kind) of one malformed or odd request."""
    kind = rng.choice(["valid", "pb-mutate", "pb-random", "json-type", "json-text", "gzip-cut", "gzip-bomb", "media",
                       "coding", "huge"])  # fmt: skip
    pb = pb_request(number, spans=4).SerializeToString()
    if kind == "valid":  # interleaved: the receiver keeps serving well-formed requests in full
        if rng.random() < 0.5:
            return pb, PROTOBUF, {200}, kind
        return orjson.dumps(json_request(number, spans=4)), JSON, {200}, kind
    if kind == "pb-mutate":
        data = bytearray(pb)
        for _ in range(rng.randint(1, 6)):
            action = rng.random()
            position = rng.randrange(len(data))
            if action < 0.4:
                data[position] = rng.randrange(256)
            elif action < 0.7:
                del data[position:]
            else:
                data[position:position] = rng.randbytes(rng.randint(1, 8))
            if not data:
                break
        return bytes(data), PROTOBUF, {200, 400}, kind
    if kind == "pb-random":
        return rng.randbytes(rng.randint(1, 400)), PROTOBUF, {200, 400}, kind
    if kind in ("json-type", "json-text"):
        doc = json_request(number, spans=4)
        wrong = [None, 5, -1, 2**70, 1e308, "x", "NaN", [], {}, True, "f" * 40, "9" * 30, [[[[]]]], {"values": 3}]
        spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
        containers = [doc, doc["resourceSpans"][0], doc["resourceSpans"][0]["scopeSpans"][0], *spans,
                      spans[0]["attributes"][rng.randrange(3)]["value"], spans[1]["status"]]  # fmt: skip
        for target in rng.sample(containers, rng.randint(1, 4)):  # chosen before any is changed
            key = rng.choice([*list(target), "kind", "flags", "droppedAttributesCount", "events", "links"])
            target[key] = rng.choice(wrong)
        text = json.dumps(doc).encode()
        if kind == "json-text":
            text = text[: rng.randrange(len(text))]
        return text, JSON, {200, 400}, kind
    if kind == "gzip-cut":
        packed = gzip.compress(pb)
        return packed[: rng.randrange(len(packed) - 8)], {**PROTOBUF, "Content-Encoding": "gzip"}, {400}, kind
    if kind == "gzip-bomb":
        return gzip.compress(pb + bytes(300_000)), {**PROTOBUF, "Content-Encoding": "gzip"}, {413}, kind
    if kind == "media":
        media = rng.choice(["text/plain", "application/xml", "application/grpc", "", "application/jsonx"])
        return pb, {"Content-Type": media}, {415}, kind
    if kind == "coding":
        return pb, {**PROTOBUF, "Content-Encoding": rng.choice(["br", "zstd", "compress", "gzip, br"])}, {415}, kind
    return rng.randbytes(70_000), rng.choice([PROTOBUF, JSON]), {413}, kind


def _request_keys(body: bytes, headers: dict[str, str]) -> set[tuple[str, str]]:
    """The (trace_id, span_id) a request holds, read independently of the collector."""
    if headers.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    try:
        if headers["Content-Type"] == JSON["Content-Type"]:
            doc = json.loads(body)
            return {(str(s.get("traceId")).lower(), str(s.get("spanId")).lower())
                    for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]
                    if isinstance(s, dict)}  # fmt: skip
        message = ExportTraceServiceRequest.FromString(body)
    except (ValueError, TypeError, KeyError, AttributeError, DecodeError):
        return set()
    return {(s.trace_id.hex(), s.span_id.hex()) for rs in message.resource_spans for ss in rs.scope_spans
            for s in ss.spans}  # fmt: skip


def test_fuzzing_the_receiver_never_crashes_it_nor_half_stores_a_request(tmp_path: Path) -> None:
    rng = random.Random(20261202)
    config = CollectorConfig(port=0, max_body_bytes=64_000, flush_interval_s=0.2)
    allowed_keys: set[tuple[str, str]] = set()
    complete: list[set[tuple[str, str]]] = []
    kinds: dict[str, int] = {}
    with Collector(tmp_path / "s.duckdb", config) as target, httpx.Client(timeout=30) as session:
        for number in range(300):
            body, headers, allowed, kind = _fuzz_case(rng, number)
            response = session.post(target.url, content=body, headers=headers)
            assert response.status_code in allowed, (kind, response.status_code, response.content[:200])
            kinds[kind] = kinds.get(kind, 0) + 1
            if response.status_code == 200:
                keys = _request_keys(body, headers)
                allowed_keys |= keys
                if headers["Content-Type"] == JSON["Content-Type"]:
                    partial = response.json().get("partialSuccess")
                else:
                    partial = ExportTraceServiceResponse.FromString(response.content).partial_success.rejected_spans
                if not partial:
                    complete.append(keys)
            elif response.headers["content-type"] == "application/json":  # JSON requests, and unknown types
                assert isinstance(response.json()["message"], str)
            else:
                assert status_pb2.Status.FromString(response.content).message
        assert session.get(target.url.replace("/v1/traces", "/health")).status_code == 200
    stats = target.stats()
    assert stats.flusher.rejected_segments == 0 and stats.flusher.failures == 0, "the store refused a journaled line"
    stored = set(span_keys(target.db))
    assert stored <= allowed_keys, "spans of a refused request were stored"
    assert all(keys <= stored for keys in complete), "a fully accepted request was not stored whole"
    assert len(kinds) == 10 and stats.accepted_spans > 100 and stats.rejected_spans > 10


# -- past one machine ----------------------------------------------------------------------------------------


def _route(doc: dict[str, Any], shards: int) -> list[dict[str, Any]]:
    """Split one request by trace id (as the loadbalancing exporter's ``routing_key: traceID``)."""
    out: list[dict[str, Any]] = [{"resourceSpans": []} for _ in range(shards)]
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                shard = zlib.crc32(bytes.fromhex(span["traceId"])) % shards
                target = out[shard]["resourceSpans"]
                if not target or target[-1]["_from"] is not rs:
                    target.append({"_from": rs, "resource": rs.get("resource", {}), "scopeSpans": []})
                scopes = target[-1]["scopeSpans"]
                if not scopes or scopes[-1]["_from"] is not ss:
                    scopes.append({"_from": ss, "scope": ss.get("scope", {}), "spans": []})
                scopes[-1]["spans"].append(span)
    for part in out:
        for rs in part["resourceSpans"]:
            del rs["_from"]
            for ss in rs["scopeSpans"]:
                del ss["_from"]
    return out


def test_two_collectors_routed_by_trace_id_report_like_one_store(tmp_path: Path, client: httpx.Client) -> None:
    lines = (sample_traces_dir() / "production_day.jsonl").read_bytes().splitlines()[:60]
    single = tmp_path / "single.duckdb"
    (tmp_path / "all.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    ingest_file(single, tmp_path / "all.jsonl", "otlp-jsonl")
    config = CollectorConfig(port=0, flush_interval_s=0.2)
    shards = [Collector(tmp_path / f"shard{i}.duckdb", config) for i in range(2)]
    for shard in shards:
        shard.start()
    try:
        for line in lines:
            for shard, part in zip(shards, _route(orjson.loads(line), 2), strict=True):
                if part["resourceSpans"]:
                    body = gzip.compress(orjson.dumps(part)) if len(line) % 2 else orjson.dumps(part)
                    headers = {**JSON, "Content-Encoding": "gzip"} if len(line) % 2 else JSON
                    assert client.post(shard.url, content=body, headers=headers).status_code == 200
    finally:
        for shard in shards:
            assert shard.stop()
    traces = [{t for t, _ in span_keys(shard.db)} for shard in shards]
    assert traces[0] and traces[1] and not traces[0] & traces[1], "a trace was split across collectors"
    folders = []
    for i, shard in enumerate(shards):
        folders.append(tmp_path / f"parquet{i}")
        export_parquet(shard.db, folders[-1])
    merged = open_parquet(folders)
    whole = open_store(single, read_only=True)
    try:
        combined, reference = report(merged), report(whole)
    finally:
        merged.close()
        whole.close()
    assert reference["runs"] > 10 and reference["tools"]
    assert combined == reference


def test_the_otel_collector_configuration_routes_by_trace_id_to_both_collectors() -> None:
    text = (ROOT / "treellm" / "collector" / "otelcol-loadbalancing.yaml").read_text()
    assert "loadbalancing:" in text and "routing_key: traceID" in text
    static = text.split("static:", 1)[1]
    assert static.count("- ") >= 2
    for port in ("4319", "4320"):
        assert f"127.0.0.1:{port}" in text or f"treellm-{port}" in text


def _closed_segments(journal: Journal, lines: list[bytes]) -> None:
    for line in lines:
        journal.submit(line).result(timeout=10)
        assert journal.cut() is not None


def test_a_backlog_of_segments_goes_in_as_one_transaction_and_a_refused_batch_segment_by_segment(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "j", max_segment_bytes=2**20, max_pending_bytes=2**20, max_journal_bytes=2**24)
    journal.open()
    lines = [decode_protobuf(pb_request(n, spans=3).SerializeToString()).lines[0] for n in range(6)]
    _closed_segments(journal, lines[:4])
    flusher = Flusher(tmp_path / "s.duckdb", journal, interval_s=0.01, batch_bytes=3 * len(lines[0]) + 1)
    assert flusher.flush() == "done"  # the three oldest segments in one transaction
    assert flusher.stats().flushes == 1 and flusher.stats().spans_stored == 9
    assert len(journal.closed_segments()) == 1 and len(span_keys(tmp_path / "s.duckdb")) == 9
    poison = orjson.loads(lines[5])
    poison["resourceSpans"][0]["scopeSpans"][0]["spans"][1]["kind"] = 200  # written past the receiver's checks
    _closed_segments(journal, [lines[4], orjson.dumps(poison, option=orjson.OPT_APPEND_NEWLINE)])
    assert flusher.flush() == "done"  # refused as a batch: each segment alone, the poisoned one split
    journal.close()
    assert flusher.drain(time.monotonic() + 30)
    expected = {(ids(n, i)[0].hex(), ids(n, i)[1].hex()) for n in range(6) for i in range(3)}
    assert set(span_keys(tmp_path / "s.duckdb")) == expected - {(ids(5, 1)[0].hex(), ids(5, 1)[1].hex())}
    assert flusher.stats().spans_stored == 17 and flusher.stats().rejected_segments == 1
    journal.release()


def test_a_span_the_store_refuses_is_isolated_by_splitting_and_set_aside_with_the_reason(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j", max_segment_bytes=2**20, max_pending_bytes=2**20, max_journal_bytes=2**24)
    journal.open()
    lines = [decode_protobuf(pb_request(n, spans=3).SerializeToString()).lines[0] for n in range(7)]
    poison = orjson.loads(lines[3])
    poison["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["kind"] = 200  # written past the receiver's checks
    lines[3] = orjson.dumps(poison) + b"\n"
    journal.submit(b"".join(lines)).result(timeout=10)
    flusher = Flusher(tmp_path / "s.duckdb", journal, interval_s=0.01, batch_bytes=2**24)
    for _ in range(20):
        flusher.flush()
    journal.close()
    assert flusher.drain(time.monotonic() + 30)
    stored = span_keys(tmp_path / "s.duckdb")
    poisoned = poison["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    expected = {(ids(n, i)[0].hex(), ids(n, i)[1].hex()) for n in range(7) for i in range(3)}
    assert len(stored) == 20 and set(stored) == expected - {(poisoned["traceId"], poisoned["spanId"])}
    assert flusher.stats().rejected_segments == 1
    (set_aside,) = (tmp_path / "j" / "rejected").iterdir()
    record = orjson.loads(set_aside.read_bytes())
    assert "kind" in record["reason"] and "200" in record["reason"]
    (line,) = record["lines"]
    assert [s for rs in line["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]] == [poisoned]
    assert line["resourceSpans"][0]["resource"] == poison["resourceSpans"][0]["resource"]  # kept with its span
    journal.release()
    assert (tmp_path / "j").exists()  # kept: it holds the rejected line


def test_it_listens_on_loopback_unless_told_and_warns_when_open_without_a_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert CollectorConfig().host == "127.0.0.1" and CollectorConfig().loopback
    with Collector(tmp_path / "s.duckdb", CollectorConfig(host="0.0.0.0", port=0)):
        pass
    assert "without a token" in caplog.text
    with pytest.raises(CollectorError, match="cannot listen"), socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        Collector(tmp_path / "t.duckdb", CollectorConfig(port=taken.getsockname()[1])).start()
