"""The runtime rule's cost: ``command_targets`` (effect + paths read and written) against
``classify_command`` (effect only), side by side in one run over every real command of the
shipped coding-agent trajectories (issue 20's target: within 1.25x).

    .venv/bin/python benchmarks/bench_shell_targets.py [--rounds 5]

Each round times both functions over all commands, alternating which goes first; the
table prints the median microseconds per command of each and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from treellm.shell import classify_command, command_targets

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def commands() -> list[str]:
    out: list[str] = []
    for path in sorted((DATA / "mini-swe-agent").glob("*/*.traj.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        for message in data["messages"]:
            for call in message.get("tool_calls") or []:
                out.append(json.loads(call["function"]["arguments"])["command"])
    for path in sorted((DATA / "swe-agent").glob("*.traj")):
        data = json.loads(path.read_text(encoding="utf-8"))
        out.extend(step["action"].rstrip() for step in data.get("trajectory", []) if step["action"].strip())
    return out


def per_call(function: object, texts: list[str]) -> list[float]:
    times = []
    for text in texts:
        start = time.perf_counter_ns()
        function(text)  # type: ignore[operator]
        times.append((time.perf_counter_ns() - start) / 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    texts = commands()
    old: list[float] = []
    new: list[float] = []
    for i in range(args.rounds):
        pair = [(classify_command, old), (command_targets, new)]
        for function, sink in pair if i % 2 == 0 else reversed(pair):
            sink.extend(per_call(function, texts))
    a, b = statistics.median(old), statistics.median(new)
    print(f"{len(texts)} real commands x {args.rounds} rounds")
    print(f"{'function':<20} {'median us':>10} {'mean us':>10}")
    print(f"{'classify_command':<20} {a:>10.1f} {statistics.fmean(old):>10.1f}")
    print(f"{'command_targets':<20} {b:>10.1f} {statistics.fmean(new):>10.1f}")
    print(f"ratio (targets / classify, median): {b / a:.2f}x   (target <= 1.25x)")


if __name__ == "__main__":
    main()
