"""``trajectory``: chat-format runs (OpenAI tool calls, or bash blocks in the text), each one trace.

A bare list of messages, an object with a ``messages`` or ``traj`` list (its other scalar
fields become ``treellm.trajectory.<key>`` on the run span), or a JSON list of such runs
(an empty list holds no runs). Each run is one trace and one record, shaped like
treellm's own runs (:mod:`treellm.derive.formats._transcript`): a root ``invoke_agent
trajectory`` span, then, as its children in message order, a ``chat`` span per assistant
message and an ``execute_tool {name}`` span per tool call carrying the raw argument text
and the paired result. Ids are a hash of the run's content and its index in the file, so
the same file ingested again, from any path, adds nothing; times are synthetic (1 ms per
message from a fixed epoch) so that time order is message order. A bad run is reported
by its index and the runs after it are still read; a file that is not JSON is reported by
its line.

Where the calls are, decided per run:

- **Tool calls** (a run with an assistant ``tool_calls`` entry or a ``role: tool``
  message): each entry of an assistant message's ``tool_calls`` is a call. Results pair
  with calls by ``tool_call_id``; when an id repeats, the k-th tool message with id X
  answers the k-th call with id X.
- **Text actions** (any other run: mini-swe-agent's own text format, ``{info, messages,
  trajectory_format}`` or a bare message list): as mini-swe-agent parses a reply
  (:data:`_TEXT_ACTION`, its ``action_regex``), an assistant message whose text holds
  exactly one code block fenced as ``bash`` or ``mswea_bash_command`` is one call of the
  tool ``bash`` with the arguments ``{"command": <the block's text without its fences,
  surrounding whitespace stripped>}``; the result is the text of the next message when it
  is a ``user`` message. A message with no such block, or several, is a format error that
  mini-swe-agent answered with a message of its own: no call. Call ids are synthetic,
  ``call_<root span id>_<k>``: the k-th call of a run (0-based) is its k-th assistant
  message with exactly one block.

A run with assistant messages but no call found either way is stored, and its record
warns, naming the run's index.

The run's outcome (``treellm.run.outcome`` on its root span, the ``outcome`` of the ``runs``
view) is the result the run object records, when it records one (:func:`run_result`), first
found in this order, each at the top level or under ``info``: SWE-bench's ``resolved``
(true: ``success``, false: ``failure``); tau-bench's ``reward`` (1: ``success``, from 0 to
below 1: ``failure``); an integer ``exit_code``, ``exit_status`` or ``returncode`` (0:
``success``, else ``failure``). Anything else (no such field, a reward outside [0, 1], a
text exit status such as mini-swe-agent's ``Submitted``) records no result, and the run's
outcome stays ``completed``, as for any trace without one.

Detection: an object with a ``messages`` or ``traj`` list, a list whose first object has a
``role``, a list of lists whose first object has a ``role``, or an empty list.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Final, Literal

from treellm.derive.formats._base import JsonObject, Malformed, Record, kind_of, load_json
from treellm.derive.formats._sniff import Sample, Verdict
from treellm.derive.formats._transcript import (
    RunReading,
    ToolCall,
    ToolResult,
    chat_tool_calls,
    content_text,
    run_digest,
    run_records,
    run_spans,
    scalar_fields,
    trajectory_document,
)
from treellm.errors import IngestError

NAME: Final = "trajectory"
WHAT: Final = (
    "chat-format runs, bare or under `messages`/`traj`, one run or a list: OpenAI assistant `tool_calls` with "
    "`role: tool` results, or mini-swe-agent's text actions (exactly one `bash` code block in an assistant "
    "message, the result in the next user message)"
)
MAPPING: Final = (
    "one trace per run, one `execute_tool` span per call, results paired by `tool_call_id` (by order when ids "
    'repeat); a text action is a `bash` call `{"command": ...}`; a run with no call found is a warning'
)

logger = logging.getLogger(__name__)

TaskResult = Literal["success", "failure"]
_RESULT_PLACES: Final = ("resolved", "reward", "exit_code", "exit_status", "returncode")

_TEXT_ACTION: Final = re.compile(r"```(?:bash|mswea_bash_command)\s*\n(.*?)\n```", re.DOTALL)
"""mini-swe-agent's ``action_regex`` (``bash`` in 1.x, ``mswea_bash_command`` in 2.x's text format)."""
_LOOKED_FOR: Final = "no assistant `tool_calls`, no assistant message with exactly one bash code block"


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
            reading = _checked_reading(run, index, path=path)
        except IngestError as exc:
            yield exc
        else:
            digest = run_digest(run, index)
            yield from run_records(reading, index, digest=digest, agent=agent, path=path, looked_for=_LOOKED_FOR)


def trajectories_to_traces_data(obj: object, *, path: str) -> dict[str, Any]:
    """OTLP/JSON ``TracesData`` of chat-format runs, one trace per run.

    ``obj`` is the parsed file (see the module docstring for the accepted shapes);
    ``path`` names the file in errors and gives the agent name (its stem). A malformed run
    raises :class:`IngestError` with its index as ``record``.
    """
    agent = Path(path).stem
    spans: list[JsonObject] = []
    for index, run in enumerate(_runs(obj, path=path)):
        reading = _checked_reading(run, index, path=path)
        spans.extend(run_spans(reading, index, digest=run_digest(run, index), agent=agent))
    return trajectory_document(spans, agent)


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


def _checked_reading(run: object, index: int, *, path: str) -> RunReading:
    try:
        messages, fields = _run_parts(run)
        reading = _read_messages(messages, fields)
    except Malformed as exc:
        raise IngestError(str(exc), path=path, record=index) from None
    result = run_result(run) if isinstance(run, Mapping) else None
    return replace(reading, outcome=result) if result is not None else reading


def run_result(run: Mapping[str, Any]) -> TaskResult | None:
    """The result a run object records (pure; the rules are in the module docstring), or None."""
    info = run.get("info")
    places = [run, info] if isinstance(info, Mapping) else [run]
    for key in _RESULT_PLACES:
        for place in places:
            result = _result_of(key, place.get(key))
            if result is not None:
                return result
    return None


def _result_of(key: str, value: object) -> TaskResult | None:
    if key == "resolved":
        return ("success" if value else "failure") if isinstance(value, bool) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    if key == "reward":
        return "success" if value == 1 else "failure" if 0 <= value < 1 else None
    return ("success" if value == 0 else "failure") if isinstance(value, int) else None


def _run_parts(run: object) -> tuple[list[Any], dict[str, str | int | float | bool]]:
    """A run's messages and the scalar fields of its object (none for a bare list)."""
    if isinstance(run, list):
        return run, {}
    if isinstance(run, Mapping):
        for key in ("messages", "traj"):
            if isinstance(run.get(key), list):
                return run[key], scalar_fields(run, skip=("messages", "traj"))
        raise Malformed("a run object needs a messages or traj list")
    raise Malformed(f"expected a run (a list of messages or an object with messages or traj), got {kind_of(run)}")


