"""`treellm run` end to end: a subprocess against the loopback OpenAI-compatible server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from openai_server import Call, OpenAIServer, Turn


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENAI_API_KEY": "sk-test-123", "NO_COLOR": "1", "COLUMNS": "160"}
    return subprocess.run(
        [sys.executable, "-m", "treellm", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_treellm_run_drives_a_real_http_model_with_the_builtin_tools(tmp_path: Path) -> None:
    root = tmp_path / "project"
    root.mkdir()
    (root / "README.md").write_text("# Widget\nA widget maker.\n", encoding="utf-8")
    (root / "src").mkdir()
    (root / "src" / "main.py").write_text("print('widget')\n", encoding="utf-8")
    script = [
        Turn(text="Looking around.", tool_calls=[Call("list_dir", {"path": "."})]),
        Turn(tool_calls=[Call("read_file", {"path": "README.md"}), Call("read_file", {"path": "README.md"})]),
        Turn(tool_calls=[Call("read_file", {"path": "../secret.txt"})]),
        Turn(tool_calls=[Call("read_file", {"path": "README.md"})]),
    ]
    with OpenAIServer(script) as server:
        result = run_cli(
            "run",
            "--base-url",
            server.base_url,
            "--model",
            "test-model",
            "--root",
            str(root),
            "What is this project?",
            cwd=tmp_path,
        )
        bodies = server.bodies
        auth = server.requests[0].headers.get("authorization")
    # the fourth turn repeats README.md: pruned, every call of the turn caught, the branch ends
    assert result.returncode == 1, result.stderr
    assert "run ended pruned_out" in result.stderr
    assert "Loop detected" in result.stderr or "loop: read_file" in result.stderr
    assert auth == "Bearer sk-test-123"
    assert len(bodies) == 4
    tools = {t["function"]["name"] for t in bodies[0]["tools"]}
    assert tools == {"read_file", "list_dir", "search_text", "current_time", "task_complete"}
    tool_messages = [m["content"] for m in bodies[3]["messages"] if m["role"] == "tool"]
    assert any("README.md" in t and "src/" in t for t in tool_messages)  # list_dir
    assert any("A widget maker." in t for t in tool_messages)  # read_file, once
    assert any("outside the allowed folder" in t for t in tool_messages)
    assert sum("A widget maker." in t for t in tool_messages) == 1


def test_treellm_run_prints_the_answer_on_stdout(tmp_path: Path) -> None:
    script = [
        Turn(tool_calls=[Call("current_time", {})]),
        Turn(tool_calls=[Call("task_complete", {"result": "42"})]),
    ]
    with OpenAIServer(script) as server:
        result = run_cli(
            "run", "--base-url", server.base_url, "--model", "m", "--root", str(tmp_path), "q", cwd=tmp_path
        )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "42"
    assert "current_time" in result.stderr


def test_treellm_run_reads_a_limits_file(tmp_path: Path) -> None:
    limits = tmp_path / "limits.toml"
    limits.write_text("[tools.current_time]\nmax_repeats = 1\n", encoding="utf-8")
    script = [
        Turn(tool_calls=[Call("current_time", {})]),
        Turn(tool_calls=[Call("current_time", {})]),
    ]
    with OpenAIServer(script) as server:
        result = run_cli(
            "run",
            "--base-url",
            server.base_url,
            "--model",
            "m",
            "--root",
            str(tmp_path),
            "--limits",
            str(limits),
            "q",
            cwd=tmp_path,
        )
    assert result.returncode == 1
    assert "(file)" in result.stderr  # the limit came from the file, not the tool's own max_repeats=3


def test_treellm_run_without_an_endpoint_is_one_clear_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREELLM_")}
    result = subprocess.run(
        [sys.executable, "-m", "treellm", "run", "q"],
        cwd=tmp_path,
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "treellm: error: treellm run needs --base-url and --model (or TREELLM_BASE_URL and TREELLM_MODEL)"
    )


def test_treellm_run_trace_writes_the_run_as_otlp_jsonl(tmp_path: Path) -> None:
    import json

    trace = tmp_path / "out" / "run.jsonl"
    script = [
        Turn(tool_calls=[Call("list_dir", {})]),
        Turn(tool_calls=[Call("task_complete", {"result": "ok"})]),
    ]
    with OpenAIServer(script) as server:
        result = run_cli(
            "run", "--base-url", server.base_url, "--model", "m7", "--root", str(tmp_path),
            "--trace", str(trace), "--name", "cli-agent", "q", cwd=tmp_path,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    spans = [
        span
        for line in trace.read_text(encoding="utf-8").splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    ]
    names = sorted(s["name"] for s in spans)
    assert names == ["chat m7", "chat m7", "collapse", "execute_tool list_dir", "invoke_agent cli-agent"]
