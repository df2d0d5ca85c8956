"""One validator for every road into the store (treellm.otlp.validate): the collector's JSON and
protobuf paths, every input format, ingest's in-place read, its line check and --skip-bad."""

from __future__ import annotations

import copy
import json
import os
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from treellm.collector import Collector, CollectorConfig
from treellm.collector.decode import decode_json, decode_protobuf
from treellm.errors import IngestError
from treellm.otlp import DUPLICATE_KEYS, normalize_traces_data
from treellm.otlp.validate import EVENT_RULES, LINK_RULES, SPAN_RULES, VALIDATE_SQL
from treellm.store import ingest, open_store
from treellm.store.ingest import MEMORY_LIMIT, ingest_file, line_problem

TRACE = "0af7651916cd43dd8448eb211c80319c"
ROOT = "b7ad6b7169203331"


def span(index: int, **fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": TRACE,
        "spanId": f"{index + 1:016x}",
        "name": f"s{index}",
        "kind": 1,
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000000001000",
        "attributes": [{"key": "i", "value": {"intValue": str(index)}}],
        "status": {"code": 0},
    }
    out.update(fields)
    return {k: v for k, v in out.items() if v is not None}


def doc(*spans: dict[str, Any], resource: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    attrs = resource if resource is not None else [{"key": "service.name", "value": {"stringValue": "svc"}}]
    scope_spans = [{"scope": {"name": "t"}, "spans": list(spans)}]
    return {"resourceSpans": [{"resource": {"attributes": attrs}, "scopeSpans": scope_spans}]}


def kv(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "value": {"stringValue": value}}


def write_jsonl(path: Path, *docs: dict[str, Any]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in docs))
    return path


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    con = open_store(db, read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def stored_names(db: Path) -> set[str]:
    return {name for (name,) in rows(db, "SELECT name FROM spans")} if db.exists() else set()


# -- the rule table -------------------------------------------------------------------------------------

INVALID: list[tuple[str, dict[str, Any]]] = [
    ("traceId", {"traceId": "0af7651916cd43dd"}),
    ("traceId", {"traceId": "0" * 32}),
    ("traceId", {"traceId": "zz" * 16}),
    ("traceId", {"traceId": None}),
    ("spanId", {"spanId": "abc"}),
    ("spanId", {"spanId": "0" * 16}),
    ("parentSpanId", {"parentSpanId": "not-hex-at-all!!"}),
    ("parentSpanId", {"parentSpanId": "abcd"}),
    ("name", {"name": 5}),
    ("kind", {"kind": 6}),
    ("kind", {"kind": -1}),
    ("kind", {"kind": "SPAN_KIND_SERVER"}),
    ("startTimeUnixNano", {"startTimeUnixNano": str(2**63), "endTimeUnixNano": str(2**63)}),
    ("startTimeUnixNano", {"startTimeUnixNano": "-5"}),
    ("endTimeUnixNano", {"endTimeUnixNano": str(2**64 - 1)}),
    ("endTimeUnixNano", {"endTimeUnixNano": "1699999999999999999"}),
    ("status.code", {"status": {"code": 3}}),
    ("status.code", {"status": {"code": -1}}),
    ("events[0].timeUnixNano", {"events": [{"timeUnixNano": str(2**63), "name": "e"}]}),
    ("links[0].traceId", {"links": [{"traceId": "0" * 32, "spanId": ROOT}]}),
    ("links[0].spanId", {"links": [{"traceId": TRACE, "spanId": "12"}]}),
    ("flags", {"flags": 2**32}),
]


@pytest.mark.parametrize(("field", "fields"), INVALID, ids=[f"{f}={next(iter(v.values()))!r:.20}" for f, v in INVALID])
def test_each_invalid_field_rejects_its_span_alone_with_a_reason_naming_it(field: str, fields: dict[str, Any]) -> None:
    result = normalize_traces_data(doc(span(0), span(1, **fields), span(2)))
    assert (result.total, result.rejected) == (3, 1)
    [reason] = result.reasons
    assert reason.startswith(f"resourceSpans[0].scopeSpans[0].spans[1].{field}: ")
    assert result.traces_data is not None
    assert [s["name"] for s in result.traces_data["resourceSpans"][0]["scopeSpans"][0]["spans"]] == ["s0", "s2"]


def test_the_sql_check_is_generated_from_the_rule_table() -> None:
    for rule in (*SPAN_RULES, *EVENT_RULES, *LINK_RULES):
        assert rule.column in VALIDATE_SQL
    assert "end_ns >= start_ns" in VALIDATE_SQL
    assert "parent_span_id IS NULL OR" in VALIDATE_SQL


def test_line_problem_names_the_span_and_field() -> None:
    line = orjson.dumps(doc(span(0), span(1, kind=9)))
    assert line_problem(line) == "resourceSpans[0].scopeSpans[0].spans[1].kind: expected 0..5, got 9"
    assert line_problem(orjson.dumps(doc(span(0)))) is None


def test_a_wrong_structure_is_a_problem_of_the_whole_line() -> None:
    problem = line_problem(b'{"resourceSpans": [{"scopeSpans": 5}]}')
    assert problem is not None and "resourceSpans[0].scopeSpans" in problem


# -- duplicate keys ----------------------------------------------------------------------------------------


def _duplicated_doc() -> dict[str, Any]:
    s = span(
        0,
        attributes=[kv("a", "first"), kv("b", "x"), kv("a", "last")],
        events=[{"timeUnixNano": "1700000000000000500", "name": "e", "attributes": [kv("k", "1"), kv("k", "2")]}],
        links=[{"traceId": TRACE, "spanId": ROOT, "attributes": [kv("l", "old"), kv("l", "new")]}],
    )
    return doc(s, resource=[kv("service.name", "old-svc"), kv("service.name", "svc")])


RECORDED = ["resource:service.name", "a", "events[0]:k", "links[0]:l"]


def test_duplicate_keys_keep_the_last_value_and_are_recorded_on_the_span() -> None:
    result = normalize_traces_data(_duplicated_doc())
    assert result.rejected == 0 and result.duplicate_keys == 1
    assert result.traces_data is not None
    rs = result.traces_data["resourceSpans"][0]
    assert rs["resource"]["attributes"] == [kv("service.name", "svc")]
    out = rs["scopeSpans"][0]["spans"][0]
    assert out["attributes"][:2] == [kv("a", "last"), kv("b", "x")]
    assert out["attributes"][-1] == {
        "key": DUPLICATE_KEYS,
        "value": {"arrayValue": {"values": [{"stringValue": k} for k in RECORDED]}},
    }
    assert out["events"][0]["attributes"] == [kv("k", "2")]
    assert out["links"][0]["attributes"] == [kv("l", "new")]


def _check_duplicates_stored(db: Path) -> None:
    [(attributes, resource)] = rows(db, "SELECT attributes, resource_attributes FROM spans")
    assert attributes["a"] == "last" and resource["service.name"] == "svc"
    assert json.loads(attributes[DUPLICATE_KEYS]) == {"values": [{"stringValue": k} for k in RECORDED]}
    assert rows(db, "SELECT attributes FROM span_events") == [({"k": "2"},)]
    assert rows(db, "SELECT attributes FROM span_links") == [({"l": "new"},)]


def test_duplicate_keys_in_a_file_are_ingested_last_value_wins(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "dups.jsonl", _duplicated_doc())
    report = ingest(tmp_path / "s.duckdb", [path])
    assert (report.spans, report.bad_records) == (1, ())
    _check_duplicates_stored(tmp_path / "s.duckdb")


@pytest.mark.parametrize(
    ("key", "column"), [("treellm.node.kind", "node_kind"), ("treellm.tool.signature", "signature"), ("x", None)]
)
def test_a_repeated_key_of_treellms_own_span_keeps_the_last_value_promoted_or_not(
    tmp_path: Path, key: str, column: str | None
) -> None:
    """The stage reads an own span's promoted columns from its lists of keys and values and stores a
    MAP of the rest: a repeated key among the promoted ones must still send the file to the
    validator (the last value wins, the key recorded), not be read at its first place."""
    attributes = [kv("treellm.run.id", "r1"), kv(key, "first"), kv("treellm.node.id", "n1"), kv(key, "last")]
    path = write_jsonl(tmp_path / "own.jsonl", doc(span(0, attributes=attributes)))
    report = ingest(tmp_path / "s.duckdb", [path])
    assert (report.spans, report.bad_records) == (1, ())
    read = column or f"attributes['{key}']"
    [(value, node_id, stored)] = rows(tmp_path / "s.duckdb", f"SELECT {read}, node_id, attributes FROM spans")
    assert (value, node_id) == ("last", "n1")
    assert json.loads(stored[DUPLICATE_KEYS]) == {"values": [{"stringValue": key}]}


def test_an_unnamed_key_of_treellms_own_span_is_stored_as_the_validator_stores_it(tmp_path: Path) -> None:
    """An attribute without a key (hostile or broken input) on an own span: the stored MAP of the
    rest leaves no such entry out silently; the validator stores it under the empty key."""
    attributes = [kv("treellm.run.id", "r1"), {"value": {"stringValue": "x"}}, kv("treellm.node.id", "n1")]
    path = write_jsonl(tmp_path / "own.jsonl", doc(span(0, attributes=attributes)))
    report = ingest(tmp_path / "s.duckdb", [path])
    assert (report.spans, report.bad_records) == (1, ())
    assert rows(tmp_path / "s.duckdb", "SELECT node_id, attributes FROM spans") == [("n1", {"": "x"})]


def test_duplicate_keys_through_the_collector_are_stored_and_nothing_is_quarantined(tmp_path: Path) -> None:
    decoded = decode_json(orjson.dumps(_duplicated_doc()))
    assert (decoded.accepted, decoded.rejected) == (1, 0)
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b"".join(decoded.lines))
    assert ingest_file(tmp_path / "s.duckdb", path).spans == 1
    _check_duplicates_stored(tmp_path / "s.duckdb")


