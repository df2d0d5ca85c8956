"""Every input format other than OTLP JSON lines, converted to OTLP/JSON ``TracesData``.

The store ingests one shape only: OTLP/JSON ``TracesData`` objects (``{"resourceSpans":
[...]}``) in the encoding of :mod:`treellm.otlp` (lowercase hex ids, 64-bit integers as
decimal strings, ``AnyValue`` objects, OTLP span kinds INTERNAL=1 ... CONSUMER=5, status
codes UNSET=0, OK=1, ERROR=2). This module turns the other inputs into that shape and
tells the formats apart. OTLP JSON lines are read elsewhere, as they are.

Contract:

- The converters (:func:`proto_to_traces_data`, :func:`sdk_json_to_traces_data`,
  :func:`trajectories_to_traces_data`) are pure: they take bytes or parsed JSON, never
  mutate it, and build new dicts. A malformed record raises
  :class:`~treellm.errors.IngestError` with ``path`` and ``record`` (the 0-based index of
  the protobuf message, the span or the run) and a reason naming the field; nothing else
  is raised for bad input. Output is deterministic: no clock, no randomness.
- :func:`detect_format` and :func:`iter_traces_data` are the thin readers. Detection reads
  only a prefix (the first line, a growing prefix of a JSON document up to 64 MiB, or the
  first protobuf message); :func:`iter_traces_data` reads the small formats whole.
  An unreadable file is an ``IngestError``.

Recognised variants:

- ``otlp-jsonl``: the first non-space byte is ``{`` and the first line is a complete JSON
  object with ``resourceSpans``. An empty or blank file is reported as ``otlp-jsonl`` too
  (the ingester reports empty files).
- ``otlp-json``: one (possibly pretty-printed) ``TracesData`` object, several of them one
  after the other, or a JSON list of them; each object is one record.
- ``otlp-proto``: one serialized ``TracesData`` (``ExportTraceServiceRequest`` has the
  same wire layout: field 1 = ``resource_spans``), or the OpenTelemetry Collector file
  exporter's ``format: proto``, which frames every message with its length. Its README
  (https://github.com/open-telemetry/opentelemetry-collector-contrib/blob/main/exporter/fileexporter/README.md,
  "File Format") says: "each encoded object is preceded by 4 bytes (an unsigned 32 bit
  integer) which represent the number of bytes contained in the encoded object", and its
  ``file_writer.go`` writes that length with ``binary.BigEndian.PutUint32``. Framing is
  decided per file: when the 4-byte big-endian prefixes tile the data and the first frame
  parses, the file is framed (a truncated last frame is reported by its index); otherwise
  it is one message. Each message is one record. Ids become hex (not protobuf JSON's
  base64), ``bytesValue`` base64, enums integers.
- ``sdk-json``: spans as the OpenTelemetry Python SDK's ``ReadableSpan.to_json()`` writes
  them, as ``{"spans": [...]}`` (other keys ignored) or a bare list. Ids may be hex
  strings, ``0x`` hex or integers; kinds ``"SpanKind.INTERNAL"``, ``"internal"`` or the
  SDK's integer; times ISO 8601 (UTC unless an offset is given) or integer nanoseconds;
  the parent as ``parent_id`` or ``parent: {span_id, is_remote}``; the resource as
  ``{"attributes": {...}, "schema_url": ...}`` or a flat dict; an optional
  ``instrumentation_scope``. A span whose parent is not in the file becomes a root and
  carries ``treellm.ingest.orphan_parent`` = the parent's hex id. Spans are grouped by
  resource then scope, in first-seen order. The whole file is one record.
- ``trajectory``: OpenAI chat-format runs: a bare list of messages, an object with a
  ``messages`` or ``traj`` list (its other scalar fields become
  ``treellm.trajectory.<key>`` on the run span), or a JSON list of such runs (an empty
  list holds no runs). Each run is one trace and one record, shaped like treellm's own
  runs: a root ``invoke_agent trajectory`` span, then, as its children in message order,
  a ``chat`` span per assistant message and an ``execute_tool {name}`` span per tool call
  carrying the raw argument text and the paired result. Results pair with calls by
  ``tool_call_id``; when an id repeats, the k-th tool message with id X answers the k-th
  call with id X. Ids are a hash of the run's content and its index in the file, so the
  same file ingested again, from any path, adds nothing; times are synthetic (1 ms per
  message from a fixed epoch) so that time order is message order.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any, Final, Literal

import orjson
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from google.protobuf.unknown_fields import UnknownFieldSet  # type: ignore[import-untyped]
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, TracesData

from treellm.errors import IngestError
from treellm.otlp import any_value, key_values
from treellm.telemetry import semconv as sc

__all__ = [
    "InputFormat",
    "detect_format",
    "iter_traces_data",
    "proto_to_traces_data",
    "sdk_json_to_traces_data",
    "trajectories_to_traces_data",
]

logger = logging.getLogger(__name__)

InputFormat = Literal["otlp-jsonl", "otlp-json", "otlp-proto", "sdk-json", "trajectory"]
JsonObject = dict[str, Any]

# Attribute names this module adds (candidates for telemetry/semconv.py).
_ORPHAN_PARENT: Final = "treellm.ingest.orphan_parent"
_TRAJECTORY_PREFIX: Final = "treellm.trajectory."
_TRAJECTORY_INDEX: Final = "treellm.trajectory.index"
_SCOPE_NAME: Final = "treellm.store.foreign"
_SERVICE_NAME: Final = "service.name"

_SPAN_KINDS: Final = {"UNSPECIFIED": 0, "INTERNAL": 1, "SERVER": 2, "CLIENT": 3, "PRODUCER": 4, "CONSUMER": 5}
_STATUS_CODES: Final = {"UNSET": 0, "OK": 1, "ERROR": 2}
_KIND_INTERNAL: Final = 1
_KIND_CLIENT: Final = 3
_FLAGS_HAS_IS_REMOTE: Final = 0x100
_FLAGS_IS_REMOTE: Final = 0x200
_SYNTHETIC_FLAGS: Final = 0x101  # sampled, parent known to be local (as treellm.otlp writes it)
_INT64_MAX: Final = 2**63 - 1
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)

_TRAJECTORY_EPOCH_NS: Final = 1_704_067_200 * 10**9  # 2024-01-01T00:00:00Z
_RUN_SPACING_NS: Final = 60 * 10**9
_MESSAGE_NS: Final = 10**6

_SNIFF_BYTES: Final = 1 << 16
_MAX_SNIFF_BYTES: Final = 64 << 20
_SPACE: Final = b" \t\r\n"
_BOM: Final = b"\xef\xbb\xbf"


class _Malformed(Exception):
    """Why a record is malformed; becomes an IngestError where the record index is known."""


def _kind_of(value: object) -> str:
    return "null" if value is None else type(value).__name__


# --- reading files --------------------------------------------------------------------------------


def _read_bytes(path: str | os.PathLike[str], display: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise IngestError(f"cannot read the file ({exc.strerror or exc})", path=display) from exc


def _load_json(data: bytes, display: str) -> Any:
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise IngestError(f"invalid JSON: {exc.msg} (column {exc.colno})", path=display, line=exc.lineno) from exc
    except UnicodeDecodeError as exc:
        raise IngestError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=display) from exc
    except RecursionError as exc:
        raise IngestError("JSON nested too deeply", path=display) from exc


# --- detection --------------------------------------------------------------------------------------


def detect_format(path: str | os.PathLike[str]) -> InputFormat:
    """The format of the file at ``path``, sniffed from its first bytes (see the module docstring).

    Raises :class:`IngestError` naming the file and what it starts with when no format fits.
    """
    display = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            start, first = _first_byte(handle)
            if first is None:
                return "otlp-jsonl"
            seen = ""
            if first in b"{[":
                found, seen = _sniff_json(handle, start, size, first=first)
                if found is not None:
                    return found
            if _sniff_proto(handle, size):
                return "otlp-proto"
            handle.seek(start)
            head = handle.read(48)
    except OSError as exc:
        raise IngestError(f"cannot read the file ({exc.strerror or exc})", path=display) from exc
    raise IngestError(
        f"unrecognised input: {seen or _describe_bytes(head)}; expected OTLP JSON lines, an OTLP/JSON "
        "object, OTLP protobuf, OpenTelemetry SDK span JSON or OpenAI chat trajectories",
        path=display,
    )


def _first_byte(handle: IO[bytes]) -> tuple[int, int | None]:
    """Offset and value of the first byte that is not whitespace (or a UTF-8 BOM)."""
    offset = 0
    while chunk := handle.read(_SNIFF_BYTES):
        skip = len(_BOM) if offset == 0 and chunk.startswith(_BOM) else 0
        rest = chunk[skip:].lstrip(_SPACE)
        if rest:
            return offset + len(chunk) - len(rest), rest[0]
        offset += len(chunk)
    return offset, None


def _describe_bytes(head: bytes) -> str:
    text = head.decode("utf-8", "replace")
    if all(c.isprintable() or c.isspace() for c in text):
        return f"it starts with {text[:40]!r}"
    return f"it starts with the bytes {head[:16].hex(' ')}"


def _loads_quietly(line: bytes) -> object:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


def _sniff_json(handle: IO[bytes], start: int, size: int, *, first: int) -> tuple[InputFormat | None, str]:
    """The JSON format at ``start`` (or None) and, when None, a description of what was seen."""
    line = b""
    if first == ord("{"):
        handle.seek(start)
        line = handle.readline()
        doc = _loads_quietly(line)
        if isinstance(doc, dict) and "resourceSpans" in doc:
            return "otlp-jsonl", ""
    length = _SNIFF_BYTES
    while True:
        handle.seek(start)
        buf = handle.read(length)
        eof = start + len(buf) >= size
        try:
            found, seen = _classify_json(buf, eof=eof)
        except _Truncated:
            if length >= _MAX_SNIFF_BYTES:
                return None, f"no recognised key in the first {_MAX_SNIFF_BYTES >> 20} MiB of JSON"
            length *= 4
            continue
        except _NotJson as exc:
            return None, f"it starts like JSON but is not ({exc})"
        if found == "otlp-json" and b'"resourceSpans"' in line:
            # The first line holds the key but is not a complete object: a JSON lines file
            # whose first line is broken; the line reader reports it by its line number.
            return "otlp-jsonl", ""
        return found, seen


class _Truncated(Exception):
    """The sniffed prefix ends inside the part of the document that decides the format."""


class _NotJson(Exception):
    """The sniffed prefix is not JSON."""


_TOKEN = re.compile(rb'[ \t\r\n]*("[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\]:,]|-?[0-9][0-9.eE+-]*|true|false|null)', re.DOTALL)


def _skip_space(buf: bytes, pos: int, *, eof: bool) -> int:
    while pos < len(buf) and buf[pos] in _SPACE:
        pos += 1
    if pos >= len(buf):
        raise _NotJson("it ends early") if eof else _Truncated
    return pos


def _object_keys(buf: bytes, pos: int, *, eof: bool) -> Iterator[tuple[str, int]]:
    """Keys of the object opening at ``buf[pos]``, each with the first byte of its value."""
    depth, state, key = 0, "open", ""
    while True:
        match = _TOKEN.match(buf, pos)
        if match is None:
            rest = buf[pos:].lstrip(_SPACE)
            if not eof and (rest[:1] == b'"' or len(rest) < 8):
                raise _Truncated
            raise _NotJson(f"unexpected {rest[:12]!r}" if rest else "it ends early")
        pos = match.end()
        token = match.group(1)
        if depth >= 2:
            depth += (token in (b"{", b"[")) - (token in (b"}", b"]"))
        elif state == "open":
            if token != b"{":
                raise _NotJson("expected an object")
            depth, state = 1, "key"
        elif state in ("key", "comma") and token == b"}":
            return
        elif state == "key" and token[:1] == b'"':
            try:
                key = json.loads(token)
            except (ValueError, UnicodeDecodeError) as exc:
                raise _NotJson("a key is not a JSON string") from exc
            state = "colon"
        elif state == "colon" and token == b":":
            state = "value"
        elif state == "value" and token not in (b"}", b"]", b":", b","):
            yield key, token[0]
            state = "comma"
            if token in (b"{", b"["):
                depth = 2
        elif state == "comma" and token == b",":
            state = "key"
        else:
            raise _NotJson(f"unexpected {token[:12]!r}")


def _object_format(keys: Mapping[str, int], *, element: bool) -> InputFormat | None:
    """The format an object's keys decide (``element``: an item of a top-level list)."""
    if "resourceSpans" in keys:
        return "otlp-json"
    if keys.get("messages") == ord("[") or keys.get("traj") == ord("["):
        return "trajectory"
    if element and "role" in keys:
        return "trajectory"
    if "context" in keys and "name" in keys:
        return "sdk-json"  # a list of spans, or a single span
    if not element and keys.get("spans") == ord("["):
        return "sdk-json"
    return None


