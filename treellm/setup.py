"""``treellm.configure()``: assemble the OpenTelemetry SDK pipeline and install it globally.

One call sets up tracing (a batch span processor per exporter) and metrics,
installs both as the global providers (so a plain ``TreeExecutor(...)`` is
traced) and returns the tracer provider. It honours the standard ``OTEL_*``
environment variables: ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``
for the resource, and ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``)
to send the same spans to any OTLP backend (Jaeger, Tempo, Phoenix, a
Collector) with no code change.

Exporter failures are logged and counted by the exporters and the SDK's
processors; they are never raised into the agent. The OpenTelemetry API lets a
process install its global providers once: a second ``configure()`` logs a
warning, keeps the first global providers, and returns its own provider, which
can still be passed explicitly (``TreeExecutor(..., tracer_provider=...)``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

from treellm.exporters.jsonl import OTLPJsonlSpanExporter
from treellm.telemetry.redaction import Capture, CaptureMode, resolve_capture, set_default_capture

__all__ = ["DEFAULT_SERVICE_NAME", "configure"]

logger = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "treellm"
_OTLP_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def _resource(service_name: str | None) -> Resource:
    if service_name is not None:
        return Resource.create({SERVICE_NAME: service_name})
    if os.environ.get("OTEL_SERVICE_NAME"):
        return Resource.create()
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


def _wants_otlp(otlp: bool | str | None) -> bool:
    if otlp is None:
        return any(os.environ.get(name) for name in _OTLP_ENDPOINT_VARS)
    return bool(otlp)


def configure(
    service_name: str | None = None,
    *,
    jsonl: str | os.PathLike[str] | None = None,
    duckdb: str | os.PathLike[str] | None = None,
    otlp: bool | str | None = None,
    console: bool = False,
    capture: Capture | CaptureMode | None = None,
) -> TracerProvider:
    """Build the SDK pipeline, install it as the global provider and return it.

    ``jsonl``: append OTLP/JSON lines to this file (what ``treellm ingest``
    reads). ``duckdb``: write into this treellm store (through an fsync'd journal,
    holding the write lock only per batch). ``otlp``: ``True`` or an endpoint URL sends OTLP/HTTP (protobuf);
    ``None`` sends it when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set. ``console``
    prints spans. ``capture``: ``"redacted"`` (default), ``"full"`` or
    ``"none"``; when not given, ``TREELLM_CAPTURE`` decides.
    """
    set_default_capture(resolve_capture(capture) if capture is not None else None)
    resolve_capture()  # validate TREELLM_CAPTURE now, not at the first span
    resource = _resource(service_name)
    provider = TracerProvider(resource=resource)
    readers: list[MetricReader] = []
    if jsonl is not None:
        Path(jsonl).parent.mkdir(parents=True, exist_ok=True)
        provider.add_span_processor(BatchSpanProcessor(OTLPJsonlSpanExporter(jsonl)))
    if duckdb is not None:
        from treellm.store.exporter import DuckDBSpanExporter

        provider.add_span_processor(BatchSpanProcessor(DuckDBSpanExporter(duckdb)))
    if _wants_otlp(otlp):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = otlp if isinstance(otlp, str) else None
        traces_endpoint = f"{endpoint.rstrip('/')}/v1/traces" if endpoint else None
        metrics_endpoint = f"{endpoint.rstrip('/')}/v1/metrics" if endpoint else None
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_endpoint)))
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=metrics_endpoint)))
    if console:
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(meter_provider)
    else:
        logger.warning(
            "a global tracer provider is already installed; it is kept. Pass the provider that "
            "configure() returned as tracer_provider= to use this pipeline."
        )
    return provider
