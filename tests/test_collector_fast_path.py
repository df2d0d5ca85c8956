"""The collector's request path (issue 23): protobuf checked and made canonical in one pass, the
per-attribute rules left to the store's check at flush, and decoding on worker processes."""

from __future__ import annotations

import asyncio
import gzip
import math
import os
import signal
from pathlib import Path
from typing import Any, cast

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from treellm.collector import Collector, CollectorConfig
from treellm.collector.decode import decode_protobuf, decode_request
from treellm.collector.errors import BadRequest, PayloadTooLarge
from treellm.collector.pool import DecodePool, _WorkerDied
from treellm.derive.formats.otlp_proto import canonical_traces_data, raw_traces_data
from treellm.errors import ConfigError
from treellm.otlp import DUPLICATE_KEYS, MAX_VALUE_DEPTH, normalize_traces_data
from treellm.store import open_store
from treellm.store.ingest import ingest_file

TRACE = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
START = 1_700_000_000_000_000_000


def s(text: str) -> AnyValue:
    return AnyValue(string_value=text)


def nested(depth: int) -> AnyValue:
    """A value nested ``depth`` levels below the attribute (0: a plain string)."""
    value = s("leaf")
    for level in range(depth):
        value = (
            AnyValue(array_value=ArrayValue(values=[value]))
            if level % 2
            else AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key="k", value=value)]))
        )
    return value


def rich_span(index: int, **fields: Any) -> Span:
    span = Span(
        trace_id=TRACE, span_id=(index + 1).to_bytes(8, "big"), name=f"s{index}", kind=cast(Any, index % 6),
        start_time_unix_nano=START, end_time_unix_nano=START + 10, trace_state="a=b" if index % 2 else "",
        flags=index, dropped_attributes_count=index % 3, dropped_events_count=index % 2, dropped_links_count=1,
        status=Status(code=cast(Any, index % 3), message="m" if index % 2 else ""),
        attributes=[
            KeyValue(key="str", value=s("x")), KeyValue(key="int", value=AnyValue(int_value=-(2**63))),
            KeyValue(key="bool", value=AnyValue(bool_value=True)), KeyValue(key="pi", value=AnyValue(double_value=3.5)),
            KeyValue(key="nan", value=AnyValue(double_value=math.nan)),
            KeyValue(key="inf", value=AnyValue(double_value=-math.inf)),
            KeyValue(key="bytes", value=AnyValue(bytes_value=b"\x00\xff-_")), KeyValue(key="unset", value=AnyValue()),
            KeyValue(key="deep", value=nested(MAX_VALUE_DEPTH)),
        ],
    )  # fmt: skip
    if index % 2:
        span.parent_span_id = bytes(8)  # all zero: no parent
    elif index:
        span.parent_span_id = b"\x07" * 8
    event = span.events.add(time_unix_nano=START + 1, name="e", dropped_attributes_count=2)
    event.attributes.add(key="k", value=s("v"))
    span.events.add(time_unix_nano=START + 2, name="bare")
    link = span.links.add(trace_id=TRACE, span_id=b"\x09" * 8, flags=3, trace_state="t=1" if index else "")
    link.attributes.add(key="l", value=AnyValue(int_value=5))
    for key, value in fields.items():
        setattr(span, key, value)
    return span


def request(*scopes: ScopeSpans, resource: list[KeyValue] | None = None, schema: str = "") -> ExportTraceServiceRequest:
    res = Resource(attributes=resource or [KeyValue(key="service.name", value=s("svc"))], dropped_attributes_count=1)
    return ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(resource=res, scope_spans=scopes, schema_url=schema)]
    )


def both_roads(message: ExportTraceServiceRequest) -> tuple[Any, Any]:
    fast = canonical_traces_data(message, max_reasons=None)
    assert fast is not None
    return fast, normalize_traces_data(raw_traces_data(message), max_reasons=None)


def test_one_pass_equals_the_validator_on_every_field() -> None:
    scoped = ScopeSpans(
        scope=InstrumentationScope(name="lib", version="1.2", attributes=[KeyValue(key="sa", value=s("1"))],
                                   dropped_attributes_count=4),
        spans=[rich_span(i) for i in range(6)], schema_url="https://scope",
    )  # fmt: skip
    no_scope = ScopeSpans(spans=[rich_span(6)])
    message = request(scoped, no_scope, schema="https://resource")
    message.resource_spans.append(ResourceSpans(scope_spans=[ScopeSpans(spans=[rich_span(7)])]))
    fast, validator = both_roads(message)
    assert fast.traces_data == validator.traces_data
    assert (fast.total, fast.rejected) == (validator.total, validator.rejected) == (8, 0)
    assert orjson.dumps(fast.traces_data) == orjson.dumps(validator.traces_data)


