"""Collector throughput: pre-encoded OTLP/protobuf load, with and without a live reader, beside the SDK's ceiling.

Run: .venv/bin/python benchmarks/bench_collector.py [--seconds 60] [--connections 8] [--spans-per-request 100]

Measured in one run, each against a fresh ``python -m treellm.collector`` subprocess and store
(but the first):

- ``decode_request alone``: the request path's decoding of the same pre-encoded bodies in this
  process, one core, no HTTP, no journal, no store: its spans/s and per-request p50/p99.

- ``pre-encoded``: ``--connections`` threads (keep-alive ``http.client``) POST distinct
  protobuf requests of ``--spans-per-request`` treellm-shaped spans (built once with the
  SDK's ``encode_spans``; the trace and span ids are patched per request, so every span is
  new) for ``--seconds``; a 429/503 is retried after its ``Retry-After``, as OTLP clients
  do. Reported: acknowledged spans/s, p50/p99 acknowledgement latency, refusals, then,
  after SIGTERM and the drain, whether the store holds exactly the acknowledged spans; below
  the table, the acknowledged rate in each 5 s of the load (it falls where the journal's bound
  is reached and receiving waits for the store) and how many requests waited for room.
- ``pre-encoded + reader``: the same while a reader opens the store read-only every
  second, counts the spans and closes it (as the dashboard does); its query time and how
  far the visible count trails the acknowledged one (in seconds of load) are reported.
- ``Python SDK exporter``: spans created by the OpenTelemetry SDK (three attributes) through
  ``BatchSpanProcessor`` + ``OTLPSpanExporter`` to the collector: the ceiling of a real
  Python client on this machine (the SDK, not the collector, is what limits it).

Ratios are to the first row; the machine has 2 cores shared by the load, the collector
and DuckDB, so read the ratios. The load average before and after is printed with the table.
"""

from __future__ import annotations

import argparse
import bisect
import http.client
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import set_span_in_context  # noqa: E402

from treellm.collector.decode import decode_request  # noqa: E402
from treellm.errors import StoreBusyError, StoreError  # noqa: E402
from treellm.store import open_store  # noqa: E402

URL_LINE = re.compile(r"listening on (http://\S+)")


# -- requests -------------------------------------------------------------------------------------------


RUN_PLACEHOLDER = b"run-########"


@dataclass(frozen=True)
class Template:
    """One encoded request and where its ids and run id sit, to make distinct copies cheaply."""

    body: bytes
    id_offsets: list[tuple[int, int]]  # (offset, length) of every trace and span id
    run_offsets: list[int]  # offset of every ``treellm.run.id`` value

    def request(self, number: int) -> bytes:
        """The template with the last 4 bytes of every id and the run id set from ``number``."""
        out = bytearray(self.body)
        tail = (number + 1).to_bytes(4, "big")
        for start, length in self.id_offsets:
            out[start + length - 4 : start + length] = tail
        run = b"run-%08x" % (number + 1)
        for start in self.run_offsets:
            out[start : start + len(run)] = run
        return bytes(out)


def _all(body: bytes, value: bytes) -> list[int]:
    found, start = [], body.find(value)
    while start >= 0:
        found.append(start)
        start = body.find(value, start + 1)
    return found


