"""The repeat rules, once: state changes, failures, per-tool precedence and the texts of a catch.

Used by the engine (``run.py``), by :class:`~treellm.LoopGuard` and by the
analysis of stored calls, so the three count, fail and answer alike.

- **state change** (``docs/architecture.md``): a *successful* call of a tool
  marked ``mutates``, or a successful call whose arguments the tool's rule
  marks as writing: ``mutates_when`` (a callable, or argument patterns), the
  shell classifier for shell tools (``treellm.shell.command_targets`` of the
  command: ``write`` and ``unknown`` both count as writing; a call whose command
  cannot be found counts as ``unknown``), or the editor classifier (a
  ``command`` other than ``view``). ``read_only`` patterns are matched against each
  unknown program of a shell command (its words joined by spaces, such as
  ``python reproduce.py``): when every one matches, the command changes only
  what it is known to write.
- **targets** (:func:`call_targets`): what a call reads and what its state
  change writes, ``None`` where that cannot be known. Shell commands: the
  paths the parser names. Other tools: a path argument (:data:`PATH_ARGUMENTS`)
  is read, and written when the call changes state. A state change restarts
  the counts of the calls on its path that read what it wrote (or write it: a
  restore after an edit does new work), and of calls whose reads are unknown;
  a write to unknown targets restarts every count; its own signature keeps
  counting (:meth:`treellm.loop.PathSignatures.extend`,
  :meth:`RepeatPolicy.extend`).
- **failed call**: the tool raised, its span status is ERROR, or its result
  text matches one of the rule's ``error_when`` regexes (``re.search``);
  :data:`DEFAULT_ERROR_WHEN` applies when a rule sets none. A failed call
  counts on its path but never changes state.
- **oversized arguments**: arguments nested deeper than the config's
  ``max_argument_depth`` or bigger than its ``max_argument_bytes`` are never
  parsed (:func:`oversized_arguments`): the executor rejects the call, and both
  it and the guard record only a ``RawArguments`` preview of them, so no deep
  value reaches an observer.
- **precedence** per tool: a limits file (``TreeConfig.tool_limits``) > the
  tool's own settings in code (:class:`ToolSettings`) > the defaults (the
  config's ``max_repeats_per_signature``, action ``prune``, :class:`ToolRule`'s
  defaults, ``classifier="shell"`` for ``treellm.shell.DEFAULT_SHELL_TOOLS``).

Hard rules: pure (no I/O, clocks or run state); the functions take frozen
values and never raise on a call's data (bad rules raise ``ConfigError`` when
built). Nothing here imports the run, the executor or telemetry, so the store
and the analysis may import it.
"""

from __future__ import annotations

import functools
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias, get_args

from treellm.config import ArgumentPattern, Classifier, RepeatAction, ToolLimits, TreeConfig
from treellm.engine.nodes import PrunedCall
from treellm.errors import ConfigError
from treellm.loop import CallKey, LimitSource, LoopDecision, LoopDetector, Paths, PathSignatures
from treellm.shell import DEFAULT_SHELL_TOOLS, CommandTargets, command_targets, command_text
from treellm.signature import RawArguments, arguments_problem, canonical_json, parse_arguments

__all__ = [
    "DEFAULT_ERROR_NEEDS",
    "DEFAULT_ERROR_WHEN",
    "DEFAULT_EDITOR_TOOLS",
    "PATH_ARGUMENTS",
    "ArgumentPattern",
    "CallTargets",
    "Classifier",
    "MutatesWhen",
    "RepeatPolicy",
    "ToolRule",
    "ToolSettings",
    "answer_text",
    "call_targets",
    "changes_state",
    "is_failure",
    "loop_message",
    "merge_rule",
    "oversized_arguments",
    "preview",
    "pruned_call",
]

PREVIEW_CHARS = 2000
"""How much of oversized arguments a node, an event or a chunk shows."""

MutatesWhen: TypeAlias = Callable[[object], bool] | ArgumentPattern | tuple[ArgumentPattern, ...]
"""A predicate on the parsed arguments, or argument patterns (any one matching)."""

DEFAULT_EDITOR_TOOLS: tuple[str, ...] = ("str_replace_editor", "str_replace_based_edit_tool")
"""Tools read by the ``editor`` classifier unless their rule says otherwise."""

