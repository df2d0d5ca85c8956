"""The placement of other frameworks' spans: conventions, runs, trees and ordinals, inside an ingest.

Contract: no function commits, and each raises whatever DuckDB raises; only
:func:`update_stored` writes the store, inside the caller's transaction. Before the insert,
:func:`read_foreign` reads the temporary view ``fresh`` (the spans an ingest is about to insert)
and leaves what :mod:`treellm.telemetry.conventions` says of them in ``foreign_answers`` (the
insert's :data:`FOREIGN_COLUMNS`); then :func:`place_foreign` reads the view ``incoming`` (those
rows as they will be stored) and the stored rows of their traces, and leaves the placement by
:mod:`treellm.derive.trees` in ``foreign_placed``: the new rows' for the insert
(:data:`PLACED_COLUMNS`), the stored rows' for :func:`update_stored`, which writes those that
changed. The two may run before the ingest's transaction begins (their working tables are freed
then), with :data:`PLACED_FROM` to tell whether the stored rows they read changed meanwhile. So
a new row is written once, placed: an UPDATE of every new row after its insert cost more than
the placement itself, most of it in the commit (BENCHMARKS.md, "Batched ingest"). :func:`finish_foreign` drops
the working tables after the insert. The rules are theirs; this module only moves data, so that
the work done in Python is as small as the rules allow:

- The conventions are read once per distinct key, never per span: DuckDB splits each span's
  inputs into the role's (the values of ``ROLE_KEYS``, a presence bit per ``MARKER_KEYS`` key
  and ``PRESENCE_PREFIXES`` prefix, the name's first ``NAME_PREFIXES`` match), the tool name's,
  the arguments' and the result's text, and takes the first call id, model and agent name in
  SQL; Python answers each distinct key (``role_of``, ``tool_name_of``, ``arguments_of``,
  ``result_of``: the rules of ``read_span``), and the signature and result hash per distinct
  value; the answers go back as tables joined in SQL.
- The rows the trees read are read once (``place_rows``) and placed a batch of whole traces
  (about :data:`_PLACE_SPANS` spans) at a time, with Python's cycle collector paused; their
  answer goes back in bounded frames; a call's earlier identical calls are views of one list per
  key (:class:`treellm.derive.trees.EarlierIds`), never a tuple per call, and each call stores its
  chain (``repeat_chain``) and at most :data:`EARLIER_KEPT` of them.
- Whole traces are placed again whenever one of their spans arrives, so spans stored
  before their run's root (a batch exporter sends children first) move to that run.
- A placement again never reads what the redaction rewrote: when a counted call is first
  keyed from its raw arguments (those that arrived in this transaction, or its parent's, see
  below) its key is stored as ``call_digest`` (the SHA-256 hex of the tool name, a NUL and
  the canonical argument text: never the 32-bit signature) and its targets as
  ``call_targets`` (compact JSON ``{"reads", "writes", "changes_state"}``, as the default
  rule judged them then; whether the call failed is read from its stored status); a later
  placement keys the call on those (``CallKey(tool, digest)``: keys only need equality) and
  derives a key from the stored arguments only for a call that has none (stores from before
  migration 0007). Each target path is stored as a digest of each of its components (``/``,
  ``.`` and ``..`` kept): :func:`treellm.shell.paths_overlap` only compares whole components
  for equality, so every overlap answer stays as on the raw paths, while nothing readable of
  a path is stored (this module does not know the capture mode, and ``none`` stores hashes
  only). The digest of the key, like the signature and the result hash, can confirm a
  guessed argument text, never reveal it. A call stored with a key is keyed again only by a
  parent that records it and arrives later (a bare LangChain value whose ``tools`` node
  comes in the next flush); a call that arrives after such a parent was stored takes its
  arguments from what was stored (redacted) of that parent.
- Only columns cross into Python (Arrow), never rows of maps; the placement's answer goes
  back as columns too.
"""

from __future__ import annotations

import ast
import functools
import gc
import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

import duckdb
import numpy as np
import orjson

from treellm import settings
from treellm.derive import trees_sql
from treellm.derive.transform import attribute_result_sql
from treellm.derive.trees import Placement, SpanFacts, place_traces
from treellm.engine import repeats
from treellm.engine.tools import result_hash
from treellm.loop import CallKey, Paths
from treellm.signature import RawArguments, canonical_json, hash_text, parse_arguments, signature
from treellm.telemetry import conventions

__all__ = [
    "DEFAULT_INTERNAL",
    "EARLIER_KEPT",
    "FOREIGN_COLUMNS",
    "PLACED_COLUMNS",
    "PLACED_FROM",
    "PLACED_JOINS",
    "Columns",
    "columns",
    "finish_foreign",
    "frames_as_tables",
    "internal_tools",
    "place_foreign",
    "read_foreign",
    "result_read_sql",
    "streamed_batches",
    "streamed_rows",
    "update_stored",
]

DEFAULT_INTERNAL = frozenset(conventions.DEFAULT_INTERNAL_TOOLS)
_DEFAULT_RULE = repeats.ToolRule()
"""Other frameworks' calls are judged by the default rule: the shell classifier for shell
tools, the default failure patterns on results (``docs/architecture.md``)."""
_ROLES = {operation: role for role, operation in trees_sql.ROLE_OPERATIONS.items()}
_OPERATION_OF_ROLE = " ".join(
    f"WHEN '{role}' THEN '{operation}'" for role, operation in trees_sql.ROLE_OPERATIONS.items()
)
_CAUGHT = "loop:detected"


def internal_tools() -> frozenset[str]:
    """Framework-internal tool names: ``TREELLM_INTERNAL_TOOLS`` (comma-separated; empty for
    none) else :data:`treellm.telemetry.conventions.DEFAULT_INTERNAL_TOOLS`."""
    names = settings.get(settings.TREELLM_INTERNAL_TOOLS)
    return DEFAULT_INTERNAL if names is None else frozenset(names)


def arguments_value(text: str) -> Any:
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


