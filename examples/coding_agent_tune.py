"""A coding agent's trajectories, ingested and tuned: which repeat limit does the data support?

    python examples/coding_agent_tune.py [TRAJECTORY_OR_FOLDER ...] [--db runs.duckdb]

Without paths it reads the mini-swe-agent trajectories shipped in ``tests/data/mini-swe-agent``
(SWE-bench runs, each a chat of ``bash`` calls). Prints, per tool, the calls and exact repeats
(productive and wasted), then ``tune``'s verdict, the limit it advises and why, and the
``read_only`` rules it proposes for the commands that hide wasted repeats from the limit.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from treellm.analysis.report import report, tune
from treellm.store import ingest, open_store

SHIPPED = Path(__file__).resolve().parent.parent / "tests" / "data" / "mini-swe-agent"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--db", type=Path, help="the store (default: a temporary one)")
    args = parser.parse_args()
    paths = args.paths or sorted(SHIPPED.rglob("*.traj.json"))
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "runs.duckdb"
        done = ingest(db, paths)
        print(f"{done.files} trajectories: {done.runs} runs, {done.accounting.tool_calls} tool calls")
        con = open_store(db, read_only=True)
        try:
            figures, advice = report(con), tune(con)
        finally:
            con.close()
    for tool in figures["tools"]:
        print(
            f"{tool['tool']}: {tool['calls']} calls, {tool['exact_repeats']} exact repeats "
            f"({tool['productive_repeats']} productive, {tool['wasted_repeats']} wasted)"
        )
    for tool in advice["tools"]:
        limit = tool["recommended_max_repeats"]
        print(f"tune {tool['tool']}: {tool['verdict']}, max_repeats {limit}: {tool['reason']}")
        for rule in tool.get("rules", []):
            if rule["advised"]:
                print(f"  read_only rule {rule['read_only']!r}: sees {rule['wasted_seen']} wasted repeat(s)")


if __name__ == "__main__":
    main()
