"""The runtime rule on real coding agents: the shipped trajectories replayed through
``LoopGuard.check()`` / ``record()``, with the default rules and with the ``read_only``
rules that ``treellm tune`` proposes from the same data.

- Ingest (the derivation) and LoopGuard count alike on every real call.
- A re-read of a file that nothing has written since counts as a repeat, even after
  writes to other files; a re-run of a test after an edit of the code under test does not.
- No call that the hand labels call needed is counted, with or without the tuned rules;
  the tuned rules let the limit count wasted repeats that the default rule hid.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from treellm import LoopGuard, ToolRule, TreeConfig
from treellm.analysis import tune
from treellm.analysis.rules import candidate_pattern, rules_by_tool
from treellm.analysis.tuning import limits_toml, tuning_by_tool
from treellm.store import ingest, open_store

DATA = Path(__file__).parent / "data" / "mini-swe-agent"
FILES = sorted(DATA.glob("*/*.traj.json"))


def _calls(path: Path) -> list[tuple[str, str]]:
    """(command, result) of every bash call of a trajectory, in order."""
    data = json.loads(path.read_text(encoding="utf-8"))
    results = {m["tool_call_id"]: m.get("content") or "" for m in data["messages"] if m.get("role") == "tool"}
    return [
        (json.loads(call["function"]["arguments"])["command"], results.get(call["id"], ""))
        for message in data["messages"]
        for call in message.get("tool_calls") or []
    ]


def _replay(path: Path, rule: ToolRule | None = None) -> Iterator[tuple[int, int]]:
    """(call index, the guard's count) of every call of a trajectory, in shadow mode."""
    guard = LoopGuard(config=TreeConfig(shadow=True), rules={"bash": rule} if rule else None, telemetry=False)
    for i, (command, result) in enumerate(_calls(path)):
        decision = guard.check("bash", {"command": command})
        yield i, decision.count
        guard.record("bash", {"command": command}, result)


def _name(path: Path) -> str:
    return "/".join(path.parts[-2:])


LABELS = {
    (row["file"], row["call"]): row["label"]
    for row in map(json.loads, (DATA / "repeats.jsonl").read_text(encoding="utf-8").splitlines())
}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    db = tmp_path_factory.mktemp("replay") / "swe.duckdb"
    ingest(db, FILES)
    con = open_store(db, read_only=True)
    try:
        rows = con.execute("SELECT source, ordinal FROM tool_calls ORDER BY source, start_ns, span_id").fetchall()
        toml = limits_toml(tuning_by_tool(con), rules=rules_by_tool(con))
        tools = {t["tool"]: t for t in tune(con)["tools"]}
    finally:
        con.close()
    ordinals: dict[str, list[int]] = {}
    for source, ordinal in rows:
        ordinals.setdefault(_name(Path(source)), []).append(ordinal)
    path = tmp_path_factory.mktemp("limits") / "limits.toml"
    path.write_text(toml, encoding="utf-8")
    return {"ordinals": ordinals, "config": TreeConfig.from_file(path), "tune": tools}


def test_ingest_and_the_guard_count_every_real_call_alike(tuned: dict[str, Any]) -> None:
    for path in FILES:
        counts = [count for _, count in _replay(path)]
        assert [c + 1 for c in counts] == tuned["ordinals"][_name(path)], path.name


def test_no_needed_repeat_is_counted_with_or_without_the_tuned_rules(tuned: dict[str, Any]) -> None:
    limits = tuned["config"].tool_limits["bash"]
    rule = ToolRule(read_only=limits.read_only)
    counted_default: list[str] = []
    counted_tuned: list[str] = []
    for path in FILES:
        for sink, with_rule in ((counted_default, None), (counted_tuned, rule)):
            sink.extend(LABELS[(_name(path), i)] for i, count in _replay(path, with_rule) if count >= 1 and i > 0)
    assert "needed" not in counted_default and "needed" not in counted_tuned
    # the tuned rules let the limit see more wasted repeats than the default rule did
    assert counted_default.count("wasted") < counted_tuned.count("wasted")


def test_tune_proposes_read_only_rules_that_prune_nothing_productive(tuned: dict[str, Any]) -> None:
    rules = tuned["tune"]["bash"]["rules"]
    advised = [r for r in rules if r["advised"]]
    assert advised and all(r["productive_pruned"] == 0 and r["advised_productive_pruned"] == 0 for r in advised)
    assert advised[0]["advised_wasted_seen"] >= 1
    # a rule that would prune productive repeats (scripts that edit the code) is shown, never advised
    assert any(r["productive_pruned"] > 0 and not r["advised"] for r in rules)
    assert tuned["tune"]["bash"]["verdict"] != "raise"
    assert tuned["config"].tool_limits["bash"].read_only == tuple(r["read_only"] for r in advised)


def _guard_counts(commands: list[str], rule: ToolRule | None = None) -> list[int]:
    guard = LoopGuard(rules={"bash": rule} if rule else None, telemetry=False, config=TreeConfig(shadow=True))
    out = []
    for command in commands:
        out.append(guard.check("bash", {"command": command}).count)
        guard.record("bash", {"command": command}, "same text")
    return out


def test_a_re_read_after_writes_to_other_files_counts_and_a_test_after_an_edit_does_not() -> None:
    # real commands of pvlib-python-1707 (deepseek_chat_dev): the file under test is pvlib/iam.py
    commands = [command for command, _ in _calls(DATA / "deepseek_chat_dev" / "pvlib__pvlib-python-1707.traj.json")]
    read = "sed -n '70,95p' ./pvlib/iam.py"
    assert read in commands
    other_write = next(c for c in commands if c.startswith("sed -i") and "iam.py" not in c)
    backup = "cp ./pvlib/iam.py ./pvlib/iam.py.backup"
    assert backup in commands
    # writes to other files between: the re-read is a repeat
    assert _guard_counts([read, other_write, backup, read])[-1] == 1
    # an edit of the file it reads between: not a repeat
    edit = next(c for c in commands if "sed -i" in c and "iam.py" in c)
    assert _guard_counts([read, edit, read])[-1] == 0
    # the test re-run after an edit of the code under test is not a repeat, even with the
    # test script declared read-only; with only a read-only test run between, it is
    test = "python test_issue.py"
    rule = ToolRule(read_only=[candidate_pattern(("python", "test_issue.py")) or ""])
    assert _guard_counts([test, edit, test], rule)[-1] == 0
    assert _guard_counts([read, test, read], rule)[-1] == 1
    assert _guard_counts([read, test, read])[-1] == 0  # by default an unknown program may write anything
    # a package install changes the environment, not the file: the re-read counts, the test re-run does not
    install = next(c for c in commands if c.startswith("pip install"))
    assert _guard_counts([read, install, read])[-1] == 1
    assert _guard_counts([test, install, test], rule)[-1] == 0


def test_candidate_patterns_generalise_programs() -> None:
    assert candidate_pattern(("python", "reproduce_issue.py")) == r"^python[0-9.]* (?:\S*/)?reproduce\w*\.py\b"
    assert candidate_pattern(("python3", "-m", "pytest", "tests/x.py")) == r"^python[0-9.]* -m pytest\b"
    assert candidate_pattern(("sqlfluff", "lint", "x.sql")) == r"^sqlfluff lint\b"
    snippet = candidate_pattern(("python", "-c", "import numpy; print(numpy.__version__)"))
    assert snippet is not None and re.search(snippet, "python -c import numpy; print(1)")
    assert not re.search(snippet, "python -c open('x.py', 'w').write('')")
    assert candidate_pattern(("python", "-c", "import os; os.remove('x')")) is None
    assert candidate_pattern(("sqlfluff", "fix", "x.sql")) is None  # says it writes
