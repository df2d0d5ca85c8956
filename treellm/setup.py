"""``treellm.configure()``: assemble the OpenTelemetry SDK pipeline and install it globally.

One call sets up tracing (a batch span processor per exporter) and metrics,
installs both as the global providers (so a plain ``TreeExecutor(...)`` is
traced) and returns the tracer provider. It honours the standard ``OTEL_*``
environment variables: ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``
for the resource, ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``)
to send the same spans to any OTLP backend (Jaeger, Tempo, Phoenix, a
Collector) with no code change, and ``OTEL_TRACES_EXPORTER`` /
``OTEL_METRICS_EXPORTER``: a comma-separated list of ``otlp``, ``console`` (the
SDK's console exporters, to stdout), or ``none`` (no exporter from the
environment for that signal). Unset, a signal exports OTLP when an endpoint
variable *for that signal* is set: spans with ``..._ENDPOINT`` or
``..._TRACES_ENDPOINT``, metrics with ``..._ENDPOINT`` or ``..._METRICS_ENDPOINT``
(never with the traces endpoint alone: metrics go only where metrics are
configured, and nothing about metrics is sent or logged otherwise). The arguments
win over the environment: ``otlp=`` (both signals; ``otlp=True`` leaves metrics
off when the environment names an endpoint for spans only) and ``console=``
(spans); ``jsonl=`` and ``duckdb=`` are never turned off by it.
Any other value is a :class:`~treellm.errors.ConfigError`
naming the variable, raised before anything is installed; so is an OTLP endpoint
(``otlp=`` or the endpoint variables the chosen exporters read) that is not an
``http(s)://`` URL with a host, a numeric port and a user and password that
percent-encode ``/``, ``?`` and ``#``. An endpoint reaches a log line or an error only
through :func:`treellm.urls.display_url` (its password masked).

Each OTLP exporter gives up an export (its retries included) after
:data:`EXPORT_TIMEOUT_S` seconds, unless ``OTEL_EXPORTER_OTLP_TIMEOUT`` or the
signal's ``..._TIMEOUT`` variable says otherwise: shutting down with the endpoint
down ends in about that time, not after the SDK's ten seconds of backoff.

Exporter failures are logged and counted by the exporters and the SDK's
processors; they are never raised into the agent. The OpenTelemetry API lets a
process install its global providers once: a second ``configure()`` logs a
warning, keeps the first global providers, and returns its own provider, which
can still be passed explicitly (``TreeExecutor(..., tracer_provider=...)``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

from treellm.errors import ConfigError
from treellm.exporters.jsonl import OTLPJsonlSpanExporter
from treellm.telemetry.redaction import Capture, CaptureMode, resolve_capture, set_default_capture
from treellm.urls import display_url, url_problem

__all__ = ["DEFAULT_SERVICE_NAME", "configure"]

logger = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "treellm"
_OTLP_ENDPOINT_VARS: Final = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_METRICS_ENDPOINT_VARS: Final = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
_TIMEOUT_VARS: Final = {
    "traces": ("OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"),
    "metrics": ("OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT"),
}
EXPORT_TIMEOUT_S: Final = 1.0
"""Seconds an OTLP exporter spends on one export, retries included, when no ``OTEL_*_TIMEOUT`` says."""
TRACES_EXPORTER_ENV: Final = "OTEL_TRACES_EXPORTER"
METRICS_EXPORTER_ENV: Final = "OTEL_METRICS_EXPORTER"

ExporterName = Literal["otlp", "console"]
_NAMES: Final[Mapping[str, ExporterName | None]] = {"otlp": "otlp", "console": "console", "none": None}


@dataclass(frozen=True, slots=True)
class ExporterPlan:
    """Which exporters each signal gets besides ``jsonl=`` / ``duckdb=`` (spans only)."""

    traces: frozenset[ExporterName]
    metrics: frozenset[ExporterName]


def exporters_from_env(variable: str, environ: Mapping[str, str]) -> frozenset[ExporterName] | None:
    """The exporters ``$variable`` names (``none``: the empty set); None when unset or empty."""
    raw = environ.get(variable, "")
    names = [name.strip().lower() for name in raw.split(",") if name.strip()]
    if not names:
        return None
    for name in names:
        if name not in _NAMES:
            raise ConfigError(
                f"{variable}: expected a comma-separated list of otlp, console or none, got {raw!r} "
                f"({name!r} is not an exporter treellm knows)",
                setting=variable,
            )
    if "none" in names and len(set(names)) > 1:
        raise ConfigError(f"{variable}: expected none alone or a list of exporters, got {raw!r}", setting=variable)
    return frozenset(exporter for name in names if (exporter := _NAMES[name]) is not None)


def _default(endpoint_vars: tuple[str, ...], environ: Mapping[str, str]) -> frozenset[ExporterName]:
    return frozenset({"otlp"}) if any(environ.get(name) for name in endpoint_vars) else frozenset()


def _overridden(exporters: frozenset[ExporterName], name: ExporterName, wanted: bool | None) -> frozenset[ExporterName]:
    if wanted is None:
        return exporters
    return exporters | {name} if wanted else exporters - {name}


def exporter_plan(otlp: bool | str | None, console: bool | None, environ: Mapping[str, str]) -> ExporterPlan:
    """The exporters of each signal: the arguments (when given) over the environment (pure)."""
    traces = exporters_from_env(TRACES_EXPORTER_ENV, environ)
    metrics = exporters_from_env(METRICS_EXPORTER_ENV, environ)
    if traces is None:
        traces = _default(_OTLP_ENDPOINT_VARS, environ)
    if metrics is None:
        metrics = _default(_METRICS_ENDPOINT_VARS, environ)
    wants_otlp = None if otlp is None else bool(otlp)
    metrics_otlp = wants_otlp
    if otlp is True and _spans_only_endpoint(environ):
        metrics_otlp = None  # metrics would go to the SDK's default endpoint: left to OTEL_METRICS_EXPORTER
    return ExporterPlan(
        traces=_overridden(_overridden(traces, "otlp", wants_otlp), "console", console),
        metrics=_overridden(metrics, "otlp", metrics_otlp),
    )


def _spans_only_endpoint(environ: Mapping[str, str]) -> bool:
    """Whether the environment names an OTLP endpoint for spans and none for metrics."""
    spans = any(environ.get(name) for name in _OTLP_ENDPOINT_VARS)
    return spans and not any(environ.get(name) for name in _METRICS_ENDPOINT_VARS)


def export_timeout(signal: Literal["traces", "metrics"], environ: Mapping[str, str]) -> float | None:
    """The ``timeout=`` to give the signal's OTLP exporter (pure): None when an ``OTEL_*_TIMEOUT``
    variable is set (the SDK reads it), else :data:`EXPORT_TIMEOUT_S`."""
    return None if any(environ.get(name) for name in _TIMEOUT_VARS[signal]) else EXPORT_TIMEOUT_S


def _env_endpoint(variables: tuple[str, ...]) -> str:
    """The endpoint the SDK takes from the environment (the most specific variable set), for a log line."""
    return next((os.environ[name] for name in reversed(variables) if os.environ.get(name)), "the SDK's default")


def _endpoint_variables(plan: ExporterPlan) -> list[str]:
    """The ``OTEL_*`` endpoint variables the SDK's OTLP exporters of ``plan`` read."""
    wanted: list[str] = []
    if "otlp" in plan.traces:
        wanted += _OTLP_ENDPOINT_VARS
    if "otlp" in plan.metrics:
        wanted += [name for name in _METRICS_ENDPOINT_VARS if name not in wanted]
    return wanted


