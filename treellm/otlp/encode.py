"""Pure conversions between SDK spans and the OTLP/JSON encoding. No I/O.

Contract of :func:`spans_to_traces_data` (the OTLP/JSON ``TracesData`` object, the file
format of the OpenTelemetry Collector's file exporter and ``treellm``'s JSONL traces):

- Spans are grouped by resource, then by instrumentation scope, each group in the order
  of its first span; spans keep their order inside a group.
- Keys are lowerCamelCase protobuf JSON names; trace and span ids are lowercase hex
  (32 / 16 characters; ``parentSpanId`` is omitted on roots), as OTLP/JSON requires
  (not protobuf's base64).
- Every 64-bit integer (times, ``intValue``) is a decimal string; enums are integers:
  span kind uses the OTLP numbering (INTERNAL=1 ... CONSUMER=5, one more than the
  Python SDK's ``SpanKind``), status code UNSET=0, OK=1, ERROR=2.
- ``flags`` holds the W3C trace flags (bits 0-7) plus the OTLP "has is_remote" bit
  (0x100) and the "is_remote" bit (0x200) of the parent (spans) or linked context (links).
- Attribute values become ``AnyValue`` objects. Non-finite doubles are the strings
  ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (the protobuf JSON mapping); an int outside
  the int64 range (which protobuf cannot hold) becomes a ``stringValue`` of its digits;
  ``bytes`` become base64 ``bytesValue``; a mapping becomes ``kvlistValue``; ``None``
  inside a sequence becomes the empty ``AnyValue`` ``{}``; any other type becomes the
  ``stringValue`` of ``str(value)``. Conversion never raises for a value.
- Dropped counts, ``traceState``, ``schemaUrl`` and status ``message`` appear only when
  non-zero / non-empty.

:func:`traces_data_line` encodes that object as one compact JSON line of UTF-8 ending in
``"\\n"``. Surrogate policy: a ``str`` holding surrogate code points (for example from
``os.fsdecode`` of undecodable bytes) is repaired before encoding: a well-formed
high+low pair becomes the character it stands for, and every lone surrogate becomes
U+FFFD. The line is therefore always valid UTF-8 and valid JSON (``NaN`` never leaks
out bare). The repair runs only on the rare lines that need it.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode

__all__ = ["any_value", "json_line", "key_values", "span_to_json", "spans_to_traces_data", "traces_data_line"]

JsonObject = dict[str, Any]

# The Python SDK numbers SpanKind from INTERNAL=0; OTLP from UNSPECIFIED=0, INTERNAL=1.
_SPAN_KIND: dict[SpanKind, int] = {
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}
_STATUS_CODE: dict[StatusCode, int] = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}

_FLAGS_HAS_IS_REMOTE = 0x100
_FLAGS_IS_REMOTE = 0x200
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_ZERO_TRACE_ID = "0" * 32
_ZERO_SPAN_ID = "0" * 16

_encode_json_text = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False
).encode


# --- attribute values -------------------------------------------------------------------


def _string_value(value: str) -> JsonObject:
    return {"stringValue": value}


def _bool_value(value: bool) -> JsonObject:
    return {"boolValue": value}


def _int_value(value: int) -> JsonObject:
    if _INT64_MIN <= value <= _INT64_MAX:
        return {"intValue": str(value)}
    return {"stringValue": str(value)}


def _double_value(value: float) -> JsonObject:
    if math.isfinite(value):
        return {"doubleValue": value}
    if math.isnan(value):
        return {"doubleValue": "NaN"}
    return {"doubleValue": "Infinity" if value > 0 else "-Infinity"}


def _array_value(values: Sequence[object]) -> JsonObject:
    return {"arrayValue": {"values": [any_value(v) for v in values]}}


def _kvlist_value(values: Mapping[object, object]) -> JsonObject:
    return {"kvlistValue": {"values": [{"key": str(k), "value": any_value(v)} for k, v in values.items()]}}


# Exact types first (the common case, one dict lookup); subclasses fall through to isinstance.
_BY_TYPE: dict[type, Callable[[Any], JsonObject]] = {
    str: _string_value,
    bool: _bool_value,
    int: _int_value,
    float: _double_value,
    tuple: _array_value,
    list: _array_value,
}


def any_value(value: object) -> JsonObject:
    """One attribute value as an OTLP/JSON ``AnyValue`` object (never raises)."""
    encode = _BY_TYPE.get(type(value))
    if encode is not None:
        return encode(value)
    return _any_value_by_isinstance(value)


def _any_value_by_isinstance(value: object) -> JsonObject:
    if value is None:
        return {}
    if isinstance(value, str):
        return _string_value(str(value))
    if isinstance(value, bool):
        return _bool_value(bool(value))
    if isinstance(value, int):
        return _int_value(int(value))
    if isinstance(value, float):
        return _double_value(float(value))
    if isinstance(value, bytes | bytearray | memoryview):
        return {"bytesValue": base64.b64encode(value).decode("ascii")}
    if isinstance(value, Mapping):
        return _kvlist_value(value)
    if isinstance(value, Sequence):
        return _array_value(value)
    return _string_value(str(value))


def _plain(attributes: Mapping[str, object]) -> Mapping[str, object]:
    """The dict behind the SDK's ``BoundedAttributes`` when there is one.

    Iterating ``BoundedAttributes`` goes through the generic ``Mapping`` views (a
    generator step and a ``__getitem__`` per key), which cost more than the rest of the
    encoding; its values live in a plain ``_dict``. Any other mapping is used as it is.
    """
    inner = getattr(attributes, "_dict", None)
    return inner if isinstance(inner, dict) else attributes


def key_values(attributes: Mapping[str, object] | None) -> list[JsonObject]:
    """Attributes as an OTLP/JSON ``KeyValue`` list, in their insertion order.

    The common types are inlined (this loop runs for every attribute of every span).
    """
    if not attributes:
        return []
    out: list[JsonObject] = []
    append = out.append
    for key, value in _plain(attributes).items():
        kind = type(value)
        if kind is str:
            append({"key": key, "value": {"stringValue": value}})
        elif kind is int and _INT64_MIN <= value <= _INT64_MAX:  # type: ignore[operator]
            append({"key": key, "value": {"intValue": str(value)}})
        elif kind is bool:
            append({"key": key, "value": {"boolValue": value}})
        else:
            append({"key": key, "value": any_value(value)})
    return out


# --- spans --------------------------------------------------------------------------------


def _flags(context: SpanContext | None, remote: SpanContext | None) -> int:
    trace_flags = int(context.trace_flags) if context is not None else 0
    flags = trace_flags | _FLAGS_HAS_IS_REMOTE
    if remote is not None and remote.is_remote:
        flags |= _FLAGS_IS_REMOTE
    return flags


def _status(status: Status) -> JsonObject:
    out: JsonObject = {"code": _STATUS_CODE[status.status_code]}
    if status.description:
        out["message"] = status.description
    return out


def _event(event: Event) -> JsonObject:
    out: JsonObject = {
        "timeUnixNano": str(event.timestamp),
        "name": event.name,
        "attributes": key_values(event.attributes),
    }
    if event.dropped_attributes:
        out["droppedAttributesCount"] = event.dropped_attributes
    return out


def _link(link: Link) -> JsonObject:
    context = link.context
    out: JsonObject = {
        "traceId": f"{context.trace_id:032x}",
        "spanId": f"{context.span_id:016x}",
        "attributes": key_values(link.attributes),
        "flags": _flags(context, context),
    }
    trace_state = context.trace_state.to_header() if context.trace_state else ""
    if trace_state:
        out["traceState"] = trace_state
    if link.dropped_attributes:
        out["droppedAttributesCount"] = link.dropped_attributes
    return out


def span_to_json(span: ReadableSpan) -> JsonObject:
    """One SDK span as an OTLP/JSON ``Span`` object.

    A span without a span context (never produced by the SDK pipeline) gets all-zero ids.
    """
    context = span.get_span_context()
    parent = span.parent
    out: JsonObject = {
        "traceId": f"{context.trace_id:032x}" if context is not None else _ZERO_TRACE_ID,
        "spanId": f"{context.span_id:016x}" if context is not None else _ZERO_SPAN_ID,
    }
    if context is not None and context.trace_state:
        out["traceState"] = context.trace_state.to_header()
    if parent is not None:
        out["parentSpanId"] = f"{parent.span_id:016x}"
    out["flags"] = _flags(context, parent)
    out["name"] = span.name
    out["kind"] = _SPAN_KIND[span.kind]
    out["startTimeUnixNano"] = str(span.start_time or 0)
    out["endTimeUnixNano"] = str(span.end_time or 0)
    out["attributes"] = key_values(getattr(span, "_attributes", None) or span.attributes)
    if span.dropped_attributes:
        out["droppedAttributesCount"] = span.dropped_attributes
    out["events"] = [_event(event) for event in span.events]
    if span.dropped_events:
        out["droppedEventsCount"] = span.dropped_events
    out["links"] = [_link(link) for link in span.links]
    if span.dropped_links:
        out["droppedLinksCount"] = span.dropped_links
    out["status"] = _status(span.status)
    return out


# --- grouping -------------------------------------------------------------------------------


def _resource_json(resource: Resource) -> JsonObject:
    return {"attributes": key_values(resource.attributes)}


def _scope_json(scope: InstrumentationScope | None) -> JsonObject:
    if scope is None:
        return {}
    out: JsonObject = {"name": scope.name}
    if scope.version:
        out["version"] = scope.version
    if scope.attributes:
        out["attributes"] = key_values(scope.attributes)
    return out


def _with_schema_url(obj: JsonObject, schema_url: str | None) -> JsonObject:
    if schema_url:
        obj["schemaUrl"] = schema_url
    return obj


_Groups = list[tuple[Resource, dict[InstrumentationScope | None, list[ReadableSpan]]]]


def _group(spans: Sequence[ReadableSpan]) -> _Groups:
    """Spans by resource then scope, in first-seen order.

    Resources are matched by identity first (one provider shares one ``Resource``; its
    ``__hash__`` serialises every attribute), then by equality.
    """
    groups: _Groups = []
    index_by_id: dict[int, int] = {}
    for span in spans:
        resource = span.resource
        index = index_by_id.get(id(resource))
        if index is None:
            index = next((i for i, (r, _) in enumerate(groups) if r == resource), len(groups))
            if index == len(groups):
                groups.append((resource, {}))
            index_by_id[id(resource)] = index
        groups[index][1].setdefault(span.instrumentation_scope, []).append(span)
    return groups


def spans_to_traces_data(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """SDK spans as one OTLP/JSON ``TracesData`` object (see the module docstring)."""
    resource_spans = []
    for resource, scopes in _group(spans):
        scope_spans = [
            _with_schema_url(
                {"scope": _scope_json(scope), "spans": [span_to_json(s) for s in members]},
                scope.schema_url if scope is not None else None,
            )
            for scope, members in scopes.items()
        ]
        resource_spans.append(
            _with_schema_url({"resource": _resource_json(resource), "scopeSpans": scope_spans}, resource.schema_url)
        )
    return {"resourceSpans": resource_spans}


# --- lines ----------------------------------------------------------------------------------


def _repair_surrogates(text: str) -> str:
    """Join well-formed surrogate pairs; replace each lone surrogate with U+FFFD."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def json_line(obj: Mapping[str, Any]) -> bytes:
    """``obj`` as one compact JSON line of valid UTF-8 ending in ``"\\n"``.

    orjson encodes it (several times faster than the standard library); a line whose
    strings hold surrogates, which orjson refuses, is repaired and encoded by the
    standard library instead. Raises ``TypeError`` for a value JSON cannot hold (a bare
    non-finite float would be written as ``null``); :func:`spans_to_traces_data` produces neither.
    """
    try:
        return orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError as exc:
        if "surrogates" not in str(exc):
            raise TypeError(str(exc)) from exc
    text = _encode_json_text(obj)
    return (_repair_surrogates(text) + "\n").encode("utf-8")


def traces_data_line(spans: Sequence[ReadableSpan]) -> bytes:
    """SDK spans as one OTLP JSONL line: :func:`spans_to_traces_data`, compact, UTF-8, ``"\\n"``."""
    return json_line(spans_to_traces_data(spans))
