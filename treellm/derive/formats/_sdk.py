"""OpenTelemetry Python SDK span JSON (``ReadableSpan.to_json()``) to OTLP/JSON, shared by the SDK formats.

Ids may be hex strings, ``0x`` hex or integers; kinds ``"SpanKind.INTERNAL"``,
``"internal"`` or the SDK's integer; times ISO 8601 (UTC unless an offset is given) or
integer nanoseconds (the SDK's own ISO text holds microseconds: it drops the nanoseconds
below them, so exact times need whole microseconds); the parent as ``parent_id`` or
``parent: {span_id, is_remote}``; the resource as ``{"attributes": {...}, "schema_url":
...}`` or a flat dict; an optional ``instrumentation_scope``. A span whose parent is not in the file becomes a root and
carries ``treellm.ingest.orphan_parent`` = the parent's hex id (its ``parentSpanId`` is
left out, so that the store sees a root). Spans are grouped by resource then scope, in
first-seen order.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from treellm.derive.formats._base import (
    ORPHAN_PARENT,
    JsonObject,
    Malformed,
    Record,
    checked,
    kind_of,
    mapping,
    sequence,
    with_schema,
)
from treellm.errors import IngestError
from treellm.otlp import key_values

_SPAN_KINDS: Final = {"UNSPECIFIED": 0, "INTERNAL": 1, "SERVER": 2, "CLIENT": 3, "PRODUCER": 4, "CONSUMER": 5}
_STATUS_CODES: Final = {"UNSET": 0, "OK": 1, "ERROR": 2}
_FLAGS_HAS_IS_REMOTE: Final = 0x100
_FLAGS_IS_REMOTE: Final = 0x200
_INT64_MAX: Final = 2**63 - 1
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def traces_data(spans: Iterable[SdkSpan], known: set[tuple[str, str]]) -> JsonObject:
    """One ``TracesData`` of ``spans``, grouped by resource then scope in first-seen order;
    a span whose (trace id, parent id) is not in ``known`` becomes a flagged root."""
    groups: dict[str, tuple[JsonObject, dict[str, JsonObject]]] = {}
    for span in spans:
        resource_key = _group_key(span.resource, span.resource_schema)
        if resource_key not in groups:
            groups[resource_key] = (
                with_schema({"resource": span.resource, "scopeSpans": []}, span.resource_schema),
                {},
            )
        resource_spans, scopes = groups[resource_key]
        scope_key = _group_key(span.scope, span.scope_schema)
        if scope_key not in scopes:
            scopes[scope_key] = with_schema({"scope": span.scope, "spans": []}, span.scope_schema)
            resource_spans["scopeSpans"].append(scopes[scope_key])
        scopes[scope_key]["spans"].append(_sdk_span_json(span, known))
    return {"resourceSpans": [resource_spans for resource_spans, _ in groups.values()]}


def span_records(items: list[SdkSpan | IngestError], *, path: str) -> Iterator[Record | IngestError]:
    """One record per span (its own ``TracesData``, through the one validator) and the bad ones
    in between, in file order.

    Parents are looked up among all the good spans of the file, so a span keeps its parent
    whichever record holds it.
    """
    known = {(s.trace_id, s.span_id) for s in items if isinstance(s, SdkSpan)}
    for index, item in enumerate(items):
        if isinstance(item, IngestError):
            yield item
        else:
            yield from checked(index, traces_data([item], known), path=path)


@dataclass(frozen=True, slots=True)
class SdkSpan:
    """One span of SDK JSON, converted except for its parent (which needs the whole file)."""

    trace_id: str
    span_id: str
    trace_state: str
    parent_id: str | None
    body: JsonObject  # flags ... status, in OTLP/JSON
    resource: JsonObject
    resource_schema: str
    scope: JsonObject
    scope_schema: str


def _group_key(value: JsonObject, schema_url: str) -> str:
    return json.dumps([value, schema_url], sort_keys=True, default=str)


def _sdk_span_json(span: SdkSpan, known: set[tuple[str, str]]) -> JsonObject:
    out: JsonObject = {"traceId": span.trace_id, "spanId": span.span_id}
    if span.trace_state:
        out["traceState"] = span.trace_state
    orphan = span.parent_id is not None and (span.trace_id, span.parent_id) not in known
    if span.parent_id is not None and not orphan:
        out["parentSpanId"] = span.parent_id
    out.update(span.body)
    if orphan:
        out["attributes"] = [
            *span.body["attributes"],
            {"key": ORPHAN_PARENT, "value": {"stringValue": span.parent_id}},
        ]
    return out


def sdk_span(raw: object) -> SdkSpan:
    """One parsed SDK span, converted except for its parent; ``Malformed`` names the field."""
    if not isinstance(raw, Mapping):
        raise Malformed(f"expected a span object, got {kind_of(raw)}")
    name = raw.get("name")
    if not isinstance(name, str):
        raise Malformed(f"name: expected text, got {kind_of(name)}")
    context = mapping(raw.get("context"), "context")
    trace_id = _own_id(context.get("trace_id"), 32, "context.trace_id")
    span_id = _own_id(context.get("span_id"), 16, "context.span_id")
    parent_id, remote = _sdk_parent(raw)
    start = _time_ns(raw.get("start_time"), "start_time")
    end = start if raw.get("end_time") is None else _time_ns(raw.get("end_time"), "end_time")
    resource, resource_schema = _sdk_resource(raw.get("resource"))
    scope, scope_schema = _sdk_scope(raw.get("instrumentation_scope", raw.get("instrumentation_info")))
    body: JsonObject = {
        "flags": _flags(context, remote),
        "name": name,
        "kind": _sdk_kind(raw.get("kind")),
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(end),
        "attributes": key_values(mapping(raw.get("attributes"), "attributes")),
        "events": [_sdk_event(e, f"events[{j}]") for j, e in enumerate(sequence(raw.get("events"), "events"))],
        "links": [_sdk_link(link, f"links[{j}]") for j, link in enumerate(sequence(raw.get("links"), "links"))],
        "status": _sdk_status(raw.get("status")),
    }
    trace_state = _trace_state(context.get("trace_state"))
    return SdkSpan(trace_id, span_id, trace_state, parent_id, body, resource, resource_schema, scope, scope_schema)


def _hex_text(value: object, digits: int, what: str) -> str:
    """An id given as an integer, hex text or ``0x`` hex, as ``digits`` lowercase hex digits."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < 16**digits:
            raise Malformed(f"{what}: {value} does not fit in {digits * 4} bits")
        return f"{value:0{digits}x}"
    if isinstance(value, str):
        text = value.strip().lower().removeprefix("0x")
        if text and len(text) <= digits and all(c in "0123456789abcdef" for c in text):
            return text.rjust(digits, "0")
    raise Malformed(f"{what}: expected a {digits}-digit hex id or an integer, got {value!r}")


