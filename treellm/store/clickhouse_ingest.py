"""``treellm ingest --clickhouse``: files the Collector cannot read, into ClickHouse.

Trajectories, SDK span dumps, OTLP files and other frameworks' traces are read by the
DuckDB ingest (one validator, the conventions, runs and trees, signatures and ordinals
with the state-change rule, the redaction of other frameworks' values) into a private store
in a temporary folder. Then, for the traces with a span new to ClickHouse:

1. the new spans go into the spans table as the Collector's exporter writes rows (treellm's
   own spans with their promoted attributes written back: the raw span, as sent);
2. a trace new to ClickHouse gets its derived rows from that store (``treellm_spans`` and the
   views' tables: :func:`treellm.store.clickhouse_derive.write_derived`, as ``treellm derive``
   writes them), and its span counts in ``treellm_traces``, so a derive worker takes it for
   derived;
3. a trace that already had spans in ClickHouse is derived from all of them there
   (:func:`treellm.store.clickhouse_derive.derive_traces`): the file held only part of it.
   Should more spans of a trace reach the spans table later, a derive worker derives it again
   from what the table holds (for other frameworks' spans: their redacted copy).

So ClickHouse reports exactly what DuckDB reports for the same files.

Hard rules: the rows are built by DuckDB (``to_json`` per span, events and links as the
exporter's Nested arrays), never span by span in Python; a span already in the table
(same trace and span id) is not written again; a failure before the first insert
writes nothing, and each insert is one batch of whole spans.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Final

import duckdb

from treellm.derive.transform import WRITTEN_BACK
from treellm.store.clickhouse import ClickHouseConnection
from treellm.store.clickhouse_derive import (
    Shard,
    derive_traces,
    events_sql,
    record_traces,
    timestamp_sql,
    trace_counts_sql,
    write_derived,
)
from treellm.store.connection import connect_quietly
from treellm.store.ingest import IngestProgress, IngestReport, InputFormatChoice, ingest
from treellm.store.scratch import scratch_folder

__all__ = ["ingest_clickhouse", "rows_sql"]

BATCH_SPANS: Final = 5000
_TRACE_CHUNK: Final = 1000


def rows_sql() -> str:
    """One JSONEachRow line per span of the DuckDB store not in ``existing(trace_id, span_id)``,
    as the exporter writes it (pure: SQL text). treellm's own spans get back the attributes
    that ingest promoted to columns (it keeps them out of ``attributes``)."""
    entries = ", ".join(
        f"struct_pack(k := '{key}', v := CAST(s.{column} AS VARCHAR))"
        if column != "shadow_caught"
        else f"struct_pack(k := '{key}', v := CASE WHEN s.{column} THEN 'true' WHEN NOT s.{column} THEN 'false' END)"
        for column, key in WRITTEN_BACK.items()
    )
    own = f"map_from_entries(list_filter([{entries}], lambda e: e.v IS NOT NULL))"
    attributes = (
        "CASE WHEN s.run_id IS NOT NULL AND s.convention IS NULL "
        f"THEN map_concat(coalesce(s.attributes, MAP {{}}::MAP(VARCHAR, VARCHAR)), {own}) "
        "ELSE coalesce(s.attributes, MAP {}::MAP(VARCHAR, VARCHAR)) END"
    )
    return f"""
