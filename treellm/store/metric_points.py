"""OTLP metric data points in the store: the ``metric_points`` table, the pure conversion, the writer.

Contract:

- ``metric_points`` (migration ``0005_metric_points``) holds one row per data point:
  the metric (name, description, unit, ``metric_type`` one of ``sum``, ``gauge``,
  ``histogram``, ``exponential_histogram``, ``summary``; ``temporality`` ``delta`` /
  ``cumulative`` and ``is_monotonic`` where the type has them), the point's times
  (``time_ns``, ``start_time_ns``), its value (``value`` DOUBLE for sums and gauges;
  ``count``, ``sum``, ``min``, ``max``, ``bucket_counts``, ``explicit_bounds`` for
  histograms; ``scale``, ``zero_count``, the positive and negative buckets for exponential
  histograms; ``quantiles`` / ``quantile_values`` for summaries), its attributes and the
  resource's as ``MAP(VARCHAR, VARCHAR)`` (values as text, as in ``spans``), ``service_name``,
  the scope, ``day`` and ``point_id``. Exemplars and metric metadata are not kept.
- ``point_id`` identifies a point: a hash of its series (resource, scope, metric name,
  type, temporality, attributes) and its times. The writer stores a point once, so a
  client's retried request or a replayed journal segment stores nothing twice.
- Pure core: :func:`metrics_request_from_protobuf` / :func:`metrics_request_from_json` turn a
  request body into an ``ExportMetricsServiceRequest`` (raising
  :class:`~treellm.errors.IngestError` for a body that is not one), :func:`points_from_request`
  turns it into :class:`MetricPoint` rows, rejecting alone a point the store cannot hold
  (no metric name, no time or a time past the int64 range, histogram buckets that do not
  match the bounds), and :func:`point_line` writes a row as one JSON line.
- Thin shell: :func:`insert_point_lines` inserts a file of such lines in one transaction
  (DuckDB reads the file itself), holding the write lock only while it does; a busy store
  raises :class:`~treellm.errors.StoreBusyError`, refused data a
  :class:`~treellm.errors.StoreError` caused by the DuckDB error.

Durability in the collector (why the journal holds rows): ``treellm collect`` answers a
metrics request 200 only once its points are fsync'd, exactly as for spans. The points
go into a second :class:`~treellm.store.journal.Journal` in ``<journal>/metrics/``
(the same segment files, group commit, bounds, torn-tail recovery and ``rejected/``
folder; the span journal and its ingester stay untouched), one :func:`point_line` per
point, converted and validated at the receiver, so a journaled line is always
insertable. The collector's one flusher thread moves both journals into the store: after
each span segment it inserts the oldest metrics segment with :func:`insert_point_lines`,
in its own short transaction, right after the span one (one flusher, so readers still get
the pause between flushes). A crash between the commit and the segment's deletion
replays the segment, which ``point_id`` makes harmless. Rows rather than OTLP/JSON
``MetricsData`` lines keep the flusher's work a single ``INSERT ... SELECT`` over
``read_json``, with no second OTLP flattener in SQL.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final, Literal

import duckdb
import orjson
from google.protobuf import json_format  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from treellm.errors import IngestError, StoreError
from treellm.otlp import any_value, json_line

__all__ = [
    "METRIC_POINTS_SQL",
    "MetricPoint",
    "MetricType",
    "PointBatch",
    "PointsReport",
    "Temporality",
    "insert_point_lines",
    "metrics_request_from_json",
    "metrics_request_from_protobuf",
    "point_line",
    "points_from_request",
]

MetricType = Literal["sum", "gauge", "histogram", "exponential_histogram", "summary"]
Temporality = Literal["delta", "cumulative"]

METRIC_POINTS_SQL: Final = """
CREATE TABLE metric_points (
    point_id VARCHAR NOT NULL,
    metric_name VARCHAR NOT NULL,
    description VARCHAR,
    unit VARCHAR,
    metric_type VARCHAR NOT NULL,
    temporality VARCHAR,
    is_monotonic BOOLEAN,
    time_ns BIGINT NOT NULL,
    start_time_ns BIGINT,
    value DOUBLE,
    count UBIGINT,
    sum DOUBLE,
    min DOUBLE,
    max DOUBLE,
    bucket_counts UBIGINT[],
    explicit_bounds DOUBLE[],
    scale INTEGER,
    zero_count UBIGINT,
    zero_threshold DOUBLE,
    positive_offset INTEGER,
    positive_bucket_counts UBIGINT[],
    negative_offset INTEGER,
    negative_bucket_counts UBIGINT[],
    quantiles DOUBLE[],
    quantile_values DOUBLE[],
    flags UINTEGER,
    attributes MAP(VARCHAR, VARCHAR),
    resource_attributes MAP(VARCHAR, VARCHAR),
    service_name VARCHAR NOT NULL,
    scope_name VARCHAR,
    scope_version VARCHAR,
    day DATE NOT NULL
);
"""

_INT64_MAX: Final = 2**63 - 1
_TEMPORALITY: Final[Mapping[int, Temporality]] = {1: "delta", 2: "cumulative"}
_DATA_FIELDS: Final[Mapping[str, MetricType]] = {
    "sum": "sum",
    "gauge": "gauge",
    "histogram": "histogram",
    "exponential_histogram": "exponential_histogram",
    "summary": "summary",
}
_MAX_OBJECT_BYTES: Final = 64 * 1024 * 1024

Attributes = Mapping[str, str | None]


@dataclass(frozen=True, slots=True)
class MetricPoint:
    """One row of ``metric_points`` (``day`` is derived from ``time_ns`` by the writer)."""

    point_id: str
    metric_name: str
    metric_type: MetricType
    time_ns: int
    service_name: str
    description: str | None = None
    unit: str | None = None
    temporality: Temporality | None = None
    is_monotonic: bool | None = None
    start_time_ns: int | None = None
    value: float | None = None
    count: int | None = None
    sum: float | None = None
    min: float | None = None
    max: float | None = None
    bucket_counts: tuple[int, ...] | None = None
    explicit_bounds: tuple[float, ...] | None = None
    scale: int | None = None
    zero_count: int | None = None
    zero_threshold: float | None = None
    positive_offset: int | None = None
    positive_bucket_counts: tuple[int, ...] | None = None
    negative_offset: int | None = None
    negative_bucket_counts: tuple[int, ...] | None = None
    quantiles: tuple[float, ...] | None = None
    quantile_values: tuple[float, ...] | None = None
    flags: int = 0
    attributes: Attributes = field(default_factory=dict)
    resource_attributes: Attributes = field(default_factory=dict)
    scope_name: str | None = None
    scope_version: str | None = None


@dataclass(frozen=True, slots=True)
class PointBatch:
    """The points of one request that the store can hold, and the rejected ones with the first reasons."""

    points: tuple[MetricPoint, ...]
    total: int
    rejected: int
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PointsReport:
    """What :func:`insert_point_lines` did: the lines read, the points stored, the duplicates skipped."""

    lines: int
    points: int
    duplicates: int


# --- request bodies -------------------------------------------------------------------------------------


def metrics_request_from_protobuf(body: bytes) -> Any:
    """A serialized ``ExportMetricsServiceRequest``; :class:`IngestError` when it is not one."""
    try:
        return ExportMetricsServiceRequest.FromString(body)
    except DecodeError as exc:
        raise IngestError(f"not a protobuf ExportMetricsServiceRequest: {exc}") from None


def metrics_request_from_json(body: bytes) -> Any:
    """An OTLP/JSON ``ExportMetricsServiceRequest`` (the protobuf JSON mapping with integer enums;
    unknown fields ignored); :class:`IngestError` when it is not one."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise IngestError(f"not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise IngestError(f"expected a JSON object (an ExportMetricsServiceRequest), got {type(doc).__name__}")
    try:
        return json_format.ParseDict(doc, ExportMetricsServiceRequest(), ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise IngestError(f"not an OTLP/JSON ExportMetricsServiceRequest: {exc}") from None


# --- request -> rows (pure) -----------------------------------------------------------------------------


class _Rejected(Exception):
    """A point the store cannot hold (internal: becomes a reason in :class:`PointBatch`)."""


def points_from_request(request: Any, *, max_reasons: int = 5) -> PointBatch:
    """The rows of an ``ExportMetricsServiceRequest`` (see the module docstring). Deterministic."""
    points: list[MetricPoint] = []
    reasons: list[str] = []
    total = rejected = 0
    for r, resource_metrics in enumerate(request.resource_metrics):
        resource = _attributes(resource_metrics.resource.attributes)
        service = resource.get("service.name") or "unknown_service"
        for s, scope_metrics in enumerate(resource_metrics.scope_metrics):
            scope = scope_metrics.scope
            for m, metric in enumerate(scope_metrics.metrics):
                where = f"resourceMetrics[{r}].scopeMetrics[{s}].metrics[{m}]"
                kind = metric.WhichOneof("data")
                if kind not in _DATA_FIELDS:
                    continue  # no data: nothing to store, nothing rejected
                data = getattr(metric, kind)
                metric_type = _DATA_FIELDS[kind]
                temporality = None if kind in ("gauge", "summary") else _TEMPORALITY.get(data.aggregation_temporality)
                base = {
                    "metric_name": metric.name,
                    "metric_type": metric_type,
                    "service_name": service,
                    "description": metric.description or None,
                    "unit": metric.unit or None,
                    "temporality": temporality,
                    "is_monotonic": bool(data.is_monotonic) if kind == "sum" else None,
                    "resource_attributes": resource,
                    "scope_name": scope.name or None,
                    "scope_version": scope.version or None,
                }
                for p, point in enumerate(data.data_points):
                    total += 1
                    try:
                        if not metric.name:
                            raise _Rejected("name: a metric needs a name")
                        points.append(_point(metric_type, point, base))
                    except _Rejected as exc:
                        rejected += 1
                        if len(reasons) < max_reasons:
                            reasons.append(f"{where}.{_json_name(kind)}.dataPoints[{p}].{exc}")
    return PointBatch(tuple(points), total, rejected, tuple(reasons))


def _json_name(kind: str) -> str:
    return "exponentialHistogram" if kind == "exponential_histogram" else kind


def _point(metric_type: MetricType, point: Any, base: Mapping[str, Any]) -> MetricPoint:
    time_ns, start_ns = int(point.time_unix_nano), int(point.start_time_unix_nano)
    if time_ns == 0:
        raise _Rejected("timeUnixNano: missing")
    if time_ns > _INT64_MAX or start_ns > _INT64_MAX:
        raise _Rejected("timeUnixNano/startTimeUnixNano: above the int64 range")
    attributes = _attributes(point.attributes)
    values: dict[str, Any] = {"flags": int(point.flags)}
    if metric_type in ("sum", "gauge"):
        which = point.WhichOneof("value")
        values["value"] = float(getattr(point, which)) if which is not None else None
    elif metric_type == "summary":
        values |= {
            "count": int(point.count),
            "sum": float(point.sum),
            "quantiles": tuple(float(q.quantile) for q in point.quantile_values),
            "quantile_values": tuple(float(q.value) for q in point.quantile_values),
        }
    else:
        values |= {
            "count": int(point.count),
            "sum": float(point.sum) if point.HasField("sum") else None,
            "min": float(point.min) if point.HasField("min") else None,
            "max": float(point.max) if point.HasField("max") else None,
        }
        if metric_type == "histogram":
            counts, bounds = tuple(point.bucket_counts), tuple(point.explicit_bounds)
            if counts and len(counts) != len(bounds) + 1:
                raise _Rejected(
                    f"bucketCounts: expected {len(bounds) + 1} counts for {len(bounds)} bounds, got {len(counts)}"
                )
            values |= {"bucket_counts": counts, "explicit_bounds": bounds}
        else:
            values |= {
                "scale": int(point.scale),
                "zero_count": int(point.zero_count),
                "zero_threshold": float(point.zero_threshold),
                "positive_offset": int(point.positive.offset),
                "positive_bucket_counts": tuple(point.positive.bucket_counts),
                "negative_offset": int(point.negative.offset),
                "negative_bucket_counts": tuple(point.negative.bucket_counts),
            }
    identity = (
        sorted(base["resource_attributes"].items()), base["scope_name"], base["scope_version"], base["metric_name"],
        metric_type, base["temporality"], sorted(attributes.items()), start_ns, time_ns,
    )  # fmt: skip
    point_id = hashlib.blake2b(orjson.dumps(identity), digest_size=16).hexdigest()
    return MetricPoint(
        point_id=point_id,
        time_ns=time_ns,
        start_time_ns=start_ns or None,
        attributes=attributes,
        **base,
        **values,
    )


def _attributes(key_values: Iterable[Any]) -> dict[str, str | None]:
    """``KeyValue`` messages as text, as the ``spans`` table keeps them (the last of a repeated key wins)."""
    return {kv.key: _text(kv.value) for kv in key_values}


def _text(value: Any) -> str | None:
    which = value.WhichOneof("value")
    if which == "string_value":
        return str(value.string_value)
    if which == "bool_value":
        return "true" if value.bool_value else "false"
    if which == "int_value":
        return str(value.int_value)
    if which == "double_value":
        encoded = any_value(float(value.double_value))["doubleValue"]
        return encoded if isinstance(encoded, str) else orjson.dumps(encoded).decode()
    if which == "bytes_value":
        return str(any_value(bytes(value.bytes_value))["bytesValue"])
    if which in ("array_value", "kvlist_value"):
        return orjson.dumps(_json_any(value)[_CAMEL[which]]).decode()
    return None


_CAMEL: Final = {"array_value": "arrayValue", "kvlist_value": "kvlistValue"}


def _json_any(value: Any) -> dict[str, Any]:
    """An ``AnyValue`` message as the store's canonical OTLP/JSON object."""
    which = value.WhichOneof("value")
    if which == "array_value":
        return {"arrayValue": {"values": [_json_any(v) for v in value.array_value.values]}}
    if which == "kvlist_value":
        return {"kvlistValue": {"values": [{"key": kv.key, "value": _json_any(kv.value)}
                                           for kv in value.kvlist_value.values]}}  # fmt: skip
    if which == "int_value":
        return {"intValue": str(value.int_value)}
    if which in ("double_value", "bytes_value", "string_value", "bool_value"):
        return any_value(getattr(value, which) if which != "bytes_value" else bytes(value.bytes_value))
    return {}


# --- rows <-> journal lines -----------------------------------------------------------------------------


def _double(value: float) -> float | str:
    """A double for JSON: non-finite values as the protobuf JSON mapping spells them (read back by a cast)."""
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _doubles(values: Sequence[float] | None) -> list[float | str] | None:
    return None if values is None else [_double(v) for v in values]


_DOUBLE_COLUMNS: Final = ("value", "sum", "min", "max", "zero_threshold")
_DOUBLE_LIST_COLUMNS: Final = ("explicit_bounds", "quantiles", "quantile_values")


def point_line(point: MetricPoint) -> bytes:
    """``point`` as one JSON line of the journal (what :func:`insert_point_lines` reads)."""
    row: dict[str, Any] = {f.name: getattr(point, f.name) for f in fields(point)}  # a missing key reads as NULL
    for name in _DOUBLE_COLUMNS:
        if row[name] is not None:
            row[name] = _double(row[name])
    for name in _DOUBLE_LIST_COLUMNS:
        row[name] = _doubles(row[name])
    return json_line({name: value for name, value in row.items() if value is not None})


# --- the writer -----------------------------------------------------------------------------------------

# How DuckDB reads a journal line: doubles as text (a cast reads "NaN" and "Infinity" back).
_READ_TYPES: Final = {
    "point_id": "VARCHAR", "metric_name": "VARCHAR", "metric_type": "VARCHAR", "time_ns": "BIGINT",
    "service_name": "VARCHAR", "description": "VARCHAR", "unit": "VARCHAR", "temporality": "VARCHAR",
    "is_monotonic": "BOOLEAN", "start_time_ns": "BIGINT", "value": "VARCHAR", "count": "UBIGINT",
    "sum": "VARCHAR", "min": "VARCHAR", "max": "VARCHAR", "bucket_counts": "UBIGINT[]",
    "explicit_bounds": "VARCHAR[]", "scale": "INTEGER", "zero_count": "UBIGINT", "zero_threshold": "VARCHAR",
    "positive_offset": "INTEGER", "positive_bucket_counts": "UBIGINT[]", "negative_offset": "INTEGER",
    "negative_bucket_counts": "UBIGINT[]", "quantiles": "VARCHAR[]", "quantile_values": "VARCHAR[]",
    "flags": "UINTEGER", "attributes": "MAP(VARCHAR, VARCHAR)", "resource_attributes": "MAP(VARCHAR, VARCHAR)",
    "scope_name": "VARCHAR", "scope_version": "VARCHAR",
}  # fmt: skip


def _select_list() -> Iterator[str]:
    for name in _READ_TYPES:
        if name in _DOUBLE_COLUMNS:
            yield f"CAST({name} AS DOUBLE) AS {name}"
        elif name in _DOUBLE_LIST_COLUMNS:
            yield f"CAST({name} AS DOUBLE[]) AS {name}"
        else:
            yield name
    yield "CAST(make_timestamp(time_ns // 1000) AS DATE) AS day"


_COLUMNS_SQL: Final = ", ".join(_READ_TYPES) + ", day"
_STAGE_SQL: Final = (
    "CREATE OR REPLACE TEMP TABLE metric_stage AS SELECT * FROM read_json(?, format = 'newline_delimited', "
    f"maximum_object_size = {_MAX_OBJECT_BYTES}, columns = {{"
    + ", ".join(f"'{name}': '{kind}'" for name, kind in _READ_TYPES.items())
    + "})"
)
_INSERT_SQL: Final = f"""
INSERT INTO metric_points ({_COLUMNS_SQL})
SELECT {", ".join(_select_list())}
FROM metric_stage s
WHERE NOT EXISTS (SELECT 1 FROM metric_points m WHERE m.point_id = s.point_id)
QUALIFY row_number() OVER (PARTITION BY point_id) = 1
"""


def insert_point_lines(db: str | os.PathLike[str], path: str | os.PathLike[str], *, retries: int = 20) -> PointsReport:
    """Insert the :func:`point_line` lines of ``path`` into the store at ``db`` in one transaction.

    Points already stored (same ``point_id``) are skipped and counted. Raises
    :class:`~treellm.errors.StoreBusyError` while another process holds the store (after
    ``retries`` waits) and :class:`~treellm.errors.StoreError` when DuckDB refuses the data.
    """
    display = str(path)
    if Path(path).stat().st_size == 0:
        return PointsReport(0, 0, 0)
    from treellm.store.connection import open_store  # here: connection imports the schema, which imports this

    con = open_store(db, retries=retries)
    try:
        con.execute("BEGIN TRANSACTION")
        con.execute(_STAGE_SQL, [display])
        row = con.execute("SELECT count(*) FROM metric_stage").fetchone()
        lines = int(row[0]) if row else 0
        inserted = con.execute(_INSERT_SQL).fetchone()
        points = int(inserted[0]) if inserted else 0
        con.execute("DROP TABLE metric_stage")
        con.execute("COMMIT")
    except duckdb.Error as exc:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise StoreError(f"{display}: the store refused the metric points: {exc}", path=display) from exc
    finally:
        con.close()  # closing also rolls back a transaction left open by anything else
    return PointsReport(lines, points, lines - points)
