"""Outcomes from the data (issue 24, point 4): a trajectory that records its result (tau-bench's
reward, SWE-bench's resolved flag, an exit status) gives its run the outcome success or failure,
the analysis splits repeats by it, and a tool that never ran under a limit has no current limit
(none observed), not 1."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from treellm.analysis import (
    Filters,
    repeat_samples,
    repeats_by_run_outcome,
    tune,
    tuning_by_tool,
    what_if_by_tool_limit,
)
from treellm.derive.formats.trajectory import run_result
from treellm.store import ingest, open_store

DATA = Path(__file__).parent / "data" / "external"
TAU = DATA / "tau-bench-gpt-4o-airline-excerpt.json"


@pytest.fixture(scope="module")
def tau_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("tau") / "tau.duckdb"
    ingest(db, [TAU])
    return db


def _rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    con = open_store(db, read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_tau_bench_runs_show_success_and_failure_from_their_rewards(tau_db: Path) -> None:
    runs = json.loads(TAU.read_text(encoding="utf-8"))
    expected = {str(i): "success" if run["reward"] == 1.0 else "failure" for i, run in enumerate(runs)}
    assert set(expected.values()) == {"success", "failure"}  # the excerpt holds both
    found = _rows(
        tau_db,
        "SELECT s.attributes['treellm.trajectory.index'], r.outcome FROM runs r "
        "JOIN spans s ON s.trace_id = r.trace_id AND s.span_id = r.span_id",
    )
    assert dict(found) == expected


@pytest.mark.parametrize(
    ("run", "result"),
    [
        ({"reward": 1.0}, "success"),
        ({"reward": 1}, "success"),
        ({"reward": 0.0}, "failure"),
        ({"reward": 0.5}, "failure"),
        ({"reward": 2.0}, None),  # not a 0..1 reward: no claim
        ({"reward": -1}, None),
        ({"reward": math.nan}, None),
        ({"reward": True}, None),
        ({"reward": "1"}, None),
        ({"resolved": True}, "success"),
        ({"resolved": False}, "failure"),
        ({"info": {"resolved": True}}, "success"),
        ({"resolved": 1}, None),
        ({"resolved": False, "reward": 1.0}, "failure"),  # the task's verdict first
        ({"reward": 1.0, "info": {"resolved": False}}, "failure"),
        ({"exit_code": 0}, "success"),
        ({"exit_status": 2}, "failure"),
        ({"info": {"returncode": 1}}, "failure"),
        ({"info": {"exit_status": "Submitted"}}, None),  # mini-swe-agent's text status says nothing of the task
        ({"task_id": 3, "trial": 0}, None),
    ],
)
def test_the_result_a_run_records(run: dict[str, Any], result: str | None) -> None:
    assert run_result(run) == result


def test_a_trajectory_without_a_result_stays_completed_and_swe_bench_resolved_counts(tmp_path: Path) -> None:
    def run(**fields: Any) -> dict[str, Any]:
        messages = [
            {"role": "user", "content": "fix the bug"},
            {"role": "assistant", "content": "```bash\nls\n```"},
            {"role": "user", "content": "a.py"},
        ]
        return {"messages": messages, **fields}

    path = tmp_path / "mini.json"
    runs = [run(info={"exit_status": "Submitted", "resolved": True}), run(info={"resolved": False}), run()]
    path.write_text(json.dumps(runs), encoding="utf-8")
    db = tmp_path / "t.duckdb"
    assert ingest(db, [path]).runs == 3
    found = _rows(
        db,
        "SELECT s.attributes['treellm.trajectory.index'], r.outcome FROM runs r "
        "JOIN spans s ON s.trace_id = r.trace_id AND s.span_id = r.span_id",
    )
    assert dict(found) == {"0": "success", "1": "failure", "2": "completed"}


def test_repeats_split_by_run_outcome_add_up_to_every_repeat(tau_db: Path) -> None:
    con = open_store(tau_db, read_only=True)
    try:
        split = repeats_by_run_outcome(con)
        samples = repeat_samples(con)
        outcomes = dict(con.execute("SELECT outcome, count(*) FROM runs GROUP BY outcome").fetchall())
        by_run = dict(con.execute("SELECT run_id, outcome FROM runs").fetchall())
        one_tool = repeats_by_run_outcome(con, Filters(tool="book_reservation"))
    finally:
        con.close()
    assert list(split.columns) == [
        "run_outcome", "runs", "runs_with_repeats", "repeats", "productive", "wasted", "unknown", "wasted_per_run",
    ]  # fmt: skip
    assert dict(zip(split["run_outcome"], split["runs"], strict=True)) == outcomes
    assert split["runs"].is_monotonic_decreasing
    assert int(split["repeats"].sum()) == len(samples) > 0
    for outcome, group in samples.assign(run_outcome=samples["run_id"].map(by_run)).groupby("run_outcome"):
        row = split[split["run_outcome"] == outcome].iloc[0]
        assert row["repeats"] == len(group) and row["runs_with_repeats"] == group["run_id"].nunique()
        assert row["wasted"] == int((group["outcome"] == "wasted").sum())
        assert row["productive"] == int(group["productive"].sum())
        assert row["wasted_per_run"] == pytest.approx(row["wasted"] / row["runs"])
    assert int(one_tool["repeats"].sum()) == int((samples["tool"] == "book_reservation").sum())


def test_a_tool_that_never_ran_under_a_limit_has_no_current_limit(tau_db: Path) -> None:
    con = open_store(tau_db, read_only=True)
    try:
        frame = tuning_by_tool(con)
        data = tune(con)
    finally:
        con.close()
    assert len(frame) > 0 and not frame["observed_limit"].any()
    assert str(frame["current_max_repeats"].dtype) == "Int64" and frame["current_max_repeats"].isna().all()
    assert all(item["current_max_repeats"] is None for item in data["tools"])
    con = open_store(tau_db, read_only=True)
    try:
        what_if = what_if_by_tool_limit(con)
    finally:
        con.close()
    assert len(what_if) > 0 and str(what_if["current_limit"].dtype) == "Int64" and what_if["current_limit"].isna().all()
    assert all(isinstance(item["recommended_max_repeats"], int) for item in data["tools"])
    strict = subprocess.run(
        [sys.executable, "-m", "treellm", "tune", "--db", str(tau_db), "--format", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    parsed = json.loads(strict.stdout, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert parsed["tools"] and all(item["current_max_repeats"] is None for item in parsed["tools"])
    table = subprocess.run(
        [sys.executable, "-m", "treellm", "tune", "--db", str(tau_db), "--format", "table"],
        capture_output=True, text=True, check=True, env={**_env(), "COLUMNS": "200"},
    )  # fmt: skip
    lines = [line.split() for line in table.stdout.splitlines()]
    tools = {str(item["tool"]) for item in data["tools"]}
    rows = [cells for cells in lines if cells and cells[0] in tools]
    assert len(rows) == len(tools) and all(cells[2] == "none" for cells in rows), table.stdout


def test_a_tool_that_ran_under_a_limit_reports_it(tmp_path: Path) -> None:
    from treellm.simulate import sample_traces_dir

    db = tmp_path / "t.duckdb"
    ingest(db, [sample_traces_dir() / "branch_local_loop.jsonl"])
    con = open_store(db, read_only=True)
    try:
        frame = tuning_by_tool(con)
    finally:
        con.close()
    observed = frame[frame["observed_limit"]]
    assert len(observed) > 0 and observed["current_max_repeats"].notna().all()
    assert all(isinstance(v, int) and v >= 1 for v in observed["current_max_repeats"].astype(object))
    assert frame.loc[~frame["observed_limit"], "current_max_repeats"].isna().all()
    assert pd.api.types.is_integer_dtype(frame["current_max_repeats"])


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "TREELLM_DB"}