def _own_id(value: object, digits: int, what: str) -> str:
    text = _hex_text(value, digits, what)
    if text.strip("0") == "":
        raise Malformed(f"{what} is all zero")
    return text


def _sdk_parent(raw: Mapping[str, Any]) -> tuple[str | None, bool | None]:
    """The parent span id (None for a root) and whether the parent is remote (None: not said)."""
    parent = raw.get("parent")
    if parent is not None:
        parent = mapping(parent, "parent")
        remote = parent.get("is_remote")
        value, what = parent.get("span_id"), "parent.span_id"
    else:
        remote = None
        value, what = raw.get("parent_id"), "parent_id"
    if value is None:
        return None, remote if isinstance(remote, bool) else None
    text = _hex_text(value, 16, what)
    return (None if text.strip("0") == "" else text), remote if isinstance(remote, bool) else None


def _flags(context: Mapping[str, Any], remote: bool | None) -> int:
    trace_flags = context.get("trace_flags", 0)
    if isinstance(trace_flags, Mapping):
        trace_flags = trace_flags.get("value", 0)
    flags = trace_flags & 0xFF if isinstance(trace_flags, int) else 0
    if remote is not None:
        flags |= _FLAGS_HAS_IS_REMOTE | (_FLAGS_IS_REMOTE if remote else 0)
    return flags


_TRACE_STATE_REPR = re.compile(r"\{key=([^,{}]*), value=([^{}]*)\}")


def _trace_state(value: object) -> str:
    """A W3C ``tracestate`` header from the SDK's ``repr`` (``"['{key=a, value=b}']"``),
    a header, an ``{"entries": {...}}`` object or a list of pairs."""
    if value is None:
        return ""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return ",".join(f"{k}={v}" for k, v in _TRACE_STATE_REPR.findall(text))
        return text
    if isinstance(value, Mapping):
        entries = mapping(value.get("entries", value), "context.trace_state")
        return ",".join(f"{k}={v}" for k, v in entries.items())
    if isinstance(value, list) and all(isinstance(p, list | tuple) and len(p) == 2 for p in value):
        return ",".join(f"{k}={v}" for k, v in value)
    raise Malformed(f"context.trace_state: expected text or an object, got {kind_of(value)}")


def _enum_name(value: str, *prefixes: str) -> str:
    name = value.strip().upper()
    for prefix in prefixes:
        name = name.removeprefix(prefix)
    return name


