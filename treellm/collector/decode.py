"""Pure decoding of OTLP/HTTP trace requests into journal lines. No I/O.

Contract:

- :func:`decode_request` takes a whole (decompressed) request body, protobuf or JSON,
  and returns :class:`Decoded`: the accepted spans as OTLP/JSON ``TracesData`` lines in
  the store's canonical encoding (the one :mod:`treellm.otlp` and
  :func:`~treellm.store.foreign.proto_to_traces_data` write: lowercase hex ids, 64-bit
  integers as decimal strings, ``AnyValue`` objects, integer enums), ready for the
  journal and for :func:`~treellm.store.ingest_file`; and how many spans were rejected
  and why. Deterministic; the body is never mutated.
- A body that cannot be decoded at all (not protobuf / not JSON, the request's
  structure is wrong: ``resourceSpans`` not a list, a resource or scope of the wrong
  shape) raises :class:`BadRequest` (HTTP 400, never retried). A span that decodes
  but cannot be stored is rejected alone (HTTP 200 with ``partial_success``): a trace or
  span id of the wrong size or all zero, a kind outside 0-5, a status code outside 0-2,
  a time above the int64 range, a field of the wrong JSON type, an attribute value
  nested deeper than :data:`MAX_VALUE_DEPTH`. Whatever is accepted is ingestable: the
  journal never holds a line the store would refuse.
- JSON follows the OTLP/JSON rules (https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding):
  hex ids (case-insensitive), integer enums (enum names are rejected), 64-bit integers
  as numbers or decimal strings, lowerCamelCase keys, unknown fields ignored, ``null``
  as the field's default.
- A request's spans become lines of at most :data:`LINE_SPANS` spans and
  :data:`LINE_BYTES` bytes (the ingester reads lines of up to 64 MiB; smaller lines keep
  its memory low). A single span above :data:`LINE_BYTES` once encoded is rejected.
- :func:`decompress` inflates ``gzip`` / ``deflate`` bodies without ever holding more
  than ``limit + 1`` bytes of output: a compression bomb raises :class:`PayloadTooLarge`
  (HTTP 413) as soon as it crosses the limit; a truncated or corrupt stream raises
  :class:`BadRequest`.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from google.protobuf.unknown_fields import UnknownFieldSet  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from treellm.collector.errors import BadRequest, PayloadTooLarge
from treellm.errors import IngestError
from treellm.otlp import json_line
from treellm.store.foreign import proto_to_traces_data

__all__ = [
    "LINE_BYTES",
    "LINE_SPANS",
    "MAX_VALUE_DEPTH",
    "Decoded",
    "Encoding",
    "decode_json",
    "decode_protobuf",
    "decode_request",
    "decompress",
]

Encoding = Literal["protobuf", "json"]
JsonObject = dict[str, Any]

LINE_SPANS: Final = 1000
LINE_BYTES: Final = 16 * 1024 * 1024
MAX_VALUE_DEPTH: Final = 32
MAX_REASONS: Final = 5

_INT64_MAX: Final = 2**63 - 1
_INT64_MIN: Final = -(2**63)
_UINT32_MAX: Final = 2**32 - 1
_MAX_KIND: Final = 5  # SPAN_KIND_CONSUMER
_MAX_STATUS: Final = 2  # STATUS_CODE_ERROR
_ZERO_TRACE: Final = bytes(16)
_ZERO_SPAN: Final = bytes(8)
_HEX: Final = frozenset("0123456789abcdefABCDEF")
_DECIMAL: Final = re.compile(r"-?[0-9]{1,20}")
_VALUE_KEYS: Final = (
    "stringValue", "boolValue", "intValue", "doubleValue", "arrayValue", "kvlistValue", "bytesValue",
)  # fmt: skip
_SPECIAL_DOUBLES: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


@dataclass(frozen=True, slots=True)
class Decoded:
    """What one request holds: the accepted spans as journal lines, and the rejected ones."""

    lines: tuple[bytes, ...]
    accepted: int
    rejected: int
    reasons: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return sum(len(line) for line in self.lines)

    def error_message(self) -> str:
        """The ``partial_success.error_message``: the count and the first reasons."""
        if not self.rejected:
            return ""
        shown = "; ".join(self.reasons[:MAX_REASONS])
        more = f"; and {self.rejected - MAX_REASONS} more" if self.rejected > MAX_REASONS else ""
        return f"{self.rejected} span(s) rejected: {shown}{more}"


class _Invalid(Exception):
    """Why one field cannot be stored; becomes a rejected span or a BadRequest."""


def _kind_of(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {shown!r}"
    if isinstance(value, list):
        return "a list"
    return "an object"


# --- the whole request --------------------------------------------------------------------------------


def decode_request(body: bytes, encoding: Encoding) -> Decoded:
    """Decode one request body (see the module docstring)."""
    return decode_protobuf(body) if encoding == "protobuf" else decode_json(body)


def _finish(docs: list[JsonObject], total: int, rejected: int, reasons: list[str]) -> Decoded:
    lines: list[bytes] = []
    for doc in docs:
        for line, spans in _encode(doc):
            if line is None:
                rejected += spans
                reasons.append(f"a span is above the {LINE_BYTES // 2**20} MiB limit of one journal line once encoded")
            else:
                lines.append(line)
    return Decoded(tuple(lines), total - rejected, rejected, tuple(reasons))


# --- protobuf -------------------------------------------------------------------------------------------


def decode_protobuf(body: bytes) -> Decoded:
    """An ``application/x-protobuf`` body: a serialized ``ExportTraceServiceRequest``."""
    try:
        request = ExportTraceServiceRequest.FromString(body)
    except DecodeError as exc:
        raise BadRequest(f"not a protobuf ExportTraceServiceRequest: {exc}") from None
    total = 0
    reasons: list[str] = []
    rejected = 0
    for r, resource_spans in enumerate(request.resource_spans):
        for s, scope_spans in enumerate(resource_spans.scope_spans):
            spans = scope_spans.spans
            total += len(spans)
            bad = []
            for i, span in enumerate(spans):
                problem = _proto_span_problem(span)
                if problem is not None:
                    bad.append(i)
                    reasons.append(f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}].{problem}")
            for i in reversed(bad):
                del spans[i]
            rejected += len(bad)
    if rejected or len(UnknownFieldSet(request)):
        request.DiscardUnknownFields()  # unknown fields are ignored (proto3); the converter refuses them on top
        body = request.SerializeToString()
    try:
        docs = [doc for doc in proto_to_traces_data(body, path="request") if _has_spans(doc)]
    except IngestError as exc:  # our checks above let through something the converter refuses
        raise BadRequest(exc.reason) from None
    return _finish(docs, total, rejected, reasons)


def _proto_span_problem(span: Any) -> str | None:
    """Why a protobuf ``Span`` cannot be stored, or None."""
    trace_id = span.trace_id
    if len(trace_id) != 16 or trace_id == _ZERO_TRACE:
        return f"traceId: expected 16 bytes, not all zero, got {trace_id.hex() or 'none'}"
    span_id = span.span_id
    if len(span_id) != 8 or span_id == _ZERO_SPAN:
        return f"spanId: expected 8 bytes, not all zero, got {span_id.hex() or 'none'}"
    parent = span.parent_span_id
    if parent and len(parent) != 8 and any(parent):
        return f"parentSpanId: expected 8 bytes, got {len(parent)}"
    if not 0 <= span.kind <= _MAX_KIND:
        return f"kind: expected 0-{_MAX_KIND}, got {span.kind}"
    if span.start_time_unix_nano > _INT64_MAX or span.end_time_unix_nano > _INT64_MAX:
        return "startTimeUnixNano/endTimeUnixNano: above the int64 range"
    if not 0 <= span.status.code <= _MAX_STATUS:
        return f"status.code: expected 0-{_MAX_STATUS}, got {span.status.code}"
    for i, link in enumerate(span.links):
        if len(link.trace_id) != 16 or link.trace_id == _ZERO_TRACE:
            return f"links[{i}].traceId: expected 16 bytes, not all zero"
        if len(link.span_id) != 8 or link.span_id == _ZERO_SPAN:
            return f"links[{i}].spanId: expected 8 bytes, not all zero"
    return None


def _has_spans(doc: JsonObject) -> bool:
    return any(ss["spans"] for rs in doc["resourceSpans"] for ss in rs["scopeSpans"])


# --- JSON -----------------------------------------------------------------------------------------------


def decode_json(body: bytes) -> Decoded:
    """An ``application/json`` body: an OTLP/JSON ``ExportTraceServiceRequest``."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest(f"expected an ExportTraceServiceRequest object, got {_kind_of(doc)}")
    total = rejected = 0
    reasons: list[str] = []
    resource_spans_out: list[JsonObject] = []
    for r, rs in enumerate(_structure_list(doc.get("resourceSpans"), "resourceSpans")):
        where = f"resourceSpans[{r}]"
        rs_obj = _structure_object(rs, where)
        resource = _structure(_resource, rs_obj.get("resource"), f"{where}.resource")
        scope_spans_out: list[JsonObject] = []
        for s, ss in enumerate(_structure_list(rs_obj.get("scopeSpans"), f"{where}.scopeSpans")):
            where_ss = f"{where}.scopeSpans[{s}]"
            ss_obj = _structure_object(ss, where_ss)
            scope = _structure(_scope, ss_obj.get("scope"), f"{where_ss}.scope")
            spans_out: list[JsonObject] = []
            for i, span in enumerate(_structure_list(ss_obj.get("spans"), f"{where_ss}.spans")):
                total += 1
                try:
                    spans_out.append(_span(span))
                except _Invalid as exc:
                    rejected += 1
                    reasons.append(f"{where_ss}.spans[{i}].{exc}")
            if spans_out:
                schema = _structure(_text, ss_obj.get("schemaUrl"), f"{where_ss}.schemaUrl")
                scope_spans_out.append(_with_schema({"scope": scope, "spans": spans_out}, schema))
        if scope_spans_out:
            schema = _structure(_text, rs_obj.get("schemaUrl"), f"{where}.schemaUrl")
            resource_spans_out.append(_with_schema({"resource": resource, "scopeSpans": scope_spans_out}, schema))
    docs = [{"resourceSpans": resource_spans_out}] if resource_spans_out else []
    return _finish(docs, total, rejected, reasons)


