"""Ingest of a batched OTLP JSONL file (the OpenTelemetry Collector's file exporter), beside DuckDB's floor.

Run: .venv/bin/python benchmarks/bench_ingest_batched.py [--spans 300000] [--keep DIR] [--repeat 1]

The Collector's file exporter writes one ``TracesData`` per export batch: 50-100 spans per
line, each with its resource and scope. The tools' results and the models' answers are prose, each
different, as real ones are (:data:`DATA_VERSION`). Measured in one run, on the same file:

- the floor: DuckDB ``read_ndjson_objects`` of the file into an untransformed table, until its
  connection is closed (where the command ends: DuckDB checkpoints the table then), and until
  its commit (the floor as measured before 2026-12-05);
- the whole ``treellm ingest`` command (a subprocess, at the default
  ``TREELLM_INGEST_MEMORY_LIMIT``) and its peak RSS (``VmHWM`` from ``/proc``);
- the same ingest in process, split into the placement of other frameworks' spans
  (conventions; runs and trees) and the rest (stage, insert; the rest of it: pieces of the
  file, the SQL check, commit), each phase timed by wrapping its function. It bounds its
  process as the command does (``bound_process``: DuckDB gets what the process does not hold,
  less the reserve for Python); before 2026-12-07 it gave DuckDB the whole limit, which the
  command never has (BENCHMARKS.md, "Batched ingest");
- the start-up of a command (interpreter and imports), the gap between the two ingests;
- the whole command with ``TREELLM_CAPTURE=full`` (no redaction), and that again with the
  conventions answering nothing (patched: no span is placed in a run), which prices the
  redaction and the whole placement (its statements, and what the insert carries for it).

Run: [--repeat N] measures each N times in turn and reports the best of each (2 shared
cores: one round's wall times move by 2x between runs).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
from child_peak import ROOT, run_with_peak

TOOLS = ("read_file", "grep", "run_tests", "web_search", "fetch_url", "list_dir")
WORDS = (
    "the", "of", "and", "to", "in", "is", "for", "on", "with", "as", "by", "at", "from", "def", "return",
    "import", "class", "self", "none", "true", "false", "if", "else", "error", "file", "line", "test",
    "path", "value", "result", "list", "dict", "int", "str", "passed", "failed", "found", "module",
    "function", "call",
)  # fmt: skip


def _prose(rng: random.Random, length: int) -> str:
    """About ``length`` characters of lower-case words and numbers, different each time: a tool's
    result or a model's answer, as distinct as real ones are (each crosses the redaction's prefilter
    and the conventions once; one text repeated would cross once in all)."""
    words: list[str] = []
    size = 0
    while size < length:
        word = rng.choice(WORDS) if rng.random() < 0.8 else str(rng.randrange(100_000))
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


def _attr(key: str, value: object) -> dict[str, object]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": str(value)}}


def _span(ids: tuple[str, str, str | None], index: int, start: int, rng: random.Random) -> dict[str, object]:
    """A span as an instrumented agent framework writes it (GenAI and OpenInference attributes)."""
    trace, span_id, parent = ids
    role = "agent" if parent is None else ("llm" if index % 3 == 1 else "tool")
    attrs = [_attr("session.id", trace[:12]), _attr("thread.id", rng.randrange(1, 9))]
    if role == "agent":
        name = "invoke_agent support-bot"
        attrs += [_attr("gen_ai.operation.name", "invoke_agent"), _attr("gen_ai.agent.name", "support-bot"),
                  _attr("input.value", json.dumps({"messages": [{"role": "user", "content": "z" * 120}]}))]  # fmt: skip
    elif role == "llm":
        name = "chat gpt-4o-mini"
        attrs += [
            _attr("gen_ai.operation.name", "chat"),
            _attr("gen_ai.request.model", "gpt-4o-mini"),
            _attr("gen_ai.usage.input_tokens", rng.randrange(200, 4000)),
            _attr("gen_ai.usage.output_tokens", rng.randrange(10, 400)),
            _attr("gen_ai.request.temperature", 0.2),
            _attr("llm.output_messages", _prose(rng, rng.randrange(100, 600))),
        ]
    else:
        tool = rng.choice(TOOLS)
        name = f"execute_tool {tool}"
        attrs += [
            _attr("gen_ai.operation.name", "execute_tool"),
            _attr("gen_ai.tool.name", tool),
            _attr("gen_ai.tool.call.id", f"call_{rng.getrandbits(48):012x}"),
            _attr("gen_ai.tool.call.arguments", json.dumps({"path": f"src/pkg/module_{rng.randrange(50)}.py"})),
            _attr("gen_ai.tool.call.result", _prose(rng, rng.randrange(100, 500))),
        ]
    span: dict[str, object] = {
        "traceId": trace,
        "spanId": span_id,
        "flags": 257,
        "name": name,
        "kind": 1 if role != "llm" else 3,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + rng.randrange(1_000_000, 900_000_000)),
        "attributes": attrs,
        "status": {"code": 2 if rng.random() < 0.02 else 0},
    }
    if parent is not None:
        span["parentSpanId"] = parent
    if role == "tool" and rng.random() < 0.1:
        span["events"] = [{"timeUnixNano": str(start + 5), "name": "retry", "attributes": [_attr("attempt", 2)]}]
    return span


DATA_VERSION = "prose"
"""Names the generated file (``--keep`` reuses it): since 2026-12-06, results and answers are prose,
each different; before, one letter repeated (a 300k-span file compressed 20x: a floor that writes
little, and one text per length for the placement and the redaction)."""


def generate(path: Path, spans: int, seed: int = 11) -> int:
    """Write ``spans`` spans as batched OTLP JSON lines (50-100 spans a line, traces split across
    lines as a batch processor splits them); returns the number of lines."""
    rng = random.Random(seed)
    resource = {
        "attributes": [
            _attr("service.name", "support-bot"),
            _attr("telemetry.sdk.name", "opentelemetry"),
            _attr("telemetry.sdk.language", "python"),
            _attr("telemetry.sdk.version", "1.29.0"),
            _attr("host.name", "worker-3"),
        ]
    }
    scope = {"name": "openinference.instrumentation.openai_agents", "version": "0.1.12"}
    start = 1_796_000_000_000_000_000
    pending: list[dict[str, object]] = []
    lines = written = 0
    with path.open("w", encoding="utf-8") as out:
        while written < spans:
            trace = f"{rng.getrandbits(128) | 1:032x}"
            root = f"{rng.getrandbits(64) | 1:016x}"
            for i in range(min(rng.randrange(20, 80), spans - written)):
                span_id = root if i == 0 else f"{rng.getrandbits(64) | 1:016x}"
                pending.append(_span((trace, span_id, None if i == 0 else root), i, start + i * 3_000_000, rng))
                written += 1
            start += 5_000_000_000
            batch = rng.randrange(50, 101)
            while len(pending) >= batch or (written >= spans and pending):
                body, pending = pending[:batch], pending[batch:]
                doc = {"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": scope, "spans": body}]}]}
                out.write(json.dumps(doc, separators=(",", ":")) + "\n")
                lines += 1
    return lines


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


_UNPLACED = """
import sys
import treellm.derive.foreign as foreign
foreign._read_foreign = lambda con, internal: False  # no span of another framework: read_foreign's own fallback
from treellm.cli import main
sys.exit(main())
"""
"""``treellm ingest`` with the conventions answering nothing, so the placement has no span to
place (the spans land in no run): what the command costs without the placement, for its cost only."""


def whole_command(
    path: Path, folder: Path, *, full: bool = False, unplaced: bool = False
) -> tuple[float, float, dict[str, object]]:
    """``treellm ingest`` as a subprocess; peak RSS from /proc (VmHWM starts afresh at exec).
    ``full``: ``TREELLM_CAPTURE=full`` (nothing redacted); ``unplaced``: :data:`_UNPLACED`."""
    db = folder / "store.duckdb"
    for stale in folder.glob("store.duckdb*"):
        stale.unlink()
    start = ["-c", _UNPLACED] if unplaced else ["-m", "treellm"]
    env = {**os.environ, "TREELLM_CAPTURE": "full"} if full else None
    child = run_with_peak([sys.executable, *start, "ingest", str(path), "--db", str(db), "--json"], env=env)
    elapsed, out, err = child.seconds, child.out, child.err
    if child.returncode != 0:
        raise RuntimeError(err)
    return elapsed, child.peak_mb, json.loads(out)


def startup() -> float:
    """Seconds a ``treellm`` command spends before it works: the interpreter and the CLI's imports."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "treellm", "ingest", "--help"], check=True, capture_output=True, cwd=ROOT)
    return time.perf_counter() - t0