def _sdk_kind(value: object) -> int:
    """OTLP span kind of ``"SpanKind.INTERNAL"``, ``"internal"``, ``"SPAN_KIND_INTERNAL"`` or
    the Python SDK's integer (INTERNAL=0, so one less than OTLP's); unspecified when absent."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 4:
        return value + 1
    if isinstance(value, str):
        kind = _SPAN_KINDS.get(_enum_name(value, "SPANKIND.", "SPAN_KIND_"))
        if kind is not None:
            return kind
    raise Malformed(f"kind: expected a span kind such as 'SpanKind.INTERNAL', got {value!r}")


def _sdk_status(value: object) -> JsonObject:
    status = mapping(value, "status")
    code = status.get("status_code")
    if code is None:
        number: int | None = 0
    elif isinstance(code, int) and not isinstance(code, bool):
        number = code if code in (0, 1, 2) else None
    elif isinstance(code, str):
        number = _STATUS_CODES.get(_enum_name(code, "STATUSCODE.", "STATUS_CODE_"))
    else:
        number = None
    if number is None:
        raise Malformed(f"status.status_code: expected UNSET, OK or ERROR, got {code!r}")
    out: JsonObject = {"code": number}
    description = status.get("description")
    if isinstance(description, str) and description:
        out["message"] = description
    return out


_ISO_TIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d+))?\s*(Z|z|[+-]\d{2}(?::?\d{2})?)?"
)


def _time_ns(value: object, what: str) -> int:
    """Nanoseconds since the epoch from integer nanoseconds (number or digits) or ISO 8601 text."""
    ns: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        ns = value
    elif isinstance(value, float) and math.isfinite(value):
        ns = int(value)
    elif isinstance(value, str):
        text = value.strip()
        ns = int(text) if text.isdigit() else _iso_ns(text)
    if ns is None or not 0 <= ns <= _INT64_MAX:
        raise Malformed(f"{what}: expected an ISO 8601 time or integer nanoseconds, got {value!r}")
    return ns


def _iso_ns(text: str) -> int | None:
    match = _ISO_TIME.fullmatch(text)
    if match is None:
        return None
    try:
        year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
        moment = datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    except ValueError:
        return None
    seconds = (moment - _EPOCH) // timedelta(seconds=1)
    zone = match.group(8)
    if zone and zone not in "Zz":
        digits = zone[1:].replace(":", "")
        offset = int(digits[:2]) * 3600 + int(digits[2:] or 0) * 60
        seconds -= offset if zone[0] == "+" else -offset
    fraction = (match.group(7) or "")[:9].ljust(9, "0")
    return seconds * 10**9 + int(fraction)


def _sdk_event(raw: object, what: str) -> JsonObject:
    event = mapping(raw, what)
    name = event.get("name")
    if not isinstance(name, str):
        raise Malformed(f"{what}.name: expected text, got {kind_of(name)}")
    return {
        "timeUnixNano": str(_time_ns(event.get("timestamp"), f"{what}.timestamp")),
        "name": name,
        "attributes": key_values(mapping(event.get("attributes"), f"{what}.attributes")),
    }


def _sdk_link(raw: object, what: str) -> JsonObject:
    link = mapping(raw, what)
    context = mapping(link.get("context"), f"{what}.context")
    remote = context.get("is_remote")
    out: JsonObject = {
        "traceId": _own_id(context.get("trace_id"), 32, f"{what}.context.trace_id"),
        "spanId": _own_id(context.get("span_id"), 16, f"{what}.context.span_id"),
        "attributes": key_values(mapping(link.get("attributes"), f"{what}.attributes")),
        "flags": _flags(context, remote if isinstance(remote, bool) else None),
    }
    trace_state = _trace_state(context.get("trace_state"))
    if trace_state:
        out["traceState"] = trace_state
    return out


def _sdk_resource(value: object) -> tuple[JsonObject, str]:
    resource = mapping(value, "resource")
    attributes = resource.get("attributes")
    if isinstance(attributes, Mapping) and set(resource) <= {"attributes", "schema_url"}:
        schema_url = resource.get("schema_url")
        return {"attributes": key_values(attributes)}, schema_url if isinstance(schema_url, str) else ""
    return {"attributes": key_values(resource)}, ""  # a flat dict of resource attributes


def _sdk_scope(value: object) -> tuple[JsonObject, str]:
    if value is None:
        return {}, ""
    scope = mapping(value, "instrumentation_scope")
    out: JsonObject = {"name": str(scope.get("name") or "")}
    if scope.get("version"):
        out["version"] = str(scope["version"])
    attributes = mapping(scope.get("attributes"), "instrumentation_scope.attributes")
    if attributes:
        out["attributes"] = key_values(attributes)
    schema_url = scope.get("schema_url")
    return out, schema_url if isinstance(schema_url, str) else ""
