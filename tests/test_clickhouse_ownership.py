"""treellm owns only what it creates in ClickHouse (chDB, real): a user's tables named like
treellm's views survive every command unchanged, a name in treellm's database that holds
someone else's object is refused (never replaced), treellm's own views are replaced or
upgraded, and every bad ClickHouse option value is one error line, password masked.

One chDB folder for the module (chDB allows one data folder per process): the Collector's
rows of the sample traces in ``default.otel_traces`` beside the user's own MergeTree tables
``default.runs``, ``default.spans``, ``default.nodes``, ``default.tool_calls`` and
``default.loop_events``, each with rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("chdb")

from clickhouse_rows import file_rows, insert_sql

from treellm import analysis as A
from treellm.analysis import explorer
from treellm.cli import main
from treellm.errors import ConfigError
from treellm.store import ingest, open_store
from treellm.store.clickhouse import NotOwnedError, display_url, open_clickhouse, plan_tables, plan_views
from treellm.store.clickhouse_derive import run_derive
from treellm.store.clickhouse_views import OTEL_TRACES_DDL, SCHEMA_VERSION, TABLE_NAMES, VIEW_NAMES

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "sample_traces").glob("*.jsonl"))
TRAJECTORIES = sorted(p for p in (ROOT / "tests" / "data" / "mini-swe-agent").iterdir() if p.is_dir())[0]

# The user's own tables, named like treellm's views, each with its own columns and rows.
USER_TABLES = {
    "runs": ("id UInt32, who String", "(1, 'alice'), (2, 'bob')"),
    "spans": ("k String, v Float64", "('a', 1.5), ('b', 2.5)"),
    "nodes": ("n Int64", "(7), (8), (9)"),
    "tool_calls": ("tool String, calls UInt64", "('grep', 3)"),
    "loop_events": ("at DateTime, what String", "('2026-01-02 03:04:05', 'x'), ('2026-01-02 03:04:06', 'y')"),
}


class Folder:
    """The chDB folder, and raw statements on it without treellm (a session opened and closed)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = f"chdb:{path}"

    def run(self, *statements: str) -> list[str]:
        from chdb import session

        new_session: Any = session.Session  # chDB ships no type hints
        s: Any = new_session(str(self.path))
        try:
            return [str(s.query(statement, "TabSeparated")) for statement in statements]
        finally:
            s.close()

    def objects(self, database: str) -> dict[str, tuple[str, str]]:
        """The tables and views of ``database`` as name -> (engine, comment)."""
        [text] = self.run(
            f"SELECT name, engine, comment FROM system.tables WHERE database = '{database}' ORDER BY name"
        )
        rows = [line.split("\t") for line in text.splitlines() if line]
        return {name: (engine, comment) for name, engine, comment in rows}

    def user_tables(self) -> dict[str, tuple[str, str]]:
        """Each user table's DDL (engine and columns) and rows, as text."""
        out = {}
        for name in USER_TABLES:
            ddl, data = self.run(
                f"SELECT create_table_query FROM system.tables WHERE database = 'default' AND name = '{name}'",
                f"SELECT * FROM default.{name} ORDER BY ALL",
            )
            out[name] = (ddl, data)
        return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Folder:
    """The Collector's table with the sample traces, and the user's tables, before treellm ever ran."""
    f = Folder(tmp_path_factory.mktemp("ownership") / "chdb")
    f.run(OTEL_TRACES_DDL.format(table="default.otel_traces"))
    rows = [row for path in SAMPLES for row in file_rows(path)]
    f.run(*(insert_sql(rows[i : i + 5000], "default.otel_traces") for i in range(0, len(rows), 5000)))
    for name, (columns, values) in USER_TABLES.items():
        f.run(
            f"CREATE TABLE default.{name} ({columns}) ENGINE = MergeTree ORDER BY tuple()",
            f"INSERT INTO default.{name} VALUES {values}",
        )
    return f


