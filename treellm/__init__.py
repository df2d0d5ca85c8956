"""treellm: path-local loop detection, tracing and analysis for LLM agents that run as a tree.

The public API. Importing treellm has no side effects: nothing is configured,
no provider is installed, no file is opened. It needs only the core install (the
detector, executor, guard, OpenTelemetry SDK, JSONL exporter); ``OpenAICompatibleModel``
is imported when first used and needs the ``openai`` extra.
"""

import typing as _typing

from treellm._version import __version__
from treellm.agent import TreeExecutor
from treellm.config import ArgumentPattern, ToolLimits, TreeConfig
from treellm.engine.events import Chunk, ChunkType, Event, EventType, RunStats
from treellm.engine.executor import BranchAnswer, RunResult
from treellm.engine.nodes import CollapseNode, NodeKind, NodeStatus, PrunedCall, ThinkNode, ToolNode
from treellm.engine.repeats import ToolRule
from treellm.engine.tools import Skill, Tool
from treellm.errors import (
    ConfigError,
    IngestError,
    MissingExtraError,
    ModelError,
    ScriptExhaustedError,
    StoreBusyError,
    StoreError,
    ToolDefinitionError,
    TreeLLMError,
)
from treellm.exporters.jsonl import OTLPJsonlSpanExporter
from treellm.guard import GuardDecision, LoopGuard
from treellm.loop import CallKey, LoopDecision, LoopDetector, PathSignatures
from treellm.models.base import ChatModel, ModelRequest, ModelTurn, ToolCall, Usage
from treellm.models.scripted import ScriptedModel
from treellm.setup import configure
from treellm.signature import RawArguments, canonical_json, parse_arguments, signature, stable_hash

__all__ = [
    "ArgumentPattern",
    "BranchAnswer",
    "CallKey",
    "ChatModel",
    "Chunk",
    "ChunkType",
    "CollapseNode",
    "ConfigError",
    "Event",
    "EventType",
    "GuardDecision",
    "IngestError",
    "LoopDecision",
    "LoopDetector",
    "LoopGuard",
    "MissingExtraError",
    "ModelError",
    "ModelRequest",
    "ModelTurn",
    "NodeKind",
    "NodeStatus",
    "OTLPJsonlSpanExporter",
    "OpenAICompatibleModel",
    "PathSignatures",
    "PrunedCall",
    "RawArguments",
    "RunResult",
    "RunStats",
    "ScriptExhaustedError",
    "ScriptedModel",
    "Skill",
    "StoreBusyError",
    "StoreError",
    "ThinkNode",
    "Tool",
    "ToolCall",
    "ToolDefinitionError",
    "ToolLimits",
    "ToolNode",
    "ToolRule",
    "TreeConfig",
    "TreeExecutor",
    "TreeLLMError",
    "Usage",
    "__version__",
    "canonical_json",
    "configure",
    "parse_arguments",
    "signature",
    "stable_hash",
]


if _typing.TYPE_CHECKING:
    from treellm.models.openai import OpenAICompatibleModel


def __getattr__(name: str) -> _typing.Any:
    if name == "OpenAICompatibleModel":  # needs the openai extra: imported on first use
        from treellm.models.openai import OpenAICompatibleModel

        return OpenAICompatibleModel
    raise AttributeError(f"module 'treellm' has no attribute {name!r}")
