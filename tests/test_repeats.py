"""The repeat rules of ``engine/repeats.py``: state changes, failures, texts, and engine == LoopGuard."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import last_tool_results
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from treellm import (
    ArgumentPattern,
    ConfigError,
    LoopGuard,
    ModelTurn,
    NodeStatus,
    ScriptedModel,
    Tool,
    ToolCall,
    ToolDefinitionError,
    ToolNode,
    ToolRule,
    TreeConfig,
    TreeExecutor,
)
from treellm.engine.repeats import (
    DEFAULT_ERROR_NEEDS,
    DEFAULT_ERROR_WHEN,
    RepeatPolicy,
    ToolSettings,
    changes_state,
    is_failure,
    merge_rule,
)
from treellm.loop import PathSignatures, call_key

SHELL = ToolRule(classifier="shell")


def run_calls(
    calls: list[tuple[str, dict[str, Any]]],
    tools: list[Tool],
    config: TreeConfig | None = None,
) -> tuple[Any, ScriptedModel]:
    """Run one call per turn on one path (collapse branching), then answer."""
    turns = [ModelTurn(tool_calls=[ToolCall(name, args)]) for name, args in calls]
    model = ScriptedModel([*turns, ModelTurn(text="done")])
    result = TreeExecutor(model, tools, config or TreeConfig(shadow=True), telemetry=False).run("t")
    return result, model


def ordinals(result: Any) -> list[int]:
    return [n.ordinal for n in result.nodes if isinstance(n, ToolNode)]


def bash(command: str) -> tuple[str, dict[str, Any]]:
    return "bash", {"command": command}


def echo(args: dict[str, Any]) -> str:
    return f"ran {json.dumps(args, sort_keys=True)}"


# -- the state-change rule -----------------------------------------------------------------------


def test_a_read_repeated_after_an_intervening_write_is_ordinal_1_again() -> None:
    calls = [bash("cat a.txt"), bash("echo hi > a.txt"), bash("cat a.txt"), bash("cat a.txt")]
    result, _ = run_calls(calls, [Tool("bash", "b", handler=echo)])
    assert ordinals(result) == [1, 1, 1, 2]

    guard = LoopGuard(shadow=True, telemetry=False)  # bash is a shell tool by default
    seen = []
    for name, args in calls:
        seen.append(guard.check(name, args).ordinal)
        guard.record(name, args, "ok")
    assert seen == [1, 1, 1, 2]


def test_the_same_write_repeated_back_to_back_is_caught() -> None:
    handler_calls: list[dict[str, Any]] = []

    def handler(args: dict[str, Any]) -> str:
        handler_calls.append(args)
        return "done"

    result, _ = run_calls([bash("sed -i s/a/b/ f.py")] * 2, [Tool("bash", "b", handler=handler)], TreeConfig())
    assert len(handler_calls) == 1 and result.outcome == "pruned_out"
    assert result.pruned_calls[0].count == 1

    guard = LoopGuard(telemetry=False)
    guard.record("bash", {"command": "rm -rf build"}, "")
    assert not guard.check("bash", {"command": "rm -rf build"}).allowed


def test_unknown_programs_count_as_writes() -> None:
    assert changes_state(SHELL, "bash", {"command": "python run.py"})
    assert changes_state(SHELL, "bash", {"command": "./deploy.sh"})
    assert not changes_state(SHELL, "bash", {"command": "cat a.txt | grep x"})
    assert changes_state(SHELL, "bash", {"no_command": "x"})  # no command found: unknown
    calls = [bash("pytest -q"), bash("git status"), bash("python fix.py"), bash("git status"), bash("pytest -q")]
    result, _ = run_calls(calls, [Tool("bash", "b", handler=echo)])
    assert ordinals(result) == [1, 1, 1, 1, 1]


def test_mutates_tools_restart_their_own_other_signatures() -> None:
    edit = Tool("edit_file", "e", handler=echo, mutates=True)
    calls = [("edit_file", {"p": "a"}), ("edit_file", {"p": "b"}), ("edit_file", {"p": "a"}), ("edit_file", {"p": "a"})]
    result, _ = run_calls(calls, [edit])
    assert ordinals(result) == [1, 1, 1, 2]

    guard = LoopGuard(mutates=["edit_file"], shadow=True, telemetry=False)
    seen = []
    for name, args in calls:
        seen.append(guard.check(name, args).ordinal)
        guard.record(name, args, "ok")
    assert seen == [1, 1, 1, 2]


def test_path_signatures_restart_every_other_key_and_keep_their_own() -> None:
    read, write, other = call_key("bash", {"c": "cat"}), call_key("bash", {"c": "w"}), call_key("bash", {"c": "w2"})
    path = PathSignatures.empty().extend(read).extend(write, mutates=True)
    assert path.count(read) == 0 and path.count(write) == 1
    path = path.extend(write, mutates=True)
    assert path.count(write) == 2 and path.count(read) == 0
    path = path.extend(read).extend(other, mutates=True)
    assert path.count(write) == 0 and path.count(read) == 0 and path.count(other) == 1


def test_a_failed_write_is_not_a_state_change() -> None:
    def handler(args: dict[str, Any]) -> str:
        return "<returncode>1</returncode>" if ">" in args["command"] else "contents"

    calls = [bash("cat a.txt"), bash("echo x > /ro/a.txt"), bash("cat a.txt")]
    result, _ = run_calls(calls, [Tool("bash", "b", handler=handler)])
    nodes = [n for n in result.nodes if isinstance(n, ToolNode)]
    assert ordinals(result) == [1, 1, 2]
    assert nodes[1].status == NodeStatus.FAILED and any(e.type == "tool:error" for e in result.events)

    guard = LoopGuard(telemetry=False)
    guard.record("bash", {"command": "cat a.txt"}, "contents")
    guard.record("bash", {"command": "echo x > /ro/a.txt"}, "<returncode>1</returncode>")
    assert not guard.check("bash", {"command": "cat a.txt"}).allowed


def test_mutates_when_patterns_and_predicates_mark_writes() -> None:
    post = ToolRule(mutates_when=ArgumentPattern("method", "^(POST|PUT|DELETE)$"))
    assert changes_state(post, "http", {"method": "POST", "url": "u"})
    assert not changes_state(post, "http", {"method": "GET", "url": "u"})
    assert not changes_state(post, "http", {"url": "u"})
    assert changes_state(post, "http", '{"method": "DELETE"}')  # JSON text is parsed first
    whole = ToolRule(mutates_when=[ArgumentPattern(None, '"dry_run":false')])
    assert changes_state(whole, "deploy", {"dry_run": False}) and not changes_state(whole, "deploy", {"dry_run": True})
    numeric = ToolRule(mutates_when=(ArgumentPattern("level", "^[3-9]$"),))
    assert changes_state(numeric, "t", {"level": 4}) and not changes_state(numeric, "t", {"level": 1})
    predicate = ToolRule(mutates_when=lambda args: isinstance(args, dict) and args.get("write") is True)
    assert changes_state(predicate, "t", {"write": True}) and not changes_state(predicate, "t", {})
    assert not changes_state(ToolRule(classifier="none"), "bash", {"command": "rm x"})
    assert not changes_state(ToolRule(), "read_file", {"path": "a"})


def test_the_limits_file_sets_the_rules_and_wins_over_the_code(tmp_path: Path) -> None:
    limits = tmp_path / "limits.toml"
    limits.write_text(
        "[tools.http]\n"
        'mutates_when = {argument = "method", matches = "^(POST|PUT|DELETE)$"}\n'
        "error_when = ['^HTTP [45]\\d\\d']\n"
        "[tools.bash]\n"
        'classifier = "none"\n',
        encoding="utf-8",
    )
    config = TreeConfig.from_file(limits)
    policy = RepeatPolicy(config, {"http": ToolSettings(rule=ToolRule(mutates=True, error_when=()))})
    assert policy.rule("http").mutates is True  # the file leaves mutates alone
    assert policy.state_change("http", {"method": "GET"}, failed=False)
    assert policy.is_failure("http", "HTTP 503 unavailable") and not policy.is_failure("http", "Error: x")
    assert not policy.state_change("bash", {"command": "rm x"}, failed=False)
    assert policy.state_change("http", {"method": "PUT"}, failed=False)
    assert not policy.state_change("http", {"method": "PUT"}, failed=True)

    calls = [bash("cat a"), bash("rm a"), bash("cat a")]
    result, _ = run_calls(calls, [Tool("bash", "b", handler=echo)], config.replace(shadow=True))
    assert ordinals(result) == [1, 1, 2]
    guard = LoopGuard(config=config, rules={"bash": SHELL}, telemetry=False)
    for name, args in calls[:2]:
        guard.record(name, args, "ok")
    assert not guard.check(*calls[2]).allowed


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"classifier": "zsh"}, "tools.t.classifier in l.toml: expected shell, editor or none, got 'zsh'"),
        ({"error_when": "x"}, "tools.t.error_when in l.toml: expected a list of regular expressions, got 'x'"),
        ({"error_when": ["("]}, "tools.t.error_when[0] in l.toml: expected a regular expression, got '('"),
        ({"mutates_when": {"argument": "m"}}, "tools.t.mutates_when.matches in l.toml: expected a regular"),
        (
            {"mutates_when": [{"argument": 1, "matches": "x"}]},
            "tools.t.mutates_when[0].argument in l.toml: expected an",
        ),
        ({"mutates_when": {"arg": "m", "matches": "x"}}, "tools.t.mutates_when.arg in l.toml: expected argument"),
        ({"mutates_when": "POST"}, "tools.t.mutates_when in l.toml: expected a table"),
    ],
)
def test_bad_rules_in_a_limits_file_say_what_was_expected(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        TreeConfig.from_mapping({"tools": {"t": table}}, path="l.toml")


def test_bad_rules_in_code_are_rejected() -> None:
    with pytest.raises(ConfigError, match="classifier: expected shell, editor or none"):
        ToolRule(classifier="zsh")  # type: ignore[arg-type]
    with pytest.raises(ToolDefinitionError, match="tool 'x': error_when: expected a regular expression"):
        Tool("x", "x", handler=echo, error_when=["("])
    with pytest.raises(ConfigError, match=r"mutates_when\.matches: expected a regular expression"):
        ArgumentPattern("a", "(")


def test_merge_rule_takes_each_field_the_file_sets() -> None:
    config = TreeConfig.from_mapping({"tools": {"t": {"classifier": "shell"}}})
    merged = merge_rule(ToolRule(mutates=True, error_when=("x",)), config.tool_limits["t"])
    assert merged == ToolRule(mutates=True, classifier="shell", error_when=("x",))
    assert merge_rule(None, None) == ToolRule()


# -- the failure rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "failed"),
    [
        ("<returncode>1</returncode>\nboom", True),
        ("out\n<returncode> 127 </returncode>", True),
        ("<returncode>-9</returncode>", True),
        ("<returncode>0</returncode>\nfine", False),
        ("<returncode>00</returncode>", False),
        ('Traceback (most recent call last):\n  File "x.py"', True),
        ("log line\nTraceback (most recent call last):\nValueError", True),
        ("Error: no such file", True),
        ("  error: bad flag", True),
        ("no Error: in the middle", False),
        # SWE-agent's editor refusing an edit its linter rejected
        ("Your proposed edit has introduced new syntax error(s).\nYour changes have NOT been applied.", True),
        ("File updated. Please review the changes.", False),
        ("exchanges have NOT been applied", False),
        ("done: changes have NOT been applied yet", True),
        ("changes have NOT been appliedly", False),
        ('{"error": "not found"}', True),
        ('{"status": 404, "error": {"code": 1}}', True),
        ('{"data": {"x": 1}, "error": "late"}', True),
        ('{"error": null, "data": 1}', False),
        ('{"error": ""}', False),
        ('{"error" :  false}', False),
        ('{"ok": true, "error": {}}', False),
        ('{"data": {"error": "nested"}}', False),
        ('{"message": "the \\"error\\": key"}', False),
        ('["error", 1]', False),
        ("all good", False),
        ("", False),
    ],
)
def test_the_default_failure_rule(text: str, failed: bool) -> None:
    assert is_failure(ToolRule(), text) is failed


def test_each_default_failure_pattern_has_its_literal_part_for_the_sql_prefilter() -> None:
    """``DEFAULT_ERROR_NEEDS`` names a literal part of each default pattern, in their order (whether
    SQL passes over no failing text is ``test_foreign``'s check, on real texts)."""
    for pattern, part in zip(DEFAULT_ERROR_WHEN, DEFAULT_ERROR_NEEDS, strict=True):
        assert part in pattern.replace("\\", "")


def test_raised_and_status_errors_always_fail_and_a_custom_rule_replaces_the_defaults() -> None:
    assert is_failure(ToolRule(), "fine", raised=True) and is_failure(ToolRule(), "fine", status_error=True)
    custom = ToolRule(error_when=[r"^FAILED", r"exit status [1-9]"])
    assert is_failure(custom, "FAILED tests/x.py") and is_failure(custom, "... exit status 2")
    assert not is_failure(custom, "Error: the defaults are replaced")
    assert not is_failure(ToolRule(error_when=()), "Traceback (most recent call last):")
    both = ToolRule(error_when=(*DEFAULT_ERROR_WHEN, "^WARN"))
    assert is_failure(both, "WARN x") and is_failure(both, "Error: y")


def test_the_default_failure_rule_reads_large_hostile_text() -> None:
    """Text that makes a backtracking pattern take exponential time: the rule answers (no clock
    here: such a pattern would never end, and the suite with it)."""
    texts = ["{" + '"a": "' * 20_000, '{"a": {' * 20_000, "{" + '"a\\' * 30_000, "x" * 200_000]
    for text in texts:
        assert not is_failure(ToolRule(), text)


def test_a_custom_error_when_fails_a_call_in_the_engine_and_the_guard() -> None:
    tool = Tool("http", "h", handler=lambda _: "HTTP 503", error_when=["^HTTP 5"])
    result, _ = run_calls([("http", {"u": 1})], [tool])
    node = next(n for n in result.nodes if isinstance(n, ToolNode))
    assert node.status == NodeStatus.FAILED and node.error == "HTTP 503"
    statuses: list[Any] = []
    guard = LoopGuard(rules={"http": ToolRule(error_when=["^HTTP 5"])}, observers=[statuses.append], telemetry=False)
    guard.record("http", {"u": 1}, "HTTP 503")
    assert [e.type for e in statuses][-2:] == ["tool:start", "tool:error"]


# -- identical texts from the engine and LoopGuard ---------------------------------------------------


@pytest.mark.parametrize("action", ["nudge", "cache"])
@pytest.mark.parametrize("repeats", [1, 2])
def test_the_engine_and_the_guard_answer_a_caught_call_with_the_same_text(action: Any, repeats: int) -> None:
    tool = Tool("fetch", "f", handler=lambda _: "page text", on_repeat=action, max_repeats=repeats)
    calls = [("fetch", {"u": 1})] * (repeats + 1)
    _, model = run_calls(calls, [tool], TreeConfig())
    engine_answer = last_tool_results(model.requests[-1])[0]

    guard = LoopGuard(limits={"fetch": repeats}, on_repeat=action, telemetry=False)
    for name, args in calls[:-1]:
        guard.record(name, args, "page text")
    decision = guard.check(*calls[-1])
    assert not decision.allowed and decision.answer == engine_answer
    assert "page text" in engine_answer


def test_the_engine_and_the_guard_emit_the_same_loop_detected_record() -> None:
    tool = Tool("s", "s", handler=lambda _: "r", on_repeat="nudge")
    result, _ = run_calls([("s", {"q": 1})] * 2, [tool], TreeConfig())
    engine = result.pruned_calls[0]
    events: list[Any] = []
    guard = LoopGuard(on_repeat="nudge", observers=[events.append], telemetry=False)
    guard.record("s", {"q": 1}, "r")
    guard.check("s", {"q": 1})
    pruned = next(e.payload.call for e in events if e.type == "loop:detected")
    same = ("tool", "signature", "count", "limit", "limit_source", "action", "shadow", "answer", "raw_arguments")
    assert {f: getattr(pruned, f) for f in same} == {f: getattr(engine, f) for f in same}


# -- the property: the executor and LoopGuard count alike -------------------------------------------------

CALLS: list[tuple[str, dict[str, Any], bool]] = [  # (tool, arguments, changes state when it succeeds)
    ("bash", {"command": "cat a.txt"}, False),
    ("bash", {"command": "grep -n x a.txt | head -5"}, False),
    ("bash", {"command": "ls"}, False),
    ("bash", {"command": "echo hi > a.txt"}, True),
    ("bash", {"command": "sed -i 's/a/b/' a.txt"}, True),
    ("bash", {"command": "python run.py"}, True),
    ("read_file", {"path": "a.txt"}, False),
    ("read_file", {"path": "b.txt"}, False),
    ("edit_file", {"path": "a.txt"}, True),
    ("edit_file", {"path": "b.txt"}, True),
    ("http", {"method": "GET", "url": "u"}, False),
    ("http", {"method": "POST", "url": "u"}, True),
]
OUTCOMES = ["ok", "ok", "raise", "error_text", "returncode"]
POST = ArgumentPattern("method", "^POST$")


def outcome_text(outcome: str) -> str:
    return {"ok": "fine", "error_text": "Error: nope", "returncode": "out\n<returncode>2</returncode>"}[outcome]


UNKNOWN = None
# what each of CALLS reads and, when it changes state, writes (None: cannot be known), by hand;
# a call that writes also "reads" what it writes (a write of it between makes the repeat new work)
TARGETS: list[tuple[frozenset[str] | None, frozenset[str] | None]] = [
    (frozenset({"a.txt"}), frozenset()),
    (frozenset({"a.txt"}), frozenset()),
    (frozenset({"."}), frozenset()),
    (frozenset({"a.txt"}), frozenset({"a.txt"})),
    (frozenset({"a.txt"}), frozenset({"a.txt"})),
    (UNKNOWN, UNKNOWN),
    (frozenset({"a.txt"}), frozenset()),
    (frozenset({"b.txt"}), frozenset()),
    (frozenset({"a.txt"}), frozenset({"a.txt"})),
    (frozenset({"b.txt"}), frozenset({"b.txt"})),
    (UNKNOWN, frozenset()),
    (UNKNOWN, UNKNOWN),
]


def _restarts(writer: int, reader: int) -> bool:
    reads, writes = TARGETS[reader][0], TARGETS[writer][1]
    if reads is None or writes is None:
        return True
    return any(w == r or "." in (w, r) for w in writes for r in reads)


def naive_ordinals(steps: list[tuple[int, str]]) -> list[int]:
    """Replay the definition on a list: a successful state change restarts the counts of the
    other keys that read what it wrote (all of them when either side cannot be known)."""
    out = []
    for i, (index, _) in enumerate(steps):
        count = 0
        for other, outcome in steps[:i]:
            if other == index:
                count += 1
            elif CALLS[other][2] and outcome == "ok" and _restarts(other, index):
                count = 0
        out.append(count + 1)
    return out


def scripted_handler(outcomes: Iterator[str]) -> Callable[[dict[str, Any]], str]:
    def handler(_: dict[str, Any]) -> str:
        outcome = next(outcomes)
        if outcome == "raise":
            raise RuntimeError("boom")
        return outcome_text(outcome)

    return handler


steps_strategy = st.lists(st.tuples(st.integers(0, len(CALLS) - 1), st.sampled_from(OUTCOMES)), max_size=14)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps_strategy)
def test_the_executor_and_the_guard_give_the_same_ordinals(steps: list[tuple[int, str]]) -> None:
    handler = scripted_handler(iter([outcome for _, outcome in steps]))
    tools = [
        Tool("bash", "b", handler=handler),
        Tool("read_file", "r", handler=handler),
        Tool("edit_file", "e", handler=handler, mutates=True),
        Tool("http", "h", handler=handler, mutates_when=POST),
    ]
    config = TreeConfig(shadow=True, node_budget=10_000, depth_limit=10_000, retry_max_attempts=1, retry_base_delay_s=0)
    calls = [(CALLS[i][0], CALLS[i][1]) for i, _ in steps]
    result, _ = run_calls(calls, tools, config)
    nodes = [n for n in result.nodes if isinstance(n, ToolNode)]

    guard = LoopGuard(
        config=config, mutates=["edit_file"], rules={"http": ToolRule(mutates_when=POST)}, telemetry=False
    )
    guard_ordinals, guard_caught = [], []
    for (name, args), (_, outcome) in zip(calls, steps, strict=True):
        decision = guard.check(name, args)
        guard_ordinals.append(decision.ordinal)
        guard_caught.append(decision.count >= decision.limit)
        raised = outcome == "raise"
        guard.record(name, args, "Error: boom" if raised else outcome_text(outcome), error=raised)

    assert [n.ordinal for n in nodes] == guard_ordinals == naive_ordinals(steps)
    assert [n.shadow_caught for n in nodes] == guard_caught
    assert [n.status == NodeStatus.FAILED for n in nodes] == [o != "ok" for _, o in steps]