def _uses_tool_calls(messages: list[Any]) -> bool:
    """Whether a run keeps its calls as OpenAI tool calls (else they are text actions)."""
    for message in messages:
        if isinstance(message, Mapping):
            role = message.get("role")
            if role == "tool" or (role == "assistant" and message.get("tool_calls")):
                return True
    return False


def _read_messages(messages: list[Any], fields: Mapping[str, str | int | float | bool]) -> RunReading:
    """Assistant message indices, tool calls in message order, and each answered call's result.

    With tool calls, a tool message answers the oldest unanswered call with its
    ``tool_call_id`` (so the k-th tool message with id X answers the k-th call with id X);
    with text actions, the next user message answers the call (see the module docstring).
    """
    text_actions = not _uses_tool_calls(messages)
    chats: list[int] = []
    calls: list[ToolCall] = []
    results: dict[int, ToolResult] = {}
    waiting: dict[str | None, deque[int]] = {}
    for j, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise Malformed(f"message {j}: expected an object, got {kind_of(message)}")
        role = message.get("role")
        if role == "assistant":
            chats.append(j)
            if text_actions:
                call = _text_action(message, j)
                if call is not None:
                    answer = _text_answer(messages, j + 1)
                    if answer is not None:
                        results[len(calls)] = answer
                    calls.append(call)
                continue
            for call in chat_tool_calls(message, j):
                waiting.setdefault(call.call_id, deque()).append(len(calls))
                calls.append(call)
        elif role == "tool":
            call_id = message.get("tool_call_id")
            queue = waiting.get(call_id if isinstance(call_id, str) and call_id else None)
            if queue:
                results[queue.popleft()] = ToolResult(j, content_text(message.get("content")))
            else:
                logger.debug("message %d answers no open tool call (id %r)", j, call_id)
        elif not isinstance(role, str):
            raise Malformed(f"message {j}: expected a role, got {kind_of(role)}")
    return RunReading(
        positions=len(messages),
        chats=tuple(chats),
        calls=tuple(calls),
        results=results,
        fields=fields,
        synthetic_call_ids=text_actions,
    )


def _text_action(message: Mapping[str, Any], j: int) -> ToolCall | None:
    """The ``bash`` call of an assistant message's text: its one bash code block, or none."""
    text = content_text(message.get("content"))
    blocks = _TEXT_ACTION.findall(text) if text else []
    if len(blocks) != 1:
        return None
    arguments = json.dumps({"command": blocks[0].strip()}, ensure_ascii=False)
    return ToolCall(message=j, position=0, siblings=1, call_id=None, name="bash", arguments=arguments)


def _text_answer(messages: list[Any], j: int) -> ToolResult | None:
    """The result of a text action: the message at ``j`` when it is a user message."""
    if j < len(messages) and isinstance(messages[j], Mapping) and messages[j].get("role") == "user":
        return ToolResult(j, content_text(messages[j].get("content")))
    return None
