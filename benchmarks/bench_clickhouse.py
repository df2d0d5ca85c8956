"""The analysis on both engines side by side: DuckDB (treellm's store) and ClickHouse (chDB
over the Collector exporter's ``otel_traces``), the same spans in each.

Run: .venv/bin/python benchmarks/bench_clickhouse.py [--spans 1000000] [--keep /tmp/ba] [--repeats 3]

The spans are ``bench_analysis.py``'s store (the same simulated file, replicated, with
``--keep`` shared with it). ClickHouse gets the same OTLP/JSON lines as rows written the way
the exporter writes them (``tests/clickhouse_rows.py``) into the exporter's exact DDL in a
chDB folder; then one ``treellm derive`` worker derives them into treellm's tables
(``treellm_spans``, ``treellm_traces``), timed: its throughput in spans/s per worker. Each
function: the median of ``--repeats`` calls after one warm-up on each engine, and the ratio
chDB / DuckDB measured in the same run. ``totals`` and ``report`` are checked equal on both.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

import chdb  # noqa: E402
import duckdb  # noqa: E402
from bench_analysis import FUNCTIONS, build, median_time, size_of  # noqa: E402
from clickhouse_rows import exporter_rows, insert_sql  # noqa: E402

from treellm import analysis  # noqa: E402
from treellm.store import open_store  # noqa: E402
from treellm.store.clickhouse import ClickHouseConnection, open_clickhouse  # noqa: E402
from treellm.store.clickhouse_derive import run_derive, underived  # noqa: E402

BATCH = 50_000


def load_clickhouse(big: Path, ch: ClickHouseConnection, spans: int) -> None:
    """``big`` (OTLP/JSON lines) into ``otel_traces`` as the exporter's rows, unless already there."""
    have = int(ch.df(f"SELECT count() AS n FROM {ch.table}")["n"][0])
    if have == spans:
        print(f"reused otel_traces ({have:,} rows)")
        return
    if have:
        ch.command(f"TRUNCATE TABLE {ch.table}")
    t0 = time.perf_counter()
    rows: list[dict[str, object]] = []
    with big.open(encoding="utf-8") as handle:
        for line in handle:
            rows.extend(exporter_rows(json.loads(line)))
            if len(rows) >= BATCH:
                ch.command(insert_sql(rows, ch.table))
                rows.clear()
    if rows:
        ch.command(insert_sql(rows, ch.table))
    ch.command(f"OPTIMIZE TABLE {ch.table} FINAL")
    size = ch.df("SELECT sum(bytes_on_disk) AS b FROM system.parts WHERE table = 'otel_traces' AND active")["b"][0]
    print(f"wrote {spans:,} exporter rows into otel_traces in {time.perf_counter() - t0:.1f} s "
          f"(row building in Python included), {int(size) / 1e6:,.0f} MB on disk")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--base-runs", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", help="folder to keep the files, the DuckDB store and the chDB folder in")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="treellm-bench-ch-") as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        db = build(folder, args.spans, args.base_runs)
        big = folder / f"spans-{args.spans}-base{args.base_runs}.jsonl"
        duck = open_store(db, read_only=True)
        ch = open_clickhouse(f"chdb:{folder / f'chdb-{args.spans}'}", create_table=True)
        try:
            spans = duck.execute("SELECT count(*) FROM spans").fetchone()[0]  # type: ignore[index]
            load_clickhouse(big, ch, spans)
            if underived(ch):
                t0 = time.perf_counter()
                passes = run_derive(ch, wait_s=0, once=True)
                took = time.perf_counter() - t0
                derived = sum(p.spans for p in passes)
                print(f"treellm derive (one worker, {len(passes)} pass(es)): {derived:,} spans in {took:.1f} s, "
                      f"{derived / took:,.0f} spans/s")  # fmt: skip
            else:
                print("reused treellm's derived tables")
            print(f"\n{spans:,} spans; DuckDB {duckdb.__version__}, chDB {chdb.__version__}")
            print(f"median of {args.repeats} after one warm-up, default filters")
            print(f"{'function':26} {'result':>12} {'DuckDB s':>9} {'chDB s':>9} {'chDB/DuckDB':>12}")
            same = True
            for name, _target, _label in FUNCTIONS:
                function = getattr(analysis, name)
                d_s, result = median_time(lambda function=function: function(duck), args.repeats)
                c_s, other = median_time(lambda function=function: function(ch), args.repeats)
                if isinstance(result, dict):
                    same = same and result == other
                print(f"{name:26} {size_of(result):>12} {d_s:9.3f} {c_s:9.3f} {c_s / d_s:12.2f}")
            print("totals and report identical on both engines" if same else "DIFFERENT results: see test_clickhouse")
        finally:
            duck.close()
            ch.close()


if __name__ == "__main__":
    main()