def test_the_readme_limits_file_example_reads_and_means_what_it_says() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    block = re.search(r"TreeConfig\.from_file\(\"limits\.toml\"\).*?```toml\n(.*?)```", readme, re.S)
    assert block is not None
    config = TreeConfig.from_mapping(tomllib.loads(block.group(1)))
    policy = RepeatPolicy(config)
    assert policy.state_change("http", {"method": "DELETE"}, failed=False)
    assert policy.is_failure("http", "HTTP 502 bad gateway")
    assert policy.state_change("bash", {"command": "rm x"}, failed=False)
    assert not policy.state_change("bash", {"command": "cat x"}, failed=False)


def test_a_guard_given_the_bare_command_text_classifies_it() -> None:
    guard = LoopGuard(telemetry=False)
    guard.record("bash", "cat a.txt", "x")
    guard.record("bash", "echo y > a.txt", "")
    assert guard.check("bash", "cat a.txt").allowed
    assert not changes_state(SHELL, "bash", "ls -la")


INGEST_CALLS = [i for i, (name, _, _) in enumerate(CALLS) if name in ("bash", "read_file")]  # default rules only


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.tuples(st.sampled_from(INGEST_CALLS), st.sampled_from(OUTCOMES)), max_size=12))
def test_ingest_counts_a_trajectory_as_the_guard_does(tmp_path_factory: Any, steps: list[tuple[int, str]]) -> None:
    """The same calls as another agent's trajectory: ingest's ordinals (default rules: the shell
    classifier for bash, the default failure patterns) equal LoopGuard's and the definition's."""
    import json

    from treellm.store import ingest, open_store

    messages: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    guard = LoopGuard(telemetry=False)
    guard_ordinals = []
    for k, (index, outcome) in enumerate(steps):
        name, args, _ = CALLS[index]
        text = "Error: boom" if outcome == "raise" else outcome_text(outcome)
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": f"call_{k}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"call_{k}", "content": text})
        decision = guard.check(name, args)
        guard_ordinals.append(decision.ordinal)
        guard.record(name, args, text)
    folder = tmp_path_factory.mktemp("traj")
    path = folder / "run.json"
    path.write_text(json.dumps({"messages": messages}), encoding="utf-8")
    db = folder / "t.duckdb"
    ingest(db, [path])
    con = open_store(db, read_only=True)
    try:
        stored = [r[0] for r in con.execute("SELECT ordinal FROM tool_calls ORDER BY start_ns, span_id").fetchall()]
    finally:
        con.close()
    assert stored == guard_ordinals == naive_ordinals(steps)