@pytest.fixture(scope="module")
def pristine(folder: Folder) -> dict[str, tuple[str, str]]:
    tables = folder.user_tables()
    assert all("ENGINE = MergeTree" in ddl and data for ddl, data in tables.values())
    return tables


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The report of the sample traces over DuckDB: what treellm's own views must give."""
    db = tmp_path_factory.mktemp("ownership_duck") / "samples.duckdb"
    ingest(db, SAMPLES)
    con = open_store(db, read_only=True)
    yield A.report(con)
    con.close()


def _objects() -> dict[str, tuple[str, str]]:
    """treellm's tables and views, as a database of its holds them after a connection."""
    tables = dict.fromkeys(TABLE_NAMES, ("ReplacingMergeTree", f"treellm:table:{SCHEMA_VERSION}"))
    return {**tables, **dict.fromkeys(VIEW_NAMES, ("View", f"treellm:view:{SCHEMA_VERSION}"))}


@pytest.fixture(scope="module")
def derived(folder: Folder) -> Folder:
    """The Collector's spans derived by `treellm derive --once`, as a team's cron job runs it."""
    assert main(["derive", "--clickhouse", folder.url, "--once", "--wait", "0"]) == 0
    return folder


def test_report_and_tune_leave_the_users_tables_unchanged(
    derived: Folder, pristine: dict[str, tuple[str, str]], expected: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    folder = derived
    capsys.readouterr()
    assert main(["report", "--clickhouse", folder.url, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == expected  # read through treellm's views, not the user's tables
    assert main(["tune", "--clickhouse", folder.url]) == 0
    assert capsys.readouterr().out
    assert folder.user_tables() == pristine
    assert folder.objects("treellm") == _objects()


def test_the_dashboards_data_loading_leaves_the_users_tables_unchanged(
    derived: Folder, pristine: dict[str, tuple[str, str]], expected: dict[str, Any]
) -> None:
    folder = derived
    from treellm.cli import _dashboard_command, build_parser

    _dashboard_command(build_parser().parse_args(["dashboard", "--clickhouse", folder.url]))  # opens, checks
    ch = open_clickhouse(folder.url)
    try:
        assert ch.table == "default.otel_traces" and ch.database == "treellm"
        assert len(explorer.run_list(ch, limit=10_000)) == expected["runs"]
        assert explorer.filter_options(ch) and explorer.data_version(ch)
        assert not explorer.run_row(ch, "sample-nudge_and_cache").empty
    finally:
        ch.close()
    assert folder.user_tables() == pristine


def test_ingest_clickhouse_leaves_the_users_tables_unchanged(
    derived: Folder, pristine: dict[str, tuple[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    folder = derived
    assert main(["ingest", str(TRAJECTORIES), "--clickhouse", folder.url, "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["spans"] > 0 and written["runs"] > 0
    assert folder.user_tables() == pristine
    ch = open_clickhouse(folder.url)
    try:
        assert A.report(ch)["runs"] > written["runs"]  # the samples and the trajectories, in default.otel_traces
    finally:
        ch.close()


@pytest.mark.parametrize(
    "statement",
    [
        "CREATE TABLE {db}.runs (id UInt32) ENGINE = MergeTree ORDER BY id",
        "CREATE VIEW {db}.runs AS SELECT 1 AS id",  # a view, but no marker
        "CREATE VIEW {db}.runs AS SELECT 1 AS id COMMENT 'mine:view:1'",
        "CREATE TABLE {db}.runs (id UInt32) ENGINE = MergeTree ORDER BY id COMMENT 'treellm:view:1'",  # not a view
    ],
    ids=["table", "view-without-comment", "view-with-another-comment", "table-with-treellm's-comment"],
)
def test_a_name_in_treellms_database_that_is_someone_elses_is_refused_not_replaced(
    folder: Folder,
    statement: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = "theirs_" + request.node.callspec.id.replace("-", "_").replace("'", "")
    folder.run(f"CREATE DATABASE {db}", statement.format(db=db))
    if "MergeTree" in statement:
        folder.run(f"INSERT INTO {db}.runs VALUES (1), (2)")
    before = (folder.objects(db), folder.run(f"SELECT * FROM {db}.runs ORDER BY ALL"))
    with pytest.raises(NotOwnedError, match="belongs to someone else") as caught:
        open_clickhouse(folder.url, database=db)
    assert caught.value.name == f"{db}.runs" and f"{db}.runs" in str(caught.value)
    monkeypatch.setenv("TREELLM_CLICKHOUSE_DATABASE", db)  # the setting, as the dashboard's process reads it
    with pytest.raises(NotOwnedError):
        open_clickhouse(folder.url)
    monkeypatch.delenv("TREELLM_CLICKHOUSE_DATABASE")
    assert main(["report", "--clickhouse", folder.url, "--clickhouse-database", db]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("treellm: error: ") and f"{db}.runs" in err[0], err
    assert (folder.objects(db), folder.run(f"SELECT * FROM {db}.runs ORDER BY ALL")) == before  # nothing beside it


def test_treellms_own_views_are_replaced_and_upgraded_on_the_next_connection(
    folder: Folder, expected: dict[str, Any]
) -> None:
    for _ in range(2):
        open_clickhouse(folder.url, database="again").close()
    folder.run(
        "CREATE OR REPLACE VIEW again.runs AS SELECT 1 AS old COMMENT 'treellm:view:0'",  # an older treellm's
        "ALTER TABLE again.treellm_spans DROP COLUMN call_targets",  # a table of a version before that column
        "ALTER TABLE again.treellm_tool_calls MODIFY COLUMN tool Nullable(String)",  # before LowCardinality
    )
    ch = open_clickhouse(folder.url, database="again")
    try:
        run_derive(ch, wait_s=0, once=True)
        assert A.report(ch)["runs"] >= expected["runs"]
        assert ch.df("SELECT count() AS n FROM spans WHERE call_targets IS NOT NULL")["n"][0] > 0
        types = ch.df(
            "SELECT table, name, type FROM system.columns WHERE database = 'again' AND name IN ('tool', 'arguments')"
        )
        found = {(t, n): k for t, n, k in zip(types["table"], types["name"], types["type"], strict=True)}
        assert found[("treellm_tool_calls", "tool")] == "LowCardinality(Nullable(String))"  # upgraded
        assert found[("treellm_loop_events", "tool")] == "LowCardinality(Nullable(String))"  # as created
        assert found[("treellm_tool_calls", "arguments")] == "Nullable(String)"  # many values: plain text
    finally:
        ch.close()
    assert folder.objects("again") == _objects()


def test_the_plan_creates_free_names_replaces_treellms_and_refuses_the_rest() -> None:
    mine = ("View", "treellm:view:0")
    assert plan_views("t", {}) == dict.fromkeys(VIEW_NAMES, False)
    assert plan_views("t", {"runs": mine, "spans": ("View", "treellm:view:99")}) == {
        name: name in ("runs", "spans") for name in VIEW_NAMES
    }
    with pytest.raises(NotOwnedError, match=r"t\.nodes belongs to someone else"):
        plan_views("t", {"runs": mine, "nodes": ("ReplacingMergeTree", "")})
    table = ("ReplacingMergeTree", "treellm:table:1")
    assert plan_tables("t", {}) == dict.fromkeys(TABLE_NAMES, False)
    assert plan_tables("t", {"treellm_spans": table}) == {name: name == "treellm_spans" for name in TABLE_NAMES}
    replicated = ("ReplicatedReplacingMergeTree", "treellm:table:3")  # made ON CLUSTER by the team
    both = {"treellm_spans": replicated, "treellm_traces": table}
    assert plan_tables("t", both) == {name: name in both for name in TABLE_NAMES}
    assert plan_tables("t", dict.fromkeys(TABLE_NAMES, table)) == dict.fromkeys(TABLE_NAMES, True)
    for theirs in (("MergeTree", "treellm:table:1"), ("ReplacingMergeTree", ""), ("View", "treellm:view:3")):
        with pytest.raises(NotOwnedError, match=r"t\.treellm_traces belongs to someone else"):
            plan_tables("t", {"treellm_spans": table, "treellm_traces": theirs})


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--clickhouse-table", "x;y"], "expected a ClickHouse table name"),
        (["--clickhouse-table", "a.b.c"], "expected a ClickHouse table name"),
        (["--clickhouse-table", "system.one"], "outside the system databases"),
        (["--clickhouse-table", "nosuch.otel_traces"], "has no table nosuch.otel_traces"),
        (["--clickhouse-table", "default.runs"], "is not an OpenTelemetry Collector spans table"),
        (["--clickhouse-table", "treellm.spans"], "not one of treellm's views"),
        (["--clickhouse-database", "a-b"], "expected a ClickHouse database name"),
        (["--clickhouse-database", "system"], "outside the system databases"),
    ],
)
def test_a_bad_table_or_database_is_one_error_line(
    folder: Folder,
    pristine: dict[str, tuple[str, str]],
    options: list[str],
    says: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    commands = [["report", "--clickhouse", folder.url], ["ingest", str(SAMPLES[0]), "--clickhouse", folder.url]]
    for argv in commands[: 1 if "has no table" in says else 2]:  # ingest creates a missing table
        assert main([*argv, *options]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("treellm: error: ") and says in err[0], err
    assert folder.user_tables() == pristine


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://localhost:notaport", "expected a port number"),
        ("http://localhost:99999", "expected a port number"),
        ("http://u:PW#x@127.0.0.1:1", "percent-encode"),
        ("http://u:P/W@127.0.0.1:1", "percent-encode"),
        ("u:PW@127.0.0.1:1", "expected a ClickHouse URL"),
        ("ftp://u:PW@127.0.0.1:1", "expected a ClickHouse URL"),
        ("http://:PW@/db", "expected a host"),
    ],
)
def test_a_bad_url_is_one_error_line_without_its_password(
    url: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match=says) as caught:
        open_clickhouse(url)
    assert "PW" not in str(caught.value) and "P/W" not in str(caught.value)
    assert main(["report", "--clickhouse", url]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("treellm: error: ") and says in err[0], err
    assert "PW" not in err[0] and "P/W" not in err[0]


def test_a_refused_connection_never_shows_the_password(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--clickhouse", "http://u:PW%23x@127.0.0.1:1"]) == 1  # nothing listens on port 1
    err = capsys.readouterr().err
    assert "cannot connect to ClickHouse at http://u:***@127.0.0.1:1" in err
    assert "PW" not in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://treellm:s3cret@ch.internal:8123/otel", "http://treellm:***@ch.internal:8123/otel"),
        ("http://u:PW#x@127.0.0.1:1", "http://u:***@127.0.0.1:1"),
        ("u:PW@127.0.0.1:1", "u:***@127.0.0.1:1"),
        ("http://u:p@ss:w@rd@h:1/db", "http://u:***@h:1/db"),
        ("http://:PW@host", "http://:***@host"),
        ("https://host:8123/db?user=me&password=PW", "https://host:8123/db?user=me&password=***"),
        ("http://localhost:notaport", "http://localhost:notaport"),
        ("chdb:./traces", "chdb:./traces"),
    ],
)
def test_display_url_masks_the_password_whatever_the_shape(url: str, shown: str) -> None:
    assert display_url(url) == shown


def test_a_drivers_message_loses_the_password_plain_or_percent_encoded() -> None:
    from treellm.store.clickhouse import _scrubbed

    url = "http://u:P%40ss%23w0rd@h:1/db"
    text = f"cannot reach {url}: user u, password P@ss#w0rd or P%40ss%23w0rd refused"
    assert _scrubbed(text, url) == "cannot reach http://u:***@h:1/db: user u, password *** or *** refused"
