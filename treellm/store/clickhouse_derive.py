"""``treellm derive --clickhouse``: the spans the Collector wrote into ``otel_traces``, derived.

Agents send spans to the OpenTelemetry Collector, whose ClickHouse exporter writes them into
``otel_traces``: treellm's own spans and other frameworks' (GenAI, OpenInference) alike, raw.
A derive pass turns them into treellm's tables (``clickhouse_views``) with the one pipeline
that DuckDB ingest runs, so ClickHouse reports what DuckDB reports for the same spans:

1. **What is due.** Per trace of this worker's shard (``cityHash64(TraceId) % N = i``), the
   distinct spans in ``otel_traces`` against the count recorded in ``treellm_traces`` when it
   was last derived. A trace is due when the counts differ (new, or a late span arrived) and
   its last span ended at least ``wait`` ago (the quiet window, as the Collector's
   tail-sampling processor waits ``decision_wait``). The recorded counts are the watermark:
   they live in ClickHouse, so a restarted worker loses and duplicates nothing, and a span
   that arrives late, whatever its timestamp, re-derives its trace.
2. **Derive.** One scan of the spans table finds what is due; its ready traces are derived in
   passes of at most ``batch_spans`` spans of whole traces (and :data:`MAX_TRACES` traces),
   oldest first. Each pass's rows are read
   as JSONEachRow, turned into OTLP/JSON lines by DuckDB (attribute values as the exporter
   wrote them: text) and ingested into a private DuckDB store in a temporary folder: the
   validator (a bad span is skipped and counted), the conventions, runs and trees,
   signatures and ordinals with the state-change rule, the redaction of other frameworks'
   values.
3. **Write.** The derived spans go into ``treellm_spans`` and the rows of the DuckDB views
   over them into one table per view, with the pass's ``version`` (a trace derived again
   replaces its rows: ReplacingMergeTree keeps the newest, and row numbers its new derivation
   no longer uses are deleted), then the traces' counts and schema into ``treellm_traces``. A
   pass that stops half-way leaves traces whose counts were not recorded: the next pass
   derives them again, and the newer version wins.

``treellm ingest --clickhouse`` writes files' spans into ``otel_traces`` and their derived rows
with :func:`write_derived` from the same DuckDB ingest, so both roads end in the same tables.

N workers split the traces by shard and share nothing but ClickHouse. Hard rules: every value
reaches ClickHouse as a typed parameter or JSON rows, never formatted into SQL; the rows
are built by DuckDB (``to_json``), never span by span in Python.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Final

import duckdb

from treellm.derive.transform import WRITTEN_BACK
from treellm.errors import ConfigError
from treellm.store.clickhouse import ClickHouseConnection, store_columns, view_columns
from treellm.store.clickhouse_views import DERIVED_SPANS, DERIVED_TRACES, DERIVED_VIEWS, derived_schema
from treellm.store.connection import connect_quietly
from treellm.store.ingest import BadRecord, ingest
from treellm.store.judged import create_judged
from treellm.store.scratch import scratch_folder
from treellm.telemetry import semconv as sc

__all__ = [
    "COMPACT_EVERY_S", "COMPACT_SHARE", "MAX_TRACES", "DeriveHealth", "DeriveReport", "Shard", "current_schema",
    "derive_once", "derive_rows_sql", "derive_traces", "events_sql", "otlp_lines_sql", "parse_shard",
    "record_traces", "run_derive", "serve_health", "timestamp_sql", "trace_buckets", "trace_counts_sql", "underived",
    "view_rows_sql", "write_derived",
]  # fmt: skip

BATCH_SPANS: Final = 100_000
"""The most spans one pass reads (whole traces; a trace larger than this is read alone)."""
MAX_TRACES: Final = 5000
"""The most traces one pass reads: their ids travel as one array parameter (a server's HTTP
query string holds it; ClickHouse caps a URI at 1 MiB by default)."""
DEFAULT_WAIT_S: Final = 10.0
COMPACT_EVERY_S: Final = 600.0
"""How often, at most, a derive worker merges the parts of treellm's tables once nothing is due
(:meth:`~treellm.store.clickhouse.ClickHouseConnection.compact`; :func:`run_derive`)."""
COMPACT_SHARE: Final = 0.1
"""``--once`` merges at its end when it derived at least this share of every derived span: a
merge rewrites the partitions that grew (today's, mostly), so at most once per tenth of new data."""
_INSERT_ROWS: Final = 5000
_LEGACY_PREFIX: Final = "treellm.derived."  # what ingest --clickhouse wrote into otel_traces before 0.x


@dataclass(frozen=True, slots=True)
class Shard:
    """This worker's part of the traces: those with ``cityHash64(TraceId) % count = index``."""

    index: int = 0
    count: int = 1

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """``"i/N"`` as a :class:`Shard` (pure); a :class:`ConfigError` quoting the text otherwise."""
    index, sep, count = text.partition("/")
    if sep and index.isdigit() and count.isdigit() and 0 <= int(index) < int(count):
        return Shard(int(index), int(count))
    raise ConfigError(f"expected a shard as INDEX/COUNT with 0 <= INDEX < COUNT, such as 0/2, got {text!r}")


@dataclass(frozen=True, slots=True)
class DeriveReport:
    """What one pass did, and what it left for the next ones."""

    shard: str
    traces: int  # derived in this pass
    spans_read: int  # rows read from the spans table for them
    spans: int  # derived spans written into treellm_spans
    runs: int
    due: int  # traces still due after this pass (over batch_spans)
    waiting: int  # traces with new spans inside their quiet window
    lag_s: float  # how long ago the oldest span still to derive ended (0 when none)
    bad_records: tuple[BadRecord, ...] = ()

    def line(self) -> str:
        """One summary line for people."""
        rest = f", {self.due:,} due" if self.due else ""
        wait = f", {self.waiting:,} in their quiet window" if self.waiting else ""
        bad = f", {len(self.bad_records):,} bad span(s) skipped" if self.bad_records else ""
        return (
            f"shard {self.shard}: derived {self.traces:,} trace(s), {self.spans:,} span(s), {self.runs:,} run(s)"
            f"{rest}{wait}{bad}; lag {self.lag_s:.1f}s"
        )


def timestamp_sql(ns: str) -> str:
    """DuckDB text of a ClickHouse ``DateTime64(9)`` for the nanoseconds ``ns`` (UTC)."""
    return (
        f"strftime(make_timestamp({ns} // 1000), '%Y-%m-%d %H:%M:%S') || '.' "
        f"|| lpad(CAST({ns} % 1000000000 AS VARCHAR), 9, '0')"
    )


def events_sql(where: str = "") -> str:
    """Per span of the DuckDB store, its events as the arrays ClickHouse stores (times as
    ``DateTime64(9)`` text, names, attribute maps), in event order; ``where`` narrows the events
    (e.g. ``SEMI JOIN chosen USING (trace_id)``) (pure: SQL text of a SELECT)."""
    return f"""
    SELECT trace_id, span_id,
        list({timestamp_sql("coalesce(e.time_ns, 0)")} ORDER BY event_index) AS times,
        list(e.name ORDER BY event_index) AS names,
        list(coalesce(e.attributes, MAP {{}}::MAP(VARCHAR, VARCHAR)) ORDER BY event_index) AS attrs
    FROM span_events e {where} GROUP BY trace_id, span_id"""


def derive_rows_sql(columns: Sequence[str]) -> str:
    """One JSONEachRow line of ``treellm_spans`` per span of the DuckDB store whose trace is in
    the temp table ``chosen(trace_id, bucket)``: the store's columns, its events as arrays, its
    trace's bucket and the ``$version`` parameter (pure: SQL text)."""
    values = ", ".join(f'"{c}" := s."{c}"' for c in columns)
    return f"""
WITH ev AS ({events_sql("SEMI JOIN chosen USING (trace_id)")}
)
SELECT to_json(struct_pack({values},
    "event_names" := coalesce(ev.names, []), "event_times" := coalesce(ev.times, []),
    "event_attributes" := coalesce(ev.attrs, []), "bucket" := c.bucket, "version" := $version)) AS line
FROM spans s JOIN chosen c USING (trace_id)
LEFT JOIN ev USING (trace_id, span_id)
ORDER BY s.trace_id, s.start_ns, s.span_id
"""


def view_rows_sql(view: str, columns: Sequence[str]) -> str:
    """One JSONEachRow line of the table of the DuckDB view ``view`` per row of it whose trace
    is in the temp table ``chosen(trace_id, bucket)``: the view's ``columns``, the row's number
    within its trace (1 to its count, in no particular order: a derivation replaces all of
    them), its trace's bucket and the ``$version`` parameter (pure: SQL text)."""
    values = ", ".join(f'"{c}" := v."{c}"' for c in columns)
    return f"""
SELECT to_json(struct_pack({values},
    "row" := row_number() OVER (PARTITION BY v.trace_id), "bucket" := c.bucket, "version" := $version)) AS line
FROM {view} v JOIN chosen c USING (trace_id)
"""


def current_schema() -> str:
    """What this treellm derives under (:func:`~treellm.store.clickhouse_views.derived_schema`)."""
    return derived_schema(store_columns(), view_columns())


def _lines(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, object]) -> Iterator[list[str]]:
    cursor = con.execute(sql, params)
    while rows := cursor.fetchmany(_INSERT_ROWS):
        yield [line for (line,) in rows]


