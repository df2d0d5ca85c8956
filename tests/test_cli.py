"""The treellm command: version, module entry point, help with examples."""

from __future__ import annotations

import json
import subprocess
import sys
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
