"""``LoopGuard``: treellm's loop detection for agents built on other frameworks.

Call :meth:`LoopGuard.check` before a tool call and :meth:`LoopGuard.record`
after it. The guard keeps one path per conversation (``path=`` names it; one
default conversation otherwise), so a hand-written loop, a LangGraph node or an
OpenAI Agents SDK hook gets the same path-local counting, limits, actions and
events as the tree executor; observers see a run per conversation with one
ToolNode per recorded call and a ``loop:detected`` event per catch.
:meth:`LoopGuard.end` closes a conversation's run.

Counting, limit precedence, state changes, the failure rule and the texts of a
catch come from ``treellm.engine.repeats``, the module the executor uses, so a
guarded agent and a tree count, fail and answer alike. Per-tool rules come from
``rules=`` (``ToolRule``) and ``mutates=``, overridden by a limits file.

**In-flight calls.** Frameworks run a turn's calls concurrently (the OpenAI
Agents SDK checks them all before any has run), so an allowed :meth:`check`
*reserves* the call: until :meth:`record` or :meth:`release` it counts on its
path like a recorded call (the executor's same-turn rule: count = earlier
identical calls on the path + those accepted and still running). A reservation
gets the call's node id and its check time (the start of its span). It ends:

- with :meth:`record`: the reservation with the given ``call_id``, else the
  oldest one of the same call (tool and canonical arguments) on that path; a
  call recorded without a reservation (record-only use) counts from then on;
- with :meth:`release`: the call never ran, and counts as if never checked;
- with :meth:`end` (or :meth:`close`): every reservation still open on the path
  is dropped, so a call that was neither recorded nor released cannot leak.

A reservation still running when a state change is recorded keeps counting: it
lands on the path when it is recorded, after the change.

**Spans: one trace, each call counted once** (``spans=``; see
``treellm.telemetry.guard_spans``). ``"auto"`` (the default) decides per call:
with an OpenTelemetry span current at ``check()``/``record()`` time (recording,
valid context) the guard makes *no* span of its own and never a run span; it
writes its facts on that span: on a tool span (``execute_tool``, OpenInference
TOOL, Traceloop tool) the call's ``treellm.tool.signature``, ``.ordinal``,
``.limit``, ``.limit_source`` and ``gen_ai.tool.call.id`` when the call id is
known; a caught call's ``loop:detected`` event on whatever span is current. So an
adapter that checks inside the instrumented tool call annotates the tool span at
check time; one that checks in the framework's step or model span annotates the
tool span at record time if the tool span is current then, and otherwise adds
only the catches (the store recomputes ordinals of foreign calls anyway). With no
span current, the guard makes its own spans as the executor does: an
``invoke_agent`` run span per conversation (opened when a call first needs it,
parented on the context current then) and an ``execute_tool`` span per recorded
call. ``"own"`` always makes its own spans; ``"annotate"`` never does (with no
current span, only metrics).

Thread- and asyncio-safe: one ``threading.Lock`` guards the conversations and
nothing awaits while holding it, so handlers on worker threads and coroutines
of one event loop (``asyncio.gather``) may share one guard. Observers are called
on the calling thread, inside that lock: an observer must not call the guard.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

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
from treellm.engine.repeats import (
    RepeatPolicy,
    ToolRule,
    ToolSettings,
    answer_text,
    oversized_arguments,
    pruned_call,
)
from treellm.engine.tools import result_hash, result_text
from treellm.loop import CallKey, LimitSource, LoopDecision, Paths, PathSignatures, call_key
from treellm.models.base import arguments_text
from treellm.signature import parse_arguments
from treellm.telemetry.guard_spans import GuardSpans, SpanMode, span_mode

__all__ = ["GuardDecision", "LoopGuard"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GuardDecision:
    """What to do with a call: run it (``allowed``) or answer it without running.

    When not allowed, ``answer`` is the tool result to give the model for
    ``nudge`` and ``cache`` (None for ``prune``: drop the call, end the turn).
    An allowed decision holds a ``reservation`` (an id unique in its guard): the
    call counts as running until :meth:`LoopGuard.record` or
    :meth:`LoopGuard.release` (``release(decision)``) ends it. ``path`` and
    ``call_id`` are the ones given to :meth:`LoopGuard.check`.
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
    path: Hashable = None
    call_id: str | None = None
    reservation: str | None = None

    @property
    def ordinal(self) -> int:
        return self.count + 1


