"""The ClickHouse engine: treellm's views over the Collector exporter's ``otel_traces``.

``open_clickhouse(url)`` connects to ``http(s)://...`` (a server, through the maintained
``clickhouse-connect`` driver: extra ``treellm[clickhouse]``) or ``chdb:PATH`` (the
embedded ClickHouse engine on a local data folder: extra ``treellm[chdb]``), creates
treellm's views over the spans table (``otel_traces`` unless told otherwise; see
``clickhouse_views``) and returns a :class:`ClickHouseConnection` that the analysis
functions take like a DuckDB connection. Every treellm column is derived inside
ClickHouse by those views; no span is pulled into Python to derive one.

Hard rules: both drivers are imported lazily (the DuckDB install never needs them);
``?`` placeholders become typed server-side parameters (``{p0:String}``), never
string-formatted values; chDB allows one data folder per process, so one
``chdb:PATH`` connection at a time (close it before opening another folder).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import pandas as pd

from treellm import settings
from treellm.errors import ConfigError, MissingExtraError, StoreError
from treellm.store.clickhouse_views import DEFAULT_TABLE, OTEL_TRACES_DDL, view_statements
from treellm.store.engine import Dialect

__all__ = ["ENV_CLICKHOUSE", "ClickHouseConnection", "display_url", "named_parameters", "open_clickhouse"]

ENV_CLICKHOUSE: Final = settings.TREELLM_CLICKHOUSE.name


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


def display_url(url: str) -> str:
    """``url`` without its password, for messages and logs (pure)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _array_text(values: Sequence[Any]) -> str:
    """An Array(String) parameter as ClickHouse text (chDB passes parameters as text)."""
    quoted = ("'" + str(v).replace("\\", "\\\\").replace("'", "\\'") + "'" for v in values)
    return "[" + ",".join(quoted) + "]"


class ClickHouseConnection:
    """A :class:`~treellm.store.engine.Connection` to ClickHouse (server or chDB).

    ``query(sql, params) -> DataFrame`` and ``command(sql)`` are the driver's calls;
    ``df`` blocks, and a ClickHouse error propagates as the driver's exception.
    """

    def __init__(
        self,
        query: Callable[[str, dict[str, Any]], pd.DataFrame],
        command: Callable[[str], None],
        close: Callable[[], None],
        *,
        use: Callable[[str], None],
        insert: Callable[[str, bytes], None],
        table: str = DEFAULT_TABLE,
    ) -> None:
        self._query, self._command, self._close, self._use = query, command, close, use
        self._insert = insert
        self.table = table
        self.database = table.rpartition(".")[0] or None
        self._closed = False

    @property
    def dialect(self) -> Dialect:
        return "clickhouse"

    def df(self, sql: str, params: Sequence[Any] = ()) -> pd.DataFrame:
        text, named = named_parameters(sql, params)
        if self.database:  # chDB's current database is per process: set it for each query
            self._use(self.database)
        return self._query(text, named)

    def command(self, sql: str) -> None:
        """Run one statement that returns nothing (DDL, INSERT)."""
        self._command(sql)

    def insert_json_rows(self, lines: Sequence[str]) -> None:
        """Insert rows into :attr:`table`: one JSONEachRow text per row, Nested columns as
        dotted arrays (``Events.Name``), as one batch."""
        if lines:
            self._insert(self.table, "\n".join(lines).encode("utf-8"))

    def attach(self, *, create_table: bool = False) -> None:
        """Create treellm's views over :attr:`table` (and the table itself with the exporter's
        DDL when ``create_table``: for a chDB folder that no Collector writes).

        The views live in the table's database (``db.otel_traces`` -> ``db.runs`` ...), and
        the connection's queries then run in that database."""
        statements = view_statements(self.table)  # validates the name first
        if create_table:
            if self.database:
                self._command(f"CREATE DATABASE IF NOT EXISTS {self.database}")
            self._command(OTEL_TRACES_DDL.format(table=self.table))
        if self.database:
            self._use(self.database)
        for statement in statements:
            self._command(statement)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close()


# JSONEachRow with Nested columns written as dotted arrays (``Events.Name``), as the exporter's rows.
_INSERT_SETTINGS: Final = {"input_format_import_nested_json": 1}
_INSERT_FORMAT: Final = "SETTINGS input_format_import_nested_json = 1 FORMAT JSONEachRow"


def _chdb(path: str, table: str) -> ClickHouseConnection:
    try:
        from chdb import session as chdb_session
    except ImportError as exc:
        raise MissingExtraError("chdb:PATH", "chdb", "chdb") from exc
    new_session: Any = chdb_session.Session  # chDB ships no type hints
    try:
        session: Any = new_session(path)
    except Exception as exc:  # chDB raises plain RuntimeError/Exception subclasses
        raise StoreError(f"cannot open the chDB folder {path}: {exc}", path=path) from exc

    def query(sql: str, params: dict[str, Any]) -> pd.DataFrame:
        values = {k: _array_text(v) if isinstance(v, list | tuple) else v for k, v in params.items()}
        frame: pd.DataFrame = session.query(sql, "DataFrame", params=values or None)
        return frame

    def command(sql: str) -> None:
        session.query(sql)

    def use(database: str) -> None:
        session.query(f"USE {database}")

    def insert(target: str, body: bytes) -> None:
        session.query(f"INSERT INTO {target} {_INSERT_FORMAT}\n" + body.decode("utf-8"))

    return ClickHouseConnection(query, command, session.close, use=use, insert=insert, table=table)


def _server(url: str, table: str) -> ClickHouseConnection:
    try:
        import clickhouse_connect
    except ImportError as exc:
        raise MissingExtraError("--clickhouse http(s)://...", "clickhouse", "clickhouse_connect") from exc
    try:
        client = clickhouse_connect.get_client(dsn=url)
    except Exception as exc:  # the driver's OperationalError / DatabaseError
        raise StoreError(f"cannot connect to ClickHouse at {display_url(url)}: {exc}", path=display_url(url)) from exc

    def query(sql: str, params: dict[str, Any]) -> pd.DataFrame:
        frame: pd.DataFrame = client.query_df(sql, parameters=params or None)
        return frame

    def command(sql: str) -> None:
        client.command(sql)

    def use(database: str) -> None:
        client.database = database

    def insert(target: str, body: bytes) -> None:
        client.raw_insert(target, insert_block=body, settings=_INSERT_SETTINGS, fmt="JSONEachRow")

    return ClickHouseConnection(query, command, client.close, use=use, insert=insert, table=table)


def open_clickhouse(
    url: str | None = None, *, table: str = DEFAULT_TABLE, create_table: bool = False
) -> ClickHouseConnection:
    """Connect to ``url`` (``http(s)://user:password@host:8123/db`` or ``chdb:PATH``; default
    ``$TREELLM_CLICKHOUSE``) and create treellm's views over ``table``."""
    view_statements(table)  # a bad table name fails before any connection
    target = url or settings.get(settings.TREELLM_CLICKHOUSE)
    if not target:
        raise ConfigError(f"expected a ClickHouse URL (http(s)://... or chdb:PATH) or ${ENV_CLICKHOUSE}, got none")
    if target.startswith("chdb:"):
        con = _chdb(target.removeprefix("chdb:") or ".", table)
    elif target.startswith(("http://", "https://")):
        con = _server(target, table)
    else:
        raise ConfigError(
            f"expected a ClickHouse URL such as http://localhost:8123 or chdb:./traces, got {display_url(target)!r}"
        )
    try:
        con.attach(create_table=create_table)
    except Exception:
        con.close()
        raise
    return con
