"""Ingest trace files into the store: one transaction per file, idempotent, never half-written.

Contract:

- Every format becomes OTLP/JSON ``TracesData`` lines; DuckDB flattens them in SQL
  (:mod:`treellm.derive.transform`). OTLP JSON lines are read in place; the other
  formats (:mod:`treellm.derive.formats`) are converted to a temporary JSONL file first,
  every record through the one validator (:func:`treellm.otlp.normalize_traces_data`).
- What a valid span is lives in :mod:`treellm.otlp.validate` only. A file read in place is
  checked by its generated SQL (``VALIDATE_SQL``); when that flags a span, or DuckDB refuses
  to stage the file (a duplicate MAP key, a time past int64, a value of the wrong type),
  the transaction is rolled back and the file is rebuilt line by line by the validator:
  bad spans are rejected alone (each naming its line, its place and its field), duplicate
  attribute keys keep their last value (recorded on the span), an all-zero parent is none.
- Each file is one transaction: a bad file leaves nothing behind and raises
  :class:`~treellm.errors.IngestError` naming the file, the line (or record) and the
  reason; with ``skip_bad=True`` the good spans are kept and each bad one reported. When
  DuckDB refuses a file the validator accepts, the error carries DuckDB's own message.
- A record a reader stores but doubts (a trajectory run with assistant turns and no call
  found) is kept and reported in ``FileReport.warnings`` (``IngestReport.warnings``), which
  the CLI prints on stderr.
- Every new span is accounted for (:class:`Accounting`, computed inside the file's
  transaction once its spans are placed): it starts a run, is a node (a tool call among
  them), sits inside a run as context (a chain, a graph step, a skill), or is stored but
  placed nowhere, for one reason of :data:`UNPLACED_REASONS`; the counts add up to the
  file's new spans, and each reason is a warning naming its first span. Caught calls
  (``loop:detected`` events) are counted beside them, those naming no tool too.
- A span of treellm's own scope that lacks treellm's run id (an older version, a hand-made
  span) is read by the GenAI conventions like any other framework's span, instead of
  being stored outside every run: its treellm node id and kind are cleared first.
- A folder is walked for trace files by suffix; its other files (not hidden ones) are
  listed in ``IngestReport.skipped_files``, never read.
- Re-ingesting adds nothing: (trace_id, span_id) stays unique (an anti-join against
  the stored keys; duplicates are counted).
- Nothing secret is stored from other frameworks' spans (any span not from treellm's own
  instrumentation scope): after their placement has derived signatures, call keys and
  ordinals from the raw values, the same transaction rewrites what is stored of them as the
  capture mode says (``capture``, else ``configure(capture=...)``, else ``TREELLM_CAPTURE``:
  :class:`~treellm.telemetry.redaction.ForeignCapture`), each distinct value once. The
  collector and ``ingest --clickhouse`` store through here.
- A torn final line (no newline after it, as a crashed writer leaves) is skipped and
  counted in ``skipped``; an empty file ingests nothing and is reported.
- The writer holds the store's write lock only while it writes one file. The first chunk's
  spans are checked, read by the conventions and placed before the transaction begins (that
  writes nothing of the store, and DuckDB frees those working tables at once), then prepared
  again inside it if the store changed meanwhile (:func:`_prepare_staged`, :func:`_still_prepared`).
- Memory stays bounded: DuckDB reads the file in pieces, one per thread and at most
  :data:`PIECES_IN_FLIGHT_BYTES` at once over all threads (less under a small memory limit:
  :data:`LIMIT_PER_PIECE_IN_FLIGHT`; each thread's buffer sized for the longest line there is,
  :data:`SMALL_OBJECT_BYTES` or :data:`MAX_LINE_BYTES`), under a memory limit, and spills;
  the stage is inserted every :data:`CHUNK_BYTES`, so batched lines (the Collector's file
  exporter) and files of any size fit the same limit.
- :func:`ingest_segments`: several files (the journal's closed segments) in one transaction.
"""

from __future__ import annotations

import mmap
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import duckdb
import orjson

from treellm import settings
from treellm.derive.foreign import (
    FOREIGN_COLUMNS,
    PLACED_COLUMNS,
    PLACED_FROM,
    PLACED_JOINS,
    columns,
    frames_as_tables,
    internal_tools,  # noqa: F401  (read here by callers of ingest)
    streamed_rows,
)
from treellm.derive.foreign import finish_foreign as _finish_foreign
from treellm.derive.foreign import place_foreign as _place_foreign
from treellm.derive.foreign import read_foreign as _read_foreign
from treellm.derive.foreign import update_stored as _update_stored
from treellm.derive.formats import CallsNotFound, InputFormat, calls_not_found_warnings, detect_format, iter_records
from treellm.derive.transform import (
    MACROS,
    READ_COLUMNS,
    REDACT_CHANGED_PLACES_SQL,
    REDACT_KEYS_SQL,
    REDACT_PLACES,
    REDACT_TARGETS_SQL,
    REDACT_TEXT_COLUMNS,
    VALIDATE_SQL,
    redact_candidates_sql,
    redact_map_sql,
    redact_text_sql,
    stage_sql,
)
from treellm.errors import IngestError, StoreError
from treellm.exporters.jsonl import end_of_last_line
from treellm.otlp import Normalized, StructureError, json_line, normalize_traces_data
from treellm.store.connection import open_store
from treellm.store.schema import SPAN_COLUMNS
from treellm.store.scratch import scratch_folder
from treellm.telemetry import semconv as sc
from treellm.telemetry.redaction import MASK, Capture, CaptureMode, ForeignCapture, ValueRule, resolve_capture

__all__ = [
    "UNKNOWN_TOOL",
    "UNPLACED_REASONS",
    "Accounting",
    "BadRecord",
    "FileReport",
    "IngestProgress",
    "IngestReport",
    "InputFormatChoice",
    "Unplaced",
    "ingest",
    "ingest_file",
    "ingest_segments",
]

UNKNOWN_TOOL = "(unknown tool)"
"""What a report shows for a caught call (or a call) whose span names no tool: never None or nan."""

InputFormatChoice = Literal["auto", InputFormat]  # the names of treellm.derive.formats.FORMATS
MAX_LINE_BYTES = 64 * 1024 * 1024
MEMORY_LIMIT = settings.get(settings.TREELLM_INGEST_MEMORY_LIMIT)  # read once, at import
PYTHON_RESERVE_BYTES = 160 * 1024 * 1024
"""What an ingest keeps of its memory budget for its Python work beside DuckDB: the placement's
batch of about 50,000 spans took about 90 MB (BENCHMARKS.md, "Ingest memory")."""
MIN_DUCKDB_BYTES = 384 * 1024 * 1024
"""DuckDB's share is never below this: a budget too small for the process is exceeded rather than
failed (with DuckDB at 256 MB the 1 GB file's batched lines ran out of memory; at 384 MB they did
not: BENCHMARKS.md, "Ingest memory")."""