def test_read_only_programs_leave_the_other_parts_writes() -> None:
    from treellm.engine.repeats import call_targets

    rule = ToolRule(read_only=[r"^python3? test\w*\.py$"])
    assert not call_targets(rule, "bash", {"command": "python test_x.py"}).changes_state
    heredoc = call_targets(rule, "bash", {"command": "cat > test_x.py << 'EOF'\nprint(1)\nEOF\npython test_x.py"})
    assert heredoc.changes_state and heredoc.writes == frozenset({"test_x.py"})
    # a writer whose targets cannot be named in the same command still writes anything
    assert call_targets(rule, "bash", {"command": "git stash && python test_x.py"}).writes is None
    assert call_targets(rule, "bash", {"command": "python fix.py && python test_x.py"}).writes is None


PATCH = "--- a/src/pkg/core.py\n+++ b/src/pkg/core.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"


@pytest.mark.parametrize(
    ("command", "writes"),
    [
        # a patch file written from a heredoc, then applied, in one command: the patch names what it writes
        (f"cat > fix.patch << 'EOF'\n{PATCH}EOF\n\npatch -p1 < fix.patch", {"fix.patch", "src/pkg/core.py"}),
        (f"cat > fix.patch <<EOF\n{PATCH}EOF\ngit apply fix.patch", {"fix.patch", "src/pkg/core.py"}),
        (f"tee fix.patch << 'EOF' > /dev/null\n{PATCH}EOF\npatch -p1 < fix.patch", {"fix.patch", "src/pkg/core.py"}),
        (f"patch -p1 << 'EOF'\n{PATCH}EOF", {"src/pkg/core.py"}),  # fed the heredoc itself, as before
        # a patch file this command did not write, or filled by anything but a heredoc: unknown
        ("patch -p1 < fix.patch", None),
        ("git apply fix.patch", None),
        (f"cat > fix.patch << 'EOF'\n{PATCH}EOF\npatch -p1 < other.patch", None),
        (f"cat >> fix.patch << 'EOF'\n{PATCH}EOF\npatch -p1 < fix.patch", None),  # appended: more than the heredoc
        (f"cat > $P << 'EOF'\n{PATCH}EOF\npatch -p1 < $P", None),
        (f"cat part.patch > fix.patch << 'EOF'\n{PATCH}EOF\npatch -p1 < fix.patch", None),  # cat of a file, not stdin
        # the file written again between: its text is no longer the heredoc's
        (f"cat > fix.patch << 'EOF'\n{PATCH}EOF\necho x > fix.patch\npatch -p1 < fix.patch", None),
        (f"cat > fix.patch << 'EOF'\n{PATCH}EOF\ncat more.patch >> fix.patch\npatch -p1 < fix.patch", None),
        (f"cat > fix.patch << 'EOF'\n{PATCH}EOF\npython mend.py\npatch -p1 < fix.patch", None),
        # another file written between changes nothing
        (
            f"cat > fix.patch << 'EOF'\n{PATCH}EOF\necho x > notes.txt\npatch -p1 < fix.patch",
            {"fix.patch", "notes.txt", "src/pkg/core.py"},
        ),
    ],
)
def test_a_patch_applied_from_a_file_the_same_command_wrote_writes_what_it_names(
    command: str, writes: set[str] | None
) -> None:
    from treellm.shell import command_targets

    found = command_targets(command)
    assert found.effect == "write"
    assert (None if found.writes_unknown else set(found.known_writes)) == writes


