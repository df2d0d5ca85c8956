"""One run of a tree: all per-run state, and the think / tool / collapse steps.

Hard rules:

- Every piece of per-run state lives on :class:`Run` (nodes, ids, budgets,
  events); the executor holds none, so one executor runs many tasks at once.
- A tool call is checked against the node's path *and* the calls already
  accepted in the same turn before anything runs. A caught call never becomes
  a node: it is a ``PrunedCall`` on the ThinkNode that asked for it.
- Limits, actions, state changes, the failure rule and the texts of a catch
  come from ``engine/repeats.py`` (shared with ``LoopGuard``), never from here.
- Every tool call in an assistant message that goes back to the model is
  answered by exactly one tool message, or removed from that message.
- The model's and the tools' faults are data (node status, events, results
  fed back); a ``ScriptExhaustedError`` or any other bug propagates. That
  includes arguments deeper or bigger than ``max_argument_depth`` /
  ``max_argument_bytes`` (checked on the text before it is parsed: the call is
  a failed ToolNode that never ran), a handler past its timeout, and a result
  that cannot be turned into text (the handler ran once; never a retry).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import inspect
import itertools
import json
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from treellm.config import TreeConfig
from treellm.engine.events import (
    EVENT_TYPES,
    BudgetExhausted,
    Chunk,
    ChunkType,
    CollapseComplete,
    CollapseStart,
    Event,
    LoopDetected,
    Observer,
    Outcome,
    Payload,
    RunStats,
    SkillComplete,
    SkillStart,
    TaskComplete,
    ThinkComplete,
    ThinkStart,
    ThinkToken,
    ToolComplete,
    ToolError,
    ToolRetry,
    ToolStart,
    notify,
)
from treellm.engine.nodes import (
    CollapseNode,
    Node,
    NodeKind,
    NodeStatus,
    PrunedCall,
    ThinkNode,
    ToolErrorType,
    ToolNode,
)
from treellm.engine.repeats import (
    RepeatPolicy,
    answer_text,
    loop_message,
    oversized_arguments,
    preview,
    pruned_call,
)
from treellm.engine.tools import (
    TASK_COMPLETE,
    TASK_COMPLETE_SPEC,
    Skill,
    Tool,
    result_hash,
    result_text,
    tool_timeout,
)
from treellm.errors import ModelError
from treellm.loop import CallKey, LoopDecision, PathSignatures, key_of
from treellm.models.base import (
    ChatModel,
    Message,
    ModelDelta,
    ModelRequest,
    TextDelta,
    ToolCall,
    ToolSpec,
    Usage,
    arguments_text,
    assemble,
)
from treellm.signature import RawArguments, parse_arguments

__all__ = ["BranchEnd", "Run", "SubTree", "tree_outcome"]


Clock = Callable[[], int]
Sleep = Callable[[float], Awaitable[None]]
EndReason = Literal["answer", "prune", "budget", "error"]

COLLAPSE_PROMPT = (
    "You compress an agent's working context. Summarise the tool results below densely: keep every "
    "fact, number, name and error the agent needs to finish its task; drop repetition."
)


@dataclass(frozen=True, slots=True)
class BranchEnd:
    node_id: str
    reason: EndReason
    answer: str | None = None
    summary: str | None = None


def tree_outcome(ends: Sequence[BranchEnd]) -> Outcome:
    """completed if any branch answered; else budget_exhausted if any budget ran out;
    else pruned_out when every branch ended by prune actions; else failed."""
    reasons = {end.reason for end in ends}
    if "answer" in reasons:
        return "completed"
    if "budget" in reasons:
        return "budget_exhausted"
    if reasons == {"prune"}:
        return "pruned_out"
    return "failed"


@dataclass(slots=True)
class SubTree:
    """The root tree or a skill's sub-tree: its settings, tools and branch ends."""

    config: TreeConfig
    tools: Mapping[str, Tool]
    skills: Mapping[str, Skill]
    policy: RepeatPolicy
    """Limits, actions and state-change/failure rules per tool (``engine/repeats.py``)."""
    system_prompt: str
    skill_stack: tuple[str, ...] = ()
    ends: list[BranchEnd] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        config: TreeConfig,
        tools: Sequence[Tool],
        skills: Sequence[Skill],
        system_prompt: str,
        skill_stack: tuple[str, ...] = (),
    ) -> SubTree:
        return cls(
            config,
            {t.name: t for t in tools},
            {s.tool_name: s for s in skills},
            RepeatPolicy(config, {t.name: t.settings for t in tools}),
            system_prompt,
            skill_stack,
        )

    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self.tools.values()] + [s.spec for s in self.skills.values()] + [TASK_COMPLETE_SPEC]


