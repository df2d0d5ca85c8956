"""``treellm mcp-proxy``: a :class:`~treellm.LoopGuard` in front of any MCP server, over stdio.

The proxy is an MCP server on its own stdin/stdout that launches the real server as a
subprocess (the official ``mcp`` SDK's stdio transports on both sides) and relays JSON-RPC
messages between them *unchanged*: initialize and capabilities, listings, resources,
prompts, notifications, the server's own requests (sampling, elicitation) and their
answers. Only ``tools/call`` requests are looked at, and each one goes through the guard:

- allowed: forwarded; its response is recorded before it is relayed (a result with
  ``isError: true`` or a JSON-RPC error is a failed call; an ``input_required`` result, or
  a ``notifications/cancelled`` from the client, releases the call: it has not run yet);
- caught: answered by the proxy, never reaching the server (:func:`caught_result`): ``prune``
  gives a result with ``isError: true`` saying the identical call was already made N times
  in this session; ``nudge`` the guard's answer text (with the earlier result's structured
  content); ``cache`` the earlier result, replayed whole.

One proxy process serves one client session, so the guard has one path: a session id made
per proxy run (a random hex id, or ``session_id=``). Calls the client sends concurrently
count against each other through the guard's reservations, in the order they arrive.

Hard rules: everything but :func:`run_mcp_proxy` and :func:`relay` is synchronous and does no
I/O; ``mcp`` is imported inside functions (``require_extra`` first), so importing this module
never needs the ``mcp`` extra. A broken message from either side is logged and skipped (a
client's gets a JSON-RPC parse error), never raised.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import sys
import threading
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from treellm.config import RepeatAction, TreeConfig
from treellm.errors import ConfigError, require_extra
from treellm.guard import GuardDecision, LoopGuard

if TYPE_CHECKING:
    from mcp.shared.message import SessionMessage
    from mcp_types import JSONRPCMessage

__all__ = [
    "GuardedSession",
    "Outcome",
    "ToolCall",
    "caught_result",
    "outcome",
    "relay",
    "run_mcp_proxy",
    "server_command",
    "tool_call",
]

logger = logging.getLogger(__name__)

RequestId = int | str


class _Sender(Protocol):
    """The writing end of a transport (what the SDK's stdio transports yield)."""

    async def send(self, item: SessionMessage, /) -> None: ...

    async def aclose(self) -> None: ...


_Streams = tuple["AsyncIterable[SessionMessage | Exception]", _Sender]
"""A transport's (read, write) streams."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A ``tools/call`` request: its JSON-RPC id, the tool and its arguments."""

    request_id: RequestId
    tool: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a ``tools/call`` response says about the call: its result text and whether it failed."""

    text: str
    failed: bool


def tool_call(request_id: RequestId, method: str, params: Mapping[str, Any] | None) -> ToolCall | None:
    """The tool call a request makes, None for any other request (or one without a tool name)."""
    if method != "tools/call" or params is None or not isinstance(params.get("name"), str):
        return None
    arguments = params.get("arguments")
    return ToolCall(request_id, params["name"], arguments if isinstance(arguments, Mapping) else {})


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


class GuardedSession:
    """The guard's side of one proxied session: which forwarded calls await their response.

    Synchronous and I/O-free; one task hands it the client's messages, another the server's
    (both on one event loop). It never raises on a message's content.
    """

    def __init__(self, guard: LoopGuard, session_id: str) -> None:
        self.guard = guard
        self.session_id = session_id
        self._pending: dict[RequestId, tuple[ToolCall, GuardDecision]] = {}
        self._latest: dict[str, tuple[str, Mapping[str, Any]]] = {}
        """Per signature, the node id and result of its latest recorded call (what cache replays)."""

    def from_client(self, message: JSONRPCMessage) -> JSONRPCMessage | None:
        """Check a client message: the response to send back instead of forwarding it (a
        caught call), or None to forward it unchanged."""
        from mcp_types import JSONRPCNotification, JSONRPCRequest, JSONRPCResponse

        if isinstance(message, JSONRPCNotification):
            if message.method == "notifications/cancelled" and message.params is not None:
                self._release(message.params.get("requestId"))
            return None
        if not isinstance(message, JSONRPCRequest):
            return None
        call = tool_call(message.id, message.method, message.params)
        if call is None:
            return None
        decision = self.guard.check(call.tool, dict(call.arguments), self.session_id, call_id=str(call.request_id))
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
            dict(call.arguments),
            done.text,
            self.session_id,
            call_id=str(call.request_id),
            error=done.failed,
        )
        self._latest[decision.signature] = (node_id, result)

    def _release(self, request_id: object) -> None:
        if isinstance(request_id, int | str):
            entry = self._pending.pop(request_id, None)
            if entry is not None:
                self.guard.release(entry[1])

    def close(self) -> None:
        """End the session's run; calls still awaiting a response are dropped."""
        self._pending.clear()
        self.guard.end(self.session_id)


async def relay(
    session: GuardedSession,
    client: _Streams,
    server: _Streams,
) -> None:
    """Relay messages both ways through ``session`` until either side closes its stream; then
    close both write streams (so each transport's writer, and the transport, can end)."""
    import anyio
    from mcp.shared.message import SessionMessage
    from mcp_types import PARSE_ERROR, ErrorData, JSONRPCError

    client_read, client_write = client
    server_read, server_write = server

    async def upstream(done: anyio.CancelScope) -> None:
        async for item in client_read:
            if isinstance(item, Exception):
                logger.warning("mcp-proxy: the client sent a message that is not JSON-RPC: %s", item)
                error = ErrorData(code=PARSE_ERROR, message=f"Parse error: {item}")
                await client_write.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=None, error=error)))
                continue
            reply = session.from_client(item.message)
            if reply is None:
                await server_write.send(item)
            else:
                await client_write.send(SessionMessage(reply))
        done.cancel()

    async def downstream(done: anyio.CancelScope) -> None:
        async for item in server_read:
            if isinstance(item, Exception):
                logger.warning("mcp-proxy: the server sent a message that is not JSON-RPC: %s", item)
                continue
            session.from_server(item.message)
            await client_write.send(item)
        done.cancel()

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(upstream, tasks.cancel_scope)
            tasks.start_soon(downstream, tasks.cancel_scope)
    finally:  # the transports' writers end when their streams close
        await client_write.aclose()
        await server_write.aclose()


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
) -> None:
    """Serve one MCP session on this process's stdin/stdout in front of the server that
    ``command`` starts (with this process's environment), guarding its tool calls.

    ``config`` (a limits file) overrides ``on_repeat`` and ``max_repeats`` per tool, as for
    :class:`~treellm.LoopGuard`; ``name`` is the agent's name in traces. Tracing is
    :func:`treellm.configure` (``jsonl=trace``, else the ``OTEL_*`` variables), installed
    for the process and flushed at the end. Blocks until the client closes stdin or the
    server exits; then the session's run ends. Raises ``MissingExtraError`` without the
    ``mcp`` extra, ``ConfigError`` for a missing command or a bad ``OTEL_*`` variable.
    While serving, stdout is the protocol's: the SDK points fd 1 at stderr meanwhile.
    """
    require_extra("treellm mcp-proxy", "mcp", "mcp")
    import anyio

    from treellm.setup import configure

    executable, args = server_command(command)
    provider = configure(jsonl=trace)
    guard = LoopGuard(on_repeat=on_repeat, max_repeats=max_repeats, config=config, name=name, tracer_provider=provider)
    session = GuardedSession(guard, session_id or f"mcp-{uuid.uuid4().hex}")
    finished: list[bool] = []

    def finish() -> None:  # once: in _serve, else (it failed before) here
        if not finished:
            finished.append(True)
            session.close()
            provider.shutdown()

    try:
        anyio.run(_serve, session, executable, args, finish)
    finally:
        finish()


