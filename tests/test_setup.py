"""configure(): the SDK pipeline installed globally, so a plain TreeExecutor is traced to JSONL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import sys
    import treellm
    from treellm import ModelTurn, ScriptedModel, Tool, ToolCall, TreeExecutor

    provider = treellm.configure(service_name="checkout-agent", jsonl=sys.argv[1])
    model = ScriptedModel([
        ModelTurn(tool_calls=[ToolCall("lookup", {"id": 7, "api_key": "sk-abcdefghijklmnopqrstuv"})]),
        ModelTurn(tool_calls=[ToolCall("lookup", {"id": 7, "api_key": "sk-abcdefghijklmnopqrstuv"})]),
    ])
    result = TreeExecutor(model, [Tool("lookup", "l", handler=lambda a: "row 7")], name="checkout").run("t")
    print(result.run_id, result.outcome)
    """
)


def run_script(tmp_path: Path, env: dict[str, str]) -> tuple[str, list[dict[str, object]]]:
    trace_file = tmp_path / "traces" / "run.jsonl"
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(trace_file)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in trace_file.read_text(encoding="utf-8").splitlines()]
    return result.stdout, lines


def spans_of(lines: list[dict[str, object]]) -> list[dict[str, object]]:
    return [s for line in lines for rs in line["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]  # type: ignore[attr-defined,index]


def test_configure_then_a_plain_executor_writes_the_run_to_jsonl(tmp_path: Path) -> None:
    out, lines = run_script(tmp_path, {"TREELLM_CAPTURE": ""})
    run_id, outcome = out.split()
    assert outcome == "pruned_out"
    resource = lines[0]["resourceSpans"][0]["resource"]["attributes"]  # type: ignore[index]
    assert {"key": "service.name", "value": {"stringValue": "checkout-agent"}} in resource
    spans = spans_of(lines)
    names = sorted(str(s["name"]) for s in spans)
    assert names == [
        "chat scripted",
        "chat scripted",
        "collapse",
        "execute_tool lookup",
        "invoke_agent checkout",
    ]
    root = next(s for s in spans if s["name"] == "invoke_agent checkout")
    attrs = {a["key"]: a["value"] for a in root["attributes"]}  # type: ignore[index,union-attr]
    assert attrs["treellm.run.id"] == {"stringValue": run_id}
    tool = next(s for s in spans if s["name"] == "execute_tool lookup")
    tool_attrs = {a["key"]: a["value"] for a in tool["attributes"]}  # type: ignore[index,union-attr]
    assert "sk-abc" not in json.dumps(tool_attrs) and "[REDACTED]" in json.dumps(tool_attrs)
    loops = [e for s in spans for e in s.get("events", []) if e["name"] == "loop:detected"]  # type: ignore[attr-defined]
    assert len(loops) == 1


def test_treellm_capture_none_keeps_only_hashes(tmp_path: Path) -> None:
    _, lines = run_script(tmp_path, {"TREELLM_CAPTURE": "none"})
    tool = next(s for s in spans_of(lines) if s["name"] == "execute_tool lookup")
    keys = {a["key"] for a in tool["attributes"]}  # type: ignore[index,union-attr]
    assert "gen_ai.tool.call.arguments" not in keys and "gen_ai.tool.call.result" not in keys
    assert {"treellm.tool.signature", "treellm.tool.result_hash"} <= keys