PHASES = (
    ("treellm.store.ingest", "_stage_chunk", "stage: read_json and flatten (transform.py)"),
    ("treellm.store.ingest", "_insert_prepared", "insert: stored rows placed again, spans, events, links"),
    ("treellm.derive.foreign", "_read_foreign", "conventions: each distinct key once, answers joined"),
    ("treellm.derive.foreign", "_place", "trees: runs, nodes, ordinals"),
)


def in_process(path: Path, folder: Path) -> tuple[float, dict[str, float]]:
    """(whole in-process ingest, seconds per phase of :data:`PHASES`), each phase timed by wrapping
    its function; the placement of other frameworks' spans is conventions + trees."""
    import importlib

    spent = {label: 0.0 for _, _, label in PHASES}
    originals = []
    for module_name, name, label in PHASES:
        module = importlib.import_module(module_name)
        original = getattr(module, name)
        originals.append((module, name, original))

        def timed(*args: object, _original: Any = original, _label: str = label, **kwargs: object) -> object:
            t0 = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                spent[_label] += time.perf_counter() - t0

        setattr(module, name, timed)
    try:
        for stale in folder.glob("inproc.duckdb*"):
            stale.unlink()
        ingest = importlib.import_module("treellm.store.ingest").ingest
        t0 = time.perf_counter()
        ingest(folder / "inproc.duckdb", [path], bound_process=True)  # as the command: DuckDB gets its share
        elapsed = time.perf_counter() - t0
        return elapsed, spent
    finally:
        for module, name, original in originals:
            setattr(module, name, original)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spans", type=int, default=300_000)
    parser.add_argument("--keep", help="folder to keep the generated file in (reused when present)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds, each measure in turn; the best of each")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="treellm-bench-") as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        data = folder / f"batched-{args.spans}-{DATA_VERSION}.jsonl"
        if not data.exists():
            t0 = time.perf_counter()
            lines = generate(data, args.spans)
            print(f"generated {data.name}: {lines} lines, {data.stat().st_size / 1e6:.0f} MB "
                  f"in {time.perf_counter() - t0:.1f} s")  # fmt: skip
        size_mb = data.stat().st_size / 1e6
        rounds = []
        for _ in range(args.repeat):  # side by side, in turn; the best of each is reported
            for stale in folder.glob("*.duckdb*"):
                stale.unlink()
            committed_s, floor_s = floor(data, folder)
            ingest_s, peak_mb, report = whole_command(data, folder)
            full_s = whole_command(data, folder, full=True)[0]
            core_s = whole_command(data, folder, full=True, unplaced=True)[0]
            inproc_s, phases = in_process(data, folder)
            rounds.append((floor_s, ingest_s, peak_mb, inproc_s, phases, committed_s, full_s, core_s))
        floor_s = min(r[0] for r in rounds)
        committed_s = min(r[5] for r in rounds)
        ingest_s = min(r[1] for r in rounds)
        peak_mb = max(r[2] for r in rounds)
        inproc_s, phases = min(((r[3], r[4]) for r in rounds), key=lambda r: r[0])
        full_s = min(r[6] for r in rounds)
        core_s = min(r[7] for r in rounds)
        start_s = startup()
        spans = args.spans

        def row(label: str, seconds: float, rate: bool = True) -> None:
            speed = f"{spans / seconds:10,.0f} {floor_s / seconds:8.2f}" if rate else ""
            print(f"{label:56} {seconds:8.2f} {speed}")

        print(f"\n{spans:,} spans in batched lines, {size_mb:.0f} MB; ingest report: {report}")
        if args.repeat > 1:
            print(f"best of {args.repeat} rounds each (floor, command, in process in turn)")
        print(f"{'method':56} {'seconds':>8} {'spans/s':>10} {'x floor':>8}")
        row("floor: read_ndjson_objects into an untransformed table", floor_s)
        row("  the same until its commit, before its close (old floor)", committed_s)
        row("treellm ingest (whole command)", ingest_s)
        row("  start-up: interpreter and CLI imports (ingest --help)", start_s, rate=False)
        row("  with TREELLM_CAPTURE=full (nothing redacted)", full_s)
        row("    and nothing placed (patched, for the placement's cost)", core_s)
        row("  in-process ingest", inproc_s)
        placing = {k: v for k, v in phases.items() if k.startswith(("conventions", "trees"))}
        rest = {k: v for k, v in phases.items() if k not in placing}
        row("    of which placing foreign spans (runs, trees)", sum(placing.values()), rate=False)
        for label, seconds in placing.items():
            row(f"      {label}", seconds, rate=False)
        rest_s = inproc_s - sum(placing.values())
        row("    the rest: read, stage, check, insert, commit", rest_s)
        for label, seconds in rest.items():
            row(f"      {label}", seconds, rate=False)
        row("      other: line checks, file pieces, SQL check, keys stored, redaction, commit",
            rest_s - sum(rest.values()), rate=False)  # fmt: skip
        print(f"peak RSS of the ingest command: {peak_mb:,.0f} MB at the default memory limit; "
              f"target >= 0.50x floor")  # fmt: skip


if __name__ == "__main__":
    main()
