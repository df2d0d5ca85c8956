"""Loop detector benchmark: check + extend cost by path depth, tree memory, hashing cost.

Run: .venv/bin/python benchmarks/bench_detector.py
Prints ratios measured side by side in one run (the machine is shared: read ratios).
"""

from __future__ import annotations

import json
import statistics
import time
import tracemalloc

from treellm import LoopDetector, PathSignatures, stable_hash


def args_of(i: int) -> dict[str, object]:
    """~200 bytes of typical tool arguments, distinct per i."""
    return {
        "path": f"src/package_{i % 97}/module_{i}/implementation.py",
        "query": f"def handle_request(self, request_{i}): return response",
        "limit": 10 + i % 7,
        "options": {"case_sensitive": False, "regex": True, "context_lines": 3},
    }


def build_path(det: LoopDetector, depth: int) -> PathSignatures:
    path = PathSignatures.empty()
    for i in range(depth):
        path = det.extend_path(path, "grep", args_of(i), node_id=f"n{i}")
    return path


def time_check_extend(det: LoopDetector, path: PathSignatures, reps: int) -> float:
    """Median seconds per check + extend over 5 rounds of ``reps`` calls."""
    samples = []
    calls = [args_of(10_000_000 + i) for i in range(reps)]
    for _ in range(5):
        t0 = time.perf_counter()
        for a in calls:
            decision = det.check(path, "grep", a)
            if not decision.caught:
                path.extend(decision.key, "new")
        samples.append((time.perf_counter() - t0) / reps)
    return statistics.median(samples)


def tree_memory(levels: int, siblings: int, *, copy_map: bool) -> int:
    """Bytes held by a spine of ``levels`` with ``siblings`` leaves extended at each level."""
    det = LoopDetector()
    keep: list[object] = []
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    if copy_map:  # tree-llm's way: a full Map copy per extension
        spine: dict[str, int] = {}
        for level in range(levels):
            for s in range(siblings):
                leaf = dict(spine)
                leaf[f"grep:{level}:{s}"] = 1
                keep.append(leaf)
            spine = dict(spine)
            spine[f"grep:{level}"] = 1
    else:
        path = PathSignatures.empty()
        for level in range(levels):
            for s in range(siblings):
                keep.append(det.extend_path(path, "grep", {"l": level, "s": s}))
            path = det.extend_path(path, "grep", {"l": level})
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del keep
    return used


def hashing_ratio(reps: int = 20_000) -> tuple[float, float]:
    calls = [args_of(i) for i in range(reps)]
    size = len(json.dumps(calls[0]))

    def run(fn: object) -> float:
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            for a in calls:
                fn(a)  # type: ignore[operator]
            samples.append((time.perf_counter() - t0) / reps)
        return statistics.median(samples)

    ours_once = run(stable_hash)
    ref = run(lambda a: json.dumps(a, sort_keys=True))
    print(f"\narguments size: {size} bytes")
    print(f"{'operation':48} {'us/call':>9} {'ratio':>7}")
    print(f"{'json.dumps(sort_keys=True)':48} {ref * 1e6:9.2f} {1.0:7.2f}")
    print(f"{'stable_hash (canonical_json + djb2 base 36)':48} {ours_once * 1e6:9.2f} {ours_once / ref:7.2f}")
    return ours_once, ref


def main() -> None:
    det = LoopDetector()
    print("check + extend, ~200-byte arguments, by path depth")
    print(f"{'depth':>7} {'us/op':>9} {'ratio to depth 10':>18}")
    base = None
    for depth in (10, 100, 1_000, 10_000):
        path = build_path(det, depth)
        per_op = time_check_extend(det, path, reps=2_000)
        base = base or per_op
        print(f"{depth:>7} {per_op * 1e6:9.2f} {per_op / base:18.2f}")

    print("\nmemory of a spine with 10 siblings extended per level")
    head = ("levels", "extensions", "ours KiB", "B/ext", "map-copy KiB", "copy/ours")
    print("{:>7} {:>11} {:>10} {:>7} {:>13} {:>10}".format(*head))
    for levels in (50, 100, 200):
        ours = tree_memory(levels, 10, copy_map=False)
        copy = tree_memory(levels, 10, copy_map=True)
        ext = levels * 11
        row = f"{levels:>7} {ext:>11} {ours / 1024:10.1f} {ours / ext:7.0f}"
        print(f"{row} {copy / 1024:13.1f} {copy / ours:10.2f}")

    hashing_ratio()


if __name__ == "__main__":
    main()