BROKEN: list[dict[str, Any]] = [
    {"trace_id": b"\x01\x02"},
    {"trace_id": bytes(16)},
    {"span_id": bytes(8)},
    {"span_id": b"\x01" * 9},
    {"parent_span_id": b"\x01" * 3},
    {"kind": 6},
    {"kind": -1},
    {"start_time_unix_nano": 2**63, "end_time_unix_nano": 2**63},
    {"end_time_unix_nano": START - 1},
    {"status": Status(code=cast(Any, 3))},
]


@pytest.mark.parametrize("fields", BROKEN, ids=[next(iter(f)) for f in BROKEN])
def test_a_broken_span_is_rejected_alone_with_the_validators_reason(fields: dict[str, Any]) -> None:
    broken = rich_span(1)
    for key, value in fields.items():
        if key == "status":
            broken.status.CopyFrom(value)
        else:
            setattr(broken, key, value)
    message = request(ScopeSpans(spans=[rich_span(0), broken, rich_span(2)]))
    fast, validator = both_roads(message)
    assert (fast.rejected, fast.reasons) == (validator.rejected, validator.reasons) and fast.rejected == 1
    assert fast.traces_data == validator.traces_data


@pytest.mark.parametrize("where", ["event", "link", "deep"])
def test_events_links_and_values_break_rules_on_the_request_path_too(where: str) -> None:
    broken = rich_span(1)
    if where == "event":
        broken.events[0].time_unix_nano = 2**64 - 1
    elif where == "link":
        broken.links[0].span_id = bytes(8)
    else:
        broken.attributes.add(key="too-deep", value=nested(MAX_VALUE_DEPTH + 1))
    fast, validator = both_roads(request(ScopeSpans(spans=[rich_span(0), broken])))
    assert fast.rejected == 1 and fast.reasons == validator.reasons
    assert ("nested deeper" in fast.reasons[0]) == (where == "deep")


_IDS = st.one_of(st.binary(min_size=0, max_size=17), st.just(bytes(8)), st.just(bytes(16)))
_UINT64 = st.one_of(st.integers(0, 2**64 - 1), st.integers(2**63 - 3, 2**63 + 3), st.just(0))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_IDS, _IDS, _IDS, st.integers(-2, 7), _UINT64, _UINT64, st.integers(-1, 3)),
                min_size=1, max_size=5))  # fmt: skip
def test_one_pass_and_the_validator_decide_alike(specs: list[tuple[Any, ...]]) -> None:
    spans = []
    for index, (trace, span_id, parent, kind, start, end, code) in enumerate(specs):
        span = rich_span(index, trace_id=trace if index % 2 else TRACE, span_id=span_id if index % 3 else b"\x05" * 8)
        span.parent_span_id, span.kind, span.start_time_unix_nano, span.end_time_unix_nano = parent, kind, start, end
        span.status.code = code
        spans.append(span)
    fast, validator = both_roads(request(ScopeSpans(spans=spans)))
    assert (fast.traces_data, fast.total, fast.rejected, fast.reasons) == (
        validator.traces_data, validator.total, validator.rejected, validator.reasons,
    )  # fmt: skip


# -- repeated keys: a span's, an event's and a link's go to the store's check; a resource's or scope's not ---


def stored(tmp_path: Path, lines: tuple[bytes, ...], name: str) -> list[tuple[Any, ...]]:
    path = tmp_path / f"{name}.jsonl"
    path.write_bytes(b"".join(lines))
    db = tmp_path / f"{name}.duckdb"
    ingest_file(db, path)
    con = open_store(db, read_only=True)
    try:
        return con.execute(
            "SELECT s.name, s.attributes, s.resource_attributes, e.attributes, l.attributes FROM spans s "
            "JOIN span_events e USING (trace_id, span_id) JOIN span_links l USING (trace_id, span_id) "
            "WHERE e.event_index = 0 ORDER BY s.name"
        ).fetchall()
    finally:
        con.close()


