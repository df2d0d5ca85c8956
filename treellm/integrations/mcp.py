"""``treellm mcp-proxy``: a :class:`~treellm.LoopGuard` in front of any MCP server, over stdio.

The proxy is an MCP server on its own stdin/stdout that launches the real server as a
subprocess and relays the JSON-RPC lines between them *unchanged* (byte for byte):
initialize and capabilities, listings, resources, prompts, notifications, the server's own
requests (sampling, elicitation) and their answers. Only ``tools/call`` requests are looked
at, and each one goes through the guard:

- allowed: forwarded; its response is recorded before it is relayed (a result with
  ``isError: true`` or a JSON-RPC error is a failed call; an ``input_required`` result, or
  a ``notifications/cancelled`` from the client, releases the call: it has not run yet);
- caught: answered by the proxy, never reaching the server (:func:`caught_result`): ``prune``
  gives a result with ``isError: true`` saying the identical call was already made N times
  in this session; ``nudge`` the guard's answer text (with the earlier result's structured
  content); ``cache`` the earlier result, replayed whole.

The arguments are keyed as given (an object, a list, a string, a number); absent or null
arguments are ``{}``. One proxy process serves one client session, so the guard has one path:
a session id made per proxy run (a random hex id, or ``session_id=``). Calls the client sends
concurrently count against each other through the guard's reservations, in the order they
arrive.

The proxy speaks JSON-RPC to the end (:class:`ProxyProtocol`): every request gets an answer.
A line that is not JSON gets a parse error; a message that is not a valid MCP message (an
``id`` that is an object, an array, a boolean, null or a fraction; a ``tools/call`` without a
string tool name) gets an error naming what is wrong, with the request's id when it is a valid
JSON-RPC id, else null; a message over ``max_message_bytes`` (16 MiB by default) is read
through, dropped, and answered with an error naming the cap (to whichever side waits for it:
its id is looked for at the message's top level in its first 64 KiB). When the server's output
ends while the client is connected, every request still waiting for the server gets an error
saying how the server ended, and :func:`run_mcp_proxy` raises :class:`ServerExitedError` (the
command exits 1 with that line on stderr).

Hard rules: everything but :func:`relay`, :func:`run_mcp_proxy` and the private transports at the
end is synchronous and does no I/O; lines are split in linear time (each byte scanned and
copied a bounded number of times) and at most ``max_message_bytes`` of a line is held; ``mcp``
is imported inside functions (``require_extra`` first), so importing this module never needs
the ``mcp`` extra. A broken message from the server is logged and dropped, never raised.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeGuard

from treellm.config import RepeatAction, TreeConfig
from treellm.errors import ConfigError, TreeLLMError, require_extra
from treellm.guard import GuardDecision, LoopGuard

if TYPE_CHECKING:
    from anyio.abc import Process
    from mcp_types import JSONRPCError, JSONRPCMessage, JSONRPCResponse

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "GuardedSession",
    "LineSplitter",
    "Outcome",
    "Oversized",
    "ProxyProtocol",
    "Relayed",
    "ServerExitedError",
    "SessionEnd",
    "ToolCall",
    "caught_result",
    "exit_reason",
    "head_fields",
    "outcome",
    "relay",
    "run_mcp_proxy",
    "server_command",
    "tool_call",
]

logger = logging.getLogger(__name__)

RequestId = int | str

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The largest message (one JSON-RPC line, without its newline) relayed either way."""

_HEAD_BYTES = 64 * 1024
"""How much of an oversized message is kept to find its id."""

_GRACE_SECONDS = 2.0
"""How long the server gets to exit after its stdin closes, and again after SIGTERM (as the SDK)."""

_PARSE_ERROR, _INVALID_REQUEST, _INVALID_PARAMS, _INTERNAL_ERROR = -32700, -32600, -32602, -32603
_CONNECTION_CLOSED = -32000
"""JSON-RPC's implementation-defined band; the code the MCP SDK uses for a closed connection."""


class ServerExitedError(TreeLLMError):
    """The MCP server's output ended while the client was still connected (it exited, was
    killed, or closed its stdout); ``reason`` says how (:func:`exit_reason`), ``failed_requests``
    counts the client's requests that got a JSON-RPC error for it."""

    def __init__(self, reason: str, *, returncode: int | None, failed_requests: int) -> None:
        waiting = "no request was waiting for it"
        if failed_requests:
            waiting = f"{failed_requests} waiting request{'s' if failed_requests > 1 else ''} got a JSON-RPC error"
        super().__init__(f"the MCP server {reason} while the client was connected; {waiting}")
        self.reason = reason
        self.returncode = returncode
        self.failed_requests = failed_requests


