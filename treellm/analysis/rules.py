"""Tune the rules, not only the limits: which ``read_only`` rule would let a shell tool's
limit see the wasted repeats that its state-change rule hides.

A shell tool's count restarts after every program whose effect cannot be known (a script,
a test runner, a linter): by default such a program may write anything. On coding agents
that hides nearly every wasted repeat (a re-read of a file nothing touched, after a run of
``python reproduce.py``). For each shell tool this module:

- finds the wasted identical repeats (``analysis.repeats``) that the limit does not count
  and the unknown programs that ran between each and its twin (the *blockers*);
- generalises each blocker into a candidate ``read_only`` pattern: the program and, for a
  Python script, the first word of its name (``python reproduce_issue.py`` ->
  ``^python[0-9.]* reproduce\\w*\\.py$``; ``python -m pytest ...`` -> ``^python[0-9.]* -m
  pytest\\b``; ``sqlfluff lint x`` -> ``^sqlfluff lint\\b``; a ``python -c`` snippet with no
  call that could write a file -> a pattern for every such snippet);
- replays every run with each candidate (the runtime's own rule,
  ``treellm.engine.repeats.RepeatPolicy.extend``) and counts the wasted repeats it would
  let the limit count and the productive ones it would let the limit prune (its loss).

The advised set starts from every candidate that alone prunes no productive repeat;
while the set together would prune one, the candidate whose removal costs the least is
dropped, then each whose removal loses nothing. The set is advised when it lets the limit
see at least one wasted repeat. Per candidate, ``wasted_seen`` and ``productive_pruned``
are what it does alone (blockers often come in twos: alone it may see nothing);
``advised_wasted_seen`` and ``advised_productive_pruned`` what the advised set does
together. ``limits_toml`` writes the advised ones as ``read_only``.
Needs captured arguments (the commands).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from typing import Any, Final

import pandas as pd

from treellm.analysis.filters import Filters
from treellm.analysis.repeats import CODE_WRITES, load_calls, repeats
from treellm.config import TreeConfig
from treellm.engine.repeats import RepeatPolicy, ToolRule, ToolSettings
from treellm.loop import PathSignatures, call_key
from treellm.shell import DEFAULT_SHELL_TOOLS, command_targets, command_text
from treellm.signature import parse_arguments
from treellm.store.backend import StoreConnection

__all__ = ["RULE_COLUMNS", "candidate_pattern", "rules_by_tool"]

RULE_COLUMNS = [
    "tool", "read_only", "hidden_wasted", "wasted_seen", "productive_pruned", "advised", "advised_wasted_seen",
    "advised_productive_pruned", "examples",
]  # fmt: skip

_SCRIPT: Final = re.compile(r"([A-Za-z]+)[\w.-]*\.py$")
_PYTHON: Final = re.compile(r"python[0-9.]*$")
_WRITES_WORD: Final = re.compile(
    r"^(?:fix|format|write|apply|migrate|install|update|upgrade|edit|patch|init|--fix|--write|-w|--in-place|-i)$"
)
"""Arguments that say a program writes (``sqlfluff fix``, ``black --write``): never proposed read-only."""
_SNIPPET: Final = rf"^python[0-9.]* -c (?![\s\S]*(?:{CODE_WRITES.pattern}))"
"""``python -c`` snippets whose code has no call that could write a file."""


def candidate_pattern(program: tuple[str, ...]) -> str | None:
    """The ``read_only`` pattern that generalises one unknown program (its words), or None."""
    if not program:
        return None
    name = program[0].rsplit("/", 1)[-1]
    args = [a for a in program[1:] if a not in {"-u", "-B", "-W"}]
    if _PYTHON.fullmatch(name):
        if len(args) >= 2 and args[0] == "-m":
            return rf"^python[0-9.]* -m {re.escape(args[1])}\b"
        if args and args[0] == "-c":
            return _SNIPPET if len(args) > 1 and not CODE_WRITES.search(args[1]) else None
        if args:
            script = _SCRIPT.search(args[0])
            if script is not None:
                return rf"^python[0-9.]* (?:\S*/)?{re.escape(script[1])}\w*\.py\b"
        return None
    if name in {"bash", "sh"} or any(_WRITES_WORD.search(a) for a in program[1:]):
        return None
    sub = next((a for a in args if not a.startswith("-")), None)
    if sub is not None and re.fullmatch(r"[a-z][a-z-]*", sub):
        return rf"^{re.escape(name)} {re.escape(sub)}\b"
    return rf"^{re.escape(name)}\b"


def _replay(calls: list[tuple[Any, ...]], tool: str, patterns: tuple[str, ...]) -> set[tuple[str, str]]:
    """(run id, node id) of the calls of ``tool`` that the limit counts (count >= 1) when
    ``patterns`` are its ``read_only`` rule; runs replayed as one path each, in time order."""
    rule = ToolRule(read_only=patterns)
    policy = RepeatPolicy(TreeConfig(), {tool: ToolSettings(rule=rule)})
    counted: set[tuple[str, str]] = set()
    path = PathSignatures.empty()
    run: Any = None
    for call in calls:
        run_id, node_id, name, arguments, failed = call[2], call[3], call[5], call[10], call[8] == "failed"
        if run_id != run:
            path, run = PathSignatures.empty(), run_id
        value = parse_arguments(arguments or "")
        key = call_key(name, value)
        if name == tool and path.count(key) >= 1:
            counted.add((run_id, node_id))
        path = policy.extend(path, key, value, node_id, succeeded=not failed)
    return counted


def rules_by_tool(con: StoreConnection, filters: Filters | None = None) -> pd.DataFrame:
    """Per shell tool and candidate ``read_only`` pattern (``RULE_COLUMNS``): the wasted
    repeats hidden by that kind of program, the wasted repeats the rule lets the limit
    count, the productive repeats it would let the limit prune, whether it is advised, and
    example programs."""
    found = repeats(con, filters, tools=DEFAULT_SHELL_TOOLS)
    if not len(found):
        return pd.DataFrame([], columns=RULE_COLUMNS)
    calls = load_calls(con, filters, tools=DEFAULT_SHELL_TOOLS)  # the runs of those repeats, whole
    by_node = {(c[2], c[3]): i for i, c in enumerate(calls)}
    hidden: dict[str, Counter[str]] = defaultdict(Counter)
    examples: dict[tuple[str, str], list[str]] = defaultdict(list)
    for row in found.itertuples(index=False):
        if row.outcome != "wasted" or row.counted:
            continue
        start, end = by_node.get((row.run_id, row.twin_node_id)), by_node.get((row.run_id, row.node_id))
        if start is None or end is None:
            continue
        for between in calls[start + 1 : end]:
            command = command_text(parse_arguments(between[10] or ""))
            if between[2] != row.run_id or command is None:
                continue
            for program in command_targets(command).programs:
                pattern = candidate_pattern(program)
                if pattern is not None:
                    hidden[str(row.tool)][pattern] += 1
                    shown = examples[(str(row.tool), pattern)]
                    if len(shown) < 3 and " ".join(program)[:120] not in shown:
                        shown.append(" ".join(program)[:120])
    outcome: dict[tuple[str, str], str] = {
        (str(r.run_id), str(r.node_id)): str(r.outcome) for r in found.itertuples(index=False)
    }
    out = []
    for tool, patterns in sorted(hidden.items()):
        base = _replay(calls, tool, ())

        def effect(chosen: tuple[str, ...], tool: str = tool, base: set[tuple[str, str]] = base) -> tuple[int, int]:
            newly = _replay(calls, tool, chosen) - base
            return (
                sum(outcome.get(n) == "wasted" for n in newly),
                sum(outcome.get(n) == "productive" for n in newly),
            )

        alone = {pattern: effect((pattern,)) for pattern in patterns}
        chosen = tuple(p for p, _ in patterns.most_common() if alone[p][1] == 0)
        wasted, productive = effect(chosen)
        while chosen and productive > 0:  # drop the pattern whose removal prunes the least productive
            trials = {p: effect(tuple(q for q in chosen if q != p)) for p in chosen}
            worst = min(trials, key=lambda p: (trials[p][1], -trials[p][0]))
            chosen = tuple(q for q in chosen if q != worst)
            wasted, productive = trials[worst]
        for pattern in reversed(chosen):  # least used first: keep only what sees something
            rest = tuple(q for q in chosen if q != pattern)
            if effect(rest)[0] == wasted:
                chosen = rest
        wasted, productive = effect(chosen) if chosen else (0, 0)
        advised = set(chosen) if wasted > 0 else set()
        together = (wasted, productive) if advised else (0, 0)
        for pattern, count in patterns.most_common():
            seen, pruned = alone[pattern]
            out.append((tool, pattern, count, seen, pruned, pattern in advised, *together, examples[(tool, pattern)]))
    return pd.DataFrame(out, columns=RULE_COLUMNS)
