"""The analysis on two engines: DuckDB (treellm's store) and ClickHouse (chDB over the
Collector exporter's ``otel_traces``, exact DDL, rows written as the exporter writes them)
give identical results on the sample traces.

One chDB folder for the module (chDB allows one data folder per process): the sample
traces in ``samples.otel_traces``, the foreign data in ``foreign.otel_traces``, each read
through treellm's views in a database of its own (``treellm_samples``, ``treellm_foreign``),
since the connections stay open side by side.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("chdb")

from clickhouse_rows import file_rows, held_chdb_folder, insert_sql

from treellm import analysis as A
from treellm.cli import main
from treellm.errors import ConfigError
from treellm.store import ingest, open_store
from treellm.store.clickhouse import ClickHouseConnection, display_url, named_parameters, open_clickhouse
from treellm.store.clickhouse_derive import run_derive
from treellm.store.clickhouse_ingest import ingest_clickhouse
from treellm.store.ingest import IngestReport

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "sample_traces").glob("*.jsonl"))
# other frameworks' traces (recorded through their real instrumentors), tau-bench and any-agent
# traces, mini-swe-agent and SWE-agent trajectories: what `treellm ingest --clickhouse` writes for them
FOREIGN = [ROOT / "tests" / "data" / "external", ROOT / "tests" / "data" / "frameworks",
           *sorted(p for p in (ROOT / "tests" / "data" / "mini-swe-agent").iterdir() if p.is_dir()),
           *sorted((ROOT / "tests" / "data" / "swe-agent").glob("*.traj")),
           *sorted((ROOT / "sample_traces").glob("real_*.json"))]  # fmt: skip

FRAMES = [
    "prune_rate_by_tool", "prune_rate_by_model", "repeat_outcome_by_tool", "repeat_samples", "repeats",
    "identical_repeats_by_tool", "near_repeats", "near_repeats_by_tool", "tuning_by_tool", "what_if_by_tool_limit",
    "shape_by_run", "shape_distribution", "shape_groups", "runs_by_day", "cost_by_tool",
]  # fmt: skip


def _value(v: Any) -> Any:
    """One cell, engine-neutral: NULL/NaN -> None, numpy scalars -> Python, integral floats
    -> int, floats rounded, arrays and sets -> sorted-or-ordered tuples, dates -> ISO text."""
    if isinstance(v, np.ndarray | list | tuple):
        return tuple(_value(x) for x in v)
    if isinstance(v, set | frozenset):
        return tuple(sorted(_value(x) for x in v))
    if isinstance(v, dict):
        return tuple(sorted((k, _value(x)) for k, x in v.items()))
    if v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, pd.Timestamp | dt.date):
        return pd.Timestamp(v).date().isoformat()
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float):
        return int(v) if v == int(v) else round(v, 9)
    return v


def normalised(frame: pd.DataFrame) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Columns and rows sorted: frames equal after sorting, dtypes normalised."""
    rows = [tuple(_value(v) for v in row) for row in frame.itertuples(index=False, name=None)]
    return [str(c) for c in frame.columns], sorted(rows, key=repr)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("clickhouse")


def _load(folder: Path, name: str, files: list[Path]) -> tuple[Any, ClickHouseConnection]:
    db = folder / f"{name}.duckdb"
    ingest(db, files)
    ch = open_clickhouse(
        f"chdb:{folder / 'chdb'}", table=f"{name}.otel_traces", database=f"treellm_{name}", create_table=True
    )
    rows = [row for path in files for row in file_rows(path)]
    for start in range(0, len(rows), 5000):
        ch.command(insert_sql(rows[start : start + 5000], ch.table))
    run_derive(ch, wait_s=0, once=True)  # what `treellm derive` does beside the Collector
    return open_store(db, read_only=True), ch


@pytest.fixture(scope="module")
def samples(folder: Path) -> Iterator[tuple[Any, ClickHouseConnection]]:
    duck, ch = _load(folder, "samples", SAMPLES)
    yield duck, ch
    duck.close()
    ch.close()


def test_the_otel_traces_table_holds_every_sample_span(samples: tuple[Any, ClickHouseConnection]) -> None:
    duck, ch = samples
    assert (
        int(ch.df(f"SELECT count() AS n FROM {ch.table}")["n"][0])
        == duck.execute("SELECT count(*) FROM spans").fetchone()[0]
    )


