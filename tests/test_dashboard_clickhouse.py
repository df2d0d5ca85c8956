"""The dashboard over ClickHouse (embedded chDB, the Collector exporter's rows): the pages
show what they show over DuckDB, through the same analysis functions; and
`treellm dashboard --clickhouse` hands the URL and table to the Streamlit process."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("chdb")

from clickhouse_rows import file_rows, held_chdb_folder, insert_sql
from streamlit.testing.v1 import AppTest

from dashboard.text import literal
from treellm.analysis import Filters, explorer
from treellm.cli import _dashboard_command, build_parser
from treellm.store import ingest, open_store
from treellm.store.clickhouse import open_clickhouse
from treellm.store.clickhouse_derive import run_derive

ROOT = Path(__file__).resolve().parent.parent
VIEWS = ROOT / "dashboard" / "views"
FILES = sorted((ROOT / "sample_traces").glob("*.jsonl"))
TABLE = "dash.otel_traces"


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The same sample traces in a DuckDB store and in a chDB folder (as the exporter writes them)."""
    folder = tmp_path_factory.mktemp("dash_ch")
    db = folder / "samples.duckdb"
    ingest(db, FILES)
    url = f"chdb:{folder / 'chdb'}"
    ch = open_clickhouse(url, table=TABLE, create_table=True)
    rows = [row for path in FILES for row in file_rows(path)]
    for start in range(0, len(rows), 5000):
        ch.command(insert_sql(rows[start : start + 5000], ch.table))
    run_derive(ch, wait_s=0, once=True)
    ch.close()
    return db, url


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    import streamlit as st

    from dashboard import data

    st.cache_data.clear()
    yield
    st.cache_data.clear()
    data.release()  # chDB holds one folder a process: the next test's is another


