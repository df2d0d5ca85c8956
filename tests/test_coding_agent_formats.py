"""Coding agents' own trajectory formats: every call found, in order, with its result.

mini-swe-agent's text format (a bash code block in the assistant's text, the result in the
next user message) and SWE-agent's ``.traj`` files (each step's ``action`` and
``observation``) ingest as ``bash`` calls; a run whose calls cannot be found is a warning,
never a silent run with none. Expected values are read from the files here, independently
of the readers.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from treellm.analysis import repeats
from treellm.cli import main
from treellm.derive.formats import Record, detect_format, iter_records
from treellm.errors import IngestError
from treellm.store import ingest, open_store
from treellm.telemetry.conventions import unwrap_result

DATA = Path(__file__).parent / "data"
TEXT_ACTIONS = sorted((DATA / "mini-swe-agent-text-actions").glob("*.traj.json"))
SWE_AGENT = sorted((DATA / "swe-agent").glob("*.traj"))
# mini-swe-agent's action_regex (1.x fences ``bash``, 2.x's text format ``mswea_bash_command``)
BLOCK = re.compile(r"```(?:bash|mswea_bash_command)\s*\n(.*?)\n```", re.DOTALL)


def stored(result: str | None) -> str | None:
    """A result as the store keeps every framework's results (``conventions.unwrap_result``:
    an empty text is an empty result, a JSON text such as ``344\\n`` is re-dumped)."""
    return None if result is None else unwrap_result(result)[0]


def calls_of(db: Path) -> dict[str, list[tuple[str, str, dict[str, Any], str | None]]]:
    """(call id, tool, arguments, result) of each stored call, per source file, in call order."""
    con = open_store(db, read_only=True)
    try:
        rows = con.execute(
            "SELECT source, call_id, tool, arguments, result FROM tool_calls ORDER BY source, start_ns, span_id"
        ).fetchall()
    finally:
        con.close()
    out: dict[str, list[tuple[str, str, dict[str, Any], str | None]]] = {}
    for source, call_id, tool, arguments, result in rows:
        out.setdefault(Path(source).name, []).append((call_id, tool, json.loads(arguments), result))
    return out


def expected_text_actions(messages: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    """(command, result) of each assistant message with exactly one bash block."""
    out = []
    for j, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        blocks = BLOCK.findall(message["content"])
        if len(blocks) == 1:
            after = messages[j + 1] if j + 1 < len(messages) else None
            out.append((blocks[0].strip(), stored(after["content"]) if after and after["role"] == "user" else None))
    return out


def expected_swe_agent(doc: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(command, result) of each step with a non-blank action; for a file of only a history,
    of each assistant message with a non-blank action and the message after it."""
    if doc.get("trajectory"):
        steps = doc["trajectory"]
        return [(s["action"].rstrip(), stored(s["observation"])) for s in steps if (s["action"] or "").strip()]
    history = doc["history"]
    return [
        (m["action"].rstrip(), stored(history[j + 1]["content"]))
        for j, m in enumerate(history)
        if m["role"] == "assistant" and (m.get("action") or "").strip()
    ]


def test_the_copied_files_are_all_there() -> None:
    assert [p.name for p in TEXT_ACTIONS] == ["github_issue.traj.json", "local.traj.json"]
    assert len(SWE_AGENT) == 22
    assert (DATA / "swe-agent" / "LICENSE.md").is_file()
    assert (DATA / "mini-swe-agent-text-actions" / "LICENSE.md").is_file()