# -- per-span rejection in a file -------------------------------------------------------------------------


def _mixed_file(path: Path) -> Path:
    return write_jsonl(
        path,
        doc(span(0), span(1)),
        doc(span(2), span(3, endTimeUnixNano="5"), span(4, traceId="0" * 32)),
        doc(span(5)),
    )


def test_skip_bad_keeps_the_other_spans_of_a_line_and_reports_each_bad_one(tmp_path: Path) -> None:
    report = ingest(tmp_path / "s.duckdb", [_mixed_file(tmp_path / "m.jsonl")], skip_bad=True)
    assert report.spans == 4
    assert stored_names(tmp_path / "s.duckdb") == {"s0", "s1", "s2", "s5"}
    assert [(b.line, b.reason.split(":")[0]) for b in report.bad_records] == [
        (2, "resourceSpans[0].scopeSpans[0].spans[1].endTimeUnixNano"),
        (2, "resourceSpans[0].scopeSpans[0].spans[2].traceId"),
    ]


def test_without_skip_bad_a_bad_span_fails_the_file_naming_line_and_field(tmp_path: Path) -> None:
    with pytest.raises(IngestError) as caught:
        ingest(tmp_path / "s.duckdb", [_mixed_file(tmp_path / "m.jsonl")])
    assert caught.value.line == 2
    assert caught.value.reason.startswith("resourceSpans[0].scopeSpans[0].spans[1].endTimeUnixNano: ")
    assert stored_names(tmp_path / "s.duckdb") == set()


