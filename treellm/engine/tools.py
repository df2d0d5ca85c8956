"""Tools and skills as declared by users, and the built-in ``task_complete``.

A :class:`Tool` handler receives the parsed arguments as one dict, may be sync
(run in a thread of its own so it never blocks the run's event loop) or async,
and returns text or anything JSON-able. A handler that raises is the tool's
fault: the executor retries it and finally sends the error back to the model.

Each call runs under a timeout (:func:`tool_timeout`): a call that runs longer
fails with "tool X timed out after N s" and is not retried (a hung tool rarely
recovers, and a retry would start a second copy beside the first). An async
handler is cancelled (one that swallows the cancellation, or blocks the event
loop without awaiting, cannot be stopped). A sync handler's thread cannot be
stopped either, so it is abandoned: a daemon thread that runs on until the
handler returns, whose result is dropped, which no longer counts against
``max_concurrency`` and never keeps the process alive; the run does not wait
for it. A handler runs once per attempt whatever happens to its result: a value
:func:`result_text` cannot turn into text (a circular structure, keys that are
not strings, an object whose ``str()`` raises) makes the call fail with an error
result ("returned a value that cannot be sent to the model"), never a retry and
never a ``str()`` guess.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from treellm.config import ArgumentPattern, Classifier, RepeatAction, TreeConfig
from treellm.engine.repeats import MutatesWhen, ToolRule, ToolSettings
from treellm.errors import ConfigError, ToolDefinitionError
from treellm.models.base import ToolSpec

__all__ = [
    "SKILL_PREFIX",
    "TASK_COMPLETE",
    "TASK_COMPLETE_SPEC",
    "Handler",
    "Skill",
    "Tool",
    "result_hash",
    "result_text",
    "tool_timeout",
]

Handler = Callable[[dict[str, Any]], Any | Awaitable[Any]]

TASK_COMPLETE = "task_complete"
SKILL_PREFIX = "skill_"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_OBJECT_SCHEMA: Mapping[str, Any] = {"type": "object", "properties": {}}

TASK_COMPLETE_SPEC = ToolSpec(
    TASK_COMPLETE,
    "Finish this branch of the task: give the final result (and optionally a short summary).",
    {
        "type": "object",
        "properties": {
            "result": {"type": "string", "description": "the final answer"},
            "summary": {"type": "string", "description": "how it was reached, briefly"},
        },
        "required": ["result"],
    },
)


def _check_name(name: object, what: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ToolDefinitionError(
            f"{what} name: expected 1-64 letters, digits, '_', '.' or '-', got {name!r}", tool=str(name)
        )


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool the model may call.

    ``max_repeats`` overrides the default limit for this tool (a limits file
    overrides both); ``on_repeat`` says what to do with a caught call
    (``prune``, ``nudge`` or ``cache``). The state-change and failure rule
    (:class:`~treellm.engine.repeats.ToolRule`): ``mutates`` says every
    successful call changes state, ``mutates_when`` which arguments do,
    ``classifier="shell"`` reads a shell command (the default for the tools in
    ``treellm.shell.DEFAULT_SHELL_TOOLS``; ``"none"`` turns it off), and
    ``error_when`` lists regexes on the result text that mark a call failed
    (``None``: the defaults). A successful state change restarts the counts
    of every other call on its path; its own keeps counting. ``timeout_s``
    overrides ``TreeConfig.tool_timeout_s`` for this tool (``math.inf``: none).
    """

    name: str
    description: str
    parameters: Mapping[str, Any] = field(default_factory=lambda: dict(_OBJECT_SCHEMA))
    handler: Handler | None = None
    max_repeats: int | None = None
    on_repeat: RepeatAction = "prune"
    mutates: bool = False
    mutates_when: MutatesWhen | Sequence[ArgumentPattern] | None = None
    classifier: Classifier | None = None
    error_when: Sequence[str] | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        _check_name(self.name, "tool")
        if self.name == TASK_COMPLETE or self.name.startswith(SKILL_PREFIX):
            raise ToolDefinitionError(f"tool name {self.name!r} is reserved", tool=self.name)
        if self.handler is None or not callable(self.handler):
            raise ToolDefinitionError(f"tool {self.name!r}: expected a callable handler", tool=self.name)
        limit = self.max_repeats
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ToolDefinitionError(
                f"tool {self.name!r}: max_repeats: expected an integer >= 0, got {limit!r}", tool=self.name
            )
        if self.on_repeat not in ("prune", "nudge", "cache"):
            raise ToolDefinitionError(
                f"tool {self.name!r}: on_repeat: expected prune, nudge or cache, got {self.on_repeat!r}",
                tool=self.name,
            )
        timeout = self.timeout_s
        number = isinstance(timeout, int | float) and not isinstance(timeout, bool)
        if timeout is not None and not (number and timeout > 0):
            raise ToolDefinitionError(
                f"tool {self.name!r}: timeout_s: expected a number of seconds > 0, got {timeout!r}", tool=self.name
            )
        try:
            self.rule  # noqa: B018 -- validates the rule's fields
        except ConfigError as exc:
            raise ToolDefinitionError(f"tool {self.name!r}: {exc}", tool=self.name) from exc

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    @property
    def rule(self) -> ToolRule:
        """The tool's own state-change and failure rule (a limits file may override it)."""
        return ToolRule(self.mutates, self.mutates_when, self.classifier, self.error_when)

    @property
    def settings(self) -> ToolSettings:
        """The tool's own repeat settings, for :class:`~treellm.engine.repeats.RepeatPolicy`."""
        return ToolSettings(self.max_repeats, self.on_repeat, self.rule)


@dataclass(frozen=True, slots=True)
class Skill:
    """A sub-agent offered to the model as the tool ``skill_<name>``.

    A call runs a sub-tree with its own empty path, depth from 0, its own
    system prompt, and ``tools`` (default: the caller's) and ``config``
    (default: the caller's); its answer is the tool result.
    """

    name: str
    description: str
    system_prompt: str
    tools: Sequence[Tool] | None = None
    config: TreeConfig | None = None

    def __post_init__(self) -> None:
        _check_name(self.name, "skill")

    @property
    def tool_name(self) -> str:
        return SKILL_PREFIX + self.name

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(
            self.tool_name,
            self.description,
            {
                "type": "object",
                "properties": {"task": {"type": "string", "description": "what the skill should do"}},
                "required": ["task"],
            },
        )


def tool_timeout(tool: Tool, config: TreeConfig) -> float | None:
    """Seconds a call of ``tool`` may run, or None for no timeout.

    A limits file's ``timeout_s`` > the tool's own ``timeout_s`` > ``config.tool_timeout_s``;
    ``inf`` means no timeout.
    """
    filed = config.tool_limits.get(tool.name)
    if filed is not None and filed.timeout_s is not None:
        timeout: float | None = filed.timeout_s
    elif tool.timeout_s is not None:
        timeout = tool.timeout_s
    else:
        timeout = config.tool_timeout_s
    return None if timeout is None or math.isinf(timeout) else float(timeout)


def result_text(value: object) -> str:
    """A handler's return value as the text the model sees.

    Raises (``TypeError``, ``ValueError``, ``RecursionError``...) when the value
    is not text and cannot be JSON-encoded (a circular structure, keys that are
    not strings, an object whose ``str()`` raises): the caller decides what that means.
    """
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False, default=str)


def result_hash(text: str) -> str:
    """A stable 64-bit hash of a result text (hex), recorded even when content is not."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
