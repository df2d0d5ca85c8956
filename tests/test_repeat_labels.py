"""Repeats judged right on real agents: treellm's answers against a hand-labelled set.

``tests/data/mini-swe-agent/`` holds 29 real SWE-bench trajectories of a coding agent with one
``bash`` tool, ``tests/data/swe-agent/`` 22 trajectories of another (SWE-agent), each set with
two label files written by reading the calls (``LABELS.md`` says how): ``repeats.jsonl``
(every identical call: wasted or needed, with a reason) and ``pairs.jsonl`` (consecutive
similar commands: paging, near or different, with a reason). ``repeats()`` and
``near_repeats()`` are scored on them, precision and recall each with its counts, and
``tune`` must not advise raising ``bash``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from treellm.analysis import near_repeats, repeats, report, tune
from treellm.store import ingest, open_store

DATA = Path(__file__).parent / "data"
SETS = {
    # label set -> (trajectory files, the label folder)
    "mini-swe-agent": (sorted((DATA / "mini-swe-agent").glob("*/*.traj.json")), DATA / "mini-swe-agent"),
    "swe-agent": (sorted((DATA / "swe-agent").glob("*.traj")), DATA / "swe-agent-labels"),
}


def _labels(folder: Path, name: str) -> list[dict[str, Any]]:
    text = (folder / name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _file_name(source: str) -> str:
    path = Path(source)
    return "/".join(path.parts[-2:]) if path.name.endswith(".traj.json") else path.name


@pytest.fixture(scope="module", params=sorted(SETS))
def judged(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    files, folder = SETS[request.param]
    assert len(files) == {"mini-swe-agent": 29, "swe-agent": 22}[request.param]
    db = tmp_path_factory.mktemp("labels") / "coding.duckdb"
    ingest(db, files)
    con = open_store(db, read_only=True)
    try:
        rows = con.execute(
            "SELECT source, run_id, node_id FROM tool_calls ORDER BY source, start_ns, span_id"
        ).fetchall()
        index: dict[tuple[str, str], tuple[str, int]] = {}
        seen: Counter[str] = Counter()
        for source, run_id, node_id in rows:
            name = _file_name(source)
            index[(run_id, node_id)] = (name, seen[name])
            seen[name] += 1
        return {
            "set": request.param,
            "folder": folder,
            "files": files,
            "index": index,
            "repeats": repeats(con),
            "pairs": near_repeats(con),
            "tune": tune(con)["tools"],
        }
    finally:
        con.close()


def _score(hits: int, called: int, labelled: int) -> tuple[float, float]:
    """(precision, recall), each over its own count."""
    return (hits / called if called else 0.0), (hits / labelled if labelled else 0.0)


def test_the_label_sets_are_as_large_as_promised() -> None:
    for _, folder in SETS.values():
        rows = _labels(folder, "repeats.jsonl")
        pairs = _labels(folder, "pairs.jsonl")
        assert len(rows) >= 20 and len(pairs) >= 30
        assert all(r["reason"].strip() and r["label"] in {"wasted", "needed"} for r in rows)
        assert all(p["reason"].strip() and p["label"] in {"paging", "near", "different"} for p in pairs)


def _identical_calls(judged: dict[str, Any]) -> set[tuple[str, int]]:
    """An independent count: every call whose command is byte-identical to an earlier one in its file."""
    out = set()
    for path in judged["files"]:
        data = json.loads(path.read_text(encoding="utf-8"))
        if judged["set"] == "mini-swe-agent":
            commands = [
                json.loads(call["function"]["arguments"])["command"]
                for message in data["messages"]
                for call in message.get("tool_calls") or []
            ]
        else:
            commands = [step["action"].rstrip() for step in data.get("trajectory", []) if step["action"].strip()]
        name = _file_name(str(path))
        out |= {(name, i) for i, command in enumerate(commands) if command in commands[:i]}
    return out


def test_every_identical_call_is_shown_and_labelled(judged: dict[str, Any]) -> None:
    shown = {judged["index"][(r.run_id, r.node_id)] for r in judged["repeats"].itertuples()}
    labelled = {(r["file"], r["call"]) for r in _labels(judged["folder"], "repeats.jsonl")}
    independent = _identical_calls(judged)
    assert shown == independent == labelled
    # identical repeats include those the limit's rule counts, never fewer
    counted = judged["repeats"]["counted"]
    assert 0 < counted.sum() < len(counted)
    assert judged["repeats"]["reason"].str.len().min() > 0


def test_wasted_precision_and_recall_on_hand_labelled_repeats(judged: dict[str, Any]) -> None:
    labels = {(r["file"], r["call"]): r["label"] for r in _labels(judged["folder"], "repeats.jsonl")}
    called = {judged["index"][(r.run_id, r.node_id)] for r in judged["repeats"].itertuples() if r.outcome == "wasted"}
    wasted = {key for key, label in labels.items() if label == "wasted"}
    precision, recall = _score(len(called & wasted), len(called), len(wasted))
    assert len(wasted) >= 7 and len(called) >= 4
    assert precision >= 0.9, (precision, len(called & wasted), len(called))
    # SWE-agent's editor's `edit` writes the file the run last opened, and a listing that differs
    # only by the agent's own new file shows it nothing new (see LABELS.md there)
    floor = {"mini-swe-agent": 0.7, "swe-agent": 0.9}[judged["set"]]
    assert recall >= floor, (recall, len(called & wasted), len(wasted))


def test_needed_re_runs_after_a_state_change_are_not_called_wasted(judged: dict[str, Any]) -> None:
    """Edit-then-test cycles, restores and regenerated patches are productive."""
    needed = {(r["file"], r["call"]) for r in _labels(judged["folder"], "repeats.jsonl") if r["label"] == "needed"}
    called = {judged["index"][(r.run_id, r.node_id)] for r in judged["repeats"].itertuples() if r.outcome == "wasted"}
    assert len(needed & called) <= 0.1 * len(needed)


def _pairs(judged: dict[str, Any]) -> dict[tuple[str, int, int], str]:
    out = {}
    for row in judged["pairs"].itertuples():
        earlier = judged["index"][(row.run_id, row.earlier_node_id)]
        later = judged["index"][(row.run_id, row.node_id)]
        out[(earlier[0], earlier[1], later[1])] = str(row.kind)
    return out


def test_paging_precision_and_recall_on_line_windows(judged: dict[str, Any]) -> None:
    found = _pairs(judged)
    labels = {(p["file"], p["earlier"], p["later"]): p["label"] for p in _labels(judged["folder"], "pairs.jsonl")}
    paging = {key for key, label in labels.items() if label == "paging"}
    called = {key for key, kind in found.items() if kind == "paging" and key in labels}
    if judged["set"] == "swe-agent":
        assert not paging and not called  # those runs never page (LABELS.md)
        return
    precision, recall = _score(len(called & paging), len(called), len(paging))
    assert len(paging) >= 30
    assert recall >= 0.9, (recall, len(called & paging), len(paging))
    assert precision >= 0.8, (precision, len(called & paging), len(called))


def test_near_repeat_precision(judged: dict[str, Any]) -> None:
    found = _pairs(judged)
    labels = {(p["file"], p["earlier"], p["later"]): p["label"] for p in _labels(judged["folder"], "pairs.jsonl")}
    near = [labels[key] for key, kind in found.items() if kind == "near" and key in labels]
    assert len(near) >= 10
    precision = near.count("near") / len(near)
    assert precision >= 0.8, (precision, Counter(near))
    # a different file or question is never a near repeat
    different = [key for key, label in labels.items() if label == "different"]
    assert sum(found.get(key) == "near" for key in different) <= 0.2 * len(different)


def test_tune_does_not_advise_raising_bash_and_says_why(judged: dict[str, Any]) -> None:
    if judged["set"] != "mini-swe-agent":
        bash = next((t for t in judged["tune"] if t["tool"] == "bash"), None)
        assert bash is None or bash["verdict"] != "raise"
        return
    bash = next(t for t in judged["tune"] if t["tool"] == "bash")
    assert bash["recommended_max_repeats"] <= 2
    assert bash["verdict"] != "raise"
    assert not bash["observed_limit"] and "no observed limit" in bash["reason"]
    assert "state change" in bash["reason"]  # the re-runs after writes are why the limit need not grow


def test_tau_bench_never_raises_book_reservation_on_one_productive_repeat(tmp_path: Path) -> None:
    """One re-booking after a cancel against nine identical failing retries is no case for a raise."""
    source = Path(__file__).parent / "data" / "external" / "tau-bench-gpt-4o-airline-book-reservation.json"
    db = tmp_path / "tau.duckdb"
    ingest(db, [source])
    con = open_store(db, read_only=True)
    try:
        tools = {t["tool"]: t for t in tune(con)["tools"]}
    finally:
        con.close()
    book = tools["book_reservation"]
    assert (book["samples"], round(book["productive_rate"] * book["samples"])) == (10, 1)
    assert book["verdict"] != "raise" and book["recommended_max_repeats"] == 1
    assert "too few productive repeats" in book["reason"]


def test_the_report_shows_every_identical_call_beside_the_counted_ones(judged: dict[str, Any], tmp_path: Path) -> None:
    db = tmp_path / "report.duckdb"
    ingest(db, judged["files"])
    con = open_store(db, read_only=True)
    try:
        data = report(con)
    finally:
        con.close()
    independent = len(_identical_calls(judged))
    assert data["identical_repeats"] == independent == sum(t["identical_repeats"] for t in data["tools"])
    for tool in data["tools"]:
        assert tool["identical_productive"] + tool["identical_wasted"] <= tool["identical_repeats"]
        assert tool["exact_repeats"] <= tool["identical_repeats"]


def _chat_identical(path: Path) -> int:
    """Independently: calls whose tool and canonical arguments equal an earlier call's in the same run."""
    data = json.loads(path.read_text(encoding="utf-8"))
    runs = data if isinstance(data, list) else [data]
    total = 0
    for run in runs:
        messages = run.get("traj") or run.get("messages") or []
        seen: list[tuple[str, str]] = []
        for message in messages:
            for call in message.get("tool_calls") or []:
                key = (call["function"]["name"], json.dumps(json.loads(call["function"]["arguments"]), sort_keys=True))
                total += key in seen
                seen.append(key)
    return total