def template_request(spans: int) -> Template:
    """One protobuf request of ``spans`` treellm-shaped spans: one run, a root and its tool calls."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("treellm", "0.1")
    run_id = RUN_PLACEHOLDER.decode()
    root = tracer.start_span(
        "invoke_agent bench",
        attributes={"gen_ai.operation.name": "invoke_agent", "treellm.run.id": run_id},
    )
    context = set_span_in_context(root)
    for i in range(spans - 1):
        tool = ("read_file", "grep", "run_tests", "web_search")[i % 4]
        span = tracer.start_span(
            f"execute_tool {tool}",
            context=context,
            attributes={
                "treellm.run.id": run_id,
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "gen_ai.tool.call.id": f"call_{i}",
                "treellm.node.id": f"n{i}",
                "treellm.node.kind": "tool",
                "treellm.node.depth": i // 10,
                "treellm.node.parent_id": "root",
                "treellm.tool.signature": f"{tool}:{i % 17:04x}",
                "treellm.tool.ordinal": 1 + i % 3,
                "treellm.tool.result_hash": f"{i * 7919:016x}",
                "gen_ai.tool.call.arguments": json.dumps({"path": f"src/module_{i}.py", "limit": 50}),
                "gen_ai.tool.call.result": "x" * 200,
            },
        )
        span.end()
    root.end()
    provider.shutdown()
    finished = memory.get_finished_spans()
    body = encode_spans(finished).SerializeToString()
    ids = {s.context.trace_id.to_bytes(16, "big") for s in finished}
    ids |= {s.context.span_id.to_bytes(8, "big") for s in finished}
    id_offsets = [(start, len(value)) for value in ids for start in _all(body, value)]
    return Template(body, id_offsets, _all(body, RUN_PLACEHOLDER))


# -- the collector under test ----------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, living (Linux /proc)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo.extend(int(child) for child in task.read_text().split())
            except OSError:
                continue
    return out


class CollectorProcess:
    def __init__(self, folder: Path, options: Sequence[str] = ()) -> None:
        self.db = folder / "store.duckdb"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "treellm.collector", "--db", str(self.db), "--port", "0", *options],
            stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        assert self.process.stderr is not None
        line = self.process.stderr.readline()
        match = URL_LINE.search(line)
        if match is None:
            self.process.kill()
            raise RuntimeError(f"the collector did not start: {line}{self.process.stderr.read()}")
        self.url = match.group(1)

    def cpu_seconds(self) -> float:
        """User + system CPU the collector and its decoding processes have used so far (Linux /proc)."""
        return sum(_cpu_seconds(pid) for pid in _tree(self.process.pid))

    def health(self) -> dict[str, Any]:
        """The collector's ``GET /health`` counters."""
        parts = urlsplit(self.url)
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
        try:
            conn.request("GET", "/health")
            body: dict[str, Any] = json.loads(conn.getresponse().read())
            return body
        finally:
            conn.close()

    def stop(self) -> tuple[int, float]:
        """SIGTERM, wait for the drain; (exit code, seconds it took)."""
        started = time.perf_counter()
        self.process.send_signal(signal.SIGTERM)
        _, err = self.process.communicate(timeout=300)
        if err.strip():
            print(err.strip(), file=sys.stderr)
        return self.process.returncode, time.perf_counter() - started

    def stored(self) -> int:
        con = open_store(self.db, read_only=True)
        try:
            row = con.execute("SELECT count(*) FROM spans").fetchone()
            return int(row[0]) if row else 0
        finally:
            con.close()


# -- load ---------------------------------------------------------------------------------------------------


@dataclass
class Load:
    spans_per_request: int
    acked_spans: int = 0
    latencies: list[float] = field(default_factory=list)
    acks: list[tuple[float, int]] = field(default_factory=list)  # (time, acknowledged spans so far)
    refused: int = 0
    errors: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def acked_at(self, count: int) -> float | None:
        """When the acknowledged count first reached ``count``."""
        with self.lock:
            index = bisect.bisect_left(self.acks, count, key=lambda a: a[1])
            return self.acks[index][0] if index < len(self.acks) else None


def run_load(url: str, template: Template, *, seconds: float, connections: int,
             load: Load, rate: float | None) -> float:  # fmt: skip
    """POST distinct requests from ``connections`` threads for ``seconds`` (paced to ``rate`` spans/s if given)."""
    parts = urlsplit(url)
    numbers = iter(range(10**9))
    numbers_lock = threading.Lock()
    started = time.perf_counter()
    deadline = started + seconds
    gap = load.spans_per_request / rate if rate else 0.0

    def worker() -> None:
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)
        headers = {"Content-Type": "application/x-protobuf"}
        try:
            while time.perf_counter() < deadline:
                with numbers_lock:
                    number = next(numbers)
                if gap:
                    time.sleep(max(0.0, started + number * gap - time.perf_counter()))
                body = template.request(number)
                while True:
                    sent = time.perf_counter()
                    conn.request("POST", parts.path, body=body, headers=headers)
                    response = conn.getresponse()
                    response.read()
                    now = time.perf_counter()
                    with load.lock:
                        if response.status == 200:
                            load.acked_spans += load.spans_per_request
                            load.latencies.append(now - sent)
                            load.acks.append((now, load.acked_spans))
                        elif response.status in (429, 503):
                            load.refused += 1
                        else:
                            load.errors += 1
                    if response.status not in (429, 503):
                        break
                    time.sleep(float(response.getheader("Retry-After") or 1))
        finally:
            conn.close()

    threads = [threading.Thread(target=worker) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


@dataclass(frozen=True)
class Sample:
    wait_s: float  # until the read-only connection opened
    query_s: float
    age_s: float  # how long ago the newest visible span had been acknowledged (0: all visible)


def reader(db: Path, load: Load, stop: threading.Event, out: list[Sample]) -> None:
    """Every second: open read-only, count, close (as the dashboard does)."""
    while not stop.wait(1.0):
        started = time.perf_counter()
        try:
            con = open_store(db, read_only=True, retries=40)
        except StoreBusyError:
            continue
        except StoreError:  # no store yet: the first flush has not happened
            continue
        opened = time.perf_counter()
        try:
            row = con.execute("SELECT count(*) FROM spans").fetchone()
        finally:
            con.close()
        done = time.perf_counter()
        visible = int(row[0]) if row else 0
        with load.lock:
            acked = load.acked_spans
        first_missing = load.acked_at(visible + 1) if visible < acked else None
        out.append(Sample(opened - started, done - opened, done - first_missing if first_missing else 0.0))


@dataclass(frozen=True)
class Row:
    name: str
    rate: float
    p50_ms: float
    p99_ms: float
    refused: int
    stored_ok: str
    drain_s: float
    note: str = ""


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values) or [0.0]
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


