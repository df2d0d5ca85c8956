"""Pure decoding of OTLP/HTTP trace and metrics requests into journal lines. No I/O.

Contract:

- :func:`decode_request` takes a whole (decompressed) request body, protobuf or JSON,
  and returns :class:`Decoded`: the accepted spans as OTLP/JSON ``TracesData`` lines in
  the store's canonical encoding (the one :mod:`treellm.otlp` and
  :func:`~treellm.derive.formats.otlp_proto.proto_to_traces_data` write: lowercase hex ids, 64-bit
  integers as decimal strings, ``AnyValue`` objects, integer enums), ready for the
  journal and for :func:`~treellm.store.ingest_file`; and how many spans were rejected
  and why. Deterministic; the body is never mutated.
- A body that cannot be decoded at all (not protobuf / not JSON, the request's
  structure is wrong: ``resourceSpans`` not a list, a resource or scope of the wrong
  shape) raises :class:`BadRequest` (HTTP 400, never retried). A span that decodes
  but cannot be stored is rejected alone (HTTP 200 with ``partial_success``, the count
  and the first reasons, each naming the span and its field, in the validator's words).
  Whatever is accepted is ingestable: the journal never holds a line the store would refuse.
- Protobuf (the fast road) is checked and made canonical in one pass over the parsed message
  by :func:`~treellm.derive.formats.otlp_proto.canonical_traces_data`: ids, times, kinds, status
  codes, event times, link ids and value depth by the bounds of the one rule table
  (:mod:`treellm.otlp.validate`), with no raw document rebuilt by the validator. Repeated
  attribute keys of a span, an event or a link are journaled as sent: the store's check flags
  them when the flusher ingests the line, and the validator keeps the last value and records
  the key there (:mod:`treellm.store.ingest`), as it would have here. A resource's or scope's
  repeated keys send the message down the validator's road at once
  (:func:`~treellm.derive.formats.otlp_proto.raw_traces_data`, then
  :func:`treellm.otlp.normalize_traces_data`).
- JSON is parsed and rebuilt by the one validator, :func:`treellm.otlp.normalize_traces_data`
  (:mod:`treellm.collector.otlp_json`): its rebuild is the canonical line itself, and OTLP/JSON
  can break per-attribute rules that protobuf's types rule out (a string as a boolean, two values
  in one ``AnyValue``), so they are judged here and answered in the ``partial_success``.
- A request's spans become lines of at most :data:`LINE_SPANS` spans and
  :data:`LINE_BYTES` bytes (the ingester reads lines of up to 64 MiB; smaller lines keep
  its memory low). A single span above :data:`LINE_BYTES` once encoded is rejected.
- :func:`decode_metrics_request` does the same for ``/v1/metrics``: one line per data point,
  a row of :mod:`treellm.store.metric_points` (converted and checked there), rejected points
  counted apart, an undecodable body a :class:`BadRequest`.
- :func:`decompress` inflates ``gzip`` / ``deflate`` bodies without ever holding more
  than ``limit + 1`` bytes of output: a compression bomb raises :class:`PayloadTooLarge`
  (HTTP 413) as soon as it crosses the limit; a truncated or corrupt stream raises
  :class:`BadRequest`.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final, Literal

import orjson
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from treellm.collector.errors import BadRequest, PayloadTooLarge
from treellm.collector.otlp_json import JsonObject, normalize_request
from treellm.derive.formats.otlp_proto import canonical_traces_data, raw_traces_data
from treellm.errors import IngestError
from treellm.otlp import json_line
from treellm.store.metric_points import (
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
    """An ``application/x-protobuf`` body: a serialized ``ExportTraceServiceRequest``, converted
    field by field to raw OTLP/JSON and then checked by the same validator as the JSON path."""
    try:
        request = ExportTraceServiceRequest.FromString(body)
    except DecodeError as exc:
        raise BadRequest(f"not a protobuf ExportTraceServiceRequest: {exc}") from None
    normalized = canonical_traces_data(request, max_reasons=MAX_REASONS)
    if normalized is None:  # a resource's or scope's attributes repeat a key: the validator's road
        normalized = normalize_request(raw_traces_data(request), max_reasons=MAX_REASONS)
    docs = [normalized.traces_data] if normalized.traces_data is not None else []
    return _finish(docs, normalized.total, normalized.rejected, list(normalized.reasons))


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
    per data point (:func:`~treellm.store.metric_points.point_line`); a point the store cannot hold, or
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


def decompress(
    data: bytes,
    coding: Literal["identity", "gzip", "deflate"],
    limit: int,
    *,
    inflater: Callable[[int], zlib._Decompress] = zlib.decompressobj,
) -> bytes:
    """``data`` decoded from its HTTP content coding, never holding more than ``limit + 1`` bytes.

    The work is linear in ``len(data)`` whatever the number of gzip members (see
    :func:`_inflate`). ``inflater(wbits)`` makes each member's decompressor (a seam: tests
    count the bytes it is fed).
    """
    if coding == "identity":
        if len(data) > limit:
            raise PayloadTooLarge(f"the body is above the {limit}-byte limit", limit=limit)
        return data
    wbits = 16 + zlib.MAX_WBITS if coding == "gzip" else zlib.MAX_WBITS
    try:
        return _inflate(data, wbits, limit, coding, inflater=inflater)
    except zlib.error as exc:
        if coding == "deflate":  # some clients send raw deflate instead of the zlib format HTTP names
            try:
                return _inflate(data, -zlib.MAX_WBITS, limit, coding, inflater=inflater)
            except zlib.error:
                pass
        raise BadRequest(f"corrupt {coding} body: {exc}") from None


def _inflate(data: bytes, wbits: int, limit: int, coding: str, *, inflater: Callable[[int], zlib._Decompress]) -> bytes:
    """Inflate ``data`` (gzip: member after member) in windows of the input, never re-slicing it.

    zlib copies the input left over at the end of a member (``unused_data``) and the input
    left when the output limit stops it (``unconsumed_tail``): handing it the whole rest of
    the body made a body of many small members cost the square of its size (4 MiB of empty
    members: 30 s). Each member is instead fed windows of a memoryview that start at 256
    bytes and double up to 64 KiB, so what zlib copies is bounded by the member's own size
    (plus 256 bytes): the work is linear in the body, and a large member is still read in
    64 KiB steps.
    """
    first_window, last_window = 256, 64 * 1024
    source = memoryview(data)
    out = bytearray()
    position = 0  # the first byte not yet given to the inflater
    window = first_window
    stream = inflater(wbits)
    pending: bytes | memoryview = b""  # given to the inflater, not consumed: source[position - len(pending):position]
    while True:
        if not pending:
            if position == len(data):
                out += stream.flush()
                if len(out) > limit:
                    raise PayloadTooLarge(f"the body is above the {limit}-byte limit once decompressed", limit=limit)
                if not stream.eof:
                    raise BadRequest(f"truncated {coding} body: the stream ends early")
                return bytes(out)
            pending = source[position : position + window]
            position += len(pending)
            window = min(window * 2, last_window)
        out += stream.decompress(pending, limit + 1 - len(out))
        if len(out) > limit:
            raise PayloadTooLarge(f"the body is above the {limit}-byte limit once decompressed", limit=limit)
        if stream.eof:
            position -= len(stream.unused_data)  # the next member starts there
            if position == len(data):
                return bytes(out)
            if coding != "gzip":
                raise BadRequest(f"{len(data) - position} byte(s) after the end of the {coding} stream")
            stream, pending, window = inflater(wbits), b"", first_window  # gzip allows members one after another
            continue
        pending = stream.unconsumed_tail
