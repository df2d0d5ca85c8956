"""Rows as the OpenTelemetry Collector's ClickHouse exporter writes them into ``otel_traces``.

A port of the exporter's row writer (opentelemetry-collector-contrib
``exporter/clickhouseexporter/exporter_traces.go`` and ``internal/util.go``
``AttributesToMap`` at commit f92a5763be13aeb59ecf6f8b47e31d54109191bb): attribute values
through pcommon ``Value.AsString`` (bools ``true``/``false``, ints in decimal, doubles in
Go's shortest form, arrays and maps as compact JSON with sorted keys), ``SpanKind`` and
``StatusCode`` as ptrace's ``String()`` names, ids as lowercase hex, ``Duration`` in ns,
events and links as Nested arrays. Used by ``tests/test_clickhouse.py`` and
``benchmarks/bench_clickhouse.py``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

KINDS = {0: "Unspecified", 1: "Internal", 2: "Server", 3: "Client", 4: "Producer", 5: "Consumer"}
STATUS = {0: "Unset", 1: "Ok", 2: "Error"}


def go_float(f: float) -> str:
    """pcommon's float64AsString: 'f' format unless abs < 1e-6 or >= 1e21."""
    if math.isinf(f) or math.isnan(f):
        return f"json: unsupported value: {f}"
    if f == int(f) and abs(f) < 1e21:
        return str(int(f))
    return repr(f) if 1e-6 <= abs(f) < 1e21 else f"{f:e}".replace("e-0", "e-")


def _raw(v: dict[str, Any]) -> Any:
    if "stringValue" in v:
        return v["stringValue"]
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "bytesValue" in v:
        return v["bytesValue"]
    if "arrayValue" in v:
        return [_raw(x) for x in v["arrayValue"].get("values", [])]
    if "kvlistValue" in v:
        return {kv["key"]: _raw(kv["value"]) for kv in v["kvlistValue"].get("values", [])}
    return None


def as_string(v: dict[str, Any]) -> str:
    """pcommon Value.AsString."""
    if "stringValue" in v:
        return str(v["stringValue"])
    if "boolValue" in v:
        return "true" if v["boolValue"] else "false"
    if "intValue" in v:
        return str(int(v["intValue"]))
    if "doubleValue" in v:
        return go_float(float(v["doubleValue"]))
    if "bytesValue" in v:
        return str(v["bytesValue"])
    if "arrayValue" in v or "kvlistValue" in v:
        return json.dumps(_raw(v), separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return ""


def _attrs(kvs: Iterable[dict[str, Any]] | None) -> dict[str, str]:
    return {kv["key"]: as_string(kv.get("value", {})) for kv in (kvs or [])}


def _ts(ns: int) -> str:
    sec, frac = divmod(int(ns), 1_000_000_000)
    return dt.datetime.fromtimestamp(sec, dt.UTC).strftime("%Y-%m-%d %H:%M:%S") + f".{frac:09d}"


def exporter_rows(traces_data: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """One ``otel_traces`` row (JSONEachRow, Nested as dotted arrays) per span of an OTLP/JSON TracesData."""
    for rs in traces_data.get("resourceSpans", []):
        res = _attrs(rs.get("resource", {}).get("attributes"))
        service = res.get("service.name", "")
        for ss in rs.get("scopeSpans", []):
            scope = ss.get("scope", {}) or {}
            for sp in ss.get("spans", []):
                start, end = int(sp["startTimeUnixNano"]), int(sp["endTimeUnixNano"])
                ev = sp.get("events", []) or []
                ln = sp.get("links", []) or []
                st = sp.get("status", {}) or {}
                yield {
                    "Timestamp": _ts(start), "TraceId": sp["traceId"].lower(), "SpanId": sp["spanId"].lower(),
                    "ParentSpanId": (sp.get("parentSpanId") or "").lower(), "TraceState": sp.get("traceState", ""),
                    "SpanName": sp["name"], "SpanKind": KINDS.get(int(sp.get("kind", 0)), "Unspecified"),
                    "ServiceName": service, "ResourceAttributes": res,
                    "ScopeName": scope.get("name", ""), "ScopeVersion": scope.get("version", ""),
                    "SpanAttributes": _attrs(sp.get("attributes")), "Duration": end - start,
                    "StatusCode": STATUS.get(int(st.get("code", 0)), "Unset"), "StatusMessage": st.get("message", ""),
                    "Events.Timestamp": [_ts(int(e["timeUnixNano"])) for e in ev],
                    "Events.Name": [e["name"] for e in ev],
                    "Events.Attributes": [_attrs(e.get("attributes")) for e in ev],
                    "Links.TraceId": [x["traceId"].lower() for x in ln],
                    "Links.SpanId": [x["spanId"].lower() for x in ln],
                    "Links.TraceState": [x.get("traceState", "") for x in ln],
                    "Links.Attributes": [_attrs(x.get("attributes")) for x in ln],
                }  # fmt: skip


def file_rows(path: str | Path) -> list[dict[str, Any]]:
    """The exporter's rows for every TracesData line of an OTLP/JSON Lines file."""
    rows: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                rows.extend(exporter_rows(json.loads(line)))
    return rows


def insert_sql(rows: list[dict[str, Any]], table: str = "otel_traces") -> str:
    """One INSERT ... FORMAT JSONEachRow statement for ``rows`` (Nested columns as dotted arrays)."""
    body = "\n".join(json.dumps(r, ensure_ascii=False) for r in rows)
    return f"INSERT INTO {table} SETTINGS input_format_import_nested_json = 1 FORMAT JSONEachRow\n{body}"


_HOLD = """
import sys
from chdb import session
held = session.Session(sys.argv[1])
held.query("SELECT 1")
print("held", flush=True)
sys.stdin.readline()
held.close()
"""


@contextlib.contextmanager
def held_chdb_folder(folder: Path) -> Iterator[int]:
    """Another process with the chDB folder open (chDB lets one at a time) until the block ends:
    its process id."""
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(folder)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder.pid
    finally:
        holder.communicate("\n", timeout=60)
