"""What a valid span is, written once: the rule table, the canonical normaliser and the SQL check.

Every road into the store goes through :func:`normalize_traces_data` or is checked by
:data:`VALIDATE_SQL`, both derived from :data:`SPAN_RULES` / :data:`EVENT_RULES` /
:data:`LINK_RULES`: the collector's OTLP/JSON, every converter of :mod:`treellm.derive.formats`,
ingest's line check and ``--skip-bad``, and the SQL that checks what DuckDB staged from a file
read in place. The collector's protobuf road checks each span's own fields against the same
rules' bounds in one pass over the message
(:func:`~treellm.derive.formats.otlp_proto.canonical_traces_data`; its rejections are worded by
:func:`span_problem`) and leaves repeated attribute keys to :data:`VALIDATE_SQL` at flush.

Contract of :func:`normalize_traces_data` (pure: no I/O, the input is never mutated): it
takes a parsed OTLP/JSON ``TracesData`` / ``ExportTraceServiceRequest`` and returns
:class:`Normalized`: the spans the store can keep, each rebuilt field by field in the
canonical encoding (lowercase hex ids, 64-bit integers as decimal strings, ``AnyValue``
objects with one value, integer enums, dropped counts only when non-zero), and the
rejected ones with a reason naming the field. The OTLP/JSON rules
(https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding): hex ids,
case-insensitive; integer enums only (enum names are rejected); 64-bit integers as numbers
or decimal strings; lowerCamelCase keys; unknown fields ignored; ``null`` as the field's
default.

Decisions (one place, so that every road agrees):

- **Per span**: a span that breaks a rule is rejected alone, with a reason
  ``resourceSpans[r].scopeSpans[s].spans[i].<field>: ...``; the other spans of the
  request, line or record are kept. Only a wrong *structure* (``resourceSpans`` not a
  list, a resource or scope of the wrong shape) raises :class:`StructureError` for the
  whole document.
- **Out of range** (rejected): a trace id that is not 32 hex digits or is all zero, a span
  or link id that is not 16 hex digits or is all zero, a parent id that is not 16 hex
  digits, a time outside 0..2**63-1 (int64, as the store holds it), an end time before the
  start time, a kind outside 0-5, a status code outside 0-2, flags or dropped counts
  outside uint32, an attribute value nested deeper than :data:`MAX_VALUE_DEPTH`.
- **An all-zero ``parentSpanId`` means no parent** (as protobuf's empty bytes do): the
  span is a root.
- **Duplicate attribute keys** (on a span, its resource, its scope, an event or a link):
  the last value wins, as in the OpenTelemetry SDKs, and the span records it in the
  attribute :data:`DUPLICATE_KEYS` (a list of ``key``, ``resource:key``, ``scope:key``,
  ``events[i]:key`` or ``links[i]:key``).

:data:`VALIDATE_SQL` is generated from the same rules over the store's stage table (one
row per span, ids lowercased, times cast to BIGINT). It is a detector: any row it returns
(an event or a link whose attributes repeat a key among them), or any row DuckDB refuses to
stage (a span's or resource's repeated key in its MAP, a time past int64), sends the file
through :func:`normalize_traces_data`, which decides.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from treellm.errors import TreeLLMError

__all__ = [
    "DUPLICATE_KEYS",
    "EVENT_RULES",
    "LINK_RULES",
    "MAX_VALUE_DEPTH",
    "SPAN_RULES",
    "VALIDATE_SQL",
    "Normalized",
    "Rule",
    "StructureError",
    "normalize_traces_data",
    "span_problem",
    "unique_keys_sql",
    "validate_sql",
]

JsonObject = dict[str, Any]

DUPLICATE_KEYS: Final = "treellm.ingest.duplicate_keys"
MAX_VALUE_DEPTH: Final = 32
INT64_MAX: Final = 2**63 - 1
INT64_MIN: Final = -(2**63)
UINT32_MAX: Final = 2**32 - 1


# --- the rule table -------------------------------------------------------------------------------


RuleKind = Literal["id", "parent", "time", "enum", "text", "not_before", "unique_keys"]


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule on one field: its OTLP/JSON name, the stage column (or lambda field) that
    holds it, what kind of check, and its bound (hex digits of an id, the largest value of
    an integer, the field an end may not precede)."""

    field: str
    column: str
    kind: RuleKind
    bound: int | str = 0

    def expected(self) -> str:
        """What the field must hold, as the reasons say it."""
        if self.kind == "id":
            return f"{self.bound} hex digits, not all zero"
        if self.kind == "parent":
            return f"{self.bound} hex digits (all zero or empty: no parent)"
        if self.kind in ("time", "enum"):
            return f"0..{self.bound}"
        if self.kind == "not_before":
            return f"not before {self.bound}"
        if self.kind == "unique_keys":
            return "unique keys (a repeated key keeps its last value, recorded on the span)"
        return "a string"