@pytest.mark.parametrize(
    ("command", "use"),
    [
        ("open chall.py", ("opens", "chall.py")),
        ('open "src/setup.py" 30', ("opens", "src/setup.py")),
        ("create reproduce.py", ("opens", "reproduce.py")),
        ("edit 1:1\nwith open('x', 'rb') as f:\nend_of_edit", ("writes", None)),
        ("insert 'import os'", ("writes", None)),
        ("goto 120", ("shows", None)),
        ("scroll_down", ("shows", None)),
        # an open that names no one file, or does more: which file is open is then unknown
        ("open $F", ("opens", None)),
        ("open a.py && cat b.py", ("opens", None)),
        ("open", ("opens", None)),
        # other commands leave the editor alone, whatever they hold
        ("cat chall.py", None),
        ("str_replace_editor view chall.py", None),
        ("echo edit", None),
        ("", None),
    ],
)
def test_swe_agents_editor_commands_say_how_they_use_the_open_file(command: str, use: Any) -> None:
    from treellm.shell import editor_use

    assert editor_use(command) == use


def _on_line(parents: dict[str, str | None], node: str | None, end: str | None) -> bool:
    """The definition, walked naively: ``node`` is ``end`` or one of its ancestors, on a line that
    reaches a root (a line that runs into a cycle is no line)."""
    if node is None or node == end:
        return True
    if end is None:
        return False
    seen: list[str] = []
    current = parents.get(end) if end in parents else None
    while current is not None:
        if current in seen or current == end:
            return False
        seen.append(current)
        current = parents.get(current)
    return node in seen


