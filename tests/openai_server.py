"""A scriptable OpenAI-compatible Chat Completions server on loopback, for tests.

Not a test module: import it (``from openai_server import OpenAIServer, Turn``).

``OpenAIServer`` is a real HTTP/1.1 server (stdlib ``ThreadingHTTPServer`` on
``127.0.0.1``, port 0, served from a background thread) that answers
``POST /v1/chat/completions`` with ``text/event-stream`` chunks the way OpenAI
does: ``data: {json}\\n\\n`` frames, text and tool-call arguments split into small
pieces, ``index`` on every tool-call fragment and the id and name only on the
first, an empty-``choices`` usage chunk when ``stream_options.include_usage`` is
set, then ``data: [DONE]``. Because it is a socket, a CLI run in a subprocess can
talk to it as well as in-process clients: pass ``server.base_url``
(``http://127.0.0.1:PORT/v1``) to it.

Script it with responses consumed one per request, in order (or a callable
``(body) -> response``):

- :class:`Turn` -- text and/or :class:`Call` tool calls and usage; ``delay``
  seconds before answering makes a slow turn (:func:`slow`), ``chunk_delay``
  stalls between chunks, ``whole_calls`` sends every call whole with no ``index``
  (as some OpenAI-compatible servers do; also a server-wide option).
- :class:`ErrorReply` -- a status code with an OpenAI-style error body and
  optional ``retry-after-ms`` / ``Retry-After`` headers.
- :class:`StreamErrorReply` -- a 200 stream that breaks off with an error event.

Like real servers it validates every request before taking a response from the
script: the body shape, the tool specs, and the history (every assistant
``tool_calls`` entry answered by exactly one following ``role: tool`` message
before the next assistant/user message, and no stray tool message). A rejected
request gets a 400 ``invalid_request_error`` and consumes no scripted response.
A request past the end of the script gets a 500 with ``x-should-retry: false``
naming the problem. Every request is recorded in ``requests`` (method, path,
lower-cased headers, parsed JSON body, the status answered).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

__all__ = [
    "Call",
    "ErrorReply",
    "OpenAIServer",
    "RecordedRequest",
    "Reply",
    "StreamErrorReply",
    "Turn",
    "completion_json",
    "history_problem",
    "request_problem",
    "slow",
    "stream_events",
    "turn_chunks",
]

HISTORY_MESSAGE = (
    "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'."
)
_CREATED = 1_700_000_000
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


@dataclass(frozen=True)
class Call:
    """A tool call in a scripted turn; ``id`` defaults to ``call_<request>_<position>``."""

    name: str
    arguments: str | Mapping[str, Any] = "{}"
    id: str | None = None

    def arguments_text(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, separators=(",", ":"))


@dataclass(frozen=True)
class Turn:
    """A successful streamed answer. ``usage`` is ``(prompt_tokens, completion_tokens)``."""

    text: str = ""
    tool_calls: Sequence[Call] = ()
    usage: tuple[int, int] | None = (11, 7)
    delay: float = 0.0
    chunk_delay: float = 0.0
    whole_calls: bool = False
    piece_size: int = 4


@dataclass(frozen=True)
class ErrorReply:
    """An HTTP error with an OpenAI-style body ``{"error": {"message", "type", "param", "code"}}``."""

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    retry_after_ms: int | None = None
    retry_after: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def all_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.retry_after_ms is not None:
            headers["retry-after-ms"] = str(self.retry_after_ms)
        if self.retry_after is not None:
            headers["Retry-After"] = self.retry_after
        return headers


@dataclass(frozen=True)
class StreamErrorReply:
    """A 200 stream that sends ``text`` and then breaks off with ``data: {"error": ...}``."""

    message: str
    text: str = ""
    type: str = "server_error"


Reply = Turn | ErrorReply | StreamErrorReply
Script = Sequence[Reply] | Callable[[dict[str, Any]], Reply]


def slow(seconds: float, turn: Turn | None = None) -> Turn:
    """A turn that answers only after ``seconds`` (``Turn("late")`` by default)."""
    return replace(turn if turn is not None else Turn("late"), delay=seconds)


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it, and the status it answered."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any
    status: int


# ---------------------------------------------------------------------------- pure protocol


def _pieces(text: str, size: int) -> list[str]:
    if not text:
        return []
    size = max(size, 1)
    return [text[i : i + size] for i in range(0, len(text), size)]


def turn_chunks(
    turn: Turn, *, model: str, number: int, include_usage: bool, whole_calls: bool = False
) -> list[dict[str, Any]]:
    """The chunk objects (before ``data: [DONE]``) that stream ``turn`` as request ``number``."""
    chunk_id = f"chatcmpl-{number}"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": _CREATED,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            out["usage"] = None
        return out

    chunks = [chunk({"role": "assistant", "content": "" if turn.text else None})]
    chunks += [chunk({"content": piece}) for piece in _pieces(turn.text, turn.piece_size)]
    calls = [(call.id or f"call_{number}_{i}", call) for i, call in enumerate(turn.tool_calls)]
    if whole_calls or turn.whole_calls:
        if calls:
            whole = [
                {"id": cid, "type": "function", "function": {"name": c.name, "arguments": c.arguments_text()}}
                for cid, c in calls
            ]
            chunks.append(chunk({"tool_calls": whole}))
    else:
        for index, (cid, call) in enumerate(calls):
            first = {"index": index, "id": cid, "type": "function"}
            chunks.append(chunk({"tool_calls": [{**first, "function": {"name": call.name, "arguments": ""}}]}))
            for piece in _pieces(call.arguments_text(), turn.piece_size):
                chunks.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    chunks.append(chunk({}, "tool_calls" if calls else "stop"))
    if include_usage and turn.usage is not None:
        prompt, completion = turn.usage
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        chunks.append({**chunk({}), "choices": [], "usage": usage})
    return chunks


def completion_json(turn: Turn, *, model: str, number: int) -> dict[str, Any]:
    """``turn`` as one non-streamed ``chat.completion`` object (request ``number``)."""
    calls = [
        {
            "id": c.id or f"call_{number}_{i}",
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments_text()},
        }
        for i, c in enumerate(turn.tool_calls)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": turn.text or None, "refusal": None}
    if calls:
        message["tool_calls"] = calls
    prompt, completion = turn.usage or (0, 0)
    return {
        "id": f"chatcmpl-{number}",
        "object": "chat.completion",
        "created": _CREATED,
        "model": model,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": "tool_calls" if calls else "stop"}
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def stream_events(
    reply: Turn | StreamErrorReply, *, model: str, number: int, include_usage: bool, whole_calls: bool = False
) -> list[str]:
    """The ``data:`` payloads of one streamed reply, ``[DONE]`` included when the stream ends well."""
    if isinstance(reply, StreamErrorReply):
        chunks = turn_chunks(Turn(reply.text, usage=None), model=model, number=number, include_usage=False)
        error = {"error": {"message": reply.message, "type": reply.type, "param": None, "code": None}}
        return [json.dumps(chunk) for chunk in chunks[:-1]] + [json.dumps(error)]
    chunks = turn_chunks(reply, model=model, number=number, include_usage=include_usage, whole_calls=whole_calls)
    return [json.dumps(chunk) for chunk in chunks] + ["[DONE]"]


def history_problem(messages: Sequence[Any]) -> tuple[str, str] | None:
    """``(message, param)`` when a tool call goes unanswered or a tool message answers none."""
    pending: dict[str, int] = {}
    for position, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in pending:
                detail = (
                    f"Message {position} (role 'tool', tool_call_id {call_id!r}) does not respond to a "
                    "'tool_call_id' of the preceding assistant message."
                )
                return f"{HISTORY_MESSAGE} {detail}", f"messages.[{position}]"
            del pending[call_id]
            continue
        if pending:
            return _unanswered(pending)
        if role == "assistant":
            pending = {call.get("id"): position for call in message.get("tool_calls") or ()}
    return _unanswered(pending) if pending else None


def _unanswered(pending: Mapping[str, int]) -> tuple[str, str]:
    ids = ", ".join(str(call_id) for call_id in pending)
    position = next(iter(pending.values()))
    detail = f"The following tool_call_ids did not have response messages: {ids}"
    return f"{HISTORY_MESSAGE} {detail}", f"messages.[{position}].role"


def request_problem(body: Any, *, plain_json: bool = False) -> tuple[str, str | None] | None:
    """``(message, param)`` when a chat completions request is malformed, as a real server checks it."""
    if not isinstance(body, dict):
        return "We could not parse the JSON body of your request.", None
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "you must provide a model parameter", "model"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "[] is too short - 'messages'", "messages"
    if body.get("stream") is not True and not plain_json:
        return "This test server only streams: send 'stream': true.", "stream"
    for position, message in enumerate(messages):
        problem = _message_problem(message, position)
        if problem is not None:
            return problem
    for position, tool in enumerate(body.get("tools") or ()):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            return f"Missing required parameter: 'tools[{position}].function'.", f"tools[{position}]"
        if not isinstance(function.get("name"), str) or not isinstance(function.get("parameters", {}), dict):
            return f"Invalid 'tools[{position}].function'.", f"tools[{position}].function"
    return history_problem(messages)


def _message_problem(message: Any, position: int) -> tuple[str, str] | None:
    param = f"messages.[{position}]"
    if not isinstance(message, dict) or message.get("role") not in _ROLES:
        return f"Invalid value for 'role' in {param}.", f"{param}.role"
    if message["role"] == "tool" and not isinstance(message.get("tool_call_id"), str):
        return f"Missing required parameter: '{param}.tool_call_id'.", f"{param}.tool_call_id"
    for index, call in enumerate(message.get("tool_calls") or ()):
        function = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(call, dict) and isinstance(call.get("id"), str) and isinstance(function, dict)):
            return f"Invalid '{param}.tool_calls[{index}]'.", f"{param}.tool_calls[{index}]"
        if not isinstance(function.get("name"), str) or not isinstance(function.get("arguments"), str):
            return f"Invalid '{param}.tool_calls[{index}].function'.", f"{param}.tool_calls[{index}].function"
    return None


# ---------------------------------------------------------------------------- the server


class OpenAIServer:
    """The server; use it as a context manager or call ``start()`` / ``stop()``.

    ``whole_calls=True`` sends every turn's tool calls whole with no ``index``.
    ``reject_stream_options=True`` answers 400 to any request carrying
    ``stream_options`` (as some OpenAI-compatible servers do), consuming no response.
    ``plain_json=True`` also answers requests without ``"stream": true`` with one
    ``chat.completion`` JSON object (frameworks that do not stream send those).
    """

    def __init__(
        self,
        script: Script = (),
        *,
        whole_calls: bool = False,
        reject_stream_options: bool = False,
        plain_json: bool = False,
    ) -> None:
        self.plain_json = plain_json
        self._responder = script if callable(script) else None
        self._script: list[Reply] = [] if callable(script) else list(script)
        self._taken = 0
        self.whole_calls = whole_calls
        self.reject_stream_options = reject_stream_options
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle

    def start(self) -> OpenAIServer:
        httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        httpd.owner = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="openai-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``, what a client takes as its base URL."""
        if self._httpd is None:
            raise RuntimeError("OpenAIServer is not running: call start() or use it in a with block")
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    # -- scripting and inspection

    def add(self, *replies: Reply) -> None:
        """Append replies to the script (a list script only)."""
        with self._lock:
            self._script.extend(replies)

    @property
    def bodies(self) -> list[Any]:
        """The parsed JSON body of every request, in arrival order."""
        with self._lock:
            return [request.body for request in self.requests]

    @property
    def remaining(self) -> int:
        """Scripted replies not yet taken."""
        with self._lock:
            return len(self._script) - self._taken

    # -- called from handler threads

    def _decide(self, method: str, path: str, headers: Mapping[str, str], body: Any) -> tuple[Reply, int]:
        """The reply to one request and its number (1-based); records the request."""
        with self._lock:
            number = len(self.requests) + 1
            reply = self._reply_for(path, body)
            status = reply.status if isinstance(reply, ErrorReply) else 200
            self.requests.append(RecordedRequest(method, path, dict(headers), body, status))
            return reply, number

    def _reply_for(self, path: str, body: Any) -> Reply:
        if path.rstrip("/") != "/v1/chat/completions":
            return ErrorReply(404, f"Invalid URL (POST {path})")
        problem = request_problem(body, plain_json=self.plain_json)
        if problem is not None:
            return ErrorReply(400, problem[0], param=problem[1])
        if self.reject_stream_options and "stream_options" in body:
            return ErrorReply(400, "Unrecognized request argument supplied: stream_options", param="stream_options")
        if self._responder is not None:
            return self._responder(body)
        if self._taken >= len(self._script):
            message = (
                f"openai_server script exhausted: request {len(self.requests) + 1} "
                f"but the script holds {len(self._script)} replies"
            )
            return ErrorReply(500, message, type="server_error", headers={"x-should-retry": "false"})
        self._taken += 1
        return self._script[self._taken - 1]

    def _pause(self, seconds: float) -> None:
        if seconds > 0:
            self._stopping.wait(seconds)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    owner: OpenAIServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "openai-test-server/1"
    timeout = 10.0
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: requests are recorded on the server instead."""

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = None
        headers = {name.lower(): value for name, value in self.headers.items()}
        owner = self.server.owner
        reply, number = owner._decide("POST", self.path, headers, body)
        try:
            if isinstance(reply, ErrorReply):
                owner._pause(reply.delay)
                self._send_json(reply.status, reply.body(), reply.all_headers())
            elif isinstance(reply, Turn) and body.get("stream") is not True:
                owner._pause(reply.delay)
                self._send_json(200, completion_json(reply, model=str(body["model"]), number=number), {})
            else:
                self._send_stream(reply, body, number)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up (a timeout): nothing to answer

    def do_GET(self) -> None:
        self._send_json(404, ErrorReply(404, f"Invalid URL (GET {self.path})").body(), {})

    def _send_json(self, status: int, payload: Mapping[str, Any], headers: Mapping[str, str]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _send_stream(self, reply: Turn | StreamErrorReply, body: Mapping[str, Any], number: int) -> None:
        owner = self.server.owner
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        whole = owner.whole_calls
        events = stream_events(
            reply, model=str(body["model"]), number=number, include_usage=include_usage, whole_calls=whole
        )
        delay, chunk_delay = (reply.delay, reply.chunk_delay) if isinstance(reply, Turn) else (0.0, 0.0)
        owner._pause(delay)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for position, event in enumerate(events):
            if position:
                owner._pause(chunk_delay)
            self._write_chunk(f"data: {event}\n\n".encode())
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()