@dataclass(frozen=True, slots=True)
class Branch:
    """Where a ThinkNode starts: its context, path, depth and parent."""

    tree: SubTree
    messages: tuple[Message, ...]
    path: PathSignatures
    depth: int
    parent_id: str | None


@dataclass(slots=True)
class _Accepted:
    """A call that passed the loop check in this turn (it becomes a ToolNode)."""

    call_id: str
    node_id: str
    name: str
    raw: str
    value: Any
    key: CallKey
    decision: LoopDecision
    shadow_caught: bool
    problem: str | None = None
    """Why the arguments were rejected unparsed (too deep or too big), else None."""
    node: ToolNode | None = None


@dataclass(frozen=True, slots=True)
class _Outcome:
    """How an accepted call ended."""

    ok: bool
    text: str
    attempts: int
    error_type: ToolErrorType = "tool_error"


@dataclass(slots=True)
class _Caught:
    """A caught call that is not run (prune, nudge or cache)."""

    pruned: PrunedCall
    key: CallKey


class Run:
    """Everything about one run; created per task by the executor."""

    def __init__(
        self,
        *,
        run_id: str,
        task: str,
        agent: str,
        model: ChatModel,
        config: TreeConfig,
        observers: Sequence[Observer],
        clock: Clock,
        sleep: Sleep,
        on_chunk: Callable[[Chunk], None] | None = None,
    ) -> None:
        self.run_id = run_id
        self.task = task
        self.agent = agent
        self.model = model
        self.config = config
        self.clock = clock
        self.sleep = sleep
        self._observers = list(observers)
        self._on_chunk = on_chunk
        self._ids = itertools.count(1)
        self._call_ids = itertools.count(1)
        self.nodes: dict[str, Node] = {}
        self.events: list[Event] = []
        self.chunks: list[Chunk] = []
        self.pruned: list[PrunedCall] = []
        self.retries = 0
        self.compressions = 0
        self.usage = Usage()
        self._tool_slots = asyncio.Semaphore(config.max_concurrency)

    # -- ids, events, chunks -------------------------------------------------

    def new_node_id(self) -> str:
        return f"n{next(self._ids)}"

    def new_call_id(self) -> str:
        return f"call_{next(self._call_ids)}"

    def emit(self, payload: Payload, node: Node | None = None, *, skill_stack: tuple[str, ...] = ()) -> None:
        event = Event(
            EVENT_TYPES[type(payload)],
            self.run_id,
            node.id if node else None,
            node.parent_id if node else None,
            node.depth if node else 0,
            node.skill_stack if node else skill_stack,
            self.clock(),
            payload,
        )
        self.events.append(event)
        notify(self._observers, event)

    def chunk(self, kind: ChunkType, content: str, node_id: str | None = None) -> None:
        chunk = Chunk(kind, content, node_id)
        self.chunks.append(chunk)
        if self._on_chunk is not None:
            self._on_chunk(chunk)

    def store(self, node: Node) -> Node:
        self.nodes[node.id] = node
        return node

    def stats(self) -> RunStats:
        kinds = [n.kind for n in self.nodes.values()]
        return RunStats(
            nodes=len(kinds),
            think_nodes=kinds.count(NodeKind.THINK),
            tool_nodes=kinds.count(NodeKind.TOOL),
            collapse_nodes=kinds.count(NodeKind.COLLAPSE),
            max_depth=max((n.depth for n in self.nodes.values()), default=0),
            loops_detected=len(self.pruned),
            pruned=sum(1 for p in self.pruned if not p.shadow),
            retries=self.retries,
            compressions=self.compressions,
            input_tokens=self.usage.input_tokens,
            output_tokens=self.usage.output_tokens,
        )

    # -- budgets -------------------------------------------------------------

    def _budget_left(self, tree: SubTree, wanted: int, at: Node | None, skill_stack: tuple[str, ...]) -> bool:
        used = len(self.nodes)
        if used + wanted <= self.config.node_budget:
            return True
        self._exhausted(tree, BudgetExhausted("node", self.config.node_budget, used), at, skill_stack)
        return False

    def _exhausted(
        self, tree: SubTree, payload: BudgetExhausted, at: Node | None, skill_stack: tuple[str, ...]
    ) -> None:
        self.emit(payload, at, skill_stack=skill_stack)
        what = "node budget" if payload.budget == "node" else "depth limit"
        self.chunk(ChunkType.BUDGET_EXHAUSTED, f"[tree] {what} of {payload.limit} reached — branch stopped")
        tree.ends.append(BranchEnd(at.id if at else "", "budget"))

    # -- think ---------------------------------------------------------------

    async def think(self, branch: Branch) -> None:
        """Run a branch to its end: a loop while it has one child, concurrent sub-branches when it forks.

        Iterative along single-child chains, so a deep collapse-mode tree never
        nests coroutines (and never hits Python's recursion limit).
        """
        current: Branch | None = branch
        while current is not None:
            children = await self._step(current)
            if len(children) == 1:
                current = children[0]
                continue
            if children:
                await asyncio.gather(*(self.think(child) for child in children))
            current = None

    async def _step(self, branch: Branch) -> list[Branch]:
        """Run one ThinkNode and its tool calls; return the branches that continue from it."""
        tree = branch.tree
        parent = self.nodes.get(branch.parent_id) if branch.parent_id else None
        if branch.depth >= tree.config.depth_limit:
            self._exhausted(
                tree,
                BudgetExhausted("depth", tree.config.depth_limit, branch.depth),
                parent,
                tree.skill_stack,
            )
            return []
        if not self._budget_left(tree, 1, parent, tree.skill_stack):
            return []
        node = ThinkNode(
            id=self.new_node_id(),
            parent_id=branch.parent_id,
            depth=branch.depth,
            status=NodeStatus.RUNNING,
            skill_stack=tree.skill_stack,
            started_ns=self.clock(),
            model=self.model.model_name,
        )
        self.store(node)
        self.emit(ThinkStart(self.model.model_name, len(branch.messages)), node)
        request = ModelRequest(branch.messages, tree.specs(), node.id, node.depth, "think", tree.skill_stack)
        try:
            turn = assemble(await self._stream_model(request, node))
        except ModelError as exc:
            failed = node.with_(status=NodeStatus.FAILED, error=str(exc), ended_ns=self.clock(), ended_by="error")
            self.store(failed)
            self.emit(ThinkComplete("", 0, 0, None, "error", str(exc)), failed)
            self.chunk(ChunkType.ERROR, f"[tree] model error: {exc}", node.id)
            tree.ends.append(BranchEnd(node.id, "error"))
            return []
        if turn.usage is not None:
            self.usage = self.usage + turn.usage
        node = node.with_(text=turn.text, usage=turn.usage, requested_calls=len(turn.tool_calls))
        self.store(node)

        finish = next((c for c in turn.tool_calls if c.name == TASK_COMPLETE), None)
        if finish is not None or not turn.tool_calls:
            answer, summary = _final_answer(finish, turn.text, tree.config)
            self._complete_think(node, "answer", len(turn.tool_calls), 0, answer=answer)
            self.emit(TaskComplete(answer, summary), node)
            self.chunk(ChunkType.TASK_COMPLETE, answer, node.id)
            tree.ends.append(BranchEnd(node.id, "answer", answer, summary))
            return []

        accepted, caught, call_order = self._loop_check(tree, branch.path, node, turn.tool_calls)
        checked = self.nodes[node.id]
        assert isinstance(checked, ThinkNode)
        node = checked
        answered = [c for c in caught if c.pruned.action != "prune"]
        if not accepted and not answered:
            self._complete_think(node, "prune", len(turn.tool_calls), 0)
            tree.ends.append(BranchEnd(node.id, "prune"))
            return []
        if not self._budget_left(tree, len(accepted), node, tree.skill_stack):
            self._complete_think(node, "budget", len(turn.tool_calls), len(accepted))
            return []
        self._complete_think(node, "children", len(turn.tool_calls), len(accepted))
        await asyncio.gather(*(self._run_tool(tree, node, a) for a in accepted))
        answers = self._answer_caught(node.id, caught)
        order = {call_id: i for i, call_id in enumerate(call_order)}
        return await self._continue(branch, node, text=turn.text, accepted=accepted, answers=answers, order=order)

    async def _stream_model(self, request: ModelRequest, node: Node) -> list[ModelDelta]:
        deltas: list[ModelDelta] = []
        async for delta in self.model.stream(request):
            deltas.append(delta)
            if isinstance(delta, TextDelta) and delta.text and request.purpose == "think":
                self.emit(ThinkToken(delta.text), node)
                self.chunk(ChunkType.TEXT, delta.text, node.id)
        return deltas

    def _complete_think(
        self,
        node: ThinkNode,
        ended_by: Literal["answer", "prune", "budget", "children"],
        requested: int,
        accepted: int,
        answer: str | None = None,
    ) -> None:
        done = node.with_(status=NodeStatus.COMPLETED, ended_ns=self.clock(), ended_by=ended_by, answer=answer)
        self.store(done)
        self.emit(ThinkComplete(node.text, requested, accepted, node.usage, ended_by), done)

    # -- the loop check --------------------------------------------------------

    def _loop_check(
        self, tree: SubTree, path: PathSignatures, node: ThinkNode, calls: Sequence[ToolCall]
    ) -> tuple[list[_Accepted], list[_Caught], list[str]]:
        """Check each call against the path and the calls accepted before it in this turn.

        Returns the accepted calls, the caught ones (not run) and every call id in turn order.
        """
        accepted: list[_Accepted] = []
        caught: list[_Caught] = []
        turn_path = path
        seen_ids: set[str] = set()
        call_order: list[str] = []
        shadow = tree.config.shadow
        for call in calls:
            call_id = call.id if call.id and call.id not in seen_ids else self.new_call_id()
            seen_ids.add(call_id)
            call_order.append(call_id)
            raw, value, key, problem = _read_arguments(call, tree.config)
            decision = tree.policy.check(turn_path, key)
            if decision.caught:
                pruned = pruned_call(
                    decision,
                    call_id=call_id,
                    raw_arguments=raw,
                    arguments=value,
                    action=tree.policy.action(call.name),
                    shadow=shadow,
                )
                self._record_catch(node, pruned)
                if not shadow:
                    caught.append(_Caught(pruned, key))
                    continue
            node_id = self.new_node_id()
            turn_path = tree.policy.extend(turn_path, key, value, node_id, succeeded=False)
            accepted.append(_Accepted(call_id, node_id, call.name, raw, value, key, decision, decision.caught, problem))
        return accepted, caught, call_order

    def _record_catch(self, node: ThinkNode, pruned: PrunedCall) -> None:
        self.pruned.append(pruned)
        current = self.nodes[node.id]
        assert isinstance(current, ThinkNode)
        self.store(current.with_(pruned=(*current.pruned, pruned)))
        self.emit(LoopDetected(pruned), current)
        if not pruned.shadow:
            self.chunk(
                ChunkType.LOOP_DETECTED,
                loop_message(pruned.tool, pruned.raw_arguments, pruned.action),
                node.id,
            )

    def _answer_caught(self, think_id: str, caught: list[_Caught]) -> list[PrunedCall]:
        """The nudge and cache answers, once this turn's tools have run."""
        answers: list[PrunedCall] = []
        for item in caught:
            p = item.pruned
            if p.action == "prune":
                continue
            earlier = self.nodes.get(p.earlier_node_ids[-1]) if p.earlier_node_ids else None
            earlier_result = earlier.result if isinstance(earlier, ToolNode) and earlier.result is not None else ""
            text = answer_text(p.action, tool=p.tool, count=p.count, limit=p.limit, earlier_result=earlier_result)
            answered = dataclasses.replace(p, answer=text)
            self.pruned[self.pruned.index(p)] = answered
            think = self.nodes[think_id]
            assert isinstance(think, ThinkNode)
            self.store(think.with_(pruned=tuple(answered if q is p else q for q in think.pruned)))
            answers.append(answered)
        return answers

    # -- tools -----------------------------------------------------------------

    async def _run_tool(self, tree: SubTree, think: ThinkNode, call: _Accepted) -> None:
        node = ToolNode(
            id=call.node_id,
            parent_id=think.id,
            depth=think.depth,
            status=NodeStatus.RUNNING,
            skill_stack=think.skill_stack,
            started_ns=self.clock(),
            tool_name=call.name,
            call_id=call.call_id,
            args=call.value,
            raw_args=call.raw,
            signature=call.decision.signature,
            ordinal=call.decision.ordinal,
            limit=call.decision.limit,
            limit_source=call.decision.limit_source,
            shadow_caught=call.shadow_caught,
        )
        self.store(node)
        d = call.decision
        self.emit(
            ToolStart(
                call.name,
                call.call_id,
                call.value,
                call.raw,
                d.signature,
                d.ordinal,
                d.limit,
                d.limit_source,
                call.shadow_caught,
                tuple(i for i in d.earlier_node_ids if i is not None),
            ),
            node,
        )
        shown = call.raw if call.problem is None else preview(call.raw)
        self.chunk(ChunkType.TOOL_CALL, f"{call.name}({shown})", node.id)
        outcome = await self._execute(tree, node, call)
        ok, text, attempts = outcome.ok, outcome.text, outcome.attempts
        ended = self.clock()
        digest = result_hash(text)
        node = node.with_(
            status=NodeStatus.COMPLETED if ok else NodeStatus.FAILED,
            ended_ns=ended,
            result=text,
            result_hash=digest,
            attempts=attempts,
            error=None if ok else text,
            error_type=None if ok else outcome.error_type,
        )
        self.store(node)
        call.node = node
        duration = ended - (node.started_ns or ended)
        if ok:
            self.emit(ToolComplete(call.name, text, digest, attempts, duration), node)
            self.chunk(ChunkType.TOOL_RESULT, text, node.id)
        else:
            self.emit(ToolError(call.name, text, text, digest, attempts, duration, outcome.error_type), node)
            self.chunk(ChunkType.TOOL_ERROR, text, node.id)

    async def _execute(self, tree: SubTree, node: ToolNode, call: _Accepted) -> _Outcome:
        """Run a call (with retries when its handler raises)."""
        if call.problem is not None:
            c = tree.config
            return _Outcome(
                False,
                f"Error: the arguments of {call.name} were rejected: {call.problem}. Send arguments at most "
                f"{c.max_argument_depth} levels deep and {c.max_argument_bytes:,} bytes long.",
                0,
                "arguments_too_large",
            )
        if isinstance(call.value, RawArguments):
            return _Outcome(False, _malformed_message(call.name, call.raw), 0)
        if call.name in tree.skills:
            return await self._run_skill(tree, tree.skills[call.name], node, call.value)
        tool = tree.tools.get(call.name)
        if tool is None or tool.handler is None:
            names = ", ".join(sorted([*tree.tools, *tree.skills, TASK_COMPLETE]))
            return _Outcome(False, f"Error: unknown tool {call.name!r}. Available tools: {names}.", 0)
        if not isinstance(call.value, dict):
            kind = type(call.value).__name__ if call.value is not None else "null"
            return _Outcome(False, f"Error: the arguments of {call.name} must be a JSON object, got {kind}.", 0)
        timeout = tool_timeout(tool, tree.config)
        attempts = 0
        max_attempts = tree.config.retry_max_attempts
        while True:
            attempts += 1
            try:
                async with self._tool_slots:
                    value = await _call_handler(tool, call.value, timeout)
            except Exception as exc:  # noqa: BLE001 -- a tool's fault is data: retried, then sent to the model
                error = f"{type(exc).__name__}: {exc}"
                if attempts >= max_attempts:
                    return _Outcome(False, f"Error: {call.name} failed after {attempts} attempt(s): {error}", attempts)
                delay = tree.config.retry_base_delay_s * 2 ** (attempts - 1)
                self.retries += 1
                self.emit(ToolRetry(call.name, attempts, error, delay), node)
                await self.sleep(delay)
                continue
            if value is _TIMED_OUT:  # never retried: a hung tool rarely recovers, and its thread may still run
                return _Outcome(False, f"Error: tool {call.name} timed out after {timeout:g} s.", attempts, "timeout")
            return _handler_outcome(tree, call.name, value, attempts)

    async def _run_skill(self, tree: SubTree, skill: Skill, node: ToolNode, arguments: Any) -> _Outcome:
        task = arguments.get("task") if isinstance(arguments, dict) else None
        if not isinstance(task, str) or not task:
            return _Outcome(False, f"Error: {skill.tool_name} needs a non-empty 'task' string argument.", 0)
        sub = SubTree.build(
            skill.config or tree.config,
            skill.tools if skill.tools is not None else list(tree.tools.values()),
            [s for s in tree.skills.values() if s.name not in (*tree.skill_stack, skill.name)],
            skill.system_prompt,
            (*tree.skill_stack, skill.name),
        )
        self.emit(SkillStart(skill.name, task), node)
        self.chunk(ChunkType.SKILL, f"[tree] skill {skill.name}: {task}", node.id)
        messages = ({"role": "system", "content": sub.system_prompt}, {"role": "user", "content": task})
        await self.think(Branch(sub, messages, PathSignatures.empty(), 0, node.id))
        outcome = tree_outcome(sub.ends)
        answer = next((e.answer for e in sub.ends if e.reason == "answer"), None)
        self.emit(SkillComplete(skill.name, answer, outcome), node)
        if answer is None:
            return _Outcome(False, f"Error: skill {skill.name} ended without an answer ({outcome}).", 1)
        return _Outcome(True, answer, 1)

    # -- continuing the branch -----------------------------------------------------

    async def _continue(
        self,
        branch: Branch,
        think: ThinkNode,
        *,
        text: str,
        accepted: list[_Accepted],
        answers: list[PrunedCall],
        order: Mapping[str, int],
    ) -> list[Branch]:
        """The branches that continue after a turn's tools ran (collapsing first in collapse mode)."""
        tree = branch.tree
        if tree.config.branching == "fork" and accepted:
            children = []
            for call in accepted:
                assert call.node is not None
                messages = (*branch.messages, *_turn_messages(text, [call.node], answers, order))
                path = tree.policy.extend(branch.path, call.key, call.value, call.node_id, succeeded=self._ran(call))
                children.append(Branch(tree, messages, path, branch.depth + 1, call.node_id))
            return children
        tool_nodes = [c.node for c in accepted if c.node is not None]
        path = branch.path
        for call in accepted:
            path = tree.policy.extend(path, call.key, call.value, call.node_id, succeeded=self._ran(call))
        turn = _turn_messages(text, tool_nodes, answers, order)
        if tree.config.branching == "fork":  # only nudge/cache answers: one continuation
            child = Branch(tree, (*branch.messages, *turn), path, branch.depth + 1, think.id)
            return [child]
        collapse_id = await self._collapse(branch, think, tool_nodes, turn)
        if collapse_id is None:
            return []
        collapse = self.nodes[collapse_id]
        assert isinstance(collapse, CollapseNode)
        messages = (*branch.messages, *turn) if not collapse.compressed else self._compressed_context(branch, collapse)
        return [Branch(tree, messages, path, branch.depth + 1, collapse_id)]

    @staticmethod
    def _ran(call: _Accepted) -> bool:
        """True when the call ran and succeeded (its state change then counts, ``engine/repeats.py``)."""
        return call.node is not None and call.node.status == NodeStatus.COMPLETED

    async def _collapse(
        self, branch: Branch, think: ThinkNode, tool_nodes: list[ToolNode], turn: list[Message]
    ) -> str | None:
        tree = branch.tree
        if not self._budget_left(tree, 1, think, tree.skill_stack):
            return None
        names = {c["id"]: c["function"]["name"] for c in turn[0]["tool_calls"]}
        results = [(names.get(m["tool_call_id"], "tool"), str(m.get("content") or "")) for m in turn[1:]]
        size_before = sum(len(content) for _, content in results)
        merged = tuple(n.id for n in tool_nodes)
        node = CollapseNode(
            id=self.new_node_id(),
            parent_id=think.id,
            depth=think.depth,
            status=NodeStatus.RUNNING,
            skill_stack=think.skill_stack,
            started_ns=self.clock(),
            merged=merged,
            size_before=size_before,
            size_after=size_before,
        )
        self.store(node)
        self.emit(CollapseStart(merged, size_before), node)
        usage: Usage | None = None
        if size_before > tree.config.collapse_threshold:
            digest = "\n\n".join(f"[{name}] {content}" for name, content in results)
            request = ModelRequest(
                (
                    {"role": "system", "content": COLLAPSE_PROMPT},
                    {
                        "role": "user",
                        "content": f"Task: {_task_of(branch.messages)}\n\nTool results:\n{digest}",
                    },
                ),
                (),
                node.id,
                node.depth,
                "collapse",
                tree.skill_stack,
            )
            try:
                summary = assemble(await self._stream_model(request, node))
            except ModelError as exc:
                failed = node.with_(status=NodeStatus.FAILED, error=str(exc), ended_ns=self.clock())
                self.store(failed)
                self.emit(CollapseComplete(merged, False, size_before, size_before), failed)
                self.chunk(ChunkType.ERROR, f"[tree] collapse failed: {exc}", node.id)
                tree.ends.append(BranchEnd(node.id, "error"))
                return None
            usage = summary.usage
            if usage is not None:
                self.usage = self.usage + usage
            self.compressions += 1
            node = node.with_(compressed=True, size_after=len(summary.text), summary=summary.text)
        done = node.with_(status=NodeStatus.COMPLETED, ended_ns=self.clock())
        self.store(done)
        self.emit(CollapseComplete(merged, done.compressed, size_before, done.size_after, usage), done)
        note = f"compressed {size_before} -> {done.size_after} chars" if done.compressed else "merged"
        self.chunk(ChunkType.COLLAPSE, f"[tree] collapse of {len(merged)} result(s): {note}", node.id)
        return node.id

    def _compressed_context(self, branch: Branch, collapse: CollapseNode) -> tuple[Message, ...]:
        """System and user messages kept; everything after them replaced by the summary."""
        head = tuple(m for m in branch.messages[:2] if m.get("role") in ("system", "user"))
        return (*head, {"role": "assistant", "content": f"Summary of the work so far:\n{collapse.summary}"})