SPAN_RULES: Final = (
    Rule("traceId", "trace_id", "id", 32),
    Rule("spanId", "span_id", "id", 16),
    Rule("parentSpanId", "parent_span_id", "parent", 16),
    Rule("name", "name", "text"),
    Rule("kind", "kind", "enum", 5),
    Rule("startTimeUnixNano", "start_ns", "time", INT64_MAX),
    Rule("endTimeUnixNano", "end_ns", "time", INT64_MAX),
    Rule("endTimeUnixNano", "end_ns", "not_before", "startTimeUnixNano"),
    Rule("status.code", "status_code", "enum", 2),
)
"""The span's own fields, in the order they are checked."""

EVENT_RULES: Final = (
    Rule("timeUnixNano", "TRY_CAST(e.timeUnixNano AS BIGINT)", "time", INT64_MAX),
    Rule("attributes", "e.attributes", "unique_keys"),
)
LINK_RULES: Final = (
    Rule("traceId", "lower(l.traceId)", "id", 32),
    Rule("spanId", "lower(l.spanId)", "id", 16),
    Rule("attributes", "l.attributes", "unique_keys"),
)
"""An event's and a link's fields. A repeated attribute key is not refused: the SQL flags it (a
span's and a resource's are refused by DuckDB's MAP when staged) and the validator keeps the
last value and records the key on the span."""

_RULE: Final = {(r.field, r.kind): r for r in SPAN_RULES}
_SQL_COLUMN: Final = {r.field: r.column for r in SPAN_RULES}


def unique_keys_sql(keys: str, length: str | None = None) -> str:
    """The SQL that holds when the list of attribute keys ``keys`` (of ``length`` items, by default
    its own) repeats no key and names each: a NULL key counts as repeated (``list_distinct`` drops it)."""
    return f"len(list_distinct({keys})) = len({length or keys})"


def _sql_condition(rule: Rule) -> str:
    """The SQL that holds when ``rule.column`` keeps the rule (NULL counts as broken)."""
    c = rule.column
    if rule.kind in ("id", "parent"):
        digits = int(rule.bound)
        ok = f"regexp_full_match({c}, '[0-9a-f]{{{digits}}}') AND {c} <> '{'0' * digits}'"
        return f"({c} IS NULL OR ({ok}))" if rule.kind == "parent" else f"({ok})"
    if rule.kind in ("time", "enum"):
        return f"({c} BETWEEN 0 AND {rule.bound})"
    if rule.kind == "not_before":
        return f"({c} >= {_SQL_COLUMN[str(rule.bound)]})"
    if rule.kind == "unique_keys":
        return f"({c} IS NULL OR {unique_keys_sql(f'list_transform({c}, lambda kv: kv.key)', c)})"
    return f"({c} IS NOT NULL)"


def _all_items(column: str, var: str, rules: tuple[Rule, ...]) -> str:
    condition = " AND ".join(f"coalesce({_sql_condition(r)}, false)" for r in rules)
    return f"coalesce(list_bool_and(list_transform({column}, lambda {var}: {condition})), true)"


def validate_sql(table: str = "stage") -> str:
    """A query returning a row of ``table`` that breaks a rule (or none), generated from the rules."""
    checks = [f"coalesce({_sql_condition(r)}, false)" for r in SPAN_RULES]
    checks.append(_all_items("events", "e", EVENT_RULES))
    checks.append(_all_items("links", "l", LINK_RULES))
    where = "\n   OR ".join(f"NOT {check}" for check in checks)
    return f"SELECT trace_id, span_id FROM {table}\nWHERE {where}\nLIMIT 1\n"


VALIDATE_SQL: Final = validate_sql()


