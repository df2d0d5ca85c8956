"""Ingest trace files into the store: one transaction per file, idempotent, never half-written.

Contract:

- Every format becomes OTLP/JSON ``TracesData`` lines; DuckDB flattens them in SQL
  (:mod:`treellm.store.transform`). OTLP JSON lines are read in place; the other
  formats (:mod:`treellm.store.formats`) are converted to a temporary JSONL file first.
- Each file is one transaction: a bad file leaves nothing behind and raises
  :class:`~treellm.errors.IngestError` naming the file, the line (or record) and the
  reason; with ``skip_bad=True`` the good records are kept and each bad one reported.
- Re-ingesting adds nothing: (trace_id, span_id) stays unique (an anti-join against
  the stored keys; duplicates are counted).
- A torn final line (no newline after it, as a crashed writer leaves) is skipped and
  counted in ``skipped``; an empty file ingests nothing and is reported.
- The writer holds the store's write lock only while it writes one file.
- Memory stays bounded: DuckDB streams the file under a memory limit and spills.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import duckdb
import orjson
import pandas as pd

from treellm.engine import repeats
from treellm.engine.tools import result_hash
from treellm.errors import IngestError, StoreError
from treellm.exporters.jsonl import end_of_last_line
from treellm.otlp import json_line
from treellm.signature import RawArguments, canonical_json, parse_arguments, signature
from treellm.store.connection import open_store
from treellm.store.formats import InputFormat, detect_format, iter_records
from treellm.store.schema import SPAN_COLUMNS
from treellm.store.transform import MACROS, READ_COLUMNS, VALIDATE_SQL, stage_sql
from treellm.store.trees import SpanFacts, place_traces
from treellm.telemetry import conventions

__all__ = ["BadRecord", "FileReport", "IngestReport", "InputFormatChoice", "ingest", "ingest_file"]

InputFormatChoice = Literal["auto", InputFormat]  # the names of treellm.store.formats.FORMATS
MAX_LINE_BYTES = 64 * 1024 * 1024
MEMORY_LIMIT = os.environ.get("TREELLM_INGEST_MEMORY_LIMIT", "1GB")
_HEX = frozenset("0123456789abcdefABCDEF")
DEFAULT_INTERNAL = frozenset(conventions.DEFAULT_INTERNAL_TOOLS)
ENV_INTERNAL_TOOLS = "TREELLM_INTERNAL_TOOLS"
_DEFAULT_RULE = repeats.ToolRule()
"""Other frameworks' calls are judged by the default rule: the shell classifier for shell
tools, the default failure patterns on results (``docs/architecture.md``)."""


@dataclass(frozen=True, slots=True)
class BadRecord:
    path: str
    line: int | None
    record: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class FileReport:
    path: str
    input_format: str
    spans: int
    runs: int
    duplicates: int
    skipped: int
    empty: bool = False
    bad: tuple[BadRecord, ...] = ()


@dataclass(frozen=True, slots=True)
class IngestReport:
    """What an ingest did, file by file and in total."""

    files: int
    spans: int
    runs: int
    skipped: int
    duplicates: int
    empty_files: tuple[str, ...] = ()
    bad_records: tuple[BadRecord, ...] = ()
    details: tuple[FileReport, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "spans": self.spans,
            "runs": self.runs,
            "skipped": self.skipped,
            "duplicates": self.duplicates,
            "empty_files": list(self.empty_files),
            "bad_records": [
                {"path": b.path, "line": b.line, "record": b.record, "reason": b.reason} for b in self.bad_records
            ],
        }


# -- validating lines (only when DuckDB refused a file, or for --skip-bad) ----------------------


def _hex(value: object, size: int) -> bool:
    return isinstance(value, str) and len(value) == size and set(value) <= _HEX and value.strip("0") != ""


def _int_text(value: object) -> bool:
    return (isinstance(value, str) and value.isdigit()) or (isinstance(value, int) and not isinstance(value, bool))


def _too_long(length: int) -> str:
    return f"the line is {length / 1e6:.0f} MB, above the {MAX_LINE_BYTES // 2**20} MiB limit of one line"


def line_problem(line: bytes) -> str | None:
    """Why one OTLP/JSON line cannot be ingested, or None when it can."""
    if len(line) > MAX_LINE_BYTES:
        return _too_long(len(line))
    try:
        doc = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return f"not valid JSON ({exc})"
    if not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans"), list):
        return "not an OTLP/JSON TracesData object: no resourceSpans list"
    for r, rs in enumerate(doc["resourceSpans"]):
        if not isinstance(rs, dict) or not isinstance(rs.get("scopeSpans", []), list):
            return f"resourceSpans[{r}] is not an object with a scopeSpans list"
        for s, ss in enumerate(rs.get("scopeSpans", [])):
            spans = ss.get("spans", []) if isinstance(ss, dict) else None
            if not isinstance(spans, list):
                return f"resourceSpans[{r}].scopeSpans[{s}].spans is not a list"
            for i, span in enumerate(spans):
                where = f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}]"
                problem = _span_problem(span)
                if problem:
                    return f"{where}: {problem}"
    return None


def _span_problem(span: object) -> str | None:
    if not isinstance(span, dict):
        return "not an object"
    if not _hex(span.get("traceId"), 32):
        return f"traceId: expected 32 hex digits (not all zero), got {span.get('traceId')!r}"
    if not _hex(span.get("spanId"), 16):
        return f"spanId: expected 16 hex digits (not all zero), got {span.get('spanId')!r}"
    parent = span.get("parentSpanId")
    if parent not in (None, "") and not _hex(parent, 16):
        return f"parentSpanId: expected 16 hex digits, got {parent!r}"
    if not isinstance(span.get("name"), str):
        return f"name: expected text, got {span.get('name')!r}"
    for key in ("startTimeUnixNano", "endTimeUnixNano"):
        if not _int_text(span.get(key)):
            return f"{key}: expected an integer (as text), got {span.get(key)!r}"
    kind = span.get("kind", 0)
    if not isinstance(kind, int) or isinstance(kind, bool) or not 0 <= kind <= 5:
        return f"kind: expected an integer from 0 to 5, got {kind!r}"
    status = span.get("status", {})
    code = status.get("code", 0) if isinstance(status, dict) else None
    if not isinstance(code, int) or isinstance(code, bool) or not 0 <= code <= 2:
        return f"status.code: expected an integer from 0 to 2, got {code!r}"
    for key in ("events", "links"):
        if not isinstance(span.get(key, []), list):
            return f"{key}: expected a list, got {span.get(key)!r}"
    attributes = span.get("attributes", [])
    if not isinstance(attributes, list) or any(
        not isinstance(a, dict) or not isinstance(a.get("key"), str) or not isinstance(a.get("value", {}), dict)
        for a in attributes
    ):
        return "attributes: expected a list of {key, value} objects"
    return None


def _lines(path: Path) -> Iterator[tuple[int, bytes, bool]]:
    """(1-based line number, line without newline, complete) of a file, streamed."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            yield number, raw.rstrip(b"\r\n"), raw.endswith(b"\n")


