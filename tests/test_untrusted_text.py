"""Trace text is untrusted: every renderer shows it as typed, never as markup or terminal control.

The hostile store built here (treellm's own executor and JSONL exporter, then names and ids
rewritten as another agent could write them) is shared with ``test_dashboard`` (AppTest)
and ``test_browser`` (a real Chromium).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from rich.console import Console
from rich.table import Table

from dashboard.charts import (
    chart_text,
    prune_rate_chart,
    repeat_outcomes_chart,
    shape_chart,
    timeline_chart,
    tree_chart,
    tree_icicle,
    what_if_chart,
)
from dashboard.text import literal
from treellm import ModelTurn, OTLPJsonlSpanExporter, ScriptedModel, Tool, ToolCall, TreeConfig, TreeExecutor
from treellm.inspector import terminal_text
from treellm.store import ingest

MARKDOWN = "![x](http://127.0.0.1:9/x.png) **bold** [link](http://example.invalid)"
HTML = "<img src=x onerror=alert(1)> <b>b</b> <a href=http://example.invalid>a</a>"
TERMINAL = "\x1b[31mred\x1b[0m \x9b2J \r\x07 [red]x[/]"
HOSTILE = f"{MARKDOWN} {HTML} {TERMINAL}"
"""Markdown, HTML, terminal escapes and rich markup in one string: what every name and id holds."""

SERVICE = f"service {HOSTILE}"
AGENTS = (f"agent-1 {HOSTILE}", f"agent-2 {HOSTILE}")
MODEL = f"model {HOSTILE}"
TOOL = f"tool {HOSTILE}"
RUN_IDS = (f"run-1 {HOSTILE}", f"run-2 {HOSTILE}")
MISSING_RUN = f"no-such-run {MARKDOWN} {HTML}"
"""A ``?run=`` parameter that names no run: the page reflects it."""
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def node_id(plain: str) -> str:
    """The hostile id of the executor's node ``plain`` (n1, n2, ...)."""
    return f"{plain} {HTML} {MARKDOWN}"


