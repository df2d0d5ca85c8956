"""``LoopGuard``: treellm's loop detection for agents built on other frameworks.

Call :meth:`LoopGuard.check` before a tool call and :meth:`LoopGuard.record`
after it. The guard keeps one path per conversation (``path=`` names it; one
default conversation otherwise), so a hand-written loop, a LangGraph node or an
OpenAI Agents SDK hook gets the same path-local counting, limits, actions and
events as the tree executor; observers (telemetry among them) see a run per
conversation with one ToolNode per recorded call and a ``loop:detected`` event
per catch. :meth:`LoopGuard.end` closes a conversation's run.

Thread-safe: a lock guards the conversations, so handlers on worker threads may
share one guard. Observers are called on the calling thread.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from treellm.config import RepeatAction, TreeConfig
from treellm.engine.events import (
    EVENT_TYPES,
    Event,
    LoopDetected,
    Observer,
    Outcome,
    Payload,
    RunComplete,
    RunStart,
    RunStats,
    ToolComplete,
    ToolError,
    ToolStart,
    notify,
)
from treellm.engine.nodes import NodeStatus, PrunedCall, ToolNode
from treellm.engine.tools import result_hash, result_text
from treellm.loop import CallKey, LimitSource, LoopDetector, PathSignatures, call_key
from treellm.models.base import arguments_text
from treellm.signature import parse_arguments
from treellm.telemetry.observer import TelemetryObserver

__all__ = ["GuardDecision", "LoopGuard"]


@dataclass(frozen=True, slots=True)
class GuardDecision:
    """What to do with a call: run it (``allowed``) or answer it without running.

    When not allowed, ``answer`` is the tool result to give the model for
    ``nudge`` and ``cache`` (None for ``prune``: drop the call, end the turn).
    """

    allowed: bool
    tool: str
    signature: str
    count: int
    limit: int
    limit_source: LimitSource
    action: RepeatAction | None
    shadow: bool
    earlier_node_ids: tuple[str, ...]
    answer: str | None = None

    @property
    def ordinal(self) -> int:
        return self.count + 1


@dataclass(slots=True)
class _Conversation:
    run_id: str
    path: PathSignatures = field(default_factory=PathSignatures.empty)
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    results: dict[str, str] = field(default_factory=dict)
    tool_nodes: int = 0
    loops: int = 0
    pruned: int = 0


class LoopGuard:
    """Path-local loop detection around any agent loop (see the module docstring)."""

    def __init__(
        self,
        limits: Mapping[str, int] | None = None,
        on_repeat: RepeatAction | Mapping[str, RepeatAction] = "prune",
        *,
        max_repeats: int | None = None,
        mutates: Iterable[str] = (),
        config: TreeConfig | None = None,
        shadow: bool | None = None,
        observers: Sequence[Observer] = (),
        telemetry: bool = True,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        name: str = "agent",
        model: str = "",
        clock: Callable[[], int] = time.time_ns,
        run_ids: Callable[[], str] = lambda: uuid.uuid4().hex,
    ) -> None:
        """``limits`` are per-tool limits (like a tool's own ``max_repeats``); a
        ``config`` read from a limits file overrides them, as everywhere."""
        base = config or TreeConfig()
        if max_repeats is not None:
            base = base.replace(max_repeats_per_signature=max_repeats)
        if shadow is not None:
            base = base.replace(shadow=shadow)
        self.config = base
        self.detector = LoopDetector(base.max_repeats_per_signature, file_limits=base.file_limits)
        self.limits = dict(limits or {})
        self.on_repeat = on_repeat
        self.mutating = frozenset(mutates)
        self.name = name
        self.model = model
        self.observers: list[Observer] = list(observers)
        if telemetry:
            self.observers.insert(0, TelemetryObserver(tracer_provider, meter_provider))
        self.clock = clock
        self.run_ids = run_ids
        self._lock = threading.Lock()
        self._conversations: dict[Hashable, _Conversation] = {}

    # -- settings per tool (limits file > guard arguments > defaults) -------------------

    def _action(self, tool: str) -> RepeatAction:
        filed = self.config.tool_limits.get(tool)
        if filed is not None and filed.on_repeat is not None:
            return filed.on_repeat
        if isinstance(self.on_repeat, str):
            return self.on_repeat
        return self.on_repeat.get(tool, "prune")

    def _mutates(self, tool: str) -> bool:
        filed = self.config.tool_limits.get(tool)
        if filed is not None and filed.mutates is not None:
            return filed.mutates
        return tool in self.mutating

    # -- events ---------------------------------------------------------------------------

    def _emit(
        self, conv: _Conversation, payload: Payload, node: ToolNode | None = None, time_ns: int | None = None
    ) -> None:
        event = Event(
            EVENT_TYPES[type(payload)],
            conv.run_id,
            node.id if node else None,
            None,
            0,
            (),
            self.clock() if time_ns is None else time_ns,
            payload,
        )
        notify(self.observers, event)

    def _conversation(self, path: Hashable) -> _Conversation:
        conv = self._conversations.get(path)
        if conv is None:
            conv = _Conversation(self.run_ids())
            self._conversations[path] = conv
            self._emit(
                conv,
                RunStart(str(path) if path is not None else "", self.name, self.model, self.config, True),
            )
        return conv

    # -- the API ----------------------------------------------------------------------------

    def check(self, tool: str, arguments: Any, path: Hashable = None) -> GuardDecision:
        """Decide before a call; a caught call emits ``loop:detected``."""
        key = call_key(tool, arguments)
        with self._lock:
            conv = self._conversation(path)
            decision = self.detector.check_key(conv.path, key, self.limits.get(tool))
            earlier = tuple(i for i in decision.earlier_node_ids if i is not None)
            if not decision.caught:
                return GuardDecision(
                    True,
                    tool,
                    decision.signature,
                    decision.count,
                    decision.limit,
                    decision.limit_source,
                    None,
                    False,
                    earlier,
                )
            action = self._action(tool)
            shadow = self.config.shadow
            answer = (
                None
                if shadow
                else self._answer(conv, action, tool, count=decision.count, limit=decision.limit, earlier=earlier)
            )
            pruned = PrunedCall(
                tool=tool,
                call_id="",
                raw_arguments=_raw(arguments),
                arguments=parse_arguments(arguments),
                signature=decision.signature,
                count=decision.count,
                limit=decision.limit,
                limit_source=decision.limit_source,
                action=action,
                shadow=shadow,
                earlier_node_ids=earlier,
                answer=answer,
            )
            conv.loops += 1
            conv.pruned += 0 if shadow else 1
            self._emit(conv, LoopDetected(pruned))
            return GuardDecision(
                shadow,
                tool,
                decision.signature,
                decision.count,
                decision.limit,
                decision.limit_source,
                action,
                shadow,
                earlier,
                answer,
            )

    def _answer(
        self,
        conv: _Conversation,
        action: RepeatAction,
        tool: str,
        *,
        count: int,
        limit: int,
        earlier: tuple[str, ...],
    ) -> str | None:
        if action == "prune":
            return None
        previous = conv.results.get(earlier[-1], "") if earlier else ""
        if action == "cache":
            return previous
        times = "once" if count == 1 else f"{count} times"
        return (
            f"[treellm] {tool} was already called {times} with these exact arguments, so it was not run "
            f"again (limit {limit}). Earlier result:\n{previous}"
        )

    def record(
        self,
        tool: str,
        arguments: Any,
        result: Any,
        path: Hashable = None,
        *,
        error: bool = False,
        started_ns: int | None = None,
    ) -> str:
        """Record a call that ran (after :meth:`check` allowed it); returns its node id.

        ``error=True`` marks a failed call: it counts on the path, and does not
        restart other tools' counts even when the tool ``mutates``.
        """
        key: CallKey = call_key(tool, arguments)
        text = result_text(result)
        raw = _raw(arguments)
        with self._lock:
            conv = self._conversation(path)
            decision = self.detector.check_key(conv.path, key, self.limits.get(tool))
            node_id = f"n{next(conv.ids)}"
            now = self.clock()
            node = ToolNode(
                id=node_id,
                parent_id=None,
                depth=0,
                status=NodeStatus.FAILED if error else NodeStatus.COMPLETED,
                started_ns=started_ns if started_ns is not None else now,
                ended_ns=now,
                tool_name=tool,
                call_id=node_id,
                args=parse_arguments(arguments),
                raw_args=raw,
                signature=decision.signature,
                ordinal=decision.ordinal,
                limit=decision.limit,
                limit_source=decision.limit_source,
                result=text,
                result_hash=result_hash(text),
                attempts=1,
                shadow_caught=decision.caught,
                error=text if error else None,
            )
            conv.path = conv.path.extend(key, node_id, mutates=self._mutates(tool) and not error)
            conv.results[node_id] = text
            conv.tool_nodes += 1
            self._emit(
                conv,
                ToolStart(
                    tool,
                    node_id,
                    node.args,
                    raw,
                    decision.signature,
                    decision.ordinal,
                    decision.limit,
                    decision.limit_source,
                    decision.caught,
                    tuple(i for i in decision.earlier_node_ids if i is not None),
                ),
                node,
            )
            duration = now - (node.started_ns or now)
            if error:
                self._emit(conv, ToolError(tool, text, text, node.result_hash or "", 1, duration), node)
            else:
                self._emit(conv, ToolComplete(tool, text, node.result_hash or "", 1, duration), node)
            return node_id

    def end(self, path: Hashable = None, outcome: Outcome = "completed", answer: str | None = None) -> None:
        """Close a conversation: its run completes and its path is forgotten."""
        with self._lock:
            conv = self._conversations.pop(path, None)
            if conv is None:
                return
            stats = RunStats(
                nodes=conv.tool_nodes,
                tool_nodes=conv.tool_nodes,
                loops_detected=conv.loops,
                pruned=conv.pruned,
            )
            self._emit(conv, RunComplete(outcome, answer, stats))

    def close(self) -> None:
        """End every open conversation."""
        for path in list(self._conversations):
            self.end(path)

    def count(self, tool: str, arguments: Any, path: Hashable = None) -> int:
        """How many identical calls count on the conversation's path now."""
        with self._lock:
            conv = self._conversations.get(path)
            return conv.path.count(call_key(tool, arguments)) if conv else 0


def _raw(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments
    if isinstance(arguments, Mapping):
        return arguments_text(arguments)
    return str(arguments)
