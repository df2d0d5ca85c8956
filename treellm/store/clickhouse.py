"""The ClickHouse engine: treellm's views over the Collector exporter's ``otel_traces``.

``open_clickhouse(url)`` connects to ``http(s)://...`` (a server, through the maintained
``clickhouse-connect`` driver: extra ``treellm[clickhouse]``) or ``chdb:PATH`` (the
embedded ClickHouse engine on a local data folder: extra ``treellm[chdb]``), creates
treellm's views over the spans table (``otel_traces`` unless told otherwise; see
``clickhouse_views``) and returns a :class:`ClickHouseConnection` that the analysis
functions take like a DuckDB connection. Every treellm column is derived inside
ClickHouse by those views; no span is pulled into Python to derive one.

treellm owns only what it creates. Its views live in a database of their own (``treellm``
unless ``database`` or ``$TREELLM_CLICKHOUSE_DATABASE`` says otherwise; created if absent),
never beside the user's tables, and every object treellm creates carries a comment marker
(``treellm:view:<schema version>``). Before each create, the names are looked up in
``system.tables``: free -> ``CREATE VIEW``; treellm's marker -> ``CREATE OR REPLACE VIEW``
(an upgrade); anything else -> :class:`NotOwnedError` naming ``database.name``, and
nothing is touched. One views database reads one spans table at a time: give each table
its own database to read several at once.

Hard rules: both drivers are imported lazily (the DuckDB install never needs them);
``?`` placeholders become typed server-side parameters (``{p0:String}``), never
string-formatted values; chDB allows one data folder per process, so one
``chdb:PATH`` connection at a time (close it before opening another folder); a URL reaches
a message or a log only through :func:`display_url` (``treellm.urls``, re-exported here),
which masks its password whatever the URL's shape.
"""

from __future__ import annotations

import fcntl
import functools
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import pandas as pd

from treellm import settings
from treellm.errors import ConfigError, MissingExtraError, StoreBusyError, StoreError
from treellm.store.backend import Dialect
from treellm.store.clickhouse_views import (
    BUCKET,
    DAILY,
    DEFAULT_TABLE,
    DERIVED_SPANS,
    DERIVED_TRACES,
    DERIVED_VIEWS,
    EVENT_COLUMNS,
    OTEL_TRACES_DDL,
    SPANS_TABLE_COLUMNS,
    TABLE_NAMES,
    TRACES_COLUMNS,
    VIEW_NAMES,
    WHOLE,
    Column,
    check_names,
    clickhouse_type,
    create_view,
    derived_spans_ddl,
    derived_traces_ddl,
    derived_view_ddl,
    is_marked,
    marker,
    view_columns_wanted,
    view_queries,
)
from treellm.store.connection import NotOwnedError, apply_migrations, connect_quietly
from treellm.store.judged import create_judged
from treellm.urls import display_url
from treellm.urls import scrub as _scrubbed

__all__ = [
    "DEFAULT_DATABASE", "ENV_CLICKHOUSE", "ClickHouseConnection", "NotOwnedError", "check_server_url", "display_url",
    "named_parameters", "open_clickhouse", "plan_tables", "plan_views", "store_columns", "view_columns",
]  # fmt: skip

ENV_CLICKHOUSE: Final = settings.TREELLM_CLICKHOUSE.name
DEFAULT_DATABASE: Final = str(settings.get(settings.TREELLM_CLICKHOUSE_DATABASE, {}))
_PARTITION_ID: Final = re.compile(r"[A-Za-z0-9_-]+")
"""A partition id as ClickHouse names them (``20261205``, ``all``): quoted into ``OPTIMIZE``."""


def _type(value: Any) -> str:
    if isinstance(value, bool):
        return "Bool"
    if isinstance(value, int):
        return "Int64"
    if isinstance(value, float):
        return "Float64"
    if value is None:
        return "Nullable(String)"
    if isinstance(value, list | tuple):
        return "Array(String)"
    return "String"


def named_parameters(sql: str, params: Sequence[Any]) -> tuple[str, dict[str, Any]]:
    """SQL with its n-th ``?`` (outside quoted text) as ``{pn:Type}``, and the parameter dict (pure)."""
    out: list[str] = []
    named: dict[str, Any] = {}
    quote: str | None = None
    for ch in sql:
        if quote is not None:
            quote = None if ch == quote else quote
        elif ch in "'\"`":
            quote = ch
        elif ch == "?":
            index = len(named)
            if index >= len(params):
                raise ValueError(f"expected at least {index + 1} parameters, got {len(params)}")
            named[f"p{index}"] = params[index]
            out.append(f"{{p{index}:{_type(params[index])}}}")
            continue
        out.append(ch)
    if len(named) != len(params):
        raise ValueError(f"expected {len(named)} parameters, got {len(params)}")
    return "".join(out), named