# -- tool calls and what their responses say (pure) ---------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A ``tools/call`` request: its JSON-RPC id, the tool and its arguments (any JSON value,
    as given; ``{}`` when absent or null)."""

    request_id: RequestId
    tool: str
    arguments: Any

    def guard_arguments(self) -> Any:
        """The arguments as :meth:`LoopGuard.check` keys them as given: an object itself, any
        other value as its JSON text (a string would otherwise be parsed as JSON text)."""
        return self.arguments if isinstance(self.arguments, Mapping) else _json(self.arguments)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a ``tools/call`` response says about the call: its result text and whether it failed."""

    text: str
    failed: bool


def tool_call(request_id: RequestId, method: str, params: Mapping[str, Any] | None) -> ToolCall | str | None:
    """The tool call a request makes; for a ``tools/call`` that names no tool (no params, a
    name that is not a string) why it is invalid, for an Invalid params error; None for any
    other method."""
    if method != "tools/call":
        return None
    if params is None:
        return "Invalid params: tools/call needs params with the tool's name"
    name = params.get("name")
    if not isinstance(name, str):
        return f"Invalid params: the tool's name must be a string, got {_json_kind(name)}"
    arguments = params.get("arguments")
    return ToolCall(request_id, name, {} if arguments is None else arguments)


def outcome(result: Mapping[str, Any] | None, error: Mapping[str, Any] | None = None) -> Outcome | None:
    """The outcome of a call from its response's ``result`` (or JSON-RPC ``error``); None when
    the call has not finished (``resultType: "input_required"``: the client retries it)."""
    if error is not None:
        return Outcome(f"Error: {error.get('message', '')}", True)
    result = result or {}
    if result.get("resultType") == "input_required":
        return None
    content = result.get("content")
    blocks = content if isinstance(content, list) else []
    parts = [
        block["text"] if isinstance(block, Mapping) and isinstance(block.get("text"), str) else _json(block)
        for block in blocks
    ]
    if not parts and result.get("structuredContent") is not None:
        parts = [_json(result["structuredContent"])]
    return Outcome("\n".join(parts), result.get("isError") is True)


