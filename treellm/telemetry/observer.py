"""``TelemetryObserver``: engine and LoopGuard events -> OpenTelemetry spans, events, metrics.

Uses the OpenTelemetry API only (the SDK pipeline is ``treellm.configure``'s
job). The model (``docs/architecture.md``, telemetry):

- one root span per run, ``invoke_agent {agent}``, parented on the caller's
  current span when there is one;
- one span per node, parented *explicitly* on the node's parent span (never on
  "the current span": sibling branches run concurrently): ``chat {model}`` for a
  ThinkNode (open until its loop checks are done), ``execute_tool {tool}`` for a
  ToolNode, ``collapse`` for a CollapseNode (linked to the tool spans it merged);
  a skill's sub-tree under a nested ``invoke_agent {skill}`` span;
- a caught call is a ``loop:detected`` event on the ThinkNode span that asked
  (on the run span for a LoopGuard: ``guard_spans`` decides when it makes spans at
  all); ``tool:retry`` and ``budget:exhausted`` are span events too.

Contract: called synchronously in event order, from the run's event loop or from
LoopGuard callers' threads. On a thread that runs an event loop (the engine's), the
call only queues the event (with the caller's OpenTelemetry context, for a run span)
and returns: one worker thread per observer (``treellm-telemetry``, started on
demand, gone after a second idle) does the content capture (truncation and
redaction, :mod:`treellm.telemetry.redaction`) and all the span work, in event
order, so a big result is never redacted on the loop. ``run:complete`` waits (up to
``flush_timeout_s``) until the worker has ended the run's spans, so a run's spans are
exported when ``run()``/``arun()`` returns, as they were when all of this ran inline;
:meth:`TelemetryObserver.flush` waits the same way. Elsewhere (a LoopGuard called
from plain threads) events are handled inline, unless the worker still holds earlier
ones (order first). What ends up in spans is the same either way. A failure inside
the observer is a telemetry failure: logged, counted in ``failures``, never raised
into the agent.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from treellm._version import __version__
from treellm.engine.events import (
    BudgetExhausted,
    CollapseComplete,
    CollapseStart,
    Event,
    LoopDetected,
    RunComplete,
    RunStart,
    SkillComplete,
    SkillStart,
    TaskComplete,
    ThinkComplete,
    ThinkStart,
    ToolComplete,
    ToolError,
    ToolRetry,
    ToolStart,
)
from treellm.engine.nodes import PrunedCall
from treellm.signature import RawArguments
from treellm.telemetry import semconv as sc
from treellm.telemetry.redaction import Capture, CaptureMode, error_type, resolve_capture

__all__ = ["TelemetryObserver"]

logger = logging.getLogger(__name__)

Attributes = dict[str, AttributeValue]


@dataclass(slots=True)
class _RunSpans:
    """The open spans of one run, by node id."""

    root: Span
    run_id: str
    nodes: dict[str, Span] = field(default_factory=dict)
    """Every node's span, ended or not (an ended span still parents the node's children)."""
    stacks: dict[str, int] = field(default_factory=dict)
    """Skill-stack depth of each node, to tell a skill sub-tree from a fork continuation."""
    skills: dict[str, Span] = field(default_factory=dict)
    """Open skill spans, by the id of the ToolNode that runs the skill."""
    contexts: dict[str, SpanContext] = field(default_factory=dict)
    """The span context of every node seen (ended or not), for loop events and links."""

    def span_id(self, node_id: str) -> str:
        context = self.contexts.get(node_id)
        return format(context.span_id, "016x") if context is not None else ""


def loop_attributes(c: PrunedCall, earlier_span_ids: Sequence[str], capture: Capture) -> Attributes:
    """The attributes of a ``loop:detected`` span event (the executor's and the LoopGuard's)."""
    attrs: Attributes = {
        sc.LOOP_TOOL: c.tool, sc.LOOP_SIGNATURE: c.signature, sc.LOOP_CALL_ID: c.call_id,
        sc.LOOP_COUNT: c.count, sc.LOOP_LIMIT: c.limit, sc.LOOP_LIMIT_SOURCE: c.limit_source,
        sc.LOOP_ACTION: c.action, sc.LOOP_SHADOW: c.shadow,
        sc.LOOP_EARLIER_NODE_IDS: list(c.earlier_node_ids),
        sc.LOOP_EARLIER_SPAN_IDS: list(earlier_span_ids),
    }  # fmt: skip
    arguments = capture.arguments(c.arguments)
    if arguments is not None:
        attrs[sc.LOOP_ARGUMENTS] = arguments
    return attrs


def _on_event_loop() -> bool:
    """True on a thread that is running an asyncio event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class _Worker:
    """One daemon thread that runs submitted jobs in order.

    ``submit`` never blocks (it starts the thread when none is alive); the thread exits
    after ``IDLE_S`` without work. ``wait`` blocks the caller until a job is done. Jobs
    must not raise (the observer's job catches and counts its own failures).
    """

    IDLE_S = 1.0

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: deque[Callable[[], None]] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._submitted = 0
        self._done = 0

    def busy(self) -> bool:
        with self._cond:
            return self._done < self._submitted

    def submit(self, job: Callable[[], None]) -> int:
        """Queue ``job``; returns its ticket for :meth:`wait`."""
        with self._cond:
            if self._thread is None:
                thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                thread.start()
                self._thread = thread
            self._jobs.append(job)
            self._submitted += 1
            self._cond.notify_all()
            return self._submitted

    def wait(self, ticket: int | None, timeout_s: float) -> bool:
        """Block until job ``ticket`` (default: the last submitted) and all before it are done; False on timeout."""
        if threading.current_thread() is self._thread:
            return False  # a job waiting for itself would never return
        with self._cond:
            target = self._submitted if ticket is None else ticket
            return self._cond.wait_for(lambda: self._done >= target, timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._jobs and not self._cond.wait_for(lambda: bool(self._jobs), self.IDLE_S):
                    self._thread = None
                    return
                job = self._jobs.popleft()
            try:
                job()
            finally:
                with self._cond:
                    self._done += 1
                    self._cond.notify_all()


class TelemetryObserver:
    """Turns events into spans, span events and metrics (see the module docstring)."""

    flush_timeout_s: float = 30.0
    """How long ``run:complete`` waits for the worker to end the run's spans."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        *,
        capture: Capture | CaptureMode | None = None,
    ) -> None:
        self.capture = resolve_capture(capture)
        self._tracer = trace.get_tracer(sc.INSTRUMENTATION_NAME, __version__, tracer_provider, schema_url=sc.SCHEMA_URL)
        meter = metrics.get_meter(sc.INSTRUMENTATION_NAME, __version__, meter_provider, schema_url=sc.SCHEMA_URL)
        self._calls = meter.create_counter(sc.METRIC_TOOL_CALLS, unit="{call}", description="Tool calls executed")
        self._loops = meter.create_counter(
            sc.METRIC_LOOP_DETECTIONS,
            unit="{call}",
            description="Repeated tool calls caught by the loop check",
        )
        self._duration = meter.create_histogram(
            sc.METRIC_TOOL_DURATION, unit="s", description="Duration of tool calls, retries included"
        )
        self._runs: dict[str, _RunSpans] = {}
        self._lock = threading.Lock()
        self._worker = _Worker("treellm-telemetry")
        self.failures = 0

    def __call__(self, event: Event) -> None:
        """Handle ``event`` inline, or queue it for the worker on an event loop (see the module docstring)."""
        try:
            parent = otel_context.get_current() if isinstance(event.payload, RunStart) else None
            if not (_on_event_loop() or self._worker.busy()):
                self._process(event, parent)
                return
            ticket = self._worker.submit(lambda: self._process(event, parent))
            if isinstance(event.payload, RunComplete) and not self._worker.wait(ticket, self.flush_timeout_s):
                logger.warning("telemetry for run %s still pending after %.0f s", event.run_id, self.flush_timeout_s)
        except Exception:  # a telemetry failure must never stop the agent
            self.failures += 1
            logger.exception("telemetry observer failed on %s (run %s)", event.type, event.run_id)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every event handed over so far is in its spans; False on timeout."""
        return self._worker.wait(None, self.flush_timeout_s if timeout_s is None else timeout_s)

    def _process(self, event: Event, parent: otel_context.Context | None) -> None:
        try:
            with self._lock:
                self._handle(event, parent)
        except Exception:  # a telemetry failure must never stop the agent
            self.failures += 1
            logger.exception("telemetry observer failed on %s (run %s)", event.type, event.run_id)

    # -- dispatch ----------------------------------------------------------------------------

    def _handle(self, event: Event, parent: otel_context.Context | None = None) -> None:
        p = event.payload
        if isinstance(p, RunStart):
            self._run_start(event, p, parent)
            return
        run = self._runs.get(event.run_id)
        if run is None:
            return
        if isinstance(p, ThinkStart):
            self._think_start(run, event, p)
        elif isinstance(p, ThinkComplete):
            self._think_complete(run, event, p)
        elif isinstance(p, ToolStart):
            self._tool_start(run, event, p)
        elif isinstance(p, ToolComplete | ToolError):
            self._tool_end(run, event, p)
        elif isinstance(p, ToolRetry):
            self._node_event(run, event, sc.EVENT_TOOL_RETRY, {
                sc.RETRY_ATTEMPT: p.attempt,
                sc.RETRY_ERROR: self.capture.message(p.error, default=error_type(p.error)),
                sc.RETRY_DELAY_S: p.delay_s,
            })  # fmt: skip
        elif isinstance(p, LoopDetected):
            self._loop_detected(run, event, p)
        elif isinstance(p, CollapseStart):
            self._collapse_start(run, event, p)
        elif isinstance(p, CollapseComplete):
            self._collapse_complete(run, event, p)
        elif isinstance(p, SkillStart):
            self._skill_start(run, event, p)
        elif isinstance(p, SkillComplete):
            self._skill_complete(run, event, p)
        elif isinstance(p, BudgetExhausted):
            self._node_event(run, event, sc.EVENT_BUDGET_EXHAUSTED, {
                sc.BUDGET_KIND: p.budget, sc.BUDGET_LIMIT: p.limit, sc.BUDGET_USED: p.used,
            })  # fmt: skip
        elif isinstance(p, TaskComplete):
            attrs: Attributes = {}
            answer = self.capture.text(p.answer)
            if answer is not None:
                attrs[sc.RUN_ANSWER] = answer
            self._node_event(run, event, sc.EVENT_TASK_COMPLETE, attrs)
        elif isinstance(p, RunComplete):
            self._run_complete(run, event, p)

    # -- helpers ---------------------------------------------------------------------------------

    def _start(
        self,
        name: str,
        parent: Span | None,
        event: Event,
        attributes: Attributes,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        links: Sequence[Link] = (),
    ) -> Span:
        context = trace.set_span_in_context(parent) if parent is not None else None
        return self._tracer.start_span(
            name, context=context, kind=kind, attributes=attributes, links=links, start_time=event.time_ns
        )

    def _node_attrs(self, run: _RunSpans, event: Event, kind: str) -> Attributes:
        attrs: Attributes = {
            sc.RUN_ID: run.run_id,
            sc.NODE_ID: event.node_id or "",
            sc.NODE_KIND: kind,
            sc.NODE_DEPTH: event.depth,
            sc.NODE_PARENT_ID: event.parent_id or "",
        }
        if event.skill_stack:
            attrs[sc.NODE_SKILL_STACK] = list(event.skill_stack)
        return attrs

    def _parent(self, run: _RunSpans, event: Event) -> Span:
        parent_id = event.parent_id
        if parent_id is None:
            return run.root
        skill = run.skills.get(parent_id)
        if skill is not None and len(event.skill_stack) > run.stacks.get(parent_id, 0):
            return skill
        return run.nodes.get(parent_id, run.root)

    def _register(self, run: _RunSpans, event: Event, span: Span) -> None:
        if event.node_id is not None:
            run.nodes[event.node_id] = span
            run.stacks[event.node_id] = len(event.skill_stack)
            run.contexts[event.node_id] = span.get_span_context()

    def _node_event(self, run: _RunSpans, event: Event, name: str, attrs: Attributes) -> None:
        span = run.nodes.get(event.node_id or "")
        if span is None or not span.is_recording():
            span = run.root
            if event.node_id:
                attrs = {**attrs, sc.NODE_ID: event.node_id}
        span.add_event(name, attrs, timestamp=event.time_ns)

    def _end(self, run: _RunSpans, node_id: str | None, event: Event) -> None:
        """End a node's span; it stays in ``run.nodes`` as the parent of later nodes."""
        span = run.nodes.get(node_id or "")
        if span is not None and span.is_recording():
            span.end(end_time=event.time_ns)

    # -- runs ---------------------------------------------------------------------------------------

    def _run_start(self, event: Event, p: RunStart, parent: otel_context.Context | None) -> None:
        c = p.config
        attrs: Attributes = {
            sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT,
            sc.GEN_AI_AGENT_NAME: p.agent,
            sc.RUN_ID: event.run_id,
            sc.CONFIG_MAX_REPEATS: c.max_repeats_per_signature,
            sc.CONFIG_NODE_BUDGET: c.node_budget,
            sc.CONFIG_DEPTH_LIMIT: c.depth_limit,
            sc.CONFIG_BRANCHING: c.branching,
            sc.CONFIG_SHADOW: c.shadow,
            sc.CONFIG_COLLAPSE_THRESHOLD: c.collapse_threshold,
        }
        if p.model:
            attrs[sc.GEN_AI_REQUEST_MODEL] = p.model
        if p.guard:
            attrs[sc.RUN_GUARD] = True
            if p.task:
                attrs[sc.GEN_AI_CONVERSATION_ID] = p.task
        else:
            task = self.capture.text(p.task)
            if task is not None:
                attrs[sc.RUN_TASK] = task
        root = self._tracer.start_span(
            f"{sc.OP_INVOKE_AGENT} {p.agent}",
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes=attrs,
            start_time=event.time_ns,
        )
        self._runs[event.run_id] = _RunSpans(root, event.run_id)

    def _run_complete(self, run: _RunSpans, event: Event, p: RunComplete) -> None:
        error = self.capture.message(p.error, default=error_type(p.error)) if p.error is not None else None
        for leftover in [*run.nodes.values(), *run.skills.values()]:
            if leftover.is_recording():
                leftover.set_status(Status(StatusCode.ERROR, error or "the run ended before this node"))
                leftover.end(end_time=event.time_ns)
        s = p.stats
        run.root.set_attributes({
            sc.RUN_OUTCOME: p.outcome, sc.RUN_NODES: s.nodes, sc.RUN_MAX_DEPTH: s.max_depth,
            sc.RUN_PRUNED: s.pruned, sc.RUN_LOOPS: s.loops_detected, sc.RUN_RETRIES: s.retries,
            sc.GEN_AI_USAGE_INPUT_TOKENS: s.input_tokens, sc.GEN_AI_USAGE_OUTPUT_TOKENS: s.output_tokens,
        })  # fmt: skip
        answer = self.capture.text(p.answer)
        if answer is not None:
            run.root.set_attribute(sc.RUN_ANSWER, answer)
        if p.error is not None:
            run.root.set_status(Status(StatusCode.ERROR, error))
            run.root.set_attribute(sc.ERROR_TYPE, error_type(p.error))
        run.root.end(end_time=event.time_ns)
        del self._runs[run.run_id]

    # -- think ------------------------------------------------------------------------------------------

    def _think_start(self, run: _RunSpans, event: Event, p: ThinkStart) -> None:
        attrs = self._node_attrs(run, event, "think")
        attrs[sc.GEN_AI_OPERATION_NAME] = sc.OP_CHAT
        attrs[sc.GEN_AI_REQUEST_MODEL] = p.model
        span = self._start(f"{sc.OP_CHAT} {p.model}", self._parent(run, event), event, attrs, kind=SpanKind.CLIENT)
        self._register(run, event, span)

    def _think_complete(self, run: _RunSpans, event: Event, p: ThinkComplete) -> None:
        span = run.nodes.get(event.node_id or "")
        if span is None:
            return
        attrs: Attributes = {
            sc.THINK_REQUESTED_CALLS: p.requested_calls,
            sc.THINK_ACCEPTED_CALLS: p.accepted_calls,
            sc.THINK_ENDED_BY: p.ended_by,
            sc.NODE_STATUS: "failed" if p.error else "completed",
            sc.GEN_AI_RESPONSE_FINISH_REASONS: ["tool_calls" if p.requested_calls else "stop"],
        }
        if p.usage is not None:
            attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] = p.usage.input_tokens
            attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = p.usage.output_tokens
        text = self.capture.text(p.text) if p.text else None
        if text is not None:
            attrs[sc.THINK_TEXT] = text
        span.set_attributes(attrs)
        if p.error is not None:
            span.set_status(Status(StatusCode.ERROR, self.capture.message(p.error, default="model error")))
            span.set_attribute(sc.ERROR_TYPE, "model_error")
        self._end(run, event.node_id, event)

    # -- tools ---------------------------------------------------------------------------------------------

    def _tool_start(self, run: _RunSpans, event: Event, p: ToolStart) -> None:
        attrs = self._node_attrs(run, event, "tool")
        attrs.update({
            sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: p.tool,
            sc.GEN_AI_TOOL_CALL_ID: p.call_id, sc.GEN_AI_TOOL_TYPE: "function",
            sc.TOOL_SIGNATURE: p.signature, sc.TOOL_ORDINAL: p.ordinal, sc.TOOL_LIMIT: p.limit,
            sc.TOOL_LIMIT_SOURCE: p.limit_source, sc.TOOL_SHADOW_CAUGHT: p.shadow_caught,
            sc.TOOL_ARGS_VALID: not isinstance(p.arguments, RawArguments),
        })  # fmt: skip
        if p.earlier_node_ids:
            attrs[sc.TOOL_EARLIER_NODE_IDS] = list(p.earlier_node_ids)
        arguments = self.capture.arguments(p.arguments)
        if arguments is not None:
            attrs[sc.GEN_AI_TOOL_CALL_ARGUMENTS] = arguments
        span = self._start(f"{sc.OP_EXECUTE_TOOL} {p.tool}", self._parent(run, event), event, attrs)
        self._register(run, event, span)

    def _tool_end(self, run: _RunSpans, event: Event, p: ToolComplete | ToolError) -> None:
        failed = isinstance(p, ToolError)
        span = run.nodes.get(event.node_id or "")
        if span is not None:
            attrs: Attributes = {
                sc.TOOL_RESULT_HASH: p.result_hash,
                sc.TOOL_ATTEMPTS: p.attempts,
                sc.NODE_STATUS: "failed" if failed else "completed",
            }
            result = self.capture.text(p.result)
            if result is not None:
                attrs[sc.GEN_AI_TOOL_CALL_RESULT] = result
            span.set_attributes(attrs)
            if isinstance(p, ToolError):
                span.set_status(Status(StatusCode.ERROR, self.capture.message(p.error, default="tool error")))
                span.set_attribute(sc.ERROR_TYPE, p.error_type)
            self._end(run, event.node_id, event)
        self.count_call(p, failed=failed)

    def count_call(self, p: ToolComplete | ToolError, *, failed: bool) -> None:
        """The metrics of one executed call (also used by the LoopGuard's span-less mode)."""
        status = "error" if failed else "ok"
        self._calls.add(1, {sc.GEN_AI_TOOL_NAME: p.tool, sc.METRIC_ATTR_STATUS: status})
        self._duration.record(p.duration_ns / 1e9, {sc.GEN_AI_TOOL_NAME: p.tool, sc.METRIC_ATTR_STATUS: status})

    def count_loop(self, c: PrunedCall) -> None:
        """The metric of one caught call (also used by the LoopGuard's span-less mode)."""
        self._loops.add(1, {sc.GEN_AI_TOOL_NAME: c.tool, sc.LOOP_ACTION: c.action, sc.LOOP_SHADOW: c.shadow})

    def _loop_detected(self, run: _RunSpans, event: Event, p: LoopDetected) -> None:
        c = p.call
        attrs = loop_attributes(c, [run.span_id(i) for i in c.earlier_node_ids], self.capture)
        self._node_event(run, event, sc.EVENT_LOOP_DETECTED, attrs)
        self.count_loop(c)

    # -- collapse and skills -----------------------------------------------------------------------

    def _collapse_start(self, run: _RunSpans, event: Event, p: CollapseStart) -> None:
        attrs = self._node_attrs(run, event, "collapse")
        attrs[sc.GEN_AI_OPERATION_NAME] = sc.OP_COLLAPSE
        attrs[sc.COLLAPSE_MERGED] = list(p.merged)
        attrs[sc.COLLAPSE_SIZE_BEFORE] = p.size_before
        links = [Link(run.contexts[i], {sc.LINK_RELATION: "merged"}) for i in p.merged if i in run.contexts]
        span = self._start(sc.SPAN_COLLAPSE, self._parent(run, event), event, attrs, links=links)
        self._register(run, event, span)

    def _collapse_complete(self, run: _RunSpans, event: Event, p: CollapseComplete) -> None:
        span = run.nodes.get(event.node_id or "")
        if span is None:
            return
        span.set_attributes({
            sc.COLLAPSE_COMPRESSED: p.compressed, sc.COLLAPSE_SIZE_AFTER: p.size_after,
        })  # fmt: skip
        if p.usage is not None:
            span.set_attribute(sc.GEN_AI_USAGE_INPUT_TOKENS, p.usage.input_tokens)
            span.set_attribute(sc.GEN_AI_USAGE_OUTPUT_TOKENS, p.usage.output_tokens)
        self._end(run, event.node_id, event)

    def _skill_start(self, run: _RunSpans, event: Event, p: SkillStart) -> None:
        tool_span = run.nodes.get(event.node_id or "", run.root)
        attrs: Attributes = {
            sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT,
            sc.GEN_AI_AGENT_NAME: p.skill,
            sc.SKILL_NAME: p.skill,
            sc.RUN_ID: run.run_id,
            sc.NODE_PARENT_ID: event.node_id or "",
            sc.NODE_DEPTH: event.depth,
        }
        if event.skill_stack:
            attrs[sc.NODE_SKILL_STACK] = list(event.skill_stack)
        span = self._start(f"{sc.OP_INVOKE_AGENT} {p.skill}", tool_span, event, attrs)
        run.skills[event.node_id or ""] = span

    def _skill_complete(self, run: _RunSpans, event: Event, p: SkillComplete) -> None:
        span = run.skills.pop(event.node_id or "", None)
        if span is None:
            return
        span.set_attribute(sc.RUN_OUTCOME, p.outcome)
        if p.outcome != "completed":
            span.set_status(Status(StatusCode.ERROR, f"skill {p.skill} ended {p.outcome}"))
        span.end(end_time=event.time_ns)
