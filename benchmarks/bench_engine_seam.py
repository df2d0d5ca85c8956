"""DuckDB query times before and after the engine seam, side by side in one run.

Run: .venv/bin/python benchmarks/bench_engine_seam.py OLD_TREE --db STORE [--repeats 5]

``OLD_TREE`` is a checkout of the commit before the seam (``git worktree add --detach
/tmp/seam-old f17f2c1``: the parent of bd784a0, which added ``treellm/store/backend.py``).
``STORE`` is a DuckDB store (or a ``treellm export`` folder, read through ``open_parquet``),
e.g. ``bench_analysis.py``'s 1M-span store (``--keep DIR``); without ``--db`` one of
``--spans`` spans is built the way ``bench_analysis.py`` builds it.

Two worker processes, one importing ``treellm`` from ``OLD_TREE`` and one from this tree
(same virtualenv, same DuckDB), each with one read-only connection to the same store.
Each round times every query once in each worker, alternating which goes first; a worker
times the call itself (``perf_counter`` around the analysis function), after one warm-up.
Printed: the median per query on each side and new/old (the issue's bar: <= 1.20).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUERIES = [
    ("report", "report"),
    ("tune", "tune"),
    ("shapes", "shape_by_run"),
    ("near repeats", "near_repeats_by_tool"),
    ("totals", "totals"),
    ("prune_rate_by_tool", "prune_rate_by_tool"),
    ("prune_rate_by_model", "prune_rate_by_model"),
    ("repeat_outcome_by_tool", "repeat_outcome_by_tool"),
    ("cost_by_tool", "cost_by_tool"),
    ("runs_by_day", "runs_by_day"),
    ("tuning_by_tool", "tuning_by_tool"),
    ("what_if_by_tool_limit", "what_if_by_tool_limit"),
]
LIMIT = 1.20

WORKER = r"""
import json, sys, time
import treellm
from treellm import analysis
from pathlib import Path
from treellm.store import open_parquet, open_store
target = Path(sys.argv[1])
con = open_parquet([target]) if target.is_dir() else open_store(target, read_only=True)
print(json.dumps({"ready": treellm.__file__}), flush=True)
for line in sys.stdin:
    name = line.strip()
    function = getattr(analysis, name)
    t0 = time.perf_counter()
    result = function(con)
    seconds = time.perf_counter() - t0
    size = len(result.get("tools", result)) if isinstance(result, dict) else len(result)
    print(json.dumps({"seconds": seconds, "size": size}), flush=True)
"""


class Worker:
    """A Python process importing ``treellm`` from ``tree``, answering one query per line."""

    def __init__(self, tree: Path, db: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(tree))
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(db)], cwd=tree, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.source = Path(self._read()["ready"]).resolve()
        if not self.source.is_relative_to(tree.resolve()):
            raise SystemExit(f"the worker for {tree} imported treellm from {self.source}")

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit("a worker died")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def time(self, function: str) -> tuple[float, int]:
        assert self.process.stdin is not None
        self.process.stdin.write(function + "\n")
        self.process.stdin.flush()
        answer = self._read()
        return float(answer["seconds"]), int(answer["size"])

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


def build_store(spans: int, folder: Path) -> Path:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_analysis import build

    return Path(build(folder, spans, 4000))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("old_tree", type=Path, help="a checkout of the commit before the seam")
    parser.add_argument(
        "--db", type=Path, help="the store (or export folder) to query (default: build one of --spans spans)"
    )
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per query (after one warm-up each)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="treellm-seam-") as tmp:
        db = args.db or build_store(args.spans, Path(tmp))
        old, new = Worker(args.old_tree, db), Worker(ROOT, db)
        print(f"store {db}\nold: treellm from {old.source.parent}\nnew: treellm from {new.source.parent}")
        times: dict[str, dict[str, list[float]]] = {label: {"old": [], "new": []} for label, _ in QUERIES}
        sizes: dict[str, tuple[int, int]] = {}
        try:
            for label, function in QUERIES:  # warm-up, and the result sizes compared
                sizes[label] = (old.time(function)[1], new.time(function)[1])
            for round_ in range(args.repeats):
                for label, function in QUERIES:
                    order = [("old", old), ("new", new)] if round_ % 2 == 0 else [("new", new), ("old", old)]
                    for side, worker in order:
                        times[label][side].append(worker.time(function)[0])
        finally:
            old.close()
            new.close()
    print(f"\nmedian of {args.repeats} rounds after one warm-up, old and new alternating, default filters")
    print(f"{'query':24} {'function':24} {'size':>6} {'old s':>8} {'new s':>8} {'new/old':>8}")
    slower = []
    for label, function in QUERIES:
        o, n = statistics.median(times[label]["old"]), statistics.median(times[label]["new"])
        size = str(sizes[label][1]) if sizes[label][0] == sizes[label][1] else f"{sizes[label][0]}!={sizes[label][1]}"
        print(f"{label:24} {function:24} {size:>6} {o:8.3f} {n:8.3f} {n / o:8.2f}")
        if n / o > LIMIT:
            slower.append(f"{label} ({n / o:.2f})")
    total_old = sum(statistics.median(t["old"]) for t in times.values())
    total_new = sum(statistics.median(t["new"]) for t in times.values())
    print(f"{'sum of medians':49} {'':6} {total_old:8.3f} {total_new:8.3f} {total_new / total_old:8.2f}")
    verdict = f"more than {LIMIT - 1:.0%} slower: {', '.join(slower)}" if slower else f"every query within {LIMIT:.2f}x"
    print(f"\n{verdict}")


if __name__ == "__main__":
    main()