def test_a_value_duckdb_cannot_read_is_named_by_line_and_field_not_a_vague_sentence(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "k.jsonl", doc(span(0)), doc(span(1, kind="SPAN_KIND_SERVER")))
    with pytest.raises(IngestError) as caught:
        ingest(tmp_path / "s.duckdb", [path])
    assert caught.value.line == 2 and "kind" in caught.value.reason
    assert "although every line validates" not in str(caught.value)


# -- the all-zero parent ------------------------------------------------------------------------------------


def _pb_span(index: int, **fields: Any) -> Span:
    base: dict[str, Any] = {
        "trace_id": bytes.fromhex(TRACE),
        "span_id": (index + 1).to_bytes(8, "big"),
        "name": f"s{index}",
        "kind": 1,
        "start_time_unix_nano": 1_700_000_000_000_000_000,
        "end_time_unix_nano": 1_700_000_000_000_001_000,
    }
    base.update(fields)
    return Span(**base)


def _pb_request(*spans: Span) -> bytes:
    resource = Resource(attributes=[KeyValue(key="service.name", value=AnyValue(string_value="svc"))])
    request = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(resource=resource, scope_spans=[ScopeSpans(spans=list(spans))])]
    )
    return bytes(request.SerializeToString())


def _parents(lines: tuple[bytes, ...]) -> list[str | None]:
    return [
        s.get("parentSpanId")
        for line in lines
        for rs in orjson.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
    ]