def _first_problem(path: Path, display: str) -> IngestError:
    for number, line, complete in _lines(path):
        if not complete or not line.strip():
            continue
        problem = line_problem(line)
        if problem:
            return IngestError(problem, path=display, line=number)
    return IngestError("DuckDB could not read the file although every line validates", path=display)


# -- the transaction of one file ---------------------------------------------------------------


def _sql_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _read_expression(path: Path) -> str:
    return (
        f"read_json({_sql_literal(str(path))}, format = 'newline_delimited', records = true, "
        f"columns = {READ_COLUMNS}, maximum_object_size = {MAX_LINE_BYTES + 1024})"
    )


def _insert_staged(con: duckdb.DuckDBPyConnection) -> tuple[int, int]:
    """Insert the new spans (and their events and links) of ``stage``; returns (new, duplicates).

    The view ``fresh`` holds the new rows: the stage without the keys already stored,
    and without repeats inside the file (materialised only when the file has any).
    """
    con.execute(
        "CREATE OR REPLACE TEMP TABLE stored_keys AS "
        "SELECT trace_id, span_id FROM stage SEMI JOIN spans USING (trace_id, span_id)"
    )
    repeated = _count(con, "SELECT count(*) FROM (SELECT 1 FROM stage GROUP BY trace_id, span_id HAVING count(*) > 1)")
    fresh = "SELECT s.* FROM stage s ANTI JOIN stored_keys k USING (trace_id, span_id)"
    if repeated:
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE fresh_rows AS {fresh} "
            "QUALIFY row_number() OVER (PARTITION BY s.trace_id, s.span_id ORDER BY s.start_ns) = 1"
        )
        fresh = "SELECT * FROM fresh_rows"
    con.execute(f"CREATE OR REPLACE TEMP VIEW fresh AS {fresh}")
    staged = _count(con, "SELECT count(*) FROM stage")
    new = _count(con, "SELECT count(*) FROM fresh")
    columns = ", ".join(SPAN_COLUMNS)
    con.execute(f"INSERT INTO spans ({columns}) SELECT {columns} FROM fresh")
    con.execute(
        """
        INSERT INTO span_events
        SELECT trace_id, span_id, idx - 1, e.name, TRY_CAST(e.timeUnixNano AS BIGINT), service_name, day,
               treellm_attrs(e.attributes)
        FROM (SELECT trace_id, span_id, service_name, day, unnest(events) AS e,
                     generate_subscripts(events, 1) AS idx
              FROM fresh WHERE len(events) > 0)
        """
    )
    con.execute(
        """
        INSERT INTO span_links
        SELECT trace_id, span_id, idx - 1, lower(l.traceId), lower(l.spanId), service_name, day,
               treellm_attrs(l.attributes)
        FROM (SELECT trace_id, span_id, service_name, day, unnest(links) AS l,
                     generate_subscripts(links, 1) AS idx
              FROM fresh WHERE len(links) > 0)
        """
    )
    return new, staged - new