def test_repeated_keys_of_spans_events_and_links_are_resolved_at_flush_as_the_validator_does(tmp_path: Path) -> None:
    span = rich_span(0)
    span.attributes.add(key="str", value=s("last"))
    span.events[0].attributes.add(key="k", value=s("last"))
    span.links[0].attributes.add(key="l", value=s("last"))
    message = request(ScopeSpans(spans=[span, rich_span(1)]))
    decoded = decode_protobuf(message.SerializeToString())
    assert (decoded.accepted, decoded.rejected) == (2, 0)
    sent = orjson.loads(decoded.lines[0])["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert [a["key"] for a in sent["attributes"]].count("str") == 2  # left as sent: the store's check flags it
    by_validator = normalize_traces_data(raw_traces_data(message)).traces_data
    kept = stored(tmp_path, decoded.lines, "collector")
    assert kept == stored(tmp_path, (orjson.dumps(by_validator) + b"\n",), "validator")
    attributes, events, links = kept[0][1], kept[0][3], kept[0][4]
    assert (attributes["str"], events["k"], links["l"]) == ("last", "last", "last")
    assert orjson.loads(attributes[DUPLICATE_KEYS]) == {
        "values": [{"stringValue": k} for k in ("str", "events[0]:k", "links[0]:l")]
    }


@pytest.mark.parametrize("where", ["resource", "scope"])
def test_repeated_keys_of_a_resource_or_scope_take_the_validators_road_at_once(where: str) -> None:
    twice = [KeyValue(key="service.name", value=s("old")), KeyValue(key="service.name", value=s("svc"))]
    scope = InstrumentationScope(name="lib", attributes=twice if where == "scope" else [])
    message = request(ScopeSpans(scope=scope, spans=[rich_span(0)]), resource=twice if where == "resource" else None)
    assert canonical_traces_data(message) is None
    doc = orjson.loads(decode_protobuf(message.SerializeToString()).lines[0])
    recorded = next(a for a in doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"]
                    if a["key"] == DUPLICATE_KEYS)  # fmt: skip
    assert recorded["value"]["arrayValue"]["values"] == [{"stringValue": f"{where}:service.name"}]


# -- the pool ----------------------------------------------------------------------------------------------


def _body(spans: int = 300) -> bytes:
    return bytes(request(ScopeSpans(spans=[rich_span(i) for i in range(spans)])).SerializeToString())


@pytest.fixture(scope="module")
def pool() -> Any:
    made = DecodePool(2, inline_bytes=1)
    made.warm()
    yield made
    made.close()


def test_worker_processes_decode_as_the_caller_would(pool: DecodePool) -> None:
    body = _body()
    decoded = asyncio.run(pool.decode(gzip.compress(body), "gzip", "protobuf", 20 * 2**20, decode_request))
    assert decoded == decode_request(body, "protobuf")


def test_refusals_cross_the_process_boundary_as_the_decoders_errors(pool: DecodePool) -> None:
    with pytest.raises(BadRequest, match="not a protobuf"):
        asyncio.run(pool.decode(b"\xff" * 64, "identity", "protobuf", 2**20, decode_request))
    with pytest.raises(PayloadTooLarge) as caught:
        asyncio.run(pool.decode(gzip.compress(_body()), "gzip", "protobuf", 1000, decode_request))
    assert caught.value.limit == 1000


def test_a_worker_that_dies_costs_no_request_and_the_pool_starts_again() -> None:
    pool = DecodePool(1, inline_bytes=1)
    try:
        pool.warm()
        [pid] = pool.pids()
        os.kill(pid, signal.SIGKILL)
        body = _body(10)
        assert asyncio.run(pool.decode(body, "identity", "protobuf", 2**20, decode_request)).accepted == 10
        assert pool.restarts == 1
        assert asyncio.run(pool.decode(body, "identity", "protobuf", 2**20, decode_request)).accepted == 10
        assert pool.restarts == 1
        assert len(pool.pids()) == 1 and pool.pids() != [pid]
    finally:
        pool.close()


async def _together(pool: DecodePool, bodies: list[bytes]) -> list[int]:
    decoded = await asyncio.gather(*(pool.decode(b, "identity", "protobuf", 2**20, decode_request) for b in bodies))
    return [d.accepted for d in decoded]


def test_requests_queued_on_a_worker_each_get_their_own_answer(pool: DecodePool) -> None:
    sizes = [3, 300, 1, 50, 7, 120, 2, 9] * 3  # more requests than workers: they queue, pipelined
    assert asyncio.run(_together(pool, [_body(n) for n in sizes])) == sizes
    assert pool.restarts == 0 and len(pool.pids()) == 2


def test_a_worker_killed_under_queued_requests_costs_none_of_them() -> None:
    pool = DecodePool(1, inline_bytes=1)
    try:
        pool.warm()
        [pid] = pool.pids()

        async def run() -> list[int]:
            decoding = asyncio.ensure_future(_together(pool, [_body(n) for n in (200, 5, 6, 7)]))
            await asyncio.sleep(0)  # the first request is written
            os.kill(pid, signal.SIGKILL)
            return await decoding

        assert asyncio.run(run()) == [200, 5, 6, 7]
        assert pool.restarts == 1  # one death, counted once for its four requests
    finally:
        pool.close()


def test_a_request_cancelled_on_a_worker_ends_that_worker_uncounted() -> None:
    pool = DecodePool(1, inline_bytes=1)
    try:
        pool.warm()
        [pid] = pool.pids()

        async def cancel_one() -> None:
            decoding = asyncio.ensure_future(pool.decode(_body(300), "identity", "protobuf", 2**20, decode_request))
            await asyncio.sleep(0)
            decoding.cancel()
            with pytest.raises(asyncio.CancelledError):
                await decoding

        asyncio.run(cancel_one())
        assert pool.pids() == []  # its stream was mid-message: the worker is gone
        assert asyncio.run(_together(pool, [_body(4)])) == [4]
        assert pool.restarts == 0 and len(pool.pids()) == 1 and pool.pids() != [pid]
    finally:
        pool.close()


def _never_starts() -> Any:
    raise _WorkerDied("the decoding process did not start")


def test_workers_that_cannot_start_leave_decoding_on_threads_said_once(caplog: pytest.LogCaptureFixture) -> None:
    pool = DecodePool(2, inline_bytes=1, start=_never_starts)
    body = _body(10)
    for _ in range(3):
        assert asyncio.run(pool.decode(body, "identity", "protobuf", 2**20, decode_request)).accepted == 10
    assert (pool.workers, pool.restarts, pool.pids()) == (0, 0, [])
    assert len([r for r in caplog.records if "cannot start" in r.getMessage()]) == 1


def test_without_workers_bodies_are_decoded_on_threads() -> None:
    pool = DecodePool(0, inline_bytes=1)
    body = _body(10)
    assert asyncio.run(pool.decode(body, "identity", "protobuf", 2**20, decode_request)).accepted == 10
    assert pool.pids() == []


@pytest.mark.parametrize("value", [-1, 1.5, True, "2"])
def test_decode_workers_is_a_validated_setting(value: object) -> None:
    with pytest.raises(ConfigError, match="decode_workers: expected"):
        CollectorConfig(decode_workers=value)  # type: ignore[arg-type]
    assert CollectorConfig(decode_workers=0).decode_workers == 0


def test_a_live_collector_stores_repeated_keys_of_spans_events_and_links_last_wins(tmp_path: Path) -> None:
    spans = [rich_span(i) for i in range(300)]  # a body above the inline size: decoded by a worker process
    for span in spans[:2]:
        span.attributes.add(key="str", value=s("last"))
        span.events[0].attributes.add(key="k", value=s("last"))
        span.links[0].attributes.add(key="l", value=s("last"))
    body = request(ScopeSpans(spans=spans)).SerializeToString()
    collector = Collector(tmp_path / "s.duckdb", CollectorConfig(port=0, decode_workers=2))
    collector.start()
    try:
        headers = {"content-type": "application/x-protobuf", "content-encoding": "gzip"}
        response = httpx.post(collector.url, content=gzip.compress(body), headers=headers, timeout=60)
        assert response.status_code == 200 and response.content == b""  # no partial success: nothing rejected
    finally:
        assert collector.stop()
    stats = collector.stats()
    assert (stats.accepted_spans, stats.flusher.rejected_segments, stats.decode_restarts) == (300, 0, 0)
    con = open_store(tmp_path / "s.duckdb", read_only=True)
    try:
        found = con.execute(
            f"SELECT s.name, s.attributes['str'], e.attributes['k'], l.attributes['l'], "
            f"s.attributes['{DUPLICATE_KEYS}'] FROM spans s JOIN span_events e USING (trace_id, span_id) "
            "JOIN span_links l USING (trace_id, span_id) WHERE e.event_index = 0 ORDER BY s.span_id LIMIT 3"
        ).fetchall()
        assert con.execute("SELECT count(*) FROM spans").fetchone() == (300,)
    finally:
        con.close()
    recorded = '{"values":[{"stringValue":"str"},{"stringValue":"events[0]:k"},{"stringValue":"links[0]:l"}]}'
    assert found == [("s0", "last", "last", "last", recorded), ("s1", "last", "last", "last", recorded),
                     ("s2", "x", "v", "5", None)]  # fmt: skip