def test_an_all_zero_parent_is_no_parent_on_every_road(tmp_path: Path) -> None:
    from_json = decode_json(orjson.dumps(doc(span(0, parentSpanId="0" * 16))))
    from_proto = decode_protobuf(_pb_request(_pb_span(0, parent_span_id=bytes(8))))
    assert from_json.accepted == from_proto.accepted == 1
    assert _parents(from_json.lines) == _parents(from_proto.lines) == [None]
    path = write_jsonl(tmp_path / "z.jsonl", doc(span(0, parentSpanId="0" * 16), span(1, parentSpanId="0" * 16)))
    assert ingest(tmp_path / "s.duckdb", [path]).spans == 2
    assert rows(tmp_path / "s.duckdb", "SELECT count(*) FROM spans WHERE parent_span_id IS NULL") == [(2,)]


# -- the collector ---------------------------------------------------------------------------------------------


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    with Collector(tmp_path / "store.duckdb", CollectorConfig(port=0, flush_interval_s=0.2)) as running:
        yield running


def _wait_for(db: Path, names: set[str], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while stored_names(db) != names:
        assert time.monotonic() < deadline, f"stored {stored_names(db)}, expected {names}"
        time.sleep(0.1)


def test_the_collector_answers_partial_success_for_an_out_of_range_span_and_stores_the_rest(
    collector: Collector,
) -> None:
    body = doc(span(0), span(1, startTimeUnixNano=str(2**63 + 5), endTimeUnixNano=str(2**63 + 6)), span(2),
               span(3, attributes=[kv("d", "1"), kv("d", "2")]))  # fmt: skip
    with httpx.Client(timeout=30) as client:
        response = client.post(collector.url, content=orjson.dumps(body), headers={"content-type": "application/json"})
        pb = client.post(
            collector.url,
            content=_pb_request(_pb_span(10), _pb_span(11, status=Status(code=7))),  # type: ignore[arg-type]
            headers={"content-type": "application/x-protobuf"},
        )
    assert response.status_code == 200
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1"
    assert "spans[1].startTimeUnixNano: expected 0..9223372036854775807" in partial["errorMessage"]
    assert pb.status_code == 200
    _wait_for(collector.db, {"s0", "s2", "s3", "s10"})
    quarantine = [p for p in collector.db.parent.rglob("*") if "quarantine" in p.name.lower()]
    assert all(not p.is_file() or p.stat().st_size == 0 for p in quarantine)


# -- the four roads agree -----------------------------------------------------------------------------------------

_IDS = st.one_of(st.binary(min_size=0, max_size=17), st.just(bytes(8)), st.just(bytes(16)))
_UINT64 = st.one_of(st.integers(0, 2**64 - 1), st.integers(2**63 - 3, 2**63 + 3), st.just(0))


@st.composite
def _spans(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for index in range(draw(st.integers(1, 4))):
        start = draw(_UINT64)
        keys = draw(st.lists(st.sampled_from("abc"), max_size=4))
        out.append(
            {
                "trace_id": draw(st.one_of(st.just(bytes.fromhex(TRACE)), _IDS)),
                "span_id": draw(st.one_of(st.just((index + 1).to_bytes(8, "big")), _IDS)),
                "parent_span_id": draw(st.one_of(st.just(b""), st.just(bytes(8)), st.just(b"\x07" * 8), _IDS)),
                "name": f"s{index}",
                "kind": draw(st.integers(-2, 7)),
                "start_time_unix_nano": start,
                "end_time_unix_nano": draw(st.one_of(st.just(start), _UINT64)),
                "code": draw(st.integers(-1, 3)),
                "keys": keys,
            }
        )
    return out


def _as_proto(spec: dict[str, Any]) -> Span:
    fields = {k: v for k, v in spec.items() if k not in ("code", "keys")}
    attributes = [KeyValue(key=k, value=AnyValue(int_value=i)) for i, k in enumerate(spec["keys"])]
    return Span(**fields, status=Status(code=spec["code"]), attributes=attributes)  # type: ignore[arg-type]


def _as_json(spec: dict[str, Any]) -> dict[str, Any]:
    out = {
        "traceId": spec["trace_id"].hex(),
        "spanId": spec["span_id"].hex(),
        "name": spec["name"],
        "kind": spec["kind"],
        "startTimeUnixNano": str(spec["start_time_unix_nano"]),
        "endTimeUnixNano": str(spec["end_time_unix_nano"]),
        "status": {"code": spec["code"]},
        "attributes": [{"key": k, "value": {"intValue": str(i)}} for i, k in enumerate(spec["keys"])],
    }
    if spec["parent_span_id"]:
        out["parentSpanId"] = spec["parent_span_id"].hex()
    return out


def _accepted(lines: tuple[bytes, ...]) -> dict[str, str | None]:
    return {
        s["name"]: s.get("parentSpanId")
        for line in lines
        for rs in orjson.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
    }


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_spans())
def test_the_collector_json_the_protobuf_path_and_ingest_decide_alike(specs: list[dict[str, Any]]) -> None:
    by_json = _accepted(decode_json(orjson.dumps(doc(*[_as_json(s) for s in specs]))).lines)
    by_proto = _accepted(decode_protobuf(_pb_request(*[_as_proto(s) for s in specs])).lines)
    assert by_json == by_proto
    with tempfile.TemporaryDirectory() as tmp:
        by_ingest: dict[str, str | None] = {}
        for number, spec in enumerate(specs):  # one span a file: the in-place read and its SQL check decide
            db, path = Path(tmp) / f"s{number}.duckdb", Path(tmp) / f"s{number}.jsonl"
            write_jsonl(path, doc(_as_json(spec)))
            try:
                ingest_file(db, path)
            except IngestError:
                continue
            for name, parent in rows(db, "SELECT name, parent_span_id FROM spans"):
                by_ingest[name] = parent
    assert by_ingest == by_json


# -- a batched file at the default memory limit --------------------------------------------------------------------


def _batched(path: Path, spans: int) -> None:
    rng = random.Random(5)
    resource = {"attributes": [kv("service.name", "batched"), kv("host.name", "w1"), kv("telemetry.sdk.name", "otel")]}
    written, start = 0, 1_700_000_000_000_000_000
    with path.open("wb") as out:
        while written < spans:
            body = []
            trace = f"{rng.getrandbits(128) | 1:032x}"
            for i in range(min(rng.randrange(50, 101), spans - written)):
                attrs = [kv("gen_ai.operation.name", "execute_tool"), kv("gen_ai.tool.name", "grep"),
                         kv("gen_ai.tool.call.arguments", f'{{"q": "{i}"}}'), kv("gen_ai.tool.call.result", "r" * 200),
                         {"key": "n", "value": {"intValue": str(i)}}]  # fmt: skip
                body.append({"traceId": trace, "spanId": f"{rng.getrandbits(64) | 1:016x}", "name": "execute_tool grep",
                             "kind": 1, "startTimeUnixNano": str(start + i), "endTimeUnixNano": str(start + i + 9),
                             "attributes": attrs, "status": {}})  # fmt: skip
            written += len(body)
            start += 10**9
            line = {"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": {"name": "s"}, "spans": body}]}]}
            out.write(orjson.dumps(line) + b"\n")