def check_endpoints(otlp: bool | str | None, plan: ExporterPlan, environ: Mapping[str, str]) -> None:
    """Refuse an OTLP endpoint that the exporters would misread (``otlp=`` when it is a URL, else
    the endpoint variables they read), with a :class:`ConfigError` naming it and showing the URL
    masked (pure). Unchecked, a malformed endpoint fails at each export, and the SDK's log line
    quotes the password (``http://u:PW#x@host``: ``'u:PW' is not a valid host``)."""
    if isinstance(otlp, str) and otlp:
        given = [("otlp", otlp)]
    else:
        given = [(name, environ[name]) for name in _endpoint_variables(plan) if environ.get(name)]
    for setting, url in given:
        problem = url_problem(url)
        if problem is not None:
            raise ConfigError(f"{setting}: {problem}, got {display_url(url)!r}", setting=setting)


def _resource(service_name: str | None) -> Resource:
    if service_name is not None:
        return Resource.create({SERVICE_NAME: service_name})
    if os.environ.get("OTEL_SERVICE_NAME"):
        return Resource.create()
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


def configure(
    service_name: str | None = None,
    *,
    jsonl: str | os.PathLike[str] | None = None,
    duckdb: str | os.PathLike[str] | None = None,
    otlp: bool | str | None = None,
    console: bool | None = None,
    capture: Capture | CaptureMode | None = None,
) -> TracerProvider:
    """Build the SDK pipeline, install it as the global provider and return it.

    ``jsonl``: append OTLP/JSON lines to this file (what ``treellm ingest``
    reads). ``duckdb``: write into this treellm store (through an fsync'd journal,
    holding the write lock only per batch). ``otlp``: ``True`` or an endpoint URL sends
    spans and metrics over OTLP/HTTP (protobuf), ``False`` does not (``True`` with only
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set leaves metrics to ``OTEL_METRICS_EXPORTER``);
    ``None`` leaves it to ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER``, else sends each
    signal when an endpoint variable for it is set. ``console``: ``True`` prints spans, ``False``
    does not, ``None`` leaves it to ``OTEL_TRACES_EXPORTER``. ``capture``: ``"redacted"``
    (default), ``"full"`` or ``"none"``; when not given, ``TREELLM_CAPTURE`` decides.
    Raises :class:`~treellm.errors.ConfigError` for an exporter variable or an OTLP endpoint it cannot honour.
    """
    plan = exporter_plan(otlp, console, os.environ)  # first: a bad variable installs nothing
    check_endpoints(otlp, plan, os.environ)
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
    endpoint = otlp if isinstance(otlp, str) else None
    if "otlp" in plan.traces:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        traces_endpoint = f"{endpoint.rstrip('/')}/v1/traces" if endpoint else None
        logger.debug("spans go over OTLP to %s", display_url(traces_endpoint or _env_endpoint(_OTLP_ENDPOINT_VARS)))
        span_exporter = OTLPSpanExporter(endpoint=traces_endpoint, timeout=export_timeout("traces", os.environ))
        provider.add_span_processor(BatchSpanProcessor(span_exporter))
    if "console" in plan.traces:
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    if "otlp" in plan.metrics:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        metrics_endpoint = f"{endpoint.rstrip('/')}/v1/metrics" if endpoint else None
        logger.debug(
            "metrics go over OTLP to %s", display_url(metrics_endpoint or _env_endpoint(_METRICS_ENDPOINT_VARS))
        )
        metric_exporter = OTLPMetricExporter(endpoint=metrics_endpoint, timeout=export_timeout("metrics", os.environ))
        readers.append(PeriodicExportingMetricReader(metric_exporter))
    if "console" in plan.metrics:
        readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
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