def write_derived(
    con: duckdb.DuckDBPyConnection, ch: ClickHouseConnection, traces: Sequence[str], version: int
) -> tuple[int, dict[str, str]]:
    """Write the DuckDB store's derived spans of ``traces`` into ``treellm_spans``, and the rows
    of its views and judgements (:func:`~treellm.store.judged.create_judged`) over them into
    their tables, with ``version``; returns how many spans, and each trace's bucket (for
    :func:`record_traces`). ``con``
    is a treellm store that ingest filled with every span of ``traces``. The rows replace the
    traces' earlier ones as they are written, in the partitions of :func:`trace_buckets`;
    :func:`record_traces` then marks them derived."""
    buckets = trace_buckets(ch, traces, version)
    con.execute(  # one statement: executemany cost 0.8-4 s a pass of 5,000 traces
        "CREATE OR REPLACE TEMP TABLE chosen AS "
        "SELECT unnest($ids::VARCHAR[]) AS trace_id, CAST(unnest($days::VARCHAR[]) AS DATE) AS bucket",
        {"ids": list(buckets), "days": list(buckets.values())},
    )
    columns = [str(name) for (name, *_) in con.execute("DESCRIBE spans").fetchall()]
    create_judged(con, "c.trace_id IN (SELECT trace_id FROM chosen)")
    written = 0
    for lines in _lines(con, derive_rows_sql(columns), {"version": version}):
        ch.insert_json_rows(lines, target=ch.derived(DERIVED_SPANS))
        written += len(lines)
    for view, table in DERIVED_VIEWS.items():
        names = [str(name) for (name, *_) in con.execute(f"DESCRIBE {view}").fetchall()]
        for lines in _lines(con, view_rows_sql(view, names), {"version": version}):
            ch.insert_json_rows(lines, target=ch.derived(table))
        _delete_beyond(con, ch, view, table, version)
    return written, buckets


