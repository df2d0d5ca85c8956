"""``ScriptedModel``: the fake that ships beside the ``ChatModel`` seam.

It answers from a responder ``(ModelRequest) -> ModelTurn`` or from a list of
turns consumed in request order, and streams each turn the way a provider does
(text, then indexed tool-call fragments, then usage). Every request is kept in
``requests`` so tests can check what the model was shown. Running out of turns
raises :class:`~treellm.errors.ScriptExhaustedError`: a bug in the script, never
data. Safe within one event loop (requests are taken in the order they arrive).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence

from treellm.errors import ScriptExhaustedError
from treellm.models.base import (
    ModelDelta,
    ModelRequest,
    ModelTurn,
    TextDelta,
    ToolCallDelta,
    UsageDelta,
    arguments_text,
)

__all__ = ["Responder", "ScriptedModel"]

Responder = Callable[[ModelRequest], ModelTurn]


class ScriptedModel:
    """A chat model driven by a script instead of a paid LLM."""

    def __init__(
        self,
        script: Responder | Sequence[ModelTurn],
        *,
        model_name: str = "scripted",
        chunk_size: int = 0,
    ) -> None:
        """``chunk_size > 0`` splits text and argument strings into pieces of that size."""
        self._responder: Responder | None = script if callable(script) else None
        self._turns: list[ModelTurn] = [] if callable(script) else list(script)
        self._model_name = model_name
        self._chunk_size = chunk_size
        self.requests: list[ModelRequest] = []

    @property
    def model_name(self) -> str:
        return self._model_name

    def _next_turn(self, request: ModelRequest) -> ModelTurn:
        self.requests.append(request)
        if self._responder is not None:
            return self._responder(request)
        index = len(self.requests) - 1
        if index >= len(self._turns):
            raise ScriptExhaustedError(
                f"ScriptedModel ran out of turns: request {index + 1} (node {request.node_id}, "
                f"purpose {request.purpose}) but the script holds {len(self._turns)}",
                requests=index + 1,
            )
        return self._turns[index]

    def _pieces(self, text: str) -> list[str]:
        if self._chunk_size <= 0 or not text:
            return [text]
        return [text[i : i + self._chunk_size] for i in range(0, len(text), self._chunk_size)]

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        turn = self._next_turn(request)
        if turn.text:
            for piece in self._pieces(turn.text):
                yield TextDelta(piece)
        for index, call in enumerate(turn.tool_calls):
            pieces = self._pieces(arguments_text(call.arguments))
            yield ToolCallDelta(index=index, id=call.id, name=call.name, arguments=pieces[0])
            for piece in pieces[1:]:
                yield ToolCallDelta(index=index, arguments=piece)
        if turn.usage is not None:
            yield UsageDelta(turn.usage)