def test_text_action_files_store_one_bash_call_per_block_with_the_next_user_message(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    report = ingest(db, TEXT_ACTIONS)
    assert [d.input_format for d in report.details] == ["trajectory", "trajectory"]
    assert report.warnings == () and report.runs == 2
    stored = calls_of(db)
    for path in TEXT_ACTIONS:
        expected = expected_text_actions(json.loads(path.read_text(encoding="utf-8")))
        calls = stored[path.name]
        assert len(calls) == len(expected) > 0
        assert [(args, result) for _, _, args, result in calls] == [({"command": c}, r) for c, r in expected]
        assert {tool for _, tool, _, _ in calls} == {"bash"}
        ids = [call_id for call_id, _, _, _ in calls]
        assert len(set(ids)) == len(ids) and all(i.endswith(f"_{k}") for k, i in enumerate(ids))
    assert len(stored["github_issue.traj.json"]) == 10
    assert stored["local.traj.json"][0][2] == {"command": "echo 'hello world'"}


def test_text_actions_follow_mini_swe_agents_rule_of_exactly_one_block(tmp_path: Path) -> None:
    messages = [
        {"role": "system", "content": "Reply with one block:\n```bash\nexample\n```"},
        {"role": "user", "content": "Please solve this issue."},
        {"role": "assistant", "content": "Two at once:\n```bash\nls\n```\nand\n```bash\npwd\n```"},
        {"role": "user", "content": "Please always provide EXACTLY ONE action in triple backticks, found 2 actions."},
        {"role": "assistant", "content": "Thinking aloud, no command."},
        {"role": "user", "content": "Please always provide EXACTLY ONE action in triple backticks, found 0 actions."},
        {"role": "assistant", "content": "Now:\n```mswea_bash_command\n  grep -n x a.py  \n\n```"},
        {"role": "user", "content": "<returncode>0</returncode>\n<output>\n3:x\n</output>"},
        {"role": "assistant", "content": [{"type": "text", "text": "Done.\n```bash\ngit diff\n```"}]},
    ]
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"info": {"exit_status": "Submitted"}, "messages": messages}), encoding="utf-8")
    db = tmp_path / "t.duckdb"
    report = ingest(db, [path])
    assert report.warnings == ()
    calls = calls_of(db)["rules.json"]
    assert [(tool, args, result) for _, tool, args, result in calls] == [
        ("bash", {"command": "grep -n x a.py"}, "<returncode>0</returncode>\n<output>\n3:x\n</output>"),
        ("bash", {"command": "git diff"}, None),  # the last message: no answer
    ]


def test_every_swe_agent_file_stores_one_bash_call_per_action_in_step_order(tmp_path: Path) -> None:
    db = tmp_path / "swe.duckdb"
    report = ingest(db, [DATA / "swe-agent"])  # a folder: .traj files are walked
    assert report.files == 22 and report.runs == 22 and report.warnings == ()
    assert {d.input_format for d in report.details} == {"swe-agent"}
    stored = calls_of(db)
    total = 0
    for path in SWE_AGENT:
        doc = json.loads(path.read_text(encoding="utf-8"))
        expected = expected_swe_agent(doc)
        calls = stored.get(path.name, [])
        assert len(calls) == len(expected) > 0, path.name
        assert [args for _, _, args, _ in calls] == [{"command": c} for c, _ in expected], path.name
        assert [result for _, _, _, result in calls] == [r for _, r in expected], path.name
        assert {tool for _, tool, _, _ in calls} == {"bash"}
        total += len(calls)
    assert total == 232
    history_only = [c[2]["command"] for c in stored["function_calling_simple.traj"]]
    assert history_only == [
        "find_file missing_colon.py",
        'open "tests/missing_colon.py"',
        "edit 'def division(a: float, b: float) -> float' 'def division(a: float, b: float) -> float:'",
        "python tests/missing_colon.py",
        "submit",
    ]
    # the history's own call ids are kept
    assert stored["function_calling_simple.traj"][0][0] == "call_PbWErNIge3YTrli3fiVvmIid"


def test_the_converted_calls_carry_each_observation_unchanged() -> None:
    for path in SWE_AGENT:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if not doc.get("trajectory"):
            continue
        [record] = list(iter_records(path, "swe-agent"))
        assert isinstance(record, Record) and record.warnings == ()
        spans = record.traces_data["resourceSpans"][0]["scopeSpans"][0]["spans"]
        calls = [s for s in spans if s["name"] == "execute_tool bash"]
        attributes = [{kv["key"]: kv["value"]["stringValue"] for kv in s["attributes"]} for s in calls]
        steps = [s for s in doc["trajectory"] if s["action"].strip()]
        assert [a["gen_ai.tool.call.result"] for a in attributes] == [s["observation"] for s in steps], path.name


