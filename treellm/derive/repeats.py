"""Every identical call, judged by the evidence (``docs/architecture.md``): the rule, pure.

Derived once per trace where a store keeps judgements (ClickHouse: ``treellm derive``), and
at query time over DuckDB (:mod:`treellm.analysis.repeats`): one definition for both.

One row per **identical repeat**: an executed call with the same tool and canonical
arguments as an earlier call on its path (same signature, and the same captured
arguments where both were captured), whatever ran between. A call whose arguments are
unknown (another framework's span that records none: no signature) repeats no call. Its **twin** is the most
recent such earlier call. Each row says:

- ``counted``: whether the limit's rule counts it (its stored ordinal, derived by the
  runtime's own rule, ``treellm.engine.repeats``, is >= 2): no state change between
  that can have changed what it reads;
- ``outcome``, judged after the fact with everything the store holds:
  - ``unknown`` when it or its twin has no captured result (missing results never
    compare equal);
  - ``productive`` when its twin failed and it did not; when its result differs from
    the twin's; or, with the same result, when a call between wrote what it reads or
    writes (a re-read after an edit of that file, a test re-run after an edit of the
    code under test, a restore after an edit);
  - ``wasted`` otherwise: nothing it reads changed, and it learned nothing new.
- ``reason``: one line naming the evidence.

What counts as "wrote what it reads", after the fact: a successful call between whose
targets (``treellm.shell.command_targets``; a path argument for other tools) overlap the
repeat's reads or writes. A call whose reads cannot be known (a script, a test run) is
touched by writes to files that existed before the run (the code) and to its own
script, not by the agent's scratch files (first seen being written in this run), and by
any program that may write (its code unknown, or holding a file-writing call); code in
the run (a heredoc ``cat > s.py``, ``python -c``) without one writes nothing, nor do
test runners and linters (``pytest``, ``flake8``, ``sqlfluff lint``...); a package
install changes no file a read shows. With the same result as its twin, a read of
known files is wasted unless a call between wrote them, ran code that writes them (the
path literals of that code), or is a known writer whose targets cannot be named
(``git stash``, an editor's ``edit``): a program that may write somewhere unnamed may
have written anything, but the identical text is the evidence that it did not touch
what the read shows (unless the repeat itself writes, a restore after such a program).
A listing of names (``ls``, ``ls -F``: ``treellm.shell.lists_names``) whose result differs
from its twin's only by names of files the agent created in the run (its scratch files:
``reproduce.py``) shows it nothing new: wasted. SWE-agent's editor acts on the file it has open
(``treellm.shell.editor_use``): the run's last ``open FILE`` or ``create FILE`` that did not fail
names it, so an ``edit`` or ``insert`` writes that file and a ``goto`` or ``scroll_down`` shows
it; before any such command, or after one that names no one file, the open file is unknown and
an ``edit`` may have written anything.
"""

from __future__ import annotations

import functools
import posixpath
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from treellm.engine.repeats import CallTargets, ToolRule, call_targets
from treellm.shell import (
    DEFAULT_SHELL_TOOLS,
    ENVIRONMENT,
    CommandTargets,
    EditorUse,
    command_targets,
    command_text,
    editor_use,
    lists_names,
    paths_overlap,
)
from treellm.signature import parse_arguments

__all__ = [
    "CODE_WRITES", "REPEAT_COLUMNS", "REPEAT_TYPES", "CallFacts", "facts", "judge_repeat",
    "judge_runs",
]  # fmt: skip

REPEAT_TYPES: Final = (
    ("trace_id", "VARCHAR"), ("span_id", "VARCHAR"), ("run_id", "VARCHAR"), ("node_id", "VARCHAR"),
    ("tool", "VARCHAR"), ("call_id", "VARCHAR"), ("ordinal", "BIGINT"), ("identical_ordinal", "BIGINT"),
    ("counted", "BOOLEAN"), ("twin_node_id", "VARCHAR"), ("twin_call_id", "VARCHAR"), ("twin_span_id", "VARCHAR"),
    ("outcome", "VARCHAR"), ("reason", "VARCHAR"), ("arguments", "VARCHAR"),
)  # fmt: skip
"""One identical repeat as :func:`judge_runs` gives it: (column, DuckDB type)."""
REPEAT_COLUMNS: Final = [name for name, _ in REPEAT_TYPES]

