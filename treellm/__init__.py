"""treellm: path-local loop detection, tracing and analysis for LLM agents that run as a tree.

The public API. Importing treellm has no side effects: nothing is configured,
no provider is installed, no file is opened.
"""

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
from treellm.models.openai import OpenAICompatibleModel
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
