"""configure() sends metrics only where metrics are configured, and shuts down with the endpoint down.

Checked on requests, not clocks: a loopback OTLP/HTTP server records the path of every request a
one-call run's process makes, from its first span to the exit of its interpreter (the meter
provider exports once more at exit).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from treellm.setup import EXPORT_TIMEOUT_S, ExporterPlan, export_timeout, exporter_plan

# One model turn asking for one tool call, then the answer: a one-call run, traced by configure().
SCRIPT = textwrap.dedent(
    """
    import treellm
    from treellm import ModelTurn, ScriptedModel, Tool, ToolCall, TreeExecutor

    provider = treellm.configure(service_name="one-call")
    exporters = [p.span_exporter for p in provider._active_span_processor._span_processors]
    print("timeouts", *[e._client._timeout for e in exporters if hasattr(e, "_client")], flush=True)
    model = ScriptedModel([ModelTurn(tool_calls=[ToolCall("lookup", {"id": 7})]), ModelTurn(text="done")])
    result = TreeExecutor(model, [Tool("lookup", "l", handler=lambda a: "row 7")], name="one").run("t")
    provider.shutdown()
    print("outcome", result.outcome, flush=True)
    """
)


class _Recorder(BaseHTTPRequestHandler):
    paths: list[str]

    def do_POST(self) -> None:  # http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # the base class's name
        return


@contextmanager
def otlp_server() -> Iterator[tuple[str, list[str]]]:
    """A loopback OTLP/HTTP endpoint answering 200 to every POST; yields its base URL and the paths posted."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.paths = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.paths  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def run_one_call(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TREELLM_"))}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                          env={**clean, **env}, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "outcome completed" in done.stdout, done.stdout
    return done


def test_only_the_traces_endpoint_sends_spans_and_no_metrics() -> None:
    with otlp_server() as (url, paths):
        done = run_one_call({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{url}/v1/traces"})
    assert "/v1/traces" in paths  # the run reached the server...
    assert "/v1/metrics" not in paths, paths  # ...and metrics did not, even at the interpreter's exit
    assert "metrics" not in done.stderr.lower(), done.stderr


def test_the_common_endpoint_sends_spans_and_metrics() -> None:
    """The server sees metrics when they are configured (so the test above can see them too)."""
    with otlp_server() as (url, paths):
        run_one_call({"OTEL_EXPORTER_OTLP_ENDPOINT": url})
    assert {"/v1/traces", "/v1/metrics"} <= set(paths), paths


def test_a_metrics_endpoint_alone_sends_metrics_and_no_spans() -> None:
    with otlp_server() as (url, paths):
        run_one_call({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"{url}/v1/metrics"})
    assert "/v1/metrics" in paths and "/v1/traces" not in paths, paths


def test_a_down_endpoint_gets_the_bounded_timeout_and_shutdown_returns() -> None:
    """Nothing listens on the port: the exporter was built with treellm's timeout (not the SDK's
    10 s of retries), and the process shuts its providers down and exits by itself."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = run_one_call({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{port}/v1/traces"})
    assert f"timeouts {EXPORT_TIMEOUT_S}" in done.stdout, done.stdout
    assert "metrics" not in done.stderr.lower(), done.stderr


@pytest.mark.parametrize(
    ("env", "traces", "metrics"),
    [
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://h:4318/v1/traces"}, {"otlp"}, set()),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4318"}, {"otlp"}, {"otlp"}),
        ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://h:4318/v1/metrics"}, set(), {"otlp"}),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://h:4318/v1/traces", "OTEL_METRICS_EXPORTER": "otlp"},
         {"otlp"}, {"otlp"}),
    ],
)  # fmt: skip
def test_metrics_are_planned_only_where_an_endpoint_or_exporter_names_them(
    env: dict[str, str], traces: set[str], metrics: set[str]
) -> None:
    assert exporter_plan(None, None, env) == ExporterPlan(frozenset(traces), frozenset(metrics))  # type: ignore[arg-type]


def test_otlp_true_with_a_traces_endpoint_alone_leaves_metrics_to_their_variable() -> None:
    spans_only = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://h:4318/v1/traces"}
    assert exporter_plan(True, None, spans_only).metrics == frozenset()
    assert exporter_plan(True, None, {**spans_only, "OTEL_METRICS_EXPORTER": "otlp"}).metrics == {"otlp"}
    assert exporter_plan(True, None, {}).metrics == {"otlp"}  # nothing named: both to the SDK's default


def test_the_export_timeout_is_treellms_unless_an_otel_timeout_variable_is_set() -> None:
    assert export_timeout("traces", {}) == EXPORT_TIMEOUT_S == 1.0
    assert export_timeout("metrics", {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "5"}) == EXPORT_TIMEOUT_S
    assert export_timeout("traces", {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "5"}) is None  # the SDK reads it
    assert export_timeout("metrics", {"OTEL_EXPORTER_OTLP_TIMEOUT": "5"}) is None