def _classify_json(buf: bytes, *, eof: bool) -> tuple[InputFormat | None, str]:
    if buf[:1] == b"{":
        return _classify_object(buf, 0, eof=eof, element=False, what="a JSON object")
    pos = _skip_space(buf, 1, eof=eof)
    if buf[pos] == ord("]"):
        return "trajectory", ""  # an empty list: no runs, no spans
    if buf[pos] == ord("{"):
        return _classify_object(buf, pos, eof=eof, element=True, what="a JSON list of objects")
    if buf[pos] == ord("["):
        inner = _skip_space(buf, pos + 1, eof=eof)
        if buf[inner] == ord("]"):
            return "trajectory", ""
        if buf[inner] == ord("{"):
            keys = dict(_object_keys(buf, inner, eof=eof))
            if "role" in keys:
                return "trajectory", ""
            return None, f"a JSON list of lists of objects with keys {sorted(keys)[:12]}"
    return None, "a JSON list of neither objects nor lists of objects"


def _classify_object(buf: bytes, pos: int, *, eof: bool, element: bool, what: str) -> tuple[InputFormat | None, str]:
    keys: dict[str, int] = {}
    for key, first in _object_keys(buf, pos, eof=eof):
        keys[key] = first
        found = _object_format(keys, element=element)
        if found is not None:
            return found, ""
    return None, f"{what} with keys {sorted(keys)[:12]}"


