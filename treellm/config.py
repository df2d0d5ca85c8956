"""Frozen, validated configuration: :class:`TreeConfig` and per-tool :class:`ToolLimits`.

Hard rules:

- Defaults live only in the dataclass fields below; the README's settings table
  is checked against them by a test.
- Values are validated when built, with "expected X, got Y" errors
  (:class:`~treellm.errors.ConfigError` naming the setting, and the file when
  one was read).
- Per-tool limits follow the limit precedence of ``docs/architecture.md``: a
  limits file (``tool_limits``, read by :meth:`TreeConfig.from_file`) > the
  tool's own settings in code > ``max_repeats_per_signature``.

The limits file is the TOML that ``treellm tune`` writes::

    [defaults]                 # optional: any TreeConfig field
    max_repeats_per_signature = 1

    [tools.fetch_url]          # one table per tool, every key optional
    max_repeats = 3
    on_repeat = "nudge"        # prune | nudge | cache
    mutates = false            # true: every successful call changes state
    mutates_when = {argument = "method", matches = "^(POST|PUT|DELETE)$"}
    error_when = ['^HTTP 5']   # regexes on the result text (replace the defaults)
    timeout_s = 30.0           # seconds a call may run (inf: no timeout)

    [tools.bash]
    classifier = "shell"       # shell | editor | none (default: shell for treellm.shell's shell tools)
    read_only = ['^python (reproduce|test)_\\w+\\.py$']  # commands that change nothing

``read_only`` lists regexes (``re.search``) on each unknown program of a shell tool's
command (its words joined by spaces, such as ``python reproduce.py``): when every
unknown program of a command matches, the command changes only what it is known to
write (a heredoc into a file still writes that file); ``mutates = true`` still wins.
``treellm tune`` proposes them from data.
``mutates_when`` is one ``{argument, matches}`` table or a list of them: a
successful call whose argument ``argument`` (its text; other values as JSON;
no ``argument``: the whole canonical arguments) matches the regex ``matches``
(``re.search``) changes state. What a state change and a failed call mean, and
the default ``error_when``, are in ``treellm.engine.repeats``.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from treellm.errors import ConfigError

__all__ = ["ArgumentPattern", "Branching", "Classifier", "RepeatAction", "ToolLimits", "TreeConfig"]

RepeatAction = Literal["prune", "nudge", "cache"]
Branching = Literal["collapse", "fork"]
Classifier = Literal["shell", "editor", "none"]
"""How a tool's arguments say whether a call writes: ``shell`` reads the command; ``editor``
reads a file editor's ``command`` (``view`` reads its ``path``, anything else writes it);
``none`` turns that off."""

MAX_ARGUMENT_DEPTH = 256
"""The highest ``max_argument_depth``: deeper values would strain Python's recursion limit in
the code that handles arguments after the check (handlers, telemetry redaction)."""

DEFAULT_SYSTEM_PROMPT = (
    "You are an agent that solves the user's task with the tools offered. "
    "Call tools when they help; when the task is done, call task_complete with the result."
)


def _expect(setting: str, ok: bool, expected: str, got: object, path: str | None = None) -> None:
    if not ok:
        where = f" in {path}" if path else ""
        raise ConfigError(f"{setting}{where}: expected {expected}, got {got!r}", setting=setting, path=path)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_timeout(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _is_regex(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        re.compile(value)
    except re.error:
        return False
    return True


@dataclass(frozen=True, slots=True)
class ArgumentPattern:
    """A call writes when its argument ``argument`` matches the regex ``matches`` (``re.search``).

    The argument's text is matched (a value that is not a string: its canonical
    JSON); ``argument=None`` matches the whole canonical arguments text. A call
    without the argument does not match. Invalid values raise ``ConfigError``.
    """

    argument: str | None
    matches: str

    def __post_init__(self) -> None:
        self.validate("mutates_when")

    def validate(self, setting: str, path: str | None = None) -> None:
        ok = self.argument is None or (isinstance(self.argument, str) and self.argument != "")
        _expect(f"{setting}.argument", ok, "an argument name", self.argument, path)
        _expect(f"{setting}.matches", _is_regex(self.matches), "a regular expression", self.matches, path)

    @classmethod
    def from_mapping(cls, data: object, setting: str, path: str | None = None) -> ArgumentPattern:
        _expect(setting, isinstance(data, Mapping), "a table {argument = ..., matches = ...}", data, path)
        assert isinstance(data, Mapping)
        for key in data:
            _expect(f"{setting}.{key}", key in ("argument", "matches"), "argument or matches", key, path)
        argument, matches = data.get("argument"), data.get("matches")
        ok = argument is None or (isinstance(argument, str) and argument != "")
        _expect(f"{setting}.argument", ok, "an argument name", argument, path)
        _expect(f"{setting}.matches", _is_regex(matches), "a regular expression", matches, path)
        return cls(argument, str(matches))


def _patterns(value: object, setting: str, path: str | None) -> tuple[ArgumentPattern, ...]:
    if not isinstance(value, list | tuple):
        return (ArgumentPattern.from_mapping(value, setting, path),)
    return tuple(ArgumentPattern.from_mapping(item, f"{setting}[{i}]", path) for i, item in enumerate(value))


@dataclass(frozen=True, slots=True)
class ToolLimits:
    """Settings for one tool read from a limits file; ``None`` means "not set there"."""

    max_repeats: int | None = None
    on_repeat: RepeatAction | None = None
    mutates: bool | None = None
    mutates_when: tuple[ArgumentPattern, ...] | None = None
    """Argument patterns that make a call a state change (any one matching)."""
    classifier: Classifier | None = None
    error_when: tuple[str, ...] | None = None
    """Regexes on the result text that mark a call failed; they replace the defaults."""
    read_only: tuple[str, ...] | None = None
    """Regexes on the unknown programs of a shell command (``python reproduce.py``) that change nothing."""
    timeout_s: float | None = None
    """Seconds one call of the tool may run (``inf``: no timeout)."""

    @classmethod
    def from_mapping(cls, tool: str, data: Mapping[str, Any], path: str | None = None) -> ToolLimits:
        known = {
            "max_repeats", "on_repeat", "mutates", "mutates_when", "classifier", "error_when", "read_only", "timeout_s"
        }  # fmt: skip
        for key in data:
            _expect(f"tools.{tool}.{key}", key in known, "one of " + ", ".join(sorted(known)), key, path)
        when = data.get("mutates_when")
        errors = data.get("error_when")
        read_only = data.get("read_only")
        for name, value in (("error_when", errors), ("read_only", read_only)):
            if value is not None:
                ok = isinstance(value, list | tuple)
                _expect(f"tools.{tool}.{name}", ok, "a list of regular expressions", value, path)
        limits = cls(
            data.get("max_repeats"),
            data.get("on_repeat"),
            data.get("mutates"),
            None if when is None else _patterns(when, f"tools.{tool}.mutates_when", path),
            data.get("classifier"),
            None if errors is None else tuple(errors),
            None if read_only is None else tuple(read_only),
            data.get("timeout_s"),
        )
        limits.validate(tool, path)
        return limits

    def validate(self, tool: str, path: str | None = None) -> None:
        if self.max_repeats is not None:
            ok = _is_int(self.max_repeats) and self.max_repeats >= 0
            _expect(f"tools.{tool}.max_repeats", ok, "an integer >= 0", self.max_repeats, path)
        if self.on_repeat is not None:
            ok = self.on_repeat in get_args(RepeatAction)
            _expect(f"tools.{tool}.on_repeat", ok, "prune, nudge or cache", self.on_repeat, path)
        if self.mutates is not None:
            _expect(f"tools.{tool}.mutates", isinstance(self.mutates, bool), "true or false", self.mutates, path)
        if self.mutates_when is not None:
            setting = f"tools.{tool}.mutates_when"
            ok = isinstance(self.mutates_when, tuple)
            _expect(setting, ok, "a tuple of ArgumentPattern", self.mutates_when, path)
            for i, pattern in enumerate(self.mutates_when):
                ok = isinstance(pattern, ArgumentPattern)
                _expect(f"{setting}[{i}]", ok, "{argument = ..., matches = ...}", pattern, path)
                pattern.validate(f"{setting}[{i}]", path)
        if self.classifier is not None:
            ok = self.classifier in get_args(Classifier)
            _expect(f"tools.{tool}.classifier", ok, "shell, editor or none", self.classifier, path)
        for name, regexes in (("error_when", self.error_when), ("read_only", self.read_only)):
            if regexes is None:
                continue
            setting = f"tools.{tool}.{name}"
            _expect(setting, isinstance(regexes, tuple), "a list of regular expressions", regexes, path)
            for i, regex in enumerate(regexes):
                _expect(f"{setting}[{i}]", _is_regex(regex), "a regular expression", regex, path)
        if self.timeout_s is not None:
            ok = _is_timeout(self.timeout_s)
            _expect(f"tools.{tool}.timeout_s", ok, "a number of seconds > 0", self.timeout_s, path)


@dataclass(frozen=True, slots=True)
class TreeConfig:
    """How a tree runs. Every default lives here and only here."""

    node_budget: int = 50
    """Most nodes (think, tool and collapse, skills included) one run may create."""
    depth_limit: int = 50
    """ThinkNodes exist at depths 0 .. depth_limit - 1 (a skill's sub-tree counts from 0)."""
    collapse_threshold: int = 4000
    """Characters of sibling tool results above which a CollapseNode asks for a summary."""
    retry_max_attempts: int = 3
    """Attempts of a failing tool handler, the first included."""
    retry_base_delay_s: float = 1.0
    """Delay before the second attempt; it doubles for each further attempt."""
    max_repeats_per_signature: int = 1
    """The default limit: identical calls that may run on one path."""
    branching: Branching = "collapse"
    """``collapse``: one CollapseNode merges sibling results; ``fork``: each tool result is a branch."""
    shadow: bool = False
    """Run every call, but report each call that would have been caught."""
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    """The system message of every root (and skill-less) ThinkNode context."""
    max_concurrency: int = 8
    """Most tool handlers and branches that run at once in one run."""
    tool_timeout_s: float | None = 300.0
    """Seconds one tool call may run before it fails as timed out (None or ``inf``: no timeout).

    A tool's own ``timeout_s`` and a limits file's ``timeout_s`` override it."""
    max_argument_depth: int = 64
    """Deepest nesting of arrays and objects a tool call's arguments may have (1 to 256)."""
    max_argument_bytes: int = 1_048_576
    """Largest tool call arguments, in bytes of JSON text."""
    tool_limits: Mapping[str, ToolLimits] = field(default_factory=dict)
    """Per-tool settings from a limits file; they override the tools' own."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, path: str | None = None) -> None:
        for name in ("node_budget", "depth_limit", "retry_max_attempts", "max_concurrency", "max_argument_bytes"):
            value = getattr(self, name)
            _expect(name, _is_int(value) and value >= 1, "an integer >= 1", value, path)
        for name in ("collapse_threshold", "max_repeats_per_signature"):
            value = getattr(self, name)
            _expect(name, _is_int(value) and value >= 0, "an integer >= 0", value, path)
        depth = self.max_argument_depth
        ok = _is_int(depth) and 1 <= depth <= MAX_ARGUMENT_DEPTH
        _expect("max_argument_depth", ok, f"an integer from 1 to {MAX_ARGUMENT_DEPTH}", depth, path)
        timeout = self.tool_timeout_s
        _expect("tool_timeout_s", timeout is None or _is_timeout(timeout), "a number of seconds > 0", timeout, path)
        delay = self.retry_base_delay_s
        ok = isinstance(delay, int | float) and not isinstance(delay, bool) and delay >= 0
        _expect("retry_base_delay_s", ok, "a number >= 0", delay, path)
        _expect("branching", self.branching in get_args(Branching), "collapse or fork", self.branching, path)
        _expect("shadow", isinstance(self.shadow, bool), "true or false", self.shadow, path)
        _expect("system_prompt", isinstance(self.system_prompt, str), "text", self.system_prompt, path)
        for tool, limits in self.tool_limits.items():
            _expect(f"tools.{tool}", isinstance(limits, ToolLimits), "a ToolLimits", limits, path)
            limits.validate(tool, path)

    def replace(self, **changes: Any) -> TreeConfig:
        """A copy with some fields changed (validated)."""
        return dataclasses.replace(self, **changes)

    @property
    def file_limits(self) -> dict[str, int]:
        """tool -> max_repeats, for the tools the limits file gives a limit."""
        return {t: lim.max_repeats for t, lim in self.tool_limits.items() if lim.max_repeats is not None}

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> TreeConfig:
        """Read a TOML limits file (see the module docstring); ``overrides`` win over it."""
        text_path = str(path)
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(f"limits file not found: {text_path}", path=text_path) from exc
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{text_path}: not valid TOML: {exc}", path=text_path) from exc
        return cls.from_mapping(data, path=text_path, **overrides)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, path: str | None = None, **overrides: Any) -> TreeConfig:
        """Build from the parsed limits-file structure (``defaults`` and ``tools`` tables)."""
        for key in data:
            _expect(key, key in ("defaults", "tools"), "a [defaults] or [tools.NAME] table", key, path)
        defaults = dict(data.get("defaults", {}))
        fields = {f.name for f in dataclasses.fields(cls)} - {"tool_limits"}
        for key in defaults:
            _expect(f"defaults.{key}", key in fields, "a TreeConfig setting", key, path)
        tools_data = data.get("tools", {})
        _expect("tools", isinstance(tools_data, Mapping), "a table of tools", tools_data, path)
        tool_limits = {}
        for tool, table in tools_data.items():
            _expect(f"tools.{tool}", isinstance(table, Mapping), "a table", table, path)
            tool_limits[tool] = ToolLimits.from_mapping(tool, table, path)
        merged: dict[str, Any] = {**defaults, "tool_limits": tool_limits, **overrides}
        try:
            return cls(**merged)
        except ConfigError as exc:
            if path is None or exc.path is not None:
                raise
            raise ConfigError(f"{exc} (in {path})", setting=exc.setting, path=path) from exc
