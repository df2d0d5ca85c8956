"""What every framework driver shares: its command line and its OpenTelemetry pipeline.

Runs inside a framework's own virtual environment (``.venv-fw/<name>``), which has the
OpenTelemetry SDK and the OTLP/HTTP exporter but not treellm. Loopback only.

    drive.py --base-url http://127.0.0.1:PORT/v1
             (--otlp-endpoint http://127.0.0.1:PORT | --otlp-file PATH | --console-file PATH)
             [--runs 0-24] [--shape NAME] [--capture default|on]

- ``--otlp-endpoint``: OTLP/HTTP protobuf to ``<endpoint>/v1/traces`` (``treellm collect``).
- ``--otlp-file``: the OpenTelemetry Collector file exporter's protobuf framing (each
  ``TracesData`` behind a 4-byte big-endian length).
- ``--console-file``: the SDK's ``ConsoleSpanExporter`` output (pretty-printed span JSON).
- ``--shape``: which agent (graph) shape a driver builds, where it offers several (the
  LangGraph driver: a hand-written graph, a subgraph, a supervisor); ``default`` otherwise.
- ``--capture``: ``default`` runs the framework's instrumentation as it comes (some record no
  tool arguments then); ``on`` turns on the framework's own switch that records the content
  of tool calls (each driver's docstring names it). Drivers whose default records it ignore it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))

# No framework may phone home: every telemetry switch we know of, off.
for _name, _value in {
    "TRACELOOP_TELEMETRY": "false",
    "CREWAI_DISABLE_TELEMETRY": "true",
    "OTEL_SDK_DISABLED": "false",
    "ANONYMIZED_TELEMETRY": "false",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "LANGCHAIN_TRACING_V2": "false",
    "OPENAI_API_KEY": "sk-test",
}.items():
    os.environ.setdefault(_name, _value)


class ProtoFileSpanExporter(SpanExporter):
    """Appends each batch as a length-prefixed ``TracesData`` (the Collector's file exporter, proto)."""

    def __init__(self, path: str) -> None:
        self._handle = open(path, "ab")  # noqa: SIM115

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = encode_spans(spans).SerializeToString()
        self._handle.write(len(data).to_bytes(4, "big") + data)
        self._handle.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._handle.close()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    out = parser.add_mutually_exclusive_group(required=True)
    out.add_argument("--otlp-endpoint")
    out.add_argument("--otlp-file")
    out.add_argument("--console-file")
    parser.add_argument("--runs", default="0-24", help="a range a-b or a comma list")
    parser.add_argument("--shape", default="default", help="the agent's shape, where the driver offers several")
    parser.add_argument(
        "--capture", choices=("default", "on"), default="default", help="the framework's content capture switch"
    )
    args = parser.parse_args(argv)
    text = args.runs
    if "-" in text:
        first, last = (int(x) for x in text.split("-"))
        args.run_list = list(range(first, last + 1))
    else:
        args.run_list = [int(x) for x in text.split(",") if x]
    return args


def tracer_provider(args: argparse.Namespace, service: str) -> TracerProvider:
    """A provider exporting where the command line says (not installed globally)."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if args.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = args.otlp_endpoint.rstrip("/") + "/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    elif args.otlp_file:
        provider.add_span_processor(BatchSpanProcessor(ProtoFileSpanExporter(args.otlp_file)))
    else:
        handle = open(args.console_file, "a")  # noqa: SIM115
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=handle)))
    return provider