def _sniff_proto(handle: IO[bytes], size: int) -> bool:
    """Whether the file starts with a length-prefixed or a bare ``TracesData`` message."""
    handle.seek(0)
    head = handle.read(16)
    if head[:1] == b"\x0a":  # field 1 (resource_spans), wire type 2: a bare message
        length, used = _varint(head, 1)
        if length is not None and 1 + used + length <= size:
            handle.seek(1 + used)
            try:
                ResourceSpans.FromString(handle.read(length))
            except DecodeError:
                pass
            else:
                return True
    if len(head) >= 4:
        length = int.from_bytes(head[:4], "big")
        if 4 + length <= size:
            handle.seek(4)
            return _parse_traces_data(handle.read(length))[0] is not None
    return False


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


# --- the generic entry point -------------------------------------------------------------------------


def iter_traces_data(path: str | os.PathLike[str], input_format: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(record index, OTLP/JSON ``TracesData``) of a file in one of the non-line formats.

    A record is an OTLP/JSON object (``otlp-json``), a protobuf message (``otlp-proto``),
    the whole file (``sdk-json``) or a run (``trajectory``). The file is read whole.
    Raises :class:`IngestError` for an unreadable or malformed file, ``ValueError`` for
    ``otlp-jsonl`` or an unknown format name (a caller's bug).
    """
    display = os.fspath(path)
    if input_format == "otlp-proto":
        yield from enumerate(proto_to_traces_data(_read_bytes(path, display), path=display))
    elif input_format == "otlp-json":
        yield from _otlp_json_documents(_read_bytes(path, display), path=display)
    elif input_format == "sdk-json":
        yield 0, sdk_json_to_traces_data(_load_json(_read_bytes(path, display), display), path=display)
    elif input_format == "trajectory":
        agent = Path(display).stem
        runs = _runs(_load_json(_read_bytes(path, display), display), path=display)
        for index, run in enumerate(runs):
            yield (
                index,
                _trajectory_document(_checked_run_spans(run, index, agent=agent, path=display), agent),
            )
    else:
        raise ValueError(f"iter_traces_data reads otlp-json, otlp-proto, sdk-json or trajectory, not {input_format!r}")


_NOT_SPACE = re.compile(r"\S")


def _after_space(text: str, pos: int) -> int:
    match = _NOT_SPACE.search(text, pos)
    return len(text) if match is None else match.start()


def _otlp_json_documents(data: bytes, *, path: str) -> Iterator[tuple[int, JsonObject]]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise IngestError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=path) from exc
    decoder = json.JSONDecoder()
    index = 0
    pos = _after_space(text, 0)
    while pos < len(text):
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise IngestError(f"invalid JSON: {exc.msg} (column {exc.colno})", path=path, line=exc.lineno) from exc
        for item in obj if isinstance(obj, list) else [obj]:
            if not isinstance(item, dict) or not isinstance(item.get("resourceSpans"), list):
                raise IngestError(
                    f"expected an OTLP/JSON TracesData object (with resourceSpans), got {_kind_of(item)}",
                    path=path,
                    record=index,
                )
            yield index, item
            index += 1
        pos = _after_space(text, end)


# --- OTLP protobuf ------------------------------------------------------------------------------------


def proto_to_traces_data(data: bytes, *, path: str) -> Iterator[dict[str, Any]]:
    """OTLP/JSON ``TracesData`` for each protobuf message in ``data``, in order.

    ``data`` is one serialized ``TracesData`` / ``ExportTraceServiceRequest`` or the
    Collector file exporter's 4-byte big-endian length-prefixed messages (see the module
    docstring). A truncated or corrupt message raises :class:`IngestError` with its index
    as ``record``, after the messages before it were yielded.
    """
    for index, message in _proto_messages(data, path=path):
        try:
            yield _traces_data_json(message)
        except _Malformed as exc:
            raise IngestError(str(exc), path=path, record=index) from None


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


def _hex_id(value: bytes, size: int, what: str) -> str:
    if len(value) != size:
        raise _Malformed(f"{what} has {len(value)} bytes, expected {size}")
    if not any(value):
        raise _Malformed(f"{what} is all zero")
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


def _proto_span(span: Any, where: str) -> JsonObject:
    out: JsonObject = {
        "traceId": _hex_id(span.trace_id, 16, f"{where}.traceId"),
        "spanId": _hex_id(span.span_id, 8, f"{where}.spanId"),
    }
    if span.trace_state:
        out["traceState"] = span.trace_state
    if span.parent_span_id and any(span.parent_span_id):
        out["parentSpanId"] = _hex_id(span.parent_span_id, 8, f"{where}.parentSpanId")
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
    out["links"] = [_proto_link(link, f"{where}.links[{i}]") for i, link in enumerate(span.links)]
    _with_dropped(out, "droppedLinksCount", span.dropped_links_count)
    status: JsonObject = {"code": span.status.code}
    if span.status.message:
        status["message"] = span.status.message
    out["status"] = status
    return out


def _proto_link(link: Any, where: str) -> JsonObject:
    out: JsonObject = {
        "traceId": _hex_id(link.trace_id, 16, f"{where}.traceId"),
        "spanId": _hex_id(link.span_id, 8, f"{where}.spanId"),
        "attributes": _proto_attributes(link.attributes),
        "flags": link.flags,
    }
    if link.trace_state:
        out["traceState"] = link.trace_state
    return _with_dropped(out, "droppedAttributesCount", link.dropped_attributes_count)


def _with_schema(out: JsonObject, schema_url: str) -> JsonObject:
    if schema_url:
        out["schemaUrl"] = schema_url
    return out


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
    for r, rs in enumerate(message.resource_spans):
        resource = _with_dropped(
            {"attributes": _proto_attributes(rs.resource.attributes)},
            "droppedAttributesCount",
            rs.resource.dropped_attributes_count,
        )
        scope_spans = [
            _with_schema(
                {
                    "scope": _proto_scope(ss),
                    "spans": [
                        _proto_span(span, f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}]")
                        for i, span in enumerate(ss.spans)
                    ],
                },
                ss.schema_url,
            )
            for s, ss in enumerate(rs.scope_spans)
        ]
        resource_spans.append(_with_schema({"resource": resource, "scopeSpans": scope_spans}, rs.schema_url))
    return {"resourceSpans": resource_spans}


# --- OpenTelemetry SDK span JSON ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _SdkSpan:
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


def sdk_json_to_traces_data(obj: object, *, path: str) -> dict[str, Any]:
    """OTLP/JSON ``TracesData`` of OpenTelemetry SDK span JSON (see the module docstring).

    ``obj`` is the parsed file: ``{"spans": [...]}`` or a list of spans. A malformed span
    raises :class:`IngestError` with its index as ``record``.
    """
    spans: list[_SdkSpan] = []
    for index, raw in enumerate(_sdk_span_list(obj, path=path)):
        try:
            spans.append(_sdk_span(raw))
        except _Malformed as exc:
            raise IngestError(str(exc), path=path, record=index) from None
    known = {(s.trace_id, s.span_id) for s in spans}
    groups: dict[str, tuple[JsonObject, dict[str, JsonObject]]] = {}
    for span in spans:
        resource_key = _group_key(span.resource, span.resource_schema)
        if resource_key not in groups:
            groups[resource_key] = (
                _with_schema({"resource": span.resource, "scopeSpans": []}, span.resource_schema),
                {},
            )
        resource_spans, scopes = groups[resource_key]
        scope_key = _group_key(span.scope, span.scope_schema)
        if scope_key not in scopes:
            scopes[scope_key] = _with_schema({"scope": span.scope, "spans": []}, span.scope_schema)
            resource_spans["scopeSpans"].append(scopes[scope_key])
        scopes[scope_key]["spans"].append(_sdk_span_json(span, known))
    return {"resourceSpans": [resource_spans for resource_spans, _ in groups.values()]}


def _group_key(value: JsonObject, schema_url: str) -> str:
    return json.dumps([value, schema_url], sort_keys=True, default=str)


def _sdk_span_list(obj: object, *, path: str) -> list[Any]:
    if isinstance(obj, Mapping) and isinstance(obj.get("spans"), list):
        return list(obj["spans"])
    if isinstance(obj, list):
        return obj
    if isinstance(obj, Mapping) and "context" in obj and "name" in obj:
        return [obj]
    raise IngestError(f'expected {{"spans": [...]}} or a list of SDK spans, got {_kind_of(obj)}', path=path)


def _sdk_span_json(span: _SdkSpan, known: set[tuple[str, str]]) -> JsonObject:
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
            {"key": _ORPHAN_PARENT, "value": {"stringValue": span.parent_id}},
        ]
    return out


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _Malformed(f"{what}: expected an object, got {_kind_of(value)}")
    return value


def _sequence(value: object, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Malformed(f"{what}: expected a list, got {_kind_of(value)}")
    return value


def _sdk_span(raw: object) -> _SdkSpan:
    if not isinstance(raw, Mapping):
        raise _Malformed(f"expected a span object, got {_kind_of(raw)}")
    name = raw.get("name")
    if not isinstance(name, str):
        raise _Malformed(f"name: expected text, got {_kind_of(name)}")
    context = _mapping(raw.get("context"), "context")
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
        "attributes": key_values(_mapping(raw.get("attributes"), "attributes")),
        "events": [_sdk_event(e, f"events[{j}]") for j, e in enumerate(_sequence(raw.get("events"), "events"))],
        "links": [_sdk_link(link, f"links[{j}]") for j, link in enumerate(_sequence(raw.get("links"), "links"))],
        "status": _sdk_status(raw.get("status")),
    }
    trace_state = _trace_state(context.get("trace_state"))
    return _SdkSpan(trace_id, span_id, trace_state, parent_id, body, resource, resource_schema, scope, scope_schema)


def _hex_text(value: object, digits: int, what: str) -> str:
    """An id given as an integer, hex text or ``0x`` hex, as ``digits`` lowercase hex digits."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < 16**digits:
            raise _Malformed(f"{what}: {value} does not fit in {digits * 4} bits")
        return f"{value:0{digits}x}"
    if isinstance(value, str):
        text = value.strip().lower().removeprefix("0x")
        if text and len(text) <= digits and all(c in "0123456789abcdef" for c in text):
            return text.rjust(digits, "0")
    raise _Malformed(f"{what}: expected a {digits}-digit hex id or an integer, got {value!r}")


def _own_id(value: object, digits: int, what: str) -> str:
    text = _hex_text(value, digits, what)
    if text.strip("0") == "":
        raise _Malformed(f"{what} is all zero")
    return text


def _sdk_parent(raw: Mapping[str, Any]) -> tuple[str | None, bool | None]:
    """The parent span id (None for a root) and whether the parent is remote (None: not said)."""
    parent = raw.get("parent")
    if parent is not None:
        parent = _mapping(parent, "parent")
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
        entries = _mapping(value.get("entries", value), "context.trace_state")
        return ",".join(f"{k}={v}" for k, v in entries.items())
    if isinstance(value, list) and all(isinstance(p, list | tuple) and len(p) == 2 for p in value):
        return ",".join(f"{k}={v}" for k, v in value)
    raise _Malformed(f"context.trace_state: expected text or an object, got {_kind_of(value)}")


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
    raise _Malformed(f"kind: expected a span kind such as 'SpanKind.INTERNAL', got {value!r}")


def _sdk_status(value: object) -> JsonObject:
    status = _mapping(value, "status")
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
        raise _Malformed(f"status.status_code: expected UNSET, OK or ERROR, got {code!r}")
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
        raise _Malformed(f"{what}: expected an ISO 8601 time or integer nanoseconds, got {value!r}")
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
    event = _mapping(raw, what)
    name = event.get("name")
    if not isinstance(name, str):
        raise _Malformed(f"{what}.name: expected text, got {_kind_of(name)}")
    return {
        "timeUnixNano": str(_time_ns(event.get("timestamp"), f"{what}.timestamp")),
        "name": name,
        "attributes": key_values(_mapping(event.get("attributes"), f"{what}.attributes")),
    }


def _sdk_link(raw: object, what: str) -> JsonObject:
    link = _mapping(raw, what)
    context = _mapping(link.get("context"), f"{what}.context")
    remote = context.get("is_remote")
    out: JsonObject = {
        "traceId": _own_id(context.get("trace_id"), 32, f"{what}.context.trace_id"),
        "spanId": _own_id(context.get("span_id"), 16, f"{what}.context.span_id"),
        "attributes": key_values(_mapping(link.get("attributes"), f"{what}.attributes")),
        "flags": _flags(context, remote if isinstance(remote, bool) else None),
    }
    trace_state = _trace_state(context.get("trace_state"))
    if trace_state:
        out["traceState"] = trace_state
    return out


def _sdk_resource(value: object) -> tuple[JsonObject, str]:
    resource = _mapping(value, "resource")
    attributes = resource.get("attributes")
    if isinstance(attributes, Mapping) and set(resource) <= {"attributes", "schema_url"}:
        schema_url = resource.get("schema_url")
        return {"attributes": key_values(attributes)}, schema_url if isinstance(schema_url, str) else ""
    return {"attributes": key_values(resource)}, ""  # a flat dict of resource attributes


def _sdk_scope(value: object) -> tuple[JsonObject, str]:
    if value is None:
        return {}, ""
    scope = _mapping(value, "instrumentation_scope")
    out: JsonObject = {"name": str(scope.get("name") or "")}
    if scope.get("version"):
        out["version"] = str(scope["version"])
    attributes = _mapping(scope.get("attributes"), "instrumentation_scope.attributes")
    if attributes:
        out["attributes"] = key_values(attributes)
    schema_url = scope.get("schema_url")
    return out, schema_url if isinstance(schema_url, str) else ""


# --- OpenAI chat-format trajectories ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Call:
    """One tool call of an assistant message."""

    message: int
    position: int
    siblings: int  # tool calls in the same message
    call_id: str | None
    name: str
    arguments: str
    tool_type: str | None


@dataclass(frozen=True, slots=True)
class _Result:
    message: int
    text: str | None


def trajectories_to_traces_data(obj: object, *, path: str) -> dict[str, Any]:
    """OTLP/JSON ``TracesData`` of OpenAI chat-format runs, one trace per run.

    ``obj`` is the parsed file (see the module docstring for the accepted shapes);
    ``path`` names the file in errors and gives the agent name (its stem). A malformed run
    raises :class:`IngestError` with its index as ``record``.
    """
    agent = Path(path).stem
    spans: list[JsonObject] = []
    for index, run in enumerate(_runs(obj, path=path)):
        spans.extend(_checked_run_spans(run, index, agent=agent, path=path))
    return _trajectory_document(spans, agent)


def _trajectory_document(spans: list[JsonObject], agent: str) -> JsonObject:
    if not spans:
        return {"resourceSpans": []}
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": key_values({_SERVICE_NAME: agent})},
                "scopeSpans": [{"scope": {"name": _SCOPE_NAME}, "spans": spans}],
            }
        ]
    }