_RULE: Final = ToolRule()
_HEREDOC: Final = re.compile(
    r"(?:cat|tee)\s*>\s*['\"]?([\w./-]+)['\"]?\s*<<-?\s*['\"]?(\w+)['\"]?[^\n]*\n(.*?)\n\2\b", re.DOTALL
)
CODE_WRITES: Final = re.compile(
    r"""open\([^)]*,\s*(?:mode\s*=\s*)?['"][wax+]|\.write_text\(|\.write_bytes\(|\bshutil\.|\bsubprocess\b"""
    r"""|\bos\.(?:remove|rename|replace|unlink|system|mkdir|makedirs|rmdir|chmod|truncate|popen)\b|\bpopen\("""
    r"""|\bexec\(|\beval\(|__import__|\.(?:save|savez|savetxt|touch|unlink|rename|mkdir|rmdir)\("""
    r"""|\.to_(?:csv|json|pickle|parquet|excel|sql)\(|\bsed\s+-i"""
)
"""Python code that may write a file: the one vocabulary of the evidence (scripts and snippets
the run holds) and of the ``python -c`` rule proposed by ``analysis.rules``."""
_PYTHON_C: Final = re.compile(r"""python[0-9.]*\s+-c\s+(['"])(.*)\1""", re.DOTALL)
_SCRIPT: Final = re.compile(r"(?:python[0-9.]*|bash|sh)\s+(?:-\w+\s+)*([\w./-]+\.(?:py|sh))")
_FILE_WORD: Final = re.compile(r"[\w./-]+\.(?:py|sh|sql|cfg|toml|ini|json|ya?ml|txt|js|ts)\b")
_CHECKER: Final = re.compile(
    r"(?:python[0-9.]*\s+-m\s+)?(?:pytest|py\.test|unittest|flake8|pylint|mypy|pyflakes|pycodestyle|tox|nox)\b"
    r"|ruff\s+check\b|sqlfluff\s+(?:lint|parse)\b|black\s+--check\b"
)
"""Test runners and linters: programs that read the code and write none of it."""


@dataclass(frozen=True, slots=True)
class CallFacts:
    """One executed call as the judgement needs it. ``command`` is a shell tool's command."""

    tool: str
    arguments: str | None
    result_hash: str | None
    failed: bool
    targets: CallTargets
    command: str | None = None
    bodies: dict[str, str] = field(default_factory=dict)
    """Files whose text this call wrote from a heredoc (path -> text)."""
    editor: tuple[EditorUse, str | None] | None = None
    """How the command uses SWE-agent's editor (``treellm.shell.editor_use``)."""
    opened: str | None = None
    """The file open in SWE-agent's editor when this command wrote or showed it, when known
    (the run's state: see the module docstring)."""


def facts(tool: str, arguments: str | None, result_hash: str | None, *, failed: bool) -> CallFacts:
    """:class:`CallFacts` of a stored call (targets by the default rule of its tool)."""
    targets, command, bodies, editor = _read(tool, arguments)
    return CallFacts(tool, arguments, result_hash, failed, targets, command, bodies, editor)


@functools.lru_cache(maxsize=16_384)
def _read(
    tool: str, arguments: str | None
) -> tuple[CallTargets, str | None, dict[str, str], tuple[EditorUse, str | None] | None]:
    """(targets, shell command, heredoc bodies, editor use) of a call's arguments: the same text
    read once (an agent's repeats are the same text; the bodies are shared, and read, never changed)."""
    value = parse_arguments(arguments or "")
    command = command_text(value) if tool in DEFAULT_SHELL_TOOLS else None
    targets = CallTargets(None, None, True) if arguments is None else call_targets(_RULE, tool, value)
    bodies = {m[1].removeprefix("./"): m[3] for m in _HEREDOC.finditer(command)} if command else {}
    return targets, command, bodies, editor_use(command) if command else None


def _same_file(a: str, b: str) -> bool:
    return paths_overlap(a, b) and a.rsplit("/", 1)[-1] == b.rsplit("/", 1)[-1]


@functools.lru_cache(maxsize=16_384)
def _targets(command: str) -> CommandTargets:
    return command_targets(command)


def _touched(call: CallFacts) -> tuple[frozenset[str], frozenset[str]]:
    """(known reads, known writes) of a call."""
    if call.opened is not None:
        opened = frozenset({call.opened})
        return opened, opened if call.editor is not None and call.editor[0] == "writes" else frozenset()
    if call.command is not None:
        found = _targets(call.command)
        return found.reads, found.writes
    return call.targets.reads or frozenset(), call.targets.writes or frozenset()