def _count(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    row = con.execute(sql).fetchone()
    return int(row[0]) if row else 0


def _arguments_value(text: str) -> Any:
    """Arguments as other frameworks record them: JSON text, else a Python literal, else raw."""
    value = parse_arguments(text)
    if isinstance(value, RawArguments):
        try:
            literal = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return value
        if isinstance(literal, dict | list):
            return literal
    return value


_FOREIGN_OPERATIONS = {"tool": "execute_tool", "llm": "chat", "agent": "invoke_agent"}


def _read_foreign(con: duckdb.DuckDBPyConnection, internal_tools: frozenset[str]) -> list[str]:
    """Read the new spans of other frameworks through their conventions; returns their traces."""
    rows = con.execute(
        "SELECT f.trace_id, f.span_id, f.name, f.status_code, map_keys(f.attributes), map_values(f.attributes), "
        "       (SELECT list(e.name) FROM span_events e WHERE e.trace_id = f.trace_id AND e.span_id = f.span_id "
        "        AND NOT (e.name = 'loop:detected' AND coalesce(e.attributes['treellm.loop.shadow'], '') = 'true')) "
        "FROM fresh f WHERE f.run_id IS NULL AND f.node_kind IS NULL"
    ).fetchall()
    if not rows:
        return []
    out = []
    for trace, span, name, status, keys, values, events in rows:
        facts = conventions.read_span(
            name, dict(zip(keys or (), values or (), strict=True)), status_code=status or 0, event_names=events or ()
        )
        if facts.role == "tool" and _CAUGHT in (events or ()):
            # an instrumentor's span of a call that LoopGuard caught: it did not run, the event says so
            facts = conventions.ForeignSpan(role="other", family=facts.family)
        sig = digest = None
        internal = facts.tool_name in internal_tools if facts.tool_name else None
        failed = facts.failed or (
            facts.role == "tool" and facts.result is not None and repeats.is_failure(_DEFAULT_RULE, facts.result)
        )
        if facts.role == "tool" and facts.tool_name:
            sig = signature(facts.tool_name, _arguments_value(facts.arguments or ""))
            digest = result_hash(facts.result) if facts.result is not None else None
        out.append(
            (trace, span, facts.family or "otel", _FOREIGN_OPERATIONS.get(facts.role), facts.tool_name,
             facts.call_id, facts.arguments, facts.result, sig, digest, facts.model, facts.agent_name,
             internal, failed)
        )  # fmt: skip
    frame = pd.DataFrame(
        out,
        columns=["trace_id", "span_id", "convention", "operation", "tool_name", "tool_call_id", "arguments",
                 "result", "signature", "result_hash", "model", "agent_name", "internal", "failed"],
    )  # fmt: skip
    con.register("foreign_updates", frame)
    con.execute(
        "UPDATE spans SET convention = u.convention, operation = u.operation, tool_name = u.tool_name, "
        "tool_call_id = u.tool_call_id, arguments = u.arguments, result = u.result, signature = u.signature, "
        "result_hash = u.result_hash, model = coalesce(spans.model, u.model), "
        "agent_name = coalesce(spans.agent_name, u.agent_name), internal = u.internal, "
        "node_status = CASE WHEN u.failed AND u.operation = 'execute_tool' THEN 'failed' END "
        "FROM foreign_updates u WHERE spans.trace_id = u.trace_id AND spans.span_id = u.span_id"
    )
    con.unregister("foreign_updates")
    return sorted({row[0] for row in out})


def internal_tools() -> frozenset[str]:
    """Framework-internal tool names: ``TREELLM_INTERNAL_TOOLS`` (comma-separated; empty for
    none) else :data:`treellm.telemetry.conventions.DEFAULT_INTERNAL_TOOLS`."""
    text = os.environ.get(ENV_INTERNAL_TOOLS)
    if text is None:
        return DEFAULT_INTERNAL
    return frozenset(name.strip() for name in text.split(",") if name.strip())


def _finish_foreign(con: duckdb.DuckDBPyConnection, internal: frozenset[str] | None = None) -> None:
    """Conventions, runs, trees and ordinals for new spans from other frameworks.

    Whole traces are placed again whenever one of their spans arrives, so spans stored
    before their run's root (a batch exporter sends children first) move to that run.
    """
    traces = _read_foreign(con, internal_tools() if internal is None else internal)
    if not traces:
        return
    con.register("foreign_traces", pd.DataFrame({"trace_id": traces}))
    rows = con.execute(
        "SELECT trace_id, span_id, parent_span_id, start_ns, end_ns, operation, tool_name, arguments, "
        "       coalesce(internal, false), agent_name, orphan_parent IS NOT NULL AND parent_span_id IS NULL, "
        "       status_code = 2 OR node_status = 'failed' "
        "FROM spans JOIN foreign_traces USING (trace_id)"
    ).fetchall()
    foreign = {
        (t, s) for t, s in con.execute(
            "SELECT trace_id, span_id FROM spans JOIN foreign_traces USING (trace_id) WHERE convention IS NOT NULL"
        ).fetchall()
    }  # fmt: skip
    rows = _keyed_from_parents(con, rows)
    con.unregister("foreign_traces")
    facts = [
        SpanFacts(
            trace_id=trace, span_id=span, parent_id=parent, start_ns=start, end_ns=end,
            role=_ROLES.get(operation or "", "other"),
            call_key=(f"{tool}\x00{canonical_json(_arguments_value(args or ''))}"
                      if tool is not None and operation == "execute_tool" and not internal else None),
            agent_name=agent, flagged_orphan=flagged,
            changes_state=(tool is not None and operation == "execute_tool" and not internal and not failed
                           and repeats.changes_state(_DEFAULT_RULE, tool, _arguments_value(args or ""))),
        )
        for trace, span, parent, start, end, operation, tool, args, internal, agent, flagged, failed in rows
    ]  # fmt: skip
    placed = [p for p in place_traces(facts) if (p.trace_id, p.span_id) in foreign]
    frame = pd.DataFrame(
        [
            (p.trace_id, p.span_id, p.run_id, p.node_kind, p.node_parent_id, p.depth, p.ordinal,
             json.dumps(list(p.earlier)) if p.earlier else None, p.orphan, p.anchor)
            for p in placed
        ],
        columns=["trace_id", "span_id", "run_id", "node_kind", "node_parent_id", "node_depth", "ordinal",
                 "earlier_node_ids", "orphan", "anchor_node_id"],
    ).astype({"node_depth": "Int64", "ordinal": "Int64"})  # fmt: skip
    con.register("run_updates", frame)
    con.execute(
        "UPDATE spans SET run_id = u.run_id, node_kind = u.node_kind, node_parent_id = u.node_parent_id, "
        "node_depth = u.node_depth, ordinal = u.ordinal, earlier_node_ids = u.earlier_node_ids, "
        "anchor_node_id = u.anchor_node_id, "
        "orphan_parent = CASE WHEN u.orphan THEN coalesce(spans.orphan_parent, spans.parent_span_id, '') "
        "                     WHEN spans.parent_span_id IS NULL THEN spans.orphan_parent END "
        "FROM run_updates u WHERE spans.trace_id = u.trace_id AND spans.span_id = u.span_id"
    )
    con.unregister("run_updates")


_ROLES = {"execute_tool": "tool", "chat": "llm", "invoke_agent": "agent"}
_CAUGHT = "loop:detected"


def _keyed_from_parents(con: duckdb.DuckDBPyConnection, rows: list[Any]) -> list[Any]:
    """Tool spans that record a bare value (LangChain's single-argument tools) take their
    keyed arguments and call id from the parent that records the call, once it is stored."""
    bare = [
        (r[0], r[1], r[2], r[6]) for r in rows
        if r[5] == "execute_tool" and r[2] is not None and not (r[7] or "").lstrip().startswith("{")
    ]  # fmt: skip
    if not bare:
        return rows
    con.register("bare_calls", pd.DataFrame(bare, columns=["trace_id", "span_id", "parent_id", "tool"]))
    parents = con.execute(
        "SELECT b.trace_id, b.span_id, b.tool, map_keys(p.attributes), map_values(p.attributes) FROM bare_calls b "
        "JOIN spans p ON p.trace_id = b.trace_id AND p.span_id = b.parent_id"
    ).fetchall()
    con.unregister("bare_calls")
    found: dict[tuple[str, str], tuple[str, str | None, str]] = {}
    for trace, span, tool, keys, values in parents:
        call = conventions.parent_call(dict(zip(keys or (), values or (), strict=True)), tool)
        if call is not None:
            found[(trace, span)] = (call[0], call[1], signature(tool, _arguments_value(call[0])))
    if not found:
        return rows
    frame = pd.DataFrame(
        [(t, s, a, c, g) for (t, s), (a, c, g) in found.items()],
        columns=["trace_id", "span_id", "arguments", "tool_call_id", "signature"],
    )
    con.register("keyed_calls", frame)
    con.execute(
        "UPDATE spans SET arguments = u.arguments, tool_call_id = coalesce(spans.tool_call_id, u.tool_call_id), "
        "signature = u.signature FROM keyed_calls u WHERE spans.trace_id = u.trace_id AND spans.span_id = u.span_id"
    )
    con.unregister("keyed_calls")
    return [(*r[:7], found[(r[0], r[1])][0], *r[8:]) if (r[0], r[1]) in found else r for r in rows]


@contextmanager
def _transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


CHUNK_BYTES = 256 * 1024 * 1024
"""Files larger than this are staged in chunks of whole lines (one transaction still), so
the memory an ingest needs does not grow with the file."""


def _chunks(jsonl: Path, folder: Path) -> Iterator[Path]:
    """The file itself when small, else copies of consecutive runs of whole lines."""
    if jsonl.stat().st_size <= CHUNK_BYTES:
        yield jsonl
        return
    with jsonl.open("rb") as source:
        index = 0
        while True:
            part = folder / f"chunk-{index}.jsonl"
            written = 0
            with part.open("wb") as out:
                for line in source:
                    out.write(line)
                    written += len(line)
                    if written >= CHUNK_BYTES:
                        break
            if written == 0:
                part.unlink()
                return
            yield part
            part.unlink()
            index += 1


def _load_chunk(con: duckdb.DuckDBPyConnection, chunk: Path, *, original: Path, display: str) -> tuple[int, int, int]:
    """Stage, validate, insert and finish one chunk inside the caller's transaction."""
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE stage AS {stage_sql(_read_expression(chunk))}", {"source": display})
    except duckdb.Error as exc:
        raise _first_problem(original, display) from exc
    if con.execute(VALIDATE_SQL).fetchone() is not None:
        raise _first_problem(original, display)
    new, duplicates = _insert_staged(con)
    _finish_foreign(con)
    runs = _count(
        con,
        "SELECT count(*) FROM spans s SEMI JOIN fresh f USING (trace_id, span_id) "
        "WHERE s.skill_name IS NULL AND (s.span_id = split_part(s.run_id, ':', 2) "
        "OR (s.convention IS NULL AND s.operation = 'invoke_agent' AND s.node_id IS NULL AND s.run_id IS NOT NULL))",
    )
    con.execute("DROP VIEW IF EXISTS fresh")
    con.execute("DROP TABLE IF EXISTS fresh_rows")
    con.execute("DROP TABLE IF EXISTS stored_keys")
    con.execute("DROP TABLE IF EXISTS stage")
    return new, runs, duplicates


def _load_jsonl(db: Path, jsonl: Path, *, display: str, retries: int = 20) -> tuple[int, int, int]:
    """One transaction: stage, validate, insert, finish (chunk by chunk for large files).
    Returns (spans, runs, duplicates)."""
    con = open_store(db, retries=retries)
    try:
        con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
        con.execute("SET preserve_insertion_order = false")
        con.execute(MACROS)
        totals = [0, 0, 0]
        with tempfile.TemporaryDirectory(prefix="treellm-chunks-") as tmp, _transaction(con):
            for chunk in _chunks(jsonl, Path(tmp)):
                for i, value in enumerate(_load_chunk(con, chunk, original=jsonl, display=display)):
                    totals[i] += value
        return totals[0], totals[1], totals[2]
    except duckdb.Error as exc:
        raise StoreError(f"{display}: the store refused the data: {exc}", path=display) from exc
    finally:
        con.close()


# -- files of each format ---------------------------------------------------------------------------


def _good_lines_copy(path: Path, folder: Path, *, keep_bad: bool, display: str) -> tuple[Path, int, list[BadRecord]]:
    """A copy of the complete, valid lines (the torn last line is dropped; bad lines raise
    unless ``keep_bad``). Returns (copy, skipped torn lines, bad records)."""
    target = folder / "good.jsonl"
    skipped = 0
    bad: list[BadRecord] = []
    with target.open("wb") as out:
        for number, line, complete in _lines(path):
            if not complete:
                skipped += 1
                continue
            if not line.strip():
                continue
            problem = line_problem(line)
            if problem is not None:
                if not keep_bad:
                    raise IngestError(problem, path=display, line=number)
                bad.append(BadRecord(display, number, None, problem))
                continue
            out.write(line + b"\n")
    return target, skipped, bad


def _overlong_line(path: Path, limit: int = MAX_LINE_BYTES) -> tuple[int, int] | None:
    """(1-based line number, length) of the first line longer than ``limit``, else None.

    Jumps from newline to newline with ``bytes.find`` (memchr) over 64 MiB chunks.
    """
    chunk_size = 64 * 1024 * 1024
    line_number = 1
    current = 0  # length of the line so far, carried across chunks
    with path.open("rb") as handle:
        while chunk := handle.read(chunk_size):
            pos = 0
            while (end := chunk.find(b"\n", pos)) >= 0:
                if current + end - pos > limit:
                    return line_number, current + end - pos
                line_number += 1
                current = 0
                pos = end + 1
            current += len(chunk) - pos
            if current > limit:
                return line_number, current
    return None


def _torn_tail(path: Path) -> bool:
    with path.open("rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) != b"\n"


def ingest_file(
    db: str | os.PathLike[str],
    path: str | os.PathLike[str],
    input_format: InputFormatChoice = "auto",
    *,
    skip_bad: bool = False,
    retries: int = 20,
) -> FileReport:
    """Ingest one file in one transaction (see the module docstring).

    ``retries`` bounds the waits for a busy store before :class:`StoreBusyError`.
    """
    source = Path(path)
    display = str(path)
    if not source.is_file():
        raise IngestError("no such file", path=display)
    if source.stat().st_size == 0:
        return FileReport(display, input_format, 0, 0, 0, 0, empty=True)
    if input_format == "auto":
        fmt: str = detect_format(source)
    else:
        fmt = input_format
    with tempfile.TemporaryDirectory(prefix="treellm-ingest-") as tmp:
        folder = Path(tmp)
        skipped = 0
        bad: list[BadRecord] = []
        if fmt == "otlp-jsonl":
            jsonl = source
            overlong = _overlong_line(source)
            if overlong is not None and not skip_bad:
                line, length = overlong
                message = (
                    f"the line is {length / 1e6:.0f} MB, above the {MAX_LINE_BYTES // 2**20} MiB limit of one line"
                )
                raise IngestError(message, path=display, line=line)
            if skip_bad:
                jsonl, skipped, bad = _good_lines_copy(source, folder, keep_bad=True, display=display)
            elif _torn_tail(source):
                jsonl = folder / "complete.jsonl"
                copy_without_torn_tail(source, jsonl)
                skipped = 1
        else:
            jsonl = folder / "converted.jsonl"
            with jsonl.open("wb") as out:
                for record in iter_records(source, fmt):
                    if isinstance(record, IngestError):
                        if not skip_bad:
                            raise record
                        bad.append(BadRecord(display, record.line, record.record, record.reason))
                    else:
                        out.write(json_line(record.traces_data))
        if jsonl.stat().st_size == 0:
            return FileReport(display, fmt, 0, 0, 0, skipped, empty=not bad and not skipped, bad=tuple(bad))
        spans, runs, duplicates = _load_jsonl(Path(db), jsonl, display=display, retries=retries)
    return FileReport(display, fmt, spans, runs, duplicates, skipped, bad=tuple(bad))


TRACE_SUFFIXES = frozenset({".jsonl", ".ndjson", ".json", ".pb", ".binpb", ".proto", ".otlp"})


def _expand(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Files named are taken as they are; folders are walked for trace files (by suffix:
    .jsonl .ndjson .json .pb .binpb .proto .otlp), so a README beside them is left alone."""
    out: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            out.extend(
                sorted(
                    f for f in path.rglob("*")
                    if f.is_file() and not f.name.startswith(".") and f.suffix.lower() in TRACE_SUFFIXES
                )
            )  # fmt: skip
        else:
            out.append(path)
    return out


def ingest(
    store: str | os.PathLike[str],
    paths: Sequence[str | os.PathLike[str]],
    input_format: InputFormatChoice = "auto",
    *,
    skip_bad: bool = False,
    progress: Callable[[int, int, str], None] | None = None,
) -> IngestReport:
    """Ingest files (folders are walked) into the store at ``store``, one transaction each.

    Without ``skip_bad`` the first bad file raises :class:`IngestError`; the files
    before it stay ingested (each was its own transaction). ``progress(done, total,
    path)`` is called before each file.
    """
    files = _expand(paths)
    reports: list[FileReport] = []
    for index, file in enumerate(files):
        if progress is not None:
            progress(index, len(files), str(file))
        reports.append(ingest_file(store, file, input_format, skip_bad=skip_bad))
    if progress is not None:
        progress(len(files), len(files), "")
    return IngestReport(
        files=len(files),
        spans=sum(r.spans for r in reports),
        runs=sum(r.runs for r in reports),
        skipped=sum(r.skipped for r in reports),
        duplicates=sum(r.duplicates for r in reports),
        empty_files=tuple(r.path for r in reports if r.empty),
        bad_records=tuple(b for r in reports for b in r.bad),
        details=tuple(reports),
    )


def copy_without_torn_tail(path: Path, target: Path) -> int:
    """Copy ``path`` up to its last newline; returns the bytes dropped."""
    size = path.stat().st_size
    with path.open("rb") as src:
        data_end = end_of_last_line(src, size)
        src.seek(0)
        with target.open("wb") as out:
            shutil.copyfileobj(_Limited(src, data_end), out, 1 << 20)
    return size - data_end


class _Limited:
    def __init__(self, handle: Any, limit: int) -> None:
        self.handle, self.left = handle, limit

    def read(self, size: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        size = self.left if size < 0 else min(size, self.left)
        data: bytes = self.handle.read(size)
        self.left -= len(data)
        return data
