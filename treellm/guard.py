"""``LoopGuard``: treellm's loop detection for agents built on other frameworks.

Call :meth:`LoopGuard.check` before a tool call and :meth:`LoopGuard.record`
after it. The guard keeps one path per conversation (``path=`` names it; one
default conversation otherwise), so a hand-written loop, a LangGraph node or an
OpenAI Agents SDK hook gets the same path-local counting, limits, actions and
events as the tree executor; observers (telemetry among them) see a run per
conversation with one ToolNode per recorded call and a ``loop:detected`` event
per catch. :meth:`LoopGuard.end` closes a conversation's run.

Counting, limit precedence, state changes, the failure rule and the texts of a
catch come from ``treellm.engine.repeats``, the module the executor uses, so a
guarded agent and a tree count, fail and answer alike. Per-tool rules come from
``rules=`` (``ToolRule``) and ``mutates=``, overridden by a limits file.

Thread-safe: a lock guards the conversations, so handlers on worker threads may
share one guard. Observers are called on the calling thread.
"""

from __future__ import annotations

import dataclasses
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
from treellm.engine.nodes import NodeStatus, ToolNode
from treellm.engine.repeats import RepeatPolicy, ToolRule, ToolSettings, answer_text, pruned_call
from treellm.engine.tools import result_hash, result_text
from treellm.loop import CallKey, LimitSource, PathSignatures, call_key
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
        rules: Mapping[str, ToolRule] | None = None,
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
        """``limits`` are per-tool limits (like a tool's own ``max_repeats``),
        ``on_repeat`` one action or one per tool, ``rules`` per-tool state-change
        and failure rules (``mutates=["edit"]`` is short for
        ``rules={"edit": ToolRule(mutates=True)}``); a ``config`` read from a
        limits file overrides them all, as everywhere."""
        base = config or TreeConfig()
        if max_repeats is not None:
            base = base.replace(max_repeats_per_signature=max_repeats)
        if shadow is not None:
            base = base.replace(shadow=shadow)
        self.config = base
        self.policy = _policy(base, limits or {}, on_repeat, rules or {}, frozenset(mutates))
        self.detector = self.policy.detector
        self.name = name
        self.model = model
        self.observers: list[Observer] = list(observers)
        if telemetry:
            self.observers.insert(0, TelemetryObserver(tracer_provider, meter_provider))
        self.clock = clock
        self.run_ids = run_ids
        self._lock = threading.Lock()
        self._conversations: dict[Hashable, _Conversation] = {}

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
            decision = self.policy.check(conv.path, key)
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
            action = self.policy.action(tool)
            shadow = self.config.shadow
            previous = conv.results.get(earlier[-1], "") if earlier else ""
            answer = (
                None
                if shadow
                else answer_text(action, tool=tool, count=decision.count, limit=decision.limit, earlier_result=previous)
            )
            pruned = pruned_call(
                decision,
                call_id="",
                raw_arguments=_raw(arguments),
                arguments=parse_arguments(arguments),
                action=action,
                shadow=shadow,
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

        A failed call (``error=True``: it raised or its status is an error; or
        its result text matches the tool's ``error_when``) counts on the path
        but never changes state. A successful call that changes state (the
        tool's rule) restarts the counts of every other call on the path.
        """
        key: CallKey = call_key(tool, arguments)
        text = result_text(result)
        raw = _raw(arguments)
        error = self.policy.is_failure(tool, text, status_error=error)
        state_change = self.policy.state_change(tool, arguments, failed=error)
        with self._lock:
            conv = self._conversation(path)
            decision = self.policy.check(conv.path, key)
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
            conv.path = conv.path.extend(key, node_id, mutates=state_change)
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


def _policy(
    config: TreeConfig,
    limits: Mapping[str, int],
    on_repeat: RepeatAction | Mapping[str, RepeatAction],
    rules: Mapping[str, ToolRule],
    mutates: frozenset[str],
) -> RepeatPolicy:
    """The guard's arguments as the tools' own settings (a limits file in ``config`` wins)."""
    actions: Mapping[str, RepeatAction] = {} if isinstance(on_repeat, str) else on_repeat
    settings: dict[str, ToolSettings] = {}
    for tool in {*limits, *actions, *rules, *mutates}:
        rule = rules.get(tool)
        if tool in mutates:
            rule = dataclasses.replace(rule, mutates=True) if rule is not None else ToolRule(mutates=True)
        settings[tool] = ToolSettings(limits.get(tool), actions.get(tool), rule)
    return RepeatPolicy(config, settings, default_action=on_repeat if isinstance(on_repeat, str) else "prune")


def _raw(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments
    if isinstance(arguments, Mapping):
        return arguments_text(arguments)
    return str(arguments)