def _is_message(value: object) -> bool:
    return isinstance(value, Mapping) and "role" in value


def _runs(obj: object, *, path: str) -> list[Any]:
    """The runs of a parsed trajectory file: one (a message list or a run object) or a list of them."""
    if isinstance(obj, Mapping):
        return [obj]
    if isinstance(obj, list):
        return [obj] if obj and _is_message(obj[0]) else obj
    expected = "a list of chat messages, an object with messages or traj, or a list of runs"
    raise IngestError(f"expected {expected}; got {_kind_of(obj)}", path=path)


def _checked_run_spans(run: object, index: int, *, agent: str, path: str) -> list[JsonObject]:
    try:
        return _run_spans(run, index, agent=agent)
    except _Malformed as exc:
        raise IngestError(str(exc), path=path, record=index) from None


def _run_parts(run: object) -> tuple[list[Any], dict[str, str | int | float | bool]]:
    """A run's messages and the scalar fields of its object (none for a bare list)."""
    if isinstance(run, list):
        return run, {}
    if isinstance(run, Mapping):
        for key in ("messages", "traj"):
            if isinstance(run.get(key), list):
                fields = {
                    str(k): v
                    for k, v in run.items()
                    if k not in ("messages", "traj") and isinstance(v, str | int | float | bool)
                }
                return run[key], fields
        raise _Malformed("a run object needs a messages or traj list")
    raise _Malformed(f"expected a run (a list of messages or an object with messages or traj), got {_kind_of(run)}")


