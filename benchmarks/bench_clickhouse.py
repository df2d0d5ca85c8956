"""The analysis on both engines side by side: DuckDB (treellm's store) and ClickHouse (chDB
over the Collector exporter's ``otel_traces``), the same spans in each.

Run: .venv/bin/python benchmarks/bench_clickhouse.py [--spans 1000000] [--keep /tmp/ba] [--repeats 3]
     [--copies 10]

The spans are ``bench_analysis.py``'s store (the same simulated file, replicated, with
``--keep`` shared with it). ClickHouse gets the same OTLP/JSON lines as rows written the way
the exporter writes them (``tests/clickhouse_rows.py``) into the exporter's exact DDL in a
chDB folder; then one ``treellm derive`` worker derives them into treellm's tables
(``treellm_spans``, ``treellm_traces``), timed: its throughput in spans/s per worker. Each
function: the median of ``--repeats`` calls after one warm-up on each engine, and the ratio
chDB / DuckDB measured in the same run. ``totals`` and ``report`` are checked equal on both.

``--copies K`` then scales chDB alone: treellm's derived tables (every one the analysis reads)
are copied K-1 more times inside ClickHouse, each copy's trace and run ids suffixed (``INSERT
... SELECT``, into a database of its own), so they hold K times the spans, runs and calls; each
function is timed again over them (no DuckDB beside it: the figures to hold are absolute, report
<= 5 s at 10M spans), as the copies left them (several parts a table) and after merging their
parts as a derive pass does at its end, side by side. Deriving 10M spans through one worker
would take K times the derive time above; the derive throughput per worker is the figure
measured above. Copy k is dated k days before the derivation (``bucket``). Then the same
copies in tables partitioned by day (``DAILY``, a server's layout; chDB's tables are one
partition), each function over them, and the next pass: one more copy of the spans, derived
today, and the merge after it, timed over both layouts, side by side.
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
from treellm.store.clickhouse_views import DAILY, DERIVED_SPANS, DERIVED_TRACES, DERIVED_VIEWS  # noqa: E402

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


TABLES = (DERIVED_SPANS, DERIVED_TRACES, *DERIVED_VIEWS.values())


def copy_rows(ch: ClickHouseConnection, source: str, target: str, table: str, *, suffix: str, days_before: int) -> None:
    """Insert the rows of ``source.table`` into ``target.table``, every trace and run id with
    ``suffix`` after it, dated ``days_before`` days before their partition (``bucket``)."""
    columns = list(ch.df(f"SELECT name FROM system.columns WHERE database = '{source}' AND table = '{table}' "
                         "ORDER BY position")["name"])  # fmt: skip
    values = ", ".join(
        f"concat(`{c}`, '{suffix}')" if c == "trace_id" else
        f"if(`{c}` IS NULL, NULL, concat(`{c}`, '{suffix}'))" if c == "run_id" else
        f"subtractDays(`{c}`, {days_before})" if c == "bucket" else f"`{c}`"
        for c in columns
    )  # fmt: skip
    names = ", ".join(f"`{c}`" for c in columns)
    ch.command(f"INSERT INTO {target}.{table} ({names}) SELECT {values} FROM {source}.{table} FINAL")


def copy_derived(ch: ClickHouseConnection, target: str, copies: int, *, fresh: bool = False) -> None:
    """Fill the database ``target`` with ``copies`` copies of the derived tables of ``ch``'s
    database (copy 0 as it is, copy k with ``-k`` after every trace and run id, k days older); the
    tables as ``ch``'s unless ``fresh`` (then as :func:`open_clickhouse` made them in ``target``)."""
    for table in TABLES:
        if not fresh:
            ch.command(f"DROP TABLE IF EXISTS {target}.{table} SYNC")  # columns as the source's, now
            ch.command(f"CREATE TABLE {target}.{table} AS {ch.database}.{table}")
        for k in range(copies):
            copy_rows(ch, ch.database, target, table, suffix=f"-{k}" if k else "", days_before=k)