@functools.lru_cache(maxsize=65_536)
def _canonical(arguments: str) -> tuple[Any, str]:
    """(the parsed value, its canonical text) of recorded argument text (pure, memoised:
    an agent's repeats and a trace placed again reuse them)."""
    value = arguments_value(arguments)
    return value, canonical_json(value)


@functools.lru_cache(maxsize=65_536)
def _signature(tool: str, arguments: str) -> str:
    return f"{tool}:{hash_text(_canonical(arguments)[1])}"


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@functools.lru_cache(maxsize=65_536)
def _path_digest(path: str) -> str:
    """``path`` with each component replaced by 16 hex digits of its SHA-256 (``/``, ``.`` and
    ``..`` kept): :func:`treellm.shell.paths_overlap` gives the same answer on the digests."""
    return "/".join(part if part in ("", ".", "..") else _sha256(part)[:16] for part in path.split("/"))


def _paths_json(paths: Paths) -> list[str] | None:
    return None if paths is None else sorted(_path_digest(path) for path in paths)


@functools.lru_cache(maxsize=65_536)
def _stored_key(tool: str, arguments: str) -> tuple[str, str]:
    """(``call_digest``, ``call_targets``) of a call of ``tool`` with the argument text
    ``arguments``, as stored (see the module docstring; pure, memoised)."""
    value, text = _canonical(arguments)
    found = repeats.call_targets(_DEFAULT_RULE, tool, value)
    targets = {"reads": _paths_json(found.reads), "writes": _paths_json(found.writes),
               "changes_state": found.changes_state}  # fmt: skip
    return _sha256(f"{tool}\x00{text}"), orjson.dumps(targets).decode()


@functools.lru_cache(maxsize=65_536)
def _targets(stored: str) -> repeats.CallTargets:
    """The targets of a call from its ``call_targets`` (paths as digests)."""
    found = orjson.loads(stored)
    reads, writes = found["reads"], found["writes"]
    return repeats.CallTargets(
        None if reads is None else frozenset(reads), None if writes is None else frozenset(writes),
        bool(found["changes_state"]),
    )  # fmt: skip


# -- conventions: what each new span says ---------------------------------------------------------


def _sql_list(items: Sequence[str]) -> str:
    return "[" + ", ".join("'" + item.replace("'", "''") + "'" for item in items) + "]"


def _value(key: str) -> str:
    """The attribute ``key`` of the span ``f``, or for a pseudo key of ``conventions.EVENT_SOURCES``
    the attribute of its first event of that name that has it (``conventions.event_attributes``)."""
    source = conventions.EVENT_SOURCES.get(key)
    if source is None:
        return f"f.attributes[{_sql_list([key])[1:-1]}]"
    event, attribute = (_sql_list([part])[1:-1] for part in source)
    holds = f"list_contains(list_transform(e.attributes, lambda a: a.key), {attribute})"
    return (
        f"(CASE WHEN len(f.events) > 0 THEN treellm_attrs(list_filter(f.events, lambda e: e.name = {event} "
        f"AND {holds})[1].attributes)[{attribute}] END)"
    )


def _first_value(keys: Sequence[str]) -> str:
    """The first non-empty value of ``keys`` (``conventions._first``) in SQL."""
    return "coalesce(" + ", ".join(f"nullif({_value(key)}, '')" for key in keys) + ")"


def _has(key: str) -> str:
    return f"map_contains(f.attributes, {_sql_list([key])[1:-1]})"


_PRESENCE_BITS = " + ".join(
    [f"(CASE WHEN {_has(key)} THEN {1 << bit} ELSE 0 END)" for bit, key in enumerate(conventions.MARKER_KEYS)]
    + [
        f"(CASE WHEN len(list_filter(map_keys(f.attributes), lambda k: starts_with(k, '{prefix}'))) > 0 "
        f"THEN {1 << (len(conventions.MARKER_KEYS) + bit)} ELSE 0 END)"
        for bit, prefix in enumerate(conventions.PRESENCE_PREFIXES)
    ]
)
_NAME_CLASS = (
    "CASE "
    + " ".join(f"WHEN starts_with(f.name, '{p}') THEN '{p}'" for p in conventions.NAME_PREFIXES)
    + " ELSE '' END"
)
_TRACELOOP_NAME = conventions.TRACELOOP_NAME
_FOREIGN_INPUT = f"""
CREATE OR REPLACE TEMP TABLE foreign_in AS
SELECT f.stage_row, f.trace_id,
       coalesce(f.status_code, 0) = 2 OR coalesce(f.exception, false) AS hard_failed,
       coalesce(f.caught, false) AS caught,
       CAST(to_json(struct_pack(v := [{", ".join(_value(k) for k in conventions.ROLE_KEYS)}],
                                m := {_PRESENCE_BITS}, n := {_NAME_CLASS})) AS VARCHAR) AS role_key,
       CAST(to_json(struct_pack(v := [{", ".join(_value(k) for k in conventions.TOOL_NAME_KEYS)}],
                                h := {_has(_TRACELOOP_NAME)}, t := {_value(_TRACELOOP_NAME)},
                                n := CASE WHEN {_first_value(conventions.TOOL_NAME_KEYS)} IS NULL
                                          AND NOT {_has(_TRACELOOP_NAME)} THEN f.name END)) AS VARCHAR) AS tool_key,
       CAST(to_json([{", ".join(_value(k) for k in conventions.ARGUMENT_KEYS)}]) AS VARCHAR) AS args_key,
       coalesce({", ".join(_value(k) for k in conventions.RESULT_KEYS)}) AS result_text,
       result_text IS NOT DISTINCT FROM {attribute_result_sql("f")} AS result_held,
       {_first_value(conventions.CALL_ID_KEYS)} AS call_first,
       {_first_value(conventions.MODEL_KEYS)} AS model_first,
       {_first_value(conventions.AGENT_NAME_KEYS)} AS agent_first
FROM (
    SELECT *,
           len(list_filter(events, lambda e: e.name = '{conventions.EXCEPTION_EVENT}')) > 0 AS exception,
           len(list_filter(events, lambda e: e.name = '{_CAUGHT}'
               AND coalesce(treellm_attrs(e.attributes)['treellm.loop.shadow'], '') <> 'true')) > 0 AS caught
    FROM fresh WHERE run_id IS NULL AND node_kind IS NULL
) f
"""
"""Per new span of another framework, only what :func:`conventions.read_span` reads, as keys of
its parts: the role's inputs (``role_key``: the values of ``ROLE_KEYS``, a presence bit per
``MARKER_KEYS`` key and ``PRESENCE_PREFIXES`` prefix, the name's first ``NAME_PREFIXES`` match),
the tool name's, the arguments' (``ARGUMENT_KEYS`` in order), the result's text, and the first
call id, model and agent name. Each distinct key is read once in Python (:func:`_read_foreign`)."""
_BOOLEAN = frozenset({"internal", "failed", "orphan", "result_failed", "summary"})
_INTEGER = frozenset({"node_depth", "ordinal"})


