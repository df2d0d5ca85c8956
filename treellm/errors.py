"""Everything treellm raises derives from :class:`TreeLLMError`.

::

    TreeLLMError
    ├── ConfigError            a setting or limits file is invalid (names the setting)
    ├── MissingExtraError      a feature needs an optional extra that is not installed
    ├── ModelError             the chat model failed (HTTP status, transport, protocol)
    ├── ScriptExhaustedError   a ScriptedModel ran out of turns (a bug in the script: propagates)
    ├── ToolDefinitionError    a tool or skill is declared wrongly (names the tool)
    └── StoreError             the DuckDB store cannot be opened, read or written
        ├── IngestError        an input file is malformed (names the file, line and reason)
        └── StoreBusyError     another process holds the store's write lock

Third-party errors are re-raised ``from exc`` where the library is called. A
model's or a tool's fault during a run (bad JSON arguments, a failing handler, a
loop, a spent budget) is data on the node, not an exception.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "IngestError",
    "MissingExtraError",
    "ModelError",
    "ScriptExhaustedError",
    "StoreBusyError",
    "StoreError",
    "ToolDefinitionError",
    "TreeLLMError",
    "require_extra",
]


class TreeLLMError(Exception):
    """The root of every error treellm raises."""


class ConfigError(TreeLLMError):
    """A setting, environment variable or limits file holds an invalid value."""

    def __init__(self, message: str, *, setting: str | None = None, path: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting
        self.path = path


class MissingExtraError(TreeLLMError, ImportError):
    """A feature needs an optional extra (``pip install 'treellm[EXTRA]'``) that is missing.

    Also an :class:`ImportError`, so code that probes for a feature with ``except
    ImportError`` keeps working."""

    def __init__(self, feature: str, extra: str, missing: str) -> None:
        super().__init__(
            f"{feature} needs the optional extra {extra!r} (missing module {missing!r}): pip install 'treellm[{extra}]'"
        )
        self.feature = feature
        self.extra = extra
        self.missing = missing


def require_extra(feature: str, extra: str, *modules: str) -> None:
    """Raise :class:`MissingExtraError` when one of ``modules`` cannot be imported."""
    import importlib.util

    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(feature, extra, module)


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


class StoreError(TreeLLMError):
    """The store cannot be opened, read or written."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class IngestError(StoreError):
    """An input file (or one record in it) is malformed.

    ``line`` is the 1-based line of a line-oriented file, ``record`` the 0-based index
    of a record (a span, a run, a protobuf message) when there are no lines.
    """

    def __init__(
        self, message: str, *, path: str | None = None, line: int | None = None, record: int | None = None
    ) -> None:
        where = path or "<input>"
        if line is not None:
            where += f":{line}"
        elif record is not None:
            where += f" (record {record})"
        super().__init__(f"{where}: {message}", path=path)
        self.reason = message
        self.line = line
        self.record = record


class StoreBusyError(StoreError):
    """Another process holds the DuckDB write lock (retry later)."""