_PATH_LITERAL: Final = re.compile(r"""['"]([\w./-]+\.[A-Za-z]{1,5})['"]""")


def _code_of(call: CallFacts, bodies: dict[str, str]) -> str | None:
    """The code of a shell call's unknown program(s) when the run holds it (``python -c``, or
    scripts written in the run by a heredoc), else None."""
    command = call.command or ""
    inline = _PYTHON_C.search(command)
    if inline is not None:
        return inline[2]
    scripts = [s.removeprefix("./") for s in _SCRIPT.findall(command)]
    if not scripts or any(s not in bodies for s in scripts):
        return None
    return "\n".join(bodies[s] for s in scripts)


def _writes_of(call: CallFacts, bodies: dict[str, str]) -> tuple[frozenset[str], bool, bool]:
    """(paths written, whether more may be written, whether that "more" comes from a program
    that may write somewhere unnamed) of a call between."""
    if call.opened is not None:
        return _touched(call)[1], False, False
    if call.command is not None:
        found = _targets(call.command)
        if found.effect == "read":
            return frozenset(), False, False
        if found.programs and all(_CHECKER.match(" ".join(p)) for p in found.programs):
            return found.writes, found.writes_unknown and not found.programs, False
        if found.programs:
            code = _code_of(call, bodies)
            if code is None:
                return found.writes, True, True
            if CODE_WRITES.search(code) is None:
                return found.writes, False, False
            literals = frozenset(posixpath.normpath(p) for p in _PATH_LITERAL.findall(code))
            return found.writes | literals, not literals, not literals
        return found.writes, found.writes_unknown, False
    targets = call.targets
    if not targets.changes_state:
        return frozenset(), False, False
    return targets.writes or frozenset(), targets.writes is None, False


def _short(text: str | None) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= 60 else line[:57] + "..."


_LISTED_MARK: Final = "/*@=|"
"""What ``ls -F`` appends to a name (a directory, an executable, a link, a socket, a pipe)."""


def _own_names(listed: str | None, before: str | None, created: Sequence[str]) -> list[str] | None:
    """The names by which the listing ``listed`` differs from ``before``, when every one of them
    names a file the agent created in the run (a name's ``ls -F`` mark dropped), else None."""
    if listed is None or before is None:
        return None
    now, then = Counter(listed.split()), Counter(before.split())
    differ = sorted((now - then) + (then - now))
    own = {_name(path) for path in created}
    if not differ or any(name[:-1] not in own if name[-1] in _LISTED_MARK else name not in own for name in differ):
        return None
    return differ


def judge_repeat(
    call: CallFacts,
    twin: CallFacts,
    between: Sequence[CallFacts],
    *,
    bodies: dict[str, str] | None = None,
    created: Sequence[str] = (),
    listings: tuple[str | None, str | None] = (None, None),
) -> tuple[str, str]:
    """(outcome, reason) of an identical repeat, given its twin and the calls between them on
    its path (pure: the rule of the module docstring). ``bodies``: scripts written in the run
    (path -> text); ``created``: the paths the agent created in the run (its scratch files);
    ``listings``: the results of the call and its twin when they may list names."""
    if call.result_hash is None or twin.result_hash is None:
        return "unknown", "no captured result for this call or its twin"
    if twin.failed and not call.failed:
        return "productive", "its twin failed; this one succeeded (a retry that worked)"
    if call.result_hash != twin.result_hash:
        listed = _own_names(*listings, created) if call.command is not None and lists_names(call.command) else None
        if listed is not None:
            names = ", ".join(listed[:3]) + (f" and {len(listed) - 3} more" if len(listed) > 3 else "")
            return "wasted", f"lists only the agent's own new files beyond its twin's listing ({names})"
        return "productive", "a new result: differs from its twin's"
    shell = _targets(call.command) if call.command is not None else None
    reads = call.targets.reads if shell is None else (None if shell.reads_unknown else shell.reads)
    own = _touched(call)[1]
    if call.opened is not None:
        reads = _touched(call)[0]
    files = frozenset(_FILE_WORD.findall(call.command or "")) if reads is None else frozenset()
    known = bodies or {}
    for other in between:
        if other.bodies:
            known = {**known, **other.bodies}
        if other.failed:
            continue
        written, more, program = _writes_of(other, known)
        written = written - {ENVIRONMENT}  # an install: the same result says it changed nothing here
        if more and (reads is None or not program or own):
            return "productive", f"same result, but `{_short(other.command or other.tool)}` may have written anything"
        if reads is None:
            relevant = [
                p
                for p in written
                if any(paths_overlap(p, f) for f in files) or not any(_same_file(p, c) for c in created)
            ]
        else:
            relevant = [p for p in written if any(paths_overlap(p, r) for r in reads | own)]
        if relevant:
            return "productive", f"same result after {sorted(relevant)[0]} was written between (checks the change)"
    if reads is None:
        return "wasted", "same result as its twin; nothing it runs was written between (only scratch files, if any)"
    return "wasted", "same result as its twin; nothing it reads was written between"


