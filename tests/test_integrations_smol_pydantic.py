"""LoopGuard adapters for smolagents and Pydantic AI, with the real frameworks.

``tests/frameworks/smolagents/guard_drive.py`` and ``tests/frameworks/pydanticai/guard_drive.py``
run in their framework's own virtual environment (built when missing: never skipped) against
the fake OpenAI-compatible server below, which asks for N identical calls of one tool: one
per turn (``sequential``) or N in one turn (``parallel``), then ends the run (with
smolagents' ``final_answer`` tool when the request offers it). With a guard of
``max_repeats`` L, exactly L tool bodies run per run and every other call gets the
configured answer, as the framework reports it and as the model sees it in the next
request; the exported spans, ingested into a store, count each run, call and catch once,
with the framework's instrumentation and without it (the guard's own spans).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from treellm.analysis import report
from treellm.store import ingest, open_store

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "frameworks"))

from harness import framework_python  # noqa: E402
from openai_server import Call, OpenAIServer, RecordedRequest, Turn  # noqa: E402

MARK = re.compile(r"\[guard (sequential|parallel) (\d+) run (\d+)\]")
"""The marker of a driver's user message: ``[guard <mode> <calls> run <i>]``."""

TOOL, ARGUMENTS = "search", {"query": "refund policy"}
RESULT = "3 articles match 'refund policy': Returns, Refunds, Shipping."
FINAL = "Done."
MODES = ("sequential", "parallel")
ACTIONS = ("prune", "nudge", "cache")
CALLS, LIMIT, RUNS = 4, 2, 2


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content)
    return ""


def _marker(body: Mapping[str, Any]) -> re.Match[str] | None:
    """The marker of the request's last task (a run continuing a conversation adds its own)."""
    for message in reversed(body.get("messages") or ()):
        if message.get("role") == "user":
            found = MARK.search(_text(message.get("content")))
            if found:
                return found
    return None


class Responder:
    """The fake model, stateful per run (smolagents sends its history as text, so the turn
    is counted here): ``sequential`` asks for one call per turn until N were asked,
    ``parallel`` for N calls in the first turn; then the final answer."""

    def __init__(self) -> None:
        self.served: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, body: Mapping[str, Any]) -> Turn:
        found = _marker(body)
        if found is None:
            return Turn(text="no guard marker")
        mode, calls = found.group(1), int(found.group(2))
        with self._lock:
            turn = self.served[found.group(0)]
            self.served[found.group(0)] += 1
        if (mode == "sequential" and turn < calls) or (mode == "parallel" and turn == 0):
            return Turn(tool_calls=[Call(TOOL, ARGUMENTS) for _ in range(1 if mode == "sequential" else calls)])
        names = {t.get("function", {}).get("name") for t in body.get("tools") or () if isinstance(t, Mapping)}
        if "final_answer" in names:
            return Turn(tool_calls=[Call("final_answer", {"answer": FINAL})])
        return Turn(text=FINAL)


def run_driver(
    name: str,
    tmp_path: Path,
    *,
    mode: str,
    calls: int = CALLS,
    limit: int = LIMIT,
    action: str,
    runs: int = RUNS,
    instrument: bool = False,
    extra: tuple[str, ...] = (),
) -> tuple[dict[str, Any], Path, list[RecordedRequest]]:
    """Run ``tests/frameworks/<name>/guard_drive.py``: (its JSON summary, the span file, the requests)."""
    spans = tmp_path / f"{name}-{mode}-{action}-{'on' if instrument else 'off'}.pb"
    with OpenAIServer(Responder(), plain_json=True) as server:
        command = [
            str(framework_python(name)),
            str(ROOT / "tests" / "frameworks" / name / "guard_drive.py"),
            "--base-url", server.base_url, "--otlp-file", str(spans), "--runs", f"0-{runs - 1}",
            "--mode", mode, "--calls", str(calls), "--limit", str(limit), "--action", action,
            *(["--instrument"] if instrument else []), *extra,
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TREELLM_"))}
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=False)
        requests = list(server.requests)
    if done.returncode != 0:
        raise AssertionError(f"{name} guard driver failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    refused = [(r.status, r.body) for r in requests if r.status != 200]
    assert not refused, refused
    return json.loads(done.stdout.strip().splitlines()[-1]), spans, requests


def store_report(tmp_path: Path, spans: Path) -> dict[str, Any]:
    """``treellm.analysis.report`` of a store holding ``spans``."""
    db = tmp_path / f"{spans.stem}.duckdb"
    ingest(db, [spans])
    con = open_store(db, read_only=True)
    try:
        return report(con)
    finally:
        con.close()


def assert_guarded(summary: dict[str, Any], *, mode: str, action: str, calls: int = CALLS, runs: int = RUNS) -> None:
    """Exactly ``LIMIT`` bodies ran per run; every other call got the configured answer.

    A caught call quotes the earlier result (``cache`` is that result, ``nudge`` ends with
    it) once that call was recorded: always in ``sequential`` mode; in ``parallel`` mode the
    earlier identical calls of the turn may still be running: the answer then says so."""
    assert summary["bodies"] == LIMIT * runs, summary
    assert len(summary["runs"]) == runs
    assert summary["started"] == summary["ended"] == runs, summary  # one conversation per run, each ended
    for given in summary["runs"]:
        assert len(given) == calls, given
        running = [a for a in given if "is already running with these exact arguments" in a["content"]]
        assert mode == "parallel" or not running, given
        answers = [a for a in given if a not in running]
        if action == "cache":  # a cached answer is the earlier result itself: the bodies tell
            assert all(a["content"] == RESULT for a in answers), answers
            continue
        ran = [a for a in answers if a["content"] == RESULT]
        caught = [a for a in answers if a["content"] != RESULT]
        assert len(ran) == LIMIT, answers
        assert len(caught) + len(running) == calls - LIMIT, answers
        for answer in caught:
            head, _, tail = answer["content"].partition("Earlier result:\n")
            assert head.startswith(f"[treellm] {TOOL}"), answer
            if action == "nudge":
                assert f"was already called {LIMIT} times" in head, answer
                assert tail == RESULT, answer
            else:
                assert "was pruned" in head, answer


def seen_by_model(requests: list[RecordedRequest], summary: dict[str, Any]) -> None:
    """Every answer a run's calls got is in the messages of that run's next request."""
    for i, answers in enumerate(summary["runs"]):
        mine = [r.body for r in requests if (found := _marker(r.body)) and int(found.group(3)) == i]
        last = json.dumps([_text(m.get("content")) for m in mine[-1]["messages"]])
        for answer in answers:
            assert json.dumps(answer["content"].strip())[1:-1] in last, (answer, last)


def assert_counted_once(tmp_path: Path, spans: Path, calls: int = CALLS, runs: int = RUNS) -> None:
    found = store_report(tmp_path, spans)
    caught = (calls - LIMIT) * runs
    assert (found["runs"], found["tool_calls"], found["pruned"]) == (runs, LIMIT * runs, caught), found
    (search,) = found["tools"]
    assert (search["tool"], search["calls"], search["pruned"]) == (TOOL, LIMIT * runs, caught), search


def imports_without(module: str, frameworks: tuple[str, ...]) -> None:
    """``import treellm.integrations.<module>`` works with its framework unimportable."""
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in frameworks)
    code = f"import sys; {blocked}; import treellm.integrations.{module} as m; print(sorted(m.__all__))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


