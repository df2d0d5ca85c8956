"""Everything treellm raises derives from :class:`TreeLLMError`.

::

    TreeLLMError
    ├── ConfigError            a setting or limits file is invalid (names the setting)
    ├── ModelError             the chat model failed (HTTP status, transport, protocol)
    ├── ScriptExhaustedError   a ScriptedModel ran out of turns (a bug in the script: propagates)
    └── ToolDefinitionError    a tool or skill is declared wrongly (names the tool)

Third-party errors are re-raised ``from exc`` where the library is called. A
model's or a tool's fault during a run (bad JSON arguments, a failing handler, a
loop, a spent budget) is data on the node, not an exception.
"""

from __future__ import annotations

__all__ = ["ConfigError", "ModelError", "ScriptExhaustedError", "ToolDefinitionError", "TreeLLMError"]


class TreeLLMError(Exception):
    """The root of every error treellm raises."""


class ConfigError(TreeLLMError):
    """A setting, environment variable or limits file holds an invalid value."""

    def __init__(self, message: str, *, setting: str | None = None, path: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting
        self.path = path


class ModelError(TreeLLMError):
    """The chat model could not produce a turn."""

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable


class ScriptExhaustedError(TreeLLMError):
    """A :class:`~treellm.ScriptedModel` was asked for more turns than it holds."""

    def __init__(self, message: str, *, requests: int) -> None:
        super().__init__(message)
        self.requests = requests


class ToolDefinitionError(TreeLLMError):
    """A tool or skill is declared wrongly (duplicate name, bad limit, reserved name)."""

    def __init__(self, message: str, *, tool: str) -> None:
        super().__init__(message)
        self.tool = tool
