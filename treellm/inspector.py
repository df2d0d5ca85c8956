"""Terminal presentation of a run (rich): a live log while it goes, then its tree.

Presentation only: reads events and ``RunResult`` values, never changes them.
Everything from the trace is rendered as plain text (``rich.text.Text``), never
as console markup, so tool arguments cannot inject styles.
"""

from __future__ import annotations

import io

from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from treellm.engine.events import (
    BudgetExhausted,
    CollapseComplete,
    Event,
    LoopDetected,
    RunComplete,
    SkillStart,
    TaskComplete,
    ThinkComplete,
    ToolComplete,
    ToolError,
    ToolRetry,
    ToolStart,
)
from treellm.engine.executor import RunResult
from treellm.engine.nodes import CollapseNode, Node, PrunedCall, ThinkNode, ToolNode

__all__ = ["LiveLog", "render_tree", "tree_text"]

_KIND_STYLE = {"think": "cyan", "tool": "green", "collapse": "magenta"}
_STATUS_STYLE = {"completed": "green", "failed": "red", "running": "yellow", "pending": "dim"}


def _short(text: str | None, limit: int = 60) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class LiveLog:
    """An observer that prints one line per step of a run to a rich console."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)

    def _line(self, event: Event, style: str, message: str) -> None:
        indent = "  " * (event.depth + len(event.skill_stack))
        line = Text(f"{indent}{event.node_id or '':>4} ", style="dim")
        line.append(message, style=style)
        self.console.print(line, soft_wrap=True)

    def __call__(self, event: Event) -> None:
        p = event.payload
        if isinstance(p, ThinkComplete):
            if p.ended_by == "answer":
                return  # the TaskComplete line says it
            calls = f"{p.requested_calls} call(s)" if p.requested_calls else "answer"
            self._line(event, "cyan", f"think → {calls}{': ' + _short(p.text) if p.text else ''}")
        elif isinstance(p, ToolStart):
            self._line(event, "green", f"▶ {p.tool}({_short(p.raw_arguments, 80)})  #{p.ordinal}")
        elif isinstance(p, ToolComplete):
            self._line(event, "dim green", f"✓ {p.tool} → {_short(p.result)}")
        elif isinstance(p, ToolError):
            self._line(event, "red", f"✗ {p.tool} → {_short(p.error)}")
        elif isinstance(p, ToolRetry):
            self._line(
                event,
                "yellow",
                f"↻ {p.tool} attempt {p.attempt} failed ({_short(p.error)}); retry in {p.delay_s}s",
            )
        elif isinstance(p, LoopDetected):
            c = p.call
            what = "shadow: would " + c.action if c.shadow else c.action
            self._line(
                event,
                "bold yellow",
                f"⟲ loop: {c.tool}({_short(c.raw_arguments, 60)}) count {c.count} ≥ limit {c.limit} → {what}",
            )
        elif isinstance(p, CollapseComplete):
            note = f"compressed {p.size_before} → {p.size_after} chars" if p.compressed else "merged"
            self._line(event, "magenta", f"⊕ collapse {len(p.merged)} result(s): {note}")
        elif isinstance(p, SkillStart):
            self._line(event, "blue", f"◆ skill {p.skill}: {_short(p.task)}")
        elif isinstance(p, BudgetExhausted):
            self._line(event, "bold red", f"■ {p.budget} budget of {p.limit} reached; branch stopped")
        elif isinstance(p, TaskComplete):
            self._line(event, "bold green", f"★ answer: {_short(p.answer, 100)}")
        elif isinstance(p, RunComplete):
            s = p.stats
            self.console.print(
                Text(
                    f"run {p.outcome}: {s.nodes} nodes, depth {s.max_depth}, "
                    f"{s.pruned} pruned, {s.loops_detected} loop(s) detected, {s.retries} retries",
                    style="bold",
                )
            )


def _node_label(node: Node) -> Text:
    label = Text()
    label.append(f"{node.kind} ", style=f"bold {_KIND_STYLE[node.kind]}")
    label.append(f"{node.id} ", style="dim")
    if isinstance(node, ToolNode):
        label.append(f"{node.tool_name}({_short(node.raw_args, 50)}) ")
        label.append(f"#{node.ordinal}/{node.limit} ", style="dim")
        if node.shadow_caught:
            label.append("[shadow catch] ", style="yellow")
    label.append(str(node.status), style=_STATUS_STYLE[node.status])
    label.append(f" · depth {node.depth}", style="dim")
    if isinstance(node, ThinkNode):
        if node.answer is not None:
            label.append(f" · answer: {_short(node.answer)}", style="bold")
        elif node.ended_by in ("prune", "budget", "error"):
            label.append(f" · ended by {node.ended_by}", style="yellow")
    elif isinstance(node, ToolNode):
        label.append(f" → {_short(node.result, 40)}", style="dim")
    elif isinstance(node, CollapseNode):
        note = f"compressed {node.size_before}→{node.size_after}" if node.compressed else f"{node.size_before} chars"
        label.append(f" · merged {len(node.merged)} · {note}", style="dim")
    if node.skill_stack:
        label.append(f" · skill {'/'.join(node.skill_stack)}", style="blue")
    return label


def _pruned_label(call: PrunedCall) -> Text:
    label = Text("✂ ", style="yellow")
    label.append("pruned " if not call.shadow else "shadow catch ", style="bold yellow")
    label.append(f"{call.tool}({_short(call.raw_arguments, 50)}) ")
    label.append(f"count {call.count} ≥ limit {call.limit} ({call.limit_source}) · {call.action}", style="yellow")
    if call.earlier_node_ids:
        label.append(f" · repeats {', '.join(call.earlier_node_ids)}", style="dim")
    return label


def render_tree(result: RunResult) -> Tree:
    """The run as a rich tree, each pruned call shown under the node that asked for it."""
    children: dict[str | None, list[Node]] = {}
    for node in result.nodes:
        children.setdefault(node.parent_id, []).append(node)
    stats = result.stats
    title = f"run {result.run_id} · {result.outcome} · {stats.nodes} nodes · {stats.pruned} pruned"
    root = Tree(Text(title), guide_style="dim")

    def add(branch: Tree, node: Node) -> None:
        sub = branch.add(_node_label(node))
        if isinstance(node, ThinkNode):
            for call in node.pruned:
                sub.add(_pruned_label(call))
        for child in children.get(node.id, []):
            add(sub, child)

    for top in children.get(None, []):
        add(root, top)
    return root


def tree_text(result: RunResult, width: int = 120, *, color: bool = False) -> str:
    """The rendered tree as plain text (for snapshots and logs)."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system="standard" if color else None, force_terminal=color)
    console.print(render_tree(result))
    return buffer.getvalue()
