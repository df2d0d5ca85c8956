"""Simulated workloads: deterministic bytes, planted behaviour, and the shipped sample traces."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from treellm.simulate import PERSONAS, PLANTED, sample_traces_dir, simulate
from treellm.simulate.scenarios import SCENARIOS, write_scenario
from treellm.store import ingest, open_store

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"


def test_the_same_seed_gives_the_same_bytes_even_across_processes(tmp_path: Path) -> None:
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    simulate(30, 11, out=first)
    code = f"from treellm.simulate import simulate; simulate(30, 11, out={str(second)!r})"
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONHASHSEED": "123", "PATH": ""})
    assert first.read_bytes() == second.read_bytes()
    third = tmp_path / "c.jsonl"
    simulate(30, 12, out=third)
    assert third.read_bytes() != first.read_bytes()


def test_every_planted_verdict_and_behaviour_appears() -> None:
    assert {p.verdict for p in PLANTED} == {"keep", "raise", "lower", "mutates", "insufficient_data"}
    assert {p.behaviour for p in PLANTED} >= {"deterministic", "flaky", "state-dependent", "polling", "mutating"}
    for persona in PERSONAS.values():
        assert set(persona.tools) == {p.tool for p in PLANTED if p.persona == persona.name}


def test_a_simulated_day_has_loops_retries_polls_forks_skills_budgets_and_shadow_runs(tmp_path: Path) -> None:
    out = tmp_path / "day.jsonl"
    report = simulate(120, 7, out=out)
    assert report.runs == 120 and report.by_persona == {"coder": 40, "operator": 40, "researcher": 40}
    assert set(report.outcomes) == {"completed", "pruned_out", "budget_exhausted"}
    db = tmp_path / "s.duckdb"
    ingest(db, [out])
    con = open_store(db, read_only=True)
    try:
        shadow, pruned = con.execute("SELECT sum(shadow_catches), sum(pruned_calls) FROM runs").fetchone() or (0, 0)
        assert shadow > 0 and pruned > 0
        limits = dict(con.execute('SELECT tool, max("limit") FROM tool_calls GROUP BY tool').fetchall())
        assert {p.tool: p.current_limit for p in PLANTED if p.tool in limits} == {
            t: v for t, v in limits.items() if t != "skill_deep_read"
        }
        forks = con.execute(
            "SELECT count(*) FROM spans WHERE attributes['treellm.config.branching'] = 'fork'"
        ).fetchone()
        assert forks and forks[0] > 0
        assert con.execute("SELECT count(*) FROM tool_calls WHERE tool = 'skill_deep_read'").fetchone()[0] > 0  # type: ignore[index]
        malformed = "SELECT count(*) FROM tool_calls WHERE tool = 'read_file' AND arguments LIKE '%src/handler.py\"'"
        assert con.execute(malformed).fetchone()[0] > 0  # type: ignore[index]
    finally:
        con.close()


def test_each_scenario_file_is_reproduced_byte_for_byte(tmp_path: Path) -> None:
    for name in SCENARIOS:
        out = tmp_path / f"{name}.jsonl"
        write_scenario(name, out)
        assert out.read_bytes() == (SAMPLES / f"{name}.jsonl").read_bytes(), name


def test_the_sample_traces_ingest_into_a_store_with_pinned_counts(tmp_path: Path) -> None:
    assert sample_traces_dir() == SAMPLES
    total = sum(f.stat().st_size for f in SAMPLES.iterdir())
    assert total <= 10 * 1024 * 1024
    db = tmp_path / "samples.duckdb"
    report = ingest(db, [SAMPLES])
    assert (report.files, report.runs, report.duplicates, report.skipped) == (9, 309, 0, 0)
    con = open_store(db, read_only=True)
    try:
        by_file = dict(
            ((source.rsplit("/", 1)[-1], (runs, pruned, shadow)) for source, runs, pruned, shadow in con.execute(
                "SELECT source, count(*), sum(pruned_calls), sum(shadow_catches) FROM runs GROUP BY source"
            ).fetchall())
        )  # fmt: skip
        assert by_file == {
            "branch_local_loop.jsonl": (1, 3, 0),
            "budget_exhausted.jsonl": (1, 0, 0),
            "nudge_and_cache.jsonl": (1, 2, 0),
            "production_day.jsonl": (300, 227, 263),
            "real_any_agent_smolagents.json": (1, 0, 0),
            "real_tau_bench_airline.json": (2, 0, 0),
            "retries.jsonl": (1, 0, 0),
            "shadow_mode.jsonl": (1, 0, 2),
            "skill_subtree.jsonl": (1, 1, 0),
        }
        outcomes = dict(con.execute("SELECT outcome, count(*) FROM runs GROUP BY outcome").fetchall())
        # the two tau-bench runs carry their rewards: one success, one failure
        assert outcomes == {"completed": 112, "pruned_out": 184, "budget_exhausted": 11, "success": 1, "failure": 1}
    finally:
        con.close()