@dataclass(frozen=True, slots=True)
class _Reservation:
    """An allowed call that has not been recorded or released yet."""

    id: str
    key: CallKey
    call_id: str | None
    node_id: str
    decision: LoopDecision
    checked_ns: int
    reads: Paths = None
    """What the call reads (``engine/repeats.py``), for the counts of calls checked while it runs."""


@dataclass(slots=True)
class _Conversation:
    run_id: str
    path: PathSignatures = field(default_factory=PathSignatures.empty)
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    results: dict[str, str] = field(default_factory=dict)
    running: list[_Reservation] = field(default_factory=list)
    """Reservations in check order."""
    tool_nodes: int = 0
    loops: int = 0
    pruned: int = 0

    def node_id(self) -> str:
        return f"n{next(self.ids)}"

    def counted(self) -> PathSignatures:
        """The path with the running calls on it: what a new call counts against."""
        return _with_running(self.path, self.running)

    def take(self, key: CallKey | None, call_id: str | None, reservation: str | None = None) -> _Reservation | None:
        """Remove and return the reservation that a record or release ends (see the module docstring)."""
        found = _match(self.running, key, call_id, reservation)
        if found is not None:
            self.running.remove(found)
        return found


def _with_running(path: PathSignatures, running: Sequence[_Reservation]) -> PathSignatures:
    for held in running:
        path = path.extend(held.key, held.node_id, reads=held.reads)
    return path