def _rewrite(value: Any, names: dict[str, str]) -> Any:
    """Every string in an OTLP JSON document with the placeholder names replaced."""
    if isinstance(value, dict):
        return {k: _rewrite(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_rewrite(v, names) for v in value]
    if isinstance(value, str):
        if re.fullmatch(r"n\d+", value):
            return node_id(value)
        for placeholder, name in names.items():
            value = value.replace(placeholder, name)
    return value


def hostile_store(folder: Path) -> Path:
    """A store of two runs (one per hostile agent) whose every name, id, argument and result
    holds :data:`HOSTILE`: a tool called three times with the same arguments (a wasted
    repeat, then a pruned call), so every page of the dashboard has something to draw."""

    async def echo(args: dict[str, Any]) -> str:
        return f"result {args['q']}"

    raw = folder / "hostile-raw.jsonl"
    for agent, run_id in zip(("agent_x1", "agent_x2"), RUN_IDS, strict=True):
        call = ToolCall("tool_x", {"q": HOSTILE})  # the third is pruned, the second a wasted repeat
        turns = [ModelTurn(tool_calls=[call, call, call], text=f"thinking {HOSTILE}"), ModelTurn(text=HOSTILE)]
        provider = TracerProvider(resource=Resource.create({"service.name": "service_x"}))
        provider.add_span_processor(SimpleSpanProcessor(OTLPJsonlSpanExporter(raw)))
        TreeExecutor(
            ScriptedModel(turns, model_name="model_x"),
            [Tool("tool_x", "echo", handler=echo, max_repeats=2)],
            TreeConfig(),
            name=agent,
            tracer_provider=provider,
            run_ids=lambda run_id=run_id: run_id,
        ).run(f"task {HOSTILE}")
        provider.shutdown()
    names = {"service_x": SERVICE, "agent_x1": AGENTS[0], "agent_x2": AGENTS[1], "model_x": MODEL, "tool_x": TOOL}
    path = folder / "hostile.jsonl"
    with path.open("w", encoding="utf-8") as out:
        for line in raw.read_text(encoding="utf-8").splitlines():
            out.write(json.dumps(_rewrite(json.loads(line), names)) + "\n")
    db = folder / "hostile.duckdb"
    ingest(db, [path])
    return db


# -- the escaping helpers ---------------------------------------------------------------------------


def test_every_chart_escapes_names_and_ids() -> None:
    nodes = [
        {"node_id": node_id("n1"), "kind": "think", "parent_id": None, "depth": 0, "status": "completed",
         "tool": None, "ordinal": None, "limit": None, "limit_source": None, "arguments": None, "skill_stack": None},
        {"node_id": node_id("n2"), "kind": "tool", "parent_id": node_id("n1"), "depth": 0, "status": HTML,
         "tool": TOOL, "ordinal": 1, "limit": 1, "limit_source": HTML, "arguments": HTML, "skill_stack": HTML},
    ]  # fmt: skip
    loops = [{"node_id": node_id("n1"), "tool": TOOL, "count": 1, "limit": 1, "limit_source": HTML, "action": HTML,
              "shadow": False, "arguments": HTML, "earlier_node_ids": json.dumps([node_id("n2")])}]  # fmt: skip
    import pandas as pd

    # Vega-Lite draws text as text: the name as given (one line, cut), never a field, link or image
    rates = pd.DataFrame([{"tool": TOOL, "calls": 3, "pruned": 2, "pruned_prune": 2, "pruned_nudge": 0,
                           "pruned_cache": 0}])  # fmt: skip
    outcomes = pd.DataFrame([{"tool": TOOL, "ordinal": 2, "productive": 1, "wasted": 2}])
    for chart in (prune_rate_chart(rates), repeat_outcomes_chart(outcomes)):
        spec = chart.to_dict()
        shown = {row["tool"] for rows in spec["datasets"].values() for row in rows}
        assert shown == {chart_text(TOOL)} and "<b>b</b>" in chart_text(TOOL) and "\x1b" not in chart_text(TOOL)
        assert not {"href", "url", "image"} & set(spec["encoding"]), spec["encoding"]
    spans = pd.DataFrame([{"span_id": "s1", "parent_span_id": None, "name": TOOL, "node_id": node_id("n2"),
                           "kind": "tool", "start_ns": 0, "end_ns": 5, "status": HTML, "tool": TOOL}])  # fmt: skip
    timed = [{**loops[0], "time_ns": 2}]
    groups = pd.DataFrame([{"max_depth": 2, "max_breadth": 1, "runs": 3, "nodes": 4.0, "agent": TOOL, "example": HTML}])
    drawn, caught = pd.DataFrame(nodes), pd.DataFrame(loops)
    charts = (tree_chart(drawn, caught), tree_icicle(drawn, caught), timeline_chart(spans, pd.DataFrame(timed)),
              shape_chart(groups, "agent"))  # fmt: skip
    for chart in charts:
        spec = chart.to_dict()
        texts = [v for rows in spec["datasets"].values() for row in rows for v in row.values() if isinstance(v, str)]
        assert any("<b>b</b>" in v for v in texts) and not any(CONTROL.search(v) for v in texts)  # one line, as text
        outside = json.dumps({k: v for k, v in spec.items() if k != "datasets"}, ensure_ascii=False)
        assert "<b>" not in outside and HTML not in outside  # trace text only in the data, drawn as text
        for layer in spec.get("layer", [spec]):
            assert not {"href", "url", "image"} & set(layer["encoding"]), layer["encoding"]
    what_if = pd.DataFrame([{"tool": TOOL, "limit": 1, "current_limit": 1, "saved": 1, "lost": 0, "unknown": 0,
                             "branches_ended": 0}])  # fmt: skip
    title = what_if_chart(what_if, TOOL).to_dict()["title"]["text"]  # the one chart that names trace text outside data
    assert title == f"What if: limits for {chart_text(TOOL)}" and not CONTROL.search(title)


def test_literal_markdown_escapes_every_construct() -> None:
    shown = literal(f"{MARKDOWN} {HTML} `code` $x$ :red[r] :smile: # h\n- item\r\x1b")
    punctuation = r"[!-/:-@\[-`{-~]"
    other = r"[^\x00-\x1f\x7f-\x9f!-/:-@\[-`{-~]"
    assert re.fullmatch(rf"(?:\\{punctuation}|{other})*", shown), shown  # each punctuation mark escaped
    assert all(shown[i + 1] == "\u2060" for i, c in enumerate(shown) if c == ":")  # no :shortcode: left
    assert literal("coder") == "coder" and literal(None) == "" and literal(float("nan")) == ""
    unescaped = re.sub(r"\\(.)", r"\1", shown).replace("\u2060", "")
    assert unescaped == f"{MARKDOWN} {HTML} `code` $x$ :red[r] :smile: # h - item"


def test_terminal_text_shows_escapes_and_markup_literally() -> None:
    text = terminal_text("a\x1b[31mred\x9b2J\rb\x07c [red]x[/] [bold]y\u202ez\nd\te")
    assert text.plain == "a\\x1b[31mred\\x9b2J\\rb\\x07c [red]x[/] [bold]y\\u202ez\\nd\\te"
    assert text.spans == []
    assert terminal_text("l1\nl2\tt", keep_lines=True).plain == "l1\nl2\tt"
    out = io.StringIO()
    Console(file=out, force_terminal=True, color_system="truecolor", width=200).print(terminal_text(TERMINAL))
    printed = out.getvalue()
    assert "[red]x[/]" in printed and "\\x1b[31mred" in printed and "\x1b[31mred" not in printed
    assert not CONTROL.search(re.sub(r"\x1b\[[0-9;]*m", "", printed).replace("\n", ""))  # rich's own styles only


def test_a_report_table_cell_keeps_rich_markup_as_text() -> None:
    out = io.StringIO()
    table = Table()
    table.add_column("tool")
    table.add_row(terminal_text("[bold red]x[/] \x1b]8;;http://example.invalid\x07link"))
    Console(file=out, force_terminal=True, color_system="truecolor", width=200).print(table)
    assert "[bold red]x[/]" in out.getvalue() and "\x1b]8;;" not in out.getvalue()


# -- the command line -------------------------------------------------------------------------------


def _treellm(*args: str) -> bytes:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    result = subprocess.run([sys.executable, "-m", "treellm", *args], capture_output=True, check=False,
                            env={**env, "COLUMNS": "600"})  # fmt: skip
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return result.stdout


def _assert_no_control(output: bytes) -> str:
    """The output as text, once checked free of any control byte but newlines (ESC, CSI, BEL, CR...)."""
    text = output.decode("utf-8")
    assert not CONTROL.search(text.replace("\n", "")), repr(CONTROL.findall(text))
    return text


def test_report_and_tune_print_hostile_names_without_control_bytes(tmp_path: Path) -> None:
    db = hostile_store(tmp_path)
    table = _assert_no_control(_treellm("report", "--db", str(db)))
    assert "[red]x[/]" in table and "\\x1b[31mred" in table and "\\x9b2J" in table and "<b>b</b>" in table
    assert "**bold**" in table
    for fmt in ("json", "toml"):
        printed = _assert_no_control(_treellm("tune", "--db", str(db), "--format", fmt, "--min-samples", "1"))
        assert "[red]x[/]" in printed and "<b>b</b>" in printed, fmt
    document = _treellm("report", "--db", str(db), "--format", "json")
    assert not CONTROL.search(document.decode().replace("\n", ""))
    assert TOOL in {item["tool"] for item in json.loads(document)["tools"]}
    toml = _treellm("tune", "--db", str(db), "--format", "toml", "--min-samples", "1").decode()
    assert tomllib.loads(toml)["tools"].keys() == {TOOL}  # the same name, once the TOML is read


def test_the_reports_note_on_internal_tools_prints_a_hostile_name_without_control_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A framework-internal tool is named by the trace (and by ``TREELLM_INTERNAL_TOOLS``): the
    report's note under its table shows it as typed, as the table does its tools."""
    source = Path(__file__).parent / "data" / "external" / "any-agent-SMOLAGENTS_trace.json"
    hostile = tmp_path / "smolagents-hostile.json"
    document = _rewrite(json.loads(source.read_text(encoding="utf-8")), {"write_file": TOOL})
    hostile.write_text(json.dumps(document), encoding="utf-8")
    monkeypatch.setenv("TREELLM_INTERNAL_TOOLS", f"final_answer,{TOOL}")
    db = tmp_path / "t.duckdb"
    ingest(db, [hostile])
    printed = json.loads(_treellm("report", "--db", str(db), "--format", "json"))
    assert {item["tool"] for item in printed["internal_tools"]} == {"final_answer", TOOL}
    table = _assert_no_control(_treellm("report", "--db", str(db)))
    note = next(line for line in table.splitlines() if line.startswith("Framework-internal tools"))
    assert "\\x1b[31mred" in note and "\\x9b2J" in note and "[red]x[/]" in note and "final_answer (1 call)" in note