def check_server_url(url: str) -> None:
    """Refuse an ``http(s)://`` URL that the driver would misread, with a :class:`ConfigError`
    that shows the URL masked (pure): a ``/``, ``?`` or ``#`` inside the user or password
    (the driver would take part of the password for the host or port), a port that is no
    number, no host."""
    rest = url.split("://", 1)[1]
    if "@" in rest and any(c in rest.rpartition("@")[0] for c in "/?#"):
        raise ConfigError(
            f"expected a ClickHouse URL whose user and password percent-encode '/', '?' and '#' "
            f"(%2F, %3F, %23), got {display_url(url)!r}"
        )
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018  # parses the port: ValueError when it is no number in 0-65535
    except ValueError:
        raise ConfigError(f"expected a port number in the ClickHouse URL, got {display_url(url)!r}") from None
    if not parts.hostname:
        raise ConfigError(f"expected a host in the ClickHouse URL, got {display_url(url)!r}")


def _escaped_text(value: str) -> str:
    """A String parameter as chDB reads it: in ClickHouse's escaped (TSV) format, where ``\\``
    starts an escape sequence and a raw tab or line feed ends the value (pure)."""
    return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def _array_text(values: Sequence[Any]) -> str:
    """An Array(String) parameter as ClickHouse text (chDB passes parameters as text)."""
    quoted = ("'" + str(v).replace("\\", "\\\\").replace("'", "\\'") + "'" for v in values)
    return "[" + ",".join(quoted) + "]"


@functools.cache
def _described() -> dict[str, tuple[Column, ...]]:
    con = connect_quietly()
    try:
        apply_migrations(con)
        create_judged(con)
        found = {name: con.execute(f"DESCRIBE {name}").fetchall() for name in ("spans", *DERIVED_VIEWS)}
    finally:
        con.close()
    return {name: tuple((str(n), str(k), null == "YES") for n, k, null, *_ in rows) for name, rows in found.items()}


def store_columns() -> tuple[Column, ...]:
    """The columns of the DuckDB store's ``spans`` table, read from a migrated in-memory store:
    the one definition that ClickHouse's ``treellm_spans`` and ``spans`` view follow."""
    return _described()["spans"]


def view_columns() -> dict[str, tuple[Column, ...]]:
    """The columns of each DuckDB view that ClickHouse keeps a table of (``nodes``, ...), read
    from a migrated in-memory store: the one definition of those tables and views."""
    return {name: _described()[name] for name in DERIVED_VIEWS}


def _not_owned(database: str, name: str, engine: str) -> NotOwnedError:
    return NotOwnedError(
        f"the ClickHouse object {database}.{name} belongs to someone else ({engine or 'an object'} "
        f"without treellm's marker): treellm never replaces it; drop or rename it, or give treellm "
        f"another database (--clickhouse-database or ${settings.TREELLM_CLICKHOUSE_DATABASE.name})",
        name=f"{database}.{name}",
    )


def plan_tables(database: str, existing: Mapping[str, tuple[str, str]]) -> dict[str, bool]:
    """Whether each of treellm's tables in ``database`` is already there (``True``: keep it, add
    the columns it lacks) or to be created (``False``), given the objects by name as (engine,
    comment) from ``system.tables`` (pure). A name that holds anything but a
    ``*ReplacingMergeTree`` table (``Replicated...`` on a cluster) with treellm's marker raises
    :class:`NotOwnedError` naming it, before anything is touched."""
    plan: dict[str, bool] = {}
    for name in TABLE_NAMES:
        if name in existing:
            engine, comment = existing[name]
            if not engine.endswith("ReplacingMergeTree") or not is_marked(comment, "table"):
                raise _not_owned(database, name, engine)
        plan[name] = name in existing
    return plan