def caught_result(decision: GuardDecision, earlier: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``CallToolResult`` (as JSON) answering a call the guard did not allow.

    ``earlier`` is the result of the latest identical call the decision counted (None while
    every such call is still running). ``prune``: an error result saying the call was pruned.
    ``cache``: ``earlier`` itself, replayed whole (structured content, ``isError``).
    ``nudge``: the guard's answer text, with ``earlier``'s structured content and
    ``isError`` (a tool with an output schema must return structured content). With no
    earlier result yet, ``nudge`` and ``cache`` give an error result saying the identical
    call is still running.
    """
    times = "once" if decision.count == 1 else f"{decision.count} times"
    if decision.action == "prune" or decision.answer is None:
        return _text_result(
            f"[treellm] {decision.tool} was pruned: the identical call (same tool, same arguments) was "
            f"already made {times} in this session (limit {decision.limit}), so it was not run again. "
            "Do not repeat it; use the earlier result or try something else.",
            error=True,
        )
    if earlier is None:
        return _text_result(
            f"[treellm] {decision.tool} was not run: the identical call was already made {times} in this "
            f"session (limit {decision.limit}) and is still running; its result is not known yet.",
            error=True,
        )
    if decision.action == "cache":
        return dict(earlier)
    result = _text_result(decision.answer, error=earlier.get("isError") is True)
    if earlier.get("structuredContent") is not None:
        result["structuredContent"] = earlier["structuredContent"]
    return result


def _text_result(text: str, *, error: bool) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": error}


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def _json_kind(value: object) -> str:
    """The JSON type of a decoded value, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number with a fraction" if isinstance(value, float) else "an integer"
    kinds = {str: "a string", list: "an array", dict: "an object"}
    return next((name for kind, name in kinds.items() if isinstance(value, kind)), type(value).__name__)


# -- framing: lines, oversized messages, exit statuses (pure) ----------------------------------


@dataclass(frozen=True, slots=True)
class Oversized:
    """A line longer than the cap, read through and dropped: its size in bytes (without the
    newline) and its first bytes (up to 64 KiB), where its id is looked for."""

    size: int
    head: bytes


class LineSplitter:
    """Splits a byte stream into its lines (without the newline), each at most ``max_bytes``
    long; a longer one becomes :class:`Oversized` once its end is read, and only its head is
    held meanwhile. Linear: each byte is scanned once and copied at most twice, however the
    stream is chunked. Pure; one instance per stream."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes) -> list[bytes | Oversized]:
        """The lines that ``chunk`` completes."""
        lines: list[bytes | Oversized] = []
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            self._add(chunk[start:end])
            lines.append(self._take())
            start = end + 1
        if start < len(chunk):
            self._add(chunk[start:])
        return lines

    def end(self) -> list[bytes | Oversized]:
        """The last line, when the stream ends without a newline after it."""
        return [self._take()] if self._size else []

    def _add(self, piece: bytes) -> None:
        if self._size <= self._max:
            self._parts.append(piece)
            if self._size + len(piece) > self._max:  # over the cap now: keep the head only
                self._parts = [b"".join(self._parts)[:_HEAD_BYTES]]
        self._size += len(piece)

    def _take(self) -> bytes | Oversized:
        data, size = b"".join(self._parts), self._size
        self._parts, self._size = [], 0
        return data if size <= self._max else Oversized(size, data)


_TOKEN = re.compile(rb'\s*(?:("[^"\\]*(?:\\.[^"\\]*)*")|([{}\[\]:,])|([^\s{}\[\]:,"]+))', re.S)
MessageKind = Literal["request", "response"]


def head_fields(head: bytes) -> tuple[RequestId | None, MessageKind | None]:
    """The top-level ``id`` (a string or an integer) of the JSON object whose text starts
    with ``head``, and whether it is a request (a ``method`` key) or a response (``result``
    or ``error``); None for what the head does not show (a value cut at its end is not read)."""
    found: RequestId | None = None
    kind: MessageKind | None = None
    depth, key, value = 0, None, None
    expect_value = False
    pos = 0
    while match := _TOKEN.match(head, pos):
        pos = match.end()
        text, punct, bare = match.groups()
        if depth == 0 and punct != b"{":
            break
        if punct in (b"{", b"["):
            depth += 1
            expect_value = False
        elif punct in (b"}", b"]", b","):
            if depth == 1 and key == "id" and _is_request_id(value):
                found = value
            if punct != b",":
                depth -= 1
            key, value = (None, None) if depth == 1 else (key, value)
        elif punct == b":" and depth == 1 and key is not None:
            expect_value = True
            kind = "request" if key == "method" else "response" if key in ("result", "error") else kind
        elif depth == 1 and (text or bare):
            token = text or bare
            with suppress(ValueError):
                decoded = json.loads(token or b"")
                if expect_value:
                    value = decoded
                elif isinstance(decoded, str):
                    key = decoded
            expect_value = False
        if depth == 0:
            break
    return found, kind


def exit_reason(returncode: int | None) -> str:
    """How a process ended, as a phrase: ``exited with status 3``, ``was killed by signal 9
    (SIGKILL)``; None (still running after its output ended) gives ``closed its output``."""
    if returncode is None:
        return "closed its output"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            return f"was killed by signal {-returncode}"
        return f"was killed by signal {-returncode} ({name})"
    return f"exited with status {returncode}"


def _is_request_id(value: object) -> TypeGuard[RequestId]:
    """An MCP request id: a string or an integer (JSON-RPC also allows null and fractions)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _error_line(request_id: object, code: int, message: str) -> bytes:
    """A JSON-RPC error response as a line; ``request_id`` echoed as given (a fraction too)."""
    error = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    return json.dumps(error, ensure_ascii=False).encode() + b"\n"


def _model_line(message: JSONRPCResponse | JSONRPCError) -> bytes:
    return message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"


@dataclass(frozen=True, slots=True)
class _Rejection:
    """Why a message is not a valid MCP message, and the id its error answer carries."""

    request_id: object
    code: int
    message: str

    def line(self) -> bytes:
        return _error_line(self.request_id, self.code, self.message)


def _envelope(value: object) -> JSONRPCMessage | _Rejection:
    """A decoded JSON value as a typed JSON-RPC message, or why it is not a valid MCP message."""
    from mcp_types import JSONRPCError, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse
    from pydantic import ValidationError

    if not isinstance(value, dict):
        return _Rejection(
            None, _INVALID_REQUEST, f"Invalid Request: a message is a JSON object, got {_json_kind(value)}"
        )
    request_id = value.get("id")
    if "method" in value and "id" in value and not _is_request_id(request_id):
        echoed = request_id if request_id is None or isinstance(request_id, float) else None  # JSON-RPC ids
        return _Rejection(
            echoed,
            _INVALID_REQUEST,
            f"Invalid Request: an MCP request id is a string or an integer, got {_json_kind(request_id)}",
        )
    model: type[JSONRPCMessage]
    if "method" in value:
        model = JSONRPCRequest if "id" in value else JSONRPCNotification
    else:
        model = JSONRPCError if "error" in value else JSONRPCResponse
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "message"
        valid_id = request_id if _is_request_id(request_id) else None
        if first["loc"][:1] == ("params",):  # a valid JSON-RPC request whose params MCP cannot take
            return _Rejection(valid_id, _INVALID_PARAMS, f"Invalid params: {where}: {first['msg']}")
        return _Rejection(valid_id, _INVALID_REQUEST, f"Invalid Request: {where}: {first['msg']}")


# -- the guard's side of a session (pure) -------------------------------------------------------


class GuardedSession:
    """The guard's side of one proxied session: which forwarded calls await their response.

    Synchronous and I/O-free; it takes typed messages (:class:`ProxyProtocol` decodes the
    lines). It never raises on a message's content.
    """

    def __init__(self, guard: LoopGuard, session_id: str) -> None:
        self.guard = guard
        self.session_id = session_id
        self._pending: dict[RequestId, tuple[ToolCall, GuardDecision]] = {}
        self._latest: dict[str, tuple[str, Mapping[str, Any]]] = {}
        """Per signature, the node id and result of its latest recorded call (what cache replays)."""

    def from_client(self, message: JSONRPCMessage) -> JSONRPCResponse | JSONRPCError | None:
        """Check a client message: the response to send back instead of forwarding it (a
        caught call, or an Invalid params error for a ``tools/call`` naming no tool), or None
        to forward it unchanged."""
        from mcp_types import ErrorData, JSONRPCError, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse

        if isinstance(message, JSONRPCNotification):
            if message.method == "notifications/cancelled" and message.params is not None:
                self._release(message.params.get("requestId"))
            return None
        if not isinstance(message, JSONRPCRequest):
            return None
        call = tool_call(message.id, message.method, message.params)
        if call is None:
            return None
        if isinstance(call, str):
            return JSONRPCError(jsonrpc="2.0", id=message.id, error=ErrorData(code=_INVALID_PARAMS, message=call))
        decision = self.guard.check(call.tool, call.guard_arguments(), self.session_id, call_id=str(call.request_id))
        if decision.allowed:
            self._pending[call.request_id] = (call, decision)
            return None
        latest = self._latest.get(decision.signature)
        earlier = latest[1] if latest is not None and latest[0] in decision.earlier_node_ids else None
        return JSONRPCResponse(jsonrpc="2.0", id=message.id, result=caught_result(decision, earlier))

    def from_server(self, message: JSONRPCMessage) -> None:
        """Record the response to a forwarded call (other messages pass untouched)."""
        from mcp_types import JSONRPCError, JSONRPCResponse

        if not isinstance(message, JSONRPCResponse | JSONRPCError) or message.id is None:
            return
        entry = self._pending.pop(message.id, None)
        if entry is None:
            return
        call, decision = entry
        if isinstance(message, JSONRPCError):
            done = outcome(None, message.error.model_dump(mode="json"))
        else:
            done = outcome(message.result)
        if done is None:  # input_required: the client sends the call again with the input
            self.guard.release(decision)
            return
        result = message.result if isinstance(message, JSONRPCResponse) else _text_result(done.text, error=True)
        node_id = self.guard.record(
            call.tool,
            call.guard_arguments(),
            done.text,
            self.session_id,
            call_id=str(call.request_id),
            error=done.failed,
        )
        self._latest[decision.signature] = (node_id, result)

    def _release(self, request_id: object) -> None:
        if _is_request_id(request_id):
            entry = self._pending.pop(request_id, None)
            if entry is not None:
                self.guard.release(entry[1])

    def close(self, *, failed: bool = False) -> None:
        """End the session's run (``failed``: the server ended it); calls still awaiting a
        response are dropped."""
        self._pending.clear()
        self.guard.end(self.session_id, "failed" if failed else "completed")


# -- the proxy's JSON-RPC side: lines in, lines out (pure) --------------------------------------


@dataclass(frozen=True, slots=True)
class Relayed:
    """What one message becomes: lines for the client and lines for the server (each ending
    with its newline)."""

    to_client: tuple[bytes, ...] = ()
    to_server: tuple[bytes, ...] = ()


class ProxyProtocol:
    """Decides what each line from either side becomes: forwarded unchanged, answered by the
    proxy, or dropped (only a server's broken non-request). Tracks the requests each side still
    waits for, so that every one is answered: by the other side, by an error naming the size
    cap, or by :meth:`server_ended`. Synchronous and I/O-free; never raises on a message."""

    def __init__(self, session: GuardedSession, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.session = session
        self.max_message_bytes = max_message_bytes
        self._client_waits: dict[RequestId, str] = {}
        """The client's forwarded requests awaiting the server's response: id -> method."""
        self._server_waits: set[RequestId] = set()
        """The server's forwarded requests awaiting the client's response."""

    def splitter(self) -> LineSplitter:
        """A splitter for one side's stream, with this protocol's cap."""
        return LineSplitter(self.max_message_bytes)

    def from_client(self, line: bytes | Oversized) -> Relayed:
        """What a line from the client becomes."""
        from mcp_types import JSONRPCNotification, JSONRPCRequest

        if isinstance(line, Oversized):
            return self._oversized_from_client(line)
        if not line.strip():
            return Relayed()
        try:
            value = json.loads(line)
        except ValueError as exc:
            logger.warning("mcp-proxy: the client sent a line that is not JSON: %s", exc)
            return Relayed(to_client=(_error_line(None, _PARSE_ERROR, f"Parse error: {exc}"),))
        message = _envelope(value)
        if isinstance(message, _Rejection):
            logger.warning("mcp-proxy: the client sent an invalid message: %s", message.message)
            return Relayed(to_client=(message.line(),))
        reply = self.session.from_client(message)
        if reply is not None:
            return Relayed(to_client=(_model_line(reply),))
        if isinstance(message, JSONRPCRequest):
            self._client_waits[message.id] = message.method
        elif isinstance(message, JSONRPCNotification):
            if message.method == "notifications/cancelled" and message.params is not None:
                cancelled = message.params.get("requestId")
                if _is_request_id(cancelled):
                    self._client_waits.pop(cancelled, None)
        elif message.id is not None:
            self._server_waits.discard(message.id)
        return Relayed(to_server=(line + b"\n",))

    def from_server(self, line: bytes | Oversized) -> Relayed:
        """What a line from the server becomes."""
        from mcp_types import JSONRPCError, JSONRPCRequest, JSONRPCResponse

        if isinstance(line, Oversized):
            return self._oversized_from_server(line)
        if not line.strip():
            return Relayed()
        try:
            value = json.loads(line)
        except ValueError as exc:
            logger.warning("mcp-proxy: the server sent a line that is not JSON (dropped): %s", exc)
            return Relayed()
        message = _envelope(value)
        if isinstance(message, _Rejection):
            logger.warning("mcp-proxy: the server sent an invalid message: %s", message.message)
            if isinstance(value, dict) and "method" in value and "id" in value:  # a request: answer it
                return Relayed(to_server=(message.line(),))
            return Relayed()
        if isinstance(message, JSONRPCRequest):
            self._server_waits.add(message.id)
        elif isinstance(message, JSONRPCResponse | JSONRPCError) and message.id is not None:
            self._client_waits.pop(message.id, None)
            self.session.from_server(message)
        return Relayed(to_client=(line + b"\n",))

    def server_ended(self, reason: str) -> Relayed:
        """The server's output ended (``reason``: :func:`exit_reason`): an error for every
        request of the client still waiting for it (a tool call among them counts as failed)."""
        from mcp_types import ErrorData, JSONRPCError

        lines = []
        for request_id, method in self._client_waits.items():
            text = f"the MCP server {reason} before answering this request ({method})"
            error = JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=_CONNECTION_CLOSED, message=text))
            self.session.from_server(error)
            lines.append(_model_line(error))
        self._client_waits.clear()
        self._server_waits.clear()
        return Relayed(to_client=tuple(lines))

    def _too_large(self, who: str, line: Oversized) -> str:
        return (
            f"{who} is {line.size} bytes, over the proxy's cap of {self.max_message_bytes} bytes "
            "(max_message_bytes); it was not relayed"
        )

    def _oversized_from_client(self, line: Oversized) -> Relayed:
        request_id, kind = head_fields(line.head)
        logger.warning("mcp-proxy: %s", self._too_large("a message from the client", line))
        if kind != "request" and request_id in self._server_waits:  # the answer to the server's request
            self._server_waits.discard(request_id)
            text = f"Response too large: the client's response {self._too_large('', line)[1:]}"
            return Relayed(to_server=(_error_line(request_id, _INTERNAL_ERROR, text),))
        text = f"Request too large: the message {self._too_large('', line)[1:]}"
        return Relayed(to_client=(_error_line(request_id, _INVALID_REQUEST, text),))

    def _oversized_from_server(self, line: Oversized) -> Relayed:
        from mcp_types import ErrorData, JSONRPCError

        request_id, kind = head_fields(line.head)
        logger.warning("mcp-proxy: %s", self._too_large("a message from the server", line))
        if kind != "request" and request_id is not None and request_id in self._client_waits:
            self._client_waits.pop(request_id)
            text = f"Response too large: the MCP server's response {self._too_large('', line)[1:]}"
            error = JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=_INTERNAL_ERROR, message=text))
            self.session.from_server(error)  # a tool call whose result cannot be relayed failed
            return Relayed(to_client=(_model_line(error),))
        if kind == "request" or (kind is None and request_id is not None):
            text = f"Request too large: the message {self._too_large('', line)[1:]}"
            return Relayed(to_server=(_error_line(request_id, _INVALID_REQUEST, text),))
        return Relayed()  # a notification (or no id in its head): nobody waits for it