def _delete_beyond(
    con: duckdb.DuckDBPyConnection, ch: ClickHouseConnection, view: str, table: str, version: int
) -> None:
    """Delete (``is_deleted`` rows of ``version``) the row numbers an earlier derivation of the
    ``chosen`` traces wrote into ``table`` beyond the rows the view has for them now: a trace
    derived again into fewer rows (a late root merged two runs) keeps none of the old ones."""
    traces = [t for (t,) in con.execute("SELECT trace_id FROM chosen").fetchall()]
    found = ch.df(
        f"SELECT trace_id, max(row) AS n FROM {ch.derived(table)} WHERE has(?, trace_id) GROUP BY trace_id", [traces]
    )
    if not len(found):
        return
    con.register("written_before", found)
    try:
        rows = con.execute(
            f"""SELECT to_json({{'trace_id': w.trace_id, 'row': k, 'version': $version, 'is_deleted': 1,
                                 'bucket': c.bucket}})
            FROM written_before w JOIN chosen c USING (trace_id)
            LEFT JOIN (SELECT trace_id, count(*) AS n FROM {view} SEMI JOIN chosen USING (trace_id) GROUP BY trace_id) v
                USING (trace_id)
            CROSS JOIN range(coalesce(v.n, 0) + 1, w.n + 1) AS r(k)""",
            {"version": version},
        ).fetchall()
    finally:
        con.unregister("written_before")
    lines = [line for (line,) in rows]
    for start in range(0, len(lines), _INSERT_ROWS):
        ch.insert_json_rows(lines[start : start + _INSERT_ROWS], target=ch.derived(table))


