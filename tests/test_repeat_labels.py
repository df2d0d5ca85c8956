"""Repeats judged right on real agents: treellm's answers against a hand-labelled set.

``tests/data/mini-swe-agent/`` holds 22 real SWE-bench trajectories of a coding agent with one
``bash`` tool and two label files written by reading the calls (``LABELS.md`` says how):
``repeats.jsonl`` (every exact repeat: wasted or needed, with a reason) and ``pairs.jsonl``
(consecutive similar commands: paging, near or different, with a reason). ``repeats()`` and
``near_repeats()`` are scored on them, and ``tune`` must not advise raising ``bash``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from treellm.analysis import near_repeats, repeats, tune
from treellm.store import ingest, open_store

DATA = Path(__file__).parent / "data" / "mini-swe-agent"


def _labels(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DATA / name).read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    db = tmp_path_factory.mktemp("labels") / "swe.duckdb"
    files = sorted(DATA.glob("*/*.traj.json"))
    assert len(files) == 22
    ingest(db, files)
    con = open_store(db, read_only=True)
    try:
        rows = con.execute(
            "SELECT source, run_id, node_id FROM tool_calls ORDER BY source, start_ns, span_id"
        ).fetchall()
        index: dict[tuple[str, str], tuple[str, int]] = {}
        seen: Counter[str] = Counter()
        for source, run_id, node_id in rows:
            name = "/".join(Path(source).parts[-2:])
            index[(run_id, node_id)] = (name, seen[name])
            seen[name] += 1
        return {"index": index, "repeats": repeats(con), "pairs": near_repeats(con), "tune": tune(con)["tools"]}
    finally:
        con.close()


def test_the_label_set_is_as_large_as_promised() -> None:
    rows = _labels("repeats.jsonl")
    pairs = _labels("pairs.jsonl")
    assert len(rows) >= 100 and len(pairs) >= 60
    assert all(r["reason"].strip() and r["label"] in {"wasted", "needed"} for r in rows)
    assert all(p["reason"].strip() and p["label"] in {"paging", "near", "different"} for p in pairs)


def test_wasted_precision_on_hand_labelled_repeats(judged: dict[str, Any]) -> None:
    labels = {(r["file"], r["call"]): r["label"] for r in _labels("repeats.jsonl")}
    wasted = [judged["index"][(r.run_id, r.node_id)] for r in judged["repeats"].itertuples() if r.outcome == "wasted"]
    labelled = [labels[key] for key in wasted if key in labels]
    assert labelled, "treellm called no labelled repeat wasted"
    precision = labelled.count("wasted") / len(labelled)
    assert precision >= 0.9, (precision, labelled)
    # every row of repeats() says why
    assert judged["repeats"]["reason"].str.len().min() > 0


def test_needed_re_runs_after_a_state_change_are_not_repeats(judged: dict[str, Any]) -> None:
    """Edit-then-test cycles, restores and regenerated patches: a write (or a program that may
    write) between restarts the count, so none of those is judged a wasted repeat."""
    needed = {(r["file"], r["call"]) for r in _labels("repeats.jsonl") if r["label"] == "needed"}
    called_wasted = {
        judged["index"][(r.run_id, r.node_id)] for r in judged["repeats"].itertuples() if r.outcome == "wasted"
    }
    assert len(needed & called_wasted) <= 0.1 * len(needed)


def _pairs(judged: dict[str, Any]) -> dict[tuple[str, int, int], str]:
    out = {}
    for row in judged["pairs"].itertuples():
        earlier = judged["index"][(row.run_id, row.earlier_node_id)]
        later = judged["index"][(row.run_id, row.node_id)]
        out[(earlier[0], earlier[1], later[1])] = str(row.kind)
    return out


def test_paging_recall_on_line_range_moves(judged: dict[str, Any]) -> None:
    found = _pairs(judged)
    paging = [(p["file"], p["earlier"], p["later"]) for p in _labels("pairs.jsonl") if p["label"] == "paging"]
    assert len(paging) >= 20
    recall = sum(found.get(key) == "paging" for key in paging) / len(paging)
    assert recall >= 0.9, recall


def test_near_repeat_precision(judged: dict[str, Any]) -> None:
    found = _pairs(judged)
    labels = {(p["file"], p["earlier"], p["later"]): p["label"] for p in _labels("pairs.jsonl")}
    near = [labels[key] for key, kind in found.items() if kind == "near" and key in labels]
    assert len(near) >= 10
    precision = near.count("near") / len(near)
    assert precision >= 0.8, (precision, Counter(near))
    # a different file or question is never a near repeat
    different = [key for key, label in labels.items() if label == "different"]
    assert sum(found.get(key) == "near" for key in different) <= 0.2 * len(different)


def test_tune_does_not_advise_raising_bash_and_says_why(judged: dict[str, Any]) -> None:
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
