"""Progress on long work: ``ingest`` tells where it is (files, bytes, new spans, the step) to a
callback, which the command line draws as a bar on a terminal (and nothing elsewhere)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from treellm.store.ingest import IngestProgress, ingest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
FILES = [DATA / "frameworks" / "strands.pb", ROOT / "sample_traces" / "retries.jsonl",
         DATA / "external" / "tau-bench-gpt-4o-airline-excerpt.json"]  # fmt: skip


def test_ingest_tells_files_bytes_spans_and_steps_in_order(tmp_path: Path) -> None:
    seen: list[IngestProgress] = []
    report = ingest(tmp_path / "t.duckdb", FILES, progress=seen.append)
    total = sum(p.stat().st_size for p in FILES)
    assert {p.bytes_total for p in seen} == {total} and {p.files for p in seen} == {3}
    assert [p.bytes_done for p in seen] == sorted(p.bytes_done for p in seen)  # never goes back
    assert [p.spans for p in seen] == sorted(p.spans for p in seen)
    assert seen[-1] == IngestProgress(3, 3, total, total, report.spans, "", "done")
    for index, path in enumerate(FILES):
        steps = [p.step for p in seen if p.path == str(path)]
        assert steps[0] == "reading" and steps[-1] == "accounting"
        assert "placing" in steps and ("converting" in steps) == (path.suffix != ".jsonl")
        assert {p.files_done for p in seen if p.path == str(path)} == {index}
        before = sum(p.stat().st_size for p in FILES[:index])
        assert max(p.bytes_done for p in seen if p.path == str(path)) == before + path.stat().st_size
    # the spans a file placed are counted once its chunk is placed, whatever was committed before
    first = report.details[0].spans
    assert next(p.spans for p in seen if p.path == str(FILES[1])) == first


def test_the_command_draws_a_bar_on_a_terminal_and_only_the_summary_elsewhere(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "200"}
    piped = subprocess.run(
        [sys.executable, "-m", "treellm", "ingest", "--db", str(tmp_path / "p.duckdb"), *map(str, FILES)],
        capture_output=True, text=True, check=True, env={k: v for k, v in env.items() if k != "TTY_COMPATIBLE"},
    )  # fmt: skip
    assert "spans/s" not in piped.stderr and "━" not in piped.stderr
    assert piped.stdout.startswith("3 file(s) into ")
    drawn = subprocess.run(
        [sys.executable, "-m", "treellm", "ingest", "--db", str(tmp_path / "t.duckdb"), *map(str, FILES)],
        capture_output=True, text=True, check=True, env={**env, "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"},
    )  # fmt: skip
    # the last frame, drawn when the bar stops (earlier frames depend on the refresh thread)
    assert "file 3/3" in drawn.stderr and " spans" in drawn.stderr and "done" in drawn.stderr