def duckdb_share(budget: int, held: int) -> int:
    """DuckDB's memory limit for an ingest whose process may use ``budget`` bytes and holds
    ``held`` already (the interpreter, its imports): what is left less
    :data:`PYTHON_RESERVE_BYTES`, at least :data:`MIN_DUCKDB_BYTES`."""
    return max(MIN_DUCKDB_BYTES, budget - held - PYTHON_RESERVE_BYTES)


def _resident_bytes() -> int:
    """This process's resident memory (Linux's ``/proc``; 0 where there is none to read)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True, slots=True)
class BadRecord:
    path: str
    line: int | None
    record: int | None
    reason: str


UnplacedReason = Literal["no run root", "missing attribute", "unknown convention", "no call"]
UNPLACED_REASONS: tuple[UnplacedReason, ...] = ("no run root", "missing attribute", "unknown convention", "no call")
"""Why a stored span is placed nowhere: its run's root span is not stored (``no run root``);
it lacks an attribute its place needs, such as a tool span without a tool name (``missing
attribute``); no convention reads it and its run or trace holds no model or tool call
(``unknown convention``: the run is only context, e.g. a trace of HTTP spans); a convention
reads it, but its trace holds no invocation, model call or tool call, so no run (``no call``:
an agent's construction, such as AutoGen's ``create_agent``)."""


@dataclass(frozen=True, slots=True)
class Unplaced:
    """The spans stored but placed nowhere for one reason, and the first of them (by start)."""

    reason: UnplacedReason
    spans: int
    first: str  # "span 'name' (span id) of trace <trace id>[, without <attribute>]"


@dataclass(frozen=True, slots=True)
class Accounting:
    """Where new spans went. ``runs + nodes + in_run + unplaced`` is every new span, each once;
    ``tool_calls`` are among the nodes (executed calls, framework-internal ones included);
    ``loop_events`` are the caught calls (``loop:detected`` events on those spans), of which
    ``unknown_tool_catches`` name no tool (the report shows them as ``(unknown tool)``)."""

    runs: int = 0
    nodes: int = 0
    tool_calls: int = 0
    in_run: int = 0
    loop_events: int = 0
    unknown_tool_catches: int = 0
    unplaced: tuple[Unplaced, ...] = ()

    @property
    def placed_nowhere(self) -> int:
        return sum(u.spans for u in self.unplaced)

    @property
    def spans(self) -> int:
        """Every span accounted for: the sum of the places."""
        return self.runs + self.nodes + self.in_run + self.placed_nowhere

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "nodes": self.nodes,
            "tool_calls": self.tool_calls,
            "in_run": self.in_run,
            "loop_events": self.loop_events,
            "unknown_tool_catches": self.unknown_tool_catches,
            "placed_nowhere": {u.reason: u.spans for u in self.unplaced},
        }


def combine(accountings: Sequence[Accounting]) -> Accounting:
    """The accounting of several files: counts summed, each reason's first span the first file's."""
    unplaced: dict[UnplacedReason, Unplaced] = {}
    for accounting in accountings:
        for u in accounting.unplaced:
            found = unplaced.get(u.reason)
            unplaced[u.reason] = u if found is None else Unplaced(u.reason, found.spans + u.spans, found.first)
    return Accounting(
        runs=sum(a.runs for a in accountings),
        nodes=sum(a.nodes for a in accountings),
        tool_calls=sum(a.tool_calls for a in accountings),
        in_run=sum(a.in_run for a in accountings),
        loop_events=sum(a.loop_events for a in accountings),
        unknown_tool_catches=sum(a.unknown_tool_catches for a in accountings),
        unplaced=tuple(unplaced[r] for r in UNPLACED_REASONS if r in unplaced),
    )


def accounting_warnings(display: str, accounting: Accounting) -> tuple[str, ...]:
    """One warning per reason spans were placed nowhere, naming the first span; one for caught
    calls that name no tool."""
    out = [
        f"{display}: {u.spans} span(s) stored but placed nowhere: {u.reason} (first: {u.first})"
        for u in accounting.unplaced
    ]
    if accounting.unknown_tool_catches:
        out.append(
            f"{display}: {accounting.unknown_tool_catches} caught call(s) name no tool "
            f"({sc.LOOP_TOOL} missing); the report shows them as {UNKNOWN_TOOL}"
        )
    return tuple(out)


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
    warnings: tuple[str, ...] = ()  # "<path>: <what>", e.g. a trajectory run whose calls were not found
    accounting: Accounting = Accounting()


Step = Literal["reading", "converting", "staging", "placing", "accounting", "done"]
"""What ingest is doing with a file: reading it (its format, its lines), converting it to OTLP
JSON lines (formats other than OTLP JSON lines), staging its lines, placing the new spans
(conventions, runs, trees, ordinals), accounting for them; ``done`` once the file's transaction
committed."""


@dataclass(frozen=True, slots=True)
class IngestProgress:
    """Where an ingest is, for a progress bar (the ``progress`` callback of :func:`ingest`):
    ``files_done`` of ``files``, ``bytes_done`` of ``bytes_total`` (the files' sizes: the current
    file's share grows as its lines are staged and placed), the new spans stored so far (committed
    files and the current file's placed chunks), the current file and its :data:`Step`."""

    files_done: int
    files: int
    bytes_done: int
    bytes_total: int
    spans: int
    path: str
    step: Step


_OnStep = Callable[[Step, float, int], None]
"""A file's progress inside :func:`ingest_file`: (step, the share of the file done, new spans so far)."""


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
    skipped_files: tuple[str, ...] = ()
    """Files found in the folders given that are no trace files by their suffix: not read."""

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the files' readers stored but doubt, file by file (see :class:`FileReport`)."""
        return tuple(w for r in self.details for w in r.warnings)

    @property
    def accounting(self) -> Accounting:
        """Where the new spans of every file went (see :class:`Accounting`)."""
        return combine([r.accounting for r in self.details])

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
            "warnings": list(self.warnings),
            "accounting": self.accounting.to_json(),
            "skipped_files": list(self.skipped_files),
        }


# -- validating lines (only when DuckDB refused a file, or the SQL check flagged a span) ----------


def _too_long(length: int) -> str:
    return f"the line is {length / 1e6:.0f} MB, above the {MAX_LINE_BYTES // 2**20} MiB limit of one line"


def _read_line(line: bytes) -> tuple[Normalized | None, str | None]:
    """(the line through the one validator, None), or (None, why the line cannot be read at all)."""
    if len(line) > MAX_LINE_BYTES:
        return None, _too_long(len(line))
    try:
        doc = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc})"
    if not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans"), list):
        return None, "not an OTLP/JSON TracesData object: no resourceSpans list"
    try:
        return normalize_traces_data(doc, max_reasons=None), None
    except StructureError as exc:
        return None, str(exc)