PATH_ARGUMENTS: tuple[str, ...] = (
    "path", "file_path", "filepath", "file", "filename", "target_file", "absolute_path", "relative_path",
    "notebook_path",
)  # fmt: skip
"""Arguments of a tool that is not a shell which name the file a call reads (or writes)."""

DEFAULT_ERROR_WHEN: tuple[str, ...] = (
    # a non-zero return code, as shell tools report it: <returncode>2</returncode>
    r"<returncode>\s*-?\s*0*[1-9]\d*\s*</returncode>",
    # a Python traceback anywhere in the text
    r"Traceback \(most recent call last\):",
    # a leading "Error:" / "error:"
    r"\A\s*[Ee]rror:",
    # an editor that refused the change (SWE-agent's linter: "Your changes have NOT been applied"),
    # as a word: the words first and the boundary before them looked behind, so the regex engine
    # looks for the words as a literal (7 us a result with a leading \b, 0.4 us so)
    r"changes have NOT been applied\b(?<!\wchanges have NOT been applied)",
    # a JSON object with a top-level "error" key (after at most one level of nested objects)
    # whose value is not null, false or empty
    r'\A\s*\{(?:[^{}"]|"(?:[^"\\]|\\.)*"|\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\})*?'
    r'"error"\s*:(?!\s*(?:null\b|false\b|""|\[\s*\]|\{\s*\}))',
)
"""The failure rule of a tool that sets no ``error_when``."""

DEFAULT_ERROR_NEEDS: tuple[str, ...] = (
    "</returncode>",
    "Traceback (most recent call last):",
    "rror:",
    "changes have NOT been applied",
    '"error"',
)
"""The literal part of each pattern of :data:`DEFAULT_ERROR_WHEN`, in the same order: a pattern
matches only a text that holds its part (``rror:`` of ``[Ee]rror:``), so a text that holds none is
no failure by the default rule, and SQL passes over most results before Python reads them
(``derive/foreign.py``). A new pattern needs its part here."""


def _config_error(setting: str, expected: str, got: object) -> ConfigError:
    return ConfigError(f"{setting}: expected {expected}, got {got!r}", setting=setting)


@functools.lru_cache(maxsize=256)
def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


@dataclass(frozen=True, slots=True)
class ToolRule:
    """How one tool's calls change state and fail (see the module docstring).

    ``mutates``: every successful call changes state. ``mutates_when``: a
    successful call changes state when this predicate (on the parsed
    arguments) holds, or one of these argument patterns matches.
    ``classifier``: ``"shell"`` reads the command of a shell tool; ``"editor"``
    a file editor's command; ``"none"`` turns that off; ``None`` means the
    default (``"shell"`` for the tools named in ``treellm.shell.DEFAULT_SHELL_TOOLS``,
    ``"editor"`` for :data:`DEFAULT_EDITOR_TOOLS`). ``error_when``: regexes on the
    result text that mark a call failed; ``None`` means
    :data:`DEFAULT_ERROR_WHEN`, ``()`` means the text never marks a failure.
    ``read_only``: regexes on each unknown program of a shell command (``python
    reproduce.py``) that changes nothing. Invalid values raise ``ConfigError``.
    """

    mutates: bool = False
    mutates_when: MutatesWhen | Sequence[ArgumentPattern] | None = None
    classifier: Classifier | None = None
    error_when: Sequence[str] | None = None
    read_only: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.mutates, bool):
            raise _config_error("mutates", "true or false", self.mutates)
        when = self.mutates_when
        if isinstance(when, ArgumentPattern):
            object.__setattr__(self, "mutates_when", (when,))
        elif isinstance(when, Sequence) and not isinstance(when, str):
            for pattern in when:
                if not isinstance(pattern, ArgumentPattern):
                    raise _config_error("mutates_when", "ArgumentPattern values", pattern)
            object.__setattr__(self, "mutates_when", tuple(when))
        elif when is not None and not callable(when):
            raise _config_error("mutates_when", "a callable or ArgumentPattern values", when)
        if self.classifier is not None and self.classifier not in get_args(Classifier):
            raise _config_error("classifier", "shell, editor or none", self.classifier)
        for name in ("error_when", "read_only"):
            regexes = getattr(self, name)
            if regexes is None:
                continue
            if isinstance(regexes, str) or not isinstance(regexes, Sequence):
                raise _config_error(name, "a list of regular expressions", regexes)
            for regex in regexes:
                try:
                    re.compile(regex)
                except (re.error, TypeError) as exc:
                    raise _config_error(name, "a regular expression", regex) from exc
            object.__setattr__(self, name, tuple(regexes))