# -- smolagents -------------------------------------------------------------------------------------


def test_smolagents_adapter_imports_without_the_framework() -> None:
    imports_without("smolagents", ("smolagents",))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("action", ACTIONS)
def test_smolagents_guard_runs_exactly_the_limit(mode: str, action: str, tmp_path: Path) -> None:
    summary, _, requests = run_driver("smolagents", tmp_path, mode=mode, action=action)
    assert_guarded(summary, mode=mode, action=action)
    seen_by_model(requests, summary)


def test_smolagents_guard_streamed_runs(tmp_path: Path) -> None:
    summary, spans, _ = run_driver("smolagents", tmp_path, mode="parallel", action="prune", extra=("--stream",))
    assert_guarded(summary, mode="parallel", action="prune")
    assert_counted_once(tmp_path, spans)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("instrument", [False, True], ids=["own-spans", "instrumented"])
def test_smolagents_guard_counts_once_in_the_store(mode: str, instrument: bool, tmp_path: Path) -> None:
    summary, spans, _ = run_driver("smolagents", tmp_path, mode=mode, action="prune", instrument=instrument)
    assert_guarded(summary, mode=mode, action="prune")
    assert_counted_once(tmp_path, spans)


def test_smolagents_guard_counts_across_runs_of_one_memory(tmp_path: Path) -> None:
    """``end_runs=False`` and ``reset=False``: the runs continue one conversation, so the
    second run's calls count against the first's and none of them runs."""
    summary, _, _ = run_driver("smolagents", tmp_path, mode="sequential", action="prune", extra=("--keep-memory",))
    assert summary["bodies"] == LIMIT, summary
    assert (summary["started"], summary["ended"]) == (1, 0), summary  # open until guard.end() or close()
    first, second = summary["runs"]
    assert [a["content"] == RESULT for a in first] == [True] * LIMIT + [False] * (CALLS - LIMIT)
    assert not any(a["content"] == RESULT for a in second), second


# -- Pydantic AI ------------------------------------------------------------------------------------


def test_pydantic_ai_adapter_imports_without_the_framework() -> None:
    imports_without("pydantic_ai", ("pydantic_ai",))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("action", ACTIONS)
def test_pydantic_ai_guard_runs_exactly_the_limit(mode: str, action: str, tmp_path: Path) -> None:
    summary, _, requests = run_driver("pydanticai", tmp_path, mode=mode, action=action)
    assert_guarded(summary, mode=mode, action=action)
    seen_by_model(requests, summary)
    for answers in summary["runs"]:  # each answer went back under its own call id
        assert len({a["call_id"] for a in answers}) == CALLS, answers


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("instrument", [False, True], ids=["own-spans", "instrumented"])
def test_pydantic_ai_guard_counts_once_in_the_store(mode: str, instrument: bool, tmp_path: Path) -> None:
    summary, spans, _ = run_driver("pydanticai", tmp_path, mode=mode, action="prune", instrument=instrument)
    assert_guarded(summary, mode=mode, action="prune")
    assert_counted_once(tmp_path, spans)


def test_pydantic_ai_guard_counts_across_runs_of_one_conversation(tmp_path: Path) -> None:
    """``per="conversation"``: a run continuing the history counts against the earlier run's
    calls, so none of its calls runs; the conversation stays open until ``guard.end()``."""
    summary, _, _ = run_driver("pydanticai", tmp_path, mode="sequential", action="prune", extra=("--conversation",))
    assert summary["bodies"] == LIMIT, summary
    assert (summary["started"], summary["ended"]) == (1, 0), summary
    first, second = summary["runs"]
    assert [a["content"] == RESULT for a in first] == [True] * LIMIT + [False] * (CALLS - LIMIT)
    assert not any(a["content"] == RESULT for a in second), second