Columns = dict[str, tuple[str, np.ndarray]]
"""Columns for DuckDB to scan: name -> (SQL type, values). See :func:`columns`."""


@contextmanager
def frames_as_tables(con: duckdb.DuckDBPyConnection, **frames: Columns) -> Iterator[None]:
    """Each set of :func:`columns` as a temporary table of its name for the block, of its columns'
    types, its rows copied in by one scan of the arrays: DuckDB reads a dict of NumPy arrays by its
    variable's name, looked up the Python stack, for the statement only. Never ``register``: a
    transaction keeps the registered object alive until it ends, even once unregistered (it keeps
    the dropped view for a rollback), and an ingest of a 1 GB file held hundreds of MB so
    (BENCHMARKS.md, "Ingest memory"). No pandas: the ingest command imports none (0.16-0.35 s, and
    68 MB resident before DuckDB gets its share). The tables are not dropped when the block raises:
    after a DuckDB error the transaction is aborted, and a DROP would hide that error behind
    "Current transaction is aborted" (the rollback drops them)."""
    con.execute("SET python_scan_all_frames = true")  # found by name through a caller's wrapper of ``con`` too
    # (this connection's own setting; left set only when an insert fails, and the transaction with it)
    for name, typed in frames.items():
        declared = ", ".join(f'"{column}" {kind}' for column, (kind, _) in typed.items())
        con.execute(f"CREATE OR REPLACE TEMP TABLE {name} ({declared})")
        treellm_scanned = {column: values for column, (_, values) in typed.items()}  # read by its name below
        con.execute(f"INSERT INTO {name} SELECT * FROM treellm_scanned")
        del treellm_scanned
    con.execute("RESET python_scan_all_frames")
    yield
    for name in frames:
        con.execute(f"DROP TABLE IF EXISTS {name}")


def streamed_batches(con: duckdb.DuckDBPyConnection, sql: str, rows: int = 10_000) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of ``sql``, fetched ``rows`` at a time, for a loop that runs no other statement on
    ``con`` meanwhile: the distinct texts of a chunk (results, values to redact) are mostly each
    different, and all of them at once held a hundred MB and more in Python."""
    cursor = con.execute(sql)
    while batch := cursor.fetchmany(rows):
        yield batch


def streamed_rows(con: duckdb.DuckDBPyConnection, sql: str, rows: int = 10_000) -> Iterator[tuple[Any, ...]]:
    """The rows of :func:`streamed_batches`, one at a time."""
    for batch in streamed_batches(con, sql, rows):
        yield from batch


def _contains_any(value: str, texts: Iterable[str]) -> str:
    return " OR ".join(f"contains({value}, {_sql_list([text])[1:-1]})" for text in texts)


_RE2_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r", " ": " "}


def _re2_class(characters: Iterable[str]) -> str:
    """An RE2 character class of ``characters``, each escaped."""
    return "[" + "".join(_RE2_ESCAPES.get(c, c if c.isalnum() else "\\" + c) for c in sorted(characters)) + "]"


_NUMBER_STARTS = frozenset("-0123456789")
"""The characters of :data:`conventions.JSON_STARTS` that start a number, the rest an object, an
array or a string: a JSON text that starts with a number (or a literal) is nothing else."""
_SPACE = _re2_class(conventions.JSON_SPACE)
_MAY_BE_LITERAL = (
    f"^(?:{_SPACE}*(?:{_re2_class(conventions.JSON_STARTS - _NUMBER_STARTS)}|"
    f"(?:{_re2_class(_NUMBER_STARTS)}[-+.0-9Ee]*|{'|'.join(conventions.JSON_LITERALS)}){_SPACE}*$)"
    f"|{_re2_class(conventions.PYTHON_LITERAL_STARTS)})"
)
"""RE2: a text that may be JSON (an object, an array or a string after :data:`conventions.JSON_SPACE`,
or nothing but a number or a JSON literal) or a Python literal
(:data:`conventions.PYTHON_LITERAL_STARTS` first)."""


def result_read_sql(value: str) -> str:
    """SQL, true for every result text (the expression ``value``) that Python must read: one that
    :func:`conventions.unwrap_result` may not give back as it is, without a call id (a text that may
    be JSON or a Python literal, an empty one, a LangChain ``repr`` with a call id), or that the
    default failure rule may match (:data:`repeats.DEFAULT_ERROR_NEEDS`). Any other text is its own
    result and no failure: of the 193,931 distinct prose results of BENCHMARKS.md's batched file,
    Python only hashes them (unwrapping them and the failure rule cost 0.8 s more)."""
    return (
        f"({value} = '' OR regexp_matches({value}, {_sql_list([_MAY_BE_LITERAL])[1:-1]}) OR "
        f"{_contains_any(value, (conventions.LANGCHAIN_CALL_ID, *repeats.DEFAULT_ERROR_NEEDS))})"
    )


_NUMPY_TYPES = {"b": "BOOLEAN", "i": "BIGINT", "u": "UBIGINT", "f": "DOUBLE"}


def columns(values: dict[str, Any]) -> Columns:
    """Columns typed explicitly by name (no inference over Python objects): lists become nullable
    booleans (:data:`_BOOLEAN`), nullable integers (:data:`_INTEGER`) or text; NumPy arrays of
    numbers or booleans keep their type."""
    typed: Columns = {}
    for name, column in values.items():
        if isinstance(column, np.ndarray) and column.dtype.kind in _NUMPY_TYPES:
            typed[name] = (_NUMPY_TYPES[column.dtype.kind], column)
            continue
        kind = "BOOLEAN" if name in _BOOLEAN else "INTEGER" if name in _INTEGER else "VARCHAR"
        typed[name] = (kind, np.fromiter(column, dtype=object, count=len(column)))
    return typed


_TOOL_ROWS = "FROM foreign_in i JOIN foreign_roles r USING (role_key) WHERE r.role = 'tool' AND NOT i.caught"
_FOREIGN_ANSWERS = f"""
CREATE OR REPLACE TEMP TABLE foreign_answers AS
    WITH x AS (
        SELECT i.*, r.family,
               CASE WHEN r.role = 'tool' AND (i.caught OR coalesce(s.summary, false)) THEN 'other'
                    ELSE r.role END AS role
        FROM foreign_in i JOIN foreign_roles r USING (role_key)
        LEFT JOIN foreign_tools s ON r.role = 'tool' AND s.tool_key = i.tool_key
    )
    SELECT x.stage_row, x.trace_id, coalesce(x.family, 'otel') AS convention,
           CASE x.role {_OPERATION_OF_ROLE} END AS operation,
           t.tool_name,
           CASE WHEN x.role = 'tool' THEN coalesce(x.call_first, o.envelope_id, a.argument_id) END AS tool_call_id,
           a.arguments, CASE WHEN o.result IS NOT NULL THEN o.result WHEN NOT x.result_held THEN rt.result_text END
               AS result, g.signature,
           CASE WHEN t.tool_name <> '' THEN o.result_hash END AS result_hash,
           CASE WHEN x.role = 'llm' THEN x.model_first END AS model,
           CASE WHEN x.role = 'agent' THEN x.agent_first END AS agent_name,
           t.internal,
           x.hard_failed OR coalesce(o.result_failed, false) AS failed
    FROM x
    LEFT JOIN foreign_tools t ON x.role = 'tool' AND t.tool_key = x.tool_key
    LEFT JOIN foreign_args a ON x.role = 'tool' AND a.args_key = x.args_key
    LEFT JOIN foreign_result_texts rt ON x.role = 'tool' AND rt.result_text = x.result_text
    LEFT JOIN foreign_results o ON o.result_id = rt.result_id
    LEFT JOIN foreign_signatures g ON g.tool = t.tool_name AND g.arguments = a.arguments
