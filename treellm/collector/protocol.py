"""The OTLP/HTTP wire rules of the receiver: request headers in, response bodies out. No I/O.

Follows the OTLP specification, "OTLP/HTTP"
(https://opentelemetry.io/docs/specs/otlp/#otlphttp; the source is
``specification/protocol/otlp.md`` in open-telemetry/opentelemetry-specification):

- "The server MUST use the same Content-Type in the response as it received in the
  request": protobuf answers ``application/x-protobuf``, JSON ``application/json``.
- Full success: ``200`` with an empty ``ExportTraceServiceResponse`` (``/v1/traces``) or
  ``ExportMetricsServiceResponse`` (``/v1/metrics``); partial success: ``200`` with
  ``partial_success`` holding ``rejected_spans`` (``rejected_data_points``) and a
  human-readable ``error_message``.
- Failures: "The response body for all HTTP 4xx and HTTP 5xx responses MUST be a
  Protobuf-encoded Status message" (``google.rpc.Status``; JSON-encoded for JSON
  requests); a ``400`` for bad data carries a ``google.rpc.BadRequest`` in ``details``.
- Throttling: ``429`` or ``503`` "and MAY include Retry-After"; clients retry only
  ``429``, ``502``, ``503`` and ``504``.

Requests whose ``Content-Type`` is neither protobuf nor JSON get a JSON ``Status``
(there is no request encoding to mirror).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Final, Literal

import orjson
from google.protobuf.any_pb2 import Any as AnyMessage  # type: ignore[import-untyped]
from google.rpc import code_pb2, error_details_pb2, status_pb2  # type: ignore[import-untyped]
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsPartialSuccess,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceResponse,
)

from treellm.collector.decode import Decoded, Encoding

__all__ = [
    "ContentCoding",
    "bearer_matches",
    "content_coding",
    "media_type",
    "metrics_success_body",
    "request_encoding",
    "status_body",
    "success_body",
]

ContentCoding = Literal["identity", "gzip", "deflate"]

_MEDIA: Final[dict[str, Encoding]] = {
    "application/x-protobuf": "protobuf",
    "application/protobuf": "protobuf",
    "application/json": "json",
}
_CODINGS: Final[dict[str, ContentCoding]] = {
    "": "identity",
    "identity": "identity",
    "gzip": "gzip",
    "x-gzip": "gzip",
    "deflate": "deflate",
}
# google.rpc.Code for each HTTP status the receiver sends (the spec does not use Status.code;
# it is filled for troubleshooting).
_GRPC_CODE: Final = {
    400: code_pb2.INVALID_ARGUMENT,
    401: code_pb2.UNAUTHENTICATED,
    404: code_pb2.NOT_FOUND,
    405: code_pb2.UNIMPLEMENTED,
    408: code_pb2.DEADLINE_EXCEEDED,
    413: code_pb2.RESOURCE_EXHAUSTED,
    415: code_pb2.INVALID_ARGUMENT,
    429: code_pb2.RESOURCE_EXHAUSTED,
    500: code_pb2.INTERNAL,
    503: code_pb2.UNAVAILABLE,
}
_BAD_REQUEST_TYPE: Final = "type.googleapis.com/google.rpc.BadRequest"


def request_encoding(content_type: str | None) -> Encoding | None:
    """``protobuf`` or ``json`` from a ``Content-Type`` header (parameters ignored), else None."""
    if not content_type:
        return None
    return _MEDIA.get(content_type.split(";", 1)[0].strip().lower())


def content_coding(header: str | None) -> ContentCoding | None:
    """The body's coding from ``Content-Encoding`` (absent means identity); None when unsupported."""
    return _CODINGS.get((header or "").strip().lower())


def media_type(encoding: Encoding) -> str:
    return "application/x-protobuf" if encoding == "protobuf" else "application/json"


def bearer_matches(authorization: bytes | None, token: str) -> bool:
    """Whether the raw ``Authorization`` header value is ``Bearer <token>``.

    Compared on bytes: the header as sent against the token's UTF-8, so a token with
    non-ASCII characters matches (a header decoded as Latin-1, as ASGI servers do, would
    not). Constant time: both sides are hashed first, so neither the first differing byte
    nor the token's length shows in the time taken.
    """
    if not authorization:
        return False
    scheme, _, credentials = authorization.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    given = hashlib.sha256(credentials.strip()).digest()
    return hmac.compare_digest(given, hashlib.sha256(token.encode("utf-8")).digest())


def success_body(encoding: Encoding, decoded: Decoded | None) -> bytes:
    """An ``ExportTraceServiceResponse``: empty on full success, ``partial_success`` otherwise."""
    if decoded is None or not decoded.rejected:
        return b"" if encoding == "protobuf" else b"{}"
    message = decoded.error_message()
    if encoding == "protobuf":
        partial = ExportTracePartialSuccess(rejected_spans=decoded.rejected, error_message=message)
        response: bytes = ExportTraceServiceResponse(partial_success=partial).SerializeToString()
        return response
    # int64 is a decimal string in the protobuf JSON mapping
    return orjson.dumps({"partialSuccess": {"rejectedSpans": str(decoded.rejected), "errorMessage": message}})


def metrics_success_body(encoding: Encoding, decoded: Decoded | None) -> bytes:
    """An ``ExportMetricsServiceResponse``: empty on full success, ``partial_success`` with
    ``rejected_data_points`` otherwise."""
    if decoded is None or not decoded.rejected:
        return b"" if encoding == "protobuf" else b"{}"
    message = decoded.error_message()
    if encoding == "protobuf":
        partial = ExportMetricsPartialSuccess(rejected_data_points=decoded.rejected, error_message=message)
        response: bytes = ExportMetricsServiceResponse(partial_success=partial).SerializeToString()
        return response
    return orjson.dumps({"partialSuccess": {"rejectedDataPoints": str(decoded.rejected), "errorMessage": message}})


def status_body(encoding: Encoding | None, http_status: int, message: str, *, field: str | None = None) -> bytes:
    """A ``google.rpc.Status`` for a failed request; a ``400`` names the field in a ``BadRequest``."""
    code = _GRPC_CODE.get(http_status, code_pb2.UNKNOWN)
    if encoding == "protobuf":
        status = status_pb2.Status(code=code, message=message)
        if http_status == 400:
            violation = error_details_pb2.BadRequest.FieldViolation(field=field or "", description=message)
            detail = AnyMessage()
            detail.Pack(error_details_pb2.BadRequest(field_violations=[violation]))
            status.details.append(detail)
        body: bytes = status.SerializeToString()
        return body
    out: dict[str, object] = {"code": code, "message": message}
    if http_status == 400:
        out["details"] = [
            {"@type": _BAD_REQUEST_TYPE, "fieldViolations": [{"field": field or "", "description": message}]}
        ]
    return orjson.dumps(out)