# -- the I/O shell ------------------------------------------------------------------------------


class _Peer(Protocol):
    """One side of the proxy: its lines (ending when its stream does) and a way to send it
    lines (never raising: what a peer that is gone cannot take is dropped)."""

    def lines(self) -> AsyncIterator[bytes | Oversized]: ...

    async def send(self, data: bytes, /) -> None: ...


class _Server(_Peer, Protocol):
    async def close(self) -> None:
        """Close the server's input (MCP's shutdown signal)."""

    async def stop(self) -> int | None:
        """Close its input, give it time to exit, then terminate it (bounded); its exit status."""


@dataclass(frozen=True, slots=True)
class SessionEnd:
    """How a proxied session ended: by the client (it closed its stream first) or not, how the
    server ended (:func:`exit_reason`, and its status) and how many of the client's requests got
    an error for it."""

    by_client: bool
    reason: str
    returncode: int | None
    failed_requests: int


async def relay(protocol: ProxyProtocol, client: _Peer, server: _Server) -> SessionEnd:
    """Relay lines both ways through ``protocol`` until the server's output ends. When the
    client's stream ends first, the server's input is closed and the server stopped (it gets
    time to exit, then is terminated); either way every request still waiting for the server
    then gets an error (:meth:`ProxyProtocol.server_ended`)."""
    import anyio

    by_client = False

    async def deliver(relayed: Relayed) -> None:
        for data in relayed.to_client:
            await client.send(data)
        for data in relayed.to_server:
            await server.send(data)

    async def upstream() -> None:
        nonlocal by_client
        async for line in client.lines():
            await deliver(protocol.from_client(line))
        by_client = True
        await server.stop()  # its output then ends, and downstream with it

    async def downstream(done: anyio.CancelScope) -> None:
        async for line in server.lines():
            await deliver(protocol.from_server(line))
        done.cancel()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(upstream)
        tasks.start_soon(downstream, tasks.cancel_scope)
    with anyio.CancelScope(shield=True):
        returncode = await server.stop()
        reason = exit_reason(returncode)
        failed = protocol.server_ended(reason)
        await deliver(failed)
    return SessionEnd(by_client, reason, returncode, len(failed.to_client))


