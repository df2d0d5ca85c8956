"""``trajectory``: OpenAI chat-format runs, each turned into a trace shaped like treellm's own runs.

A bare list of messages, an object with a ``messages`` or ``traj`` list (its other scalar
fields become ``treellm.trajectory.<key>`` on the run span), or a JSON list of such runs
(an empty list holds no runs). Each run is one trace and one record, shaped like
treellm's own runs: a root ``invoke_agent trajectory`` span, then, as its children in
message order, a ``chat`` span per assistant message and an ``execute_tool {name}`` span
per tool call carrying the raw argument text and the paired result. Results pair with
calls by ``tool_call_id``; when an id repeats, the k-th tool message with id X answers the
k-th call with id X. Ids are a hash of the run's content and its index in the file, so the
same file ingested again, from any path, adds nothing; times are synthetic (1 ms per
message from a fixed epoch) so that time order is message order. A bad run is reported
by its index and the runs after it are still read; a file that is not JSON is reported by
its line.

Detection: an object with a ``messages`` or ``traj`` list, a list whose first object has a
``role``, a list of lists whose first object has a ``role``, or an empty list.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from treellm.errors import IngestError
from treellm.otlp import key_values
from treellm.store.formats._base import (
    SCOPE_NAME,
    JsonObject,
    Malformed,
    Record,
    checked,
    kind_of,
    load_json,
    mapping,
    sequence,
)
from treellm.store.formats._sniff import Sample, Verdict
from treellm.telemetry import semconv as sc

NAME: Final = "trajectory"
WHAT: Final = (
    "OpenAI chat-format runs: messages with assistant `tool_calls` and `role: tool` results, "
    "bare or under `messages`/`traj`, one run or a list"
)
MAPPING: Final = (
    "one trace per run, one `execute_tool` span per call, results paired by `tool_call_id` (by order when ids repeat)"
)

logger = logging.getLogger(__name__)

_TRAJECTORY_PREFIX: Final = "treellm.trajectory."
_TRAJECTORY_INDEX: Final = "treellm.trajectory.index"
_SERVICE_NAME: Final = "service.name"
_KIND_INTERNAL: Final = 1
_KIND_CLIENT: Final = 3
_SYNTHETIC_FLAGS: Final = 0x101  # sampled, parent known to be local (as treellm.otlp writes it)
_TRAJECTORY_EPOCH_NS: Final = 1_704_067_200 * 10**9  # 2024-01-01T00:00:00Z
_RUN_SPACING_NS: Final = 60 * 10**9
_MESSAGE_NS: Final = 10**6


def sniff(sample: Sample) -> Verdict:
    keys = sample.keys
    if sample.shape in ("list", "lists") and sample.empty:
        return True  # an empty list: no runs, no spans
    if sample.shape in ("lists", "list") and "role" in keys:
        return True
    return sample.shape in ("object", "list") and (keys.get("messages") == ord("[") or keys.get("traj") == ord("["))


def convert(data: bytes, *, path: str) -> Iterator[Record | IngestError]:
    """Each run as one record (see the module docstring)."""
    agent = Path(path).stem
    try:
        runs = _runs(load_json(data, path), path=path)
    except IngestError as exc:
        yield exc
        return
    for index, run in enumerate(runs):
        try:
            spans = _checked_run_spans(run, index, agent=agent, path=path)
        except IngestError as exc:
            yield exc
        else:
            yield from checked(index, _trajectory_document(spans, agent), path=path)


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
                "scopeSpans": [{"scope": {"name": SCOPE_NAME}, "spans": spans}],
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
    raise IngestError(f"expected {expected}; got {kind_of(obj)}", path=path)


def _checked_run_spans(run: object, index: int, *, agent: str, path: str) -> list[JsonObject]:
    try:
        return _run_spans(run, index, agent=agent)
    except Malformed as exc:
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
        raise Malformed("a run object needs a messages or traj list")
    raise Malformed(f"expected a run (a list of messages or an object with messages or traj), got {kind_of(run)}")


def _argument_text(value: object) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _tool_calls(message: Mapping[str, Any], j: int) -> list[_Call]:
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
            raise Malformed(f"message {j}: expected an object, got {kind_of(message)}")
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
            raise Malformed(f"message {j}: expected a role, got {kind_of(role)}")
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