def test_a_batched_300k_span_file_is_ingested_at_the_default_memory_limit(tmp_path: Path) -> None:
    assert os.environ.get("TREELLM_INGEST_MEMORY_LIMIT", "1GB") == MEMORY_LIMIT
    path = tmp_path / "batched.jsonl"
    _batched(path, 300_000)
    report = ingest(tmp_path / "s.duckdb", [path])
    assert (report.spans, report.bad_records) == (300_000, ())
    assert rows(tmp_path / "s.duckdb", "SELECT count(*), count(DISTINCT span_id) FROM spans") == [(300_000, 300_000)]


# -- --skip-bad, format by format --------------------------------------------------------------------------------------


def _sdk_span(index: int, trace_id: str = "0x" + TRACE) -> dict[str, Any]:
    return {
        "name": f"s{index}",
        "context": {"trace_id": trace_id, "span_id": f"0x{index + 1:016x}", "trace_state": "[]"},
        "kind": "SpanKind.INTERNAL",
        "parent_id": None,
        "start_time": "2024-01-01T00:00:00.000000Z",
        "end_time": "2024-01-01T00:00:01.000000Z",
        "status": {"status_code": "UNSET"},
        "attributes": {"i": index},
        "events": [],
        "links": [],
        "resource": {"attributes": {"service.name": "svc"}, "schema_url": ""},
    }