@pytest.mark.parametrize("view", ["runs", "tool_calls", "loop_events"])
def test_the_views_agree_cell_for_cell(samples: tuple[Any, ClickHouseConnection], view: str) -> None:
    duck, ch = samples
    # source names the engine; the *_raw event columns keep each engine's spelling of an OTLP
    # array (DuckDB: the OTLP/JSON AnyValue, the exporter: compact JSON), no analysis reads them
    frame = duck.execute(f"SELECT * FROM {view} LIMIT 0").df()
    columns = [c for c in frame.columns if c != "source" and not c.endswith("_raw")]
    select = f"SELECT {', '.join(f'`{c}`' for c in columns)} FROM {view}"
    assert normalised(ch.df(select)) == normalised(duck.execute(select.replace("`", '"')).df())


def test_totals_report_and_tune_are_identical(samples: tuple[Any, ClickHouseConnection]) -> None:
    duck, ch = samples
    assert A.totals(ch) == A.totals(duck)
    assert A.report(ch) == A.report(duck)
    assert A.tune(ch) == A.tune(duck)
    assert A.report(duck)["runs"] > 0


@pytest.mark.parametrize("name", FRAMES)
def test_each_analysis_function_gives_identical_frames(samples: tuple[Any, ClickHouseConnection], name: str) -> None:
    duck, ch = samples
    expected = getattr(A, name)(duck)
    assert normalised(getattr(A, name)(ch)) == normalised(expected)


def test_filters_become_typed_parameters_with_the_same_answer(samples: tuple[Any, ClickHouseConnection]) -> None:
    duck, ch = samples
    tool = A.prune_rate_by_tool(duck)["tool"].iloc[0]
    since = dt.datetime(2000, 1, 1)
    for f in (A.Filters(tool=tool), A.Filters(since=since, tool=tool), A.Filters(service="no-such-service")):
        assert A.totals(ch, f) == A.totals(duck, f)
        assert normalised(A.repeat_samples(ch, f)) == normalised(A.repeat_samples(duck, f))
        assert normalised(A.shape_by_run(ch, f)) == normalised(A.shape_by_run(duck, f))
    for by in ("day", "outcome", "model"):  # each group's text, and the runs among one value, on both engines
        values = A.shape_values(duck, by=by)
        assert A.shape_values(ch, by=by) == values and values
        among = (by, values[0])
        assert normalised(A.shape_groups(ch, by="agent", among=among)) == normalised(
            A.shape_groups(duck, by="agent", among=among))  # fmt: skip
        assert normalised(A.shape_distribution(ch, among=among)) == normalised(A.shape_distribution(duck, among=among))


def test_shapes_of_chosen_columns_are_those_columns_of_every_shape_in_order(
    samples: tuple[Any, ClickHouseConnection],
) -> None:
    duck, ch = samples
    columns = ["outcome", "run_id", "max_depth", "day", "nodes"]
    for con in (duck, ch):
        whole = A.shape_by_run(con)
        chosen = A.shape_by_run(con, columns=columns)
        assert list(chosen.columns) == columns and len(chosen) == len(whole) > 0
        assert sorted(_ordered(chosen)) == sorted(_ordered(whole[columns]))  # the same rows
        starts = dict(zip(whole["run_id"], whole["start_ns"], strict=True))
        order = [starts[run] for run in chosen["run_id"]]
        assert order == sorted(order)  # in start order
    with pytest.raises(ValueError, match="no shape column breadth; expected some of run_id"):
        A.shape_by_run(duck, columns=["run_id", "breadth"])