@dataclass(frozen=True, slots=True)
class ToolSettings:
    """A tool's own repeat settings in code: the middle of the precedence (``None``: not set)."""

    max_repeats: int | None = None
    on_repeat: RepeatAction | None = None
    rule: ToolRule | None = None


def merge_rule(code: ToolRule | None, filed: ToolLimits | None) -> ToolRule:
    """The rule that applies: each field the limits file sets wins over the tool's own."""
    rule = code or ToolRule()
    if filed is None:
        return rule
    return ToolRule(
        rule.mutates if filed.mutates is None else filed.mutates,
        rule.mutates_when if filed.mutates_when is None else filed.mutates_when,
        rule.classifier if filed.classifier is None else filed.classifier,
        rule.error_when if filed.error_when is None else filed.error_when,
        rule.read_only if filed.read_only is None else filed.read_only,
    )


def _classifier(rule: ToolRule, tool: str) -> Classifier:
    if rule.classifier is not None:
        return rule.classifier
    if tool in DEFAULT_SHELL_TOOLS:
        return "shell"
    return "editor" if tool in DEFAULT_EDITOR_TOOLS else "none"


def _argument_text(value: object) -> str:
    return value if isinstance(value, str) else canonical_json(value)


def _pattern_matches(pattern: ArgumentPattern, arguments: object) -> bool:
    if pattern.argument is None:
        text = arguments.text if isinstance(arguments, RawArguments) else canonical_json(arguments)
    elif isinstance(arguments, Mapping) and pattern.argument in arguments:
        text = _argument_text(arguments[pattern.argument])
    else:
        return False
    return re.search(pattern.matches, text) is not None


@dataclass(frozen=True, slots=True)
class CallTargets:
    """What one call reads (for a call that writes, what it writes too) and, when it succeeds,
    whether it changes state and what it writes (``None``: cannot be known)."""

    reads: Paths
    writes: Paths
    changes_state: bool


@functools.lru_cache(maxsize=8192)
def _shell(command: str) -> CommandTargets:
    return command_targets(command)


def _path_argument(value: object) -> Paths:
    if not isinstance(value, Mapping):
        return None
    for name in PATH_ARGUMENTS:
        path = value.get(name)
        if isinstance(path, str) and path.strip():
            return frozenset({posixpath.normpath(path.strip())})
    return None


def _explicitly_mutates(rule: ToolRule, value: object) -> bool:
    if rule.mutates:
        return True
    when = rule.mutates_when
    if isinstance(when, tuple):
        return any(_pattern_matches(p, value) for p in when)
    return callable(when) and bool(when(value))


def _read_only(rule: ToolRule, text: str) -> bool:
    return bool(rule.read_only) and any(p.search(text) for p in _compiled(tuple(rule.read_only or ())))


def call_targets(rule: ToolRule, tool: str, arguments: object) -> CallTargets:
    """The targets of a call of ``tool`` with ``arguments`` (JSON text, bytes or the parsed
    value; see the module docstring). Never raises on the call's data.

    ``reads`` of a call that changes state also holds what it writes: a write between two
    identical writes to the same file (an edit between two restores ``cp x.bak x``) makes
    the second one new work, so it restarts their count too."""
    found = _call_targets(rule, tool, arguments)
    if not found.changes_state or found.reads is None:
        return found
    return CallTargets(None if found.writes is None else found.reads | found.writes, found.writes, True)