def _argument_text(value: object) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _tool_calls(message: Mapping[str, Any], j: int) -> list[_Call]:
    raw = _sequence(message.get("tool_calls"), f"message {j}: tool_calls")
    calls = []
    for k, call in enumerate(raw):
        what = f"message {j}, tool call {k}"
        function = _mapping(_mapping(call, what).get("function"), f"{what}: function")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise _Malformed(f"{what}: no function name")
        call_id, tool_type = call.get("id"), call.get("type")
        calls.append(
            _Call(
                message=j,
                position=k,
                siblings=len(raw),
                call_id=call_id if isinstance(call_id, str) and call_id else None,
                name=name,
                arguments=_argument_text(function.get("arguments")),
                tool_type=tool_type if isinstance(tool_type, str) else None,
            )
        )
    return calls


def _result_text(content: object) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, Mapping) and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    return json.dumps(content, ensure_ascii=False, default=str)


def _read_messages(messages: list[Any]) -> tuple[list[int], list[_Call], dict[int, _Result]]:
    """Assistant message indices, tool calls in message order, and each answered call's result.

    A tool message answers the oldest unanswered call with its ``tool_call_id`` (so the
    k-th tool message with id X answers the k-th call with id X).
    """
    chats: list[int] = []
    calls: list[_Call] = []
    results: dict[int, _Result] = {}
    waiting: dict[str | None, deque[int]] = {}
    for j, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise _Malformed(f"message {j}: expected an object, got {_kind_of(message)}")
        role = message.get("role")
        if role == "assistant":
            chats.append(j)
            for call in _tool_calls(message, j):
                waiting.setdefault(call.call_id, deque()).append(len(calls))
                calls.append(call)
        elif role == "tool":
            call_id = message.get("tool_call_id")
            queue = waiting.get(call_id if isinstance(call_id, str) and call_id else None)
            if queue:
                results[queue.popleft()] = _Result(j, _result_text(message.get("content")))
            else:
                logger.debug("message %d answers no open tool call (id %r)", j, call_id)
        elif not isinstance(role, str):
            raise _Malformed(f"message {j}: expected a role, got {_kind_of(role)}")
    return chats, calls, results


