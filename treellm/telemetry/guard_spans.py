"""``GuardSpans``: a LoopGuard's telemetry, in the framework's trace or in spans of its own.

An agent on another framework is usually traced already: its instrumentor makes a
span per tool call (and per model call, per agent step). If the guard made its own
``invoke_agent`` run and ``execute_tool`` spans too, every call would be stored twice
and every conversation would be two runs in two traces. So the guard's span mode
(``LoopGuard(spans=...)``) decides, per call, where its facts go:

- ``"annotate"``: the guard makes no span at all. It writes on the span current when
  :meth:`~treellm.LoopGuard.check` or :meth:`~treellm.LoopGuard.record` runs (the
  instrumentor's): when that span is a tool span (``execute_tool``, OpenInference
  ``TOOL``, Traceloop ``tool``, as :func:`treellm.telemetry.conventions.read_span`
  reads it), ``treellm.tool.signature``, ``.ordinal``, ``.limit``, ``.limit_source``
  (``.shadow_caught`` when true) and ``gen_ai.tool.call.id`` when the call id is known
  and the span has none; a caught call's ``loop:detected`` event (the executor's
  attributes) on whatever span is current, tool span or not (the store maps it to its
  run). No current span: nothing is traced (the metrics still count).
- ``"own"``: spans of its own, as the executor makes them: an ``invoke_agent`` run
  span per conversation, parented on the context current when it opens (a remote or
  unsampled parent included), an ``execute_tool`` span per recorded call under it, a
  ``loop:detected`` event on the run span per catch.
- ``"auto"`` (the default): ``annotate`` for a call made while a span is current
  (``trace.get_current_span()`` is recording and has a valid context), ``own``
  otherwise. A conversation's run span opens only when a call first needs a span of
  its own, so a conversation traced wholly by its framework never gets a run span or
  a second trace: each call is counted once.

Metrics (``treellm.tool.calls``, ``treellm.tool.duration``,
``treellm.loop.detections``) count every call in every mode.

Contract: called synchronously on the guard's caller's thread (so "current" is the
caller's span), in event order, possibly from several threads (a lock guards the
per-run state). Never raises: a failure is a telemetry failure, logged and counted
in ``failures``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

from opentelemetry import metrics, trace
from opentelemetry.trace import Span, SpanContext
from opentelemetry.util.types import AttributeValue

from treellm.engine.events import (
    Event,
    LoopDetected,
    RunComplete,
    RunStart,
    ToolComplete,
    ToolError,
    ToolStart,
)
from treellm.errors import ConfigError
from treellm.telemetry import conventions as conv
from treellm.telemetry import semconv as sc
from treellm.telemetry.observer import TelemetryObserver, loop_attributes
from treellm.telemetry.redaction import Capture, CaptureMode

__all__ = ["SPAN_MODES", "GuardSpans", "SpanMode", "current_span", "is_tool_span", "span_mode", "tool_attributes"]

logger = logging.getLogger(__name__)

SpanMode = Literal["auto", "own", "annotate"]
SPAN_MODES: tuple[SpanMode, ...] = get_args(SpanMode)

Attributes = dict[str, AttributeValue]

_ROLE_KEYS = (conv.OPERATION, conv.OPENINFERENCE_KIND, conv.TRACELOOP_KIND)


def span_mode(value: object) -> SpanMode:
    """``value`` as a span mode; anything else is a ``ConfigError``."""
    for mode in SPAN_MODES:
        if value == mode:
            return mode
    raise ConfigError(f"spans: expected auto, own or annotate, got {value!r}", setting="spans")


def current_span() -> Span | None:
    """The caller's current span when it is recording and has a valid context, else None."""
    span = trace.get_current_span()
    return span if span.is_recording() and span.get_span_context().is_valid else None


def _attributes(span: Span) -> Mapping[str, object]:
    found = getattr(span, "attributes", None)  # the SDK's spans are readable; the API's are not
    return found if isinstance(found, Mapping) else {}


def is_tool_span(span: Span) -> bool:
    """True when ``span`` is a tool call's span by any instrumentation's conventions."""
    attributes = _attributes(span)
    roles = {key: str(attributes[key]) for key in _ROLE_KEYS if key in attributes}
    name = getattr(span, "name", "")
    return conv.read_span(name if isinstance(name, str) else "", roles).role == "tool"


def tool_attributes(start: ToolStart) -> Attributes:
    """The guard's facts about a call, for the framework's tool span (no call id: see GuardSpans)."""
    attrs: Attributes = {
        sc.TOOL_SIGNATURE: start.signature,
        sc.TOOL_ORDINAL: start.ordinal,
        sc.TOOL_LIMIT: start.limit,
        sc.TOOL_LIMIT_SOURCE: start.limit_source,
    }
    if start.shadow_caught:
        attrs[sc.TOOL_SHADOW_CAUGHT] = True
    return attrs


