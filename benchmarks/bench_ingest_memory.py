"""Peak memory of ``treellm ingest`` against the calls of one chat trajectory (and an OTLP file).

Run: .venv/bin/python benchmarks/bench_ingest_memory.py [--calls 2000 6000 20000] [--otlp-spans 0] [--keep DIR]
         [--shapes mixed,looping,stuck] [--before DIR]

One mini-swe-agent-shaped trajectory file per size (``{info, messages, trajectory_format}``,
OpenAI ``tool_calls`` of the tool ``bash``, each answered by a ``role: tool`` message; about
1.3 KB a call, so 20,000 calls are ~27 MB) in two shapes: ``mixed`` (reads, edits with ``sed -i``,
test runs, some identical re-reads, as an agent's long run has them) and ``looping`` (an
agent cycling through the same 20 reads, nothing written between: every call repeats, and each
call's earlier identical calls grow with the run) and ``stuck`` (one read, the same every call:
one chain of identical calls as long as the run).
Each file is ingested by the whole ``treellm ingest`` command in a child process at the
default ``TREELLM_INGEST_MEMORY_LIMIT``; its peak RSS is ``VmHWM`` from ``/proc/<pid>/status``
(polled; it only grows). The table prints the peak against the calls, and the ratio of each
row's peak (and calls) to the first row of its shape: memory that grows sublinearly in the
calls has a peak ratio well below the calls ratio.

``--otlp-spans N`` adds a row for a batched OTLP JSONL file of N spans (the Collector's file
exporter shape, as ``bench_ingest_batched.py`` writes it). ``--before DIR`` (a checkout of an
older commit, e.g. a ``git worktree``) ingests every file with that tree's treellm too
(``PYTHONPATH=DIR``), each file's two runs back to back, and prints both side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import tempfile
from pathlib import Path

from child_peak import ROOT, run_with_peak

FILES = [f"src/pkg/module_{i}.py" for i in range(300)]


def _command(rng: random.Random, k: int) -> tuple[str, str]:
    """(a bash command, its output) as a coding agent's long run has them."""
    roll = rng.random()
    path = rng.choice(FILES)
    if roll < 0.08:
        return f"sed -i 's/old_{k}/new_{k}/' {path}", ""
    if roll < 0.14:
        return "python -m pytest -x -q tests/", f"<returncode>1</returncode>\n<output>FAILED test_{k % 40}\n</output>"
    if roll < 0.30:
        return "ls -la src/pkg", "<returncode>0</returncode>\n<output>" + "module.py\n" * 40 + "</output>"
    if roll < 0.60:
        start = rng.randrange(1, 400)
        lines = "".join(f"{n}\tline {n} of {path}\n" for n in range(start, start + 12))
        return f"sed -n '{start},{start + 11}p' {path}", f"<returncode>0</returncode>\n<output>{lines}</output>"
    if roll < 0.80:
        found = f"<returncode>0</returncode>\n<output>{path}:12: def\n</output>"
        return f"grep -rn 'def handler_{rng.randrange(60)}' src/", found
    body = "".join(f"line {n}: {'x' * 40}\n" for n in range(20))
    return f"cat {path}", f"<returncode>0</returncode>\n<output>{body}</output>"


def _looping(rng: random.Random, k: int) -> tuple[str, str]:
    """An agent stuck in a loop: the same 20 reads again and again, nothing written between."""
    path = FILES[k % 20]
    body = "".join(f"line {n}: {'x' * 40}\n" for n in range(20))
    return f"cat {path}", f"<returncode>0</returncode>\n<output>{body}</output>"


def _stuck(rng: random.Random, k: int) -> tuple[str, str]:
    """An agent stuck on one call: the same read, the same output, every time."""
    return _looping(rng, 0)


SHAPES = {"mixed": _command, "looping": _looping, "stuck": _stuck}