def trace_buckets(ch: ClickHouseConnection, traces: Sequence[str], version: int) -> dict[str, str]:
    """The partition (:data:`~treellm.store.clickhouse_views.BUCKET`) of each trace's rows: the
    one ``treellm_traces`` recorded when it was first derived, else the day (UTC) of ``version``
    (a pass's start, ns): a trace derived again replaces its rows in the partition that holds them."""
    today = datetime.fromtimestamp(version / 1e9, tz=UTC).date().isoformat()
    buckets = dict.fromkeys(traces, today)
    for start in range(0, len(traces), MAX_TRACES):
        found = ch.df(
            f"SELECT trace_id, toString(argMax(bucket, version)) AS bucket FROM {ch.derived(DERIVED_TRACES)} "
            "WHERE has(?, trace_id) GROUP BY trace_id",
            [list(traces[start : start + MAX_TRACES])],
        )
        buckets.update(zip(map(str, found["trace_id"]), map(str, found["bucket"]), strict=True))
    return buckets


def record_traces(
    ch: ClickHouseConnection,
    counts: dict[str, tuple[int, int]],
    shard: Shard,
    version: int,
    buckets: Mapping[str, str],
) -> None:
    """Record in ``treellm_traces`` that each trace was derived from ``counts[trace] = (distinct
    spans, last span end ns)`` of the spans table, in its partition: ``buckets`` as
    :func:`write_derived` wrote the rows (:func:`trace_buckets`)."""
    now, schema = time.time_ns(), current_schema()
    rows = [
        json.dumps({"trace_id": trace, "spans": spans, "last_ns": last, "derived_ns": now, "shard": str(shard),
                    "version": version, "schema": schema, "bucket": buckets[trace]})
        for trace, (spans, last) in counts.items()
    ]  # fmt: skip
    for start in range(0, len(rows), _INSERT_ROWS):
        ch.insert_json_rows(rows[start : start + _INSERT_ROWS], target=ch.derived(DERIVED_TRACES))


def _kv(column: str) -> str:
    """An exporter Map column as an OTLP/JSON attribute list of string values, minus what older
    versions of ``ingest --clickhouse`` wrote into it."""
    return (
        f"list_transform(list_filter(map_entries({column}), lambda kv: NOT starts_with(kv.key, '{_LEGACY_PREFIX}')), "
        "lambda kv: {'key': kv.key, 'value': {'stringValue': kv.value}})"
    )


_LEGACY_KEYS: Final = "MAP {" + ", ".join(f"'{_LEGACY_PREFIX}{c}': '{k}'" for c, k in WRITTEN_BACK.items()) + "}"


def _span_kv(column: str) -> str:
    """A span's attributes as :func:`_kv` gives them; except that a row of treellm's own scope
    written by an older ``ingest --clickhouse`` (marked by ``treellm.derived.source``) kept its
    promoted attributes only as ``treellm.derived.<column>``: those get their own keys back."""
    legacy = (
        f"list_transform(list_filter(map_entries({column}), lambda kv: NOT starts_with(kv.key, '{_LEGACY_PREFIX}') "
        f"OR {_LEGACY_KEYS}[kv.key] IS NOT NULL), lambda kv: {{'key': coalesce({_LEGACY_KEYS}[kv.key], kv.key), "
        "'value': {'stringValue': kv.value}})"
    )
    return (
        f"CASE WHEN scope_name = '{sc.INSTRUMENTATION_NAME}' AND {column}['{_LEGACY_PREFIX}source'] IS NOT NULL "
        f"THEN {legacy} ELSE {_kv(column)} END"
    )