@dataclass(slots=True)
class _Run:
    start: Event
    """The run's ``run:start``, handed to the own-span observer when the run first needs a span."""
    opened: bool = False
    own: set[str] = field(default_factory=set)
    """Node ids traced by spans of our own."""
    contexts: dict[str, SpanContext] = field(default_factory=dict)
    """The framework tool spans that were annotated, by node id (for earlier span ids)."""

    def span_id(self, node_id: str) -> str:
        context = self.contexts.get(node_id)
        return format(context.span_id, "016x") if context is not None else ""


class GuardSpans:
    """The LoopGuard's telemetry observer (see the module docstring)."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        *,
        mode: SpanMode = "auto",
        capture: Capture | CaptureMode | None = None,
    ) -> None:
        self.mode = span_mode(mode)
        self.own = TelemetryObserver(tracer_provider, meter_provider, capture=capture)
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()
        self.failures = 0

    @property
    def capture(self) -> Capture:
        return self.own.capture

    def _target(self) -> Span | None:
        """The span to write on instead of making spans (None: make our own, unless annotating)."""
        return None if self.mode == "own" else current_span()

    def _spans_of_our_own(self) -> bool:
        return self.mode != "annotate"

    # -- the guard's calls ----------------------------------------------------------------------

    def checked(self, run_id: str, node_id: str, start: ToolStart, call_id: str | None) -> None:
        """An allowed call, at ``check()`` time: annotate the current tool span, if any."""
        try:
            with self._lock:
                run = self._runs.get(run_id)
                span = self._target()
                if run is not None and span is not None and is_tool_span(span):
                    self._annotate(run, span, node_id, start, call_id)
        except Exception:  # a telemetry failure must never stop the agent
            self.failures += 1
            logger.exception("guard telemetry failed on a check (run %s)", run_id)

    def __call__(self, event: Event) -> None:
        try:
            with self._lock:
                self._handle(event)
        except Exception:  # a telemetry failure must never stop the agent
            self.failures += 1
            logger.exception("guard telemetry failed on %s (run %s)", event.type, event.run_id)

    # -- events ------------------------------------------------------------------------------------

    def _handle(self, event: Event) -> None:
        p = event.payload
        if isinstance(p, RunStart):
            started = self._runs[event.run_id] = _Run(event)
            if self.mode == "own":
                self._open(started)
            return
        run = self._runs.get(event.run_id)
        if run is None:
            return
        if isinstance(p, ToolStart):
            self._tool_start(run, event, p)
        elif isinstance(p, ToolComplete | ToolError):
            if event.node_id in run.own:
                self.own(event)
            else:
                self.own.count_call(p, failed=isinstance(p, ToolError))
        elif isinstance(p, LoopDetected):
            self._loop_detected(run, event, p)
        elif isinstance(p, RunComplete):
            del self._runs[event.run_id]
            if run.opened:
                self.own(event)
        elif run.opened:
            self.own(event)

    def _open(self, run: _Run) -> None:
        if not run.opened:
            run.opened = True
            self.own(run.start)

    def _tool_start(self, run: _Run, event: Event, p: ToolStart) -> None:
        span = self._target()
        if span is not None:
            if is_tool_span(span):
                # the guard passes the node id as the call id when it knows no call id
                call_id = p.call_id if p.call_id and p.call_id != event.node_id else None
                self._annotate(run, span, event.node_id or "", p, call_id)
        elif self._spans_of_our_own():
            self._open(run)
            run.own.add(event.node_id or "")
            self.own(event)

    def _annotate(self, run: _Run, span: Span, node_id: str, start: ToolStart, call_id: str | None) -> None:
        attrs = tool_attributes(start)
        if call_id is not None and sc.GEN_AI_TOOL_CALL_ID not in _attributes(span):
            attrs[sc.GEN_AI_TOOL_CALL_ID] = call_id
        span.set_attributes(attrs)
        if node_id:
            run.contexts[node_id] = span.get_span_context()

    def _loop_detected(self, run: _Run, event: Event, p: LoopDetected) -> None:
        span = self._target()
        if span is not None:
            ids = [run.span_id(i) for i in p.call.earlier_node_ids]
            span.add_event(sc.EVENT_LOOP_DETECTED, loop_attributes(p.call, ids, self.capture), timestamp=event.time_ns)
            self.own.count_loop(p.call)
        elif self._spans_of_our_own():
            self._open(run)
            self.own(event)
        else:
            self.own.count_loop(p.call)
