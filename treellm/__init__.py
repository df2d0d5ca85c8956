"""treellm: path-local loop detection, tracing and analysis for LLM agents that run as a tree.

The public API. Importing treellm has no side effects: nothing is configured,
no provider is installed, no file is opened.
"""

from treellm._version import __version__
from treellm.errors import ConfigError, ModelError, ScriptExhaustedError, ToolDefinitionError, TreeLLMError
from treellm.loop import CallKey, LoopDecision, LoopDetector, PathSignatures
from treellm.signature import RawArguments, canonical_json, parse_arguments, signature, stable_hash

__all__ = [
    "CallKey",
    "ConfigError",
    "LoopDecision",
    "LoopDetector",
    "ModelError",
    "PathSignatures",
    "RawArguments",
    "ScriptExhaustedError",
    "ToolDefinitionError",
    "TreeLLMError",
    "__version__",
    "canonical_json",
    "parse_arguments",
    "signature",
    "stable_hash",
]