_ROW_COLUMNS: Final = (
    "{'trace_id': 'VARCHAR', 'span_id': 'VARCHAR', 'parent_span_id': 'VARCHAR', 'trace_state': 'VARCHAR', "
    "'name': 'VARCHAR', 'kind': 'VARCHAR', 'start_ns': 'BIGINT', 'duration': 'BIGINT', "
    "'resource': 'MAP(VARCHAR, VARCHAR)', 'scope_name': 'VARCHAR', 'scope_version': 'VARCHAR', "
    "'attributes': 'MAP(VARCHAR, VARCHAR)', 'status': 'VARCHAR', 'status_message': 'VARCHAR', "
    "'event_times': 'BIGINT[]', 'event_names': 'VARCHAR[]', 'event_attributes': 'MAP(VARCHAR, VARCHAR)[]', "
    "'link_traces': 'VARCHAR[]', 'link_spans': 'VARCHAR[]', 'link_states': 'VARCHAR[]', "
    "'link_attributes': 'MAP(VARCHAR, VARCHAR)[]'}"
)


def otlp_lines_sql(rows_path: str, out_path: str) -> str:
    """``COPY`` the exporter's rows (JSONEachRow at ``rows_path``, as :func:`_export_sql` reads
    them) to OTLP/JSON ``TracesData`` lines at ``out_path``: one line per trace, resource and
    scope; a span written twice (an exporter's retry) once (pure: SQL text)."""
    kinds = ("Internal", "Server", "Client", "Producer", "Consumer")
    kind = (
        "CASE "
        + " ".join(f"WHEN kind IN ('{k}', 'SPAN_KIND_{k.upper()}') THEN {n}" for n, k in enumerate(kinds, 1))
        + " ELSE 0 END"
    )
    status = (
        "CASE WHEN status IN ('Error', 'STATUS_CODE_ERROR') THEN 2 WHEN status IN ('Ok', 'STATUS_CODE_OK') THEN 1 "
        "ELSE 0 END"
    )
    quoted = rows_path.replace("'", "''")
    target = out_path.replace("'", "''")
    return f"""
COPY (
    WITH rows AS (
        SELECT * FROM read_json('{quoted}', format = 'newline_delimited', columns = {_ROW_COLUMNS})
        QUALIFY row_number() OVER (PARTITION BY trace_id, span_id ORDER BY start_ns, duration) = 1
    ),
    spans AS (
        SELECT trace_id, to_json(resource) AS resource_key, resource, scope_name, scope_version, start_ns, span_id,
            {{'traceId': trace_id, 'spanId': span_id, 'parentSpanId': parent_span_id, 'traceState': trace_state,
              'name': name, 'kind': {kind}, 'startTimeUnixNano': CAST(start_ns AS VARCHAR),
              'endTimeUnixNano': CAST(start_ns + duration AS VARCHAR), 'attributes': {_span_kv("attributes")},
              'events': list_transform(range(1, len(event_names) + 1), lambda i: {{
                  'timeUnixNano': CAST(event_times[i] AS VARCHAR), 'name': event_names[i],
                  'attributes': {_kv("event_attributes[i]")}}}),
              'links': list_transform(range(1, len(link_traces) + 1), lambda i: {{
                  'traceId': link_traces[i], 'spanId': link_spans[i], 'traceState': link_states[i],
                  'attributes': {_kv("link_attributes[i]")}}}),
              'status': {{'code': {status}, 'message': status_message}}}} AS span
        FROM rows
    )
    SELECT [{{'resource': {{'attributes': {_kv("any_value(resource)")}}},
              'scopeSpans': [{{'scope': {{'name': scope_name, 'version': scope_version}},
                               'spans': list(span ORDER BY start_ns, span_id)}}]}}] AS "resourceSpans"
    FROM spans
    GROUP BY trace_id, resource_key, scope_name, scope_version
) TO '{target}' (FORMAT json)
"""


