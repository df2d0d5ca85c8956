"""OTLP/JSON requests normalised to the store's canonical encoding. Pure: no I/O, no mutation.

Contract of :func:`normalize_request`: it takes a parsed OTLP/JSON ``ExportTraceServiceRequest``
and returns :class:`Normalized`: a ``TracesData`` object holding the spans the store can keep,
each rebuilt field by field in the encoding :func:`~treellm.store.formats.otlp_proto.proto_to_traces_data`
writes (lowercase hex ids, 64-bit integers as decimal strings, ``AnyValue`` objects with one
value, integer enums, dropped counts only when non-zero), so the ingester never meets a type it
does not expect. The OTLP/JSON rules (https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding):
hex ids, case-insensitive; integer enums only (enum names are rejected); 64-bit integers as
numbers or decimal strings; lowerCamelCase keys; unknown fields ignored; ``null`` as the field's
default. A span of the wrong shape is rejected alone (its reason kept, up to ``max_reasons``);
a request whose structure is wrong (``resourceSpans`` not a list, a resource or scope of the
wrong shape) raises :class:`~treellm.collector.errors.BadRequest`. Attribute values nested
deeper than :data:`MAX_VALUE_DEPTH` are rejected, never recursed into.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from treellm.collector.errors import BadRequest

__all__ = ["MAX_VALUE_DEPTH", "JsonObject", "Normalized", "normalize_request"]

JsonObject = dict[str, Any]

MAX_VALUE_DEPTH: Final = 32

_INT64_MAX: Final = 2**63 - 1
_INT64_MIN: Final = -(2**63)
_UINT32_MAX: Final = 2**32 - 1
_MAX_KIND: Final = 5  # SPAN_KIND_CONSUMER
_MAX_STATUS: Final = 2  # STATUS_CODE_ERROR
_HEX: Final = frozenset("0123456789abcdefABCDEF")
_DECIMAL: Final = re.compile(r"-?[0-9]{1,20}")
_VALUE_KEYS: Final = (
    "stringValue", "boolValue", "intValue", "doubleValue", "arrayValue", "kvlistValue", "bytesValue",
)  # fmt: skip
_SPECIAL_DOUBLES: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


@dataclass(frozen=True, slots=True)
class Normalized:
    """The accepted spans as one ``TracesData`` (None when there are none), and the rejected ones."""

    traces_data: JsonObject | None
    total: int
    rejected: int
    reasons: tuple[str, ...]


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


def normalize_request(doc: object, *, max_reasons: int = 5) -> Normalized:
    """A parsed OTLP/JSON request in canonical form (see the module docstring)."""
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
                    if len(reasons) < max_reasons:
                        reasons.append(f"{where_ss}.spans[{i}].{exc}")
            if spans_out:
                schema = _structure(_text, ss_obj.get("schemaUrl"), f"{where_ss}.schemaUrl")
                scope_spans_out.append(_with_schema({"scope": scope, "spans": spans_out}, schema))
        if scope_spans_out:
            schema = _structure(_text, rs_obj.get("schemaUrl"), f"{where}.schemaUrl")
            resource_spans_out.append(_with_schema({"resource": resource, "scopeSpans": scope_spans_out}, schema))
    traces_data = {"resourceSpans": resource_spans_out} if resource_spans_out else None
    return Normalized(traces_data, total, rejected, tuple(reasons))


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
    elif (isinstance(value, str) and _DECIMAL.fullmatch(value)) or (isinstance(value, float) and value.is_integer()):
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
        out.append(
            {"key": _text(obj.get("key"), f"{where}.key"), "value": _any(obj.get("value"), f"{where}.value", depth)}
        )
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
