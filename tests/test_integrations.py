"""LoopGuard adapters (``treellm.integrations``) with the real frameworks.

Each framework's ``tests/frameworks/<name>/guard_drive.py`` runs in that framework's own
virtual environment (built when missing: never skipped) against the fake
OpenAI-compatible server below, which asks for N identical calls of one tool: one per
turn (``sequential``) or N in one turn (``parallel``). With a guard of ``max_repeats`` L,
exactly L tool bodies run per run and every other call gets the configured answer; the
exported spans, ingested into a store, count each run, call and catch once, with the
framework's instrumentor and without it (the guard's own spans).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from treellm.analysis import report
from treellm.store import ingest, open_store

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "frameworks"))

from harness import framework_python  # noqa: E402
from openai_server import Call, OpenAIServer, Turn  # noqa: E402

# -- shared: the fake model asking for N identical calls, running a guard driver, the store -------

GUARD_TASK = re.compile(r"\[guard (sequential|parallel) (\d+) run (\d+)\]")
"""The marker of a guard driver's user message: ``[guard <mode> <calls> run <i>]``."""

SEARCH = ("search", {"query": "refund policy"})
"""The call the fake model repeats (tool name, arguments)."""

FINAL = "Done."


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content)
    return ""


def guard_reply(body: Mapping[str, Any]) -> Turn:
    """Stateless: reads the mode and N from the first user message and the turns so far from
    the history. ``sequential``: one call per turn until N were asked; ``parallel``: N calls in
    the first turn. Then a final answer."""
    messages = body.get("messages") or []
    marker = next(
        (found for m in messages if m.get("role") == "user" and (found := GUARD_TASK.search(_text(m.get("content"))))),
        None,
    )
    if marker is None:
        return Turn(text="no guard marker")
    mode, calls = marker.group(1), int(marker.group(2))
    asked = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
    name, arguments = SEARCH
    if mode == "sequential" and asked < calls:
        return Turn(tool_calls=[Call(name, arguments)])
    if mode == "parallel" and asked == 0:
        return Turn(tool_calls=[Call(name, arguments) for _ in range(calls)])
    return Turn(text=FINAL)


def imports_without(module: str, frameworks: tuple[str, ...]) -> None:
    """``import treellm.integrations.<module>`` works with its framework's packages unimportable."""
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in frameworks)
    code = f"import sys; {blocked}; import treellm.integrations.{module} as m; print(sorted(m.__all__))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def guard_server() -> OpenAIServer:
    return OpenAIServer(guard_reply, plain_json=True)