def _call_targets(rule: ToolRule, tool: str, arguments: object) -> CallTargets:
    value = parse_arguments(arguments)
    explicit = _explicitly_mutates(rule, value)
    classifier = _classifier(rule, tool)
    if classifier == "shell":
        command = command_text(value.text if isinstance(value, RawArguments) else value)
        if command is None:
            return CallTargets(None, None, True)
        found = _shell(command)
        if found.programs and not explicit and all(_read_only(rule, " ".join(p)) for p in found.programs):
            # every unknown program is read-only by the rule: what is left are the other parts' writes
            left: Paths = None if found.writer_unknown else found.writes
            return CallTargets(found.known_reads, left, left is None or bool(left))
        if found.effect == "read" and not explicit:
            return CallTargets(found.known_reads, frozenset(), False)
        return CallTargets(found.known_reads, found.known_writes if found.effect != "read" else None, True)
    path = _path_argument(value)
    if classifier == "editor" and isinstance(value, Mapping):
        writes = value.get("command") != "view"
        if not writes and not explicit:
            return CallTargets(path, frozenset(), False)
        return CallTargets(path, path, True)
    if explicit:
        return CallTargets(path, path, True)
    return CallTargets(path, frozenset(), False)


def changes_state(rule: ToolRule, tool: str, arguments: object) -> bool:
    """True when a *successful* call of ``tool`` with ``arguments`` changes state.

    ``arguments`` is JSON text, bytes or the parsed value (a ``str`` is read as
    JSON text; text that is not JSON is, for a shell tool, the command itself).
    Failure is the caller's to apply: a failed call never changes state.
    """
    return call_targets(rule, tool, arguments).changes_state


def is_failure(rule: ToolRule, result_text: str, *, raised: bool = False, status_error: bool = False) -> bool:
    """True when a call failed: it raised, its status is an error, or its result text matches ``error_when``."""
    if raised or status_error:
        return True
    patterns = DEFAULT_ERROR_WHEN if rule.error_when is None else tuple(rule.error_when)
    return any(p.search(result_text) is not None for p in _compiled(patterns))


# -- the texts of a catch ------------------------------------------------------------------

_TAILS: Mapping[RepeatAction, str] = {
    "prune": "pruning branch",
    "nudge": "answering with a nudge",
    "cache": "answering from cache",
}


def preview(raw: str) -> str:
    """``raw`` cut to :data:`PREVIEW_CHARS` characters, saying how many more there were."""
    if len(raw) <= PREVIEW_CHARS:
        return raw
    return f"{raw[:PREVIEW_CHARS]}…[{len(raw) - PREVIEW_CHARS:,} more characters]"


def oversized_arguments(arguments: object, config: TreeConfig) -> tuple[str, RawArguments, str] | None:
    """None when ``arguments`` are within the config's depth and size limits; else their raw
    text (a parsed value's canonical JSON), a ``RawArguments`` preview and why (for
    "the arguments were rejected: ..."). Checked without parsing; never raises or recurses."""
    problem = arguments_problem(arguments, max_depth=config.max_argument_depth, max_bytes=config.max_argument_bytes)
    if problem is None:
        return None
    if isinstance(arguments, bytes | bytearray):
        raw = bytes(arguments).decode("utf-8", "replace")
    else:
        raw = arguments if isinstance(arguments, str) else canonical_json(arguments)
    return raw, RawArguments(preview(raw)), problem


def loop_message(tool: str, raw_arguments: str, action: RepeatAction) -> str:
    """The chunk text of a caught call (tree-llm's wording for ``prune``)."""
    return f"[tree] Loop detected: {tool}({raw_arguments}) already in path — {_TAILS[action]}"


IN_FLIGHT_ANSWER = (
    "[treellm] {tool} is already running with these exact arguments on this path (limit {limit}), so it was "
    "not started again: its result comes back with the call already running."
)


def answer_text(action: RepeatAction, *, tool: str, count: int, limit: int, earlier_result: str | None) -> str | None:
    """The tool result sent back for a caught call: None for ``prune``, the earlier result
    for ``cache``, and for ``nudge`` a note saying the call was already made, how often,
    and its earlier result. ``earlier_result`` None means the identical earlier call is
    still running (LoopGuard's concurrent calls): both actions then say so instead of
    answering with an empty result."""
    if action == "prune":
        return None
    if earlier_result is None:
        return IN_FLIGHT_ANSWER.format(tool=tool, limit=limit)
    if action == "cache":
        return earlier_result
    times = "once" if count == 1 else f"{count} times"
    return (
        f"[treellm] {tool} was already called {times} on this path with these exact "
        f"arguments, so it was not run again (limit {limit}). Earlier result:\n{earlier_result}"
    )


