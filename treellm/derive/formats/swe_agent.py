"""``swe-agent``: SWE-agent ``.traj`` files, one run each, every action a call of the tool ``bash``.

An object ``{environment, trajectory, history, info}``. Each ``trajectory`` step (an object
with ``action``, ``observation``, ``thought``, ``response``, ``state``) is one assistant
turn: a ``chat`` span, then, when its ``action`` is not blank, one call of the tool
``bash`` with the arguments ``{"command": <the action, trailing whitespace stripped>}``
and the step's ``observation`` as its result, whatever the command (``open file.py``,
``goto 120``, ``scroll_down``, ``edit 10:12 ... end_of_edit``, ``str_replace_editor view
...``, ``submit``: SWE-agent hands them all to its shell). The k-th call of a run (0-based)
is its k-th step with a non-blank action.

A file with no steps (no ``trajectory`` list, or an empty one) is read from its
``history`` of chat messages: each assistant message is a turn; its ``action``, when not
blank, is its one call (as above), else each entry of its OpenAI ``tool_calls`` is a call
(function name, argument text); the message after the turn answers its call when it is a
``tool`` or ``user`` message (a turn of several tool calls has no results). There the k-th
call is the k-th call of the assistant messages in order.

The trace is shaped as in ``trajectory`` (:mod:`treellm.derive.formats._transcript`: a root
``invoke_agent trajectory`` span, its agent named by the file's stem, a ``chat`` span per
turn followed by its ``execute_tool bash`` span; a step takes two synthetic milliseconds,
so time order is step order). Call ids are the call's own id when it has one (``tool_calls``),
else synthetic: ``call_<root span id>_<k>``. The scalar fields of ``info``
(``exit_status``, ``submission``...), those of ``info.model_stats`` (as
``model_stats.<key>``) and ``environment`` go on the run span as
``treellm.trajectory.<key>``. A file is one record; a malformed one is reported naming
its field, and a run with turns but no call is stored with a warning.

Detection: an object with a ``trajectory`` or ``history`` list.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from treellm.derive.formats._base import Malformed, Record, kind_of, load_json, mapping, sequence
from treellm.derive.formats._sniff import Sample, Verdict
from treellm.derive.formats._transcript import (
    RunReading,
    Scalar,
    ToolCall,
    ToolResult,
    chat_tool_calls,
    content_text,
    run_digest,
    run_records,
    scalar_fields,
)
from treellm.errors import IngestError

NAME: Final = "swe-agent"
WHAT: Final = (
    "SWE-agent `.traj` files: `{environment, trajectory, history, info}`, each `trajectory` step an `action` "
    "(`open`, `goto`, `edit ... end_of_edit`, shell commands) and its `observation`"
)
MAPPING: Final = (
    'one trace per file; each step with an action is a `chat` span and a `bash` call `{"command": action}` '
    "whose result is the observation; a file without steps is read from its `history`"
)

TOOL: Final = "bash"
_FAMILY: Final = b"treellm.swe-agent"
_LOOKED_FOR: Final = "no step with an action, no assistant `action` or `tool_calls` in the history"


def sniff(sample: Sample) -> Verdict:
    keys = sample.keys
    return sample.shape == "object" and (keys.get("trajectory") == ord("[") or keys.get("history") == ord("["))


def convert(data: bytes, *, path: str) -> Iterator[Record | IngestError]:
    """The file's one run as one record (see the module docstring)."""
    try:
        doc = load_json(data, path)
        reading = read_traj(doc)
    except IngestError as exc:
        yield exc
        return
    except Malformed as exc:
        yield IngestError(str(exc), path=path, record=0)
        return
    digest = run_digest(doc, 0, family=_FAMILY)
    yield from run_records(reading, 0, digest=digest, agent=Path(path).stem, path=path, looked_for=_LOOKED_FOR)


def read_traj(doc: object) -> RunReading:
    """The turns, calls and results of a parsed ``.traj`` document (pure); ``Malformed`` names
    the field that is not as the module docstring says."""
    if not isinstance(doc, Mapping):
        raise Malformed(f"expected a SWE-agent trajectory object, got {kind_of(doc)}")
    steps = sequence(doc.get("trajectory"), "trajectory")
    if steps:
        reading = _read_steps(steps)
    elif isinstance(doc.get("history"), list):
        reading = _read_history(doc["history"])
    elif "trajectory" in doc:
        reading = _read_steps([])
    else:
        raise Malformed("expected a trajectory or history list")
    info = mapping(doc.get("info"), "info")
    fields: dict[str, Scalar] = scalar_fields(info)
    fields.update(scalar_fields(mapping(info.get("model_stats"), "info.model_stats"), prefix="model_stats."))
    fields.update(scalar_fields(doc, skip=("trajectory", "history", "info")))
    return replace(reading, fields=fields, synthetic_call_ids=True)


def _action(value: object, what: str) -> str:
    """An action's command: the text with trailing whitespace stripped ("" when blank or missing)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Malformed(f"{what}: expected text, got {kind_of(value)}")
    return value.rstrip()


def _bash(command: str, position: int, call_id: str | None = None) -> ToolCall:
    arguments = json.dumps({"command": command}, ensure_ascii=False)
    return ToolCall(message=position, position=0, siblings=1, call_id=call_id, name=TOOL, arguments=arguments)


def _read_steps(steps: list[Any]) -> RunReading:
    """Step k is the turn at position 2k and its observation the answer at 2k + 1."""
    calls: list[ToolCall] = []
    results: dict[int, ToolResult] = {}
    for k, raw in enumerate(steps):
        step = mapping(raw, f"trajectory[{k}]")
        command = _action(step.get("action"), f"trajectory[{k}].action")
        if command.strip():
            results[len(calls)] = ToolResult(2 * k + 1, content_text(step.get("observation")))
            calls.append(_bash(command, 2 * k))
    return RunReading(
        positions=2 * len(steps), chats=tuple(2 * k for k in range(len(steps))), calls=tuple(calls), results=results
    )


def _read_history(messages: list[Any]) -> RunReading:
    chats: list[int] = []
    calls: list[ToolCall] = []
    results: dict[int, ToolResult] = {}
    for j, raw in enumerate(messages):
        message = mapping(raw, f"history[{j}]")
        if message.get("role") != "assistant":
            continue
        chats.append(j)
        command = _action(message.get("action"), f"history[{j}].action")
        tool_calls = chat_tool_calls(message, j)
        if command.strip():
            own_id = tool_calls[0].call_id if len(tool_calls) == 1 else None
            turn = [_bash(command, j, own_id)]
        else:
            turn = tool_calls
        answer = _answer(messages, j + 1) if len(turn) == 1 else None
        if answer is not None:
            results[len(calls)] = answer
        calls.extend(turn)
    return RunReading(positions=len(messages), chats=tuple(chats), calls=tuple(calls), results=results)


def _answer(messages: list[Any], j: int) -> ToolResult | None:
    """The message at ``j`` as a result when it is a tool or user message."""
    if j < len(messages) and isinstance(messages[j], Mapping) and messages[j].get("role") in ("tool", "user"):
        return ToolResult(j, content_text(messages[j].get("content")))
    return None
