"""The programs in ``examples/`` run as written: each against the scripted OpenAI-compatible
server (``tests/openai_server.py``) in its framework's environment (``.venv-fw/<name>``, built
by the Makefile, or here when it is missing: never skipped), or on the shipped data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from treellm.collector import Collector, CollectorConfig
from treellm.store import open_store

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(ROOT / "tests" / "frameworks"))
sys.path.insert(0, str(ROOT / "tests"))

from harness import framework_python  # noqa: E402
from openai_server import Call, OpenAIServer, Turn  # noqa: E402

TESTED = {
    "langgraph_guard.py",
    "smolagents_guard.py",
    "pydantic_ai_guard.py",
    "agents_sdk_collect.py",
    "coding_agent_tune.py",
}
QUIET = {
    "LANGCHAIN_TRACING_V2": "false",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "OPENAI_API_KEY": "sk-test",
    "PYTHONPATH": "",
}
SEARCH = Turn(tool_calls=[Call("search", {"query": "refund policy"})])
ANSWER = "Refunds are accepted within 30 days."
RAN_ONCE = "search -> 3 articles match 'refund policy': Returns, Refunds, Shipping."
NUDGED = "[treellm] search was already called once on this path with these exact arguments"


def _run(python: Path | str, example: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(python), str(EXAMPLES / example), *args],
        check=False, capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, **QUIET, **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_every_example_is_tested() -> None:
    assert {p.name for p in EXAMPLES.glob("*.py")} == TESTED


def test_the_langgraph_agent_with_the_guard_runs_the_repeated_search_once() -> None:
    search = Turn(tool_calls=[Call("search", {"query": "refund policy"})])
    script = [search, search, search, Turn(text="Refunds are accepted within 30 days.")]
    with OpenAIServer(script, plain_json=True) as server:
        done = _run(framework_python("langgraph"), "langgraph_guard.py", {"OPENAI_BASE_URL": server.base_url})
    assert done.stdout.splitlines() == ["search ran 1 time(s)", "answer: Refunds are accepted within 30 days."]
    # the repeats reached the model as the guard's answer, not as another run of the tool
    last = server.requests[-1].body["messages"]
    answers = [m["content"] for m in last if m["role"] == "tool"]
    assert len(answers) == 3 and answers[0].startswith("3 articles")
    assert all(a.startswith("[treellm] search was already called once") for a in answers[1:])


def _assert_searched_once_and_nudged(lines: list[str]) -> None:
    """The example's output: the first search ran, its two repeats got the guard's note."""
    assert lines[0] == RAN_ONCE, lines
    assert len(lines) == 5 and all(line.startswith(f"search -> {NUDGED}") for line in lines[1:3]), lines
    assert lines[3:] == ["search ran 1 time(s)", f"answer: {ANSWER}"], lines


def test_the_smolagents_agent_with_the_guard_runs_the_repeated_search_once() -> None:
    final = Turn(tool_calls=[Call("final_answer", {"answer": ANSWER})])  # smolagents ends a run with a tool
    with OpenAIServer([SEARCH, SEARCH, SEARCH, final], plain_json=True) as server:
        done = _run(framework_python("smolagents"), "smolagents_guard.py", {"OPENAI_BASE_URL": server.base_url})
    _assert_searched_once_and_nudged(done.stdout.splitlines())
    # smolagents gives the model each observation as text: the repeats reached it as the guard's note
    last = [part["text"] for m in server.requests[-1].body["messages"] for part in m["content"]]
    observations = [text for text in last if text.startswith("Observation:")]
    assert len(observations) == 3 and observations[0].startswith("Observation:\n3 articles"), observations
    assert all(text.startswith(f"Observation:\n{NUDGED}") for text in observations[1:]), observations


def test_the_pydantic_ai_agent_with_the_guard_runs_the_repeated_search_once() -> None:
    with OpenAIServer([SEARCH, SEARCH, SEARCH, Turn(text=ANSWER)], plain_json=True) as server:
        done = _run(framework_python("pydanticai"), "pydantic_ai_guard.py", {"OPENAI_BASE_URL": server.base_url})
    _assert_searched_once_and_nudged(done.stdout.splitlines())
    answers = [m["content"] for m in server.requests[-1].body["messages"] if m["role"] == "tool"]
    assert len(answers) == 3 and answers[0].startswith("3 articles"), answers
    assert all(a.startswith(NUDGED) for a in answers[1:]), answers


def test_the_agents_sdk_agent_is_traced_into_collect(tmp_path: Path) -> None:
    script = [Turn(tool_calls=[Call("get_order", {"order_id": "1234"})]), Turn(text="Order 1234 has shipped.")]
    db = tmp_path / "runs.duckdb"
    with OpenAIServer(script, plain_json=True) as server, Collector(
        db, CollectorConfig(port=0, flush_interval_s=0.2)
    ) as collector:  # fmt: skip
        done = _run(
            framework_python("agents"), "agents_sdk_collect.py",
            {"OPENAI_BASE_URL": server.base_url, "TREELLM_COLLECT_URL": collector.url},
        )  # fmt: skip
    assert done.stdout.strip() == "answer: Order 1234 has shipped."
    con = open_store(db, read_only=True)
    try:
        assert con.execute("SELECT count(*), any_value(service) FROM runs").fetchone() == (1, "support-agent")
        assert con.execute("SELECT tool, arguments, result FROM tool_calls").fetchall() == [
            ("get_order", '{"order_id": "1234"}', "order 1234: 2 items, shipped")
        ]
    finally:
        con.close()


def test_the_coding_agent_trajectories_are_ingested_and_tuned(tmp_path: Path) -> None:
    trajectories = sorted((ROOT / "tests" / "data" / "mini-swe-agent" / "deepseek_chat_dev").glob("sqlfluff*.json"))
    done = _run(sys.executable, "coding_agent_tune.py", {}, *map(str, trajectories), "--db", str(tmp_path / "t.db"))
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"{len(trajectories)} trajectories: {len(trajectories)} runs, ")
    assert lines[1].startswith("bash: ") and "exact repeats" in lines[1]
    assert any(line.startswith("tune bash: ") and "max_repeats" in line for line in lines)
