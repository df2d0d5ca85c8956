"""Analysis speed on a production-like store of 1M spans, beside a full scan of the spans table.

Run: .venv/bin/python benchmarks/bench_analysis.py [--spans 1000000] [--keep /tmp/ba] [--profile NAME]

The store: ``simulate(--base-runs, seed=7)`` (about 14.5 spans per run), then that OTLP
JSONL file replicated K times with rewritten ids until ``--spans`` is reached: in copy k
(1..K) every trace id gets ``k`` as its first 4 hex digits, every run id ``sim-7-...``
becomes ``sim-7-c{k}-...`` and every timestamp moves k days later (so the copies are
distinct runs, spread over K days). One big JSONL file, one ``ingest()`` into DuckDB.
With ``--keep DIR`` the base file, the big file and the store are kept and reused.

Measured in one run, on one read-only connection, with default filters: the median of
``--repeats`` calls (after one warm-up) of each analysis function, and of a full scan of
the spans table (several columns of every row; at least 11 calls, it takes milliseconds).
The ratio to the scan is the figure to compare across machines; the targets are seconds.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import math
import pstats
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

from treellm import analysis
from treellm.simulate import simulate
from treellm.store import ingest, open_store

SEED = 7
DAY_NS = 86_400 * 10**9
FULL_SCAN_SQL = "SELECT count(*), sum(length(name)), sum(length(coalesce(arguments, ''))), max(start_ns) FROM spans"
_TRACE = re.compile(rb'"traceId":"[0-9a-f]{4}')
_TIME = re.compile(rb'(TimeUnixNano":")([0-9]+)')
_SPAN = b'"startTimeUnixNano"'

# (function, target seconds, target label); tuning_by_tool and report combine several functions.
REPORT_S = 1.0
FUNCTIONS: list[tuple[str, float, str]] = [
    ("totals", REPORT_S, "<= 1 s"),
    ("prune_rate_by_tool", REPORT_S, "<= 1 s"),
    ("prune_rate_by_model", REPORT_S, "<= 1 s"),
    ("repeat_outcome_by_tool", REPORT_S, "<= 1 s"),
    ("cost_by_tool", REPORT_S, "<= 1 s"),
    ("shape_by_run", REPORT_S, "<= 1 s"),
    ("shape_distribution", REPORT_S, "<= 1 s"),
    ("runs_by_day", REPORT_S, "<= 1 s"),
    ("tuning_by_tool", 3.0, "<= 3 s (combined)"),
    ("what_if_by_tool_limit", 3.0, "<= 3 s"),
    ("near_repeats_by_tool", 5.0, "<= 5 s"),
    ("report", 3.0, "<= 3 s (combined)"),
]


def replicate(base: Path, out: Path, spans: int) -> tuple[int, int]:
    """Write copies 1..K of ``base`` (ids rewritten, k days later) into ``out`` until ``spans``
    spans are written (whole runs: a line is one run); returns (copies, spans written)."""
    lines = base.read_bytes().splitlines()
    per_copy = sum(line.count(_SPAN) for line in lines)
    if per_copy == 0:
        raise SystemExit(f"{base} has no spans")
    copies = math.ceil(spans / per_copy)
    if copies > 0xFFFF:
        raise SystemExit(f"{copies} copies needed: raise --base-runs")
    run_prefix = f"sim-{SEED}-".encode()
    written = 0
    with out.open("wb") as handle:
        for k in range(1, copies + 1):
            trace = b'"traceId":"%04x' % k
            run = run_prefix + b"c%d-" % k
            shift = k * DAY_NS

            def moved(match: re.Match[bytes], shift: int = shift) -> bytes:
                return match.group(1) + str(int(match.group(2)) + shift).encode()

            for line in lines:
                if written >= spans:
                    return k, written
                handle.write(_TIME.sub(moved, _TRACE.sub(trace, line).replace(run_prefix, run)) + b"\n")
                written += line.count(_SPAN)
    return copies, written


def build(folder: Path, spans: int, base_runs: int) -> Path:
    """The store of ``spans`` spans in ``folder`` (each step reused when its file exists)."""
    t_all = time.perf_counter()
    base = folder / f"sim-{base_runs}-seed{SEED}.jsonl"
    if not base.exists():
        partial = base.with_suffix(".partial")
        sim = simulate(base_runs, SEED, out=partial)
        partial.rename(base)
        rate = sim.runs / sim.seconds
        print(f"simulated {sim.runs:,} runs, {sim.spans:,} spans in {sim.seconds:.1f} s ({rate:.0f} runs/s)")
    else:
        print(f"reused {base}")
    big = folder / f"spans-{spans}-base{base_runs}.jsonl"
    if not big.exists():
        t0 = time.perf_counter()
        partial = big.with_suffix(".partial")
        copies, written = replicate(base, partial, spans)
        partial.rename(big)
        print(f"replicated into {copies} copies, {written:,} spans, {big.stat().st_size / 1e6:,.0f} MB "
              f"in {time.perf_counter() - t0:.1f} s")  # fmt: skip
    else:
        print(f"reused {big} ({big.stat().st_size / 1e6:,.0f} MB)")
    db = folder / f"spans-{spans}-base{base_runs}.duckdb"
    if not db.exists():
        t0 = time.perf_counter()
        partial = folder / "building.duckdb"
        for stale in folder.glob("building.duckdb*"):
            stale.unlink()
        result = ingest(partial, [big])
        partial.rename(db)
        print(f"ingested {result.spans:,} spans, {result.runs:,} runs in {time.perf_counter() - t0:.1f} s")
    else:
        print(f"reused {db}")
    print(f"store ready in {time.perf_counter() - t_all:.1f} s")
    return db


def median_time(call: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median seconds of ``repeats`` calls after one warm-up, and the last result."""
    result = call()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def size_of(result: Any) -> str:
    if isinstance(result, dict):
        return f"{len(result.get('tools', result))} tools" if "tools" in result else f"{len(result)} keys"
    return f"{len(result):,} rows"