def line_problem(line: bytes) -> str | None:
    """Why one OTLP/JSON line cannot be ingested whole (its first bad span, named by its place
    and field, as :func:`treellm.otlp.normalize_traces_data` says), or None when it can."""
    normalized, problem = _read_line(line)
    if normalized is None:
        return problem
    return normalized.reasons[0] if normalized.reasons else None


def _lines(path: Path) -> Iterator[tuple[int, bytes, bool]]:
    """(1-based line number, line without newline, complete) of a file, streamed."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            yield number, raw.rstrip(b"\r\n"), raw.endswith(b"\n")


def _canonical_copy(path: Path, folder: Path, *, keep_bad: bool, display: str) -> tuple[Path, int, list[BadRecord]]:
    """A copy of ``path`` with every line rebuilt by the one validator: bad spans left out
    (each raises, naming its line, unless ``keep_bad``: then each is reported), duplicate
    attribute keys resolved (the last value wins, recorded on the span), the torn last line
    dropped. Returns (copy, skipped torn lines, bad records)."""
    target = folder / "canonical.jsonl"
    skipped = 0
    bad: list[BadRecord] = []
    with target.open("wb") as out:
        for number, line, complete in _lines(path):
            if not complete:
                skipped += 1
                continue
            if not line.strip():
                continue
            normalized, problem = _read_line(line)
            reasons = (problem,) if normalized is None else normalized.reasons
            for reason in reasons:
                if not keep_bad:
                    raise IngestError(str(reason), path=display, line=number)
                bad.append(BadRecord(display, number, None, str(reason)))
            if normalized is not None and normalized.traces_data is not None:
                out.write(json_line(normalized.traces_data))
    return target, skipped, bad


# -- the transaction of one file ---------------------------------------------------------------


def _sql_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


SMALL_OBJECT_BYTES = 8 * 1024 * 1024
"""The largest line DuckDB is told to expect when no line of the files is longer. Its JSON reader
gives each thread a buffer of twice ``maximum_object_size``: told :data:`MAX_LINE_BYTES` (64 MiB),
128 MiB a thread, and at a 384 MiB limit a 43 MB file of treellm's own spans ran out of memory;
told 8 MiB, it passed, and the batched file of BENCHMARKS.md ingested as fast (5.6-6.0 s against
6.1-6.4 s)."""


def _object_bytes(sources: Sequence[Path]) -> int:
    """The longest line ``sources`` may hold, as DuckDB is told: :data:`SMALL_OBJECT_BYTES` when no
    line is longer (a few lookups a file, :func:`_lines_within`; a longer line is not looked for
    and named, as the check against :data:`MAX_LINE_BYTES` does), else :data:`MAX_LINE_BYTES`."""
    small = all(_lines_within(source, SMALL_OBJECT_BYTES) for source in sources)
    return SMALL_OBJECT_BYTES if small else MAX_LINE_BYTES


def _read_expression(paths: list[Path], object_bytes: int = MAX_LINE_BYTES) -> str:
    files = "[" + ", ".join(_sql_literal(str(path)) for path in paths) + "]"
    return (
        f"read_json({files}, format = 'newline_delimited', records = true, "
        f"columns = {READ_COLUMNS}, maximum_object_size = {object_bytes + 1024})"
    )


_STORED_KEYS = "SELECT trace_id, span_id FROM stage SEMI JOIN spans USING (trace_id, span_id)"
_STORED_SINCE = f"""
WITH stored_now AS MATERIALIZED ({_STORED_KEYS})
SELECT count(*) FROM (
    (SELECT * FROM stored_now EXCEPT SELECT * FROM stored_keys)
    UNION ALL
    (SELECT * FROM stored_keys EXCEPT SELECT * FROM stored_now)
)
"""
"""The keys of the stage whose being stored changed since ``stored_keys`` was read."""


def _prepare_staged(con: duckdb.DuckDBPyConnection) -> tuple[int, int]:
    """Check the staged spans, keep the new ones in the view ``fresh``, read what the conventions
    say of those of other frameworks and place them (``foreign_answers``, ``foreign_placed``: the
    view ``incoming`` holds the new rows as they will be stored); returns (new, duplicates).

    Writes nothing of the store, and reads of it only which keys of the stage it holds and the
    stored rows of the placed traces: an ingest runs it for its first chunk before its transaction
    begins, so that the working tables of the conventions and of the placement are freed before
    the insert (DuckDB keeps a table dropped inside a transaction until it ends), and
    :func:`_still_prepared` tells whether the store changed meanwhile. ``fresh`` is the stage
    without the keys already stored, and without repeats inside the file (materialised only when
    the file has any); each row keeps its row of the stage (``stage_row``), which keys the answers.
    """
    try:
        flagged = con.execute(VALIDATE_SQL).fetchone()
    except duckdb.Error as exc:
        raise _Refused(str(exc).split("\n", 1)[0]) from exc
    if flagged is not None:
        raise _Refused(f"span {flagged[1]!r} of trace {flagged[0]!r} breaks a rule of treellm.otlp")
    if _count(con, _WITHOUT_RUN_ID):
        con.execute(_FALL_BACK)
    con.execute(f"CREATE OR REPLACE TEMP TABLE stored_keys AS {_STORED_KEYS}")
    repeated = _count(con, "SELECT count(*) FROM (SELECT 1 FROM stage GROUP BY trace_id, span_id HAVING count(*) > 1)")
    fresh = "SELECT s.rowid AS stage_row, s.* FROM stage s ANTI JOIN stored_keys k USING (trace_id, span_id)"
    if repeated:
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE fresh_rows AS {fresh} "
            "QUALIFY row_number() OVER (PARTITION BY s.trace_id, s.span_id ORDER BY s.start_ns) = 1"
        )
        fresh = "SELECT * FROM fresh_rows"
    else:
        con.execute("DROP TABLE IF EXISTS fresh_rows")
    con.execute(f"CREATE OR REPLACE TEMP VIEW fresh AS {fresh}")
    staged = _count(con, "SELECT count(*) FROM stage")
    new = _count(con, "SELECT count(*) FROM fresh")
    with _refused_by_the_data():  # they read event attributes, built into MAPs here
        _read_foreign(con)
    answered = ", ".join(f"{FOREIGN_COLUMNS.get(column, f'f.{column}')} AS {column}" for column in SPAN_COLUMNS)
    con.execute(
        f"CREATE OR REPLACE TEMP VIEW incoming AS SELECT {answered}, f.stage_row FROM fresh f "
        "LEFT JOIN foreign_answers u ON u.stage_row = f.stage_row"
    )
    _place_foreign(con)  # builds nothing from the raw data: an error here is no bad line, it is itself
    con.execute(f"CREATE OR REPLACE TEMP TABLE placed_from AS {PLACED_FROM}")
    return new, staged - new


def _still_prepared(con: duckdb.DuckDBPyConnection) -> bool:
    """Inside the transaction, after :func:`_prepare_staged` ran before it: whether the store
    holds the same keys of the stage and the same rows of the placed traces as it did then
    (another connection of this process may have written or deleted spans in between; then the
    chunk is prepared again)."""
    same = f"SELECT count(*) FROM placed_from p JOIN ({PLACED_FROM}) q ON q.n = p.n AND q.h = p.h"
    return _count(con, _STORED_SINCE) == 0 and _count(con, same) == 1


def _insert_prepared(con: duckdb.DuckDBPyConnection) -> None:
    """Inside the transaction, after :func:`_prepare_staged`: write what the placement changed of
    the stored rows, then insert the new spans of ``fresh`` (and their events and links) with the
    conventions' answers and their placement (an UPDATE of every new row after its insert cost
    more than the placement's own work, most of it in the commit)."""
    _update_stored(con)
    inserted = (*SPAN_COLUMNS, *(column for column in PLACED_COLUMNS if column not in SPAN_COLUMNS))
    placed = ", ".join(f"{PLACED_COLUMNS.get(column, f'i.{column}')} AS {column}" for column in inserted)
    with _refused_by_the_data():
        con.execute(f"INSERT INTO spans ({', '.join(inserted)}) SELECT {placed} FROM incoming i {PLACED_JOINS}")
    _finish_foreign(con)
    con.execute("DROP VIEW incoming")
    with _refused_by_the_data():
        _insert_events_and_links(con)


