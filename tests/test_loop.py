"""LoopDetector and PathSignatures: path-local counts, limits, immutability."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from treellm import ConfigError, LoopDetector, PathSignatures, signature
from treellm.loop import call_key


def test_first_call_passes_and_an_exact_repeat_is_caught_by_default() -> None:
    det = LoopDetector()
    path = PathSignatures.empty()
    assert not det.would_loop(path, "search", {"q": "x"})
    path = det.extend_path(path, "search", {"q": "x"}, node_id="n1")
    assert det.would_loop(path, "search", {"q": "x"})
    assert not det.would_loop(path, "search", {"q": "y"})
    assert not det.would_loop(path, "fetch", {"q": "x"})


def test_argument_key_order_and_text_form_do_not_matter() -> None:
    det = LoopDetector()
    path = det.extend_path(PathSignatures.empty(), "web", '{"b": 2, "a": 1}')
    assert det.would_loop(path, "web", {"a": 1, "b": 2})


def test_extend_never_changes_the_parent_and_siblings_are_independent() -> None:
    det = LoopDetector()
    parent = det.extend_path(PathSignatures.empty(), "read_file", {"path": "a"}, node_id="n1")
    branch_a = det.extend_path(parent, "search", {"q": "x"}, node_id="a1")
    branch_b = det.extend_path(parent, "grep", {"q": "x"}, node_id="b1")
    assert parent.count(call_key("search", {"q": "x"})) == 0
    assert det.would_loop(branch_a, "search", {"q": "x"})
    assert not det.would_loop(branch_b, "search", {"q": "x"})
    assert len(parent) == 1 and len(branch_a) == 2 and len(branch_b) == 2


def test_decision_names_count_limit_source_and_earlier_nodes() -> None:
    det = LoopDetector(max_repeats=2)
    path = PathSignatures.empty()
    for node in ("n1", "n2"):
        path = det.extend_path(path, "search", {"q": "x"}, node_id=node)
    decision = det.check(path, "search", {"q": "x"})
    assert decision.caught
    assert (decision.count, decision.limit, decision.limit_source, decision.ordinal) == (2, 2, "default", 3)
    assert decision.earlier_node_ids == ("n1", "n2")
    assert decision.signature == signature("search", {"q": "x"})


def test_limit_precedence_file_over_tool_over_default() -> None:
    path = LoopDetector().extend_path(PathSignatures.empty(), "fetch", {"u": 1})
    default_only = LoopDetector(max_repeats=1)
    assert default_only.check(path, "fetch", {"u": 1}).limit_source == "default"
    tool = default_only.check(path, "fetch", {"u": 1}, max_repeats=3)
    assert (tool.limit, tool.limit_source, tool.caught) == (3, "tool", False)
    with_file = LoopDetector(max_repeats=5, file_limits={"fetch": 1})
    filed = with_file.check(path, "fetch", {"u": 1}, max_repeats=3)
    assert (filed.limit, filed.limit_source, filed.caught) == (1, "file", True)
    assert with_file.check(path, "other", {}, max_repeats=None).limit == 5


def test_a_limit_of_zero_catches_every_call() -> None:
    assert LoopDetector(max_repeats=0).would_loop(PathSignatures.empty(), "t", {})


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_invalid_limits_are_refused_with_the_value(bad: object) -> None:
    with pytest.raises(ConfigError, match="expected an integer >= 0"):
        LoopDetector(max_repeats=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="limit of t"):
        LoopDetector(file_limits={"t": bad})  # type: ignore[dict-item]


def test_a_djb2_collision_never_counts_a_different_call() -> None:
    # "ab" and "bA" collide in djb2 (33*97 + 98 == 33*98 + 65), and so do the
    # canonical texts that embed them at the same place.
    assert signature("t", {"q": "ab"}) == signature("t", {"q": "bA"})
    det = LoopDetector()
    path = det.extend_path(PathSignatures.empty(), "t", {"q": "ab"})
    assert not det.would_loop(path, "t", {"q": "bA"})
    assert det.would_loop(path, "t", {"q": "ab"})


def test_malformed_arguments_count_under_their_raw_text() -> None:
    det = LoopDetector()
    path = det.extend_path(PathSignatures.empty(), "read", '{"path": "a"')
    assert det.would_loop(path, "read", '{"path": "a"')
    assert not det.would_loop(path, "read", '{"path": "b"')
    assert not det.would_loop(path, "read", {})
    # raw text is kept apart from the parsed string with the same characters
    raw = det.extend_path(PathSignatures.empty(), "t", "abc")
    assert not det.would_loop(raw, "t", '"abc"')


def test_a_successful_mutating_call_restarts_the_other_tools_counts() -> None:
    det = LoopDetector()
    path = det.extend_path(PathSignatures.empty(), "read_file", {"p": "a"}, node_id="r1")
    path = det.extend_path(path, "edit_file", {"p": "a"}, node_id="e1", mutates=True)
    decision = det.check(path, "read_file", {"p": "a"})
    assert not decision.caught and decision.earlier_node_ids == ()
    # the mutating tool's own repeats still count
    assert det.would_loop(path, "edit_file", {"p": "a"})
    path = det.extend_path(path, "read_file", {"p": "a"}, node_id="r2")
    assert det.check(path, "read_file", {"p": "a"}).earlier_node_ids == ("r2",)


def test_a_mutating_tool_restarts_counts_for_the_previous_mutating_tool() -> None:
    det = LoopDetector()
    path = det.extend_path(PathSignatures.empty(), "edit", {"x": 1}, mutates=True)
    path = det.extend_path(path, "write", {"x": 1}, mutates=True)
    assert not det.would_loop(path, "edit", {"x": 1})
    assert det.would_loop(path, "write", {"x": 1})
    path = det.extend_path(path, "write", {"x": 2}, mutates=True)
    assert not det.would_loop(path, "edit", {"x": 1})


calls = st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 2), st.booleans())


@given(st.lists(st.tuples(st.integers(0, 30), calls), max_size=40))
def test_counts_match_a_naive_replay_on_every_branch(steps: list[tuple[int, tuple[str, int, bool]]]) -> None:
    """Random trees: each step extends some existing path; compare with a list replay."""
    det = LoopDetector()
    paths: list[tuple[PathSignatures, list[tuple[str, int, bool]]]] = [(PathSignatures.empty(), [])]
    for parent_index, (tool, arg, mutates) in steps:
        path, history = paths[parent_index % len(paths)]
        paths.append((det.extend_path(path, tool, {"v": arg}, mutates=mutates), [*history, (tool, arg, mutates)]))
    for path, history in paths:
        for tool in "abc":
            for arg in range(3):
                expected = 0
                for h_tool, h_arg, h_mut in history:
                    if h_mut and (h_tool, h_arg) != (tool, arg):  # a state change by another key
                        expected = 0
                    if (h_tool, h_arg) == (tool, arg):
                        expected += 1
                assert path.count(call_key(tool, {"v": arg})) == expected