def profile(con: duckdb.DuckDBPyConnection, name: str, top: int = 25) -> None:
    """cProfile of one call of an analysis function (after a warm-up), by cumulative time."""
    function = getattr(analysis, name)
    function(con)
    profiler = cProfile.Profile()
    profiler.enable()
    function(con)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(top)
    print(f"\nprofile of {name}:\n{text.getvalue()}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--base-runs", type=int, default=4000, help="simulated runs replicated into the store")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per function (after one warm-up)")
    parser.add_argument("--keep", help="folder to keep the generated files and the store in (reused when present)")
    parser.add_argument("--profile", action="append", default=[], help="cProfile this analysis function too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="treellm-bench-") as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        db = build(folder, args.spans, args.base_runs)
        con = open_store(db, read_only=True)
        try:
            spans = con.execute("SELECT count(*) FROM spans").fetchone()[0]  # type: ignore[index]
            days = con.execute("SELECT count(DISTINCT day) FROM spans").fetchone()[0]  # type: ignore[index]
            threads = con.execute("SELECT current_setting('threads')").fetchone()[0]  # type: ignore[index]
            sizes = analysis.totals(con)
            print(f"\n{spans:,} spans over {days} days: {sizes['runs']:,} runs, {sizes['tool_calls']:,} executed "
                  f"calls, {sizes['pruned']:,} pruned; DuckDB {duckdb.__version__}, {threads} threads")  # fmt: skip
            # the scan takes milliseconds (the store is compressed): more calls steady its median
            scan_s, _ = median_time(lambda: con.execute(FULL_SCAN_SQL).fetchall(), max(args.repeats, 11))
            rows = []
            for name, target, label in FUNCTIONS:
                function = getattr(analysis, name)
                seconds, result = median_time(lambda function=function: function(con), args.repeats)
                rows.append((name, seconds, size_of(result), target, label))
            print(f"\nmedian of {args.repeats} after one warm-up, default filters")
            print(f"{'function':32} {'result':>14} {'seconds':>8} {'x scan':>8}  {'target':18} {'met':>6}")
            print(f"{'full scan of spans (4 columns)':32} {f'{spans:,} rows':>14} {scan_s:8.4f} {1.0:8.1f}")
            missed = []
            for name, seconds, size, target, label in rows:
                met = seconds <= target
                if not met:
                    missed.append(f"{name} ({seconds:.2f} s, target {label})")
                print(f"{name:32} {size:>14} {seconds:8.3f} {seconds / scan_s:8.1f}  {label:18} "
                      f"{'met' if met else 'MISSED':>6}")  # fmt: skip
            if missed:
                print(f"\nMISSED: {'; '.join(missed)}")
            else:
                print("\nevery target met")
            for name in args.profile:
                profile(con, name)
        finally:
            con.close()


if __name__ == "__main__":
    main()
