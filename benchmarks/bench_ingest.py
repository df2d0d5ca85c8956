"""Ingest throughput on a generated OTLP JSONL file of 1M spans, beside DuckDB's own floor.

Run: .venv/bin/python benchmarks/bench_ingest.py [--spans 1000000]

The file: traces of 60 spans, each a run (its root span as the executor writes it).

Measured in one run, on the same file:
- the floor: DuckDB ``read_ndjson_objects`` of the file into an untransformed table, until its
  connection is closed (where the command ends: DuckDB checkpoints the table then), and until
  its commit (the floor as measured before 2026-12-05);
- the whole ``treellm ingest`` command (a subprocess: parse, flatten, promote, keep
  (trace_id, span_id) unique by an anti-join, events), its peak memory;
- the insert step with uniqueness kept by a PRIMARY KEY + INSERT OR IGNORE instead;
- a row-by-row ``executemany`` insert of a 10k-span slice.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import duckdb
from child_peak import run_with_peak

SPANS_PER_TRACE = 60


def _attr(key: str, value: object) -> dict[str, object]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": str(value)}}


def _root(trace: str, start: int, spans: int) -> dict[str, object]:
    """The run's own span, as the executor ends a run: ``invoke_agent``, no parent, the run's facts."""
    attrs = [
        _attr("treellm.run.id", trace[:16]), _attr("gen_ai.operation.name", "invoke_agent"),
        _attr("gen_ai.agent.name", "bench-agent"), _attr("treellm.run.task", "benchmark task"),
        _attr("treellm.run.outcome", "completed"), _attr("treellm.run.nodes", spans - 1),
    ]  # fmt: skip
    return {
        "traceId": trace, "name": "invoke_agent bench-agent", "kind": 1, "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + spans * 2_000_000), "attributes": attrs, "status": {"code": 0},
    }  # fmt: skip


def _span(trace: str, index: int, parent: str | None, start: int, rng: random.Random) -> dict[str, object]:
    tool = rng.choice(["read_file", "grep", "run_tests", "web_search", "fetch_url"])
    kind = "tool" if index % 3 else "think"
    attrs = [
        _attr("treellm.run.id", trace[:16]),
        _attr("treellm.node.id", f"n{index}"),
        _attr("treellm.node.kind", kind),
        _attr("treellm.node.depth", index // 6),
        _attr("treellm.node.parent_id", f"n{max(index - 1, 0)}"),
        _attr("gen_ai.operation.name", "execute_tool" if kind == "tool" else "chat"),
    ]
    if kind == "tool":
        attrs += [
            _attr("gen_ai.tool.name", tool),
            _attr("gen_ai.tool.call.id", f"call_{index}"),
            _attr("treellm.tool.signature", f"{tool}:{rng.randrange(36**6):x}"),
            _attr("treellm.tool.ordinal", 1 + index % 3),
            _attr("treellm.tool.limit", 2),
            _attr("treellm.tool.limit_source", "default"),
            _attr("treellm.tool.result_hash", f"{rng.getrandbits(64):016x}"),
            _attr("treellm.tool.attempts", 1),
            _attr("gen_ai.tool.call.arguments", json.dumps({"path": f"src/module_{index}.py", "limit": 50})),
            _attr("gen_ai.tool.call.result", "x" * rng.randrange(200, 400)),
        ]
    else:
        attrs += [_attr("gen_ai.request.model", "gpt-bench"), _attr("treellm.think.text", "y" * 300)]
    span: dict[str, object] = {
        "traceId": trace,
        "spanId": f"{rng.getrandbits(64) | 1:016x}",
        "name": f"execute_tool {tool}" if kind == "tool" else "chat gpt-bench",
        "kind": 1,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + 1_000_000),
        "attributes": attrs,
        "status": {"code": 0},
    }
    if parent:
        span["parentSpanId"] = parent
    if index % 20 == 7:
        loop_attrs = [_attr("treellm.loop.tool", tool), _attr("treellm.loop.count", 1)]
        span["events"] = [{"timeUnixNano": str(start), "name": "loop:detected", "attributes": loop_attrs}]
    return span


def generate(path: Path, spans: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    resource_attrs = [_attr("service.name", "bench-agent"), _attr("telemetry.sdk.name", "opentelemetry")]
    start = 1_796_000_000_000_000_000
    with path.open("w", encoding="utf-8") as out:
        written = 0
        while written < spans:
            trace = f"{rng.getrandbits(128) | 1:032x}"
            count = min(SPANS_PER_TRACE, spans - written)
            root = f"{rng.getrandbits(64) | 1:016x}"
            body = [_root(trace, start, count)]  # a run per trace, its spans below its root
            body += [_span(trace, i, root, start + i * 2_000_000, rng) for i in range(1, count)]
            body[0]["spanId"] = root
            scope_spans = [{"scope": {"name": "treellm"}, "spans": body}]
            doc = {"resourceSpans": [{"resource": {"attributes": resource_attrs}, "scopeSpans": scope_spans}]}
            out.write(json.dumps(doc, separators=(",", ":")) + "\n")
            written += count
            start += 10_000_000_000


def floor(path: Path, folder: Path) -> tuple[float, float]:
    """(seconds until the table is committed, until its connection is closed). The whole command
    ends with its store closed, and DuckDB checkpoints a database as its last connection closes
    (the floor's 300k-span table sits in its write-ahead log until then), so the floor is measured
    to the same point; the first figure is the floor as measured before 2026-12-05."""
    con = duckdb.connect(str(folder / "floor.duckdb"))
    t0 = time.perf_counter()
    con.execute(f"CREATE TABLE raw AS SELECT * FROM read_ndjson_objects('{path}')")
    committed = time.perf_counter() - t0
    con.close()
    return committed, time.perf_counter() - t0


def whole_command(path: Path, folder: Path) -> tuple[float, float, dict[str, object]]:
    """Run ``treellm ingest`` as a subprocess; its peak RSS is read from /proc (VmHWM),
    which starts afresh at exec (``getrusage`` would count the pages the fork inherited)."""
    db = folder / "store.duckdb"
    ingest = ["ingest", str(path), "--db", str(db), "--input-format", "otlp-jsonl", "--json"]
    child = run_with_peak([sys.executable, "-m", "treellm", *ingest])
    elapsed, out, err = child.seconds, child.out, child.err
    if child.returncode != 0:
        raise RuntimeError(err)
    return elapsed, child.peak_mb, json.loads(out)


def primary_key_variant(path: Path, folder: Path) -> tuple[float, float]:
    """The insert step with an anti-join (as treellm does) against PRIMARY KEY + INSERT OR IGNORE."""
    from treellm.derive.transform import MACROS, stage_sql
    from treellm.store.ingest import _read_expression

    con = duckdb.connect(str(folder / "variants.duckdb"))
    con.execute("SET memory_limit = '1GB'")
    con.execute(MACROS)
    con.execute(f"CREATE TABLE stage AS {stage_sql(_read_expression([path]))}", {"source": "bench"})
    con.execute("CREATE TABLE anti_t AS SELECT trace_id, span_id, name, start_ns, attributes FROM stage LIMIT 0")
    con.execute(
        "CREATE TABLE pk (trace_id VARCHAR, span_id VARCHAR, name VARCHAR, start_ns BIGINT, "
        "attributes MAP(VARCHAR, VARCHAR), PRIMARY KEY (trace_id, span_id))"
    )
    t0 = time.perf_counter()
    con.execute(
        "INSERT INTO anti_t SELECT s.trace_id, s.span_id, s.name, s.start_ns, s.attributes FROM stage s "
        "ANTI JOIN anti_t t USING (trace_id, span_id) "
        "QUALIFY row_number() OVER (PARTITION BY s.trace_id, s.span_id ORDER BY s.start_ns) = 1"
    )
    anti = time.perf_counter() - t0
    t0 = time.perf_counter()
    con.execute("INSERT OR IGNORE INTO pk SELECT trace_id, span_id, name, start_ns, attributes FROM stage")
    pk = time.perf_counter() - t0
    con.close()
    return anti, pk


def executemany_slice(folder: Path, count: int = 10_000) -> float:
    con = duckdb.connect(str(folder / "rows.duckdb"))
    con.execute("CREATE TABLE t (trace_id VARCHAR, span_id VARCHAR, name VARCHAR, start_ns BIGINT, tool VARCHAR)")
    rows = [(f"{i:032x}", f"{i:016x}", "execute_tool grep", i, "grep") for i in range(count)]
    t0 = time.perf_counter()
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?)", rows)
    elapsed = time.perf_counter() - t0
    con.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--keep", help="folder to keep the generated file in (reused when present)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="treellm-bench-") as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        data = folder / f"spans-{args.spans}.jsonl"
        if not data.exists():
            t0 = time.perf_counter()
            generate(data, args.spans)
            print(f"generated {data.name}: {data.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - t0:.1f} s")
        for stale in folder.glob("*.duckdb*"):
            stale.unlink()
        size_mb = data.stat().st_size / 1e6
        committed_s, floor_s = floor(data, folder)
        ingest_s, peak_mb, report = whole_command(data, folder)
        anti_s, pk_s = primary_key_variant(data, folder)
        rows_s = executemany_slice(folder)
        spans = args.spans
        print(f"\n{spans:,} spans, {size_mb:.0f} MB of OTLP JSON lines; ingest report: {report}")
        print(f"{'method':62} {'seconds':>8} {'spans/s':>10} {'x floor':>8}")
        print(f"{'floor: read_ndjson_objects into an untransformed table':62} {floor_s:8.2f} {spans / floor_s:10,.0f} "
              f"{1.0:8.2f}")  # fmt: skip
        print(f"{'  the same until its commit, before its close (the old floor)':62} {committed_s:8.2f} "
              f"{spans / committed_s:10,.0f} {floor_s / committed_s:8.2f}")  # fmt: skip
        print(f"{'treellm ingest (whole command, anti-join uniqueness)':62} {ingest_s:8.2f} {spans / ingest_s:10,.0f} "
              f"{floor_s / ingest_s:8.2f}")  # fmt: skip
        print(f"{'  insert step only: anti-join + dedupe':62} {anti_s:8.2f} {spans / anti_s:10,.0f}")
        print(f"{'  insert step only: PRIMARY KEY + INSERT OR IGNORE':62} {pk_s:8.2f} {spans / pk_s:10,.0f}")
        rate = 10_000 / rows_s
        print(f"{'row-by-row executemany, 10k-span slice (5 columns)':62} {rows_s:8.2f} {rate:10,.0f} "
              f"{rate / (spans / floor_s):8.3f}")  # fmt: skip
        print(f"peak RSS of the ingest command: {peak_mb:,.0f} MB (target <= 2,048 MB); target >= 0.50x floor")
        if os.environ.get("TREELLM_BENCH_KEEP") is None and not args.keep:
            data.unlink()


if __name__ == "__main__":
    main()