def _export_sql(table: str) -> str:
    """The exporter's rows of the traces in ``{p0}``, as :func:`otlp_lines_sql` reads them."""
    return f"""
SELECT TraceId AS trace_id, SpanId AS span_id, ParentSpanId AS parent_span_id, TraceState AS trace_state,
    toString(SpanName) AS name, toString(SpanKind) AS kind, toInt64(toUnixTimestamp64Nano(Timestamp)) AS start_ns,
    toInt64(Duration) AS duration, CAST(ResourceAttributes, 'Map(String, String)') AS resource,
    ScopeName AS scope_name, ScopeVersion AS scope_version, CAST(SpanAttributes, 'Map(String, String)') AS attributes,
    toString(StatusCode) AS status, StatusMessage AS status_message,
    arrayMap(t -> toInt64(toUnixTimestamp64Nano(t)), Events.Timestamp) AS event_times,
    arrayMap(n -> toString(n), Events.Name) AS event_names,
    arrayMap(m -> CAST(m, 'Map(String, String)'), Events.Attributes) AS event_attributes,
    Links.TraceId AS link_traces, Links.SpanId AS link_spans, Links.TraceState AS link_states,
    arrayMap(m -> CAST(m, 'Map(String, String)'), Links.Attributes) AS link_attributes
FROM {table}
WHERE has(?, TraceId)
"""


def trace_counts_sql(table: str, where: str) -> str:
    """Per trace of the spans table that ``where`` keeps: its distinct spans (an exporter's retried
    rows count once) and its last span's end, ns: what ``treellm_traces`` records (pure: SQL)."""
    return f"""
    SELECT TraceId AS trace_id, uniqExact(SpanId) AS spans,
        max(toInt64(toUnixTimestamp64Nano(Timestamp)) + toInt64(Duration)) AS last_ns
    FROM {table} WHERE {where}
    GROUP BY TraceId"""


def _due_sql(table: str, database: str) -> str:
    """Per trace of the shard (``?`` count, ``?`` index), its counts (:func:`trace_counts_sql`) and
    the count recorded when it was last derived (0 when never), when that differs or the trace
    was derived under another schema than ``?`` (an upgrade). Every trace id is taken as it is:
    a span that breaks the validator's rules (a trace id that is no hex) is refused by the ingest
    and reported as a bad record, never skipped here without a word."""
    return f"""
SELECT r.trace_id AS trace_id, r.spans AS spans, r.last_ns AS last_ns, d.done AS done
FROM ({trace_counts_sql(table, "cityHash64(TraceId) % ? = ?")}
) r
LEFT JOIN (
    SELECT trace_id, argMax(spans, version) AS done, argMax(schema, version) AS schema
    FROM {database}.{DERIVED_TRACES} GROUP BY trace_id
) d ON r.trace_id = d.trace_id
WHERE r.spans != d.done OR d.schema != ?
ORDER BY r.last_ns, r.trace_id
"""


def underived(ch: ClickHouseConnection) -> int:
    """How many traces of the spans table treellm's tables lack or hold out of date (any shard,
    any quiet window, or derived under another schema): what ``report`` warns about. When the
    table's row count (kept by ClickHouse in each part's metadata) equals the recorded spans and
    every trace was derived under this schema, nothing is due and nothing is scanned."""
    schema = current_schema()
    quick = ch.df(
        f"SELECT (SELECT count() FROM {ch.table}) AS rows, sum(s) AS recorded, countIf(d != ?) AS stale "
        f"FROM (SELECT argMax(spans, version) AS s, argMax(schema, version) AS d FROM {ch.derived(DERIVED_TRACES)} "
        "GROUP BY trace_id)",
        [schema],
    )
    if int(quick["rows"][0]) == int(quick["recorded"][0]) and int(quick["stale"][0]) == 0:
        return 0
    found = ch.df(f"SELECT count() AS n FROM ({_due_sql(ch.table, ch.database)})", [1, 0, schema])
    return int(found["n"][0])


@dataclass(frozen=True, slots=True)
class _Due:
    """One scan of what is due: the ready traces in order (trace id -> (spans, last end ns)) and
    the traces still inside their quiet window."""

    ready: dict[str, tuple[int, int]]
    waiting_last_ns: tuple[int, ...]
    now_ns: int


def _scan(ch: ClickHouseConnection, shard: Shard, wait_s: float, now_ns: int | None) -> _Due:
    now = time.time_ns() if now_ns is None else now_ns
    due = ch.df(_due_sql(ch.table, ch.database), [shard.count, shard.index, current_schema()])
    # wait 0: no quiet window at all, so a trace stamped ahead of this clock (skew) is not held
    ready_mask = due["last_ns"] <= now - int(wait_s * 1e9) if wait_s > 0 else due["last_ns"].notna()
    ready, waiting = due[ready_mask], due[~ready_mask]
    columns = zip(ready["trace_id"], ready["spans"], ready["last_ns"], strict=True)
    traces = {str(t): (int(n), int(last)) for t, n, last in columns}
    return _Due(traces, tuple(int(x) for x in waiting["last_ns"]), now)