def test_swe_agent_runs_carry_their_info_and_a_chat_span_per_step(tmp_path: Path) -> None:
    path = DATA / "swe-agent" / "ctf__forensics__flash.traj"
    doc = json.loads(path.read_text(encoding="utf-8"))
    db = tmp_path / "swe.duckdb"
    ingest(db, [path])
    con = open_store(db, read_only=True)
    try:
        (root,) = con.execute(
            "SELECT attributes['treellm.trajectory.exit_status'], attributes['treellm.trajectory.submission'], "
            "attributes['treellm.trajectory.model_stats.api_calls'], agent_name "
            "FROM spans WHERE parent_span_id IS NULL"
        ).fetchall()
        children = con.execute("SELECT name FROM spans WHERE parent_span_id IS NOT NULL ORDER BY start_ns").fetchall()
        names = [name for (name,) in children]
    finally:
        con.close()
    info = doc["info"]
    assert root == ("submitted", info["submission"], str(info["model_stats"]["api_calls"]), path.stem)
    assert names == ["chat", "execute_tool bash"] * len(doc["trajectory"])


def test_ingesting_again_from_another_path_adds_nothing_and_keeps_the_call_ids(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    files = [SWE_AGENT[0], TEXT_ACTIONS[0]]
    ingest(db, files)
    first = calls_of(db)
    copies = []
    for path in files:
        copy = tmp_path / path.name
        shutil.copyfile(path, copy)
        copies.append(copy)
    again = ingest(db, copies)
    assert (again.spans, again.runs) == (0, 0)
    other = tmp_path / "other.duckdb"
    ingest(other, copies)
    assert calls_of(other) == first


def test_detection_tells_the_coding_agent_formats_apart_from_the_others(tmp_path: Path) -> None:
    assert {detect_format(p) for p in SWE_AGENT} == {"swe-agent"}
    assert {detect_format(p) for p in TEXT_ACTIONS} == {"trajectory"}
    cases = {
        "swe-agent": {"environment": "swe_main", "trajectory": [], "info": {}},
        "trajectory": {"info": {}, "messages": [], "trajectory_format": "mini-swe-agent-1"},
        "otlp-json": {"resourceSpans": [], "history": []},
        "sdk-json": {"spans": [], "trajectory": []},
    }
    for name, content in cases.items():
        target = tmp_path / f"{name}.json"
        target.write_text(json.dumps(content, indent=2), encoding="utf-8")
        assert detect_format(target) == name, name


RUN_WITH_CALLS = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "ok"},
]
RUN_WITHOUT_CALLS = [
    {"role": "user", "content": "fix it"},
    {"role": "assistant", "content": "I would run ls, then:\n```python\nprint(1)\n```"},
    {"role": "user", "content": "go on"},
    {"role": "assistant", "content": "Done."},
]


def test_a_run_whose_calls_cannot_be_found_is_a_warning_naming_the_file_and_the_run(tmp_path: Path) -> None:
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([RUN_WITH_CALLS, RUN_WITHOUT_CALLS]), encoding="utf-8")
    report = ingest(tmp_path / "t.duckdb", [path])
    assert report.runs == 2 and report.spans == 3 + 3  # root, chat, call; root, two chats
    (warning,) = report.warnings
    assert warning.startswith(f"{path}: run 1: 2 assistant turn(s) but no tool call found")
    assert report.details[0].warnings == report.warnings
    assert report.to_json()["warnings"] == [warning]


