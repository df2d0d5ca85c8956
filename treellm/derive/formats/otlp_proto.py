"""``otlp-proto``: OTLP protobuf, bare or in the Collector file exporter's length-prefixed frames.

One serialized ``TracesData`` (``ExportTraceServiceRequest`` has the same wire layout:
field 1 = ``resource_spans``), or the OpenTelemetry Collector file exporter's ``format:
proto``, which frames every message with its length. Its README
(https://github.com/open-telemetry/opentelemetry-collector-contrib/blob/main/exporter/fileexporter/README.md,
"File Format") says: "each encoded object is preceded by 4 bytes (an unsigned 32 bit
integer) which represent the number of bytes contained in the encoded object", and its
``file_writer.go`` writes that length with ``binary.BigEndian.PutUint32``. Framing is
decided per file: when the 4-byte big-endian prefixes tile the data and the first frame
parses, the file is framed (a truncated last frame is reported by its index); otherwise it
is one message. Each message is one record. Ids become hex (not protobuf JSON's base64),
``bytesValue`` base64, enums integers; every message then goes through the one validator
(:func:`treellm.otlp.normalize_traces_data`): a bad span is reported alone, the rest kept.

Detection comes after every JSON reading (a bare message starts with 0x0a, which a JSON
sniffer skips as whitespace): the file starts with a bare ``TracesData`` whose first
``ResourceSpans`` parses, or with a length prefix whose frame parses as a ``TracesData``.
The first message is read whole, however long. A corrupt message ends the file.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Final

from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from google.protobuf.unknown_fields import UnknownFieldSet  # type: ignore[import-untyped]
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, TracesData

from treellm.derive.formats._base import JsonObject, Record, checked, with_schema
from treellm.derive.formats._sniff import NeedBytes, Sample, Verdict
from treellm.errors import IngestError
from treellm.otlp import MAX_VALUE_DEPTH, Normalized, any_value
from treellm.otlp.validate import EVENT_RULES, LINK_RULES, SPAN_RULES, Rule, span_problem

NAME: Final = "otlp-proto"
WHAT: Final = (
    "OTLP protobuf `TracesData` / `ExportTraceServiceRequest`, also the Collector file exporter's "
    "length-prefixed proto format"
)
MAPPING: Final = "converted to OTLP/JSON"


def _rule(field: str, kind: str) -> Rule:
    return next(r for r in SPAN_RULES if r.field == field and r.kind == kind)


def sniff(sample: Sample) -> Verdict:
    """A bare message whose first ``ResourceSpans`` parses, or a first frame that parses."""
    if not sample.final:
        return False
    head, size = sample.head, sample.size
    if head[:1] == b"\x0a":  # field 1 (resource_spans), wire type 2: a bare message
        length, used = _varint(head[:16], 1)
        if length is not None and 1 + used + length <= size:
            if len(head) < 1 + used + length:
                return NeedBytes(1 + used + length)
            try:
                ResourceSpans.FromString(head[1 + used : 1 + used + length])
            except DecodeError:
                pass
            else:
                return True
    if len(head) >= 4:
        length = int.from_bytes(head[:4], "big")
        if 4 + length <= size:
            if len(head) < 4 + length:
                return NeedBytes(4 + length)
            return _parse_traces_data(head[4 : 4 + length])[0] is not None
    return False


def convert(data: bytes, *, path: str) -> Iterator[Record | IngestError]:
    """Each message of ``data`` as a record (its good spans), each rejected span reported
    after it (:func:`~treellm.derive.formats._base.checked`); a corrupt message is the last item."""
    try:
        for index, message in _proto_messages(data, path=path):
            yield from checked(index, raw_traces_data(message), path=path)
    except IngestError as exc:
        yield exc


def proto_to_traces_data(data: bytes, *, path: str) -> Iterator[dict[str, Any]]:
    """OTLP/JSON ``TracesData`` (canonical, :func:`treellm.otlp.normalize_traces_data`) for each
    protobuf message in ``data``, in order.

    ``data`` is one serialized ``TracesData`` / ``ExportTraceServiceRequest`` or the
    Collector file exporter's 4-byte big-endian length-prefixed messages (see the module
    docstring). A truncated or corrupt message, or a span the validator rejects, raises
    :class:`IngestError` with the message's index as ``record``, after the messages before
    it were yielded.
    """
    for index, message in _proto_messages(data, path=path):
        for item in checked(index, raw_traces_data(message), path=path):
            if isinstance(item, IngestError):
                raise item
            yield item.traces_data


def raw_traces_data(message: Any) -> JsonObject:
    """A protobuf ``TracesData`` / ``ExportTraceServiceRequest`` as raw OTLP/JSON, field by field
    and unchecked (ids hex whatever their length, times as decimal text whatever their size):
    :func:`treellm.otlp.normalize_traces_data` decides what is valid, for every road alike."""
    return _traces_data_json(message)


def _parse_traces_data(payload: bytes) -> tuple[Any, str]:
    """(message, "") or (None, why the payload is not a ``TracesData``)."""
    try:
        message = TracesData.FromString(payload)
    except DecodeError as exc:
        return None, f"truncated or corrupt protobuf: {exc}"
    unknown = sorted({field.field_number for field in UnknownFieldSet(message)})
    if unknown:
        return None, f"not an OTLP TracesData message (unknown top-level field {unknown[0]})"
    return message, ""


def _frames(data: bytes) -> tuple[list[tuple[int, int]], tuple[int, str] | None]:
    """(start, end) of each 4-byte-length-prefixed frame, and (index, reason) where framing breaks."""
    frames: list[tuple[int, int]] = []
    pos = 0
    while pos < len(data):
        left = len(data) - pos
        if left < 4:
            return frames, (
                len(frames),
                f"{left} stray byte(s) after the last message, too few for a length prefix",
            )
        length = int.from_bytes(data[pos : pos + 4], "big")
        if length > left - 4:
            return frames, (
                len(frames),
                f"truncated: the length prefix says {length} bytes, {left - 4} remain",
            )
        frames.append((pos + 4, pos + 4 + length))
        pos += 4 + length
    return frames, None


def _proto_messages(data: bytes, *, path: str) -> Iterator[tuple[int, Any]]:
    if not data:
        return
    frames, broken = _frames(data)
    first = _parse_traces_data(data[frames[0][0] : frames[0][1]])[0] if frames else None
    single: Any = None
    if first is None or broken is not None:
        single, reason = _parse_traces_data(data)
        if single is not None:
            yield 0, single
            return
        if first is None:
            raise IngestError(reason, path=path, record=0)
    for index, (start, end) in enumerate(frames):
        message, reason = (first, "") if index == 0 else _parse_traces_data(data[start:end])
        if message is None:
            raise IngestError(reason, path=path, record=index)
        yield index, message
    if broken is not None:
        raise IngestError(broken[1], path=path, record=broken[0])


def _hex_id(value: bytes) -> str:
    return value.hex()


def _proto_any(value: Any) -> JsonObject:
    which = value.WhichOneof("value")
    if which == "string_value":
        return {"stringValue": value.string_value}
    if which == "bool_value":
        return {"boolValue": value.bool_value}
    if which == "int_value":
        return {"intValue": str(value.int_value)}
    if which == "double_value":
        return any_value(float(value.double_value))
    if which == "array_value":
        return {"arrayValue": {"values": [_proto_any(v) for v in value.array_value.values]}}
    if which == "kvlist_value":
        return {"kvlistValue": {"values": _proto_attributes(value.kvlist_value.values)}}
    if which == "bytes_value":
        return any_value(bytes(value.bytes_value))
    return {}  # unset, or a string-table index (meaningful only in profiles)


def _proto_attributes(values: Sequence[Any]) -> list[JsonObject]:
    return [{"key": kv.key, "value": _proto_any(kv.value)} for kv in values]


def _with_dropped(out: JsonObject, key: str, count: int) -> JsonObject:
    if count:
        out[key] = count
    return out


def _proto_span(span: Any) -> JsonObject:
    out: JsonObject = {
        "traceId": _hex_id(span.trace_id),
        "spanId": _hex_id(span.span_id),
    }
    if span.trace_state:
        out["traceState"] = span.trace_state
    if span.parent_span_id:
        out["parentSpanId"] = _hex_id(span.parent_span_id)
    out["flags"] = span.flags
    out["name"] = span.name
    out["kind"] = span.kind
    out["startTimeUnixNano"] = str(span.start_time_unix_nano)
    out["endTimeUnixNano"] = str(span.end_time_unix_nano)
    out["attributes"] = _proto_attributes(span.attributes)
    _with_dropped(out, "droppedAttributesCount", span.dropped_attributes_count)
    out["events"] = [
        _with_dropped(
            {
                "timeUnixNano": str(e.time_unix_nano),
                "name": e.name,
                "attributes": _proto_attributes(e.attributes),
            },
            "droppedAttributesCount",
            e.dropped_attributes_count,
        )
        for e in span.events
    ]
    _with_dropped(out, "droppedEventsCount", span.dropped_events_count)
    out["links"] = [_proto_link(link) for link in span.links]
    _with_dropped(out, "droppedLinksCount", span.dropped_links_count)
    status: JsonObject = {"code": span.status.code}
    if span.status.message:
        status["message"] = span.status.message
    out["status"] = status
    return out


def _proto_link(link: Any) -> JsonObject:
    out: JsonObject = {
        "traceId": _hex_id(link.trace_id),
        "spanId": _hex_id(link.span_id),
        "attributes": _proto_attributes(link.attributes),
        "flags": link.flags,
    }
    if link.trace_state:
        out["traceState"] = link.trace_state
    return _with_dropped(out, "droppedAttributesCount", link.dropped_attributes_count)


def _proto_scope(scope_spans: Any) -> JsonObject:
    if not scope_spans.HasField("scope"):
        return {}
    scope = scope_spans.scope
    out: JsonObject = {"name": scope.name}
    if scope.version:
        out["version"] = scope.version
    if scope.attributes:
        out["attributes"] = _proto_attributes(scope.attributes)
    return _with_dropped(out, "droppedAttributesCount", scope.dropped_attributes_count)


def _traces_data_json(message: Any) -> JsonObject:
    resource_spans = []
    for rs in message.resource_spans:
        resource = _with_dropped(
            {"attributes": _proto_attributes(rs.resource.attributes)},
            "droppedAttributesCount",
            rs.resource.dropped_attributes_count,
        )
        scope_spans = [
            with_schema(
                {
                    "scope": _proto_scope(ss),
                    "spans": [_proto_span(span) for span in ss.spans],
                },
                ss.schema_url,
            )
            for ss in rs.scope_spans
        ]
        resource_spans.append(with_schema({"resource": resource, "scopeSpans": scope_spans}, rs.schema_url))
    return {"resourceSpans": resource_spans}


def _varint(data: bytes, pos: int) -> tuple[int | None, int]:
    value = shift = used = 0
    while pos + used < len(data) and used < 10:
        byte = data[pos + used]
        value |= (byte & 0x7F) << shift
        used += 1
        if not byte & 0x80:
            return value, used
        shift += 7
    return None, used


# --- the collector's request path: checked and canonical in one pass ---------------------------------------


_TIME_MAX: Final = int(_rule("startTimeUnixNano", "time").bound)
_KIND_MAX: Final = int(_rule("kind", "enum").bound)
_STATUS_MAX: Final = int(_rule("status.code", "enum").bound)
_EVENT_TIME_MAX: Final = int(EVENT_RULES[0].bound)
_TRACE_BYTES: Final = int(_rule("traceId", "id").bound) // 2
_SPAN_BYTES: Final = int(_rule("spanId", "id").bound) // 2
_LINK_TRACE_BYTES: Final = int(LINK_RULES[0].bound) // 2
_LINK_SPAN_BYTES: Final = int(LINK_RULES[1].bound) // 2
_ZERO_TRACE: Final = bytes(_TRACE_BYTES)
_ZERO_SPAN: Final = bytes(_SPAN_BYTES)
_ZERO_LINK_TRACE: Final = bytes(_LINK_TRACE_BYTES)
_ZERO_LINK_SPAN: Final = bytes(_LINK_SPAN_BYTES)


class _Refused(Exception):
    """A span breaks a rule (its reason is then worded by :func:`treellm.otlp.validate.span_problem`)."""


def canonical_traces_data(message: Any, *, max_reasons: int | None = 5) -> Normalized | None:
    """A parsed protobuf ``TracesData`` / ``ExportTraceServiceRequest`` as canonical OTLP/JSON in one
    pass, what :func:`treellm.otlp.normalize_traces_data` makes of :func:`raw_traces_data` but
    without building the raw document first (the collector's request path).

    Checked here, per span, by the bounds of the rule table: ids (size, not all zero; an all-zero
    or empty parent is none), times within int64, the end not before the start, kind and status
    code, event times, link ids, and values nested deeper than :data:`MAX_VALUE_DEPTH`; protobuf's
    own types settle the rest (strings, booleans, 64-bit integers, uint32 counts). A span that
    breaks a rule is rejected alone with the validator's reason. Repeated attribute keys of a span,
    an event or a link are left as sent: the store's check flags them when the line is ingested and
    the validator keeps the last value and records the key there (:mod:`treellm.store.ingest`).
    Returns None when a resource's or a scope's attributes repeat a key or nest too deep (the
    caller takes the validator's road for the whole message). Pure.
    """
    total = rejected = 0
    reasons: list[str] = []
    resource_spans_out: list[JsonObject] = []
    for r, rs in enumerate(message.resource_spans):
        resource = rs.resource
        if _repeats_a_key(resource.attributes):
            return None
        try:
            resource_out = _with_dropped(
                {"attributes": _canonical_attributes(resource.attributes, 0)},
                "droppedAttributesCount",
                resource.dropped_attributes_count,
            )
        except _Refused:
            return None
        scope_spans_out: list[JsonObject] = []
        for s, ss in enumerate(rs.scope_spans):
            scope = ss.scope
            if _repeats_a_key(scope.attributes):
                return None
            try:
                scope_out = _canonical_scope(scope)
            except _Refused:
                return None
            spans_out: list[JsonObject] = []
            for i, span in enumerate(ss.spans):
                total += 1
                try:
                    spans_out.append(_canonical_span(span))
                    continue
                except _Refused:
                    pass
                problem = span_problem(_proto_span(span))
                if problem is None:  # the two readings disagree: the validator decides, for every span
                    return None
                rejected += 1
                if max_reasons is None or len(reasons) < max_reasons:
                    reasons.append(f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}].{problem}")
            if spans_out:
                scope_spans_out.append(with_schema({"scope": scope_out, "spans": spans_out}, ss.schema_url))
        if scope_spans_out:
            resource_spans_out.append(
                with_schema({"resource": resource_out, "scopeSpans": scope_spans_out}, rs.schema_url)
            )
    traces_data = {"resourceSpans": resource_spans_out} if resource_spans_out else None
    return Normalized(traces_data, total, rejected, tuple(reasons))


def _repeats_a_key(values: Sequence[Any]) -> bool:
    return len(values) > 1 and len({kv.key for kv in values}) < len(values)


def _canonical_scope(scope: Any) -> JsonObject:
    out: JsonObject = {"name": scope.name}
    if scope.version:
        out["version"] = scope.version
    if scope.attributes:
        out["attributes"] = _canonical_attributes(scope.attributes, 0)
    return _with_dropped(out, "droppedAttributesCount", scope.dropped_attributes_count)


def _canonical_attributes(values: Sequence[Any], depth: int) -> list[JsonObject]:
    """``KeyValue`` messages as canonical OTLP/JSON, as sent (a repeated key stays repeated)."""
    out = []
    for kv in values:
        value = kv.value
        which = value.WhichOneof("value")
        if which == "string_value":
            out.append({"key": kv.key, "value": {"stringValue": value.string_value}})
        else:
            out.append({"key": kv.key, "value": _canonical_any(value, which, depth)})
    return out


def _canonical_any(value: Any, which: str | None, depth: int) -> JsonObject:
    if which == "string_value":
        return {"stringValue": value.string_value}
    if which == "int_value":
        return {"intValue": str(value.int_value)}
    if which == "bool_value":
        return {"boolValue": value.bool_value}
    if which == "double_value":
        return any_value(float(value.double_value))
    if which == "bytes_value":
        return any_value(bytes(value.bytes_value))
    if which == "array_value":
        values = value.array_value.values
        if values and depth >= MAX_VALUE_DEPTH:
            raise _Refused
        return {"arrayValue": {"values": [_canonical_any(v, v.WhichOneof("value"), depth + 1) for v in values]}}
    if which == "kvlist_value":
        entries = value.kvlist_value.values
        if entries and depth >= MAX_VALUE_DEPTH:
            raise _Refused
        return {"kvlistValue": {"values": _canonical_attributes(entries, depth + 1)}}
    return {}  # unset, or a string-table index (meaningful only in profiles)


def _canonical_span(span: Any) -> JsonObject:
    """One span checked and canonical; :class:`_Refused` when it breaks a rule."""
    trace_id, span_id, parent = span.trace_id, span.span_id, span.parent_span_id
    if len(trace_id) != _TRACE_BYTES or trace_id == _ZERO_TRACE or len(span_id) != _SPAN_BYTES or span_id == _ZERO_SPAN:
        raise _Refused
    if parent and len(parent) != _SPAN_BYTES:
        raise _Refused
    kind, start, end, code = span.kind, span.start_time_unix_nano, span.end_time_unix_nano, span.status.code
    if (
        start > _TIME_MAX
        or end > _TIME_MAX
        or end < start
        or not 0 <= kind <= _KIND_MAX
        or not 0 <= code <= _STATUS_MAX
    ):
        raise _Refused
    out: JsonObject = {"traceId": trace_id.hex(), "spanId": span_id.hex()}
    if span.trace_state:
        out["traceState"] = span.trace_state
    if parent and parent != _ZERO_SPAN:
        out["parentSpanId"] = parent.hex()
    out["flags"] = span.flags
    out["name"] = span.name
    out["kind"] = kind
    out["startTimeUnixNano"] = str(start)
    out["endTimeUnixNano"] = str(end)
    out["attributes"] = _canonical_attributes(span.attributes, 0)
    _with_dropped(out, "droppedAttributesCount", span.dropped_attributes_count)
    out["events"] = [_canonical_event(e) for e in span.events] if span.events else []
    _with_dropped(out, "droppedEventsCount", span.dropped_events_count)
    out["links"] = [_canonical_link(x) for x in span.links] if span.links else []
    _with_dropped(out, "droppedLinksCount", span.dropped_links_count)
    status: JsonObject = {"code": code}
    if span.status.message:
        status["message"] = span.status.message
    out["status"] = status
    return out


def _canonical_event(event: Any) -> JsonObject:
    time = event.time_unix_nano
    if time > _EVENT_TIME_MAX:
        raise _Refused
    out: JsonObject = {
        "timeUnixNano": str(time),
        "name": event.name,
        "attributes": _canonical_attributes(event.attributes, 0),
    }
    return _with_dropped(out, "droppedAttributesCount", event.dropped_attributes_count)


def _canonical_link(link: Any) -> JsonObject:
    trace_id, span_id = link.trace_id, link.span_id
    if (len(trace_id) != _LINK_TRACE_BYTES or trace_id == _ZERO_LINK_TRACE or len(span_id) != _LINK_SPAN_BYTES
            or span_id == _ZERO_LINK_SPAN):  # fmt: skip
        raise _Refused
    out: JsonObject = {
        "traceId": trace_id.hex(),
        "spanId": span_id.hex(),
        "attributes": _canonical_attributes(link.attributes, 0),
        "flags": link.flags,
    }
    if link.trace_state:
        out["traceState"] = link.trace_state
    return _with_dropped(out, "droppedAttributesCount", link.dropped_attributes_count)