def _run_digest(run: object, index: int) -> bytes:
    content = json.dumps(run, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(b"treellm.trajectory\x00%d\x00%s" % (index, content.encode("ascii"))).digest()


def _nonzero_hex(value: bytes) -> str:
    return value.hex() if any(value) else (b"\x00" * (len(value) - 1) + b"\x01").hex()


class _SpanIds:
    """Span ids of one run: a hash of the run's digest and a sequence number."""

    def __init__(self, digest: bytes) -> None:
        self._digest = digest
        self._next = 0

    def next(self) -> str:
        value = hashlib.sha256(self._digest + self._next.to_bytes(8, "big")).digest()[:8]
        self._next += 1
        return _nonzero_hex(value)


def _synthetic_span(
    ids: tuple[str, str, str | None],
    name: str,
    kind: int,
    times: tuple[int, int],
    attributes: Mapping[str, Any],
) -> JsonObject:
    trace_id, span_id, parent_id = ids
    out: JsonObject = {"traceId": trace_id, "spanId": span_id}
    if parent_id is not None:
        out["parentSpanId"] = parent_id
    out.update(
        flags=_SYNTHETIC_FLAGS,
        name=name,
        kind=kind,
        startTimeUnixNano=str(times[0]),
        endTimeUnixNano=str(times[1]),
        attributes=key_values(attributes),
        events=[],
        links=[],
        status={"code": 0},
    )
    return out


_CHAT_ATTRIBUTES: Final = {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT}


def _run_spans(run: object, index: int, *, agent: str) -> list[JsonObject]:
    """The spans of one run: its root, then a chat span per assistant message, each followed
    by an execute_tool span per tool call, all children of the root, in message order."""
    messages, fields = _run_parts(run)
    chats, calls, results = _read_messages(messages)
    digest = _run_digest(run, index)
    trace_id = _nonzero_hex(digest[:16])
    ids = _SpanIds(digest)
    root_id = ids.next()
    base = _TRAJECTORY_EPOCH_NS + index * _RUN_SPACING_NS

    def at(j: int) -> int:
        return base + (j + 1) * _MESSAGE_NS

    root_attributes: dict[str, Any] = {
        sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT,
        sc.GEN_AI_AGENT_NAME: agent,
        sc.RUN_ID: f"{trace_id}:{root_id}",
        _TRAJECTORY_INDEX: index,
    }
    for key, value in fields.items():
        root_attributes.setdefault(_TRAJECTORY_PREFIX + key, value)
    root_name = f"{sc.OP_INVOKE_AGENT} trajectory"
    root_times = (base, at(len(messages)))
    spans = [_synthetic_span((trace_id, root_id, None), root_name, _KIND_INTERNAL, root_times, root_attributes)]
    next_call = 0
    for j in chats:
        chat_ids = (trace_id, ids.next(), root_id)
        chat_times = (at(j), at(j) + _MESSAGE_NS // 4)
        spans.append(_synthetic_span(chat_ids, sc.OP_CHAT, _KIND_CLIENT, chat_times, _CHAT_ATTRIBUTES))
        while next_call < len(calls) and calls[next_call].message == j:
            spans.append(_tool_span(calls[next_call], results.get(next_call), (trace_id, ids.next(), root_id), at))
            next_call += 1
    return spans


def _tool_span(
    call: _Call, result: _Result | None, ids: tuple[str, str, str | None], at: Callable[[int], int]
) -> JsonObject:
    step = (_MESSAGE_NS // 2) // call.siblings
    start = at(call.message) + _MESSAGE_NS // 2 + call.position * step
    end = at(result.message) + _MESSAGE_NS // 2 if result is not None else start
    attributes: dict[str, Any] = {
        sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL,
        sc.GEN_AI_TOOL_NAME: call.name,
    }
    if call.call_id is not None:
        attributes[sc.GEN_AI_TOOL_CALL_ID] = call.call_id
    if call.tool_type is not None:
        attributes[sc.GEN_AI_TOOL_TYPE] = call.tool_type
    attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS] = call.arguments
    if result is not None and result.text is not None:
        attributes[sc.GEN_AI_TOOL_CALL_RESULT] = result.text
    return _synthetic_span(
        ids, f"{sc.OP_EXECUTE_TOOL} {call.name}", _KIND_INTERNAL, (start, max(start, end)), attributes
    )