def test_a_file_of_many_runs_without_calls_is_one_warning_counting_them_and_naming_the_first(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.json"
    runs = [RUN_WITH_CALLS] + [RUN_WITHOUT_CALLS] * 3 + [RUN_WITH_CALLS] + [RUN_WITHOUT_CALLS] * 10
    path.write_text(json.dumps(runs), encoding="utf-8")
    report = ingest(tmp_path / "t.duckdb", [path])
    assert report.runs == 15
    (warning,) = report.warnings
    without = [i for i, run in enumerate(runs) if run is RUN_WITHOUT_CALLS]
    assert len(without) == 13 and without[:10] == [1, 2, 3, 5, 6, 7, 8, 9, 10, 11]
    assert warning.startswith(f"{path}: 13 runs with assistant turns but no tool call found (")
    assert warning.endswith("): runs 1, 2, 3, 5, 6, 7, 8, 9, 10, 11 and 3 more; they are stored with no calls")


def test_a_swe_agent_file_without_actions_is_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "blank.traj"
    steps = [{"action": "", "observation": "", "thought": "hmm", "response": "hmm", "state": "{}"}] * 2
    path.write_text(json.dumps({"environment": "swe_main", "trajectory": steps, "info": {}}), encoding="utf-8")
    report = ingest(tmp_path / "t.duckdb", [path])
    assert report.runs == 1 and report.spans == 3
    (warning,) = report.warnings
    assert warning.startswith(f"{path}: run 0: 2 assistant turn(s) but no tool call found")


def test_the_cli_prints_the_warning_on_stderr_and_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([RUN_WITH_CALLS, RUN_WITHOUT_CALLS]), encoding="utf-8")
    db = tmp_path / "cli.duckdb"
    assert main(["ingest", str(path), "--db", str(db)]) == 0
    out, err = capsys.readouterr()
    assert "2 run(s)" in out
    (line,) = [line for line in err.splitlines() if "warning" in line]
    assert line.startswith(f"treellm: warning: {path}: run 1: 2 assistant turn(s) but no tool call found")
    assert main(["ingest", str(path), "--db", str(db), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["warnings"] == [line.removeprefix("treellm: warning: ")]
    assert err.strip() == line


def test_a_corrupt_traj_file_is_a_clear_error_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torn = tmp_path / "torn.traj"
    torn.write_bytes(SWE_AGENT[0].read_bytes()[:5000])
    with pytest.raises(IngestError) as caught:
        ingest(tmp_path / "t.duckdb", [torn])
    assert str(caught.value).startswith(f"{torn}:") and "invalid JSON" in str(caught.value)
    bad_step = tmp_path / "bad_step.traj"
    steps = [{"action": "ls", "observation": "a.py"}, {"action": 7, "observation": ""}]
    bad_step.write_text(json.dumps({"environment": "swe_main", "trajectory": steps}), encoding="utf-8")
    with pytest.raises(IngestError) as caught:
        ingest(tmp_path / "t.duckdb", [bad_step])
    assert str(caught.value) == f"{bad_step} (record 0): trajectory[1].action: expected text, got int"
    assert main(["ingest", str(bad_step), "--db", str(tmp_path / "cli.duckdb")]) == 1
    assert capsys.readouterr().err.strip() == f"treellm: error: {caught.value}"


def _judged(tmp_path: Path, name: str, steps: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(command, outcome, reason) of each identical repeat of one SWE-agent trajectory of ``steps``
    (action, observation), ingested and judged."""
    path = tmp_path / f"{name}.traj"
    trajectory = [{"action": a, "observation": o, "thought": "", "response": a} for a, o in steps]
    path.write_text(json.dumps({"environment": "swe_main", "trajectory": trajectory}), encoding="utf-8")
    db = tmp_path / f"{name}.duckdb"
    ingest(db, [path])
    con = open_store(db, read_only=True)
    try:
        found = repeats(con)
    finally:
        con.close()
    return [(json.loads(r.arguments)["command"], r.outcome, r.reason) for r in found.itertuples()]


CHALL = "[File: /ctf/chall.py (3 lines total)]\n1:import os\n2:key = os.urandom(8)\n3:print(key)"


def test_swe_agents_edit_writes_the_file_its_editor_has_open(tmp_path: Path) -> None:
    """``edit`` names no file: it writes the one that the run's last ``open`` or ``create`` opened
    (read as shell, an edit's text says anything: this one parses as a writer of unnamed files)."""
    elsewhere = _judged(
        tmp_path, "elsewhere",
        [("open chall.py", CHALL), ("create solve.py", "[File: /ctf/solve.py (1 lines total)]\n1:"),
         ("edit 1:1\nwith open('msg.enc', 'rb') as f:\n    print(f.read())\nend_of_edit", "File updated."),
         ("python solve.py", "1"),
         ("open chall.py", CHALL)],
    )  # fmt: skip
    assert elsewhere == [("open chall.py", "wasted", "same result as its twin; nothing it reads was written between")]
    here = _judged(
        tmp_path, "here",
        [("open chall.py", CHALL), ("edit 3:3\nprint(key)\nend_of_edit", "File updated."), ("open chall.py", CHALL)],
    )  # fmt: skip
    assert here == [
        ("open chall.py", "productive", "same result after chall.py was written between (checks the change)")
    ]
    # before any open, after an open that names no one file and after one that failed, the edited
    # file is unknown: a program run (whose reads are unknown) may read it
    created = ("create x.py", "[File: x.py]")
    leads = {
        "none": [("ls", "x")],
        "unnamed": [created, ("open $F", "x")],
        "failed": [created, ("open gone.py", "Error: no gone.py")],
    }
    edit = ("edit 1:1\nx = 1\nend_of_edit", "File updated.")
    for name, lead in leads.items():
        unknown = _judged(tmp_path, name, [*lead, ("python chall.py", "k"), edit, ("python chall.py", "k")])
        assert unknown == [("python chall.py", "productive", "same result, but `edit 1:1` may have written anything")]
    known = _judged(
        tmp_path, "known",
        [("create x.py", "[File: x.py]"), ("python chall.py", "k"), ("edit 1:1\nx = 1\nend_of_edit", "ok"),
         ("python chall.py", "k")],
    )  # fmt: skip
    assert [(c, o) for c, o, _ in known] == [("python chall.py", "wasted")]  # x.py: the agent's scratch file
    # a repeated `goto` shows the open file: wasted unless that file was written between
    views = _judged(
        tmp_path, "views",
        [("open a.py", "[File: a.py]"), ("goto 40", "40:x"), ("create b.py", "[File: b.py]"),
         ("edit 1:1\ny\nend_of_edit", "ok"), ("open a.py", "[File: a.py]"), ("goto 40", "40:x"),
         ("edit 40:40\nz\nend_of_edit", "ok"), ("goto 40", "40:x")],
    )  # fmt: skip
    assert [(c, o) for c, o, _ in views] == [("open a.py", "wasted"), ("goto 40", "wasted"), ("goto 40", "productive")]


LISTED = "AUTHORS.rst\nREADME.rst\ndocs/\nsetup.py\nsrc/\n"


def test_a_listing_that_differs_only_by_the_agents_own_new_files_is_wasted(tmp_path: Path) -> None:
    """A listing of names again, after the agent made a file: the one new name is its own."""
    own = _judged(
        tmp_path, "own",
        [("ls -F", LISTED), ("create reproduce.py", "[File: reproduce.py (1 lines total)]"),
         ("python reproduce.py", "344"), ("ls -F", LISTED.replace("setup.py", "reproduce.py\nsetup.py"))],
    )  # fmt: skip
    assert own == [("ls -F", "wasted", "lists only the agent's own new files beyond its twin's listing (reproduce.py)")]
    # columns as a terminal prints them: the names count, not their layout
    columns = _judged(
        tmp_path, "columns",
        [("ls", "AUTHORS.rst  docs  setup.py"), ("touch notes.txt", ""),
         ("ls", "AUTHORS.rst  docs\nnotes.txt  setup.py")],
    )  # fmt: skip
    assert [(c, o) for c, o, _ in columns] == [("ls", "wasted")]
    # a name the agent did not make (an install's), a long listing, or no listing: a new result
    for name, steps in {
        "installed": [("ls -F", LISTED), ("create r.py", "[File: r.py]"), ("pip install -e .", "ok"),
                      ("ls -F", LISTED + "build/\nr.py\n")],
        "long": [("ls -la", "total 8\n-rw-r--r-- 1 a a 10 setup.py"), ("create r.py", "[File: r.py]"),
                 ("ls -la", "total 12\n-rw-r--r-- 1 a a 10 setup.py\n-rw-r--r-- 1 a a 0 r.py")],
        "grep": [("grep -r x .", "a.py:x"), ("create r.py", "[File: r.py]"), ("grep -r x .", "a.py:x\nr.py")],
    }.items():  # fmt: skip
        assert _judged(tmp_path, name, steps)[0][1:] == ("productive", "a new result: differs from its twin's"), name