# -- pure helpers ---------------------------------------------------------------------


def _read_arguments(call: ToolCall, config: TreeConfig) -> tuple[str, Any, CallKey, str | None]:
    """A call's raw text, parsed value, loop key and why its arguments were rejected (or None).

    Arguments deeper or bigger than the limits are never parsed: they count on the
    path under their raw text (as malformed JSON does), and the node, its events and
    the telemetry see only a ``RawArguments`` preview of them.
    """
    oversized = oversized_arguments(call.arguments, config)
    if oversized is not None:
        raw, shown, problem = oversized
        return raw, shown, CallKey(call.name, raw, raw=True), problem
    raw = arguments_text(call.arguments)
    value = parse_arguments(call.arguments if isinstance(call.arguments, str) else dict(call.arguments))
    return raw, value, key_of(call.name, value), None


def _handler_outcome(tree: SubTree, tool: str, value: object, attempts: int) -> _Outcome:
    """What a handler's return value means: its text, failed or not (never a retry)."""
    try:
        text = result_text(value)
    except Exception as exc:  # noqa: BLE001 -- the handler's value is the tool's fault: data, never a re-run
        return _Outcome(
            False,
            f"Error: {tool} returned a value that cannot be sent to the model "
            f"({type(value).__name__}; {type(exc).__name__}: {exc}).",
            attempts,
            "unserializable_result",
        )
    return _Outcome(not tree.policy.is_failure(tool, text), text, attempts)