def over_duckdb(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TREELLM_DASHBOARD_DB", str(db))
    monkeypatch.delenv("TREELLM_DASHBOARD_PARQUET", raising=False)
    monkeypatch.delenv("TREELLM_CLICKHOUSE", raising=False)


def over_clickhouse(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TREELLM_DASHBOARD_DB", raising=False)
    monkeypatch.delenv("TREELLM_DASHBOARD_PARQUET", raising=False)
    monkeypatch.setenv("TREELLM_CLICKHOUSE", url)
    monkeypatch.setattr(sys, "argv", ["app.py", "--clickhouse-table", TABLE])  # as `treellm dashboard` passes it


def page(name: str, **query: str) -> AppTest:
    at = AppTest.from_file(str(VIEWS / f"{name}.py"), default_timeout=120)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_the_overview_over_clickhouse_shows_the_run_count_of_duckdb(
    stores: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, url = stores
    over_duckdb(db, monkeypatch)
    duck = metrics(page("overview"))
    over_clickhouse(url, monkeypatch)
    at = page("overview")
    assert [c.value for c in at.sidebar.caption] == [literal(f"ClickHouse: {url} ({TABLE})")]
    clickhouse = metrics(at)
    assert int(duck["Runs"]) > 300
    assert clickhouse == duck  # runs, executed, pruned, prune rate, wasted repeats


def test_the_run_explorer_over_clickhouse_opens_a_deep_link(
    stores: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, url = stores
    over_duckdb(db, monkeypatch)
    duck = page("run_explorer", run="sample-nudge_and_cache", node="n2")
    over_clickhouse(url, monkeypatch)
    at = page("run_explorer", run="sample-nudge_and_cache", node="n2")
    assert at.query_params["run"] == "sample-nudge_and_cache"
    assert at.selectbox(key="node_pick").value == "n2"
    assert metrics(at) == metrics(duck)
    assert at.dataframe[0].value.astype(str).values.tolist() == duck.dataframe[0].value.astype(str).values.tolist()
    assert sorted(at.dataframe[1].value["action"]) == ["cache", "nudge"]
    assert any("record 7" in c.value for c in at.code)  # the node's captured result


def test_every_page_renders_over_clickhouse(stores: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    _, url = stores
    over_clickhouse(url, monkeypatch)
    for name in ("shapes", "tools", "tuning"):
        assert page(name).dataframe, name


def test_the_explorer_functions_give_the_same_frames_on_both_engines(stores: tuple[Path, str]) -> None:
    db, url = stores
    duck, ch = open_store(db, read_only=True), open_clickhouse(url, table=TABLE)
    try:
        assert explorer.filter_options(ch) == explorer.filter_options(duck)
        assert explorer.data_version(ch) == explorer.data_version(duck)
        assert list(explorer.run_list(ch)["run_id"]) == list(explorer.run_list(duck)["run_id"])
        for function in (explorer.run_nodes, explorer.run_loop_events):
            a, b = function(ch, "sample-nudge_and_cache"), function(duck, "sample-nudge_and_cache")
            assert list(a.columns) == list(b.columns)
            assert a.astype(str).values.tolist() == b.astype(str).values.tolist()
        for engine in (ch, duck):  # one call, its trace found once: the functions' own frames
            detail = explorer.run_detail(engine, "sample-nudge_and_cache")
            for key, function in (("nodes", explorer.run_nodes), ("loops", explorer.run_loop_events),
                                  ("spans", explorer.run_spans), ("run", explorer.run_row)):  # fmt: skip
                alone = function(engine, "sample-nudge_and_cache")
                assert detail[key].astype(str).values.tolist() == alone.astype(str).values.tolist() and len(alone)
            assert all(frame.empty for frame in explorer.run_detail(engine, "no such run").values())
        a, b = explorer.actions_by_tool(ch), explorer.actions_by_tool(duck)
        assert a.astype(str).values.tolist() == b.astype(str).values.tolist()
        assert explorer.run_row(ch, "no such run").empty
        assert explorer.outcomes(ch) == explorer.outcomes(duck)
        for run_id, node_id in (("sample-nudge_and_cache", "n1"), ("sample-nudge_and_cache", "n2")):
            a, b = explorer.run_spans(ch, run_id), explorer.run_spans(duck, run_id)
            assert list(a.columns) == list(b.columns) and len(a) == 8
            assert a.astype(str).values.tolist() == b.astype(str).values.tolist()
            a, b = explorer.node_attributes(ch, run_id, node_id), explorer.node_attributes(duck, run_id, node_id)
            assert a.values.tolist() == b.values.tolist() and len(a) > 0
            traces = explorer.run_traces(explorer.run_row(ch, run_id))
            assert traces and traces == explorer.run_traces(explorer.run_row(duck, run_id))
            for engine in (ch, duck):  # the run's traces given: the same rows, the lookup skipped
                known = explorer.node_attributes(engine, run_id, node_id, trace_ids=traces)
                assert known.values.tolist() == a.values.tolist()
        assert explorer.run_traces(explorer.run_row(ch, "no such run")) == ()
    finally:
        duck.close()
        ch.close()


def test_the_data_version_over_clickhouse_changes_when_a_derive_pass_writes_and_only_then(tmp_path: Path) -> None:
    rows = file_rows(FILES[0])
    ch = open_clickhouse(f"chdb:{tmp_path / 'chdb'}", table=TABLE, create_table=True)
    try:
        ch.command(insert_sql(rows[:-3], ch.table))
        run_derive(ch, wait_s=0, once=True)
        first = explorer.data_version(ch)
        assert first.spans >= len(rows) - 3
        run_derive(ch, wait_s=0, once=True)  # nothing arrived: nothing written, the same stamp
        assert explorer.data_version(ch) == first
        ch.command(insert_sql(rows[-3:], ch.table))  # late spans: their traces derived again
        run_derive(ch, wait_s=0, once=True)
        assert explorer.data_version(ch) != first
    finally:
        ch.close()


def test_the_dashboard_sets_clickhouse_views_up_once_then_only_connects(
    stores: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dashboard import data
    from treellm.store.clickhouse import ClickHouseConnection

    _, url = stores
    over_clickhouse(url, monkeypatch)
    monkeypatch.setattr(data, "_ATTACHED", set())
    attached: list[str] = []
    attach = ClickHouseConnection.attach

    def counting(self: ClickHouseConnection, **options: bool) -> None:
        attached.append(self.database)
        attach(self, **options)

    monkeypatch.setattr(ClickHouseConnection, "attach", counting)
    for _ in range(3):
        assert data.query("totals", Filters())["runs"] > 0
        data.st.cache_data.clear()
    assert len(attached) == 1
    with pytest.raises(Exception, match="no_such_view"), data._connect(data.source()) as con:  # a view dropped, say
        assert isinstance(con, ClickHouseConnection)
        con.df("SELECT * FROM no_such_view")
    assert data.query("totals", Filters())["runs"] > 0 and len(attached) == 2  # set up again, once


def test_one_pages_clickhouse_queries_share_a_connection_closed_soon_after(
    stores: tuple[Path, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Opening a chDB folder of 10M spans costs 0.12-0.45 s: a page's queries reuse the kept
    connection, which is closed once no query came for ``KEEP_S`` seconds, so that another
    process (a derive pass) can open the folder again."""
    from dashboard import data

    _, url = stores
    over_clickhouse(url, monkeypatch)
    opened: list[str] = []
    open_source = data.open_source

    def counting(src: Any, **options: Any) -> Any:
        opened.append(src.kind)
        return open_source(src, **options)

    monkeypatch.setattr(data, "open_source", counting)
    monkeypatch.setattr(data, "KEEP_S", 3600.0)
    page_queries = ("totals", "repeat_outcome_by_tool", "runs_by_day", "prune_rate_by_tool")
    assert [len(data.query(name, Filters())) > 0 for name in page_queries] == [True] * 4
    assert opened == ["clickhouse"]
    monkeypatch.setattr(data, "KEEP_S", 0.0)
    data.st.cache_data.clear()
    assert data.query("totals", Filters())["runs"] > 0  # its connection is closed as soon as it is idle
    deadline = time.monotonic() + 60
    while data._KEPT.con is not None:
        assert time.monotonic() < deadline, "the idle connection was never closed"
        time.sleep(0.01)
    other = open_clickhouse(f"chdb:{tmp_path / 'other'}", table=TABLE, create_table=True)  # the folder is free
    other.close()
    reopened = len(opened)
    data.st.cache_data.clear()
    assert data.query("totals", Filters())["runs"] > 0 and len(opened) > reopened  # opened afresh


def test_a_chdb_folder_another_process_has_open_shows_busy_then_the_page_once_free(
    stores: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A derive pass holding the folder (chDB: one process at a time) is a busy store: the page
    says so and waits, and shows the data once the folder is free."""
    from dashboard import data

    _, url = stores
    over_clickhouse(url, monkeypatch)
    data.release()
    folder = Path(url.removeprefix("chdb:"))
    with held_chdb_folder(folder):
        assert not data._store_free(data.source())
        at = page("overview")
        warnings = [w.value for w in at.warning]
        assert len(warnings) == 1 and warnings[0].startswith("Store busy, retrying"), warnings
        assert not at.metric
    assert data._store_free(data.source())
    assert int(metrics(page("overview"))["Runs"]) > 300


@pytest.mark.parametrize(
    "query",
    [
        explorer.RunQuery(),
        explorer.RunQuery(sort="wasted", limit=20),
        explorer.RunQuery(sort="duration", descending=False, limit=20),
        explorer.RunQuery(text="status", sort="calls"),
        explorer.RunQuery(text="50%_\\", outcome="completed"),
        explorer.RunQuery(outcome="budget_exhausted", sort="pruned"),
    ],
)
def test_the_run_list_is_the_same_on_both_engines(stores: tuple[Path, str], query: explorer.RunQuery) -> None:
    """Sorted, filtered and searched alike: the same runs, in the same order, with the same counts."""
    db, url = stores
    duck, ch = open_store(db, read_only=True), open_clickhouse(url, table=TABLE)
    try:
        a, b = explorer.run_table(ch, query=query), explorer.run_table(duck, query=query)
        assert list(a.columns) == list(b.columns)
        assert a.astype(str).values.tolist() == b.astype(str).values.tolist()
        if query.text == "status":
            assert 0 < len(b) < int(explorer.run_table(duck)["matching"].iloc[0])
        tool = explorer.run_table(ch, Filters(tool="fetch_url"), query)
        assert list(tool["run_id"]) == list(explorer.run_table(duck, Filters(tool="fetch_url"), query)["run_id"])
    finally:
        duck.close()
        ch.close()


def test_the_dashboard_command_passes_the_clickhouse_url_and_table(
    stores: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url = stores
    monkeypatch.setenv("TREELLM_DASHBOARD_DB", "/elsewhere.duckdb")  # inherited: the arguments decide
    args: argparse.Namespace = build_parser().parse_args(
        ["dashboard", "--clickhouse", url, "--clickhouse-table", TABLE]
    )
    command, env, _ = _dashboard_command(args)
    assert command[-3:] == ["--", "--clickhouse-table", TABLE]
    assert env["TREELLM_CLICKHOUSE"] == url and "TREELLM_DASHBOARD_DB" not in env
    monkeypatch.setenv("TREELLM_CLICKHOUSE", url)  # the variable alone, as `report` and `tune` read it
    command, env, _ = _dashboard_command(build_parser().parse_args(["dashboard", "--clickhouse-table", TABLE]))
    assert command[-1] == TABLE and "TREELLM_DASHBOARD_DB" not in env
    command, env, _ = _dashboard_command(build_parser().parse_args(["dashboard", "--db", "x.duckdb"]))
    assert "--clickhouse-table" not in command and env["TREELLM_DASHBOARD_DB"].endswith("x.duckdb")
    assert command[1:4] == ["-m", "dashboard.serve", "run"]  # the pages' modules imported before it serves


def test_the_server_imports_what_the_source_needs_before_it_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from dashboard.serve import PRELOADED, preload

    for name in ("TREELLM_CLICKHOUSE", "TREELLM_DASHBOARD_DB", "TREELLM_DASHBOARD_PARQUET"):
        monkeypatch.delenv(name, raising=False)
    assert preload() == PRELOADED and all(name in sys.modules for name in PRELOADED)
    monkeypatch.setenv("TREELLM_CLICKHOUSE", "http://localhost:8123")
    assert preload() == (*PRELOADED, "treellm.store.clickhouse")
    monkeypatch.setenv("TREELLM_CLICKHOUSE", "chdb:/data")
    assert preload()[-2:] == ("treellm.store.clickhouse", "chdb")
    # a store given to the dashboard wins over an inherited URL, as the pages decide
    monkeypatch.setenv("TREELLM_DASHBOARD_DB", "/x.duckdb")
    assert preload() == PRELOADED


def test_the_server_opens_an_existing_chdb_folder_before_it_serves(
    stores: tuple[Path, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The folder is opened once with the views set up, then freed after the kept time (as after a
    query); a folder that does not exist is neither opened nor created, and one another process
    holds (a derive pass) is not waited for."""
    from dashboard import data
    from dashboard.serve import preload
    from treellm.store.clickhouse import chdb_holder

    _, url = stores
    for name in ("TREELLM_DASHBOARD_DB", "TREELLM_DASHBOARD_PARQUET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TREELLM_CLICKHOUSE", url)
    monkeypatch.setattr(sys, "argv", ["app.py", "--clickhouse-table", TABLE])
    assert preload()[-2:] == ("chdb", "chdb-folder")
    assert data.source() in data._ATTACHED and data._KEPT.con is not None  # kept, as after a query
    data.release()
    assert chdb_holder(url.removeprefix("chdb:")) is None  # free for a derive pass
    with held_chdb_folder(Path(url.removeprefix("chdb:"))):
        assert preload()[-1] == "chdb" and data._KEPT.con is None
    missing = tmp_path / "no-such-folder"
    monkeypatch.setenv("TREELLM_CLICKHOUSE", f"chdb:{missing}")
    assert preload()[-1] == "chdb" and not missing.exists()


def test_treellm_dashboard_clickhouse_in_a_real_browser(stores: tuple[Path, str], tmp_path: Path) -> None:
    """`treellm dashboard --clickhouse chdb:... --clickhouse-table ...` as a real server: the
    overview shows DuckDB's run count, and no page raises."""
    import subprocess
    import time
    import urllib.request

    from test_browser import CHROMIUM_ARGS, chromium, free_port

    if chromium() is None:
        pytest.skip("no Chromium on this machine (set TREELLM_REQUIRE_BROWSER=1 to make this a failure)")
    from playwright.sync_api import sync_playwright

    db, url = stores
    con = open_store(db, read_only=True)
    runs = len(explorer.run_list(con, limit=10_000))
    con.close()
    port = free_port()
    command = [sys.executable, "-m", "treellm", "dashboard", "--clickhouse", url, "--clickhouse-table", TABLE,
               "--port", str(port)]  # fmt: skip
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path) as server:
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2) as response:
                        if response.status == 200:
                            break
                except OSError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        pytest.fail(f"the dashboard did not start: {server.stdout.read() if server.stdout else ''}")
                    time.sleep(0.3)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
                try:
                    page = browser.new_page(viewport={"width": 1400, "height": 1000})
                    for path, text in (("", "Tuning verdicts at a glance"), ("run", "Node details")):
                        page.goto(f"{base}/{path}")
                        page.get_by_text(text, exact=False).first.wait_for(timeout=60_000)
                        page.wait_for_function(
                            "() => document.querySelectorAll('[data-testid=stSkeleton]').length == 0", timeout=60_000
                        )
                        assert page.locator("[data-testid='stException']").count() == 0, path
                        if not path:
                            values = page.locator("[data-testid='stMetricValue']").all_inner_texts()
                            assert values[0] == f"{runs:,}", values
                            assert page.get_by_text(TABLE, exact=False).count() >= 1  # the sidebar names the table
                finally:
                    browser.close()
        finally:
            server.terminate()  # within the kept connection's seconds: chDB's session still open
            output, _ = server.communicate(timeout=30)
    assert server.returncode == 0, output[-2000:]  # a clean stop (an open session crashed chDB's exit)
