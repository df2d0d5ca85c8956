"""One agent run read from a transcript (chat messages, SWE-agent steps) as the spans of one trace.

A reader (``trajectory``, ``swe-agent``) turns a run into a :class:`RunReading`: how many
positions it has (messages or steps, in order), which positions are assistant turns, the
tool calls (each at its turn's position) and each answered call's result (at the position
of the answer). :func:`run_records` turns that into one record shaped like treellm's own
runs: a root ``invoke_agent trajectory`` span, then, as its children in position order, a
``chat`` span per assistant turn followed by an ``execute_tool {name}`` span per call of
that turn, carrying the raw argument text and the paired result.

Hard rules:

- Deterministic: ids are a hash of the reader's :func:`run_digest` (the run's content, its
  index in the file and the reader's family) and a sequence number, so the same file
  ingested again, from any path, adds nothing; times are synthetic (1 ms per position from
  a fixed epoch, runs a minute apart), so time order is position order and a run's calls
  sort by ``start_ns`` in call order. No clock, no randomness.
- A call without an id of its own gets ``call_<root span id>_<k>`` (``k``: its 0-based
  index among the run's calls) when the reader sets ``synthetic_call_ids``.
- A run with assistant turns but no call is stored (its root and chat spans) and its record
  names the run's index (:func:`calls_not_found`), which the ingest turns into a warning (one
  for all such runs of a file): a reader that cannot find a format's calls says so instead of
  storing a silent run with none.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from treellm.derive.formats._base import (
    SCOPE_NAME,
    CallsNotFound,
    JsonObject,
    Malformed,
    Record,
    checked,
    mapping,
    sequence,
)
from treellm.errors import IngestError
from treellm.otlp import key_values
from treellm.telemetry import semconv as sc

Scalar = str | int | float | bool

TRAJECTORY_PREFIX: Final = "treellm.trajectory."
_TRAJECTORY_INDEX: Final = "treellm.trajectory.index"
_SERVICE_NAME: Final = "service.name"
_KIND_INTERNAL: Final = 1
_KIND_CLIENT: Final = 3
_SYNTHETIC_FLAGS: Final = 0x101  # sampled, parent known to be local (as treellm.otlp writes it)
_TRAJECTORY_EPOCH_NS: Final = 1_704_067_200 * 10**9  # 2024-01-01T00:00:00Z
_RUN_SPACING_NS: Final = 60 * 10**9
_MESSAGE_NS: Final = 10**6
_CHAT_ATTRIBUTES: Final = {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of an assistant turn: ``message`` is the turn's position, ``position``
    the call's place among the turn's ``siblings``."""

    message: int
    position: int
    siblings: int
    call_id: str | None
    name: str
    arguments: str
    tool_type: str | None = None


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A call's result: the position that answered it and its text (None: no text)."""

    message: int
    text: str | None


@dataclass(frozen=True, slots=True)
class RunReading:
    """What a reader found in one run (see the module docstring); ``results`` maps a call's
    index in ``calls`` to its result, ``fields`` become ``treellm.trajectory.<key>`` on the root,
    ``outcome`` (the result the data records, such as ``success`` or ``failure``; None: none
    recorded) becomes the run's ``treellm.run.outcome``."""

    positions: int
    chats: tuple[int, ...]
    calls: tuple[ToolCall, ...]
    results: Mapping[int, ToolResult]
    fields: Mapping[str, Scalar] = field(default_factory=dict)
    synthetic_call_ids: bool = False
    outcome: str | None = None


def run_records(
    reading: RunReading, index: int, *, digest: bytes, agent: str, path: str, looked_for: str
) -> Iterator[Record | IngestError]:
    """The run's record (its trace through the one validator), warning when it has no call."""
    spans = run_spans(reading, index, digest=digest, agent=agent)
    found = calls_not_found(reading, index, looked_for=looked_for)
    yield from checked(index, trajectory_document(spans, agent), path=path, calls_not_found=found)