_WALK: Final = 64
"""A line up to this deep is read by walking up its parents; a deeper one (a loop of many turns)
or a cycle numbers the whole run once (:class:`_Lines`)."""


class _Lines:
    """Which think nodes lie on a path: ``a`` is on the line that ends at ``b`` when it is an
    ancestor of ``b``, or ``b``. Asked a few times per run, so a line is first read by walking up
    from ``b`` (at most :data:`_WALK` parents, kept per ``b``); a deeper line or a cycle numbers
    the run's think nodes (and the parent ids they name that are not among them) in pre- and
    post-order, once, so ``a`` is on the line when ``pre[a] <= pre[b]`` and ``post[b] <=
    post[a]``. Linear in the nodes whatever the depth (a loop of 20,000 turns is a path 20,000
    deep: a set of ancestors per node would be quadratic), and nothing for a run asked little."""

    def __init__(self, parents: dict[str, str | None]) -> None:
        self.parents = parents
        self.up: dict[str, frozenset[str]] = {}
        self.pre: dict[str, int] | None = None
        self.post: dict[str, int] = {}

    def _walk(self, end: str) -> frozenset[str] | None:
        """The ancestors of ``end``, or None when its line is deeper than :data:`_WALK` or
        reaches a cycle."""
        parents = self.parents
        if end not in parents:  # a parent id no think node is: a root of its own
            return frozenset()
        line: list[str] = []
        node = parents[end]
        while node is not None:
            if len(line) == _WALK:
                return None
            line.append(node)
            node = parents.get(node)
        return frozenset(line)

    def _number(self) -> dict[str, int]:
        children: dict[str | None, list[str]] = {}
        for node, parent in self.parents.items():
            children.setdefault(parent, []).append(node)
        roots = children.setdefault(None, [])
        roots.extend({p for p in self.parents.values() if p is not None and p not in self.parents})
        pre: dict[str, int] = {}
        post = self.post
        counter = 0
        stack: list[tuple[str, bool]] = [(root, False) for root in roots]
        while stack:  # any order of children numbers the same lines
            node, leaving = stack.pop()
            if leaving:
                post[node] = counter
                counter += 1
                continue
            kids = children.get(node)
            if not kids:  # a leaf (most nodes): entered and left at once
                pre[node], post[node] = counter, counter + 1
                counter += 2
                continue
            pre[node] = counter
            counter += 1
            stack.append((node, True))
            stack.extend((child, False) for child in kids)
        self.pre = pre
        return pre

    def on(self, node: str | None, end: str | None) -> bool:
        """Whether ``node`` (None: the run itself) is on the line from the run to ``end``. A node
        in a cycle of parents (malformed) is on no line but its own."""
        if node is None or node == end:
            return True
        if end is None:
            return False
        pre = self.pre
        if pre is None:
            line = self.up.get(end)
            if line is None:
                line = self._walk(end)
                if line is not None:
                    self.up[end] = line
                    return node in line
                pre = self._number()
            else:
                return node in line
        first, last = pre.get(node), pre.get(end)
        if first is None or last is None:
            return False
        return first <= last and self.post[end] <= self.post[node]


_FACTS_KEPT: Final = 65_536
""":func:`judge_runs` shares one :class:`_Known` between the calls of equal tool, arguments,
result and failure, keeping at most this many (a value, never changed)."""


@dataclass(frozen=True, slots=True)
class _Known:
    """A call's :class:`CallFacts` with what every call asks of them: the paths it reads or writes,
    each with its file name, and the paths it writes (its :func:`_touched`)."""

    facts: CallFacts
    touched: tuple[tuple[str, str], ...]
    writes: tuple[tuple[str, str], ...]


def _known(facts: CallFacts) -> _Known:
    reads, writes = _touched(facts)
    return _Known(
        facts, tuple((path, _name(path)) for path in reads | writes), tuple((path, _name(path)) for path in writes)
    )