@given(st.data())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_repeats_path_is_read_as_its_line_of_think_nodes_whatever_the_depth(data: st.DataObject) -> None:
    from treellm.derive.repeats import _WALK, _Lines

    size = data.draw(st.integers(1, 3 * _WALK))
    nodes = [f"n{i}" for i in range(size)]
    parents: dict[str, str | None] = {}
    kinds = ["chain"] if data.draw(st.booleans()) else ["chain", "chain", "tree", "root", "outside", "any"]
    for i, node in enumerate(nodes):
        kind = data.draw(st.sampled_from(kinds))
        if i == 0 or kind == "root":
            parents[node] = None
        elif kind == "chain":  # deep lines: a loop of many turns
            parents[node] = nodes[i - 1]
        elif kind == "tree":
            parents[node] = nodes[data.draw(st.integers(0, i - 1))]
        elif kind == "outside":  # a parent id that no think node is
            parents[node] = "outside"
        else:  # any node, itself or a later one: cycles
            parents[node] = nodes[data.draw(st.integers(0, size - 1))]
    if data.draw(st.booleans()):  # the first node's parent the last: the whole chain a cycle
        parents[nodes[0]] = nodes[-1]
    lines = _Lines(parents)
    choices = [*nodes, "outside", "unknown", None]
    asked = [(nodes[0], nodes[-1]), (nodes[-1], nodes[0])]
    asked += [(data.draw(st.sampled_from(choices)), data.draw(st.sampled_from(choices))) for _ in range(60)]
    for node, end in asked:
        assert lines.on(node, end) == _on_line(parents, node, end), (node, end)


@pytest.mark.parametrize(
    ("command", "names_only"),
    [
        ("ls", True), ("ls -F", True), ("ls -F\n", True), ("ls -a src tests", True), ("ls -1 /testbed/src", True),
        ("ls ./src", True), ("ls -F -a", True),
        # a long format prints sizes and times; a pipe, a glob or a second command print other things
        ("ls -la", False), ("ls -l src", False), ("ls -s", False), ("ls | head", False), ("ls *.py", False),
        ("ls && cat x", False), ("lsof", False), ("ls $DIR", False),
        ("  ls -F", False),  # a listing starts the command: the store's prefilter looks for `"ls`
    ],
)  # fmt: skip
def test_a_listing_of_names_only_is_told_apart(command: str, names_only: bool) -> None:
    from treellm.shell import lists_names

    assert lists_names(command) is names_only