def plan_views(database: str, existing: Mapping[str, tuple[str, str]]) -> dict[str, bool]:
    """Whether to replace (``True``) or create (``False``) each of treellm's views in ``database``,
    given the objects already there by name as (engine, comment) from ``system.tables`` (pure).

    A name that is free is created; a view whose comment is treellm's marker is replaced (an
    upgrade when its schema version differs); anything else raises :class:`NotOwnedError`
    naming it, before any view is touched."""
    plan: dict[str, bool] = {}
    for name in VIEW_NAMES:
        if name in existing:
            engine, comment = existing[name]
            if engine != "View" or not is_marked(comment, "view"):
                raise _not_owned(database, name, engine)
        plan[name] = name in existing
    return plan


class ClickHouseConnection:
    """A :class:`~treellm.store.backend.Connection` to ClickHouse (server or chDB).

    ``query(sql, params) -> DataFrame`` and ``command(sql)`` are the driver's calls;
    ``df`` blocks, and a ClickHouse error propagates as the driver's exception (one of
    ``errors``). :attr:`table` is the spans table, qualified (``home.table`` when given
    bare, ``home`` being the connection's own database); :attr:`database` holds treellm's
    views, and every :meth:`df` query runs in it, so ``runs`` there is ``database.runs``.
    """

    def __init__(
        self,
        query: Callable[[str, dict[str, Any]], pd.DataFrame],
        command: Callable[[str], None],
        close: Callable[[], None],
        *,
        use: Callable[[str], None],
        insert: Callable[[str, bytes], None],
        export: Callable[[str, dict[str, Any]], bytes],
        errors: tuple[type[Exception], ...],
        table: str = DEFAULT_TABLE,
        database: str = DEFAULT_DATABASE,
        home: str = "default",
        partition: str = DAILY,
    ) -> None:
        self._query, self._command, self._close, self._use = query, command, close, use
        self.partition = partition  # how treellm's tables it creates are partitioned by their bucket
        self._insert, self._export = insert, export
        self.errors = errors
        self.table = table if "." in table else f"{home}.{table}"
        self.database = database
        self._closed = False

    @property
    def dialect(self) -> Dialect:
        return "clickhouse"

    def df(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        text, named = named_parameters(sql, params)
        self._use(self.database)  # chDB's current database is per process: set it for each query
        return self._query(text, named)

    def command(self, sql: str) -> None:
        """Run one statement that returns nothing (DDL, INSERT)."""
        self._command(sql)

    def insert_json_rows(self, lines: Sequence[str], target: str | None = None) -> None:
        """Insert rows into ``target`` (default :attr:`table`): one JSONEachRow text per row,
        Nested columns as dotted arrays (``Events.Name``), as one batch."""
        if lines:
            self._insert(target or self.table, "\n".join(lines).encode("utf-8"))

    def export_rows(self, sql: str, params: Sequence[Any] = ()) -> bytes:
        """The rows of a query as JSONEachRow bytes (one JSON object a line), 64-bit integers
        unquoted, in no particular database: every name in ``sql`` is qualified."""
        text, named = named_parameters(sql, params)
        return self._export(text, named)

    def _rows(self, sql: str, params: Sequence[Any]) -> pd.DataFrame:
        """A query on the system tables, in no particular database."""
        text, named = named_parameters(sql, params)
        return self._query(text, named)

    def _has_database(self, name: str) -> bool:
        return len(self._rows("SELECT name FROM system.databases WHERE name = ?", [name])) > 0

    def _require_spans_table(self) -> None:
        database, _, name = self.table.partition(".")
        found = self._rows("SELECT name FROM system.columns WHERE database = ? AND table = ?", [database, name])
        columns = set(found["name"])
        if not columns:
            raise StoreError(
                f"ClickHouse has no table {self.table}: give the Collector's spans table with --clickhouse-table "
                "(`treellm ingest --clickhouse` creates one)"
            )
        missing = [c for c in SPANS_TABLE_COLUMNS if c not in columns]
        if missing:
            raise StoreError(
                f"{self.table} is not an OpenTelemetry Collector spans table (it has no {', '.join(missing[:3])}"
                f"{', ...' if len(missing) > 3 else ''} column): give that table with --clickhouse-table"
            )

    def attach(self, *, create_table: bool = False) -> None:
        """Create or upgrade treellm's tables and views in :attr:`database` (created if absent)
        beside :attr:`table`, and the spans table itself with the exporter's DDL when
        ``create_table`` (for a chDB folder that no Collector writes); each only where nothing
        else stands. A table of treellm's from an older version gets the columns it lacks.

        Raises :class:`NotOwnedError` when a name in :attr:`database` holds an object that is
        not treellm's, and :class:`StoreError` when :attr:`table` is missing or holds no spans;
        nothing is replaced then."""
        columns, described = store_columns(), view_columns()
        queries = view_queries(self.table, self.database, columns, described)  # validates the names first
        if create_table:
            table_database = self.table.partition(".")[0]
            if not self._has_database(table_database):
                self._command(f"CREATE DATABASE IF NOT EXISTS {table_database} COMMENT '{marker('database')}'")
            ddl = OTEL_TRACES_DDL.format(table=self.table).rstrip()
            self._command(f"{ddl}\nCOMMENT '{marker('table')}'")  # IF NOT EXISTS: a table there stays
        self._require_spans_table()
        if not self._has_database(self.database):
            self._command(f"CREATE DATABASE IF NOT EXISTS {self.database} COMMENT '{marker('database')}'")
        found = self._rows(
            "SELECT name, engine, comment FROM system.tables WHERE database = ? AND has(?, name)",
            [self.database, [*TABLE_NAMES, *VIEW_NAMES]],
        )
        rows = zip(found["name"], found["engine"], found["comment"], strict=True)
        existing = {str(name): (str(engine), str(comment)) for name, engine, comment in rows}
        tables = plan_tables(self.database, existing)
        views = plan_views(self.database, existing)  # both plans before anything is touched
        self._command(derived_spans_ddl(self.database, columns, partition=self.partition))
        self._command(derived_traces_ddl(self.database, partition=self.partition))
        for view in DERIVED_VIEWS:
            self._command(derived_view_ddl(self.database, view, described[view], partition=self.partition))
        # an older version's tables get the columns they lack (NULL in their old rows, whose
        # traces were derived under another schema: derived again, treellm_traces says so)
        wanted = {
            DERIVED_SPANS: [(n, clickhouse_type(k, nullable=True)) for n, k, _ in columns] + [*EVENT_COLUMNS, BUCKET],
            DERIVED_TRACES: list(TRACES_COLUMNS),
            **{table: view_columns_wanted(described[view]) for view, table in DERIVED_VIEWS.items()},
        }
        for table, kinds in wanted.items():
            if tables[table]:
                self._upgrade_columns(table, kinds)
        for name, replace in views.items():
            self._command(create_view(self.database, name, queries[name], replace=replace))

    def _upgrade_columns(self, table: str, wanted: Sequence[tuple[str, str]]) -> None:
        """An older table of treellm's gets the columns it lacks (NULL or empty in its old rows), and
        its text columns that are ``LowCardinality`` now (:data:`LOW_CARDINALITY`) that type: a
        mutation ClickHouse runs in the background, reading each part as before until it is
        rewritten; the values stay the same."""
        found = self._rows(
            "SELECT name, type FROM system.columns WHERE database = ? AND table = ?", [self.database, table]
        )
        have = dict(zip(found["name"], found["type"], strict=True))
        for name, kind in wanted:
            if name not in have:
                self._command(f"ALTER TABLE {self.database}.{table} ADD COLUMN IF NOT EXISTS `{name}` {kind}")
            elif kind == f"LowCardinality({have[name]})":
                self._command(f"ALTER TABLE {self.database}.{table} MODIFY COLUMN `{name}` {kind}")

    def compact(self) -> tuple[str, ...]:
        """Merge each partition of treellm's tables in :attr:`database` that holds more than one
        part into one (``OPTIMIZE TABLE ... PARTITION ID ... FINAL``), and return the names of the
        tables merged.

        The views read the tables ``FINAL``; over one part ClickHouse reads without merging,
        which at 10M spans made the overview's queries 1.9 s -> 1.1 s. Over several (every
        insert adds one, and trace ids spread each over the whole key) every read merges them
        again. On a server the partitions are the days traces were first derived (:data:`BUCKET`),
        so a merge rewrites the partitions that received rows since the last one, not the table;
        a chDB folder's tables are one partition each (:data:`WHOLE`), as are those an older
        treellm made: rewritten whole.
        :func:`~treellm.store.clickhouse_derive.run_derive` decides how often. Raises the
        driver's error (one of :attr:`errors`), such as when the user lacks the ``OPTIMIZE``
        grant."""
        found = self._rows(
            "SELECT table, partition_id, count() AS parts FROM system.parts "
            "WHERE database = ? AND active AND has(?, table) "
            "GROUP BY table, partition_id HAVING parts > 1 ORDER BY table, partition_id",
            [self.database, list(TABLE_NAMES)],
        )
        merged: dict[str, None] = {}
        for name, partition in zip(found["table"], found["partition_id"], strict=True):
            if not _PARTITION_ID.fullmatch(str(partition)):
                raise StoreError(f"ClickHouse named a partition of {self.derived(str(name))} {partition!r}")
            self._command(f"OPTIMIZE TABLE {self.derived(str(name))} PARTITION ID '{partition}' FINAL")
            merged[str(name)] = None
        return tuple(merged)

    def derived(self, name: str) -> str:
        """The qualified name of one of treellm's tables (:data:`TABLE_NAMES`)."""
        if name not in TABLE_NAMES:
            raise ValueError(f"expected one of treellm's tables {TABLE_NAMES}, got {name!r}")
        return f"{self.database}.{name}"

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close()


# JSONEachRow with Nested columns written as dotted arrays (``Events.Name``), as the exporter's rows.
_INSERT_SETTINGS: Final = {"input_format_import_nested_json": 1}
_INSERT_FORMAT: Final = "SETTINGS input_format_import_nested_json = 1 FORMAT JSONEachRow"
_EXPORT_SETTINGS: Final = "output_format_json_quote_64bit_integers = 0"


def chdb_holder(path: str | os.PathLike[str]) -> int | None:
    """The id of another process that has the chDB folder ``path`` open, else None. chDB, as a
    ClickHouse server, writes its process id into the folder's ``status`` file and holds an
    exclusive ``flock`` on it while open; a folder this process opened is not another's."""
    status = Path(path) / "status"
    try:
        fd = os.open(status, os.O_RDONLY)
    except OSError:  # no folder or never opened: nobody holds it
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        found = re.search(rb"PID:\s*(\d+)", os.pread(fd, 256, 0))
        holder = int(found.group(1)) if found else -1
        return None if holder == os.getpid() else holder
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _busy(path: str, holder: int) -> StoreBusyError:
    who = f"process {holder}" if holder > 0 else "another process"
    return StoreBusyError(
        f"the chDB folder {path} is open in {who}: chDB lets one process at a time open a folder "
        "(a derive pass, the dashboard, a report); try again when it is done, or serve the folder "
        "with a ClickHouse server to share it",
        path=path,
    )


def _chdb(path: str, table: str, database: str) -> ClickHouseConnection:
    try:
        import chdb
        from chdb import session as chdb_session
    except ImportError as exc:
        raise MissingExtraError("chdb:PATH", "chdb", "chdb") from exc
    holder = chdb_holder(path)
    if holder is not None:  # said before chDB tries, which prints its own lines to stderr
        raise _busy(path, holder)
    new_session: Any = chdb_session.Session  # chDB ships no type hints
    try:
        session: Any = new_session(path)
    except Exception as exc:  # chDB raises plain RuntimeError/Exception subclasses
        holder = chdb_holder(path)  # taken in between
        if holder is not None:
            raise _busy(path, holder) from exc
        raise StoreError(f"cannot open the chDB folder {path}: {exc}", path=path) from exc

    def query(sql: str, params: dict[str, Any]) -> pd.DataFrame:
        values = {k: _array_text(v) if isinstance(v, list | tuple) else _escaped_text(v) if isinstance(v, str) else v
                  for k, v in params.items()}  # fmt: skip
        frame: pd.DataFrame = session.query(sql, "DataFrame", params=values or None)
        return frame

    def command(sql: str) -> None:
        session.query(sql)

    def use(name: str) -> None:
        session.query(f"USE {name}")

    def insert(target: str, body: bytes) -> None:
        session.query(f"INSERT INTO {target} {_INSERT_FORMAT}\n" + body.decode("utf-8"))

    def export(sql: str, params: dict[str, Any]) -> bytes:
        values = {k: _array_text(v) if isinstance(v, list | tuple) else _escaped_text(v) if isinstance(v, str) else v
                  for k, v in params.items()}  # fmt: skip
        result: Any = session.query(f"{sql}\nSETTINGS {_EXPORT_SETTINGS}", "JSONEachRow", params=values or None)
        data: bytes = result.bytes()
        return data

    errors: tuple[type[Exception], ...] = (chdb.ChdbError,)
    try:  # chDB 4's session queries raise chdb._exceptions.ChdbError, which is not chdb.ChdbError
        from chdb._exceptions import ChdbError as QueryError
    except ImportError:  # an older chDB: one error class
        pass
    else:
        errors = (chdb.ChdbError, QueryError)
    return ClickHouseConnection(
        query,
        command,
        session.close,
        use=use,
        insert=insert,
        export=export,
        errors=errors,
        table=table,
        database=database,
        partition=WHOLE,
    )  # a chDB folder's own database is always ``default``


def _server(url: str, table: str, database: str) -> ClickHouseConnection:
    try:
        import clickhouse_connect
        from clickhouse_connect.driver.exceptions import ClickHouseError
    except ImportError as exc:
        raise MissingExtraError("--clickhouse http(s)://...", "clickhouse", "clickhouse_connect") from exc
    try:
        client = clickhouse_connect.get_client(dsn=url)
        home = client.database or str(client.command("SELECT currentDatabase()"))
    except Exception as exc:  # the driver's OperationalError / DatabaseError
        where = display_url(url)
        raise StoreError(f"cannot connect to ClickHouse at {where}: {_scrubbed(str(exc), url)}", path=where) from exc

    def query(sql: str, params: dict[str, Any]) -> pd.DataFrame:
        frame: pd.DataFrame = client.query_df(sql, parameters=params or None)
        return frame

    def command(sql: str) -> None:
        client.command(sql)

    def use(name: str) -> None:
        client.database = name

    def insert(target: str, body: bytes) -> None:
        client.raw_insert(target, insert_block=body, settings=_INSERT_SETTINGS, fmt="JSONEachRow")

    def export(sql: str, params: dict[str, Any]) -> bytes:
        data: bytes = client.raw_query(
            sql, parameters=params or None, settings={"output_format_json_quote_64bit_integers": 0}, fmt="JSONEachRow"
        )
        return data

    return ClickHouseConnection(
        query, command, client.close, use=use, insert=insert, export=export, errors=(ClickHouseError,), table=table,
        database=database, home=home,
    )  # fmt: skip


def open_clickhouse(
    url: str | None = None,
    *,
    table: str = DEFAULT_TABLE,
    database: str | None = None,
    create_table: bool = False,
    attach: bool = True,
    partition: str | None = None,
) -> ClickHouseConnection:
    """Connect to ``url`` (``http(s)://user:password@host:8123/db`` or ``chdb:PATH``; default
    ``$TREELLM_CLICKHOUSE``) and create or upgrade treellm's views over ``table`` in
    ``database`` (default ``$TREELLM_CLICKHOUSE_DATABASE``, else ``treellm``). ``attach=False``
    connects only: for a reader that set the views up earlier in the same process (about 35
    queries and a view rewritten each, 0.14 s on chDB, saved on every later query).
    ``partition``: how the tables it creates are partitioned (default :data:`DAILY` on a server,
    :data:`WHOLE` on chDB).

    A bad URL, table or database name is a :class:`ConfigError` before any connection; a
    view's name that holds someone else's object is a :class:`NotOwnedError` naming it; a
    missing spans table or a ClickHouse error while setting up is a :class:`StoreError`.
    No message carries the URL's password."""
    views = database or settings.get(settings.TREELLM_CLICKHOUSE_DATABASE)
    check_names(table, views)  # a bad name fails before any connection
    target = url or settings.get(settings.TREELLM_CLICKHOUSE)
    if not target:
        raise ConfigError(f"expected a ClickHouse URL (http(s)://... or chdb:PATH) or ${ENV_CLICKHOUSE}, got none")
    if target.startswith("chdb:"):
        con = _chdb(target.removeprefix("chdb:") or ".", table, views)
    elif target.startswith(("http://", "https://")):
        check_server_url(target)
        con = _server(target, table, views)
    else:
        raise ConfigError(
            f"expected a ClickHouse URL such as http://localhost:8123 or chdb:./traces, got {display_url(target)!r}"
        )
    if partition is not None:
        con.partition = partition
    if not attach:
        return con
    try:
        con.attach(create_table=create_table)
    except con.errors as exc:
        con.close()
        where = display_url(target)
        raise StoreError(
            f"cannot set up treellm's views in ClickHouse at {where}: {_scrubbed(str(exc), target)}", path=where
        ) from exc
    except Exception:
        con.close()
        raise
    return con