@contextmanager
def _refused_by_the_data() -> Iterator[None]:
    """DuckDB's refusal of the staged data (attributes it cannot hold as a MAP: duplicate keys of an
    event or a link) as :class:`_Refused`: the one validator then decides per line."""
    try:
        yield
    except (duckdb.InvalidInputException, duckdb.ConversionException) as exc:
        raise _Refused(str(exc).split("\n", 1)[0]) from exc


def _insert_events_and_links(con: duckdb.DuckDBPyConnection) -> None:
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


def _count(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    row = con.execute(sql).fetchone()
    return int(row[0]) if row else 0


@contextmanager
def _transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


class _Refused(Exception):
    """DuckDB refused to stage a file, or the SQL check flagged a span: the file goes through
    the one validator, which decides. Holds DuckDB's message (or the SQL check's finding)."""


CHUNK_BYTES = 256 * 1024 * 1024
"""Staged bytes after which the stage is inserted and emptied (one transaction still), so the
memory an ingest needs does not grow with the file. Larger chunks cost less: every chunk
anti-joins against the growing table (48 MiB chunks doubled the time of 1M spans)."""

PIECES_IN_FLIGHT_BYTES = 64 * 1024 * 1024
"""The bytes of JSON that DuckDB parses at once, over all its threads. A chunk is staged by one
``read_json`` over a list of piece files, and DuckDB parses a piece per thread: each piece is at
most this divided by the threads. One ``read_json`` of a whole file would parse 2048 lines per
thread at once (batched lines of the Collector's file exporter, 50-100 spans each, ran out of a
1 GB limit so), and one ``read_json`` per piece leaves a core idle whenever a piece holds fewer
lines than that (BENCHMARKS.md, "Batched ingest")."""

WHOLE_FILE_SLACK = 1.5
"""A file up to this many pieces is read where it is rather than copied in pieces: copying a
journal segment of 32 MiB and a few bytes costs a tenth of its flush."""

MIN_PIECE_BYTES = 1024 * 1024
"""Pieces are no smaller than this: a small file is read as it is, a larger one is cut in at least
one piece per thread."""


LIMIT_PER_PIECE_IN_FLIGHT = 24
"""DuckDB's memory limit holds at least this many times the bytes it parses at once. Parsing a
piece and flattening its spans takes many times its bytes: treellm's own spans (lines of 87 KB),
64 MiB in flight under the 620 MiB a 1 GB command leaves DuckDB, ran out of memory; 32 MiB
passed at a 568 MB peak, and 26 MiB as fast as 64 (BENCHMARKS.md, "Ingest")."""


def _piece_bytes(size: int, threads: int, memory_bytes: int | None = None) -> int:
    """How large each piece of a file of ``size`` bytes is: one per thread at least (both cores
    parse a journal segment), at most the share of one thread of :data:`PIECES_IN_FLIGHT_BYTES`,
    and of DuckDB's ``memory_bytes`` over :data:`LIMIT_PER_PIECE_IN_FLIGHT`."""
    threads = max(threads, 1)
    in_flight = PIECES_IN_FLIGHT_BYTES
    if memory_bytes is not None:
        in_flight = min(in_flight, memory_bytes // LIMIT_PER_PIECE_IN_FLIGHT)
    return max(MIN_PIECE_BYTES, min(-(-size // threads), in_flight // threads))


def _pieces(sources: Sequence[Path], folder: Path, piece_bytes: int) -> Iterator[tuple[Path, int, bool]]:
    """(file, bytes, whether it is a copy) of consecutive runs of whole lines of about
    ``piece_bytes``: a file up to :data:`WHOLE_FILE_SLACK` pieces is its own piece (a journal
    segment, closed just past its size, is read where it is), a larger one is copied a piece at
    a time, each ending at the first newline from its size on (the file mapped: no byte of it
    passes through Python)."""
    index = 0
    for source in sources:
        size = source.stat().st_size
        if size <= WHOLE_FILE_SLACK * piece_bytes:
            if size:
                yield source, size, False
            continue
        with source.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            start = 0
            while start < size:
                end = mapped.find(b"\n", min(start + piece_bytes, size) - 1) + 1 or size
                part = folder / f"piece-{index}.jsonl"
                _copy_range(handle, part, start, end - start)
                index += 1
                yield part, end - start, True
                start = end


def _copy_range(handle: Any, target: Path, offset: int, length: int) -> None:
    """Copy ``length`` bytes of the open file ``handle`` from ``offset`` into ``target``: in the
    kernel where it can (``copy_file_range``), else read and written a MiB at a time."""
    with target.open("wb") as out:
        done = 0
        if hasattr(os, "copy_file_range"):
            try:
                while done < length:
                    copied = os.copy_file_range(handle.fileno(), out.fileno(), length - done, offset + done)
                    if not copied:
                        break
                    done += copied
            except OSError:  # a file system or kernel without it: copy what is left by hand
                pass
        while done < length:
            block = os.pread(handle.fileno(), min(length - done, 1 << 20), offset + done)
            if not block:
                raise OSError(f"{handle.name}: the file ended at byte {offset + done} while it was read")
            out.write(block)
            done += len(block)


CHUNK_TAIL_SLACK = 0.5
"""The last chunk takes the rest of the input when the rest is less than this many chunks: each
chunk costs its own statements and insert, and a 300k-span file of 308 MiB (the batched file of
BENCHMARKS.md) ingested in 5.5-5.7 s as one chunk against 5.9-6.4 s as 256 MiB and 52 MiB, at the
same peak (880 MB). Chunks larger still spill: the 1 GB file took 24 s in chunks of 512 MiB, 19 s
in chunks of 256."""


def _chunks(sources: Sequence[Path], folder: Path, piece_bytes: int) -> Iterator[tuple[list[Path], int]]:
    """(piece files, bytes) of about :data:`CHUNK_BYTES` each, the last taking a rest smaller than
    :data:`CHUNK_TAIL_SLACK` chunks, none past ``1 + CHUNK_TAIL_SLACK`` chunks even when a file grows
    while it is read (see :func:`_pieces`); the copies of a chunk go once it is staged."""
    chunk: list[tuple[Path, bool]] = []
    staged = 0
    left = sum(source.stat().st_size for source in sources)
    try:
        for piece, size, copied in _pieces(sources, folder, piece_bytes):
            chunk.append((piece, copied))
            staged += size
            left -= size  # below 0 when a file grew since: the cap below still holds
            if staged >= CHUNK_BYTES and (
                left >= CHUNK_TAIL_SLACK * CHUNK_BYTES or staged >= (1 + CHUNK_TAIL_SLACK) * CHUNK_BYTES
            ):
                yield [path for path, _ in chunk], staged
                _remove_copies(chunk)
                staged = 0
        if chunk:
            yield [path for path, _ in chunk], staged
    finally:
        _remove_copies(chunk)


def _remove_copies(chunk: list[tuple[Path, bool]]) -> None:
    for path, copied in chunk:
        if copied:
            path.unlink(missing_ok=True)
    chunk.clear()


def _stage_chunk(
    con: duckdb.DuckDBPyConnection, pieces: list[Path], *, display: str, object_bytes: int = MAX_LINE_BYTES
) -> None:
    """Stage the spans of ``pieces`` (whole lines each, none over ``object_bytes``) with one
    ``read_json`` over them all."""
    select = stage_sql(_read_expression(pieces, object_bytes))
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE stage AS {select}", {"source": display})
    except duckdb.Error as exc:
        raise _Refused(str(exc).split("\n", 1)[0]) from exc


# -- redaction of other frameworks' spans ------------------------------------------------------------


def _redact_foreign(con: duckdb.DuckDBPyConnection, capture: ForeignCapture) -> None:
    """Rewrite what is stored of the new spans of other frameworks as ``capture`` says: their
    attributes (resource, event and link ones too), names and status messages, and the derived
    argument and result texts of their calls (and of the stored calls of their traces, which the
    placement may have just rewritten). Runs after the insert of the placed rows, inside the caller's
    transaction: what was derived from the raw values stays. A key's rule is decided once per
    distinct key; a value crosses into Python once however many places hold it (a result is an
    attribute and a column), and only when it may change (DuckDB runs the prefilter); only the rows
    that change are written back."""
    if not capture.active:
        return
    con.execute(REDACT_TARGETS_SQL)
    rules: dict[str, ValueRule] = {}
    places: set[str] = set()  # the maps that change
    for place, key in con.execute(REDACT_KEYS_SQL).fetchall():
        rule = rules[key] = capture.rule(key)  # the SQL applies it (a resource attribute is never hashed)
        if rule == "mask":
            places.add(place)
    rewrites = {column: capture.rewrite_of(kind) for column, (_, kind) in REDACT_TEXT_COLUMNS.items()}
    kept = [(key, rule) for key, rule in rules.items() if rule != "redact"]
    keys = columns({"k": [key for key, _ in kept], "rule": [rule for _, rule in kept]})
    done: list[tuple[str, str, str]] = []
    with frames_as_tables(con, redact_keys=keys):
        for how, value in streamed_rows(con, redact_candidates_sql(rewrites)):
            if (new := capture.rewrite(how, value)) != value:
                done.append((how, value, new))
    rewritten = columns({name: [row[i] for row in done] for i, name in enumerate(("how", "v", "r"))})
    with frames_as_tables(con, redact_keys=keys, redact_done=rewritten):
        changed = {how for how, _, _ in done}
        for column, how in rewrites.items():
            if how in changed:
                con.execute(redact_text_sql(column, how))
        places.update(place for (place,) in con.execute(REDACT_CHANGED_PLACES_SQL).fetchall())
        for place in REDACT_PLACES:
            if place in places:
                con.execute(redact_map_sql(place, mask=MASK))
    con.execute("DROP TABLE redact_spans; DROP TABLE redact_calls; DROP TABLE redact_entries")


_RUN_ROOT = (
    "{s}.skill_name IS NULL AND ({s}.span_id = split_part({s}.run_id, ':', 2) OR ({s}.convention IS NULL "
    "AND {s}.operation = 'invoke_agent' AND {s}.node_id IS NULL AND {s}.run_id IS NOT NULL))"
)
"""A span that starts its run: the ``runs`` view's rule (``store/schema.py``), on the alias ``{s}``."""
_NODE = "coalesce({s}.node_kind IS NOT NULL OR {s}.operation IN ('execute_tool', 'chat'), false)"
_TOOL_SPAN = "coalesce({s}.operation = 'execute_tool' OR {s}.node_kind = 'tool', false)"

_WITHOUT_RUN_ID = "SELECT count(*) FROM stage WHERE run_id IS NULL AND node_kind IS NOT NULL"
_FALL_BACK = "UPDATE stage SET node_id = NULL, node_kind = NULL WHERE run_id IS NULL AND node_kind IS NOT NULL"
"""Spans of treellm's scope without its run id (an older version, hand-made ones) go to the GenAI
conventions like any other framework's: the placement reads only spans without a node kind, and a
node id left behind would not match the parent ids the placement writes. Done on the stage, before
the insert, so the stored row and the placement's input agree."""

_PLACES = f"""
WITH touched AS (
    SELECT trace_id, span_id, name, start_ns, run_id, node_kind, node_id, operation, tool_name, convention,
           skill_name
    FROM spans WHERE trace_id IN (SELECT DISTINCT trace_id FROM file_keys)
),
run_facts AS (
    SELECT run_id, coalesce(bool_or({_RUN_ROOT.format(s="t")}), false) AS rooted,
           bool_or({_NODE.format(s="t")}) AS noded,
           bool_or(t.convention IS NULL AND t.node_kind IS NULL AND t.node_id IS NULL AND t.skill_name IS NULL
                   AND t.operation IS DISTINCT FROM 'invoke_agent') AS headless
    FROM touched t WHERE run_id IS NOT NULL GROUP BY run_id
),
placed AS (
    SELECT n.trace_id, n.span_id, n.name, n.start_ns,
        CASE
            WHEN n.run_id IS NULL AND n.convention = 'otel' THEN 'unknown convention'
            WHEN n.run_id IS NULL AND n.convention IS NOT NULL THEN 'no call'
            WHEN n.run_id IS NULL OR (NOT r.rooted AND r.headless) THEN 'missing attribute'
            WHEN NOT r.rooted THEN 'no run root'
            WHEN n.convention = 'otel' AND NOT r.noded THEN 'unknown convention'
            WHEN coalesce({_RUN_ROOT.format(s="n")}, false) THEN 'run'
            WHEN n.convention IS NULL AND {_TOOL_SPAN.format(s="n")} AND n.tool_name IS NULL THEN 'missing attribute'
            WHEN {_TOOL_SPAN.format(s="n")} AND n.tool_name IS NOT NULL THEN 'tool call'
            WHEN {_NODE.format(s="n")} THEN 'node'
            WHEN n.convention = 'otel' THEN 'unknown convention'
            ELSE 'in run'
        END AS place,
        CASE WHEN n.run_id IS NULL THEN '{sc.RUN_ID}'
             WHEN NOT r.rooted AND r.headless THEN 'the {sc.GEN_AI_OPERATION_NAME} of its run''s root'
             WHEN n.tool_name IS NULL THEN '{sc.GEN_AI_TOOL_NAME}' END AS missing
    FROM touched n SEMI JOIN file_keys k USING (trace_id, span_id)
    LEFT JOIN run_facts r USING (run_id)
)
SELECT place, count(*) AS spans,
       arg_min(struct_pack(name := name, span_id := span_id, trace_id := trace_id, missing := missing),
               (start_ns, span_id)) AS first
FROM placed GROUP BY place
"""
_CATCHES = f"""
SELECT count(*), count(*) FILTER (WHERE attributes['{sc.LOOP_TOOL}'] IS NULL OR attributes['{sc.LOOP_TOOL}'] = '')
FROM span_events SEMI JOIN file_keys USING (trace_id, span_id)
WHERE name = 'loop:detected'
"""


def _first_span(reason: UnplacedReason, first: dict[str, Any]) -> str:
    text = f"span {first['name']!r} ({first['span_id']}) of trace {first['trace_id']}"
    if reason != "missing attribute" or first["missing"] is None:
        return text
    return f"{text}, without {first['missing']}"


def _accounting(con: duckdb.DuckDBPyConnection) -> Accounting:
    """Where the spans of ``file_keys`` went, once they are placed (inside the transaction)."""
    places = {place: (int(n), first) for place, n, first in con.execute(_PLACES).fetchall()}
    caught, unnamed = con.execute(_CATCHES).fetchone() or (0, 0)
    tool_calls = places.get("tool call", (0, None))[0]
    return Accounting(
        runs=places.get("run", (0, None))[0],
        nodes=tool_calls + places.get("node", (0, None))[0],
        tool_calls=tool_calls,
        in_run=places.get("in run", (0, None))[0],
        loop_events=int(caught),
        unknown_tool_catches=int(unnamed),
        unplaced=tuple(
            Unplaced(reason, places[reason][0], _first_span(reason, places[reason][1]))
            for reason in UNPLACED_REASONS
            if reason in places
        ),
    )


def _load_chunk(
    con: duckdb.DuckDBPyConnection, capture: ForeignCapture, prepared: tuple[int, int]
) -> tuple[int, int, int]:
    """Inside the caller's transaction, after :func:`_prepare_staged` (whose counts are
    ``prepared``): insert the new spans, redact what was stored of them
    (:func:`_redact_foreign`) and drop the chunk's tables; returns (new, runs, duplicates)."""
    new, duplicates = prepared
    _insert_prepared(con)
    runs = _count(
        con, f"SELECT count(*) FROM spans s SEMI JOIN fresh f USING (trace_id, span_id) WHERE {_RUN_ROOT.format(s='s')}"
    )
    con.execute("INSERT INTO file_keys SELECT trace_id, span_id FROM fresh")
    _redact_foreign(con, capture)
    con.execute("DROP VIEW IF EXISTS fresh")
    con.execute("DROP TABLE IF EXISTS fresh_rows")
    con.execute("DROP TABLE IF EXISTS stored_keys")
    con.execute("DROP TABLE IF EXISTS placed_from")
    con.execute("DROP TABLE IF EXISTS stage")
    return new, runs, duplicates


def _load_chunks(
    con: duckdb.DuckDBPyConnection,
    sources: Sequence[Path],
    *,
    display: str,
    capture: CaptureMode,
    tell: _OnStep,
    limit_bytes: int,
) -> tuple[list[int], Accounting]:
    """Stage, prepare and load each chunk of ``sources`` (every :data:`CHUNK_BYTES`) in one
    transaction, then account for the new spans; returns ([spans, runs, duplicates], accounting).
    The first chunk is staged and prepared before the transaction begins (:func:`_prepare_staged`:
    the conventions' working tables are freed before its insert), and prepared again inside it
    when the store changed meanwhile (:func:`_still_prepared`)."""
    totals = [0, 0, 0]
    foreign = ForeignCapture(capture)  # its memo lives as long as the transaction
    done = 0
    size = max(sum(source.stat().st_size for source in sources), 1)
    threads = int(_count(con, "SELECT current_setting('threads')"))
    object_bytes = _object_bytes(sources)
    with scratch_folder("pieces") as tmp:
        chunks = _chunks(sources, Path(tmp), _piece_bytes(size, threads, limit_bytes))

        def next_chunk() -> tuple[int, int] | None:
            """Stage and prepare the next chunk (:func:`_prepare_staged`); None when none is left."""
            nonlocal done
            found = next(chunks, None)
            if found is None:
                return None
            pieces, chunk_bytes = found
            tell("staging", done / size, totals[0])
            _stage_chunk(con, pieces, display=display, object_bytes=object_bytes)
            done += chunk_bytes
            tell("placing", done / size, totals[0])
            return _prepare_staged(con)

        prepared = next_chunk()  # the first: before the transaction
        with _transaction(con):
            con.execute("CREATE OR REPLACE TEMP TABLE file_keys (trace_id VARCHAR, span_id VARCHAR)")
            if prepared is not None and not _still_prepared(con):
                prepared = _prepare_staged(con)
            while prepared is not None:
                totals = [t + v for t, v in zip(totals, _load_chunk(con, foreign, prepared), strict=True)]
                prepared = next_chunk()
            tell("accounting", 1.0, totals[0])
            accounting = _accounting(con)
            con.execute("DROP TABLE file_keys")
    return totals, accounting


def _load_jsonl(
    db: Path,
    sources: Sequence[Path],
    *,
    display: str,
    retries: int = 20,
    capture: CaptureMode = "redacted",
    on_step: _OnStep | None = None,
    bound_process: bool = False,
) -> tuple[int, int, int, Accounting]:
    """One transaction (:func:`_load_chunks`): stage (in pieces), validate, insert, finish (every
    :data:`CHUNK_BYTES`), account for the new spans. Returns (spans, runs, duplicates, accounting);
    raises :class:`_Refused` (after a rollback, if the transaction began) when DuckDB refuses to
    stage the file or the SQL check flags a span. ``bound_process``: :data:`MEMORY_LIMIT` bounds the
    whole process (DuckDB gets :func:`duckdb_share` of it), else DuckDB alone (an exporter or a
    flusher inside a process that holds much else)."""
    con = open_store(db, retries=retries)
    vacuum: int | None = None
    try:
        vacuum = int(_count(con, "SELECT current_setting('max_vacuum_tasks')"))
        con.execute("SET max_vacuum_tasks = 0")  # why: the note below this function
        limit, limit_bytes = MEMORY_LIMIT, settings.size_bytes(MEMORY_LIMIT)
        if bound_process:
            limit_bytes = duckdb_share(limit_bytes, _resident_bytes())
            limit = f"{limit_bytes // 2**20}MiB"
        con.execute(f"SET memory_limit = '{limit}'")
        con.execute("SET preserve_insertion_order = false")
        con.execute(MACROS)
        tell = on_step or (lambda step, share, spans: None)
        totals, accounting = _load_chunks(
            con, sources, display=display, capture=capture, tell=tell, limit_bytes=limit_bytes
        )
        if totals[0]:
            con.execute("CHECKPOINT")  # without DuckDB's vacuum: see below
        return totals[0], totals[1], totals[2], accounting
    except duckdb.Error as exc:
        raise StoreError(f"{display}: the store refused the data: {exc}", path=display) from exc
    finally:
        try:
            if vacuum is not None:
                con.execute(f"SET max_vacuum_tasks = {vacuum}")  # a setting of the process's database
        except duckdb.Error:
            pass  # a connection DuckDB broke: the error that broke it is the one to raise
        finally:
            con.close()


# An ingest's checkpoints run without DuckDB's vacuum (``max_vacuum_tasks = 0`` for its connection's
# database while it writes, then given back its value). A parallel insert writes each thread's row
# groups to the file as it goes, the last of each partial, and the checkpoint after it merged those
# by rewriting the table just written: 0.65 s of a 300k-span ingest of 6 s, and a store of 51 MB
# against 33 MB (BENCHMARKS.md, "Batched ingest"). The ingest checkpoints before it gives the
# setting back, as its close did when it was the store's last connection (the command's and the
# collector's flushes). The partial row groups stay, at most one a thread for each chunk inserted
# (small appends fill the last row group, as before); reads over them cost the same (``treellm
# report`` over those 300k spans: 2.17-2.25 s in 5 row groups, and in the 4 of a copy of the store).


# -- files of each format ---------------------------------------------------------------------------


def _overlong_line(path: Path, limit: int = MAX_LINE_BYTES) -> tuple[int, int] | None:
    """(1-based line number, length) of the first line longer than ``limit``, else None.

    A file of short lines costs a few lookups: mapped, every ``limit + 1`` bytes from a line's start
    must hold a newline, and the last one in that window (found searching back from its end, at
    once when lines are short) starts the next window. Only a file that fails is read line by line,
    to name the line.
    """
    return None if _lines_within(path, limit) else _first_overlong_line(path, limit)


def _lines_within(path: Path, limit: int) -> bool:
    """Whether no line of ``path`` is longer than ``limit`` (the windowed lookups of
    :func:`_overlong_line`, without naming the line)."""
    size = path.stat().st_size
    if size <= limit:
        return True
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        start = 0
        while size - start > limit:
            newline = mapped.rfind(b"\n", start, start + limit + 1)
            if newline < 0:
                return False
            start = newline + 1
    return True


def _first_overlong_line(path: Path, limit: int) -> tuple[int, int] | None:
    """:func:`_overlong_line` read line by line: ``bytes.find`` (memchr) over 64 MiB chunks."""
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
    capture: Capture | CaptureMode | None = None,
    on_step: _OnStep | None = None,
    bound_process: bool = False,
) -> FileReport:
    """Ingest one file in one transaction (see the module docstring).

    ``retries`` bounds the waits for a busy store before :class:`StoreBusyError`. ``capture``
    decides what is stored of other frameworks' spans: this argument, else
    ``configure(capture=...)``, else ``TREELLM_CAPTURE``, else ``redacted``
    (:func:`~treellm.telemetry.redaction.resolve_capture`). ``on_step(step, share, spans)`` is
    told each step, the share of the file done and the new spans placed so far.
    ``bound_process``: ``TREELLM_INGEST_MEMORY_LIMIT`` bounds this whole process (a command of
    its own, as ``treellm ingest`` is): DuckDB gets what the process does not hold already, less
    :data:`PYTHON_RESERVE_BYTES` (:func:`duckdb_share`); else the limit is DuckDB's alone.
    """
    mode = resolve_capture(capture).mode
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
    with scratch_folder("ingest") as tmp:
        folder = Path(tmp)
        skipped = 0
        bad: list[BadRecord] = []
        warnings: list[str] = []
        if fmt == "otlp-jsonl":
            overlong = _overlong_line(source)
            if overlong is not None and not skip_bad:
                line, length = overlong
                raise IngestError(_too_long(length), path=display, line=line)
            if overlong is None:  # read in place; the one validator decides only when DuckDB or the SQL check balks
                jsonl = source
                if _torn_tail(source):
                    jsonl = folder / "complete.jsonl"
                    copy_without_torn_tail(source, jsonl)
                    skipped = 1
                try:
                    spans, runs, duplicates, accounting = _load_jsonl(
                        Path(db), [jsonl], display=display, retries=retries, capture=mode, on_step=on_step,
                        bound_process=bound_process,
                    )  # fmt: skip
                except _Refused:
                    pass
                else:
                    return FileReport(
                        display, fmt, spans, runs, duplicates, skipped,
                        warnings=accounting_warnings(display, accounting), accounting=accounting,
                    )  # fmt: skip
            jsonl, skipped, bad = _canonical_copy(source, folder, keep_bad=skip_bad, display=display)
        else:
            jsonl = folder / "converted.jsonl"
            if on_step is not None:
                on_step("converting", 0.0, 0)
            bad, warnings = _convert(source, fmt, jsonl, skip_bad=skip_bad, display=display)
        if jsonl.stat().st_size == 0:
            empty = not bad and not skipped
            return FileReport(display, fmt, 0, 0, 0, skipped, empty=empty, bad=tuple(bad), warnings=tuple(warnings))
        try:
            spans, runs, duplicates, accounting = _load_jsonl(
                Path(db), [jsonl], display=display, retries=retries, capture=mode, on_step=on_step,
                bound_process=bound_process,
            )  # fmt: skip
        except _Refused as exc:
            raise IngestError(f"DuckDB refused the file: {exc}", path=display) from exc
    warnings.extend(accounting_warnings(display, accounting))
    return FileReport(
        display, fmt, spans, runs, duplicates, skipped, bad=tuple(bad), warnings=tuple(warnings), accounting=accounting
    )


def ingest_segments(
    db: str | os.PathLike[str],
    paths: Sequence[str | os.PathLike[str]],
    *,
    retries: int = 20,
    capture: Capture | CaptureMode | None = None,
) -> FileReport:
    """Ingest several OTLP JSON-lines files (the journal's closed segments) in one transaction,
    with one ``read_json`` over them as they are (no copy of a file that fits a piece): what
    :func:`ingest_file` does for each, at the cost of one. Raises :class:`IngestError` when a file
    has an overlong line or a torn tail, or DuckDB or the SQL check balks at a span: the caller
    then ingests each file with :func:`ingest_file`, which decides per line (nothing was stored)."""
    sources = [Path(path) for path in paths]
    display = str(sources[0]) if len(sources) == 1 else f"{sources[0]} and {len(sources) - 1} more file(s)"
    for source in sources:
        if not source.is_file():
            raise IngestError("no such file", path=str(source))
        if source.stat().st_size and (_overlong_line(source) is not None or _torn_tail(source)):
            raise IngestError("a line too long or a torn last line: ingested file by file", path=str(source))
    try:
        spans, runs, duplicates, accounting = _load_jsonl(
            Path(db), sources, display=display, retries=retries, capture=resolve_capture(capture).mode
        )
    except _Refused as exc:
        raise IngestError(f"DuckDB refused the files: {exc}", path=display) from exc
    return FileReport(
        display, "otlp-jsonl", spans, runs, duplicates, 0,
        empty=not any(source.stat().st_size for source in sources),
        warnings=accounting_warnings(display, accounting), accounting=accounting,
    )  # fmt: skip


LINE_SPANS = 1000
"""A converted record with more spans than this is written as several OTLP lines of at most this
many spans each (the same spans, resource and scope): a long run (a trajectory of 20,000 calls is
one trace) would otherwise be one line of tens of MB, which DuckDB parses whole, outside the
pieces that bound its memory."""


def split_traces_data(traces_data: Mapping[str, Any], limit: int = LINE_SPANS) -> Iterator[Mapping[str, Any]]:
    """``traces_data`` as consecutive ``TracesData`` of at most ``limit`` spans each, every one with
    its resource's and scope's fields (pure). A document of at most ``limit`` spans (none included)
    is yielded as it is."""
    resource_spans = traces_data.get("resourceSpans") or []
    total = sum(len(ss.get("spans") or []) for rs in resource_spans for ss in rs.get("scopeSpans") or [])
    if total <= limit:
        yield traces_data
        return
    for rs in resource_spans:
        resource = {k: v for k, v in rs.items() if k != "scopeSpans"}
        for ss in rs.get("scopeSpans") or []:
            scope = {k: v for k, v in ss.items() if k != "spans"}
            spans = ss.get("spans") or []
            for start in range(0, len(spans), limit):
                part = {**scope, "spans": spans[start : start + limit]}
                yield {"resourceSpans": [{**resource, "scopeSpans": [part]}]}


def _convert(
    source: Path, fmt: str, target: Path, *, skip_bad: bool, display: str
) -> tuple[list[BadRecord], list[str]]:
    """Write the records of ``source`` (a format other than OTLP JSON lines) to ``target`` as OTLP
    JSON lines (a long record split, :func:`split_traces_data`); returns (bad records, warnings).
    Its own function, so that no record outlives the conversion while the store loads the file."""
    bad: list[BadRecord] = []
    warnings: list[str] = []
    found: list[CallsNotFound] = []
    with target.open("wb") as out:
        for record in iter_records(source, fmt):
            if isinstance(record, IngestError):
                if not skip_bad:
                    raise record
                bad.append(BadRecord(display, record.line, record.record, record.reason))
            else:
                for part in split_traces_data(record.traces_data):
                    out.write(json_line(part))
                warnings.extend(f"{display}: {w}" for w in record.warnings)
                found.extend(record.calls_not_found)
    warnings.extend(f"{display}: {w}" for w in calls_not_found_warnings(found))
    return bad, warnings


TRACE_SUFFIXES = frozenset({".jsonl", ".ndjson", ".json", ".pb", ".binpb", ".proto", ".otlp", ".traj"})


def _expand(paths: Sequence[str | os.PathLike[str]]) -> tuple[list[Path], list[Path]]:
    """(files to ingest, files skipped). Files named are taken as they are; folders are walked
    for trace files (by suffix: .jsonl .ndjson .json .pb .binpb .proto .otlp .traj), so a README
    beside them is left alone, and listed as skipped. Hidden files, and files in hidden folders
    (``.git``), are neither read nor listed."""
    out: list[Path] = []
    skipped: list[Path] = []
    for p in paths:
        path = Path(p)
        if not path.is_dir():
            out.append(path)
            continue
        for f in sorted(path.rglob("*")):
            if not f.is_file() or f.name.startswith("."):
                continue
            if f.suffix.lower() in TRACE_SUFFIXES:
                out.append(f)
            elif not any(part.startswith(".") for part in f.relative_to(path).parts):
                skipped.append(f)
    return out, skipped


def ingest(
    store: str | os.PathLike[str],
    paths: Sequence[str | os.PathLike[str]],
    input_format: InputFormatChoice = "auto",
    *,
    skip_bad: bool = False,
    progress: Callable[[IngestProgress], None] | None = None,
    capture: Capture | CaptureMode | None = None,
    bound_process: bool = False,
) -> IngestReport:
    """Ingest files (folders are walked) into the store at ``store``, one transaction each.

    Without ``skip_bad`` the first bad file raises :class:`IngestError`; the files
    before it stay ingested (each was its own transaction). ``progress`` is told where the
    ingest is (:class:`IngestProgress`) at each step of each file, and once at the end (step
    ``done``, every byte done). ``capture`` and ``bound_process``: as :func:`ingest_file`.
    """
    capture = resolve_capture(capture)
    files, skipped_files = _expand(paths)
    sizes = [f.stat().st_size if f.is_file() else 0 for f in files]
    total = sum(sizes)
    reports: list[FileReport] = []
    before = spans = 0
    for index, file in enumerate(files):
        on_step: _OnStep | None = None
        if progress is not None:

            def on_step(
                step: Step, share: float, placed: int,
                *, i: int = index, offset: int = before, committed: int = spans, tell: Any = progress,
            ) -> None:  # fmt: skip
                done = offset + min(sizes[i], int(sizes[i] * share))
                tell(IngestProgress(i, len(files), done, total, committed + placed, str(files[i]), step))

            on_step("reading", 0.0, 0)
        report = ingest_file(
            store, file, input_format, skip_bad=skip_bad, capture=capture, on_step=on_step, bound_process=bound_process
        )
        reports.append(report)
        before += sizes[index]
        spans += reports[-1].spans
    if progress is not None:
        progress(IngestProgress(len(files), len(files), total, total, spans, "", "done"))
    return IngestReport(
        files=len(files),
        spans=sum(r.spans for r in reports),
        runs=sum(r.runs for r in reports),
        skipped=sum(r.skipped for r in reports),
        duplicates=sum(r.duplicates for r in reports),
        empty_files=tuple(r.path for r in reports if r.empty),
        bad_records=tuple(b for r in reports for b in r.bad),
        details=tuple(reports),
        skipped_files=tuple(str(f) for f in skipped_files),
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
