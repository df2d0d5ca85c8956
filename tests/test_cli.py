"""The treellm command: version, module entry point, help with examples."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from treellm import __version__
from treellm.cli import build_parser, main


def test_version_flag_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"treellm {__version__}"


def test_python_dash_m_treellm_runs_the_cli() -> None:
    result = subprocess.run([sys.executable, "-m", "treellm", "--version"], capture_output=True, text=True, check=False)
    assert result.returncode == 0 and __version__ in result.stdout


def test_sign_prints_the_tree_llm_signature(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sign", "search", '{"query":"loop detection","limit":10}']) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {
        "tool": "search",
        "signature": "search:1u0jffc",
        "canonical": '{"limit":10,"query":"loop detection"}',
        "valid_json": True,
    }


def test_every_command_has_help_with_an_example() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, command in sub.choices.items():  # type: ignore[attr-defined]
        assert "example" in (command.epilog or ""), name


def test_ingest_prints_the_counts_as_json_and_a_bad_file_is_one_line(tmp_path: Any) -> None:
    from pathlib import Path

    data = Path(__file__).parent / "data" / "external" / "any-agent-OPENAI_trace.json"
    db = tmp_path / "cli.duckdb"
    ok = subprocess.run(
        [sys.executable, "-m", "treellm", "ingest", str(data), "--db", str(db), "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    counts = json.loads(ok.stdout)
    assert {k: counts[k] for k in ("files", "spans", "runs", "skipped", "duplicates")} == {
        "files": 1, "spans": 6, "runs": 1, "skipped": 0, "duplicates": 0,
    }  # fmt: skip
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"resourceSpans": []}\n{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": 1}]}]}]}\n')
    failed = subprocess.run(
        [sys.executable, "-m", "treellm", "ingest", str(bad), "--db", str(db), "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert failed.returncode == 1
    assert failed.stderr.strip().splitlines() == [
        f"treellm: error: {bad}:2: resourceSpans[0].scopeSpans[0].spans[0].traceId: expected 32 hex digits, "
        "not all zero, got the number 1"
    ]


# -- the terminal report keeps every tool name whole ---------------------------------------------------

LONG_TOOLS = ("mcp__github__create_pull_request_review_comment_reply", "filesystem_read_text_file_with_line_numbers")


def _report_data(tools: tuple[str, ...]) -> dict[str, Any]:
    rows = [
        {"tool": name, "calls": 12345, "pruned": 3, "prune_rate": 0.2, "identical_repeats": 4, "identical_wasted": 2,
         "exact_repeats": 3, "productive_repeats": 1, "wasted_repeats": 1, "unknown_repeats": 1, "near_repeats": 0}
        for name in tools
    ]  # fmt: skip
    return {"runs": 3, "tool_calls": 12345 * len(tools), "pruned": 3 * len(tools), "tools": rows}


def _shown(data: dict[str, Any], width: int) -> list[str]:
    from rich.console import Console

    from treellm.cli import _report_renderable

    console = Console(width=width, record=True, file=io.StringIO())
    console.print(_report_renderable(data, width))
    return console.export_text().splitlines()


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("tools", [LONG_TOOLS, ("read_file", "search")], ids=["long", "short"])
def test_the_terminal_report_never_cuts_a_tool_name_or_a_number(width: int, tools: tuple[str, ...]) -> None:
    lines = _shown(_report_data(tools), width)
    assert all(len(line) <= width for line in lines)
    for name in tools:
        assert any(name in line for line in lines), (name, lines)
    text = "\n".join(lines)
    assert "…" not in text and "12345" in text and "20.0%" in text


def test_the_report_is_a_table_with_whole_headers_where_it_fits_and_blocks_where_it_does_not() -> None:
    short = _shown(_report_data(("read_file", "search")), 120)
    assert any(line.startswith("tool ") and "exact repeats" in line for line in short)  # full headers, one table
    narrow = _shown(_report_data(("read_file", "search")), 80)
    assert any(line.startswith("tool ") and "prod." in line for line in narrow)  # abbreviated, still one table
    assert any("ident.: identical" in line for line in narrow)
    long = _shown(_report_data(LONG_TOOLS), 80)
    assert LONG_TOOLS[0] in long and LONG_TOOLS[1] in long  # each name on a line of its own
    assert any(line.strip().startswith("calls 12345") for line in long)


def test_report_on_a_narrow_terminal_prints_whole_tool_names(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    data = Path(__file__).parent.parent / "sample_traces" / "branch_local_loop.jsonl"
    subprocess.run([sys.executable, "-m", "treellm", "ingest", str(data), "--db", str(db)], check=True,
                   capture_output=True)  # fmt: skip
    shown = subprocess.run(
        [sys.executable, "-m", "treellm", "report", "--db", str(db)],
        capture_output=True, text=True, check=True, env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    for name in ("read_file", "edit_file", "skill_review", "run_tests", "search"):
        assert name in shown.stdout
    assert "…" not in shown.stdout and max(len(line) for line in shown.stdout.splitlines()) <= 80


def test_report_into_a_pipe_is_one_row_a_tool_at_any_width(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    data = Path(__file__).parent.parent / "sample_traces" / "production_day.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    ingested = subprocess.run([sys.executable, "-m", "treellm", "ingest", str(data), "--db", str(db)], check=True,
                              capture_output=True, text=True, env=env)  # fmt: skip
    counts, places = ingested.stdout.splitlines()  # each summary line whole, none broken at 80 columns
    assert counts.startswith("1 file(s) into ") and counts.endswith(" torn line(s) skipped")
    assert places.startswith("spans: ") and places.endswith(" caught call(s)")
    piped = subprocess.run([sys.executable, "-m", "treellm", "report", "--db", str(db)],
                           capture_output=True, text=True, check=True, env=env)  # fmt: skip
    shown = subprocess.run([sys.executable, "-m", "treellm", "report", "--db", str(db), "--format", "json"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    table = json.loads(shown.stdout)
    lines = piped.stdout.splitlines()
    assert any(line.split()[:4] == ["tool", "calls", "pruned", "prune"] for line in lines)  # the whole headers
    for item in table["tools"]:  # a tool's row holds its name and its numbers, as `grep TOOL` would find it
        (row,) = [line for line in lines if line.split()[:1] == [item["tool"]]]
        assert row.split()[1:3] == [str(item["calls"]), str(item["pruned"])]


def test_ingest_of_a_folder_prints_the_files_of_other_types_it_skipped(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    (folder / ".git").mkdir(parents=True)
    (folder / ".git" / "config").write_text("[core]\n", encoding="utf-8")
    (folder / "notes.md").write_text("# notes\n", encoding="utf-8")
    (folder / "run.jsonl").write_bytes((Path(__file__).parent.parent / "sample_traces" / "retries.jsonl").read_bytes())
    command = [sys.executable, "-m", "treellm", "ingest", str(folder), "--db", str(tmp_path / "t.duckdb")]
    shown = subprocess.run(command, capture_output=True, text=True, check=True)
    assert [line for line in shown.stderr.splitlines() if line.strip()] == [
        f"treellm: skipped a file of another type: {folder / 'notes.md'}"
    ]
    as_json = subprocess.run([*command, "--json"], capture_output=True, text=True, check=True)
    assert json.loads(as_json.stdout)["skipped_files"] == [str(folder / "notes.md")]


# -- a time window as people write it: a date, or an age ----------------------------------------------


def test_a_window_bound_is_an_iso_moment_or_an_age_before_now() -> None:
    import datetime as dt

    from treellm.analysis.filters import moment

    now = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.UTC)
    assert moment("7d", now) == dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
    assert moment(" 12h ", now) == dt.datetime(2026, 12, 6, 0, 0, tzinfo=dt.UTC)
    assert moment("2w", now) == moment("14d", now) == moment("336h", now)
    assert moment("90s", now) == now - dt.timedelta(seconds=90) and moment("5m", now) == now - dt.timedelta(minutes=5)
    assert moment("2026-11-30", now) == dt.datetime(2026, 11, 30)
    assert moment("2026-11-30T08:15+02:00", now) == dt.datetime(2026, 11, 30, 6, 15, tzinfo=dt.UTC)
    for bad in ("7x", "d7", "-7d", "1.5d", "", "yesterday"):
        with pytest.raises(ValueError, match=r"an ISO date or time such as 2026-11-30.* or an age such as 7d"):
            moment(bad, now)


def test_report_since_and_until_take_an_age(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    data = Path(__file__).parent.parent / "sample_traces" / "branch_local_loop.jsonl"
    assert main(["ingest", str(data), "--db", str(db)]) == 0

    def runs(*window: str) -> int:
        shown = subprocess.run(
            [sys.executable, "-m", "treellm", "report", "--db", str(db), "--format", "json", *window],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return int(json.loads(shown.stdout)["runs"])

    every = runs()
    assert every > 0
    # the sample's runs started in the past, and within ten thousand weeks of any clock this test meets
    assert runs("--since", "10000w") == every and runs("--until", "0s") == every
    assert runs("--since", "0s") == 0 and runs("--until", "10000w") == 0
    failed = subprocess.run(
        [sys.executable, "-m", "treellm", "report", "--db", str(db), "--since", "7x"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert failed.returncode != 0
    assert failed.stderr.startswith("treellm: error: --since: expected an ISO date or time such as 2026-11-30")
    assert "or an age such as 7d or 12h" in failed.stderr and "Traceback" not in failed.stderr