def _facts_of(calls: list[tuple[Any, ...]], known: dict[tuple[Any, ...], _Known]) -> list[_Known]:
    """The :class:`_Known` of each call, those already in ``known`` shared (and kept there)."""
    if len(known) > _FACTS_KEPT:
        known.clear()
    made = []
    for c in calls:
        key = (c[5], c[10], c[9], c[8] == "failed")
        found = known.get(key)
        if found is None:
            found = known[key] = _known(facts(c[5], c[10], c[9], failed=key[3]))
        made.append(found)
    return made


def _run_repeats(
    calls: list[tuple[Any, ...]], parents: dict[str, str | None], known: dict[tuple[Any, ...], _Known]
) -> list[tuple[Any, ...]]:
    """The identical repeats of one run's calls (in time order). A call's identical calls on its
    line are its twin's and its twin (the twin's line is part of its own): found once each, so a
    loop of k identical calls costs k steps, not k²/2."""
    made = _facts_of(calls, known)
    lines = _Lines(parents)
    seen_by_key: dict[tuple[str, str], list[int]] = {}
    identical = [0] * len(calls)  # per call: how many identical calls are on its line before it
    bodies: dict[str, str] = {}
    seen_by_name: dict[str, set[str]] = {}  # paths read or written so far, by file name
    created: list[str] = []
    opened: str | None = None  # the file open in SWE-agent's editor, when known
    out: list[tuple[Any, ...]] = []
    for i, call in enumerate(calls):
        trace_id, span_id, run_id, node_id, parent_id, tool, sig, ordinal, _s, _h, arguments, call_id, listing = call
        this = made[i]
        editor = this.facts.editor
        if editor is not None:
            if editor[0] == "opens":
                opened = None if this.facts.failed else editor[1]
            elif opened is not None:
                this = made[i] = _known(replace(this.facts, opened=opened))
        twin = None
        if sig is not None:  # unknown arguments: equal to none
            earlier = seen_by_key.setdefault((tool, sig), [])
            for j in reversed(earlier):
                if lines.on(calls[j][4], parent_id) and (arguments is None or calls[j][10] in (None, arguments)):
                    twin = j
                    break
            earlier.append(i)
        if twin is not None:
            identical[i] = identical[twin] + 1
            between = [made[j].facts for j in range(twin + 1, i) if lines.on(calls[j][4], parent_id)]
            outcome, reason = judge_repeat(
                this.facts, made[twin].facts, between, bodies=bodies, created=created,
                listings=(listing, calls[twin][12]),
            )  # fmt: skip
            counted = ordinal is not None and int(ordinal) >= 2
            out.append(
                (trace_id, span_id, run_id, node_id, tool, call_id, None if ordinal is None else int(ordinal),
                 identical[i] + 1, counted, calls[twin][3], calls[twin][11], calls[twin][1], outcome, reason,
                 arguments)
            )  # fmt: skip
        if this.facts.bodies:
            bodies.update(this.facts.bodies)
        for path, name in this.writes:
            if not any(paths_overlap(path, seen) for seen in seen_by_name.get(name, ())):
                created.append(path)
        for path, name in this.touched:
            seen_by_name.setdefault(name, set()).add(path)
    return out


def _name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def judge_runs(calls: Iterable[tuple[Any, ...]], think: Iterable[tuple[str, str, str | None]]) -> list[tuple[Any, ...]]:
    """Every identical repeat (a row of :data:`REPEAT_COLUMNS`) of the ``calls``, in the order of
    the calls (pure). ``calls``: executed calls in run and time order, each (trace_id, span_id,
    run_id, node_id, parent_id, tool, signature, ordinal, status, result_hash, arguments,
    call_id, listing: the result of a call that may list names), every call of each run they
    hold; ``think``: those runs' think nodes as (run_id, node_id, parent_id), so a repeat's path
    is known."""
    parents: dict[str, dict[str, str | None]] = {}
    for run_id, node_id, parent_id in think:
        parents.setdefault(run_id, {})[node_id] = parent_id
    by_run: dict[str, list[tuple[Any, ...]]] = {}
    for row in calls:
        by_run.setdefault(row[2], []).append(row)
    out: list[tuple[Any, ...]] = []
    known: dict[tuple[Any, ...], _Known] = {}
    for run_id, run_calls in by_run.items():
        out.extend(_run_repeats(run_calls, parents.get(run_id, {}), known))
    return out