def _chunks(ready: dict[str, tuple[int, int]], batch_spans: int) -> Iterator[dict[str, tuple[int, int]]]:
    """The ready traces in passes of at most ``batch_spans`` spans of whole traces (a larger trace
    alone) and :data:`MAX_TRACES` traces."""
    chunk: dict[str, tuple[int, int]] = {}
    total = 0
    for trace, counts in ready.items():
        if chunk and (total + counts[0] > batch_spans or len(chunk) >= MAX_TRACES):
            yield chunk
            chunk, total = {}, 0
        chunk[trace] = counts
        total += counts[0]
    if chunk:
        yield chunk


def derive_traces(
    ch: ClickHouseConnection, chosen: dict[str, tuple[int, int]], shard: Shard
) -> tuple[int, int, int, tuple[BadRecord, ...]]:
    """Derive the traces ``chosen`` (trace id -> its counts in the spans table, as recorded) from
    every span of theirs in the spans table into treellm's tables: (spans read, spans written,
    runs, bad spans)."""
    version = time.time_ns()
    with scratch_folder("derive") as folder:
        rows, otlp, db = (Path(folder) / name for name in ("rows.jsonl", "spans.jsonl", "derive.duckdb"))
        exported = ch.export_rows(_export_sql(ch.table), [list(chosen)])
        spans_read = exported.count(b"\n")
        rows.write_bytes(exported)
        del exported
        with connect_quietly() as con:
            con.execute(otlp_lines_sql(str(rows), str(otlp)))
        report = ingest(db, [otlp], "otlp-jsonl", skip_bad=True)
        with connect_quietly(str(db)) as con:
            con.execute("UPDATE spans SET source = ?", [ch.table])
            written, buckets = write_derived(con, ch, list(chosen), version)
    record_traces(ch, chosen, shard, version, buckets)
    return spans_read, written, report.runs, report.bad_records


def _passes(
    ch: ClickHouseConnection, shard: Shard, wait_s: float, batch_spans: int, now_ns: int | None, *, limit: int | None
) -> Iterator[DeriveReport]:
    """One scan, then a pass per chunk of what it found ready (at most ``limit`` passes): each
    pass's report says what is still due and waiting after it, and the lag."""
    due = _scan(ch, shard, wait_s, now_ns)
    chunks = list(_chunks(due.ready, batch_spans))
    left = len(due.ready)
    for number, chosen in enumerate(chunks or [{}]):
        if limit is not None and number >= limit:
            return
        read = written = runs = 0
        bad: tuple[BadRecord, ...] = ()
        if chosen:
            read, written, runs, bad = derive_traces(ch, chosen, shard)
        left -= len(chosen)
        rest = [last for chunk in chunks[number + 1 :] for _, last in chunk.values()]
        behind = [*rest, *due.waiting_last_ns]
        lag = max(0.0, (due.now_ns - min(behind)) / 1e9) if behind else 0.0
        yield DeriveReport(
            shard=str(shard), traces=len(chosen), spans_read=read, spans=written, runs=runs, due=left,
            waiting=len(due.waiting_last_ns), lag_s=lag, bad_records=bad,
        )  # fmt: skip


def derive_once(
    ch: ClickHouseConnection,
    *,
    shard: Shard = Shard(),
    wait_s: float = DEFAULT_WAIT_S,
    batch_spans: int = BATCH_SPANS,
    now_ns: int | None = None,
) -> DeriveReport:
    """One pass: derive the due traces of ``shard`` (at most ``batch_spans`` spans of whole traces,
    at most :data:`MAX_TRACES` traces) into treellm's tables; ``now_ns`` (default the clock)
    decides which quiet windows have passed."""
    return next(_passes(ch, shard, wait_s, batch_spans, now_ns, limit=1))


