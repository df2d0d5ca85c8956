"""Nodes of an execution tree and the record of a caught call, as frozen values.

- **depth** (as in tree-llm): the root ThinkNode is 0; its ToolNodes and its
  CollapseNode take its depth; its child ThinkNodes are depth + 1. A skill's
  sub-tree counts its own depth from 0 and records the skill stack.
- A caught call is never a node: it is a :class:`PrunedCall` on the ThinkNode
  that asked for it.
- A node changes status over time; the run replaces the stored value
  (``dataclasses.replace``) rather than mutating it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from treellm.config import RepeatAction
from treellm.loop import LimitSource
from treellm.models.base import Usage

__all__ = [
    "CollapseNode",
    "Node",
    "NodeKind",
    "NodeStatus",
    "PrunedCall",
    "ThinkNode",
    "ToolErrorType",
    "ToolNode",
]

ToolErrorType = Literal["tool_error", "timeout", "arguments_too_large", "unserializable_result"]
"""Why a ToolNode failed: the handler raised, its result matched ``error_when``, the arguments
were malformed or the tool unknown (``tool_error``); it ran past its timeout (``timeout``); its
arguments were deeper or bigger than the limits (``arguments_too_large``); its handler returned a
value that cannot be turned into text (``unserializable_result``)."""


class NodeKind(StrEnum):
    THINK = "think"
    TOOL = "tool"
    COLLAPSE = "collapse"


class NodeStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class PrunedCall:
    """A call caught by the loop check (or, in shadow mode, one that would have been).

    ``earlier_node_ids`` are the ToolNodes of the earlier identical calls on the
    path, oldest first (``None`` for a call accepted earlier in the same turn
    whose node had no id yet is never stored: those get their node ids).
    """

    tool: str
    call_id: str
    raw_arguments: str
    arguments: Any
    signature: str
    count: int
    limit: int
    limit_source: LimitSource
    action: RepeatAction
    shadow: bool
    earlier_node_ids: tuple[str, ...]
    answer: str | None = None
    """The tool result sent back to the model (nudge and cache), else None."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _NodeBase:
    id: str
    parent_id: str | None
    depth: int
    status: NodeStatus = NodeStatus.PENDING
    skill_stack: tuple[str, ...] = ()
    started_ns: int | None = None
    ended_ns: int | None = None
    error: str | None = None

    def with_(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, slots=True, kw_only=True)
class ThinkNode(_NodeBase):
    """One model turn: its text, the calls it asked for and what the loop check did."""

    kind: Literal[NodeKind.THINK] = NodeKind.THINK
    model: str = ""
    text: str = ""
    requested_calls: int = 0
    pruned: tuple[PrunedCall, ...] = ()
    answer: str | None = None
    """Set when this node completed its branch (task_complete, or a text answer)."""
    usage: Usage | None = None
    ended_by: Literal["answer", "prune", "budget", "error", "children", "none"] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolNode(_NodeBase):
    """One executed (or attempted) tool call."""

    kind: Literal[NodeKind.TOOL] = NodeKind.TOOL
    tool_name: str
    call_id: str
    args: Any
    """The parsed arguments (a ``RawArguments`` when the text was not JSON)."""
    raw_args: str
    signature: str
    ordinal: int
    limit: int
    limit_source: LimitSource
    result: str | None = None
    result_hash: str | None = None
    attempts: int = 0
    shadow_caught: bool = False
    """True when shadow mode ran a call that the loop check would have caught."""
    error_type: ToolErrorType | None = None
    """Why the call failed (None while running and when it succeeded)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CollapseNode(_NodeBase):
    """Merges the results of one turn's sibling calls before the branch continues."""

    kind: Literal[NodeKind.COLLAPSE] = NodeKind.COLLAPSE
    merged: tuple[str, ...] = ()
    compressed: bool = False
    size_before: int = 0
    size_after: int = 0
    summary: str | None = None
    """The model's dense summary, when the results were compressed."""


Node = ThinkNode | ToolNode | CollapseNode
