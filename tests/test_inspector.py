"""The terminal inspector: the tree of a scripted run, pinned by a snapshot; the live log."""

from __future__ import annotations

import io
import os
from pathlib import Path

from rich.console import Console

from treellm.inspector import LiveLog, tree_text
from treellm.simulate.demo import run_demo

SNAPSHOT = Path(__file__).parent / "snapshots" / "inspector_demo_tree.txt"


def test_the_demo_tree_matches_its_snapshot() -> None:
    result = run_demo([], run_ids=lambda: "demo-run", telemetry=False)
    text = tree_text(result, width=140)
    if os.environ.get("TREELLM_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.write_text(text, encoding="utf-8")
    assert text == SNAPSHOT.read_text(encoding="utf-8")


def test_the_tree_shows_pruned_calls_under_the_node_that_asked() -> None:
    result = run_demo([], run_ids=lambda: "r", telemetry=False)
    lines = tree_text(result, width=200).splitlines()
    pruned = [i for i, line in enumerate(lines) if "✂ pruned" in line]
    assert len(pruned) == result.stats.pruned == 3
    for index in pruned:
        owner = next(lines[j] for j in range(index - 1, -1, -1) if "think n" in lines[j])
        assert owner.index("think") < lines[index].index("✂")


def test_the_live_log_prints_a_line_per_step_and_keeps_markup_as_text() -> None:
    buffer = io.StringIO()
    log = LiveLog(Console(file=buffer, width=200, color_system=None))
    result = run_demo([log], telemetry=False)
    out = buffer.getvalue()
    assert "⟲ loop: read_file" in out and "↻ run_tests attempt 1 failed" in out
    assert f"run completed: {result.stats.nodes} nodes" in out


def test_markup_in_tool_arguments_is_shown_as_text() -> None:
    from treellm import ModelTurn, ScriptedModel, Tool, ToolCall, TreeExecutor

    async def echo(args: dict[str, str]) -> str:
        return args["q"]

    model = ScriptedModel([ModelTurn(tool_calls=[ToolCall("echo", {"q": "[bold red]boom[/]"})]), ModelTurn(text="ok")])
    buffer = io.StringIO()
    log = LiveLog(Console(file=buffer, width=200, color_system=None))
    result = TreeExecutor(model, [Tool("echo", "e", handler=echo)], observers=[log], telemetry=False).run("t")
    assert "[bold red]boom[/]" in buffer.getvalue()
    assert "[bold red]boom[/]" in tree_text(result)
