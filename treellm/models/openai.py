"""``OpenAICompatibleModel``: a :class:`~treellm.models.base.ChatModel` over the Chat Completions API.

It drives OpenAI, Gemini's OpenAI endpoint, Ollama, vLLM and any server that
speaks ``POST {base_url}/chat/completions`` with ``stream: true``, through the
official ``openai`` SDK (``AsyncOpenAI``); it never parses HTTP or SSE itself.

Contract (see :mod:`treellm.models.base` for the seam):

- The executor's ThinkNode (and CollapseNode) step calls ``stream(request)`` on
  the run's event loop and iterates it; nothing blocks the loop. Each call opens
  its own SDK client and closes it when the stream ends, fails or is closed
  early, so one instance is safe to share between concurrent streams and
  between event loops (``asyncio.run`` per test, per CLI command); the price is
  a new connection per turn (some 20 ms of setup, small beside a model's turn).
- Deltas come as the server sends them: ``TextDelta`` per content piece,
  ``ToolCallDelta`` per tool-call fragment (``index`` is ``None`` when the server
  sends whole calls without one), ``UsageDelta`` when a chunk carries usage
  (asked for with ``stream_options.include_usage``). Chunks with no choices
  (the usage chunk) are handled.
- 408, 409, 429, 5xx, timeouts and connection failures are retried by the SDK
  (``max_retries``, exponential backoff with jitter, honouring ``retry-after-ms``
  and ``Retry-After`` up to two minutes; a longer one fails at once). ``timeout``
  bounds each connect, read and write, not the whole stream: a server that keeps
  sending is never cut off.
- When no turn can be had it raises :class:`~treellm.errors.ModelError` naming the
  base URL, the model, the HTTP status and the server's own message, always
  ``from`` the SDK's exception: ``status`` is the HTTP status (``None`` for
  timeouts, connection failures and errors sent inside the stream) and
  ``retryable`` is true for 408, 409, 429, 5xx, timeouts and connection failures.
  The base URL is shown with its password masked, and a connection failure names the
  operating system's reason (``connection failed: Connection refused``), which the HTTP
  stack hides behind its own words ("All connection attempts failed").
  Retries cover the request until the response starts: a stream that breaks
  off mid-turn is not retried, the deltas already yielded stay yielded and the
  error follows them.
- A server that rejects ``stream_options`` with a 400 naming it (some
  OpenAI-compatible servers do) is asked once more without it; the instance
  remembers that and stops sending it. Such a server reports no usage.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

from treellm.errors import require_extra

require_extra("OpenAICompatibleModel", "openai", "openai")

import openai
from openai.types.chat import (
    ChatCompletionChunk,
    ChatCompletionMessageParam,
    ChatCompletionToolUnionParam,
)

from treellm.errors import ModelError
from treellm.models.base import (
    ModelDelta,
    ModelRequest,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageDelta,
)
from treellm.urls import display_url

__all__ = ["OpenAICompatibleModel"]

logger = logging.getLogger(__name__)

_NO_API_KEY = "not-needed"
_RETRYABLE_STATUSES = frozenset({408, 409, 429})


class OpenAICompatibleModel:
    """A chat model behind an OpenAI-compatible Chat Completions endpoint.

    ``base_url`` includes the API prefix (``https://api.openai.com/v1``,
    ``http://localhost:11434/v1``). ``api_key=None`` sends a placeholder key, as
    local servers need none. ``extra_body`` is merged into every request body
    (server-specific options such as vLLM's ``top_k``).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        max_retries: int = 3,
        temperature: float | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        self._base_url = base_url
        self._model = model
        self._api_key = api_key if api_key is not None else _NO_API_KEY
        self._timeout = timeout
        self._max_retries = max_retries
        self._temperature = temperature
        self._extra_body = dict(extra_body) if extra_body else None
        self._send_stream_options = True

    @property
    def model_name(self) -> str:
        return self._model

    def __repr__(self) -> str:
        return f"OpenAICompatibleModel(base_url={self._base_url!r}, model={self._model!r})"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        async with self._client() as client:
            chunks = await self._open(client, request)
            async with chunks:
                try:
                    async for chunk in chunks:
                        for delta in chunk_deltas(chunk):
                            yield delta
                except openai.OpenAIError as exc:
                    raise self._model_error(exc) from exc
                except json.JSONDecodeError as exc:
                    raise ModelError(f"{self._where()}: the server sent a malformed stream chunk: {exc}") from exc

    def _client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self._base_url,
            api_key=self._api_key,
            timeout=self._timeout,
            max_retries=self._max_retries,
        )

    async def _open(self, client: openai.AsyncOpenAI, request: ModelRequest) -> openai.AsyncStream[ChatCompletionChunk]:
        try:
            try:
                return await self._create(client, request)
            except openai.BadRequestError as exc:
                if not (self._send_stream_options and _rejects_stream_options(exc)):
                    raise
                self._send_stream_options = False
                logger.info("%s rejected stream_options; asking again without it", self._where())
                return await self._create(client, request)
        except openai.OpenAIError as exc:
            raise self._model_error(exc) from exc

    async def _create(
        self, client: openai.AsyncOpenAI, request: ModelRequest
    ) -> openai.AsyncStream[ChatCompletionChunk]:
        tools = [tool.to_openai() for tool in request.tools]
        return await client.chat.completions.create(
            model=self._model,
            messages=cast("list[ChatCompletionMessageParam]", list(request.messages)),
            tools=cast("list[ChatCompletionToolUnionParam]", tools) if tools else openai.omit,
            stream=True,
            stream_options={"include_usage": True} if self._send_stream_options else openai.omit,
            temperature=self._temperature if self._temperature is not None else openai.omit,
            extra_body=self._extra_body,
        )

    def _where(self) -> str:
        return f"model {self._model!r} at {display_url(self._base_url)}"

    def _model_error(self, exc: openai.OpenAIError) -> ModelError:
        return model_error(exc, where=self._where(), timeout=self._timeout)


def chunk_deltas(chunk: ChatCompletionChunk) -> list[ModelDelta]:
    """The deltas one streamed chunk carries: text, tool-call fragments, then usage."""
    deltas: list[ModelDelta] = []
    if chunk.choices:
        delta = chunk.choices[0].delta
        if delta.content:
            deltas.append(TextDelta(delta.content))
        for call in delta.tool_calls or ():
            # Servers that send whole calls omit ``index`` although the schema requires it.
            index: int | None = getattr(call, "index", None)
            function = call.function
            deltas.append(
                ToolCallDelta(
                    index=index,
                    id=call.id or None,
                    name=(function.name or None) if function is not None else None,
                    arguments=(function.arguments or "") if function is not None else "",
                )
            )
    if chunk.usage is not None:
        usage = Usage(chunk.usage.prompt_tokens or 0, chunk.usage.completion_tokens or 0)
        deltas.append(UsageDelta(usage))
    return deltas


def model_error(exc: openai.OpenAIError, *, where: str, timeout: float) -> ModelError:
    """Translate an SDK error into a :class:`ModelError` (the caller raises it ``from exc``)."""
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        retryable = status in _RETRYABLE_STATUSES or status >= 500
        message = f"{where}: HTTP {status}: {_server_message(exc)}{_retries_note(exc)}"
        return ModelError(message, status=status, retryable=retryable)
    if isinstance(exc, openai.APITimeoutError):
        return ModelError(f"{where}: timed out after {timeout:g}s{_retries_note(exc)}", retryable=True)
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        reason = _os_reason(exc)
        if reason is not None:
            detail = f": {reason}{f' ({type(cause).__name__}: {cause})' if cause is not None else ''}"
        return ModelError(f"{where}: connection failed{detail}{_retries_note(exc)}", retryable=True)
    if isinstance(exc, openai.APIError):
        return ModelError(f"{where}: the server reported an error: {_server_message(exc)}")
    return ModelError(f"{where}: {type(exc).__name__}: {exc}")


def _os_reason(exc: BaseException) -> str | None:
    """The operating system's words for the innermost OS error behind ``exc`` ("Connection
    refused", "Name or service not known"), which the HTTP stack wraps in its own message
    ("All connection attempts failed"); None when the chain holds none."""
    reason = None
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, socket.gaierror) and current.strerror:
            reason = current.strerror
        elif isinstance(current, OSError) and isinstance(current.errno, int) and current.errno > 0:
            reason = os.strerror(current.errno)
        current = current.__cause__ or current.__context__
    return reason


def _retries_note(exc: openai.APIError) -> str:
    """How many retries the SDK spent before giving up (it stamps each request with the count)."""
    taken = exc.request.headers.get("x-stainless-retry-count", "0")
    return f" (gave up after {taken} retries)" if taken.isdigit() and int(taken) > 0 else ""


def _server_message(exc: openai.APIError) -> str:
    """The server's own error message (``{"error": {"message": ...}}``), else the SDK's."""
    body = exc.body
    if isinstance(body, Mapping):
        message = body.get("message")
        if isinstance(message, str) and message:
            return message
    elif isinstance(body, str) and body:
        return body
    return exc.message


def _rejects_stream_options(exc: openai.BadRequestError) -> bool:
    return "stream_options" in _server_message(exc).lower()