def _bad_sdk_span(index: int) -> dict[str, Any]:
    out = _sdk_span(index)
    out["end_time"] = "2023-01-01T00:00:00.000000Z"  # before its start
    return out


def _frame(message: bytes) -> bytes:
    return len(message).to_bytes(4, "big") + message


def _trajectory_run(tag: str) -> dict[str, Any]:
    return {
        "id": tag,
        "messages": [
            {"role": "user", "content": tag},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": f"c-{tag}", "type": "function", "function": {"name": "grep", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c-{tag}", "content": "found"},
        ],
    }  # fmt: skip


def _files(folder: Path) -> dict[str, tuple[Path, int]]:
    """Each format's file with one bad record (or span) among good ones, and its good spans."""
    otlp_json = folder / "otlp.json"
    otlp_json.write_text(
        json.dumps(doc(span(0), span(1)), indent=2) + "\n" + json.dumps(doc(span(2), span(3, kind=11)), indent=2)
    )
    proto = folder / "spans.pb"
    first = _pb_request(_pb_span(0), _pb_span(1, trace_id=b"\x01" * 3))
    proto.write_bytes(_frame(first) + _frame(_pb_request(_pb_span(2))))

    def sdk(bad_id: str) -> list[dict[str, Any]]:
        return [_sdk_span(0), _sdk_span(1, bad_id), _sdk_span(2), _bad_sdk_span(3)]

    sdk_json = folder / "sdk.json"
    sdk_json.write_text(json.dumps({"spans": sdk("zz")}))
    console = folder / "console.txt"
    console.write_text("".join(json.dumps(s, indent=4) + "\n" for s in sdk("0x0")))
    sdk_jsonl = folder / "sdk.jsonl"
    sdk_jsonl.write_text("".join(json.dumps(s) + "\n" for s in sdk("nope")))
    trajectory = folder / "runs.json"
    broken = copy.deepcopy(_trajectory_run("b"))
    broken["messages"][1]["tool_calls"][0]["function"]["name"] = ""
    trajectory.write_text(json.dumps([_trajectory_run("a"), broken, _trajectory_run("c")]))
    return {
        "otlp-jsonl": (_mixed_file(folder / "mixed.jsonl"), 4),
        "otlp-json": (otlp_json, 3),
        "otlp-proto": (proto, 2),
        "sdk-json": (sdk_json, 2),
        "sdk-console": (console, 2),
        "sdk-jsonl": (sdk_jsonl, 2),
        "trajectory": (trajectory, 6),
    }


BAD_COUNT = {"otlp-jsonl": 2, "otlp-json": 1, "otlp-proto": 1, "sdk-json": 2, "sdk-console": 2, "sdk-jsonl": 2,
             "trajectory": 1}  # fmt: skip


@pytest.mark.parametrize("fmt", sorted(BAD_COUNT))
def test_skip_bad_keeps_every_good_record_and_reports_each_bad_one(tmp_path: Path, fmt: str) -> None:
    path, good = _files(tmp_path)[fmt]
    report = ingest(tmp_path / "s.duckdb", [path], fmt, skip_bad=True)  # type: ignore[arg-type]
    assert report.details[0].input_format == fmt
    assert report.spans == good
    assert len(report.bad_records) == BAD_COUNT[fmt], report.bad_records
    assert all(b.reason for b in report.bad_records)
    with pytest.raises(IngestError):
        ingest(tmp_path / "other.duckdb", [path], fmt)  # type: ignore[arg-type]
