"""Ingest trace files into the store: one transaction per file, idempotent, never half-written.

Contract:

- Every format becomes OTLP/JSON ``TracesData`` lines; DuckDB flattens them in SQL
  (:mod:`treellm.store.transform`). OTLP JSON lines are read in place; the other
  formats (:mod:`treellm.store.foreign`) are converted to a temporary JSONL file first.
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

from treellm.engine.tools import result_hash
from treellm.errors import IngestError, StoreError
from treellm.exporters.jsonl import end_of_last_line
from treellm.otlp import json_line
from treellm.signature import RawArguments, parse_arguments, signature
from treellm.store.connection import open_store
from treellm.store.schema import SPAN_COLUMNS
from treellm.store.transform import MACROS, READ_COLUMNS, VALIDATE_SQL, stage_sql

__all__ = ["BadRecord", "FileReport", "IngestReport", "InputFormatChoice", "ingest", "ingest_file"]

InputFormatChoice = Literal["auto", "otlp-jsonl", "otlp-json", "otlp-proto", "sdk-json", "trajectory"]
MAX_LINE_BYTES = 64 * 1024 * 1024
MEMORY_LIMIT = os.environ.get("TREELLM_INGEST_MEMORY_LIMIT", "1GB")
_HEX = frozenset("0123456789abcdefABCDEF")


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


def _finish_foreign(con: duckdb.DuckDBPyConnection) -> None:
    """Signatures, result hashes, runs and ordinals for new spans from other frameworks."""
    calls = con.execute(
        "SELECT trace_id, span_id, tool_name, arguments, result, result_hash FROM fresh "
        "WHERE tool_name IS NOT NULL AND signature IS NULL"
    ).fetchall()
    if calls:
        updates = pd.DataFrame(
            [
                (t, s, signature(tool, _arguments_value(args if args is not None else "")),
                 rh or (result_hash(res) if res is not None else None))
                for t, s, tool, args, res, rh in calls
            ],
            columns=["trace_id", "span_id", "signature", "result_hash"],
        )  # fmt: skip
        con.register("signature_updates", updates)
        con.execute(
            "UPDATE spans SET signature = u.signature, result_hash = u.result_hash FROM signature_updates u "
            "WHERE spans.trace_id = u.trace_id AND spans.span_id = u.span_id"
        )
        con.unregister("signature_updates")
    traces = [r[0] for r in con.execute("SELECT DISTINCT trace_id FROM fresh WHERE run_id IS NULL").fetchall()]
    if not traces:
        return
    con.register("foreign_traces", pd.DataFrame({"trace_id": traces}))
    rows = con.execute(
        "SELECT trace_id, span_id, parent_span_id, operation, run_id, tool_name, signature, start_ns "
        "FROM spans JOIN foreign_traces USING (trace_id)"
    ).fetchall()
    con.unregister("foreign_traces")
    run_updates = _foreign_runs(rows)
    if run_updates.empty:
        return
    con.register("run_updates", run_updates)
    con.execute(
        "UPDATE spans SET run_id = u.run_id, ordinal = coalesce(spans.ordinal, u.ordinal), "
        "earlier_node_ids = coalesce(spans.earlier_node_ids, u.earlier_node_ids) FROM run_updates u "
        "WHERE spans.trace_id = u.trace_id AND spans.span_id = u.span_id"
    )
    con.unregister("run_updates")


def _foreign_runs(rows: Sequence[tuple[Any, ...]]) -> pd.DataFrame:
    """Run of each span (outermost agent span, else the trace root) and the ordinal of each
    tool call on its path (tool calls in time order under the nearest enclosing agent span)."""
    by_id = {(r[0], r[1]): r for r in rows}
    out: list[tuple[str, str, str, int | None, str | None]] = []
    earlier: dict[tuple[str, str, str], list[str]] = {}
    for row in sorted(rows, key=lambda r: (r[7] or 0, r[1])):
        trace, span, _parent, _operation, run_id, tool, sig = row[:7]
        if run_id is not None:
            continue
        nearest = outermost = None
        root = span
        node: tuple[Any, ...] | None = row
        seen = set()
        while node is not None and (node[0], node[1]) not in seen:
            seen.add((node[0], node[1]))
            if node[3] == "invoke_agent":
                nearest = nearest or node[1]
                outermost = node[1]
            root = node[1]
            node = by_id.get((trace, node[2])) if node[2] else None
        run = f"{trace}:{outermost or root}"
        ordinal = previous = None
        if tool is not None and sig is not None:
            same = earlier.setdefault((trace, nearest or root, sig), [])
            ordinal = len(same) + 1
            previous = json.dumps(same) if same else None
            same.append(span)
        out.append((trace, span, run, ordinal, previous))
    frame = pd.DataFrame(out, columns=["trace_id", "span_id", "run_id", "ordinal", "earlier_node_ids"])
    return frame.astype({"ordinal": "Int64"})


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
        "OR (s.operation = 'invoke_agent' AND s.node_id IS NULL AND s.run_id IS NOT NULL))",
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
        from treellm.store.foreign import detect_format

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
            from treellm.store.foreign import iter_traces_data

            jsonl = folder / "converted.jsonl"
            with jsonl.open("wb") as out:
                try:
                    for _, doc in iter_traces_data(source, fmt):
                        out.write(json_line(doc))
                except IngestError as exc:
                    if not skip_bad:
                        raise
                    bad.append(BadRecord(display, exc.line, exc.record, exc.reason))
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