def run_guard_driver(
    name: str,
    tmp_path: Path,
    *,
    mode: str,
    calls: int,
    limit: int,
    action: str,
    runs: int = 2,
    instrument: bool = False,
    extra: tuple[str, ...] = (),
) -> tuple[dict[str, Any], Path]:
    """Run ``tests/frameworks/<name>/guard_drive.py``: (its JSON summary, the span file)."""
    spans = tmp_path / f"{name}-{mode}-{action}-{'on' if instrument else 'off'}.pb"
    with guard_server() as server:
        command = [
            str(framework_python(name)),
            str(ROOT / "tests" / "frameworks" / name / "guard_drive.py"),
            "--base-url", server.base_url, "--otlp-file", str(spans), "--runs", f"0-{runs - 1}",
            "--mode", mode, "--calls", str(calls), "--limit", str(limit), "--action", action,
            *(["--instrument"] if instrument else []), *extra,
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TREELLM_"))}
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=False)
        refused = [r for r in server.requests if r.status != 200]
    if done.returncode != 0:
        raise AssertionError(f"{name} guard driver failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    assert not refused, [(r.status, r.body) for r in refused]
    return json.loads(done.stdout.strip().splitlines()[-1]), spans


def store_report(tmp_path: Path, spans: Path) -> dict[str, Any]:
    """``treellm.analysis.report`` of a store holding ``spans``."""
    db = tmp_path / f"{spans.stem}.duckdb"
    ingest(db, [spans])
    con = open_store(db, read_only=True)
    try:
        return report(con)
    finally:
        con.close()


def assert_guarded(
    summary: dict[str, Any], *, mode: str, calls: int, limit: int, action: str, runs: int, result: str
) -> None:
    """Exactly ``limit`` bodies ran per run; every other call got the configured answer.

    A caught call quotes the earlier result (``cache`` is that result, ``nudge`` ends with
    it) once that call was recorded: always in ``sequential`` mode; in ``parallel`` mode
    the earlier identical calls of the turn may still be running: the answer then says so."""
    assert summary["bodies"] == limit * runs, summary
    assert len(summary["runs"]) == runs
    for run_answers in summary["runs"]:
        assert len(run_answers) == calls, run_answers
        running = [a for a in run_answers if "is already running with these exact arguments" in a["content"]]
        assert mode == "parallel" or not running, run_answers
        answers = [a for a in run_answers if a not in running]
        if action == "cache":  # a cached answer is the earlier result itself: the bodies tell
            assert all(a["content"] == result for a in answers), answers
            assert len(answers) + len(running) == calls
            continue
        ran = [a for a in answers if a["content"] == result]
        caught = [a for a in answers if a["content"] != result]
        assert len(ran) == limit, answers
        assert len(caught) + len(running) == calls - limit, answers
        for answer in caught:
            head, _, tail = answer["content"].partition("Earlier result:\n")
            assert head.startswith("[treellm] search"), answer
            if action == "nudge":
                assert f"was already called {limit} times" in head, answer
                assert tail == result, answer
            else:
                assert "was pruned" in head, answer


MODES = ("sequential", "parallel")
ACTIONS = ("prune", "nudge", "cache")
CALLS, LIMIT, RUNS = 4, 2, 2


# -- LangGraph / LangChain ----------------------------------------------------------------------------

LANGGRAPH_RESULT = "3 articles match 'refund policy': Returns, Refunds, Shipping."


def test_langgraph_adapter_imports_without_the_framework() -> None:
    imports_without("langgraph", ("langgraph", "langchain", "langchain_core"))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("action", ACTIONS)
def test_langgraph_guard_runs_exactly_the_limit(mode: str, action: str, tmp_path: Path) -> None:
    summary, _ = run_guard_driver("langgraph", tmp_path, mode=mode, calls=CALLS, limit=LIMIT, action=action)
    assert_guarded(summary, mode=mode, calls=CALLS, limit=LIMIT, action=action, runs=RUNS, result=LANGGRAPH_RESULT)
    assert summary["left"] == 0  # every conversation ended with its invocation
    caught = [a["status"] for answers in summary["runs"] for a in answers if a["content"] != LANGGRAPH_RESULT]
    if action != "cache":  # a cached answer is the earlier result itself
        assert caught == ["error" if action == "prune" else "success"] * ((CALLS - LIMIT) * RUNS)


def test_langgraph_guard_async(tmp_path: Path) -> None:
    summary, _ = run_guard_driver(
        "langgraph", tmp_path, mode="parallel", calls=CALLS, limit=LIMIT, action="nudge", extra=("--asynchronous",)
    )
    assert_guarded(
        summary, mode="parallel", calls=CALLS, limit=LIMIT, action="nudge", runs=RUNS, result=LANGGRAPH_RESULT
    )


@pytest.mark.parametrize("mode", MODES)
def test_langgraph_guard_in_a_tool_node(mode: str, tmp_path: Path) -> None:
    summary, spans = run_guard_driver(
        "langgraph", tmp_path, mode=mode, calls=CALLS, limit=LIMIT, action="prune", extra=("--tool-node",)
    )
    assert_guarded(summary, mode=mode, calls=CALLS, limit=LIMIT, action="prune", runs=RUNS, result=LANGGRAPH_RESULT)
    assert summary["left"] == LIMIT * RUNS  # ToolNode has no end of run: ended by hand after
    found = store_report(tmp_path, spans)
    assert (found["runs"], found["tool_calls"], found["pruned"]) == (RUNS, LIMIT * RUNS, (CALLS - LIMIT) * RUNS)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("instrument", [False, True], ids=["own-spans", "instrumented"])
def test_langgraph_guard_counts_once_in_the_store(mode: str, instrument: bool, tmp_path: Path) -> None:
    summary, spans = run_guard_driver(
        "langgraph", tmp_path, mode=mode, calls=CALLS, limit=LIMIT, action="prune", instrument=instrument
    )
    assert summary["bodies"] == LIMIT * RUNS
    found = store_report(tmp_path, spans)
    assert (found["runs"], found["tool_calls"], found["pruned"]) == (RUNS, LIMIT * RUNS, (CALLS - LIMIT) * RUNS)
    (search,) = found["tools"]
    assert (search["tool"], search["calls"], search["pruned"]) == ("search", LIMIT * RUNS, (CALLS - LIMIT) * RUNS)


# -- OpenAI Agents SDK ------------------------------------------------------------------------------

AGENTS_RESULT = "3 articles match 'refund policy': Returns, Refunds, Shipping."


def test_openai_agents_adapter_imports_without_the_framework() -> None:
    imports_without("openai_agents", ("agents",))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("action", ACTIONS)
def test_openai_agents_guard_runs_exactly_the_limit(mode: str, action: str, tmp_path: Path) -> None:
    summary, _ = run_guard_driver("agents", tmp_path, mode=mode, calls=CALLS, limit=LIMIT, action=action)
    assert_guarded(summary, mode=mode, calls=CALLS, limit=LIMIT, action=action, runs=RUNS, result=AGENTS_RESULT)
    assert summary["ended"] == RUNS  # each run's conversation ended with its SDK trace


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("instrument", [False, True], ids=["own-spans", "instrumented"])
def test_openai_agents_guard_counts_once_in_the_store(mode: str, instrument: bool, tmp_path: Path) -> None:
    summary, spans = run_guard_driver(
        "agents", tmp_path, mode=mode, calls=CALLS, limit=LIMIT, action="prune", instrument=instrument
    )
    assert summary["bodies"] == LIMIT * RUNS
    assert summary["ended"] == RUNS
    found = store_report(tmp_path, spans)
    assert (found["runs"], found["tool_calls"], found["pruned"]) == (RUNS, LIMIT * RUNS, (CALLS - LIMIT) * RUNS)
    (search,) = found["tools"]
    assert (search["tool"], search["calls"], search["pruned"]) == ("search", LIMIT * RUNS, (CALLS - LIMIT) * RUNS)
