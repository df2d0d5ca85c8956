"""Terminal presentation of a run (rich): a live log while it goes, then its tree.

Presentation only: reads events and ``RunResult`` values, never changes them.
Everything from a trace (names, ids, arguments, results, model text) is untrusted and goes
through :func:`terminal_text`: a ``rich.text.Text`` (never console markup, so ``[red]`` is
shown as typed) in which every control character is a visible escape (so no escape
sequence, carriage return or bell reaches the terminal). ``treellm.cli`` uses it too.
"""

from __future__ import annotations

import io
import re

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

__all__ = ["LiveLog", "render_tree", "terminal_text", "tree_text"]

_KIND_STYLE = {"think": "cyan", "tool": "green", "collapse": "magenta"}
_STATUS_STYLE = {"completed": "green", "failed": "red", "running": "yellow", "pending": "dim"}


# C0 controls but newline and tab (ESC, CR, BEL, backspace...), DEL, C1 controls (CSI 0x9b,
# OSC 0x9d...), Unicode line separators and bidirectional controls.
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_LINE_BREAKS = re.compile(r"[\n\t]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(match.group()) or (
        f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    )


def terminal_text(value: object, style: str = "", *, keep_lines: bool = False) -> Text:
    """``value`` (any string from a trace) as rich text that prints exactly as typed.

    A ``rich.text.Text``, so console markup such as ``[bold]`` is shown, not applied; and
    every control character a terminal would act on (C0 such as ESC, CR and BEL, DEL, C1
    such as CSI ``\\x9b``, Unicode line separators and bidirectional overrides) is
    replaced by a visible escape (``\\x1b``, ``\\r``, ``\\u202e``). Newlines and tabs are
    escaped too, unless ``keep_lines`` (a table cell or a block of text may hold them).
    ``None`` is the empty text.
    """
    text = "" if value is None else str(value)
    text = _UNSAFE.sub(_visible, text)
    if not keep_lines:
        text = _LINE_BREAKS.sub(_visible, text)
    return Text(text, style=style)


def _short(text: object, limit: int = 60) -> str:
    """One line of at most ``limit`` characters (print it through :func:`terminal_text`)."""
    flat = " ".join(("" if text is None else str(text)).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class LiveLog:
    """An observer that prints one line per step of a run to a rich console."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)

    def _line(self, event: Event, style: str, message: str) -> None:
        indent = "  " * (event.depth + len(event.skill_stack))
        line = Text(indent)
        line.append(terminal_text(f"{event.node_id or '':>4} ", "dim"))
        line.append(terminal_text(message, style))
        self.console.print(line, soft_wrap=True)

    def __call__(self, event: Event) -> None:
        p = event.payload
        if isinstance(p, ThinkComplete):
            if p.ended_by == "error":
                self._line(event, "red", f"✗ think failed: {p.error or 'no reason given'}")
                return
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
    label.append(terminal_text(f"{node.id} ", "dim"))
    if isinstance(node, ToolNode):
        label.append(terminal_text(f"{node.tool_name}({_short(node.raw_args, 50)}) "))
        label.append(f"#{node.ordinal}/{node.limit} ", style="dim")
        if node.shadow_caught:
            label.append("[shadow catch] ", style="yellow")
    label.append(str(node.status), style=_STATUS_STYLE[node.status])
    label.append(f" · depth {node.depth}", style="dim")
    if isinstance(node, ThinkNode):
        if node.answer is not None:
            label.append(terminal_text(f" · answer: {_short(node.answer)}", "bold"))
        elif node.ended_by in ("prune", "budget", "error"):
            label.append(f" · ended by {node.ended_by}", style="yellow")
            if node.ended_by == "error" and node.error:
                label.append(terminal_text(f": {_short(node.error, 160)}", "yellow"))
    elif isinstance(node, ToolNode):
        label.append(terminal_text(f" → {_short(node.result, 40)}", "dim"))
    elif isinstance(node, CollapseNode):
        note = f"compressed {node.size_before}→{node.size_after}" if node.compressed else f"{node.size_before} chars"
        label.append(f" · merged {len(node.merged)} · {note}", style="dim")
    if node.skill_stack:
        label.append(terminal_text(f" · skill {'/'.join(node.skill_stack)}", "blue"))
    return label


def _pruned_label(call: PrunedCall) -> Text:
    label = Text("✂ ", style="yellow")
    label.append("pruned " if not call.shadow else "shadow catch ", style="bold yellow")
    label.append(terminal_text(f"{call.tool}({_short(call.raw_arguments, 50)}) "))
    label.append(
        terminal_text(f"count {call.count} ≥ limit {call.limit} ({call.limit_source}) · {call.action}", "yellow")
    )
    if call.earlier_node_ids:
        label.append(terminal_text(f" · repeats {', '.join(call.earlier_node_ids)}", "dim"))
    return label


def render_tree(result: RunResult) -> Tree:
    """The run as a rich tree, each pruned call shown under the node that asked for it."""
    children: dict[str | None, list[Node]] = {}
    for node in result.nodes:
        children.setdefault(node.parent_id, []).append(node)
    stats = result.stats
    title = f"run {result.run_id} · {result.outcome} · {stats.nodes} nodes · {stats.pruned} pruned"
    root = Tree(terminal_text(title), guide_style="dim")

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