WINDOW_S = 5.0


def _by_window(load: Load, started: float, elapsed: float) -> str:
    """Acknowledged spans/s in each ``WINDOW_S`` of the load (the last window may be partial):
    where the journal fills, the rate falls to what the store's ingest beside the receiver allows."""
    windows = [0] * max(1, int(-(-elapsed // WINDOW_S)))
    previous = 0
    for at, count in load.acks:
        windows[min(len(windows) - 1, int((at - started) // WINDOW_S))] += count - previous
        previous = count
    return " ".join(f"{n / WINDOW_S / 1000:.1f}k" for n in windows)


def pre_encoded(args: argparse.Namespace, template: Template, *, with_reader: bool, rate: float | None = None,
                options: Sequence[str] = (), label: str = "") -> Row:  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="treellm-bench-collector-") as tmp:
        collector = CollectorProcess(Path(tmp), options)
        load = Load(args.spans_per_request)
        stop, samples = threading.Event(), list[Sample]()
        watcher = threading.Thread(target=reader, args=(collector.db, load, stop, samples)) if with_reader else None
        if watcher is not None:
            watcher.start()
        cpu_before, client_before = collector.cpu_seconds(), time.process_time()
        started = time.perf_counter()
        elapsed = run_load(collector.url, template, seconds=args.seconds, connections=args.connections,
                           load=load, rate=rate)  # fmt: skip
        cpu, client = collector.cpu_seconds() - cpu_before, time.process_time() - client_before
        stop.set()
        if watcher is not None:
            watcher.join()
        health = collector.health()
        journal = health["journal"]
        code, drain_s = collector.stop()
        stored = collector.stored()
    achieved = load.acked_spans / elapsed
    ok = "yes" if stored == load.acked_spans and code == 0 and not load.errors else f"NO ({stored:,}, exit {code})"
    note = (f"{load.acked_spans:,} spans acked; {journal['submissions']:,} requests journaled with "
            f"{journal['syncs']:,} fdatasync(s); CPU of the collector with its decoding processes "
            f"{cpu / elapsed:.0%} of one core, of the load client (and reader) {client / elapsed:.0%}; "
            f"{health['admission_waits']:,} request(s) waited for room in the journal; acknowledged spans/s by "
            f"{WINDOW_S:.0f} s of the load: {_by_window(load, started, elapsed)}")  # fmt: skip
    if samples:
        waits, queries, ages = ([getattr(x, k) for x in samples] for k in ("wait_s", "query_s", "age_s"))
        note += (
            f"; reader: {len(samples)} queries, waited for the file p50 {_percentile(waits, 0.5):.2f} s / max "
            f"{max(waits):.2f} s, query {_percentile(queries, 0.5) * 1000:.0f} ms, visible data behind by p50 "
            f"{_percentile(ages, 0.5):.1f} s / max {max(ages):.1f} s"
        )
    name = "pre-encoded" + label + (f", paced to {rate:,.0f}/s" if rate else "") + (" + reader" if with_reader else "")
    latencies = load.latencies
    return Row(name, achieved, _percentile(latencies, 0.5) * 1000, _percentile(latencies, 0.99) * 1000,
               load.refused, ok, drain_s, note)  # fmt: skip


class CountingExporter(OTLPSpanExporter):
    """The real exporter, counting the spans it exported successfully."""

    exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = super().export(spans)
        if result is SpanExportResult.SUCCESS:
            self.exported += len(spans)
        return result


def sdk_exporter(args: argparse.Namespace) -> Row:
    logging.getLogger("opentelemetry.sdk._shared_internal").setLevel(logging.ERROR)  # drops are counted below
    seconds = min(args.seconds, args.sdk_seconds)
    with tempfile.TemporaryDirectory(prefix="treellm-bench-collector-") as tmp:
        collector = CollectorProcess(Path(tmp))
        provider = TracerProvider(resource=Resource.create({"service.name": "bench-sdk"}))
        exporter = CountingExporter(endpoint=collector.url)
        processor = BatchSpanProcessor(exporter, max_queue_size=65536,
                                       max_export_batch_size=512, schedule_delay_millis=100)  # fmt: skip
        provider.add_span_processor(processor)
        tracer = provider.get_tracer("bench")
        created = 0
        started = time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            for _ in range(100):
                span = tracer.start_span("execute_tool grep", attributes={"a": 1, "b": "text", "c": True})
                span.end()
            created += 100
        provider.force_flush(timeout_millis=120_000)
        elapsed = time.perf_counter() - started
        provider.shutdown()
        code, drain_s = collector.stop()
        stored = collector.stored()
    exported = exporter.exported
    ok = "yes" if stored == exported and code == 0 else f"NO ({stored:,} of {exported:,}, exit {code})"
    return Row("Python SDK exporter (BatchSpanProcessor)", exported / elapsed, 0.0, 0.0, 0, ok, drain_s,
               f"{created:,} spans created in {elapsed:.1f} s, {exported:,} exported, {created - exported:,} "
               "dropped by the SDK's full queue: one export at a time, the SDK is the limit")  # fmt: skip


def decode_alone(args: argparse.Namespace, template: Template) -> Row:
    """``decode_request`` on distinct pre-encoded bodies in this process, one core: the request path's
    own ceiling, before HTTP, the journal and the store."""
    bodies = [template.request(n) for n in range(64)]
    for body in bodies[:8]:
        decode_request(body, "protobuf")
    seconds = min(args.seconds, 5.0)
    done = 0
    started = time.perf_counter()
    times = []
    while (now := time.perf_counter()) - started < seconds:
        decode_request(bodies[done % len(bodies)], "protobuf")
        done += 1
        times.append(time.perf_counter() - now)
    elapsed = time.perf_counter() - started
    return Row("decode_request alone (one core, no HTTP)", done * args.spans_per_request / elapsed,
               _percentile(times, 0.5) * 1000, _percentile(times, 0.99) * 1000, 0, "-", 0.0,
               f"{done:,} requests decoded in {elapsed:.1f} s")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0, help="load duration of each pre-encoded run")
    parser.add_argument("--sdk-seconds", type=float, default=15.0, help="duration of the SDK run (capped by --seconds)")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--spans-per-request", type=int, default=100)
    parser.add_argument("--paced", type=float, default=20_000.0, help="offered spans/s of the paced run")
    parser.add_argument("--scenarios", default="decode,full,reader,paced,sdk",
                        help="which rows, in order (comma-separated: decode, full, full-nice0, reader, paced, "
                             "sdk)")  # fmt: skip
    args = parser.parse_args()
    template = template_request(args.spans_per_request)
    check = ExportTraceServiceRequest.FromString(template.request(41)).resource_spans[0].scope_spans[0].spans
    assert len({s.span_id for s in check}) == args.spans_per_request and len(template.run_offsets) == len(check)
    runs = {a.value.string_value for span in check for a in span.attributes if a.key == "treellm.run.id"}
    assert runs == {"run-0000002a"}, runs
    load_before = os.getloadavg()
    scenarios = {
        "decode": lambda: decode_alone(args, template),
        "full": lambda: pre_encoded(args, template, with_reader=False),
        "full-nice0": lambda: pre_encoded(
            args, template, with_reader=False, options=["--flusher-nice", "0"], label=", flusher not niced"
        ),
        "full-nice19": lambda: pre_encoded(
            args, template, with_reader=False, options=["--flusher-nice", "19"], label=", flusher nice 19"
        ),
        "reader": lambda: pre_encoded(args, template, with_reader=True),
        "paced": lambda: pre_encoded(args, template, with_reader=True, rate=args.paced),
        "sdk": lambda: sdk_exporter(args),
    }
    rows = [scenarios[name]() for name in args.scenarios.split(",")]
    load_after = os.getloadavg()
    base = rows[0].rate
    print(f"\ncollector on {os.cpu_count()} cores: {args.connections} connections, {args.spans_per_request} spans "
          f"per request ({len(template.body):,} bytes), {args.seconds:.0f} s per pre-encoded run")  # fmt: skip
    print(f"{'scenario':44} {'spans/s':>9} {'x first':>7} {'p50 ms':>7} {'p99 ms':>7} {'429/503':>7} "
          f"{'store == acked':>14} {'drain s':>7}")  # fmt: skip
    for row in rows:
        latency = f"{row.p50_ms:7.1f} {row.p99_ms:7.1f}" if row.p50_ms else f"{'-':>7} {'-':>7}"
        print(f"{row.name:44} {row.rate:9,.0f} {row.rate / base:7.2f} {latency} {row.refused:7d} "
              f"{row.stored_ok:>14} {row.drain_s:7.1f}")  # fmt: skip
    for row in rows:
        print(f"  {row.name}: {row.note}")
    print(f"load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in load_before)}; after: "
          f"{', '.join(f'{x:.2f}' for x in load_after)}")  # fmt: skip
    print(
        "targets (issue 23): pre-encoded >= 40,000 spans/s acknowledged, store == acked after the drain; "
        "paced to 20,000/s + reader: holds the pace at p99 <= 100 ms"
    )


if __name__ == "__main__":
    main()