def _task_of(messages: Sequence[Message]) -> str:
    return next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")


def _final_answer(finish: ToolCall | None, text: str, config: TreeConfig) -> tuple[str, str | None]:
    if finish is None:
        return text, None
    oversized = oversized_arguments(finish.arguments, config)
    if oversized is not None:  # not parsed: the answer is the raw text
        return oversized[0], None
    value = parse_arguments(finish.arguments if isinstance(finish.arguments, str) else dict(finish.arguments))
    if isinstance(value, dict):
        result, summary = value.get("result"), value.get("summary")
        answer = result if isinstance(result, str) else result_text(result) if result is not None else text
        return answer, summary if isinstance(summary, str) else None
    if isinstance(value, RawArguments):
        return value.text, None
    return result_text(value), None


def _malformed_message(tool: str, raw: str) -> str:
    try:
        json.loads(raw)
        problem = "it is not valid JSON"
    except json.JSONDecodeError as exc:
        problem = f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    except (ValueError, RecursionError) as exc:
        problem = str(exc)
    shown = raw if len(raw) <= 200 else raw[:200] + "..."
    return f"Error: the arguments of {tool} are not valid JSON ({problem}): {shown}. Send a JSON object."


_TIMED_OUT: Final = object()
"""What :func:`_call_handler` returns when the handler ran past its timeout."""