def generate_trajectory(path: Path, calls: int, *, shape_name: str = "mixed", seed: int = 7) -> None:
    """One run of ``calls`` bash calls in mini-swe-agent's tool-call trajectory shape."""
    rng = random.Random(seed)
    shape = SHAPES[shape_name]
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are a helpful assistant that can interact with a computer shell."},
        {"role": "user", "content": "<pr_description>Fix the handler.</pr_description>"},
    ]
    for k in range(calls):
        command, output = shape(rng, k)
        call_id = f"call_{k:06d}_{rng.getrandbits(40):010x}"
        messages.append(
            {
                "role": "assistant",
                "content": f"Step {k}: let me look at this next. " + "t" * rng.randrange(200, 900),
                "tool_calls": [
                    {"index": 0, "id": call_id, "type": "function",
                     "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
                ],
            }
        )  # fmt: skip
        messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
    doc = {"info": {"exit_status": "Submitted", "mini_version": "1.14"}, "messages": messages,
           "trajectory_format": "mini-swe-agent-1", "instance_id": f"bench__{calls}"}  # fmt: skip
    path.write_text(json.dumps(doc), encoding="utf-8")


def report_peak(db: Path, tree: str | None = None) -> tuple[float, float, str]:
    """(seconds, peak RSS MB, error) of ``treellm report --format json`` over ``db``."""
    env = None if tree is None else {**os.environ, "PYTHONPATH": tree}
    argv = [sys.executable, "-m", "treellm", "report", "--db", str(db), "--format", "json"]
    child = run_with_peak(argv, env, Path(tree) if tree else ROOT)
    error = "" if child.returncode == 0 else child.err.strip().splitlines()[-1][:120]
    return child.seconds, child.peak_mb, error


def ingest_peak(path: Path, db: Path, tree: str | None = None) -> tuple[float, float, float, str]:
    """(seconds, peak RSS MB from VmHWM, ru_maxrss MB of the child, error) of ``treellm ingest``
    (of the treellm in ``tree`` when given, else this one)."""
    for stale in db.parent.glob(db.name + "*"):
        stale.unlink()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    env = None if tree is None else {**os.environ, "PYTHONPATH": tree}
    argv = [sys.executable, "-m", "treellm", "ingest", str(path), "--db", str(db), "--json"]
    child = run_with_peak(argv, env, Path(tree) if tree else ROOT)  # ``-m`` imports from its folder first
    elapsed, err = child.seconds, child.err
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the largest child so far
    error = "" if child.returncode == 0 else err.strip().splitlines()[-1][:120]
    return elapsed, child.peak_mb, max(after, before) / 1024, error


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, nargs="+", default=[2000, 6000, 20000])
    parser.add_argument("--otlp-spans", type=int, default=0, help="add a batched OTLP JSONL file of N spans")
    parser.add_argument("--keep", help="folder to keep the generated files in (reused when present)")
    parser.add_argument("--shapes", default="mixed,looping,stuck", help="trajectory shapes, comma-separated")
    parser.add_argument("--before", help="a checkout of an older treellm: ingest every file with it too")
    parser.add_argument("--report", action="store_true", help="also time `treellm report` over each store")
    args = parser.parse_args()
    print(f"uptime: {os.popen('uptime').read().strip()}")
    trees = [args.before, None] if args.before else [None]
    with tempfile.TemporaryDirectory(prefix="treellm-bench-mem-") as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        files: list[tuple[str, int, Path]] = []
        for shape in args.shapes.split(","):
            for calls in args.calls:
                data = folder / f"trajectory-{shape}-{calls}.traj.json"
                if not data.exists():
                    generate_trajectory(data, calls, shape_name=shape)
                files.append((f"trajectory {shape}, {calls:,} calls", calls, data))
        if args.otlp_spans:
            sys.path.insert(0, str(Path(__file__).parent))
            from bench_ingest_batched import DATA_VERSION, generate

            data = folder / f"batched-{args.otlp_spans}-{DATA_VERSION}.jsonl"
            if not data.exists():
                generate(data, args.otlp_spans)
            files.append((f"OTLP batched, {args.otlp_spans:,} spans", args.otlp_spans, data))
        rows = []
        reports: list[list[tuple[float, float, str] | None]] = []
        for label, n, data in files:
            runs: list[tuple[float, float, float, str]] = []
            timed: list[tuple[float, float, str] | None] = []
            for tree in trees:
                runs.append(ingest_peak(data, folder / "mem.duckdb", tree))
                if args.report:  # none when the ingest failed
                    timed.append(None if runs[-1][3] else report_peak(folder / "mem.duckdb", tree))
            rows.append((label, n, data.stat().st_size / 1e6, runs))
            reports.append(timed)
    head = "".join(f" {name + ' s':>9} {name + ' MB':>10}" for name in (["before", "now"] if args.before else ["now"]))
    print(f"{'file':34} {'MB':>6}{head} {'x calls':>8} {'x peak':>7}  error")
    for index, (label, n, size, runs) in enumerate(rows):
        if index == 0 or rows[index - 1][0].split(",")[0] != label.split(",")[0]:
            first_calls, first_peak = n, runs[-1][1]  # ratios (of this tree) to the first row of each shape
        cells = "".join(f" {seconds:9.1f} {peak:10,.0f}" for seconds, peak, _, _ in runs)
        errors = "; ".join(f"{'before' if len(runs) > 1 and i == 0 else 'now'}: {error}"
                           for i, (_, _, _, error) in enumerate(runs) if error)  # fmt: skip
        print(f"{label:34} {size:6.1f}{cells} {n / first_calls:8.1f} {runs[-1][1] / first_peak:7.2f}  {errors}")
    if args.report:
        names = ["before", "now"] if args.before else ["now"]
        print(f"\n{'treellm report over the store':34}" + "".join(f" {n + ' s':>9} {n + ' MB':>10}" for n in names))
        for (label, *_), timed in zip(rows, reports, strict=True):
            cells = "".join(f" {'-':>9} {'-':>10}" if t is None else f" {t[0]:9.1f} {t[1]:10,.0f}" for t in timed)
            errors = "; ".join(t[2] for t in timed if t is not None and t[2])
            print(f"{label:34}{cells}  {errors}")
    print("peak RSS: VmHWM of the ingest command's process, default TREELLM_INGEST_MEMORY_LIMIT (1GB)")


if __name__ == "__main__":
    main()
