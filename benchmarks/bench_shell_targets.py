"""The runtime rule's cost: ``command_targets`` (effect + paths read and written) against
``classify_command`` (effect only), side by side in one run over every real command of the
shipped coding-agent trajectories (issue 20's target: within 1.25x).

    .venv/bin/python benchmarks/bench_shell_targets.py [--rounds 7]

After a warm-up pass, each round times both functions call by call over all commands,
alternating which goes first. The table prints, for each, the median microseconds per
command over every call of every round and the mean. The ratio is the median of the
per-round ratios of those medians (with their range), so that one round slowed by another
process on the machine moves it little; the per-command ratio (each command's median time
over the rounds, targets over classify, then the median over the commands) is printed as
a second view.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
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


def per_call(function: Callable[[str], object], texts: list[str]) -> list[float]:
    """Microseconds of each call, in the order of ``texts``."""
    times = []
    clock = time.perf_counter_ns
    for text in texts:
        start = clock()
        function(text)
        times.append((clock() - start) / 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    texts = commands()
    functions: list[tuple[str, Callable[[str], object]]] = [
        ("classify_command", classify_command),
        ("command_targets", command_targets),
    ]
    for _, function in functions:
        per_call(function, texts)  # warm-up: imports, first parses, caches of the interpreter
    rounds: dict[str, list[list[float]]] = {name: [] for name, _ in functions}
    for i in range(args.rounds):
        for name, function in functions if i % 2 == 0 else functions[::-1]:
            rounds[name].append(per_call(function, texts))
    old, new = rounds["classify_command"], rounds["command_targets"]
    ratios = [statistics.median(b) / statistics.median(a) for a, b in zip(old, new, strict=True)]
    per_command = [
        statistics.median(r[i] for r in new) / statistics.median(r[i] for r in old) for i in range(len(texts))
    ]
    print(f"{len(texts)} real commands x {args.rounds} rounds (alternating order)")
    print(f"{'function':<20} {'median us':>10} {'mean us':>10}")
    for name, times in rounds.items():
        every = [t for r in times for t in r]
        print(f"{name:<20} {statistics.median(every):>10.1f} {statistics.fmean(every):>10.1f}")
    print(
        f"ratio (targets / classify, median of per-round medians): {statistics.median(ratios):.2f}x"
        f"   (rounds {min(ratios):.2f}-{max(ratios):.2f}; target <= 1.25x)"
    )
    print(f"ratio per command (median over commands): {statistics.median(per_command):.2f}x")


if __name__ == "__main__":
    main()