def _ordered(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    return [tuple(_value(v) for v in row) for row in frame.itertuples(index=False, name=None)]


@pytest.mark.parametrize("data", ["samples", "foreign"])
def test_judgements_kept_by_derive_are_what_duckdb_judges_in_its_order(
    data: str, request: pytest.FixtureRequest
) -> None:
    duck, ch, *_ = request.getfixturevalue(data)
    kept = ch.df("SELECT count() AS n FROM identical_repeats")["n"][0]
    assert kept == len(A.repeats(duck)) > 0  # read from the derived table, not judged again
    assert ch.df("SELECT count() AS n FROM near_pairs")["n"][0] == len(A.near_repeats(duck)) > 0
    tool = A.repeats(duck)["tool"].value_counts().index[0]
    for f in (None, A.Filters(tool=tool), A.Filters(since=dt.datetime(2000, 1, 1)), A.Filters(service="none")):
        for name in ("repeats", "near_repeats", "identical_repeats_by_tool", "near_repeats_by_tool"):
            got, expected = getattr(A, name)(ch, f), getattr(A, name)(duck, f)
            assert list(got.columns) == list(expected.columns) and _ordered(got) == _ordered(expected), (name, f)
    assert set(A.repeats(duck, A.Filters(tool=tool))["tool"]) == {tool}
    tools = set(A.repeats(duck)["tool"].value_counts().index[1:])  # every tool but the most repeated
    for engine in (duck, ch):  # only those tools' repeats, judged with every call between
        every = A.repeats(duck)
        assert _ordered(A.repeats(engine, tools=tools)) == _ordered(every[every["tool"].isin(tools)])
    for engine in (duck, ch):  # the first rows, in the order of the whole
        assert _ordered(A.repeats(engine, limit=3)) == _ordered(A.repeats(duck))[:3]
        assert _ordered(A.near_repeats(engine, limit=3)) == _ordered(A.near_repeats(duck))[:3]
    for engine in (duck, ch):  # the tools page's pairs: per tool and the first rows, from one judgement
        for f in (None, A.Filters(tool=tool)):
            by_tool, rows = A.identical_repeats_and_rows(engine, f, limit=3)
            assert _ordered(by_tool) == _ordered(A.identical_repeats_by_tool(duck, f))
            assert _ordered(rows) == _ordered(A.repeats(duck, f))[:3]
            near, pairs = A.near_repeats_and_pairs(engine, f, limit=3)
            assert _ordered(near) == _ordered(A.near_repeats_by_tool(duck, f))
            assert _ordered(pairs) == _ordered(A.near_repeats(duck, f))[:3]
    # another similarity is paired and judged at query time on both engines (nothing kept says it)
    loose = A.near_repeats(duck, similarity=0.5)
    assert _ordered(A.near_repeats(ch, similarity=0.5)) == _ordered(loose)
    assert len(loose) >= len(A.near_repeats(duck))


def test_report_and_tune_commands_over_clickhouse_print_what_duckdb_prints(
    samples: tuple[Any, ClickHouseConnection], folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outputs = []
    clickhouse = ["--clickhouse", f"chdb:{folder / 'chdb'}", "--clickhouse-table", "samples.otel_traces",
                  "--clickhouse-database", "treellm_samples"]  # fmt: skip
    for source in (["--db", str(folder / "samples.duckdb")], clickhouse):
        assert main(["report", *source, "--format", "json"]) == 0
        assert main(["tune", *source]) == 0
        outputs.append([json.loads(line) for line in capsys.readouterr().out.splitlines()])
    assert outputs[0] == outputs[1]


def test_named_parameters_rewrites_placeholders_outside_quoted_text() -> None:
    sql, params = named_parameters("SELECT '?', \"a?\" FROM t WHERE a = ? AND b = ? AND has(?, c)", [1, "x", ["r"]])
    assert sql == "SELECT '?', \"a?\" FROM t WHERE a = {p0:Int64} AND b = {p1:String} AND has({p2:Array(String)}, c)"
    assert params == {"p0": 1, "p1": "x", "p2": ["r"]}
    with pytest.raises(ValueError, match="expected 1 parameters, got 2"):
        named_parameters("SELECT ?", [1, 2])


def test_a_url_that_is_no_clickhouse_url_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TREELLM_CLICKHOUSE", raising=False)
    with pytest.raises(ConfigError, match="expected a ClickHouse URL"):
        open_clickhouse("postgres://localhost")
    with pytest.raises(ConfigError, match="TREELLM_CLICKHOUSE"):
        open_clickhouse()
    with pytest.raises(ConfigError, match="expected a ClickHouse table name"):
        open_clickhouse("chdb:/nonexistent", table="x; DROP TABLE y")


@pytest.fixture(scope="module")
def foreign(folder: Path) -> Iterator[tuple[Any, ClickHouseConnection, IngestReport]]:
    """The foreign data ingested twice: into DuckDB, and into ClickHouse by ``ingest --clickhouse``."""
    db = folder / "foreign.duckdb"
    ingest(db, FOREIGN)
    ch = open_clickhouse(
        f"chdb:{folder / 'chdb'}", table="foreign.otel_traces", database="treellm_foreign", create_table=True
    )
    report = ingest_clickhouse(ch, FOREIGN)
    duck = open_store(db, read_only=True)
    yield duck, ch, report
    duck.close()
    ch.close()


def test_foreign_data_reports_the_same_figures(foreign: tuple[Any, ClickHouseConnection, IngestReport]) -> None:
    duck, ch, report = foreign
    expected = A.report(duck)
    assert expected["runs"] >= 80 and report.runs == expected["runs"]
    assert report.spans == duck.execute("SELECT count(*) FROM spans").fetchone()[0]
    assert A.report(ch) == expected
    assert A.tune(ch) == A.tune(duck)
    assert A.totals(ch) == A.totals(duck)


@pytest.mark.parametrize("name", FRAMES)
def test_foreign_data_gives_identical_frames(
    foreign: tuple[Any, ClickHouseConnection, IngestReport], name: str
) -> None:
    duck, ch, _ = foreign
    assert normalised(getattr(A, name)(ch)) == normalised(getattr(A, name)(duck))


@pytest.mark.parametrize("view", ["runs", "nodes", "tool_calls", "loop_events"])
def test_foreign_views_agree_cell_for_cell_source_included(
    foreign: tuple[Any, ClickHouseConnection, IngestReport], view: str
) -> None:
    duck, ch, _ = foreign
    frame = duck.execute(f"SELECT * FROM {view} LIMIT 0").df()
    columns = [c for c in frame.columns if not c.endswith("_raw")]
    select = f"SELECT {', '.join(f'`{c}`' for c in columns)} FROM {view}"
    rows = normalised(duck.execute(select.replace("`", '"')).df())
    assert normalised(ch.df(select)) == rows
    assert rows[1] or view == "loop_events"  # no foreign source carries loop:detected events


def test_ingesting_the_same_files_again_writes_nothing(foreign: tuple[Any, ClickHouseConnection, IngestReport]) -> None:
    _, ch, first = foreign
    before = int(ch.df(f"SELECT count() AS n FROM {ch.table}")["n"][0])
    again = ingest_clickhouse(ch, FOREIGN[:2])
    assert (again.spans, again.runs) == (0, 0) and again.duplicates > 0
    assert int(ch.df(f"SELECT count() AS n FROM {ch.table}")["n"][0]) == before == first.spans


def test_own_spans_written_by_ingest_read_as_the_exporter_wrote_them(
    samples: tuple[Any, ClickHouseConnection], folder: Path
) -> None:
    _, exported = samples
    ch = open_clickhouse(f"chdb:{folder / 'chdb'}", table="own.otel_traces", database="treellm_own", create_table=True)
    try:
        report = ingest_clickhouse(ch, SAMPLES)
        assert report.spans > 0 and report.bad_records == ()
        assert A.report(ch) == A.report(exported)
        assert A.tune(ch) == A.tune(exported)
        assert normalised(A.repeat_samples(ch)) == normalised(A.repeat_samples(exported))
    finally:
        ch.close()


def test_ingest_command_writes_into_clickhouse_and_report_reads_it(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trajectories = str(FOREIGN[2])
    clickhouse = ["--clickhouse", f"chdb:{folder / 'chdb'}", "--clickhouse-table", "cli.otel_traces"]
    assert main(["ingest", trajectories, *clickhouse, "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["spans"] > 0 and written["runs"] > 0
    assert main(["ingest", trajectories, "--db", str(folder / "cli.duckdb"), "--json"]) == 0
    capsys.readouterr()
    outputs = []
    for source in (clickhouse, ["--db", str(folder / "cli.duckdb")]):
        assert main(["report", *source, "--format", "json"]) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1] and outputs[0]["runs"] == written["runs"]


def test_a_password_in_the_url_never_reaches_a_message() -> None:
    assert display_url("http://treellm:s3cret@ch.internal:8123/otel") == "http://treellm:***@ch.internal:8123/otel"
    assert display_url("chdb:./traces") == "chdb:./traces"
    with pytest.raises(ConfigError) as caught:
        open_clickhouse("ftp://treellm:s3cret@ch.internal")
    assert "s3cret" not in str(caught.value)


def test_a_column_added_to_a_view_in_one_place_reaches_both_engines(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One Column added to the model: DuckDB's view has it, ClickHouse's table gets it, and the
    traces derived before the change are derived again (what an upgrade does), equal cell for cell."""
    import dataclasses

    from treellm.store import clickhouse, connection, schema, views
    from treellm.store.clickhouse_derive import underived

    files = SAMPLES[:2]
    old_duck, ch = _load(folder, "grown", files)  # derived under the model as it is
    old_duck.close()
    traces = int(ch.df("SELECT uniqExact(TraceId) AS n FROM grown.otel_traces")["n"][0])
    assert underived(ch) == 0 and traces > 1
    ch.close()

    added = views.Column("shouted", "upper(s.tool_name) || '!'")  # the one change: a Column of tool_calls
    plus = dataclasses.replace(views.TOOL_CALLS, columns=(*views.TOOL_CALLS.columns, added))
    monkeypatch.setattr(views, "VIEWS", tuple(plus if v.name == "tool_calls" else v for v in views.VIEWS))
    ddl = views.duckdb_views()  # every view of DuckDB's DDL, generated from the model
    assert ddl.count("AS shouted") == 1
    monkeypatch.setattr(connection, "VIEWS", ddl)
    monkeypatch.setattr(connection, "VIEWS_RECORD", schema.views_record(ddl))
    monkeypatch.setattr(connection, "TEMPORARY_VIEWS", views.duckdb_views(temporary=True))
    clickhouse._described.cache_clear()
    try:
        ch = open_clickhouse(f"chdb:{folder / 'chdb'}", table="grown.otel_traces", database="treellm_grown")
        assert underived(ch) == traces  # derived under another schema: due again, the report says so
        run_derive(ch, wait_s=0, once=True)
        assert underived(ch) == 0
        db = folder / "grown-plus.duckdb"
        ingest(db, files)
        select = "SELECT trace_id, span_id, shouted FROM tool_calls"
        with open_store(db, read_only=True) as duck:
            in_duckdb = normalised(duck.execute(select).df())
        assert in_duckdb == normalised(ch.df(select))
        assert len(in_duckdb[1]) > 10 and all(shouted.endswith("!") for _, _, shouted in in_duckdb[1])
        ch.close()
    finally:
        clickhouse._described.cache_clear()


def test_a_chdb_folder_another_process_has_open_is_busy_and_named_with_that_process(tmp_path: Path) -> None:
    """chDB lets one process at a time open a folder: the second is told which process has it
    (a busy store, which the dashboard retries), not chDB's "Error initializing EmbeddedServer"."""
    import subprocess
    import sys

    from treellm.errors import StoreBusyError
    from treellm.store.clickhouse import chdb_holder

    folder = tmp_path / "held"  # made by its holder: this process has the module's folder open
    assert chdb_holder(folder) is None
    with held_chdb_folder(folder) as pid:
        assert chdb_holder(folder) == pid
        with pytest.raises(StoreBusyError, match=rf"the chDB folder {folder} is open in process {pid}: "):
            open_clickhouse(f"chdb:{folder}", table="otel_traces")
        derive = subprocess.run([sys.executable, "-m", "treellm", "derive", "--clickhouse", f"chdb:{folder}",
                                 "--clickhouse-table", "otel_traces", "--once", "--wait", "0"],
                                check=False, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert derive.returncode == 1
        assert derive.stderr.splitlines() == [  # one line, chDB's own lines never printed
            f"treellm: error: the chDB folder {folder} is open in process {pid}: chDB lets one process at a "
            "time open a folder (a derive pass, the dashboard, a report); try again when it is done, or serve the "
            "folder with a ClickHouse server to share it"
        ]
    assert chdb_holder(folder) is None  # free again
    with held_chdb_folder(folder) as again:  # another process opens it
        assert chdb_holder(folder) == again
