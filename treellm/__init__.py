"""treellm: path-local loop detection, tracing and analysis for LLM agents that run as a tree.

The public API. Importing treellm has no side effects: nothing is configured,
no provider is installed, no file is opened. It needs only the core install (the
detector, executor, guard, OpenTelemetry SDK, JSONL exporter); ``OpenAICompatibleModel``
needs the ``openai`` extra. Most names are imported when first used (:data:`_LAZY`).
"""

import typing as _typing

from treellm._lazy import lazy_names as _lazy_names
from treellm._version import __version__
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
from treellm.signature import RawArguments, canonical_json, parse_arguments, signature, stable_hash

if _typing.TYPE_CHECKING:
    from treellm.agent import TreeExecutor
    from treellm.config import ArgumentPattern, ToolLimits, TreeConfig
    from treellm.engine.events import Chunk, ChunkType, Event, EventType, RunStats
    from treellm.engine.executor import BranchAnswer, RunResult
    from treellm.engine.nodes import CollapseNode, NodeKind, NodeStatus, PrunedCall, ThinkNode, ToolNode
    from treellm.engine.repeats import ToolRule
    from treellm.engine.tools import Skill, Tool
    from treellm.exporters.jsonl import OTLPJsonlSpanExporter
    from treellm.guard import GuardDecision, LoopGuard
    from treellm.loop import CallKey, LoopDecision, LoopDetector, PathSignatures
    from treellm.models.base import ChatModel, ModelRequest, ModelTurn, ToolCall, Usage
    from treellm.models.openai import OpenAICompatibleModel
    from treellm.models.scripted import ScriptedModel
    from treellm.setup import configure

_LAZY = {
    "TreeExecutor": "treellm.agent",
    **dict.fromkeys(("ArgumentPattern", "ToolLimits", "TreeConfig"), "treellm.config"),
    **dict.fromkeys(("Chunk", "ChunkType", "Event", "EventType", "RunStats"), "treellm.engine.events"),
    **dict.fromkeys(("BranchAnswer", "RunResult"), "treellm.engine.executor"),
    **dict.fromkeys(
        ("CollapseNode", "NodeKind", "NodeStatus", "PrunedCall", "ThinkNode", "ToolNode"), "treellm.engine.nodes"
    ),
    "ToolRule": "treellm.engine.repeats",
    **dict.fromkeys(("Skill", "Tool"), "treellm.engine.tools"),
    "OTLPJsonlSpanExporter": "treellm.exporters.jsonl",
    **dict.fromkeys(("GuardDecision", "LoopGuard"), "treellm.guard"),
    **dict.fromkeys(("CallKey", "LoopDecision", "LoopDetector", "PathSignatures"), "treellm.loop"),
    **dict.fromkeys(("ChatModel", "ModelRequest", "ModelTurn", "ToolCall", "Usage"), "treellm.models.base"),
    "OpenAICompatibleModel": "treellm.models.openai",  # needs the openai extra
    "ScriptedModel": "treellm.models.scripted",
    "configure": "treellm.setup",
}
"""The public names imported on first use (PEP 562), each from its module: a command of the CLI
(``treellm ingest``, ``report``) imports none of the executor, the engine, the models or the
OpenTelemetry setup (0.35-0.4 s of the 0.7 s a command took to start, BENCHMARKS.md, "Batched
ingest"). The errors and the signature are imported here: every command needs them, and the
module ``treellm.signature`` would otherwise hide the function ``signature`` once anything
imported it."""


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


__getattr__, __dir__ = _lazy_names(globals(), _LAZY)