async def _call_handler(tool: Tool, arguments: dict[str, Any], timeout: float | None) -> Any:
    """The handler's return value, or ``_TIMED_OUT``; what the handler raises propagates.

    The handler is awaited in the calling task under ``asyncio.timeout`` (no task of
    its own, so runs keep their scheduling order): on timeout an async handler is
    cancelled; a sync handler runs in a daemon thread of its own (:func:`_in_thread`)
    that is abandoned, and the run never waits for it (not even at loop shutdown).
    A ``TimeoutError`` the handler raises itself is the tool's own failure.
    """
    handler = tool.handler
    assert handler is not None
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            if inspect.iscoroutinefunction(handler):
                return await handler(arguments)
            value = await _in_thread(tool.name, handler, arguments)
            if inspect.isawaitable(value):
                return await value
            return value
    except TimeoutError:
        if deadline.expired():
            return _TIMED_OUT
        raise


async def _in_thread(name: str, handler: Callable[[dict[str, Any]], Any], arguments: dict[str, Any]) -> Any:
    """Run a sync handler in a new daemon thread (with the caller's context variables).

    Not ``asyncio.to_thread``: the default executor's threads are joined when the
    loop shuts down and when the interpreter exits, so a hung handler would hang
    the run after its timeout. A daemon thread is abandoned instead; when the
    caller stops waiting, the handler's late outcome is dropped.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()
    worker = threading.Thread(
        target=_work, args=(loop, future, context, handler, arguments), name=f"treellm-tool-{name}", daemon=True
    )
    worker.start()
    return await future


def _work(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    context: contextvars.Context,
    handler: Callable[[dict[str, Any]], Any],
    arguments: dict[str, Any],
) -> None:
    """A sync handler's thread: run it, then hand its outcome to the loop if it is still open."""
    outcome: tuple[Any, BaseException | None] | None = None
    try:
        outcome = (context.run(handler, arguments), None)
    except Exception as exc:  # noqa: BLE001 -- the tool's fault: handed to the run, which makes it data
        outcome = (None, exc)
    finally:
        if outcome is None:  # a BaseException (SystemExit...) leaves this thread: the run gets it too
            outcome = (None, sys.exc_info()[1])
        try:
            loop.call_soon_threadsafe(_settle, future, *outcome)
        except RuntimeError:  # the loop is closed: the run ended without this call (it timed out)
            _drop(outcome[0])


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():  # the call timed out or was cancelled: nobody waits for its outcome
        _drop(value)
    elif error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def _drop(value: object) -> None:
    if inspect.iscoroutine(value):
        value.close()  # a sync handler returned a coroutine nobody will await


def _turn_messages(
    text: str, tool_nodes: Sequence[ToolNode], answers: Sequence[PrunedCall], order: Mapping[str, int]
) -> list[Message]:
    """The assistant message of a turn and one tool message per call it keeps, in turn order.

    Calls pruned with action ``prune`` are removed from the assistant message;
    nudge and cache calls stay, answered by their answer.
    """
    calls: list[tuple[str, str, str, str]] = [
        (n.call_id, n.tool_name, n.raw_args, n.result or "") for n in tool_nodes
    ] + [(p.call_id, p.tool, p.raw_arguments, p.answer or "") for p in answers]
    calls.sort(key=lambda c: order.get(c[0], len(order)))
    assistant: Message = {
        "role": "assistant",
        "content": text or None,
        "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": raw}} for cid, name, raw, _ in calls
        ],
    }
    tools: list[Message] = [{"role": "tool", "tool_call_id": cid, "content": result} for cid, _, _, result in calls]
    return [assistant, *tools]