"""
"""What the conventions say of each new span of another framework, joined from the answers for
each distinct key (as :func:`conventions.read_span` would say it of the span: a call that LoopGuard
caught is a span of role ``other``, its event says it did not run; so is a summary span). A call
whose arguments are unknown has no signature: it equals no other call."""

_ANSWERED = ("convention", "operation", "tool_name", "tool_call_id", "arguments", "result", "signature",
             "result_hash", "internal")  # fmt: skip
FOREIGN_COLUMNS: Final[dict[str, str]] = {
    **{column: f"CASE WHEN u.stage_row IS NULL THEN f.{column} ELSE u.{column} END" for column in _ANSWERED},
    "model": "coalesce(f.model, u.model)",
    "agent_name": "coalesce(f.agent_name, u.agent_name)",
    "node_status": "CASE WHEN u.stage_row IS NULL THEN f.node_status "
    "WHEN u.failed AND u.operation = 'execute_tool' THEN 'failed' END",
}
"""The span columns that the conventions' answers decide: SQL over the new row ``f`` and its answer
``u`` (``foreign_answers``, joined on nothing but ``stage_row``: the row of the stage it answers,
one integer where the span's two keys were text), for the insert of the new spans
(:mod:`treellm.store.ingest`). A call's result is NULL in
the answers where its text is the attribute it was read from and its own result (``result_held``
of ``foreign_in``, and nothing unwrapped): the attribute holds it (read back by
``transform.result_sql``), and no copy of each result is held until the insert."""


def _role_stub(key: str) -> tuple[str, dict[str, Any]]:
    """(name, attributes) that :func:`conventions.role_of` answers for a ``role_key`` as for its spans."""
    found = orjson.loads(key)
    stub: dict[str, Any] = {}
    markers = len(conventions.MARKER_KEYS)
    for bit, marker in enumerate(conventions.MARKER_KEYS):
        if found["m"] >> bit & 1:
            stub[marker] = None  # present; the value, when the role reads it, comes next
    for bit, prefix in enumerate(conventions.PRESENCE_PREFIXES):
        if found["m"] >> (markers + bit) & 1:
            stub.setdefault(prefix, "")
    for name, value in zip(conventions.ROLE_KEYS, found["v"], strict=True):
        if value is not None:
            stub[name] = value
    return found["n"], stub


def _tool_name(key: str) -> str | None:
    found = orjson.loads(key)
    stub: dict[str, Any] = dict(zip(conventions.TOOL_NAME_KEYS, found["v"], strict=True))
    if found["h"]:
        stub[conventions.TRACELOOP_NAME] = found["t"]
    return conventions.tool_name_of(found["n"] or "", stub)


def _read_foreign(con: duckdb.DuckDBPyConnection, internal: frozenset[str]) -> bool:
    """Read the new spans of other frameworks through their conventions and write what they
    say; returns whether there were any (their traces are in ``foreign_in``). Each distinct key
    (``_FOREIGN_INPUT``) crosses into Python once; the answers come back as tables joined in SQL."""
    con.execute(_FOREIGN_INPUT)
    role_keys = [key for (key,) in con.execute("SELECT DISTINCT role_key FROM foreign_in").fetchall()]
    if not role_keys:
        return False
    answers = [conventions.role_of(*_role_stub(key)) for key in role_keys]
    roles = columns({"role_key": role_keys, "role": [r for r, _ in answers], "family": [f for _, f in answers]})
    with frames_as_tables(con, foreign_roles=roles):
        _read_calls(con, internal)
    return True


def _read_calls(con: duckdb.DuckDBPyConnection, internal: frozenset[str]) -> None:
    """The tool name, arguments, result and signature of each distinct key of the new tool spans
    (``foreign_roles`` registered), and the update of every new span (:data:`_FOREIGN_UPDATE`)."""
    tool_keys = [key for (key,) in con.execute(f"SELECT DISTINCT i.tool_key {_TOOL_ROWS}").fetchall()]
    names = [_tool_name(key) for key in tool_keys]
    tools = columns(
        {
            "tool_key": tool_keys,
            "tool_name": names,
            "internal": [n in internal if n else None for n in names],
            "summary": [n in conventions.SUMMARY_TOOLS for n in names],
        }
    )
    args_keys = [key for (key,) in con.execute(f"SELECT DISTINCT i.args_key {_TOOL_ROWS}").fetchall()]
    read = [conventions.arguments_of(tuple(orjson.loads(key))) for key in args_keys]
    args = columns({"args_key": args_keys, "arguments": [a for a, _ in read], "argument_id": [i for _, i in read]})
    con.execute(
        "CREATE OR REPLACE TEMP TABLE foreign_result_texts AS "
        f"SELECT row_number() OVER () AS result_id, result_text, {result_read_sql('result_text')} AS read "
        f"FROM (SELECT DISTINCT i.result_text {_TOOL_ROWS} AND i.result_text IS NOT NULL)"
    )
    ids: list[int] = []
    hashes: list[str] = []
    for batch in streamed_batches(con, "SELECT result_id, result_text FROM foreign_result_texts WHERE NOT read"):
        ids += [result_id for result_id, _ in batch]  # the text is the result: no envelope, no failure
        hashes += [result_hash(text) for _, text in batch]
    plain = len(ids)
    unwrapped: list[str | None] = [None] * plain  # None: the text itself, not held twice
    envelopes: list[str | None] = [None] * plain
    failed: list[bool] = [False] * plain
    for result_id, text in streamed_rows(con, "SELECT result_id, result_text FROM foreign_result_texts WHERE read"):
        result, envelope = conventions.unwrap_result(text)
        ids.append(result_id)
        unwrapped.append(None if result == text else result)
        envelopes.append(str(envelope) if envelope else None)
        failed.append(repeats.is_failure(_DEFAULT_RULE, result))
        hashes.append(result_hash(result))
    results = columns(
        {
            "result_id": np.array(ids, dtype=np.int64),
            "result": unwrapped,
            "envelope_id": envelopes,
            "result_failed": np.array(failed, dtype=bool),
            "result_hash": hashes,
        }
    )
    with frames_as_tables(con, foreign_tools=tools, foreign_args=args, foreign_results=results):
        pairs = con.execute(
            f"SELECT DISTINCT t.tool_name, a.arguments "
            f"FROM (SELECT DISTINCT i.tool_key, i.args_key {_TOOL_ROWS}) i "
            "JOIN foreign_tools t USING (tool_key) JOIN foreign_args a USING (args_key) "
            "WHERE t.tool_name <> '' AND a.arguments IS NOT NULL"
        ).fetchall()
        signatures = columns(
            {
                "tool": [t for t, _ in pairs],
                "arguments": [a for _, a in pairs],
                "signature": [_signature(t, a) for t, a in pairs],
            }
        )
        with frames_as_tables(con, foreign_signatures=signatures):
            con.execute(_FOREIGN_ANSWERS)


# -- runs, trees and ordinals of the traces those spans belong to -------------------------------------

# ``new``: the span arrived in this transaction (every placed span has a run; the new spans of
# other frameworks, those of ``foreign_in``, have none yet), so its stored values are the raw ones.
# ``stored``: the row is in ``spans`` already (else it is a row of ``incoming``, about to be inserted).
_PLACE_COLUMNS = """trace_id, span_id, parent_span_id, start_ns, end_ns, operation, tool_name, arguments,
       coalesce(internal, false) AS internal, agent_name,
       orphan_parent IS NOT NULL AND parent_span_id IS NULL AS flagged,
       coalesce(status_code = 2 OR node_status = 'failed', false) AS failed, {keys}, run_id IS NULL AS new"""
_FOREIGN_TRACES = "trace_id IN (SELECT DISTINCT trace_id FROM foreign_answers)"
_PLACE_ROWS = f"""
CREATE OR REPLACE TEMP TABLE place_rows AS
SELECT {_PLACE_COLUMNS.format(keys="call_digest, call_targets")}, true AS stored, CAST(NULL AS BIGINT) AS stage_row
FROM spans WHERE {_FOREIGN_TRACES}
UNION ALL
SELECT {_PLACE_COLUMNS.format(keys="NULL AS call_digest, NULL AS call_targets")}, false AS stored, stage_row
FROM incoming WHERE {_FOREIGN_TRACES}
"""
"""The rows the placement reads, read once: every span of the traces of the new spans of other
frameworks, stored or new (``incoming`` has no keys yet: only the placement writes them)."""
_PLACE_SPANS = 50_000
"""Whole traces are placed in batches of about this many spans (a trace is never split), so
Python holds one batch's rows and placements at a time, whatever the file."""
_PLACE_BATCHES = f"""
CREATE OR REPLACE TEMP TABLE place_batches AS
SELECT trace_id, (sum(n) OVER (ORDER BY trace_id ROWS UNBOUNDED PRECEDING) - n) // {_PLACE_SPANS} AS batch
FROM (SELECT trace_id, count(*) AS n FROM place_rows ANTI JOIN flat_traces USING (trace_id) GROUP BY trace_id)
"""
_TRACE_SPANS = "SELECT * FROM place_rows WHERE trace_id IN (SELECT trace_id FROM place_batches WHERE batch = $batch)"
_PLACED_TABLE = """
CREATE OR REPLACE TEMP TABLE foreign_placed (
    trace_id VARCHAR, span_id VARCHAR, run_id VARCHAR, node_kind VARCHAR, node_parent_id VARCHAR,
    node_depth INTEGER, ordinal INTEGER, earlier_node_ids VARCHAR, repeat_chain VARCHAR, orphan BOOLEAN,
    anchor_node_id VARCHAR, call_digest VARCHAR, call_targets VARCHAR, stored BOOLEAN, stage_row BIGINT
);
CREATE OR REPLACE TEMP TABLE foreign_rekeyed (
    trace_id VARCHAR, span_id VARCHAR, arguments VARCHAR, tool_call_id VARCHAR, signature VARCHAR
)
"""
"""The placement's answer for every span of the placed traces (``stored``: the row is in ``spans``;
``stage_row``: else the row of the stage it places), and the calls keyed from their parent
(:func:`_keyed_from_parents`)."""

_PLACED = ("run_id", "node_kind", "node_parent_id", "node_depth", "ordinal", "earlier_node_ids", "anchor_node_id",
           "call_digest", "call_targets", "repeat_chain")  # fmt: skip
_ORPHAN = (
    "CASE WHEN p.orphan THEN coalesce({s}.orphan_parent, {s}.parent_span_id, '') "
    "WHEN {s}.parent_span_id IS NULL THEN {s}.orphan_parent END"
)
_APPLIES = "p.span_id IS NOT NULL AND i.convention IS NOT NULL"
_ONLY_PLACED = ("call_digest", "call_targets", "repeat_chain")
"""Columns that only the placement writes: not in the new rows (``SPAN_COLUMNS``)."""
PLACED_COLUMNS: Final[dict[str, str]] = {
    **{
        column: f"CASE WHEN {_APPLIES} THEN p.{column} END"
        if column in _ONLY_PLACED
        else f"CASE WHEN {_APPLIES} THEN p.{column} ELSE i.{column} END"
        for column in _PLACED
    },
    "orphan_parent": f"CASE WHEN {_APPLIES} THEN {_ORPHAN.format(s='i')} ELSE i.orphan_parent END",
    "arguments": "CASE WHEN k.span_id IS NULL THEN i.arguments ELSE k.arguments END",
    "tool_call_id": "coalesce(i.tool_call_id, k.tool_call_id)",
    "signature": "CASE WHEN k.span_id IS NULL THEN i.signature ELSE k.signature END",
}
"""The span columns that the placement decides (some are in no new row: an insert lists them beside
``SPAN_COLUMNS``): SQL over the new row ``i`` (of ``incoming``), its
placement ``p`` (``foreign_placed``, joined on nothing but the row of the stage it places: a stored
row has none) and its call keyed from its parent ``k`` (``foreign_rekeyed``, joined on the span's
keys) (:data:`PLACED_JOINS`), for the insert of the new spans (:mod:`treellm.store.ingest`): a new
row is written once, placed."""
PLACED_JOINS: Final = (
    "LEFT JOIN foreign_placed p ON p.stage_row = i.stage_row "
    "LEFT JOIN foreign_rekeyed k ON k.trace_id = i.trace_id AND k.span_id = i.span_id"
)
_UPDATE_STORED = (
    "UPDATE spans SET "
    + ", ".join(f"{column} = p.{column}" for column in _PLACED)
    + f", orphan_parent = {_ORPHAN.format(s='spans')} "
    "FROM foreign_placed p WHERE p.stored AND spans.trace_id = p.trace_id AND spans.span_id = p.span_id "
    "AND spans.convention IS NOT NULL AND ("
    + " OR ".join(f"spans.{column} IS DISTINCT FROM p.{column}" for column in _PLACED)
    + f" OR spans.orphan_parent IS DISTINCT FROM ({_ORPHAN.format(s='spans')}))"
)
"""The stored spans of the placed traces whose placement changed (a root that arrives after its
children moves them to its run): only those rows are written again."""
_UPDATE_REKEYED = (
    "UPDATE spans SET arguments = u.arguments, tool_call_id = coalesce(spans.tool_call_id, u.tool_call_id), "
    "signature = u.signature FROM foreign_rekeyed u "
    "WHERE spans.trace_id = u.trace_id AND spans.span_id = u.span_id"
)
"""The stored calls keyed from their parent (:func:`_keyed_from_parents`; a new one takes its key
with its insert, :data:`PLACED_JOINS`)."""
PLACED_FROM: Final = f"SELECT count(*) AS n, coalesce(bit_xor(hash(s)), 0) AS h FROM spans s WHERE {_FOREIGN_TRACES}"
"""What :func:`place_foreign` read of the store, as a count and a hash of every stored row of the
placed traces: equal again later, the placement would be the same."""


def _keyed_from_parents(con: duckdb.DuckDBPyConnection, spans: dict[str, list[Any]]) -> None:
    """Tool spans that record a bare value (LangChain's single-argument tools) take their
    keyed arguments and call id from the parent that records the call, once it is stored
    (``spans["arguments"]`` is updated in place, and the stored key of such a call is dropped,
    to be derived again). A call stored with a key is keyed again only by a parent that has
    just arrived: a parent stored before holds redacted values."""
    operations, parents, arguments = spans["operation"], spans["parent_span_id"], spans["arguments"]
    digests, traces = spans["call_digest"], spans["trace_id"]
    bare = [
        i for i, operation in enumerate(operations)
        if operation == "execute_tool" and parents[i] is not None and not (arguments[i] or "").lstrip().startswith("{")
    ]  # fmt: skip
    if any(digests[i] is not None for i in bare):
        arrived = {(t, s) for t, s, new in zip(traces, spans["span_id"], spans["new"], strict=True) if new}
        bare = [i for i in bare if digests[i] is None or (traces[i], parents[i]) in arrived]
    if not bare:
        return
    frame = columns(
        {
            "i": np.asarray(bare, dtype=np.int64),
            "trace_id": [spans["trace_id"][i] for i in bare],
            "parent_id": [parents[i] for i in bare],
            "tool": [spans["tool_name"][i] for i in bare],
        }
    )
    with frames_as_tables(con, bare_calls=frame):
        found_parents = con.execute(
            "SELECT b.i, b.tool, map_keys(p.attributes), map_values(p.attributes) FROM bare_calls b "
            "JOIN (SELECT trace_id, span_id, attributes FROM spans "
            "      UNION ALL SELECT trace_id, span_id, attributes FROM incoming) p "
            "ON p.trace_id = b.trace_id AND p.span_id = b.parent_id"
        ).fetchall()
    found: dict[int, tuple[str, str | None, str]] = {}
    for i, tool, keys, values in found_parents:
        call = conventions.parent_call(dict(zip(keys or (), values or (), strict=True)), tool)
        if call is not None:
            found[i] = (call[0], call[1], signature(tool, arguments_value(call[0])))
    if not found:
        return
    keyed = columns(
        {
            "trace_id": [spans["trace_id"][i] for i in found],
            "span_id": [spans["span_id"][i] for i in found],
            "arguments": [a for a, _, _ in found.values()],
            "tool_call_id": [c for _, c, _ in found.values()],
            "signature": [g for _, _, g in found.values()],
        }
    )
    with frames_as_tables(con, keyed_calls=keyed):  # a stored call is updated (update_stored); a new one takes it
        con.execute("INSERT INTO foreign_rekeyed SELECT trace_id, span_id, arguments, tool_call_id, signature "
                    "FROM keyed_calls")  # fmt: skip
    for i, (text, _, _) in found.items():
        arguments[i] = text
        digests[i] = None


_StoredKey = tuple[str, str]
"""(``call_digest``, ``call_targets``) of a counted call."""


@functools.lru_cache(maxsize=1024)
def _unknown_targets(tool: str) -> repeats.CallTargets:
    """The targets of a call of ``tool`` whose arguments are unknown: the default rule's for no
    arguments (a shell tool's unknown command may have written anything; another tool names no
    path it writes)."""
    return repeats.call_targets(_DEFAULT_RULE, tool, {})


_Call = tuple[CallKey, repeats.CallTargets, _StoredKey]


def _span_facts(spans: dict[str, list[Any]]) -> tuple[list[SpanFacts], dict[tuple[str, str], _StoredKey]]:
    """The placement's facts of each span, and the stored key of each counted call by (trace id,
    span id): the one stored, else derived from its arguments (see the module docstring). Equal
    calls share one :class:`CallKey` (the paths look them up by identity first)."""
    by_key: dict[_StoredKey, _Call] = {}
    by_arguments: dict[tuple[str, str], _Call] = {}

    def keyed(tool: str, kept: _StoredKey) -> _Call:
        found = by_key.get(kept)
        if found is None:
            found = by_key[kept] = (CallKey(tool, kept[0], raw=False), _targets(kept[1]), kept)
        return found

    def call(tool: str, args: str, kept: tuple[str | None, str | None]) -> _Call:
        digest, targets = kept
        if digest is not None and targets is not None:
            return keyed(tool, (digest, targets))
        found = by_arguments.get((tool, args))
        if found is None:
            found = by_arguments[(tool, args)] = keyed(tool, _stored_key(tool, args))
        return found

    out = []
    stored: dict[tuple[str, str], _StoredKey] = {}
    for trace, span, parent, start, end, operation, tool, args, internal, agent, flagged, failed, kept in zip(
        spans["trace_id"], spans["span_id"], spans["parent_span_id"], spans["start_ns"], spans["end_ns"],
        spans["operation"], spans["tool_name"], spans["arguments"], spans["internal"], spans["agent_name"],
        spans["flagged"], spans["failed"], zip(spans["call_digest"], spans["call_targets"], strict=True), strict=True,
    ):  # fmt: skip
        role = _ROLES.get(operation or "", "other")
        if tool is None or operation != "execute_tool" or internal:
            out.append(SpanFacts(trace, span, parent, start, end, role, None, agent, flagged))
            continue
        if args is None and kept[0] is None:  # arguments unknown: a key of its own, never stored
            key, found = CallKey(tool, f"arguments unknown: {trace} {span}", raw=False), _unknown_targets(tool)
        else:
            key, found, stored[(trace, span)] = call(tool, args or "", kept)
        out.append(
            SpanFacts(
                trace, span, parent, start, end, role, key, agent, flagged, not failed and found.changes_state,
                found.reads, found.writes,
            )
        )  # fmt: skip
    return out, stored


_RECORD_ROWS = 100_000
"""The placement's answer goes back in frames of at most this many rows: Python never holds more
of it at once."""
EARLIER_KEPT: Final = trees_sql.EARLIER_KEPT


def _record_placed(
    con: duckdb.DuckDBPyConnection, placed: Sequence[Placement], keys: Sequence[_StoredKey | None]
) -> None:
    """Keep one batch of the placement's answer in ``foreign_placed`` (see :func:`_place`)."""
    frame = columns(
        {
            "trace_id": [p.trace_id for p in placed],
            "span_id": [p.span_id for p in placed],
            "run_id": [p.run_id for p in placed],
            "node_kind": [p.node_kind for p in placed],
            "node_parent_id": [p.node_parent_id for p in placed],
            "node_depth": [p.depth for p in placed],
            "ordinal": [p.ordinal for p in placed],
            "earlier_node_ids": [json.dumps(list(p.earlier[-EARLIER_KEPT:])) if p.earlier else None for p in placed],
            "repeat_chain": [p.repeat_chain for p in placed],
            "orphan": [p.orphan for p in placed],
            "anchor_node_id": [p.anchor for p in placed],
            "call_digest": [None if k is None else k[0] for k in keys],
            "call_targets": [None if k is None else k[1] for k in keys],
        }
    )
    with frames_as_tables(con, run_updates=frame):
        con.execute(
            "INSERT INTO foreign_placed BY NAME SELECT u.*, r.stored, r.stage_row FROM run_updates u "
            "JOIN place_rows r ON r.trace_id = u.trace_id AND r.span_id = u.span_id"
        )


def _place(con: duckdb.DuckDBPyConnection) -> None:
    """Runs, trees and ordinals of the traces of ``foreign_in``: the flat ones in SQL, all at once
    (:mod:`treellm.derive.trees_sql`), the others in Python, a batch of whole traces at a time."""
    con.execute(_PLACE_ROWS)
    _place_flat(con)
    con.execute(_PLACE_BATCHES)
    batches = [batch for (batch,) in con.execute("SELECT DISTINCT batch FROM place_batches ORDER BY 1").fetchall()]
    for batch in batches:
        _place_batch(con, int(batch))
    con.execute("DROP TABLE place_batches; DROP TABLE place_rows; DROP TABLE flat_traces")


def _place_flat(con: duckdb.DuckDBPyConnection) -> None:
    """The placement of the flat traces of ``place_rows`` (:mod:`treellm.derive.trees_sql`), written
    into ``foreign_placed``; ``flat_traces`` names them, for the Python placement to leave alone.
    Each distinct call key and targets text is derived once, in Python."""
    con.execute(trees_sql.FLAT_TRACES)
    pairs = con.execute(trees_sql.KEY_INPUTS).fetchall()
    derived = [_stored_key(tool, args) for tool, args in pairs]
    kept = [targets for (targets,) in con.execute(trees_sql.KEPT_TARGETS).fetchall()]
    frames = {
        "flat_keys": columns(
            {
                "k_tool": [tool for tool, _ in pairs],
                "k_args": [args for _, args in pairs],
                "k_digest": [digest for digest, _ in derived],
                "k_targets": [targets for _, targets in derived],
                "k_changes": np.array([_targets(targets).changes_state for _, targets in derived], dtype=bool),
            }
        ),
        "flat_kept": columns(
            {"t_targets": kept, "t_changes": np.array([_targets(t).changes_state for t in kept], dtype=bool)}
        ),
    }
    with frames_as_tables(con, **frames):
        con.execute(trees_sql.FLAT_KEYED)
    con.execute(trees_sql.FLAT_PLACED)
    con.execute("DROP TABLE flat_rows")


def _place_batch(con: duckdb.DuckDBPyConnection, batch: int) -> None:
    fetched = con.execute(_TRACE_SPANS, {"batch": batch}).fetchnumpy()
    spans = {name: fetched.pop(name).tolist() for name in list(fetched)}
    _keyed_from_parents(con, spans)
    with _no_cycle_collection():  # pure Python over acyclic objects: nothing for it to find
        facts, keyed = _span_facts(spans)
        del spans
        placed = place_traces(facts)  # only the spans of other frameworks take it (PLACED_COLUMNS, _UPDATE_STORED)
        del facts
    for start in range(0, len(placed), _RECORD_ROWS):
        part = placed[start : start + _RECORD_ROWS]
        _record_placed(con, part, [keyed.get((p.trace_id, p.span_id)) for p in part])


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Python's cycle collector paused for the block: a batch makes hundreds of thousands of
    acyclic objects (rows, facts, placements), and the collections they set off cost a third of
    the placement (BENCHMARKS.md, "Batched ingest"). What the block leaves cyclic is collected
    after it."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


_READ_TABLES = ("foreign_in", "foreign_result_texts")
"""The working tables of :func:`read_foreign`, dropped once ``foreign_answers`` holds what they
say: before the ingest's transaction (its first chunk), which frees their memory at once."""


def read_foreign(con: duckdb.DuckDBPyConnection, internal: frozenset[str] | None = None) -> None:
    """Before the insert: what the conventions say of the new spans (``fresh``) of other frameworks,
    in the temporary table ``foreign_answers`` (the insert takes :data:`FOREIGN_COLUMNS` from it:
    the rows are written once, never updated); ``internal`` defaults to :func:`internal_tools`."""
    if not _read_foreign(con, internal_tools() if internal is None else internal):
        con.execute("CREATE OR REPLACE TEMP TABLE foreign_answers AS " + _NO_ANSWERS)
    for table in _READ_TABLES:
        con.execute(f"DROP TABLE IF EXISTS {table}")


_NO_ANSWERS = (
    "SELECT CAST(NULL AS BIGINT) AS stage_row, CAST(NULL AS VARCHAR) AS trace_id, "
    + ", ".join(f"CAST(NULL AS {'BOOLEAN' if c == 'internal' else 'VARCHAR'}) AS {c}" for c in _ANSWERED)
    + ", CAST(NULL AS VARCHAR) AS model, CAST(NULL AS VARCHAR) AS agent_name, CAST(NULL AS BOOLEAN) AS failed "
    "LIMIT 0"
)


def place_foreign(con: duckdb.DuckDBPyConnection) -> None:
    """Before the insert, after :func:`read_foreign`: runs, trees and ordinals of the traces of the
    new spans of other frameworks, over their stored rows and the temporary view ``incoming`` (the
    new rows as they will be stored, with :data:`FOREIGN_COLUMNS`), in ``foreign_placed`` and
    ``foreign_rekeyed``; the insert joins in the new rows' (:data:`PLACED_COLUMNS`,
    :data:`PLACED_JOINS`) and :func:`update_stored` writes the stored rows' that changed. Writes
    nothing of the store: it may run before the ingest's transaction (:data:`PLACED_FROM` tells
    whether what it read changed by then)."""
    con.execute(_PLACED_TABLE)
    if _count_rows(con, "SELECT count(*) FROM foreign_answers"):
        _place(con)


def update_stored(con: duckdb.DuckDBPyConnection) -> None:
    """Inside the ingest's transaction, after :func:`place_foreign`: write what the placement
    changed of the stored spans of the placed traces (their runs and trees, a call keyed from a
    parent that arrived now). The only writes of this module."""
    if _count_rows(con, "SELECT count(*) FROM foreign_rekeyed"):
        con.execute(_UPDATE_REKEYED)
    if _count_rows(con, "SELECT count(*) FROM foreign_placed WHERE stored"):
        con.execute(_UPDATE_STORED)


def finish_foreign(con: duckdb.DuckDBPyConnection) -> None:
    """After the insert: drop the tables of :func:`read_foreign` and :func:`place_foreign`."""
    # Not in a ``finally``: after a DuckDB error the transaction is aborted, a statement here would
    # hide that error behind "Current transaction is aborted", and the rollback drops the tables.
    for table in ("foreign_answers", "foreign_placed", "foreign_rekeyed"):
        con.execute(f"DROP TABLE IF EXISTS {table}")


def _count_rows(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    row = con.execute(sql).fetchone()
    return int(row[0]) if row else 0