WITH ev AS ({events_sql()}
),
lk AS (
    SELECT trace_id, span_id,
        list(l.linked_trace_id ORDER BY link_index) AS traces, list(l.linked_span_id ORDER BY link_index) AS spans,
        list(coalesce(l.attributes, MAP {{}}::MAP(VARCHAR, VARCHAR)) ORDER BY link_index) AS attrs
    FROM span_links l GROUP BY trace_id, span_id
)
SELECT to_json(struct_pack(
    "Timestamp" := {timestamp_sql("s.start_ns")},
    "TraceId" := s.trace_id, "SpanId" := s.span_id, "ParentSpanId" := coalesce(s.parent_span_id, ''),
    "TraceState" := '', "SpanName" := s.name,
    "SpanKind" := CASE s.kind WHEN 1 THEN 'Internal' WHEN 2 THEN 'Server' WHEN 3 THEN 'Client'
                              WHEN 4 THEN 'Producer' WHEN 5 THEN 'Consumer' ELSE 'Unspecified' END,
    "ServiceName" := s.service_name,
    "ResourceAttributes" := coalesce(s.resource_attributes, MAP {{}}::MAP(VARCHAR, VARCHAR)),
    "ScopeName" := coalesce(s.scope_name, ''), "ScopeVersion" := coalesce(s.scope_version, ''),
    "SpanAttributes" := {attributes},
    "Duration" := greatest(s.end_ns - s.start_ns, 0),
    "StatusCode" := CASE s.status_code WHEN 1 THEN 'Ok' WHEN 2 THEN 'Error' ELSE 'Unset' END,
    "StatusMessage" := coalesce(s.status_message, ''),
    "Events.Timestamp" := coalesce(ev.times, []), "Events.Name" := coalesce(ev.names, []),
    "Events.Attributes" := coalesce(ev.attrs, []),
    "Links.TraceId" := coalesce(lk.traces, []), "Links.SpanId" := coalesce(lk.spans, []),
    "Links.TraceState" := list_transform(coalesce(lk.traces, []), lambda x: ''),
    "Links.Attributes" := coalesce(lk.attrs, [])
)) AS line
FROM spans s
LEFT JOIN ev USING (trace_id, span_id)
LEFT JOIN lk USING (trace_id, span_id)
WHERE NOT EXISTS (SELECT 1 FROM existing x WHERE x.trace_id = s.trace_id AND x.span_id = s.span_id)
ORDER BY s.trace_id, s.start_ns, s.span_id
"""


def _existing(con: duckdb.DuckDBPyConnection, ch: ClickHouseConnection) -> int:
    """Fill ``existing`` with the (trace, span) ids already in the ClickHouse table for the
    store's traces; returns how many."""
    con.execute("CREATE TEMP TABLE existing (trace_id VARCHAR, span_id VARCHAR)")
    traces = [t for (t,) in con.execute("SELECT DISTINCT trace_id FROM spans ORDER BY 1").fetchall()]
    for start in range(0, len(traces), _TRACE_CHUNK):
        chunk = traces[start : start + _TRACE_CHUNK]
        found = ch.df(f"SELECT TraceId AS trace_id, SpanId AS span_id FROM {ch.table} WHERE has(?, TraceId)", [chunk])
        if len(found):
            con.register("found_frame", found)
            con.execute("INSERT INTO existing SELECT trace_id, span_id FROM found_frame")
            con.unregister("found_frame")
    count: int = con.execute("SELECT count(*) FROM existing").fetchone()[0]  # type: ignore[index]
    return count


def _counts(ch: ClickHouseConnection, traces: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Each trace's distinct spans and last span end (ns) in the spans table, now."""
    counts: dict[str, tuple[int, int]] = {}
    for start in range(0, len(traces), _TRACE_CHUNK):
        found = ch.df(trace_counts_sql(ch.table, "has(?, TraceId)"), [list(traces[start : start + _TRACE_CHUNK])])
        for trace, spans, last in zip(found["trace_id"], found["spans"], found["last_ns"], strict=True):
            counts[str(trace)] = (int(spans), int(last))
    return counts


def _batches(con: duckdb.DuckDBPyConnection) -> Iterator[list[str]]:
    cursor = con.execute(rows_sql())
    while rows := cursor.fetchmany(BATCH_SPANS):
        yield [line for (line,) in rows]


def ingest_clickhouse(
    ch: ClickHouseConnection,
    paths: Sequence[str | os.PathLike[str]],
    input_format: InputFormatChoice = "auto",
    *,
    skip_bad: bool = False,
    progress: Callable[[IngestProgress], None] | None = None,
) -> IngestReport:
    """Ingest files into ``ch``'s spans table; the report counts the spans written (a span
    already in the table is a duplicate)."""
    with scratch_folder("ch-ingest") as folder:
        db = Path(folder) / "ingest.duckdb"
        report = ingest(db, paths, input_format, skip_bad=skip_bad, progress=progress)
        con = connect_quietly(str(db))
        try:
            present = _existing(con, ch)
            runs: int = con.execute(
                "SELECT count(*) FROM runs r WHERE NOT EXISTS "
                "(SELECT 1 FROM existing x WHERE x.trace_id = r.trace_id AND x.span_id = r.span_id)"
            ).fetchone()[0]  # type: ignore[index]
            touched = con.execute(
                "SELECT DISTINCT trace_id, trace_id IN (SELECT trace_id FROM existing) AS known FROM spans s "
                "WHERE NOT EXISTS (SELECT 1 FROM existing x WHERE x.trace_id = s.trace_id AND x.span_id = s.span_id) "
                "ORDER BY 1"
            ).fetchall()
            written = 0
            for lines in _batches(con):
                ch.insert_json_rows(lines)
                written += len(lines)
            new = [trace for trace, known in touched if not known]
            if new:
                version = time.time_ns()
                _, buckets = write_derived(con, ch, new, version)
                record_traces(ch, _counts(ch, new), Shard(), version, buckets)
            known = [trace for trace, known in touched if known]
            if known:
                derive_traces(ch, _counts(ch, known), Shard())
        finally:
            con.close()
    return IngestReport(
        files=report.files,
        spans=written,
        runs=runs,
        skipped=report.skipped,
        duplicates=report.duplicates + present,
        empty_files=report.empty_files,
        bad_records=report.bad_records,
        details=report.details,
        skipped_files=report.skipped_files,
    )