def pruned_call(
    decision: LoopDecision,
    *,
    call_id: str,
    raw_arguments: str,
    arguments: object,
    action: RepeatAction,
    shadow: bool,
    answer: str | None = None,
) -> PrunedCall:
    """The record of a caught call (not run unless ``shadow``)."""
    return PrunedCall(
        tool=decision.tool,
        call_id=call_id,
        raw_arguments=raw_arguments,
        arguments=arguments,
        signature=decision.signature,
        count=decision.count,
        limit=decision.limit,
        limit_source=decision.limit_source,
        action=action,
        shadow=shadow,
        earlier_node_ids=tuple(i for i in decision.earlier_node_ids if i is not None),
        answer=answer,
    )


# -- one policy per tree or guard ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RepeatPolicy:
    """The per-tool repeat settings of one tree or guard, resolved by the precedence above.

    ``tools`` holds the tools' own settings; ``default_action`` is the action of
    a tool that sets none. Immutable and thread-safe.
    """

    config: TreeConfig
    tools: Mapping[str, ToolSettings] = field(default_factory=dict)
    default_action: RepeatAction = "prune"
    detector: LoopDetector = field(init=False, repr=False, compare=False)
    _rules: Mapping[str, ToolRule] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        config = self.config
        detector = LoopDetector(config.max_repeats_per_signature, file_limits=config.file_limits)
        names = {*self.tools, *config.tool_limits}
        rules = {name: self._merged(name) for name in names}
        object.__setattr__(self, "detector", detector)
        object.__setattr__(self, "_rules", rules)

    def _merged(self, tool: str) -> ToolRule:
        own = self.tools.get(tool)
        return merge_rule(own.rule if own is not None else None, self.config.tool_limits.get(tool))

    def limit(self, tool: str) -> tuple[int, LimitSource]:
        """The limit of ``tool`` and where it comes from (file, tool or default)."""
        own = self.tools.get(tool)
        return self.detector.limit_for(tool, own.max_repeats if own is not None else None)

    def action(self, tool: str) -> RepeatAction:
        """What to do with a caught call of ``tool``."""
        filed = self.config.tool_limits.get(tool)
        if filed is not None and filed.on_repeat is not None:
            return filed.on_repeat
        own = self.tools.get(tool)
        if own is not None and own.on_repeat is not None:
            return own.on_repeat
        return self.default_action

    def rule(self, tool: str) -> ToolRule:
        """The state-change and failure rule of ``tool``."""
        found = self._rules.get(tool)
        return found if found is not None else ToolRule()

    def check(self, path: PathSignatures, key: CallKey) -> LoopDecision:
        """The loop decision for a call on ``path`` (count, limit and its source, earlier calls)."""
        own = self.tools.get(key.tool)
        return self.detector.check_key(path, key, own.max_repeats if own is not None else None)

    def is_failure(self, tool: str, result_text: str, *, raised: bool = False, status_error: bool = False) -> bool:
        """:func:`is_failure` with ``tool``'s rule."""
        return is_failure(self.rule(tool), result_text, raised=raised, status_error=status_error)

    def state_change(self, tool: str, arguments: object, *, failed: bool) -> bool:
        """True when a call that ran restarts the other counts on its path (never when it failed)."""
        return not failed and changes_state(self.rule(tool), tool, arguments)

    def targets(self, tool: str, arguments: object) -> CallTargets:
        """:func:`call_targets` with ``tool``'s rule."""
        return call_targets(self.rule(tool), tool, arguments)

    def extend(
        self, path: PathSignatures, key: CallKey, arguments: object, node_id: str | None = None, *, succeeded: bool
    ) -> PathSignatures:
        """``path`` with the call added: what it reads, and, when it ``succeeded`` and
        changes state, what it wrote (the one place the runtime and ingest extend paths)."""
        found = self.targets(key.tool, arguments)
        mutates = succeeded and found.changes_state
        return path.extend(key, node_id, mutates=mutates, reads=found.reads, writes=found.writes)