# --- results and errors ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Normalized:
    """The accepted spans as one ``TracesData`` (None when there are none), and the rejected ones.

    ``reasons`` holds the first ``max_reasons`` reasons (all of them when unbounded), each
    starting with the span's place (``resourceSpans[r].scopeSpans[s].spans[i].``) and the field.
    """

    traces_data: JsonObject | None
    total: int
    rejected: int
    reasons: tuple[str, ...]
    duplicate_keys: int = 0


class StructureError(TreeLLMError):
    """The document's structure is wrong (not one span): ``field`` names where."""

    def __init__(self, reason: str, *, field: str | None = None) -> None:
        super().__init__(f"{field}: {reason}" if field else reason)
        self.reason = reason
        self.field = field


class _Invalid(Exception):
    """Why one field cannot be stored; becomes a rejected span or a StructureError."""


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


# --- the document ------------------------------------------------------------------------------------


def normalize_traces_data(doc: object, *, max_reasons: int | None = 5) -> Normalized:
    """A parsed OTLP/JSON ``TracesData`` in canonical form (see the module docstring).

    Raises :class:`StructureError` when the document's structure is wrong.
    """
    if not isinstance(doc, dict):
        raise StructureError(f"expected a TracesData / ExportTraceServiceRequest object, got {_kind_of(doc)}")
    total = rejected = duplicates = 0
    reasons: list[str] = []
    resource_spans_out: list[JsonObject] = []
    for r, rs in enumerate(_structure_list(doc.get("resourceSpans"), "resourceSpans")):
        where = f"resourceSpans[{r}]"
        rs_obj = _structure_object(rs, where)
        resource_dups: list[str] = []
        resource = _structure(_resource, rs_obj.get("resource"), f"{where}.resource", resource_dups)
        scope_spans_out: list[JsonObject] = []
        for s, ss in enumerate(_structure_list(rs_obj.get("scopeSpans"), f"{where}.scopeSpans")):
            where_ss = f"{where}.scopeSpans[{s}]"
            ss_obj = _structure_object(ss, where_ss)
            scope_dups = list(resource_dups)
            scope = _structure(_scope, ss_obj.get("scope"), f"{where_ss}.scope", scope_dups)
            spans_out: list[JsonObject] = []
            for i, span in enumerate(_structure_list(ss_obj.get("spans"), f"{where_ss}.spans")):
                total += 1
                try:
                    out, dups = _span(span, scope_dups)
                except _Invalid as exc:
                    rejected += 1
                    if max_reasons is None or len(reasons) < max_reasons:
                        reasons.append(f"{where_ss}.spans[{i}].{exc}")
                    continue
                duplicates += bool(dups)
                spans_out.append(out)
            if spans_out:
                schema = _structure(_text, ss_obj.get("schemaUrl"), f"{where_ss}.schemaUrl")
                scope_spans_out.append(_with_schema({"scope": scope, "spans": spans_out}, schema))
        if scope_spans_out:
            schema = _structure(_text, rs_obj.get("schemaUrl"), f"{where}.schemaUrl")
            resource_spans_out.append(_with_schema({"resource": resource, "scopeSpans": scope_spans_out}, schema))
    traces_data = {"resourceSpans": resource_spans_out} if resource_spans_out else None
    return Normalized(traces_data, total, rejected, tuple(reasons), duplicates)


def span_problem(span: object) -> str | None:
    """Why one OTLP/JSON ``Span`` would be rejected (``<field>: <reason>``, as
    :func:`normalize_traces_data` words it after the span's place), or None when it is kept."""
    try:
        _span(span, [])
    except _Invalid as exc:
        return str(exc)
    return None


def _structure(convert: Callable[..., Any], value: object, where: str, *args: Any) -> Any:
    try:
        return convert(value, *args)
    except _Invalid as exc:
        raise StructureError(str(exc), field=where) from None