def server_command(command: Sequence[str]) -> tuple[str, list[str]]:
    """The server's executable (resolved on PATH) and its arguments; ConfigError when missing."""
    if not command:
        raise ConfigError("treellm mcp-proxy needs the MCP server's command after --", setting="command")
    executable = shutil.which(command[0])
    if executable is None:
        raise ConfigError(f"cannot start the MCP server: {command[0]!r} is not an executable file or on PATH")
    return executable, list(command[1:])


def run_mcp_proxy(
    command: Sequence[str],
    config: TreeConfig | None = None,
    *,
    on_repeat: RepeatAction = "prune",
    max_repeats: int | None = None,
    trace: str | os.PathLike[str] | None = None,
    name: str = "mcp-proxy",
    session_id: str | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> None:
    """Serve one MCP session on this process's stdin/stdout in front of the server that
    ``command`` starts (with this process's environment), guarding its tool calls.

    ``config`` (a limits file) overrides ``on_repeat`` and ``max_repeats`` per tool, as for
    :class:`~treellm.LoopGuard`; ``name`` is the agent's name in traces; ``max_message_bytes``
    caps each message either way (a longer one is answered with an error naming the cap).
    Tracing is :func:`treellm.configure` (``jsonl=trace``, else the ``OTEL_*`` variables),
    installed for the process and flushed at the end. Blocks until the client closes stdin
    (the server then gets time to exit) or the server's output ends; then the session's run
    ends. Raises ``MissingExtraError`` without the ``mcp`` extra, ``ConfigError`` for a missing
    command, a cap that is not a positive integer or a bad ``OTEL_*`` variable, and
    :class:`ServerExitedError` when the server ended while the client was connected (after
    every waiting request got an error). While serving, stdout is the protocol's: fd 1 points
    at stderr meanwhile, so stray output misses the protocol's stream.
    """
    require_extra("treellm mcp-proxy", "mcp", "mcp")
    if isinstance(max_message_bytes, bool) or not isinstance(max_message_bytes, int) or max_message_bytes < 1:
        raise ConfigError(
            f"max_message_bytes: expected a positive number of bytes, got {max_message_bytes!r}",
            setting="max_message_bytes",
        )
    import anyio

    from treellm.setup import configure

    executable, args = server_command(command)
    provider = configure(jsonl=trace)
    guard = LoopGuard(on_repeat=on_repeat, max_repeats=max_repeats, config=config, name=name, tracer_provider=provider)
    session = GuardedSession(guard, session_id or f"mcp-{uuid.uuid4().hex}")
    protocol = ProxyProtocol(session, max_message_bytes=max_message_bytes)
    finished: list[bool] = []

    def finish(end: SessionEnd | None) -> None:  # once: in _serve, else (it failed before) here
        if not finished:
            finished.append(True)
            session.close(failed=end is not None and not end.by_client)
            provider.shutdown()

    try:
        end = anyio.run(_serve, protocol, executable, args, finish)
    finally:
        finish(None)
    if not end.by_client:
        raise ServerExitedError(end.reason, returncode=end.returncode, failed_requests=end.failed_requests)


async def _serve(
    protocol: ProxyProtocol, executable: str, args: list[str], finish: Callable[[SessionEnd | None], None]
) -> SessionEnd:
    """Relay between this process's stdio and the server's; ``finish`` runs while stdout is
    still diverted (so a console exporter's last spans miss the protocol's stream)."""
    with _protocol_stdout() as stdout_fd:
        client = _ClientStdio(sys.stdin.fileno(), stdout_fd, protocol.splitter)
        try:
            async with _ServerProcess.start(executable, args, protocol.splitter) as server:
                end = await relay(protocol, client, server)
        finally:
            client.close()
        finish(end)
        return end


@contextmanager
def _protocol_stdout() -> Iterator[int]:
    """A private duplicate of fd 1 for the protocol, with fd 1 pointed at stderr meanwhile."""
    sys.stdout.flush()
    private = os.dup(1)
    try:
        os.dup2(2, 1)
        try:
            yield private
        finally:
            sys.stdout.flush()
            os.dup2(private, 1)
    finally:
        os.close(private)


class _ClientStdio:
    """The client's side: lines from ``stdin_fd`` read by a daemon thread (``os.read``, no
    buffered file object, so a read still blocked when the proxy ends holds neither a lock nor
    the process's exit) and handed over through a small queue (so a fast client waits for the
    server); lines to ``stdout_fd`` written by another daemon thread, one at a time. A client
    that is gone drops what is sent to it."""

    def __init__(self, stdin_fd: int, stdout_fd: int, splitter: Callable[[], LineSplitter]) -> None:
        self._stdin_fd = stdin_fd
        self._splitter = splitter
        self._writes: queue.SimpleQueue[tuple[bytes, Callable[[OSError | None], None]] | None] = queue.SimpleQueue()
        self._broken = False
        threading.Thread(target=self._write, args=(stdout_fd,), name="treellm-mcp-proxy-stdout", daemon=True).start()

    async def lines(self) -> AsyncIterator[bytes | Oversized]:
        loop = asyncio.get_running_loop()
        handoff: asyncio.Queue[list[bytes | Oversized] | None] = asyncio.Queue()
        room = threading.Semaphore(4)  # batches read ahead: a client faster than the server waits
        splitter = self._splitter()

        def read() -> None:
            def put(item: list[bytes | Oversized] | None) -> None:
                room.acquire()
                loop.call_soon_threadsafe(handoff.put_nowait, item)

            try:
                while chunk := os.read(self._stdin_fd, 1 << 20):
                    if lines := splitter.feed(chunk):
                        put(lines)
                put(splitter.end())
                put(None)
            except (RuntimeError, OSError):  # the loop closed (nobody reads), or the descriptor did
                logger.debug("mcp-proxy: stopped reading stdin", exc_info=True)

        threading.Thread(target=read, name="treellm-mcp-proxy-stdin", daemon=True).start()
        while (batch := await handoff.get()) is not None:
            room.release()
            for line in batch:
                yield line

    async def send(self, data: bytes, /) -> None:
        if self._broken:
            return
        loop = asyncio.get_running_loop()
        written: asyncio.Future[OSError | None] = loop.create_future()

        def done(error: OSError | None) -> None:
            def settle() -> None:
                if not written.done():  # not cancelled meanwhile
                    written.set_result(error)

            with suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(settle)

        self._writes.put((data, done))
        error = await written
        if error is not None:
            logger.info("mcp-proxy: the client's stdout is closed (%s); dropping what is sent to it", error)
            self._broken = True

    def close(self) -> None:
        self._writes.put(None)

    def _write(self, fd: int) -> None:
        while (item := self._writes.get()) is not None:
            data, done = item
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            except OSError as exc:
                done(exc)
            else:
                done(None)


class _ServerProcess:
    """The server's side: the subprocess (in a session of its own on POSIX, so stopping it
    stops its children), its stdout split into lines, its stdin written in order."""

    def __init__(self, process: Process, splitter: Callable[[], LineSplitter]) -> None:
        self._process = process
        self._splitter = splitter
        self._closed = False

    @classmethod
    @asynccontextmanager
    async def start(
        cls, executable: str, args: list[str], splitter: Callable[[], LineSplitter]
    ) -> AsyncIterator[_ServerProcess]:
        import anyio

        try:
            process = await anyio.open_process(
                [executable, *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=None,
                env=dict(os.environ),
                start_new_session=sys.platform != "win32",
            )
        except OSError as exc:
            raise ConfigError(f"cannot start the MCP server {executable!r}: {exc.strerror or exc}") from exc
        server = cls(process, splitter)
        try:
            yield server
        finally:
            with anyio.CancelScope(shield=True):
                await server.stop()
                with anyio.move_on_after(_GRACE_SECONDS):
                    await process.aclose()

    async def lines(self) -> AsyncIterator[bytes | Oversized]:
        import anyio

        stdout = self._process.stdout
        assert stdout is not None
        splitter = self._splitter()
        while True:
            try:
                chunk = await stdout.receive(1 << 20)
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                break
            for line in splitter.feed(chunk):
                yield line
        for line in splitter.end():
            yield line

    async def send(self, data: bytes, /) -> None:
        import anyio

        stdin = self._process.stdin
        assert stdin is not None
        try:
            await stdin.send(data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
            logger.debug("mcp-proxy: the server's stdin is closed (%s); its request waits for the server's end", exc)

    async def close(self) -> None:
        import anyio

        if not self._closed:
            self._closed = True
            stdin = self._process.stdin
            assert stdin is not None
            with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                await stdin.aclose()

    async def stop(self) -> int | None:
        await self.close()
        for sig in (signal.SIGTERM, getattr(signal, "SIGKILL", signal.SIGTERM), None):
            if await self._exited_within(_GRACE_SECONDS) or sig is None:
                break
            logger.info("mcp-proxy: the MCP server has not exited; sending it %s", signal.Signals(sig).name)
            self._signal(sig)
        return self._process.returncode

    async def _exited_within(self, seconds: float) -> bool:
        """Polls the exit status (``wait()`` would also wait for the pipes a child may hold)."""
        import anyio

        with anyio.move_on_after(seconds):
            while self._process.returncode is None:
                await anyio.sleep(0.01)
        return self._process.returncode is not None

    def _signal(self, sig: int) -> None:
        with suppress(ProcessLookupError, PermissionError):
            if sys.platform == "win32":
                self._process.kill()
            else:
                os.killpg(self._process.pid, sig)