def _structure(convert: Any, value: object, where: str) -> Any:
    try:
        return convert(value)
    except _Invalid as exc:
        raise BadRequest(str(exc), field=where) from None


def _structure_list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadRequest(f"expected a list, got {_kind_of(value)}", field=where)
    return value


def _structure_object(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"expected an object, got {_kind_of(value)}", field=where)
    return value


def _object(value: object, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Invalid(f"{what}: expected an object, got {_kind_of(value)}")
    return value


def _list(value: object, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Invalid(f"{what}: expected a list, got {_kind_of(value)}")
    return value


def _text(value: object, what: str = "value") -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _Invalid(f"{what}: expected a string, got {_kind_of(value)}")
    return value


def _integer(value: object, what: str, low: int, high: int) -> int:
    """An integer field: a JSON number, or (64-bit fields) a decimal string."""
    if value is None:
        return 0
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and _DECIMAL.fullmatch(value):
        number = int(value)
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    if number is None:
        raise _Invalid(f"{what}: expected an integer, got {_kind_of(value)}")
    if not low <= number <= high:
        raise _Invalid(f"{what}: expected {low}..{high}, got {number}")
    return number


def _enum(value: object, what: str, high: int) -> int:
    if isinstance(value, str):
        raise _Invalid(f"{what}: expected an integer 0-{high} (OTLP/JSON forbids enum names), got {_kind_of(value)}")
    return _integer(value, what, 0, high)


def _hex_id(value: object, what: str, digits: int) -> str:
    if not isinstance(value, str) or len(value) != digits or not set(value) <= _HEX or value.strip("0") == "":
        raise _Invalid(f"{what}: expected {digits} hex digits, not all zero, got {_kind_of(value)}")
    return value.lower()


def _parent_id(value: object) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.strip("0") == "" and set(value) <= _HEX:
        return None  # an all-zero parent means none, as in protobuf
    return _hex_id(value, "parentSpanId", 16)


def _double(value: object, what: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        if value in _SPECIAL_DOUBLES:
            return _SPECIAL_DOUBLES[value]
        try:
            number = float(value)
        except ValueError:
            pass
        else:
            if math.isfinite(number):
                return number
    raise _Invalid(f"{what}: expected a number, got {_kind_of(value)}")


def _double_value(number: float) -> JsonObject:
    if math.isfinite(number):
        return {"doubleValue": number}
    if math.isnan(number):
        return {"doubleValue": "NaN"}
    return {"doubleValue": "Infinity" if number > 0 else "-Infinity"}


def _bytes_value(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise _Invalid(f"{what}: expected base64 text, got {_kind_of(value)}")
    try:
        raw = base64.b64decode(value.replace("-", "+").replace("_", "/") + "=" * (-len(value) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise _Invalid(f"{what}: expected base64 text, got {_kind_of(value)}") from None
    return base64.b64encode(raw).decode("ascii")


def _any(value: object, what: str, depth: int) -> JsonObject:
    """One ``AnyValue`` in canonical form."""
    if depth > MAX_VALUE_DEPTH:
        raise _Invalid(f"{what}: nested deeper than {MAX_VALUE_DEPTH} levels")
    obj = _object(value, what)
    present = [key for key in _VALUE_KEYS if obj.get(key) is not None]
    if not present:
        return {}
    if len(present) > 1:
        raise _Invalid(f"{what}: expected one value, got {', '.join(present)}")
    key = present[0]
    item = obj[key]
    where = f"{what}.{key}"
    if key == "stringValue":
        return {"stringValue": _text(item, where)}
    if key == "boolValue":
        if not isinstance(item, bool):
            raise _Invalid(f"{where}: expected true or false, got {_kind_of(item)}")
        return {"boolValue": item}
    if key == "intValue":
        return {"intValue": str(_integer(item, where, _INT64_MIN, _INT64_MAX))}
    if key == "doubleValue":
        return _double_value(_double(item, where))
    if key == "arrayValue":
        values = _list(_object(item, where).get("values"), f"{where}.values")
        return {"arrayValue": {"values": [_any(v, f"{where}.values[{i}]", depth + 1) for i, v in enumerate(values)]}}
    if key == "kvlistValue":
        values = _list(_object(item, where).get("values"), f"{where}.values")
        return {"kvlistValue": {"values": _key_values(values, f"{where}.values", depth + 1)}}
    return {"bytesValue": _bytes_value(item, where)}


def _key_values(values: list[Any], what: str, depth: int = 0) -> list[JsonObject]:
    out = []
    for i, kv in enumerate(values):
        where = f"{what}[{i}]"
        obj = _object(kv, where)
        out.append({"key": _text(obj.get("key"), f"{where}.key"), "value": _any(obj.get("value"), f"{where}.value", depth)})
    return out


def _attributes(value: object, what: str = "attributes") -> list[JsonObject]:
    return _key_values(_list(value, what), what)


def _with_dropped(out: JsonObject, key: str, value: object) -> JsonObject:
    count = _integer(value, key, 0, _UINT32_MAX)
    if count:
        out[key] = count
    return out


def _with_schema(out: JsonObject, schema_url: str) -> JsonObject:
    if schema_url:
        out["schemaUrl"] = schema_url
    return out


def _resource(value: object) -> JsonObject:
    obj = _object(value, "resource")
    out: JsonObject = {"attributes": _attributes(obj.get("attributes"))}
    return _with_dropped(out, "droppedAttributesCount", obj.get("droppedAttributesCount"))


def _scope(value: object) -> JsonObject:
    if value is None:
        return {}
    obj = _object(value, "scope")
    out: JsonObject = {"name": _text(obj.get("name"), "name")}
    version = _text(obj.get("version"), "version")
    if version:
        out["version"] = version
    attributes = _attributes(obj.get("attributes"))
    if attributes:
        out["attributes"] = attributes
    return _with_dropped(out, "droppedAttributesCount", obj.get("droppedAttributesCount"))


def _event(value: object, what: str) -> JsonObject:
    obj = _object(value, what)
    out: JsonObject = {
        "timeUnixNano": str(_integer(obj.get("timeUnixNano"), f"{what}.timeUnixNano", 0, _INT64_MAX)),
        "name": _text(obj.get("name"), f"{what}.name"),
        "attributes": _attributes(obj.get("attributes"), f"{what}.attributes"),
    }
    return _with_dropped(out, "droppedAttributesCount", obj.get("droppedAttributesCount"))


def _link(value: object, what: str) -> JsonObject:
    obj = _object(value, what)
    out: JsonObject = {
        "traceId": _hex_id(obj.get("traceId"), f"{what}.traceId", 32),
        "spanId": _hex_id(obj.get("spanId"), f"{what}.spanId", 16),
        "attributes": _attributes(obj.get("attributes"), f"{what}.attributes"),
        "flags": _integer(obj.get("flags"), f"{what}.flags", 0, _UINT32_MAX),
    }
    trace_state = _text(obj.get("traceState"), f"{what}.traceState")
    if trace_state:
        out["traceState"] = trace_state
    return _with_dropped(out, "droppedAttributesCount", obj.get("droppedAttributesCount"))


def _status(value: object) -> JsonObject:
    obj = _object(value, "status")
    out: JsonObject = {"code": _enum(obj.get("code"), "status.code", _MAX_STATUS)}
    message = _text(obj.get("message"), "status.message")
    if message:
        out["message"] = message
    return out


def _span(value: object) -> JsonObject:
    """One OTLP/JSON ``Span`` in canonical form (the shape of ``proto_to_traces_data``'s spans)."""
    if not isinstance(value, dict):
        raise _Invalid(f"span: expected an object, got {_kind_of(value)}")
    out: JsonObject = {
        "traceId": _hex_id(value.get("traceId"), "traceId", 32),
        "spanId": _hex_id(value.get("spanId"), "spanId", 16),
    }
    trace_state = _text(value.get("traceState"), "traceState")
    if trace_state:
        out["traceState"] = trace_state
    parent = _parent_id(value.get("parentSpanId"))
    if parent is not None:
        out["parentSpanId"] = parent
    out["flags"] = _integer(value.get("flags"), "flags", 0, _UINT32_MAX)
    out["name"] = _text(value.get("name"), "name")
    out["kind"] = _enum(value.get("kind"), "kind", _MAX_KIND)
    out["startTimeUnixNano"] = str(_integer(value.get("startTimeUnixNano"), "startTimeUnixNano", 0, _INT64_MAX))
    out["endTimeUnixNano"] = str(_integer(value.get("endTimeUnixNano"), "endTimeUnixNano", 0, _INT64_MAX))
    out["attributes"] = _attributes(value.get("attributes"))
    _with_dropped(out, "droppedAttributesCount", value.get("droppedAttributesCount"))
    out["events"] = [_event(e, f"events[{i}]") for i, e in enumerate(_list(value.get("events"), "events"))]
    _with_dropped(out, "droppedEventsCount", value.get("droppedEventsCount"))
    out["links"] = [_link(link, f"links[{i}]") for i, link in enumerate(_list(value.get("links"), "links"))]
    _with_dropped(out, "droppedLinksCount", value.get("droppedLinksCount"))
    out["status"] = _status(value.get("status"))
    return out


# --- lines ----------------------------------------------------------------------------------------------


def _span_count(doc: JsonObject) -> int:
    return sum(len(ss["spans"]) for rs in doc["resourceSpans"] for ss in rs["scopeSpans"])


def _chunks(doc: JsonObject, size: int) -> Iterator[JsonObject]:
    """``doc`` cut into documents of at most ``size`` spans, each span keeping its resource and scope."""
    out: list[JsonObject] = []
    count = 0
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            spans = ss["spans"]
            start = 0
            while start < len(spans):
                take = spans[start : start + size - count]
                piece = {**ss, "spans": take}
                if out and out[-1]["_rs"] is rs:
                    out[-1]["scopeSpans"].append(piece)
                else:
                    out.append({"_rs": rs, "scopeSpans": [piece]})
                count += len(take)
                start += len(take)
                if count == size:
                    yield _assemble(out)
                    out, count = [], 0
    if out:
        yield _assemble(out)


def _assemble(parts: list[JsonObject]) -> JsonObject:
    return {"resourceSpans": [{**part["_rs"], "scopeSpans": part["scopeSpans"]} for part in parts]}


def _encode(doc: JsonObject) -> Iterator[tuple[bytes | None, int]]:
    """(line, spans) for each line of ``doc``; (None, 1) for a span too large for any line."""
    total = _span_count(doc)
    if total > LINE_SPANS:
        for chunk in _chunks(doc, LINE_SPANS):
            yield from _encode(chunk)
        return
    line = json_line(doc)
    if len(line) <= LINE_BYTES:
        yield line, total
    elif total == 1:
        yield None, 1
    else:
        for chunk in _chunks(doc, (total + 1) // 2):
            yield from _encode(chunk)


# --- content coding -------------------------------------------------------------------------------------


def decompress(data: bytes, coding: Literal["identity", "gzip", "deflate"], limit: int) -> bytes:
    """``data`` decoded from its HTTP content coding, never holding more than ``limit + 1`` bytes."""
    if coding == "identity":
        if len(data) > limit:
            raise PayloadTooLarge(f"the body is above the {limit}-byte limit", limit=limit)
        return data
    wbits = 16 + zlib.MAX_WBITS if coding == "gzip" else zlib.MAX_WBITS
    try:
        return _inflate(data, wbits, limit, coding)
    except zlib.error as exc:
        if coding == "deflate":  # some clients send raw deflate instead of the zlib format HTTP names
            try:
                return _inflate(data, -zlib.MAX_WBITS, limit, coding)
            except zlib.error:
                pass
        raise BadRequest(f"corrupt {coding} body: {exc}") from None


def _inflate(data: bytes, wbits: int, limit: int, coding: str) -> bytes:
    out = bytearray()
    pending = data
    inflater = zlib.decompressobj(wbits)
    while True:
        out += inflater.decompress(pending, limit + 1 - len(out))
        if len(out) > limit:
            raise PayloadTooLarge(f"the body is above the {limit}-byte limit once decompressed", limit=limit)
        if inflater.eof:
            pending = inflater.unused_data
            if not pending:
                return bytes(out)
            if coding != "gzip":
                raise BadRequest(f"{len(pending)} byte(s) after the end of the {coding} stream")
            inflater = zlib.decompressobj(wbits)  # gzip allows several members one after the other
            continue
        pending = inflater.unconsumed_tail
        if not pending:
            out += inflater.flush()
            if len(out) > limit:
                raise PayloadTooLarge(f"the body is above the {limit}-byte limit once decompressed", limit=limit)
            if not inflater.eof:
                raise BadRequest(f"truncated {coding} body: the stream ends early")
            return bytes(out)
