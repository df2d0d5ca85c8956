"""Metrics: configure() honours OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER, and `treellm collect`
takes OTLP metrics on /v1/metrics into the store's ``metric_points`` table, durably."""

from __future__ import annotations

import datetime as dt
import gzip
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from google.rpc import status_pb2  # type: ignore[import-untyped]
from opentelemetry import metrics, trace
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AGGREGATION_TEMPORALITY_CUMULATIVE,
    Metric,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult
from opentelemetry.sdk.resources import Resource

import treellm
from treellm.collector import Collector, CollectorConfig
from treellm.errors import ConfigError, StoreError
from treellm.setup import ExporterPlan, exporter_plan
from treellm.store import open_store

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_700_000_000_000_000_000
EXPORTER_VARS = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)


# -- helpers -------------------------------------------------------------------------------------------------


def wait_until(predicate: Callable[[], bool], timeout: float = 20.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def query(db: Path, sql: str, *params: object) -> list[tuple[Any, ...]]:
    """Rows from a short read-only connection; retried while the in-process flusher holds the file
    (DuckDB refuses a second configuration in one process), as a busy store."""
    deadline = time.monotonic() + 20
    while True:
        try:
            con = open_store(db, read_only=True, retries=40)
        except StoreError as exc:
            if "different configuration" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
            continue
        try:
            return con.execute(sql, list(params)).fetchall()
        finally:
            con.close()


def count_points(db: Path, where: str = "true") -> int:
    if not db.exists():
        return 0
    tables = query(db, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'metric_points'")
    if not tables[0][0]:
        return 0
    return int(query(db, f"SELECT count(*) FROM metric_points WHERE {where}")[0][0])


def count_spans(db: Path) -> int:
    return int(query(db, "SELECT count(*) FROM spans")[0][0]) if db.exists() else 0


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    with Collector(tmp_path / "store.duckdb", CollectorConfig(port=0, flush_interval_s=0.2)) as running:
        yield running


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as session:
        yield session


def attr(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def pb_metrics(count: int = 3, *, service: str = "pb-metrics") -> ExportMetricsServiceRequest:
    """A cumulative monotonic sum with ``count`` points (one per ``worker`` attribute)."""
    metric = Metric(name="jobs.done", unit="{job}", description="Jobs done")
    metric.sum.aggregation_temporality = AGGREGATION_TEMPORALITY_CUMULATIVE
    metric.sum.is_monotonic = True
    for i in range(count):
        metric.sum.data_points.add(
            start_time_unix_nano=T0, time_unix_nano=T0 + 10**9, as_int=i + 1, attributes=[attr("worker", f"w{i}")]
        )
    resource = ResourceMetrics(scope_metrics=[ScopeMetrics(metrics=[metric])])
    resource.scope_metrics[0].scope.name = "pb-scope"
    resource.resource.attributes.append(attr("service.name", service))
    return ExportMetricsServiceRequest(resource_metrics=[resource])


@contextmanager
def store_reader(db: Path) -> Iterator[None]:
    """Another process holding a read-only connection (as a dashboard query does) until the block ends."""
    script = "import sys, duckdb\ncon = duckdb.connect(sys.argv[1], read_only=True)\nprint('ready', flush=True)\n"
    script += "sys.stdin.read()\n"
    with subprocess.Popen(
        [sys.executable, "-c", script, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as holder:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "ready"
        try:
            yield
        finally:
            holder.stdin.close()
            holder.wait(timeout=30)
            holder.stdout.close()


# -- configure(): OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER (pure plan) ------------------------------------

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
NONE: frozenset[str] = frozenset()
OTLP = frozenset({"otlp"})
CONSOLE = frozenset({"console"})
BOTH = frozenset({"otlp", "console"})


@pytest.mark.parametrize(
    ("env", "traces", "metrics_"),
    [
        ({}, NONE, NONE),  # today's default: nothing without an endpoint
        (ENDPOINT, OTLP, OTLP),
        # metrics only where configured
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://h:4318/v1/traces"}, OTLP, NONE),
        ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://h:4318/v1/metrics"}, NONE, OTLP),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, OTLP, NONE),
        ({"OTEL_TRACES_EXPORTER": "console"}, CONSOLE, NONE),
        ({"OTEL_METRICS_EXPORTER": "console"}, NONE, CONSOLE),
        ({**ENDPOINT, "OTEL_TRACES_EXPORTER": "none"}, NONE, OTLP),
        ({**ENDPOINT, "OTEL_METRICS_EXPORTER": "none"}, OTLP, NONE),
        ({"OTEL_TRACES_EXPORTER": " OTLP , console ", "OTEL_METRICS_EXPORTER": "console,otlp,"}, BOTH, BOTH),
        ({**ENDPOINT, "OTEL_TRACES_EXPORTER": "", "OTEL_METRICS_EXPORTER": " "}, OTLP, OTLP),  # empty is unset
    ],
)
def test_the_exporter_variables_choose_each_signals_exporters(
    env: dict[str, str], traces: frozenset[str], metrics_: frozenset[str]
) -> None:
    assert exporter_plan(None, None, env) == ExporterPlan(traces=traces, metrics=metrics_)  # type: ignore[arg-type]


def test_the_arguments_win_over_the_exporter_variables() -> None:
    env = {**ENDPOINT, "OTEL_TRACES_EXPORTER": "otlp,console", "OTEL_METRICS_EXPORTER": "none"}
    assert exporter_plan(False, False, env) == ExporterPlan(traces=frozenset(), metrics=frozenset())
    assert exporter_plan(True, None, env) == ExporterPlan(traces=BOTH, metrics=OTLP)  # type: ignore[arg-type]
    assert exporter_plan("http://h:1", None, {"OTEL_METRICS_EXPORTER": "none"}).metrics == OTLP
    assert exporter_plan(None, True, {"OTEL_TRACES_EXPORTER": "none"}).traces == CONSOLE


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_TRACES_EXPORTER", "jaeger"),
        ("OTEL_METRICS_EXPORTER", "otlp,prometheus"),
        ("OTEL_TRACES_EXPORTER", "none,console"),
    ],
)
def test_an_exporter_value_treellm_cannot_honour_is_a_config_error_and_installs_nothing(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    before = trace.get_tracer_provider(), metrics.get_meter_provider()
    with pytest.raises(ConfigError) as caught:
        treellm.configure(service_name="bad-env")
    assert variable in str(caught.value) and repr(value) in str(caught.value)
    assert caught.value.setting == variable
    assert (trace.get_tracer_provider(), metrics.get_meter_provider()) == before


# -- configure() in a real run (a process of its own: the global providers are set once) ----------------------

RUN = textwrap.dedent(
    """
    import treellm
    from treellm import ModelTurn, ScriptedModel, Tool, ToolCall, TreeExecutor

    treellm.configure(service_name="metrics-agent")
    call = ToolCall("lookup", {"id": 7})
    model = ScriptedModel([ModelTurn(tool_calls=[call]), ModelTurn(tool_calls=[call])])
    result = TreeExecutor(model, [Tool("lookup", "l", handler=lambda a: "row 7")], name="checkout").run("t")
    print("OUTCOME", result.outcome, flush=True)
    """
)


def run_agent(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """One scripted run (one `loop:detected`) in a process of its own; the SDK exports at exit."""
    clean = {k: v for k, v in os.environ.items() if k not in EXPORTER_VARS}
    result = subprocess.run(
        [sys.executable, "-c", RUN],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, "TREELLM_CAPTURE": "", **env},
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "OUTCOME pruned_out" in result.stdout
    return result


def base_url(collector: Collector) -> str:
    return collector.url.removesuffix("/v1/traces")


def test_a_treellm_runs_loop_detections_counter_is_queryable_in_the_store(collector: Collector) -> None:
    result = run_agent({"OTEL_EXPORTER_OTLP_ENDPOINT": base_url(collector)})
    assert "Failed to export" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert collector.stop()  # every request was acknowledged before the process exited: drained now
    rows = query(
        collector.db,
        "SELECT value, metric_type, temporality, is_monotonic, attributes['gen_ai.tool.name'], "
        "attributes['treellm.loop.action'], service_name, scope_name FROM metric_points "
        "WHERE metric_name = 'treellm.loop.detections'",
    )
    assert rows == [(1.0, "sum", "cumulative", True, "lookup", "prune", "metrics-agent", "treellm")]
    calls = query(collector.db, "SELECT sum(value) FROM metric_points WHERE metric_name = 'treellm.tool.calls'")
    assert calls == [(1.0,)]
    assert count_spans(collector.db) == 5


@pytest.mark.parametrize(
    ("traces", "metrics_", "expected"),
    [  # (spans stored, loop-detection points stored, printed, not printed)
        ("console", "none", (0, 0, '"name": "execute_tool lookup"', "treellm.loop.detections")),
        ("none", "console,otlp", (0, 1, '"name": "treellm.loop.detections"', "execute_tool lookup")),
        ("otlp", "none", (5, 0, "OUTCOME", "resource_metrics")),
    ],
)
def test_the_exporter_variables_drive_a_real_runs_exporters(
    collector: Collector, traces: str, metrics_: str, expected: tuple[int, int, str, str]
) -> None:
    spans, points, printed, not_printed = expected
    env = {"OTEL_TRACES_EXPORTER": traces, "OTEL_METRICS_EXPORTER": metrics_}
    result = run_agent({"OTEL_EXPORTER_OTLP_ENDPOINT": base_url(collector), **env})
    assert printed in result.stdout and not_printed not in result.stdout
    assert collector.stop()
    assert count_spans(collector.db) == spans
    assert count_points(collector.db, "metric_name = 'treellm.loop.detections'") == points


# -- the collector's /v1/metrics --------------------------------------------------------------------------------


def _sdk_metrics() -> Any:
    """A real SDK's export: a counter, an up-down counter, a histogram and an observable gauge."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(resource=Resource.create({"service.name": "py-metrics"}), metric_readers=[reader])
    meter = provider.get_meter("test-meter", "2.0")
    meter.create_counter("requests", unit="{request}", description="Requests").add(3, {"route": "/a", "ok": True})
    meter.create_up_down_counter("queue.depth").add(-2)
    meter.create_histogram("latency", unit="s").record(0.3, {"route": "/a"})

    def observe(options: CallbackOptions) -> list[Observation]:
        return [Observation(4.5, {"cpu": 1})]

    meter.create_observable_gauge("load", callbacks=[observe])
    data = reader.get_metrics_data()
    provider.shutdown()
    return data


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_the_python_sdk_metric_exporter_points_arrive(collector: Collector, compression: Compression) -> None:
    exporter = OTLPMetricExporter(endpoint=collector.metrics_url, compression=compression)
    assert exporter.export(_sdk_metrics()) == MetricExportResult.SUCCESS
    exporter.shutdown()
    wait_until(lambda: collector.stats().flusher.points_stored == 4, what="the points in the store")
    rows = query(
        collector.db,
        "SELECT metric_name, metric_type, temporality, is_monotonic, value, count, sum, bucket_counts[1:4], "
        "explicit_bounds[1:3], attributes, unit, description, service_name, scope_name, scope_version, day "
        "FROM metric_points ORDER BY metric_name",
    )
    by_name = {row[0]: row[1:] for row in rows}
    assert by_name["requests"][:4] == ("sum", "cumulative", True, 3.0)
    assert by_name["requests"][8:11] == ({"route": "/a", "ok": "true"}, "{request}", "Requests")
    assert by_name["queue.depth"][:4] == ("sum", "cumulative", False, -2.0)
    assert by_name["load"][:4] == ("gauge", None, None, 4.5) and by_name["load"][8] == {"cpu": "1"}
    latency = by_name["latency"]
    assert latency[:3] == ("histogram", "cumulative", None) and latency[4:6] == (1, 0.3)
    assert latency[6] == [0, 1, 0, 0] and latency[7] == [0.0, 5.0, 10.0]  # 0.3 lands in (0, 5]
    assert {row[12:15] for row in rows} == {("py-metrics", "test-meter", "2.0")}


def test_a_json_metrics_request_of_every_type_is_stored_with_partial_success(
    collector: Collector, client: httpx.Client
) -> None:
    point = {"startTimeUnixNano": str(T0), "timeUnixNano": str(T0 + 5)}
    body = {
        "resourceMetrics": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "json-metrics"}}]},
            "scopeMetrics": [{"scope": {"name": "js", "version": "1"}, "metrics": [
                {"name": "g", "gauge": {"dataPoints": [{**point, "asDouble": "NaN"}]}},
                {"name": "s", "sum": {"aggregationTemporality": 1, "isMonotonic": True,
                                      "dataPoints": [{**point, "asInt": "9007199254740993"}]}},
                {"name": "h", "histogram": {"aggregationTemporality": 2, "dataPoints": [
                    {**point, "count": "3", "sum": 2.5, "min": 0.5, "max": 1.5,
                     "bucketCounts": ["1", "2"], "explicitBounds": [1.0]},
                    {**point, "count": "3", "bucketCounts": ["1", "1", "1"], "explicitBounds": [1.0]},  # bad
                ]}},
                {"name": "e", "exponentialHistogram": {"aggregationTemporality": 1, "dataPoints": [
                    {**point, "count": "4", "scale": 2, "zeroCount": "1",
                     "positive": {"offset": -1, "bucketCounts": ["2", "1"]}}]}},
                {"name": "q", "summary": {"dataPoints": [
                    {**point, "count": "2", "sum": 3.0,
                     "quantileValues": [{"quantile": 0.5, "value": 1.0}, {"quantile": 1.0, "value": 2.0}]}]}},
                {"name": "", "gauge": {"dataPoints": [{**point, "asDouble": 1.0}]}},  # bad: no name
            ], "someFutureField": 1}],
        }]
    }  # fmt: skip
    response = client.post(
        collector.metrics_url, content=orjson.dumps(body), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    partial = response.json()["partialSuccess"]
    assert partial["rejectedDataPoints"] == "2"
    assert "bucketCounts" in partial["errorMessage"] and "name" in partial["errorMessage"]
    wait_until(lambda: count_points(collector.db) == 5, what="the points in the store")
    rows = {
        row[0]: row[1:]
        for row in query(
            collector.db,
            "SELECT metric_name, metric_type, temporality, value, count, sum, min, max, bucket_counts, "
            "explicit_bounds, scale, zero_count, positive_offset, positive_bucket_counts, quantiles, "
            "quantile_values, time_ns, start_time_ns, service_name, scope_version, day FROM metric_points",
        )
    }
    assert rows["g"][0] == "gauge" and rows["g"][2] != rows["g"][2]  # NaN
    assert rows["s"][:3] == ("sum", "delta", 9007199254740992.0)
    assert rows["h"][3:9] == (3, 2.5, 0.5, 1.5, [1, 2], [1.0])
    assert rows["e"][0] == "exponential_histogram" and rows["e"][9:13] == (2, 1, -1, [2, 1])
    assert rows["q"][13:15] == ([0.5, 1.0], [1.0, 2.0]) and rows["q"][4] == 3.0
    assert {r[15:] for r in rows.values()} == {(T0 + 5, T0, "json-metrics", "1", dt.date(2023, 11, 14))}


def test_a_protobuf_partial_success_is_an_export_metrics_service_response(
    collector: Collector, client: httpx.Client
) -> None:
    request = pb_metrics(2)
    request.resource_metrics[0].scope_metrics[0].metrics[0].sum.data_points[1].time_unix_nano = 2**63
    body = gzip.compress(request.SerializeToString())
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
    response = client.post(collector.metrics_url, content=body, headers=headers)
    assert response.status_code == 200 and response.headers["content-type"] == "application/x-protobuf"
    partial = ExportMetricsServiceResponse.FromString(response.content).partial_success
    assert partial.rejected_data_points == 1 and "int64" in partial.error_message
    wait_until(lambda: count_points(collector.db) == 1, what="the good point")


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/x-protobuf", b"\xff\xff\xff not protobuf"),
        ("application/json", b"{not json"),
        ("application/json", b'{"resourceMetrics": {"scopeMetrics": []}}'),
        ("application/json", b"[1, 2]"),
    ],
)
def test_an_undecodable_metrics_body_gets_400_and_stores_nothing(
    collector: Collector, client: httpx.Client, content_type: str, body: bytes
) -> None:
    response = client.post(collector.metrics_url, content=body, headers={"Content-Type": content_type})
    assert response.status_code == 400
    if content_type == "application/x-protobuf":
        assert status_pb2.Status.FromString(response.content).message
    else:
        assert response.json()["code"] == 3  # INVALID_ARGUMENT
    assert collector.stop()
    journal = collector.stats().metrics_journal
    assert journal is not None and journal.submissions == 0
    assert count_points(collector.db) == 0


def test_another_content_type_gets_415(collector: Collector, client: httpx.Client) -> None:
    response = client.post(collector.metrics_url, content=b"x", headers={"Content-Type": "text/plain"})
    assert response.status_code == 415


def test_a_retried_metrics_request_is_stored_once(collector: Collector, client: httpx.Client) -> None:
    body = pb_metrics(3).SerializeToString()
    for _ in range(2):
        response = client.post(collector.metrics_url, content=body, headers={"Content-Type": "application/x-protobuf"})
        assert response.status_code == 200 and response.content == b""
    wait_until(
        lambda: (s := collector.stats().flusher).points_stored + s.point_duplicates == 6, what="both requests flushed"
    )
    assert collector.stats().flusher.points_stored == 3
    assert count_points(collector.db) == 3


def test_acknowledged_points_wait_in_the_journal_for_a_busy_store_and_survive_a_restart(
    tmp_path: Path, client: httpx.Client
) -> None:
    db = tmp_path / "store.duckdb"
    open_store(db).close()
    config = CollectorConfig(port=0, flush_interval_s=0.2)
    with store_reader(db):
        first = Collector(db, config)
        first.start()
        try:
            response = client.post(
                first.metrics_url, content=pb_metrics(4).SerializeToString(),
                headers={"Content-Type": "application/x-protobuf"},
            )  # fmt: skip
            assert response.status_code == 200
        finally:
            drained = first.stop(drain_timeout_s=0.3)
        assert not drained  # the reader held the store: the points stayed in the journal
        assert list((tmp_path / "store.duckdb.collector" / "metrics").glob("*.jsonl"))
    with Collector(db, config) as second:
        wait_until(lambda: second.stats().flusher.points_stored == 4, what="the replayed points")
    assert count_points(db) == 4
    assert not (tmp_path / "store.duckdb.collector").exists()