def _span_identical(path: Path) -> int:
    spans = json.loads(path.read_text(encoding="utf-8"))["spans"]
    seen: list[tuple[str, str]] = []
    total = 0
    for span in sorted(spans, key=lambda s: s["start_time"]):
        attributes = span.get("attributes") or {}
        if "gen_ai.tool.name" in attributes:
            key = (attributes["gen_ai.tool.name"], json.dumps(json.loads(attributes.get("gen_ai.tool.args") or "{}")))
            total += key in seen
            seen.append(key)
    return total


@pytest.mark.parametrize(
    "name",
    [
        "tau-bench-gpt-4o-airline-excerpt.json",
        "tau-bench-gpt-4o-airline-book-reservation.json",
        "any-agent-OPENAI_trace.json",
        "any-agent-SMOLAGENTS_trace.json",
    ],
)
def test_identical_repeats_equal_an_independent_count_on_other_real_sources(name: str, tmp_path: Path) -> None:
    source = DATA / "external" / name
    db = tmp_path / "real.duckdb"
    ingest(db, [source])
    con = open_store(db, read_only=True)
    try:
        data = report(con)
    finally:
        con.close()
    expected = _span_identical(source) if name.startswith("any-agent") else _chat_identical(source)
    assert data["identical_repeats"] == expected
    assert expected > 0 or name.startswith("any-agent")  # tau-bench repeats (9 and 12); any-agent none
