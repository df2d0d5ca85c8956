"""Pure decoding of OTLP/HTTP trace and metrics requests into journal lines. No I/O.

Contract:

- :func:`decode_request` takes a whole (decompressed) request body, protobuf or JSON,
  and returns :class:`Decoded`: the accepted spans as OTLP/JSON ``TracesData`` lines in
  the store's canonical encoding (the one :mod:`treellm.otlp` and
  :func:`~treellm.store.formats.otlp_proto.proto_to_traces_data` write: lowercase hex ids, 64-bit
  integers as decimal strings, ``AnyValue`` objects, integer enums), ready for the
  journal and for :func:`~treellm.store.ingest_file`; and how many spans were rejected
  and why. Deterministic; the body is never mutated.
- A body that cannot be decoded at all (not protobuf / not JSON, the request's
  structure is wrong: ``resourceSpans`` not a list, a resource or scope of the wrong
  shape) raises :class:`BadRequest` (HTTP 400, never retried). A span that decodes
  but cannot be stored is rejected alone (HTTP 200 with ``partial_success``): a trace or
  span id of the wrong size or all zero, a kind outside 0-5, a status code outside 0-2,
  a time above the int64 range, a field of the wrong JSON type, an attribute value
  nested too deep. Whatever is accepted is ingestable: the journal never holds a line
  the store would refuse.
- Protobuf is parsed and checked here, then converted by
  :func:`~treellm.store.formats.otlp_proto.proto_to_traces_data`; JSON is rebuilt field by field by
  :mod:`treellm.collector.otlp_json` (the OTLP/JSON rules are listed there).
- A request's spans become lines of at most :data:`LINE_SPANS` spans and
  :data:`LINE_BYTES` bytes (the ingester reads lines of up to 64 MiB; smaller lines keep
  its memory low). A single span above :data:`LINE_BYTES` once encoded is rejected.
- :func:`decode_metrics_request` does the same for ``/v1/metrics``: one line per data point,
  a row of :mod:`treellm.store.metrics` (converted and checked there), rejected points
  counted apart, an undecodable body a :class:`BadRequest`.
- :func:`decompress` inflates ``gzip`` / ``deflate`` bodies without ever holding more
  than ``limit + 1`` bytes of output: a compression bomb raises :class:`PayloadTooLarge`
  (HTTP 413) as soon as it crosses the limit; a truncated or corrupt stream raises
  :class:`BadRequest`.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from google.protobuf.unknown_fields import UnknownFieldSet  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from treellm.collector.errors import BadRequest, PayloadTooLarge
from treellm.collector.otlp_json import JsonObject, normalize_request
from treellm.errors import IngestError
from treellm.otlp import json_line
from treellm.store.formats.otlp_proto import proto_to_traces_data
from treellm.store.metrics import (
    metrics_request_from_json,
    metrics_request_from_protobuf,
    point_line,
    points_from_request,
)

__all__ = [
    "LINE_BYTES",
    "LINE_SPANS",
    "Decoded",
    "Encoding",
    "decode_json",
    "decode_metrics_request",
    "decode_protobuf",
    "decode_request",
    "decompress",
]

Encoding = Literal["protobuf", "json"]

LINE_SPANS: Final = 1000
LINE_BYTES: Final = 16 * 1024 * 1024
MAX_REASONS: Final = 5

_INT64_MAX: Final = 2**63 - 1
_MAX_KIND: Final = 5  # SPAN_KIND_CONSUMER
_MAX_STATUS: Final = 2  # STATUS_CODE_ERROR
_ZERO_TRACE: Final = bytes(16)
_ZERO_SPAN: Final = bytes(8)


@dataclass(frozen=True, slots=True)
class Decoded:
    """What one request holds: the accepted spans as journal lines, and the rejected ones."""

    lines: tuple[bytes, ...]
    accepted: int
    rejected: int
    reasons: tuple[str, ...] = ()
    unit: str = "span"

    def error_message(self) -> str:
        """The ``partial_success.error_message``: the count and the first reasons."""
        if not self.rejected:
            return ""
        shown = "; ".join(self.reasons[:MAX_REASONS])
        more = f"; and {self.rejected - MAX_REASONS} more" if self.rejected > MAX_REASONS else ""
        return f"{self.rejected} {self.unit}(s) rejected: {shown}{more}"


# --- the whole request --------------------------------------------------------------------------------


def decode_request(body: bytes, encoding: Encoding) -> Decoded:
    """Decode one request body (see the module docstring)."""
    return decode_protobuf(body) if encoding == "protobuf" else decode_json(body)


def _note(reasons: list[str], reason: str) -> None:
    """Keep the first reasons only (a request of a million bad spans keeps five)."""
    if len(reasons) < MAX_REASONS:
        reasons.append(reason)


def _finish(docs: list[JsonObject], total: int, rejected: int, reasons: list[str]) -> Decoded:
    lines: list[bytes] = []
    for doc in docs:
        for line, spans in _encode(doc):
            if line is None:
                rejected += spans
                _note(reasons, f"a span is above the {LINE_BYTES // 2**20} MiB limit of one journal line once encoded")
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
                    _note(reasons, f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}].{problem}")
            for i in reversed(bad):
                del spans[i]
            rejected += len(bad)
    if rejected or len(UnknownFieldSet(request)):
        request.DiscardUnknownFields()  # ignored, as proto3 says (the converter refuses unknown top-level fields)
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
        return f"traceId: expected 16 bytes, not all zero, got {_shown(trace_id)}"
    span_id = span.span_id
    if len(span_id) != 8 or span_id == _ZERO_SPAN:
        return f"spanId: expected 8 bytes, not all zero, got {_shown(span_id)}"
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


def _shown(value: bytes) -> str:
    if not value:
        return "none"
    return value.hex() if len(value) <= 32 else f"{len(value)} bytes"


def _has_spans(doc: JsonObject) -> bool:
    return any(ss["spans"] for rs in doc["resourceSpans"] for ss in rs["scopeSpans"])


# --- JSON -----------------------------------------------------------------------------------------------


def decode_json(body: bytes) -> Decoded:
    """An ``application/json`` body: an OTLP/JSON ``ExportTraceServiceRequest``."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"not valid JSON: {exc}") from None
    normalized = normalize_request(doc, max_reasons=MAX_REASONS)
    docs = [normalized.traces_data] if normalized.traces_data is not None else []
    return _finish(docs, normalized.total, normalized.rejected, list(normalized.reasons))


# --- metrics -------------------------------------------------------------------------------------------


def decode_metrics_request(body: bytes, encoding: Encoding) -> Decoded:
    """A ``/v1/metrics`` body, protobuf or OTLP/JSON ``ExportMetricsServiceRequest``: one journal line
    per data point (:func:`~treellm.store.metrics.point_line`); a point the store cannot hold, or
    one above :data:`LINE_BYTES` once encoded, is rejected alone. An undecodable body raises
    :class:`BadRequest`."""
    parse = metrics_request_from_protobuf if encoding == "protobuf" else metrics_request_from_json
    try:
        request = parse(body)
    except IngestError as exc:
        raise BadRequest(exc.reason) from None
    batch = points_from_request(request, max_reasons=MAX_REASONS)
    reasons = list(batch.reasons)
    rejected = batch.rejected
    lines = []
    for point in batch.points:
        line = point_line(point)
        if len(line) > LINE_BYTES:
            rejected += 1
            _note(reasons, f"a data point of {point.metric_name} is above the {LINE_BYTES // 2**20} MiB line limit")
        else:
            lines.append(line)
    return Decoded(tuple(lines), batch.total - rejected, rejected, tuple(reasons), unit="data point")


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