def _match(
    running: Sequence[_Reservation], key: CallKey | None, call_id: str | None, reservation: str | None
) -> _Reservation | None:
    """The reservation with this id, else this call id, else the oldest of ``key`` (one without
    another call id when ``call_id`` is given)."""
    if reservation is not None:
        return next((r for r in running if r.id == reservation), None)
    if call_id is not None:
        found = next((r for r in running if r.call_id == call_id), None)
        if found is not None:
            return found
    return next((r for r in running if r.key == key and (call_id is None or r.call_id is None)), None)


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
        spans: SpanMode = "auto",
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
        limits file overrides them all, as everywhere. ``spans`` is the span
        mode (``"auto"``, ``"own"`` or ``"annotate"``: the module docstring);
        another value raises ``ConfigError``."""
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
        self.spans = span_mode(spans)
        self.observers: list[Observer] = list(observers)
        self._telemetry: GuardSpans | None = None
        if telemetry:
            self._telemetry = GuardSpans(tracer_provider, meter_provider, mode=self.spans)
            self.observers.insert(0, self._telemetry)
        self.clock = clock
        self.run_ids = run_ids
        self._lock = threading.Lock()
        self._conversations: dict[Hashable, _Conversation] = {}
        self._reservations = itertools.count(1)

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

    def check(self, tool: str, arguments: Any, path: Hashable = None, *, call_id: str | None = None) -> GuardDecision:
        """Decide before a call; never raises on the call's data, never blocks on I/O.

        The count includes the identical calls of the path that are still running
        (allowed and neither recorded nor released). An allowed decision reserves
        the call (``decision.reservation``); end it with :meth:`record` once the call
        ran or with :meth:`release` if it never runs. A caught call emits
        ``loop:detected`` and reserves nothing, unless shadow mode lets it run.
        ``call_id`` (the framework's tool call id) pairs the later ``record``.
        """
        key = call_key(tool, arguments)
        with self._lock:
            conv = self._conversation(path)
            decision = self.policy.check(conv.counted(), key)
            earlier = tuple(i for i in decision.earlier_node_ids if i is not None)
            action: RepeatAction | None = None
            answer: str | None = None
            if decision.caught:
                action, answer = self._catch(conv, decision, arguments, call_id, earlier)
                if not self.config.shadow:
                    return GuardDecision(
                        False, tool, decision.signature, decision.count, decision.limit, decision.limit_source,
                        action, False, earlier, answer, path, call_id,
                    )  # fmt: skip
            held = self._reserve(conv, key, arguments, decision, call_id)
            return GuardDecision(
                True, tool, decision.signature, decision.count, decision.limit, decision.limit_source,
                action, decision.caught, earlier, None, path, call_id, held.id,
            )  # fmt: skip

    def _catch(
        self,
        conv: _Conversation,
        decision: LoopDecision,
        arguments: Any,
        call_id: str | None,
        earlier: tuple[str, ...],
    ) -> tuple[RepeatAction, str | None]:
        """Count and report a caught call; its action and answer (None in shadow mode)."""
        tool = decision.tool
        action = self.policy.action(tool)
        shadow = self.config.shadow
        previous = next((conv.results[i] for i in reversed(earlier) if i in conv.results), None)
        answer = (
            None
            if shadow
            else answer_text(action, tool=tool, count=decision.count, limit=decision.limit, earlier_result=previous)
        )
        pruned = pruned_call(
            decision,
            call_id=call_id or "",
            raw_arguments=self._raw(arguments),
            arguments=self._parsed(arguments),
            action=action,
            shadow=shadow,
            answer=answer,
        )
        conv.loops += 1
        conv.pruned += 0 if shadow else 1
        self._emit(conv, LoopDetected(pruned))
        return action, answer

    def _parsed(self, arguments: Any) -> Any:
        """The arguments as nodes and events carry them (a preview when over the config's limits)."""
        oversized = oversized_arguments(arguments, self.config)
        return parse_arguments(arguments) if oversized is None else oversized[1]

    def _raw(self, arguments: Any) -> str:
        oversized = oversized_arguments(arguments, self.config)
        return _raw(arguments) if oversized is None else oversized[0]

    def _reserve(
        self, conv: _Conversation, key: CallKey, arguments: Any, decision: LoopDecision, call_id: str | None
    ) -> _Reservation:
        reads = self.policy.targets(key.tool, arguments).reads
        held = _Reservation(f"r{next(self._reservations)}", key, call_id, conv.node_id(), decision, self.clock(), reads)
        conv.running.append(held)
        if self._telemetry is not None:
            self._telemetry.checked(conv.run_id, held.node_id, _tool_start(decision, call_id or "", ()), call_id)
        return held

    def record(
        self,
        tool: str,
        arguments: Any,
        result: Any,
        path: Hashable = None,
        *,
        error: bool = False,
        call_id: str | None = None,
        started_ns: int | None = None,
    ) -> str:
        """Record a call that ran; returns its node id. Never raises on the call's data.

        Ends the call's reservation: the one checked with ``call_id`` when one
        was, else the oldest reservation of the same call on ``path``. A call
        recorded without a reservation counts from now on, its ordinal counting
        the running calls too. The recorded call keeps the count, limit and node
        id that its check decided, and starts at ``started_ns`` (default: its
        check time, else now).

        A failed call (``error=True``: it raised or its status is an error; or
        its result text matches the tool's ``error_when``) counts on the path
        but never changes state. A successful call that changes state (the
        tool's rule) restarts the counts of every other call on the path.
        """
        key: CallKey = call_key(tool, arguments)
        text = result_text(result)
        raw = self._raw(arguments)
        error = self.policy.is_failure(tool, text, status_error=error)
        with self._lock:
            conv = self._conversation(path)
            held = conv.take(key, call_id)
            if held is not None and held.key == key:
                decision, node_id, checked = held.decision, held.node_id, held.checked_ns
                call_id = call_id or held.call_id
            else:  # record-only use, or the call id of another call: counts from now on
                decision, node_id, checked = self.policy.check(conv.counted(), key), conv.node_id(), None
            now = self.clock()
            start = started_ns if started_ns is not None else checked if checked is not None else now
            earlier = tuple(i for i in decision.earlier_node_ids if i is not None)
            node = ToolNode(
                id=node_id,
                parent_id=None,
                depth=0,
                status=NodeStatus.FAILED if error else NodeStatus.COMPLETED,
                started_ns=start,
                ended_ns=now,
                tool_name=tool,
                call_id=call_id or node_id,
                args=self._parsed(arguments),
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
            conv.path = self.policy.extend(conv.path, key, arguments, node_id, succeeded=not error)
            conv.results[node_id] = text
            conv.tool_nodes += 1
            self._emit_call(conv, node, _tool_start(decision, node.call_id, earlier, node.args, raw), text, error)
            return node_id

    def _emit_call(self, conv: _Conversation, node: ToolNode, start: ToolStart, text: str, failed: bool) -> None:
        self._emit(conv, start, node, node.started_ns)
        ended = node.ended_ns or self.clock()
        duration = ended - (node.started_ns or ended)
        digest = node.result_hash or ""
        if failed:
            self._emit(conv, ToolError(node.tool_name, text, text, digest, 1, duration), node, ended)
        else:
            self._emit(conv, ToolComplete(node.tool_name, text, digest, 1, duration), node, ended)

    @overload
    def release(self, decision: GuardDecision, /) -> bool: ...

    @overload
    def release(self, tool: str, /, arguments: Any, path: Hashable = None, *, call_id: str | None = None) -> bool: ...

    def release(
        self,
        target: GuardDecision | str,
        /,
        arguments: Any = None,
        path: Hashable = None,
        *,
        call_id: str | None = None,
    ) -> bool:
        """Drop the reservation of an allowed call that never ran: it counts as if never checked.

        ``release(decision)`` drops that decision's reservation; ``release(tool,
        arguments, path, call_id=...)`` the one checked with ``call_id``, else the
        oldest of that call on ``path``. True when a reservation was dropped;
        False when there was none (a caught decision, or one already recorded,
        released or ended). Emits no event: the call never happened.
        """
        with self._lock:
            if isinstance(target, GuardDecision):
                conv = self._conversations.get(target.path)
                if conv is None or target.reservation is None:
                    return False
                return conv.take(None, None, target.reservation) is not None
            conv = self._conversations.get(path)
            return conv is not None and conv.take(call_key(target, arguments), call_id) is not None

    def end(self, path: Hashable = None, outcome: Outcome = "completed", answer: str | None = None) -> None:
        """Close a conversation: its run completes, its path and its open reservations are forgotten."""
        with self._lock:
            conv = self._conversations.pop(path, None)
            if conv is None:
                return
            if conv.running:
                logger.debug("conversation %r ended with %d calls still reserved", path, len(conv.running))
            stats = RunStats(
                nodes=conv.tool_nodes,
                tool_nodes=conv.tool_nodes,
                loops_detected=conv.loops,
                pruned=conv.pruned,
            )
            self._emit(conv, RunComplete(outcome, answer, stats))

    def close(self) -> None:
        """End every open conversation."""
        with self._lock:
            paths = list(self._conversations)
        for path in paths:
            self.end(path)

    def count(self, tool: str, arguments: Any, path: Hashable = None) -> int:
        """How many identical calls count on the conversation's path now, running ones included."""
        with self._lock:
            conv = self._conversations.get(path)
            return conv.counted().count(call_key(tool, arguments)) if conv else 0


def _tool_start(
    decision: LoopDecision, call_id: str, earlier: tuple[str, ...], arguments: Any = None, raw: str = ""
) -> ToolStart:
    return ToolStart(
        decision.tool,
        call_id,
        arguments,
        raw,
        decision.signature,
        decision.ordinal,
        decision.limit,
        decision.limit_source,
        decision.caught,
        earlier,
    )


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
