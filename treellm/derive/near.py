"""Near repeats and paging: consecutive calls of one tool on one path that are close (the rule, pure;
:mod:`treellm.analysis.near` reads it from a store, ClickHouse keeps it per trace).

The seed's honest limitation: exact signatures miss an agent that rephrases a query or
bumps ``limit: 9`` to ``limit: 10``. This finds such pairs among *consecutive* calls of
the same tool in the same run (blocked by run and tool, so it is linear in the calls;
calls of one turn are parallel, not repeats of each other, and are not paired; the pairing
is SQL, ``NEAR_CANDIDATES_SQL`` in ``store/views.py``, and this module judges the pairs). The
definitions (``docs/architecture.md``):

- **paging**: the same resource, only a position moving on (``offset``, ``page``,
  ``cursor``, ``start``...; for shell commands the line range of ``sed -n``, ``head``,
  ``tail``, ``awk NR``) with a new result. A window that comes back with the same result
  is not progress: it is a near repeat.
- **near repeat**: the same resource (same path, identifier, date...) asked again in
  other words or with a widened query. Kinds: ``number_step`` (one non-position number
  moved by a small step), ``string_similar`` (one free-text value nearly equal),
  ``key_added`` / ``key_dropped``, ``reworded`` (a shell command on the same files with
  another pattern or more flags), ``window_widened`` (a line window of the same file that
  overlaps the previous one by at least half of the smaller: the same lines again).
- **different question**: a different file, identifier, date or id is never a near
  repeat, however alike the text looks (``2024-05-15`` vs ``2024-05-17``).

Arguments are compared structurally: JSON objects key by key; shell tools' commands are
parsed (:mod:`treellm.shell`). A near repeat is *wasted* when its result equals the
earlier call's. Needs captured arguments (capture ``redacted`` or ``full``).
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Iterable
from typing import Any, Final

import orjson

from treellm.shell import DEFAULT_SHELL_TOOLS, LineWindow, command_text, line_window

__all__ = [
    "DEFAULT_SIMILARITY",
    "NEAR_KINDS",
    "PAIR_CANDIDATE_COLUMNS",
    "PAIR_COLUMNS",
    "PAIR_TYPES",
    "classify_commands",
    "classify_pair",
    "near_pairs",
]

PAGING_KEYS = frozenset(
    {"offset", "page", "start", "start_line", "line", "from", "cursor", "skip", "page_number", "after", "begin",
     "page_token", "next_token", "start_index", "view_range"}
)  # fmt: skip
TEXT_KEYS = frozenset(
    {"query", "q", "search", "search_query", "text", "pattern", "question", "prompt", "keyword", "keywords", "term",
     "terms", "message", "content", "description", "instructions", "regex", "input"}
)  # fmt: skip
DEFAULT_SIMILARITY: Final = 0.85
"""How alike two free-text values (or two searches' patterns) must be to be a near repeat, by
:class:`difflib.SequenceMatcher` ratio after lower-casing and dropping punctuation."""
NEAR_KINDS: Final = ("number_step", "string_similar", "key_added", "key_dropped", "reworded", "window_widened")
_PUNCT = re.compile(r"[^\w\s]")
_SPACE = re.compile(r"\s+")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}|\d{1,2}/\d{1,2}/\d{2,4}")
_PATHLIKE = re.compile(r"[/\\]|\.[A-Za-z0-9]{1,6}$|::")


def _normal(text: str) -> str:
    return _SPACE.sub(" ", _PUNCT.sub(" ", text.lower())).strip()


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _identity_like(key: str, value: Any) -> bool:
    """A value that names *what* is asked about (an id, a path, a date, a code), compared
    exactly: free text under a text key, or any text with spaces, is not one."""
    if not isinstance(value, str) or key.lower() in TEXT_KEYS:
        return False
    if _DATE.search(value) or _PATHLIKE.search(value):
        return True
    return " " not in value.strip() and any(ch.isdigit() for ch in value)


def _similar(a: str, b: str, similarity: float) -> bool:
    x, y = _normal(a), _normal(b)
    if x == y or (min(len(x), len(y)) >= 3 and (x in y or y in x)):
        return True
    if min(len(x), len(y)) < 0.5 * max(len(x), len(y), 1):
        return False
    matcher = difflib.SequenceMatcher(None, x, y)
    return (
        matcher.real_quick_ratio() >= similarity
        and matcher.quick_ratio() >= similarity
        and (matcher.ratio() >= similarity)
    )


def classify_pair(before: Any, after: Any, *, similarity: float = DEFAULT_SIMILARITY) -> str | None:
    """How two argument objects are close: ``"paging"``, a near-repeat kind, or None (not
    close, or a different question: an identifier, path or date changed)."""
    if not isinstance(before, dict) or not isinstance(after, dict) or before == after:
        return None
    keys_before, keys_after = set(before), set(after)
    common = keys_before & keys_after
    if any(before[k] != after[k] and (_identity_like(k, before[k]) or _identity_like(k, after[k])) for k in common):
        return None  # another file, id or date: a different question
    if keys_before != keys_after:
        if len(keys_before ^ keys_after) != 1 or any(before[k] != after[k] for k in common):
            return None
        return "key_added" if len(keys_after) > len(keys_before) else "key_dropped"
    changed = [k for k in before if before[k] != after[k]]
    if changed and all(k.lower() in PAGING_KEYS or k.lower() in {"limit", "count", "size", "end", "end_line"}
                       for k in changed) and any(k.lower() in PAGING_KEYS for k in changed):  # fmt: skip
        return "paging"
    if len(changed) != 1:
        return None
    key = changed[0]
    old, new = before[key], after[key]
    if _number(old) and _number(new):
        return "number_step" if abs(new - old) <= max(1.0, 0.1 * abs(old)) else None
    if isinstance(old, str) and isinstance(new, str) and _similar(old, new, similarity):
        return "string_similar"
    return None


# -- shell commands ---------------------------------------------------------------------------

_SUBCOMMANDS = frozenset({"git", "pip", "python", "python3", "npm", "cargo", "go", "uv", "poetry", "conda"})


def _words(command: str) -> list[str] | None:
    try:
        return shlex.split(command, comments=False, posix=True)
    except ValueError:
        return None


def _program(words: list[str]) -> tuple[str, ...]:
    if not words:
        return ()
    head = words[0].rsplit("/", 1)[-1]
    if head in _SUBCOMMANDS and len(words) > 1:
        second = words[1]
        if second in ("-m", "-c") and len(words) > 2:
            return head, second, words[2] if second == "-m" else ""
        return head, second if not second.startswith("-") else ""
    return (head,)


def _paths(words: list[str]) -> frozenset[str]:
    return frozenset(w for w in words[1:] if not w.startswith("-") and _PATHLIKE.search(w) and "\n" not in w)


_SEARCH_PROGRAMS = frozenset({"grep", "egrep", "fgrep", "rg", "ag", "ack", "find", "fd", "locate"})
_CHAIN = re.compile(r"\s*(?:&&|\|\||;|\n)\s*")


def _main_command(command: str) -> str:
    """The part of a ``&&``/``;`` list that asks the question: the last part that is not a
    bare ``cd`` (``cd /repo && grep -n x f`` asks what ``grep -n x f`` asks)."""
    parts = [p for p in _CHAIN.split(command.strip()) if p and not re.fullmatch(r"cd\s+\S+", p)]
    return parts[-1] if parts else command


def _mostly_shown(first: LineWindow, second: LineWindow) -> bool:
    """Whether two windows of one file overlap by at least half of the smaller one: the
    same lines asked again, widened or narrowed, not the position moving on."""
    if first.start < 0 or second.start < 0 or first.end is None or second.end is None:
        return False
    shared = min(first.end, second.end) - max(first.start, second.start) + 1
    smaller = min(first.end - first.start, second.end - second.start) + 1
    return shared > 0 and shared * 2 >= smaller


def classify_commands(before: str, after: str, *, similarity: float = DEFAULT_SIMILARITY) -> str | None:
    """How two shell commands of one tool are close: ``"paging"`` (the same file, another
    line window), ``"reworded"`` (the same program on the same files asking the same thing
    with flags added or dropped, or a search whose pattern was reworded), or None (another
    program, other files, other code or data: a different question)."""
    if before == after:
        return None
    first, second = line_window(before), line_window(after)
    if first is not None and second is not None:
        if first.resource != second.resource:
            return None
        return "window_widened" if _mostly_shown(first, second) else "paging"
    a, b = _words(_main_command(before)), _words(_main_command(after))
    if not a or not b or _program(a) != _program(b):
        return None
    paths_a, paths_b = _paths(a), _paths(b)
    if paths_a != paths_b:
        return None  # another file: a different question
    rest_a = [w for w in a[1:] if w not in paths_a]
    rest_b = [w for w in b[1:] if w not in paths_b]
    terms_a = [w for w in rest_a if not w.startswith("-")]
    terms_b = [w for w in rest_b if not w.startswith("-")]
    if terms_a == terms_b:
        return "reworded"  # the same question with flags added, dropped or changed
    searching = _program(a)[0] in _SEARCH_PROGRAMS and terms_a and terms_b
    if searching and _similar(" ".join(terms_a), " ".join(terms_b), similarity):
        return "reworded"  # the same search, its pattern reworded or widened
    return None


def _shell_tool(tool: str, shell_tools: frozenset[str]) -> bool:
    return tool in shell_tools


PAIR_TYPES: Final = (
    ("run_id", "VARCHAR"), ("tool", "VARCHAR"), ("kind", "VARCHAR"), ("detail", "VARCHAR"),
    ("same_result", "BOOLEAN"), ("earlier_node_id", "VARCHAR"), ("node_id", "VARCHAR"),
    ("earlier_call_id", "VARCHAR"), ("call_id", "VARCHAR"), ("earlier_span_id", "VARCHAR"), ("span_id", "VARCHAR"),
    ("trace_id", "VARCHAR"), ("earlier_arguments", "VARCHAR"), ("arguments", "VARCHAR"),
)  # fmt: skip
"""One close pair as :func:`near_pairs` gives it: (column, DuckDB type)."""
PAIR_COLUMNS: Final = [name for name, _ in PAIR_TYPES]


def _classify(tool: str, before: Any, after: Any, shell_tools: frozenset[str], similarity: float) -> str | None:
    if _shell_tool(tool, shell_tools):
        first, second = command_text(before), command_text(after)
        if first is not None and second is not None:
            return classify_commands(first, second, similarity=similarity)
    return classify_pair(before, after, similarity=similarity)


PAIR_CANDIDATE_COLUMNS: Final = (
    "run_id", "tool", "earlier_arguments", "arguments", "earlier_result_hash", "result_hash", "earlier_node_id",
    "node_id", "earlier_call_id", "call_id", "earlier_span_id", "span_id", "trace_id",
)  # fmt: skip
"""A pair of consecutive calls that :func:`near_pairs` judges, in this order: the columns of
``NEAR_CANDIDATES_SQL`` (``store/views.py``), which chooses the pairs."""


_DETAILS_KEPT: Final = 65_536
""":func:`near_pairs` keeps at most this many pairs' kinds, each a pair of argument texts."""


def _parsed(arguments: str) -> Any:
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments


def near_pairs(
    candidates: Iterable[tuple[Any, ...]],
    *,
    similarity: float = DEFAULT_SIMILARITY,
    shell_tools: frozenset[str] | None = None,
) -> list[tuple[Any, ...]]:
    """Every close pair among ``candidates`` (rows of :data:`PAIR_CANDIDATE_COLUMNS`, in run, tool
    and time order), as a row of :data:`PAIR_COLUMNS`, in that order, wasted ones not yet first
    (pure). The pairing itself is SQL: only pairs that can be close cross into Python."""
    shells = frozenset(DEFAULT_SHELL_TOOLS) if shell_tools is None else shell_tools
    rows: list[tuple[Any, ...]] = []
    details: dict[tuple[str | None, str, str], str | None] = {}  # an agent's pairs repeat: each judged once
    for candidate in candidates:
        (run_id, tool, earlier_arguments, arguments, earlier_digest, digest, earlier_node_id, node_id,
         earlier_call_id, call_id, earlier_span_id, span_id, trace_id) = candidate  # fmt: skip
        key = (tool, earlier_arguments, arguments)
        if key in details:
            detail = details[key]
        else:
            if len(details) >= _DETAILS_KEPT:
                details.clear()
            detail = details[key] = _classify(tool, _parsed(earlier_arguments), _parsed(arguments), shells, similarity)
        if detail is None:
            continue
        same_result = digest is not None and digest == earlier_digest
        kind = "paging" if detail == "paging" and not same_result else "near"
        rows.append(
            (run_id, tool, kind, "window_repeated" if detail == "paging" and same_result else detail, same_result,
             earlier_node_id, node_id, earlier_call_id, call_id, earlier_span_id, span_id, trace_id,
             earlier_arguments, arguments)
        )  # fmt: skip
    return rows