def next_pass_merge(ch: ClickHouseConnection, url: str, target: str) -> float:
    """Seconds :meth:`ClickHouseConnection.compact` takes over ``target``'s tables after one more
    copy of ``ch``'s rows, derived today."""
    for table in TABLES:
        copy_rows(ch, ch.database, target, table, suffix="-next", days_before=0)
    merger = open_clickhouse(url, database=target)
    t0 = time.perf_counter()
    merger.compact()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--base-runs", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", help="folder to keep the files, the DuckDB store and the chDB folder in")
    parser.add_argument("--copies", type=int, default=0, help="then time chDB over K copies of the derived tables")
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
            keys = ch.df(f"SELECT partition_key FROM system.tables WHERE database = '{ch.database}' "
                         f"AND name = '{DERIVED_SPANS}'")["partition_key"]  # fmt: skip
            if underived(ch) or list(keys) != [ch.partition]:  # derive into fresh tables: each trace derived once,
                # as a worker beside a Collector does (versions left by older runs would sit unmerged in
                # chDB's parts), and in this treellm's tables
                ch.command(f"DROP DATABASE IF EXISTS {ch.database} SYNC")
                ch.close()
                ch = open_clickhouse(f"chdb:{folder / f'chdb-{args.spans}'}", create_table=True)
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
            if args.copies > 1:
                scaled(ch, f"chdb:{folder / f'chdb-{args.spans}'}", args.copies, args.repeats)
        finally:
            duck.close()
            ch.close()


def scaled(ch: ClickHouseConnection, url: str, copies: int, repeats: int) -> None:
    """Time every function over ``copies`` copies of the derived tables (chDB alone)."""
    target = f"treellm_x{copies}"
    ch.command(f"CREATE DATABASE IF NOT EXISTS {target}")
    t0 = time.perf_counter()
    copy_derived(ch, target, copies)
    print(f"\ncopied treellm's derived tables {copies} times in {time.perf_counter() - t0:.1f} s")
    big = open_clickhouse(url, database=target)
    rows = int(big.df("SELECT count() AS n FROM spans")["n"][0])
    print(f"{rows:,} spans, {int(big.df('SELECT count() AS n FROM runs')['n'][0]):,} runs in chDB ({target})")
    timed = {}
    for name, _target, _label in FUNCTIONS:
        function = getattr(analysis, name)
        timed[name] = median_time(lambda function=function: function(big), repeats)[0]
    t0 = time.perf_counter()
    merged = big.compact()  # as a derive pass does at its end
    print(f"merged the parts of {len(merged)} table(s) in {time.perf_counter() - t0:.1f} s; each function before "
          "and after (the copies' inserts left several parts a table)")  # fmt: skip
    after = {}
    for name, _target, _label in FUNCTIONS:
        function = getattr(analysis, name)
        after[name] = median_time(lambda function=function: function(big), repeats)
    daily = f"{target}_daily"
    ch.command(f"DROP DATABASE IF EXISTS {daily} SYNC")
    by_day_con = open_clickhouse(url, database=daily, partition=DAILY)  # a server's tables
    t0 = time.perf_counter()
    copy_derived(ch, daily, copies, fresh=True)
    by_day_con.compact()
    print(f"the same copies in tables partitioned by day ({daily}), merged, in {time.perf_counter() - t0:.1f} s")
    print(f"{'function':26} {'result':>12} {'parts s':>9} {'merged s':>9} {'ratio':>7} {'by day s':>9}")
    for name, _target, _label in FUNCTIONS:
        function = getattr(analysis, name)
        c_s, result = after[name]
        d_s = median_time(lambda function=function: function(by_day_con), repeats)[0]
        print(f"{name:26} {size_of(result):>12} {timed[name]:9.3f} {c_s:9.3f} {c_s / timed[name]:7.2f} {d_s:9.3f}")
    print(f"\nthe next pass: one more copy ({rows // copies:,} spans) derived today, then the merge of the parts")
    one = next_pass_merge(ch, url, target)
    by_day = next_pass_merge(ch, url, daily)
    print(f"{'tables':34} {'merge s':>8}")
    print(f"{'one partition (chDB)':34} {one:8.1f}")
    print(f"{'a partition a day (a server)':34} {by_day:8.1f}   {by_day / one:.2f}x")
    by_day_con.close()
    ch.command(f"DROP DATABASE {daily} SYNC")  # the copies stay as they were for bench_dashboard.py
    for table in TABLES:
        ch.command(f"ALTER TABLE {target}.{table} DELETE WHERE endsWith(trace_id, '-next') SETTINGS mutations_sync = 1")
    big.compact()


if __name__ == "__main__":
    main()