def calls_not_found(reading: RunReading, index: int, *, looked_for: str) -> tuple[CallsNotFound, ...]:
    """The run, when it has assistant turns but no tool call (``looked_for`` says where the reader
    looked), else nothing."""
    if reading.calls or not reading.chats:
        return ()
    return (CallsNotFound(index, len(reading.chats), looked_for),)


def trajectory_document(spans: list[JsonObject], agent: str) -> JsonObject:
    """The ``TracesData`` of converted runs' spans (no resource when there are none)."""
    if not spans:
        return {"resourceSpans": []}
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": key_values({_SERVICE_NAME: agent})},
                "scopeSpans": [{"scope": {"name": SCOPE_NAME}, "spans": spans}],
            }
        ]
    }


def run_digest(run: object, index: int, *, family: bytes = b"treellm.trajectory") -> bytes:
    """The hash that a run's trace and span ids derive from."""
    content = json.dumps(run, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(b"%s\x00%d\x00%s" % (family, index, content.encode("ascii"))).digest()


def scalar_fields(obj: Mapping[str, Any], *, skip: tuple[str, ...] = (), prefix: str = "") -> dict[str, Scalar]:
    """The scalar (text, number, boolean) fields of ``obj``, keys prefixed."""
    return {prefix + str(k): v for k, v in obj.items() if k not in skip and isinstance(v, str | int | float | bool)}


def argument_text(value: object) -> str:
    """A call's arguments as text: text as it is, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def content_text(content: object) -> str | None:
    """A message's content as text: text as it is, a list of text parts joined, else JSON."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, Mapping) and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    return json.dumps(content, ensure_ascii=False, default=str)


def chat_tool_calls(message: Mapping[str, Any], j: int) -> list[ToolCall]:
    """The OpenAI ``tool_calls`` of the assistant message at position ``j``."""
    raw = sequence(message.get("tool_calls"), f"message {j}: tool_calls")
    calls = []
    for k, call in enumerate(raw):
        what = f"message {j}, tool call {k}"
        function = mapping(mapping(call, what).get("function"), f"{what}: function")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise Malformed(f"{what}: no function name")
        call_id, tool_type = call.get("id"), call.get("type")
        calls.append(
            ToolCall(
                message=j,
                position=k,
                siblings=len(raw),
                call_id=call_id if isinstance(call_id, str) and call_id else None,
                name=name,
                arguments=argument_text(function.get("arguments")),
                tool_type=tool_type if isinstance(tool_type, str) else None,
            )
        )
    return calls


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


def run_spans(reading: RunReading, index: int, *, digest: bytes, agent: str) -> list[JsonObject]:
    """The spans of one run: its root, then a chat span per assistant turn, each followed
    by an execute_tool span per tool call, all children of the root, in position order."""
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
    if reading.outcome is not None:
        root_attributes[sc.RUN_OUTCOME] = reading.outcome
    for key, value in reading.fields.items():
        root_attributes.setdefault(TRAJECTORY_PREFIX + key, value)
    root_name = f"{sc.OP_INVOKE_AGENT} trajectory"
    root_times = (base, at(reading.positions))
    spans = [_synthetic_span((trace_id, root_id, None), root_name, _KIND_INTERNAL, root_times, root_attributes)]
    calls = reading.calls
    next_call = 0
    for j in reading.chats:
        chat_ids = (trace_id, ids.next(), root_id)
        chat_times = (at(j), at(j) + _MESSAGE_NS // 4)
        spans.append(_synthetic_span(chat_ids, sc.OP_CHAT, _KIND_CLIENT, chat_times, _CHAT_ATTRIBUTES))
        while next_call < len(calls) and calls[next_call].message == j:
            call = calls[next_call]
            if call.call_id is None and reading.synthetic_call_ids:
                call = replace(call, call_id=f"call_{root_id}_{next_call}")
            result = reading.results.get(next_call)
            spans.append(_tool_span(call, result, (trace_id, ids.next(), root_id), at))
            next_call += 1
    return spans


def _tool_span(
    call: ToolCall, result: ToolResult | None, ids: tuple[str, str, str | None], at: Callable[[int], int]
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
