"""Duplicate attribute keys of events and links (issue 22, point 5): the last value wins and the
key is recorded on the span, as for a span's own attributes, in files and through the collector;
a file is never refused whole for them, and --skip-bad keeps every good line around a bad one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from treellm.collector.decode import decode_json, decode_protobuf
from treellm.errors import IngestError
from treellm.otlp import DUPLICATE_KEYS
from treellm.otlp.validate import EVENT_RULES, LINK_RULES, VALIDATE_SQL
from treellm.store import ingest, open_store
from treellm.store.ingest import ingest_file

TRACE = "0af7651916cd43dd8448eb211c80319c"
OTHER_SPAN = "00000000000000ff"


def kv(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "value": {"stringValue": value}}


def span(index: int, *, event_dup: bool = False, link_dup: bool = False, **fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": TRACE,
        "spanId": f"{index + 1:016x}",
        "name": f"s{index}",
        "kind": 1,
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000000001000",
        "attributes": [kv("a", str(index))],
        "events": [{"timeUnixNano": "1700000000000000500", "name": "e",
                    "attributes": [kv("k", "first"), kv("k", "last")] if event_dup else [kv("k", "only")]}],
        "links": [{"traceId": TRACE, "spanId": OTHER_SPAN,
                   "attributes": [kv("l", "first"), kv("l", "last")] if link_dup else [kv("l", "only")]}],
    }  # fmt: skip
    out.update(fields)
    return out


def line(*spans: dict[str, Any]) -> bytes:
    scope_spans = [{"scope": {"name": "t"}, "spans": list(spans)}]
    doc = {"resourceSpans": [{"resource": {"attributes": [kv("service.name", "svc")]}, "scopeSpans": scope_spans}]}
    return orjson.dumps(doc) + b"\n"


def seven_lines(path: Path, *, bad_line: int | None = None) -> Path:
    """Seven one-span lines: an event's key repeated on line 4, a link's on line 6, and, when
    ``bad_line`` is given, an end before its start on that line."""
    lines = []
    for i in range(7):
        extra = {"endTimeUnixNano": "5"} if bad_line == i + 1 else {}
        lines.append(line(span(i, event_dup=i == 3, link_dup=i == 5, **extra)))
    path.write_bytes(b"".join(lines))
    return path


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    con = open_store(db, read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def recorded(db: Path) -> dict[str, list[str]]:
    found = rows(db, f"SELECT name, attributes['{DUPLICATE_KEYS}'] FROM spans WHERE attributes['{DUPLICATE_KEYS}'] "
                     "IS NOT NULL")  # fmt: skip
    return {name: [v["stringValue"] for v in json.loads(text)["values"]] for name, text in found}


def check_stored(db: Path, names: set[str]) -> None:
    assert {name for (name,) in rows(db, "SELECT name FROM spans")} == names
    events = dict(
        rows(db, "SELECT s.name, e.attributes['k'] FROM span_events e JOIN spans s USING (trace_id, span_id)")
    )
    links = dict(rows(db, "SELECT s.name, l.attributes['l'] FROM span_links l JOIN spans s USING (trace_id, span_id)"))
    assert events["s3"] == "last" and links["s5"] == "last"
    assert all(events[n] == "only" for n in names - {"s3"}) and all(links[n] == "only" for n in names - {"s5"})
    assert recorded(db) == {"s3": ["events[0]:k"], "s5": ["links[0]:l"]}


def test_the_sql_check_flags_repeated_keys_of_events_and_links() -> None:
    assert [r.kind for r in EVENT_RULES if r.field == "attributes"] == ["unique_keys"]
    assert [r.kind for r in LINK_RULES if r.field == "attributes"] == ["unique_keys"]
    assert "list_distinct(list_transform(e.attributes" in VALIDATE_SQL
    assert "list_distinct(list_transform(l.attributes" in VALIDATE_SQL


@pytest.mark.parametrize("skip_bad", [False, True])
def test_repeated_keys_of_events_and_links_keep_every_line_of_a_file(tmp_path: Path, skip_bad: bool) -> None:
    report = ingest(tmp_path / "s.duckdb", [seven_lines(tmp_path / "f.jsonl")], skip_bad=skip_bad)
    assert (report.spans, report.bad_records) == (7, ())
    check_stored(tmp_path / "s.duckdb", {f"s{i}" for i in range(7)})


def test_skip_bad_keeps_every_good_line_around_a_bad_one_named_by_its_line(tmp_path: Path) -> None:
    path = seven_lines(tmp_path / "f.jsonl", bad_line=5)
    report = ingest(tmp_path / "s.duckdb", [path], skip_bad=True)
    assert report.spans == 6
    [bad] = report.bad_records
    assert bad.line == 5 and bad.reason.startswith("resourceSpans[0].scopeSpans[0].spans[0].endTimeUnixNano: ")
    check_stored(tmp_path / "s.duckdb", {f"s{i}" for i in range(7)} - {"s4"})


def test_without_skip_bad_the_refusal_names_the_bad_line_not_a_duplicate_key(tmp_path: Path) -> None:
    with pytest.raises(IngestError) as caught:
        ingest(tmp_path / "s.duckdb", [seven_lines(tmp_path / "f.jsonl", bad_line=2)])
    assert caught.value.line == 2 and "endTimeUnixNano" in caught.value.reason


def _pb_body() -> bytes:
    spans = []
    for i in range(7):
        s = span(i, event_dup=i == 3, link_dup=i == 5)
        message = Span(
            trace_id=bytes.fromhex(TRACE), span_id=bytes.fromhex(s["spanId"]), name=s["name"], kind=cast(Any, 1),
            start_time_unix_nano=int(s["startTimeUnixNano"]), end_time_unix_nano=int(s["endTimeUnixNano"]),
            attributes=[KeyValue(key="a", value=AnyValue(string_value=str(i)))],
        )  # fmt: skip
        event = message.events.add(time_unix_nano=int(s["events"][0]["timeUnixNano"]), name="e")
        for item in s["events"][0]["attributes"]:
            event.attributes.add(key=item["key"], value=AnyValue(string_value=item["value"]["stringValue"]))
        link = message.links.add(trace_id=bytes.fromhex(TRACE), span_id=bytes.fromhex(OTHER_SPAN))
        for item in s["links"][0]["attributes"]:
            link.attributes.add(key=item["key"], value=AnyValue(string_value=item["value"]["stringValue"]))
        spans.append(message)
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])])
    return bytes(request.SerializeToString())


@pytest.mark.parametrize("encoding", ["json", "protobuf"])
def test_repeated_keys_of_events_and_links_through_the_collector_are_stored_last_wins(
    tmp_path: Path, encoding: str
) -> None:
    if encoding == "json":  # the seven lines' documents as one request
        docs = [orjson.loads(x) for x in seven_lines(tmp_path / "f.jsonl").read_bytes().splitlines()]
        decoded = decode_json(orjson.dumps({"resourceSpans": [rs for d in docs for rs in d["resourceSpans"]]}))
    else:
        decoded = decode_protobuf(_pb_body())
    assert (decoded.accepted, decoded.rejected) == (7, 0)
    journal = tmp_path / "segment.jsonl"
    journal.write_bytes(b"".join(decoded.lines))
    assert ingest_file(tmp_path / "s.duckdb", journal).spans == 7
    check_stored(tmp_path / "s.duckdb", {f"s{i}" for i in range(7)})