async def _serve(session: GuardedSession, executable: str, args: list[str], finish: Callable[[], None]) -> None:
    """Relay between this process's stdio and the server's; ``finish`` runs while stdout is
    still diverted (so a console exporter's last spans miss the protocol's stream)."""
    import anyio
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.server.stdio import stdio_server

    params = StdioServerParameters(command=executable, args=args, env=dict(os.environ))
    # the transport only iterates its stdin: lines from a daemon thread, so a server that exits
    # first ends the proxy at once instead of waiting for the client's next line
    with anyio.CancelScope() as scope:
        async with stdio_server(stdin=cast("anyio.AsyncFile[str]", _StdinLines(sys.stdin.fileno()))) as client:
            try:
                async with stdio_client(params) as server:
                    await relay(session, client, server)
            finally:
                finish()
                scope.cancel()  # the transport's reader would wait for the client's EOF


class _StdinLines:
    """A file descriptor's lines (UTF-8) as an async iterator, read by a daemon thread with
    ``os.read`` (no buffered file object, so no lock held at exit): a read still blocked when
    the proxy ends never holds up the process's exit, as a worker thread would."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        lines: asyncio.Queue[str] = asyncio.Queue()

        def read() -> None:
            try:
                for line in _split_lines(self._fd):
                    loop.call_soon_threadsafe(lines.put_nowait, line)
                loop.call_soon_threadsafe(lines.put_nowait, "")
            except (RuntimeError, OSError):  # the loop closed (nobody reads), or the descriptor did
                logger.debug("mcp-proxy: stopped reading stdin", exc_info=True)

        threading.Thread(target=read, name="treellm-mcp-proxy-stdin", daemon=True).start()
        while line := await lines.get():
            yield line


def _split_lines(fd: int) -> Iterator[str]:
    """The lines read from ``fd`` until its end, each with its newline (the last maybe without)."""
    pending = b""
    while chunk := os.read(fd, 65536):
        *complete, pending = (pending + chunk).split(b"\n")
        for line in complete:
            yield line.decode("utf-8", "replace") + "\n"
    if pending:
        yield pending.decode("utf-8", "replace")