def _structure_list(value: object, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise StructureError(f"expected a list, got {_kind_of(value)}", field=where)
    return value


def _structure_object(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise StructureError(f"expected an object, got {_kind_of(value)}", field=where)
    return value


# --- fields ------------------------------------------------------------------------------------------

_HEX: Final = frozenset("0123456789abcdefABCDEF")
_DECIMAL: Final = re.compile(r"-?[0-9]{1,20}")
_VALUE_KEYS: Final = (
    "stringValue", "boolValue", "intValue", "doubleValue", "arrayValue", "kvlistValue", "bytesValue",
)  # fmt: skip
_SPECIAL_DOUBLES: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


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


def _ruled(rule: Rule, value: object, what: str | None = None) -> Any:
    """``value`` checked by ``rule`` (ids lowercased, integers as int); ``_Invalid`` names the field."""
    what = what or rule.field
    if rule.kind in ("id", "parent"):
        digits = int(rule.bound)
        if rule.kind == "parent" and (value is None or value == ""):
            return None
        if not isinstance(value, str) or len(value) != digits or not set(value) <= _HEX:
            raise _Invalid(f"{what}: expected {rule.expected()}, got {_kind_of(value)}")
        if value.strip("0") == "":
            if rule.kind == "parent":
                return None  # an all-zero parent means none, as protobuf's empty bytes do
            raise _Invalid(f"{what}: expected {rule.expected()}, got all zero")
        return value.lower()
    if rule.kind == "enum":
        if isinstance(value, str):
            raise _Invalid(f"{what}: expected an integer 0-{rule.bound} (OTLP/JSON forbids enum names), got "
                           f"{_kind_of(value)}")  # fmt: skip
        return _integer(value, what, 0, int(rule.bound))
    if rule.kind == "time":
        return _integer(value, what, 0, int(rule.bound))
    return _text(value, what)


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
        return {"intValue": str(_integer(item, where, INT64_MIN, INT64_MAX))}
    if key == "doubleValue":
        return _double_value(_double(item, where))
    if key == "arrayValue":
        values = _list(_object(item, where).get("values"), f"{where}.values")
        return {"arrayValue": {"values": [_any(v, f"{where}.values[{i}]", depth + 1) for i, v in enumerate(values)]}}
    if key == "kvlistValue":
        values = _list(_object(item, where).get("values"), f"{where}.values")
        return {"kvlistValue": {"values": _key_values(values, f"{where}.values", depth + 1)}}
    return {"bytesValue": _bytes_value(item, where)}


def _key_values(values: list[Any], what: str, depth: int = 0, dups: list[str] | None = None) -> list[JsonObject]:
    """``KeyValue`` objects in canonical form; a repeated key keeps its last value (at the
    place of its first), and is added to ``dups`` when given."""
    out: list[JsonObject] = []
    at: dict[str, int] = {}
    for i, kv in enumerate(values):
        where = f"{what}[{i}]"
        obj = _object(kv, where)
        key = _text(obj.get("key"), f"{where}.key")
        item = {"key": key, "value": _any(obj.get("value"), f"{where}.value", depth)}
        if key in at:
            out[at[key]] = item
            if dups is not None and key not in dups:
                dups.append(key)
        else:
            at[key] = len(out)
            out.append(item)
    return out


def _attributes(value: object, what: str, dups: list[str], prefix: str = "") -> list[JsonObject]:
    found: list[str] = []
    out = _key_values(_list(value, what), what, 0, found)
    dups.extend(prefix + key for key in found)
    return out


def _with_dropped(out: JsonObject, key: str, value: object, what: str | None = None) -> JsonObject:
    count = _integer(value, what or key, 0, UINT32_MAX)
    if count:
        out[key] = count
    return out


def _with_schema(out: JsonObject, schema_url: str) -> JsonObject:
    if schema_url:
        out["schemaUrl"] = schema_url
    return out


def _resource(value: object, dups: list[str]) -> JsonObject:
    obj = _object(value, "resource")
    out: JsonObject = {"attributes": _attributes(obj.get("attributes"), "attributes", dups, "resource:")}
    return _with_dropped(out, "droppedAttributesCount", obj.get("droppedAttributesCount"))


def _scope(value: object, dups: list[str]) -> JsonObject:
    if value is None:
        return {}
    obj = _object(value, "scope")
    out: JsonObject = {"name": _text(obj.get("name"), "name")}
    version = _text(obj.get("version"), "version")
    if version:
        out["version"] = version
    attributes = _attributes(obj.get("attributes"), "attributes", dups, "scope:")
    if attributes:
        out["attributes"] = attributes
    return _with_dropped(out, "droppedAttributesCount", obj.get("droppedAttributesCount"))


def _event(value: object, what: str, dups: list[str]) -> JsonObject:
    obj = _object(value, what)
    out: JsonObject = {
        "timeUnixNano": str(_ruled(EVENT_RULES[0], obj.get("timeUnixNano"), f"{what}.timeUnixNano")),
        "name": _text(obj.get("name"), f"{what}.name"),
        "attributes": _attributes(obj.get("attributes"), f"{what}.attributes", dups, f"{what}:"),
    }
    return _with_dropped(
        out, "droppedAttributesCount", obj.get("droppedAttributesCount"), f"{what}.droppedAttributesCount"
    )


def _link(value: object, what: str, dups: list[str]) -> JsonObject:
    obj = _object(value, what)
    out: JsonObject = {
        "traceId": _ruled(LINK_RULES[0], obj.get("traceId"), f"{what}.traceId"),
        "spanId": _ruled(LINK_RULES[1], obj.get("spanId"), f"{what}.spanId"),
        "attributes": _attributes(obj.get("attributes"), f"{what}.attributes", dups, f"{what}:"),
        "flags": _integer(obj.get("flags"), f"{what}.flags", 0, UINT32_MAX),
    }
    trace_state = _text(obj.get("traceState"), f"{what}.traceState")
    if trace_state:
        out["traceState"] = trace_state
    return _with_dropped(
        out, "droppedAttributesCount", obj.get("droppedAttributesCount"), f"{what}.droppedAttributesCount"
    )


def _status(value: object) -> JsonObject:
    obj = _object(value, "status")
    out: JsonObject = {"code": _ruled(_RULE["status.code", "enum"], obj.get("code"))}
    message = _text(obj.get("message"), "status.message")
    if message:
        out["message"] = message
    return out


def _span(value: object, inherited: list[str]) -> tuple[JsonObject, list[str]]:
    """One OTLP/JSON ``Span`` in canonical form, and the duplicate keys it records."""
    if not isinstance(value, dict):
        raise _Invalid(f"span: expected an object, got {_kind_of(value)}")
    out: JsonObject = {
        "traceId": _ruled(_RULE["traceId", "id"], value.get("traceId")),
        "spanId": _ruled(_RULE["spanId", "id"], value.get("spanId")),
    }
    trace_state = _text(value.get("traceState"), "traceState")
    if trace_state:
        out["traceState"] = trace_state
    parent = _ruled(_RULE["parentSpanId", "parent"], value.get("parentSpanId"))
    if parent is not None:
        out["parentSpanId"] = parent
    out["flags"] = _integer(value.get("flags"), "flags", 0, UINT32_MAX)
    out["name"] = _ruled(_RULE["name", "text"], value.get("name"))
    out["kind"] = _ruled(_RULE["kind", "enum"], value.get("kind"))
    start = _ruled(_RULE["startTimeUnixNano", "time"], value.get("startTimeUnixNano"))
    end = _ruled(_RULE["endTimeUnixNano", "time"], value.get("endTimeUnixNano"))
    if end < start:
        raise _Invalid(f"endTimeUnixNano: expected {_RULE['endTimeUnixNano', 'not_before'].expected()}, "
                       f"got {end} < {start}")  # fmt: skip
    out["startTimeUnixNano"] = str(start)
    out["endTimeUnixNano"] = str(end)
    dups = list(inherited)
    attributes = _attributes(value.get("attributes"), "attributes", dups)
    out["attributes"] = attributes
    _with_dropped(out, "droppedAttributesCount", value.get("droppedAttributesCount"))
    out["events"] = [_event(e, f"events[{i}]", dups) for i, e in enumerate(_list(value.get("events"), "events"))]
    _with_dropped(out, "droppedEventsCount", value.get("droppedEventsCount"))
    out["links"] = [_link(x, f"links[{i}]", dups) for i, x in enumerate(_list(value.get("links"), "links"))]
    _with_dropped(out, "droppedLinksCount", value.get("droppedLinksCount"))
    out["status"] = _status(value.get("status"))
    if dups:
        kept = [a for a in attributes if a["key"] != DUPLICATE_KEYS]
        kept.append({"key": DUPLICATE_KEYS, "value": {"arrayValue": {"values": [{"stringValue": d} for d in dups]}}})
        out["attributes"] = kept
    return out, dups