def run_derive(
    ch: ClickHouseConnection,
    *,
    shard: Shard = Shard(),
    wait_s: float = DEFAULT_WAIT_S,
    batch_spans: int = BATCH_SPANS,
    once: bool = False,
    interval_s: float = 1.0,
    report: Callable[[DeriveReport], None] | None = None,
    stop: Callable[[], bool] = lambda: False,
    sleep: Callable[[float], None] = time.sleep,
    compact_every_s: float = COMPACT_EVERY_S,
    compacted: Callable[[tuple[str, ...], str | None], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[DeriveReport]:
    """Derive until nothing is due (``once``: every due trace, then return), or forever, sleeping
    ``interval_s`` when a scan found nothing ready, until ``stop()``. Each scan of the spans table
    feeds as many passes as its ready traces need (one scan, not one per pass). ``report`` sees
    each pass; the passes are returned (``once``) or the last one (continuous).

    Once something was derived and nothing is due, treellm's tables are merged into one part
    per partition (:meth:`ClickHouseConnection.compact`), so the dashboard's reads do not merge parts
    again and again: in a continuous worker at most every ``compact_every_s`` seconds of
    ``clock``; at the end of ``once`` when its spans are at least :data:`COMPACT_SHARE` of every
    derived span (a backlog: a cron job's small runs do not rewrite a large table each time);
    never with ``compact_every_s`` 0. ``compacted`` sees the tables merged and the problem, if
    the merge failed (a user without the ``OPTIMIZE`` grant): the reads stay right, only slower,
    and the worker goes on."""
    passes: list[DeriveReport] = []
    last_compact, dirty = clock(), False

    def compact() -> None:
        nonlocal last_compact, dirty
        merged: tuple[str, ...] = ()
        problem = None
        try:
            merged = ch.compact()
        except ch.errors as exc:
            problem = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        last_compact, dirty = clock(), False
        if compacted is not None:
            compacted(merged, problem)

    while not stop():
        found = 0
        for done in _passes(ch, shard, wait_s, batch_spans, None, limit=None):
            if once and passes and not done.traces:
                break  # the scan after the last pass found nothing more: said by that pass already
            if report is not None:
                report(done)
            passes = [*passes, done] if once else [done]
            found += done.traces
            dirty = dirty or done.spans > 0
            if stop():
                break
        if once and not found:
            break
        if not found:
            if dirty and compact_every_s > 0 and clock() - last_compact >= compact_every_s:
                compact()
            sleep(interval_s)
    if once and dirty and compact_every_s > 0 and not stop():
        written = sum(p.spans for p in passes)
        derived = int(ch.df(f"SELECT count() AS n FROM {ch.derived(DERIVED_SPANS)}")["n"][0])
        if written >= COMPACT_SHARE * derived:
            compact()
    return passes


class DeriveHealth:
    """What a derive worker has done, for its ``/health`` endpoint: updated by each pass
    (:meth:`record`, the ``report`` callback of :func:`run_derive`), read by the server thread."""

    def __init__(self, shard: Shard) -> None:
        self._lock = threading.Lock()
        self._state: dict[str, object] = {
            "status": "starting", "shard": str(shard), "passes": 0, "traces": 0, "spans": 0, "runs": 0,
            "bad_records": 0, "due": 0, "waiting": 0, "lag_s": 0.0, "last_pass_ns": None,
        }  # fmt: skip

    def record(self, done: DeriveReport) -> None:
        with self._lock:
            s = self._state
            s.update(status="ok", due=done.due, waiting=done.waiting, lag_s=round(done.lag_s, 3))
            s["last_pass_ns"] = time.time_ns()
            for key, value in (("passes", 1), ("traces", done.traces), ("spans", done.spans), ("runs", done.runs),
                               ("bad_records", len(done.bad_records))):  # fmt: skip
                s[key] = int(s[key]) + value  # type: ignore[call-overload]

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            return dict(self._state)


def serve_health(health: DeriveHealth, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """Serve ``GET /health`` (the worker's totals, its lag and what is due, as JSON) on a daemon
    thread; returns the server (``server_address`` holds the bound port; ``shutdown()`` then
    ``server_close()`` stop it)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/health":
                self.send_error(404, "only /health is served here")
                return
            body = json.dumps(health.snapshot()).encode("utf-8")
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # the worker's own line per pass is its log

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="treellm-derive-health", daemon=True).start()
    return server
