"""`treellm derive`: the spans the Collector's ClickHouse exporter wrote into ``otel_traces``
(treellm's own and other frameworks', rows exactly as the exporter writes them) give the
reports DuckDB gives for the same spans, whatever order or pass they arrive in.

One chDB folder for the module (chDB allows one data folder per process); each scenario has
its own spans table and treellm database in it.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from clickhouse_rows import exporter_rows, file_rows, insert_sql
from test_clickhouse import normalised

from treellm import analysis as A
from treellm.analysis import explorer
from treellm.cli import main
from treellm.derive.formats import detect_format, iter_traces_data
from treellm.derive.transform import WRITTEN_BACK
from treellm.errors import ConfigError
from treellm.store import ingest, open_store
from treellm.store.clickhouse import ClickHouseConnection, open_clickhouse
from treellm.store.clickhouse_derive import (
    DeriveHealth,
    Shard,
    derive_once,
    parse_shard,
    record_traces,
    run_derive,
    serve_health,
    underived,
    write_derived,
)
from treellm.store.clickhouse_ingest import ingest_clickhouse
from treellm.store.clickhouse_views import (
    DAILY,
    TABLE_NAMES,
    WHOLE,
    derived_spans_ddl,
    derived_traces_ddl,
    derived_view_ddl,
)

ROOT = Path(__file__).resolve().parents[1]
# other frameworks' spans as their real instrumentors recorded them, and any-agent's traces
FOREIGN = [*sorted((ROOT / "tests" / "data" / "frameworks").glob("*.pb")),
           *sorted((ROOT / "tests" / "data" / "external").glob("any-agent-*.json"))]  # fmt: skip
SAMPLES = sorted((ROOT / "sample_traces").glob("*.jsonl"))
FRAMES = ["prune_rate_by_tool", "repeat_outcome_by_tool", "repeats", "near_repeats", "tuning_by_tool", "shape_by_run"]


def rows_of(path: Path) -> list[dict[str, Any]]:
    """The exporter's rows for every span of a trace file, whatever its format."""
    fmt = detect_format(path)
    if fmt == "otlp-jsonl":
        return file_rows(path)
    return [row for _, data in iter_traces_data(path, fmt) for row in exporter_rows(data)]


def insert(ch: ClickHouseConnection, rows: list[dict[str, Any]]) -> None:
    for start in range(0, len(rows), 5000):
        ch.command(insert_sql(rows[start : start + 5000], ch.table))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("derive")


def _duckdb(db: Path, files: list[Path]) -> Iterator[Any]:
    """The same files ingested into a DuckDB store: what the ClickHouse side must equal."""
    ingest(db, files)
    con = open_store(db, read_only=True)
    yield con
    con.close()


@pytest.fixture(scope="module")
def duck_foreign(folder: Path) -> Iterator[Any]:
    yield from _duckdb(folder / "foreign.duckdb", FOREIGN)


@pytest.fixture(scope="module")
def duck_samples(folder: Path) -> Iterator[Any]:
    yield from _duckdb(folder / "samples.duckdb", SAMPLES)


Connect = Callable[..., ClickHouseConnection]


@pytest.fixture(scope="module")
def connect(folder: Path) -> Iterator[Connect]:
    """Connections to the module's chDB folder, each scenario's table and database, all closed at
    the end only: chDB shares one engine per process, and closing a session while others are open
    is not safe."""
    opened: list[ClickHouseConnection] = []

    def open_one(name: str, database: str | None = None, partition: str | None = None) -> ClickHouseConnection:
        ch = open_clickhouse(
            f"chdb:{folder / 'chdb'}", table=f"{name}.otel_traces", database=database or f"treellm_{name}",
            create_table=True, partition=partition,
        )  # fmt: skip
        opened.append(ch)
        return ch

    yield open_one
    for ch in reversed(opened):
        ch.close()


@pytest.fixture(scope="module")
def foreign(connect: Connect) -> ClickHouseConnection:
    """Other frameworks' spans sent to the Collector, then one `derive --once`."""
    ch = connect("foreign", None)
    insert(ch, [row for path in FOREIGN for row in rows_of(path)])
    run_derive(ch, wait_s=0, once=True)
    return ch


def test_other_frameworks_spans_from_the_collector_report_and_tune_as_duckdb(
    foreign: ClickHouseConnection, duck_foreign: Any
) -> None:
    expected = A.report(duck_foreign)
    assert expected["runs"] > 0 and expected["tool_calls"] > 0
    assert A.report(foreign) == expected
    assert A.tune(foreign) == A.tune(duck_foreign)
    assert A.totals(foreign) == A.totals(duck_foreign)


@pytest.mark.parametrize("name", FRAMES)
def test_other_frameworks_spans_give_identical_frames(
    foreign: ClickHouseConnection, duck_foreign: Any, name: str
) -> None:
    assert normalised(getattr(A, name)(foreign)) == normalised(getattr(A, name)(duck_foreign))


@pytest.mark.parametrize("view", ["runs", "tool_calls", "loop_events", "nodes"])
def test_other_frameworks_views_agree_cell_for_cell(
    foreign: ClickHouseConnection, duck_foreign: Any, view: str
) -> None:
    frame = duck_foreign.execute(f"SELECT * FROM {view} LIMIT 0").df()
    columns = [c for c in frame.columns if c != "source" and not c.endswith("_raw")]
    select = f"SELECT {', '.join(f'`{c}`' for c in columns)} FROM {view}"
    assert normalised(foreign.df(select)) == normalised(duck_foreign.execute(select.replace("`", '"')).df())


def test_the_run_explorer_reads_other_frameworks_results_alike_on_both_engines(
    foreign: ClickHouseConnection, duck_foreign: Any
) -> None:
    """A call's result held only by its attribute (its ``result`` column NULL, read back by
    ``result_sql``): each run's nodes and a search for a result's words give the same on both
    engines, and the search finds the run."""
    held = duck_foreign.execute(
        "SELECT t.run_id, t.result FROM tool_calls t JOIN spans s USING (trace_id, span_id) "
        "WHERE s.result IS NULL AND length(t.result) >= 20 ORDER BY t.run_id, t.span_id"
    ).fetchall()
    runs = sorted({run for run, _ in held})
    assert len(runs) >= 5
    for run in runs:
        a, b = explorer.run_nodes(foreign, run), explorer.run_nodes(duck_foreign, run)
        assert list(a.columns) == list(b.columns) and len(b)
        assert a.astype(str).values.tolist() == b.astype(str).values.tolist()
    run, text = held[0]
    query = explorer.RunQuery(text=text[:20])
    a, b = explorer.run_table(foreign, query=query), explorer.run_table(duck_foreign, query=query)
    assert run in list(b["run_id"])
    assert a.astype(str).values.tolist() == b.astype(str).values.tolist()


def test_a_second_pass_finds_nothing_and_a_lost_watermark_duplicates_nothing(foreign: ClickHouseConnection) -> None:
    assert derive_once(foreign, wait_s=0).traces == 0 and underived(foreign) == 0
    before = A.report(foreign)
    spans = int(foreign.df("SELECT count() AS n FROM spans")["n"][0])
    # a worker killed after writing the spans, before recording their traces: all derived again
    foreign.command(f"TRUNCATE TABLE {foreign.database}.treellm_traces")
    assert underived(foreign) > 0
    again = run_derive(foreign, wait_s=0, once=True)
    assert sum(p.traces for p in again) > 0
    assert int(foreign.df("SELECT count() AS n FROM spans")["n"][0]) == spans
    assert A.report(foreign) == before


def test_a_changed_judgement_rule_judges_every_trace_again(
    foreign: ClickHouseConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    import treellm.store.clickhouse_views as views

    assert underived(foreign) == 0
    traces = int(foreign.df("SELECT uniqExact(TraceId) AS n FROM foreign.otel_traces")["n"][0])
    monkeypatch.setattr(views, "rules_digest", lambda: "another rule")  # an upgrade that changed a rule
    assert underived(foreign) == traces


def test_a_late_root_derives_its_trace_again(connect: Connect, duck_samples: Any) -> None:
    ch = connect("late", None)
    rows = [row for path in SAMPLES for row in file_rows(path)]
    roots = [r for r in rows if not r["ParentSpanId"]]
    insert(ch, [r for r in rows if r["ParentSpanId"]])
    first = derive_once(ch, wait_s=0)
    assert first.traces == len({r["TraceId"] for r in rows}) and first.spans == len(rows) - len(roots)
    insert(ch, roots)  # the roots end last: their export batch comes after their children's
    assert underived(ch) == len({r["TraceId"] for r in roots})
    second = derive_once(ch, wait_s=0)
    assert second.traces == len({r["TraceId"] for r in roots}) and second.spans == len(rows)
    assert A.report(ch) == A.report(duck_samples)
    assert A.tune(ch) == A.tune(duck_samples)


def test_a_trace_derived_again_into_fewer_rows_keeps_none_of_the_old(
    connect: Connect, folder: Path, duck_samples: Any
) -> None:
    """Rows are numbered within their trace; a derivation with fewer rows deletes the numbers
    beyond its count, so no view shows a row of the earlier derivation."""
    ch = connect("fewer", None)
    db = folder / "fewer.duckdb"
    shutil.copy(folder / "samples.duckdb", db)
    with open_store(db) as con:
        traces = [t for (t,) in con.execute("SELECT DISTINCT trace_id FROM spans ORDER BY 1").fetchall()]
        _, buckets = write_derived(con, ch, traces, version=1)
        record_traces(ch, dict.fromkeys(traces, (0, 0)), Shard(), 1, buckets)
        assert normalised(ch.df("SELECT * EXCEPT (source) FROM runs")) == normalised(
            con.execute("SELECT * EXCLUDE (source) FROM runs").df()
        )
        # the same traces derived again without a run's spans: fewer runs, nodes and calls
        run = str(A.repeats(con)["run_id"].iloc[0])  # a run with an identical repeat: judged rows go too
        con.execute("DELETE FROM span_events WHERE span_id IN (SELECT span_id FROM spans WHERE run_id = ?)", [run])
        con.execute("DELETE FROM spans WHERE run_id = ?", [run])
        _, buckets = write_derived(con, ch, traces, version=2)
        record_traces(ch, dict.fromkeys(traces, (0, 0)), Shard(), 2, buckets)
        for view in ("runs", "nodes", "tool_calls", "loop_events"):
            columns = [c for c in con.execute(f"SELECT * FROM {view} LIMIT 0").df().columns if c != "source"]
            select = f"SELECT {', '.join(f'`{c}`' for c in columns)} FROM {view}"
            assert normalised(ch.df(select)) == normalised(con.execute(select.replace("`", '"')).df()), view
        assert run not in set(ch.df("SELECT run_id FROM runs")["run_id"])
        for name in ("repeats", "near_repeats"):  # the judgements kept per trace, renumbered too
            got, expected = getattr(A, name)(ch), getattr(A, name)(con)
            assert normalised(got) == normalised(expected), name
        assert run not in set(A.repeats(ch)["run_id"])
    for table in ("treellm_nodes", "treellm_identical_repeats"):
        deleted = ch.df(f"SELECT count() AS n FROM {ch.database}.{table} WHERE is_deleted = 1")
        assert int(deleted["n"][0]) > 0, table  # the numbers beyond the new count, deleted


def _derived_spans(ch: ClickHouseConnection) -> list[bytes]:
    """Every derived span row but its version, as JSON lines (chDB's DataFrames cannot hold an
    array of maps)."""
    rows = ch.export_rows(f"SELECT * EXCEPT (version) FROM {ch.database}.treellm_spans FINAL")
    return sorted(rows.splitlines())


def test_two_shards_give_the_tables_of_one_pass(connect: Connect, duck_samples: Any) -> None:
    one = connect("shards", "treellm_one")
    split = connect("shards", "treellm_split")
    insert(one, [row for path in SAMPLES for row in file_rows(path)])
    run_derive(one, wait_s=0, once=True)
    parts = [run_derive(split, shard=parse_shard(s), wait_s=0, once=True, batch_spans=1000) for s in ("0/2", "1/2")]
    assert all(sum(p.traces for p in passes) > 0 for passes in parts)  # each shard had its share
    assert len(parts[0]) > 1  # a small batch: several passes, whole traces each
    assert _derived_spans(split) == _derived_spans(one)
    traces = split.df("SELECT shard, count() AS n FROM treellm_traces FINAL GROUP BY shard ORDER BY shard")
    assert list(traces["shard"]) == ["0/2", "1/2"]
    assert A.report(split) == A.report(duck_samples)


def test_a_trace_waits_for_its_quiet_window_and_retried_rows_count_once(connect: Connect) -> None:
    ch = connect("quiet", None)
    rows = file_rows(SAMPLES[0])
    insert(ch, rows)
    insert(ch, rows[:50])  # an exporter's retry writes the same spans again
    last = max(int(pd.Timestamp(r["Timestamp"]).value) + int(r["Duration"]) for r in rows)  # the newest span's end, ns
    early = derive_once(ch, wait_s=60, now_ns=last + 30 * 10**9)
    assert early.traces == 0 and early.waiting > 0 and early.lag_s > 0
    late = derive_once(ch, wait_s=60, now_ns=last + 61 * 10**9)
    assert late.traces == len({r["TraceId"] for r in rows}) and late.spans == len(rows)
    assert late.waiting == 0 and late.lag_s == 0
    assert int(ch.df("SELECT count() AS n FROM spans")["n"][0]) == len(rows)
    ahead = [{**r, "TraceId": "f" * 31 + "1", "Timestamp": "2200-01-01 00:00:00.000000000"} for r in rows[:3]]
    insert(ch, ahead)  # a clock ahead of this one stamped these
    assert derive_once(ch, wait_s=60, now_ns=last + 61 * 10**9).waiting == 1
    assert derive_once(ch, wait_s=0).traces == 1  # no quiet window: nothing is held back


def test_the_derive_command_and_the_reports_warning(
    folder: Path, connect: Connect, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"chdb:{folder / 'chdb'}"
    options = ["--clickhouse", url, "--clickhouse-table", "cli.otel_traces", "--clickhouse-database", "treellm_cli"]
    insert(connect("cli", None), file_rows(SAMPLES[0]))
    capsys.readouterr()
    assert main(["report", *options, "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["runs"] == 0 and "not derived yet" in err and "treellm derive" in err
    assert main(["derive", *options, "--once", "--wait", "0", "--json"]) == 0
    passes = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert passes[0]["traces"] > 0 and passes[0]["shard"] == "0/1" and passes[-1]["due"] == 0
    assert main(["report", *options, "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["runs"] > 0 and "not derived" not in err
    for bad in ("nine", "host:99999"):
        assert main(["derive", *options, "--once", "--health", bad]) == 1
        assert "expected --health as [HOST:]PORT" in capsys.readouterr().err
    assert main(["derive", *options, "--once", "--compact-every", "-1"]) == 1
    assert "expected --wait, --interval and --compact-every of 0 seconds or more" in capsys.readouterr().err


def test_derive_draws_its_bar_on_a_terminal_above_the_pass_lines(
    folder: Path, connect: Connect, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"chdb:{folder / 'chdb'}"
    options = ["--clickhouse", url, "--clickhouse-table", "bar.otel_traces", "--clickhouse-database", "treellm_bar"]
    rows = file_rows(SAMPLES[0])
    insert(connect("bar", None), rows)
    traces = len({r["TraceId"] for r in rows})
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("TTY_INTERACTIVE", "1")
    capsys.readouterr()
    assert main(["derive", *options, "--once", "--wait", "0"]) == 0
    out, drawn = capsys.readouterr()
    err = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", drawn)
    assert "shard 0/1: derived" in out
    # the last frame, drawn when the bar stops: every due trace derived, with the spans and the lag
    assert f"{traces}/{traces} traces, {len(rows):,} spans" in err and "lag 0.0s" in err


@pytest.mark.parametrize("text", ["2/2", "1", "a/b", "-1/2", "0/0", ""])
def test_a_bad_shard_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="expected a shard as INDEX/COUNT"):
        parse_shard(text)
    assert parse_shard("1/3") == Shard(1, 3) and str(Shard(1, 3)) == "1/3"


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def test_a_worker_serves_its_progress_on_health_and_stops_when_told(connect: Connect) -> None:
    ch = connect("worker", None)
    rows = file_rows(SAMPLES[0])
    insert(ch, rows)
    health = DeriveHealth(Shard())
    server = serve_health(health)
    url = f"http://127.0.0.1:{server.server_address[1]}/health"
    stop = threading.Event()
    slept = threading.Event()

    def sleep(_: float) -> None:  # the worker found nothing due: let the test look, then stop it
        slept.set()
        stop.wait()

    worker = threading.Thread(
        target=run_derive,
        args=(ch,),
        kwargs={"wait_s": 0, "report": health.record, "stop": stop.is_set, "sleep": sleep},
    )
    try:
        assert _get(url)["status"] == "starting"
        worker.start()
        assert slept.wait(timeout=120)  # a pass ran and the worker is idle
        state = _get(url)
        traces = len({r["TraceId"] for r in rows})
        assert state["status"] == "ok" and state["traces"] == traces and state["spans"] == len(rows)
        assert state["due"] == 0 and state["shard"] == "0/1" and state["passes"] >= 1
        with pytest.raises(urllib.error.HTTPError, match="404") as refused:
            _get(url.replace("/health", "/other"))
        refused.value.close()
    finally:
        stop.set()
        worker.join(timeout=120)
        server.shutdown()
        server.server_close()
    assert not worker.is_alive()


def legacy_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows as ``ingest --clickhouse`` wrote them before ``derive`` existed: treellm's own spans kept
    their promoted attributes only as ``treellm.derived.<column>``, every row marked with its file."""
    keys = {key: column for column, key in WRITTEN_BACK.items()}
    out = []
    for row in rows:
        attributes = dict(row["SpanAttributes"])
        if row["ScopeName"] == "treellm" and "treellm.run.id" in attributes:
            attributes = {(f"treellm.derived.{keys[k]}" if k in keys else k): v for k, v in attributes.items()}
        attributes["treellm.derived.source"] = "sample_traces/x.jsonl"
        out.append({**row, "SpanAttributes": attributes})
    return out


def test_rows_an_older_ingest_clickhouse_wrote_derive_to_the_same_report(connect: Connect, duck_samples: Any) -> None:
    ch = connect("legacy", None)
    rows = legacy_rows([row for path in SAMPLES for row in file_rows(path)])
    assert any("treellm.derived.run_id" in r["SpanAttributes"] for r in rows)
    insert(ch, rows)
    run_derive(ch, wait_s=0, once=True)
    assert A.report(ch) == A.report(duck_samples)
    assert A.tune(ch) == A.tune(duck_samples)
    leftovers = ch.df(
        "SELECT count() AS n FROM spans WHERE arrayExists(k -> startsWith(k, 'treellm.derived.'), mapKeys(attributes))"
    )
    assert int(leftovers["n"][0]) == 0


def test_ingest_into_clickhouse_lists_the_files_it_skipped(connect: Connect, tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(SAMPLES[0], folder / SAMPLES[0].name)
    (folder / "notes.txt").write_text("not a trace\n", encoding="utf-8")
    report = ingest_clickhouse(connect("skipped", None), [folder])
    assert report.spans > 0 and report.skipped_files == (str(folder / "notes.txt"),)


def test_a_span_the_validator_refuses_is_reported_never_skipped_in_silence(connect: Connect) -> None:
    ch = connect("refused", None)
    rows = file_rows(SAMPLES[0])
    insert(ch, [*rows, {**rows[0], "TraceId": "not-a-trace-id", "SpanId": "0123456789abcdef"}])
    passes = run_derive(ch, wait_s=0, once=True)
    bad = [b for p in passes for b in p.bad_records]
    assert len(bad) == 1 and "trace" in bad[0].reason.lower()
    assert sum(p.spans for p in passes) == len(rows) and underived(ch) == 0  # recorded: not derived again


def _parts(ch: ClickHouseConnection) -> dict[str, int]:
    """Per table, the most parts one of its partitions holds."""
    found = ch.df(
        f"SELECT table, max(n) AS n FROM (SELECT table, partition_id, count() AS n FROM system.parts "
        f"WHERE database = '{ch.database}' AND active GROUP BY table, partition_id) GROUP BY table"
    )
    return dict(zip(found["table"], found["n"], strict=True))


def _partitions(ch: ClickHouseConnection) -> dict[str, dict[str, list[str]]]:
    """Per table, per partition, the names of its active parts."""
    found = ch.df(
        f"SELECT table, partition_id, name FROM system.parts WHERE database = '{ch.database}' AND active "
        "ORDER BY table, partition_id, name"
    )
    out: dict[str, dict[str, list[str]]] = {}
    for table, partition, name in zip(found["table"], found["partition_id"], found["name"], strict=True):
        out.setdefault(str(table), {}).setdefault(str(partition), []).append(str(name))
    return out


def _ns(day: str) -> int:
    return int(datetime.fromisoformat(f"{day}T12:00:00+00:00").timestamp()) * 10**9


def test_a_trace_keeps_the_day_it_was_first_derived_and_a_merge_rewrites_only_the_days_that_grew(
    connect: Connect, folder: Path, duck_samples: Any
) -> None:
    """On a server every table is partitioned by the day a trace was first derived (its layout,
    here on chDB): a trace derived again (a late span) replaces its rows in that partition, and
    a merge rewrites the partitions that received rows since the last one, never the days before."""
    ch = connect("buckets", None, DAILY)
    db = folder / "buckets.duckdb"
    shutil.copy(folder / "samples.duckdb", db)
    tables = {"treellm_spans", "treellm_traces", *(f"treellm_{v}" for v in ("runs", "nodes", "tool_calls"))}
    with open_store(db) as con:
        traces = [t for (t,) in con.execute("SELECT DISTINCT trace_id FROM spans ORDER BY 1").fetchall()]
        first, second = traces[: len(traces) // 2], traces[len(traces) // 2 :]

        def derive(chosen: list[str], version: int) -> None:
            _, buckets = write_derived(con, ch, chosen, version)
            record_traces(ch, dict.fromkeys(chosen, (0, 0)), Shard(), version, buckets)

        derive(first, _ns("2026-12-01"))
        ch.compact()
        before = _partitions(ch)
        assert all(set(before[t]) == {"20261201"} for t in tables)
        derive([*second, first[0]], _ns("2026-12-02"))  # first[0] again: a late span arrived
        buckets = ch.df(f"SELECT DISTINCT trace_id, toString(bucket) AS b FROM {ch.database}.treellm_tool_calls")
        by_trace = dict(zip(buckets["trace_id"], buckets["b"], strict=True))
        assert len(buckets) == len(by_trace)  # one partition per trace, whatever its passes
        assert {by_trace[t] for t in first if t in by_trace} == {"2026-12-01"}
        assert {by_trace[t] for t in second if t in by_trace} == {"2026-12-02"}
        assert A.report(ch) == A.report(duck_samples)  # the trace derived twice counts once
        assert tables <= set(ch.compact())
        after = _partitions(ch)
        for table in tables:
            assert set(after[table]) == {"20261201", "20261202"}, table
            assert all(len(parts) == 1 for parts in after[table].values()), table
            assert after[table]["20261201"] != before[table]["20261201"], table  # it grew: merged
        derive(second[:1], _ns("2026-12-02") + 1)  # the next pass: only the second day grows
        ch.compact()
        last = _partitions(ch)
        for table in tables:
            assert last[table]["20261201"] == after[table]["20261201"], table  # not rewritten
            assert len(last[table]["20261202"]) == 1, table
    assert A.report(ch) == A.report(duck_samples)
    assert A.tune(ch) == A.tune(duck_samples)


def test_a_server_partitions_by_day_and_a_chdb_folder_not(connect: Connect) -> None:
    """The tables' partition: a day on a server (a merge rewrites the days that grew), one on
    chDB (a process that opens the folder loads every part, and reads each cold)."""
    ch = connect("whole", None)
    keys = ch.df(
        f"SELECT DISTINCT partition_key FROM system.tables WHERE database = '{ch.database}' AND engine != 'View'"
    )
    assert list(keys["partition_key"]) == ["tuple()"]
    columns = [("trace_id", "VARCHAR", False), ("day", "DATE", False)]
    for partition, expected in ((DAILY, "PARTITION BY bucket\n"), (WHOLE, "PARTITION BY tuple()\n")):
        ddls = [derived_spans_ddl("db", columns, partition=partition), derived_traces_ddl("db", partition=partition),
                derived_view_ddl("db", "runs", [("trace_id", "VARCHAR", False)], partition=partition)]  # fmt: skip
        assert all(f"{expected}ORDER BY (bucket, trace_id" in ddl for ddl in ddls)


def test_tables_an_older_treellm_made_without_partitions_are_kept_and_still_derive_and_merge(
    connect: Connect, duck_samples: Any
) -> None:
    """Tables made before the partitions (no ``bucket`` column, one partition, the schema's
    earlier marker) stay: attach adds the column, and derive and merge go on in them."""
    plain = connect("v6_spans", "treellm_v7_probe")  # the DDL of this version, to rewrite
    ddls = [str(plain.df(f"SHOW CREATE TABLE {plain.derived(t)}")["statement"][0]) for t in TABLE_NAMES]
    older = [  # as the schema's version 6 made them: treellm_spans by month, the others one partition
        re.sub(r",\s*`?bucket`? Date", "", ddl.replace("treellm_v7_probe.", "treellm_v6."))
        .replace(
            "PARTITION BY tuple()\nORDER BY (bucket, trace_id, span_id)",
            "PARTITION BY toYYYYMM(day)\nORDER BY (trace_id, span_id)",
        )
        .replace("PARTITION BY tuple()\nORDER BY (bucket, ", "ORDER BY (")
        .replace("ORDER BY (trace_id)", "ORDER BY trace_id")
        .replace("'treellm:table:7'", "'treellm:table:6'")
        for ddl in ddls
    ]
    plain.command("CREATE DATABASE IF NOT EXISTS treellm_v6 COMMENT 'treellm:database:6'")
    for ddl in older:
        plain.command(ddl)
    ch = connect("v6_spans", "treellm_v6")
    keys = ch.df("SELECT name, partition_key, sorting_key FROM system.tables WHERE database = 'treellm_v6'")
    assert set(keys["partition_key"]) == {"", "toYYYYMM(day)"} and not any("bucket" in k for k in keys["sorting_key"])
    added = ch.df("SELECT count() AS n FROM system.columns WHERE database = 'treellm_v6' AND name = 'bucket'")
    assert int(added["n"][0]) == len(TABLE_NAMES)  # the tables are kept: attach added the column
    insert(ch, [row for path in SAMPLES for row in file_rows(path)])
    run_derive(ch, wait_s=0, once=True)
    assert A.report(ch) == A.report(duck_samples)
    assert A.tune(ch) == A.tune(duck_samples)
    assert all(n == 1 for n in _parts(ch).values())


def test_a_worker_merges_its_tables_once_idle_at_most_every_compact_every_s(
    connect: Connect, duck_samples: Any
) -> None:
    """The views read the tables FINAL, which merges parts at every read unless there is one:
    a worker merges them when nothing is due and ``compact_every_s`` of its clock have passed
    since the last merge, and never when nothing new was derived."""
    ch = connect("compact", None)
    rows = [row for path in SAMPLES for row in file_rows(path)]
    traces = sorted({r["TraceId"] for r in rows})
    first, second = set(traces[: len(traces) // 2]), set(traces[len(traces) // 2 :])
    insert(ch, [r for r in rows if r["TraceId"] in first])
    now = [0.0]
    merges: list[tuple[str, ...]] = []
    seen: list[tuple[int, dict[str, int]]] = []

    def sleep(_: float) -> None:  # the worker is idle: what it merged so far, then the next step
        seen.append((len(merges), _parts(ch)))
        if len(seen) == 1:
            insert(ch, [r for r in rows if r["TraceId"] in second])  # more arrives: a second pass
        elif len(seen) == 2:
            now[0] = 150.0  # the interval has passed: merged before the next sleep
        elif len(seen) == 3:
            now[0] = 400.0  # nothing new since: nothing merged again

    def compacted(tables: tuple[str, ...], problem: str | None) -> None:
        assert problem is None
        merges.append(tables)

    run_derive(ch, wait_s=0, sleep=sleep, stop=lambda: len(seen) >= 4, compact_every_s=100.0,
               compacted=compacted, clock=lambda: now[0])  # fmt: skip
    assert [count for count, _ in seen] == [0, 0, 1, 1]
    assert max(seen[1][1].values()) > 1 or merges[0] == ()  # two inserts each (unless ClickHouse merged first)
    assert set(merges[0]) <= set(seen[1][1]) and all(n == 1 for n in seen[2][1].values())
    assert A.report(ch) == A.report(duck_samples)
    assert A.tune(ch) == A.tune(duck_samples)


def test_derive_once_merges_a_backlog_not_each_small_run_and_says_a_refused_merge(
    connect: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--once`` (a cron job) merges at its end when it derived a tenth or more of every derived
    span, never with ``compact_every_s`` 0; a merge the server refuses is said, and the traces
    stay derived."""
    day = file_rows(SAMPLES[3])  # production_day: 300 traces
    assert "production_day" in SAMPLES[3].name
    merged: list[tuple[tuple[str, ...], str | None]] = []

    def compacted(tables: tuple[str, ...], problem: str | None) -> None:
        merged.append((tables, problem))

    never = connect("nomerge", None)
    insert(never, day)
    run_derive(never, wait_s=0, once=True, batch_spans=1000, compact_every_s=0, compacted=compacted)
    assert merged == []
    ch = connect("merge", None)
    insert(ch, day)
    passes = run_derive(ch, wait_s=0, once=True, batch_spans=1000, compacted=compacted)
    assert len(passes) > 1 and len(merged) == 1  # several passes, one merge at the end
    assert merged[0][1] is None and all(n == 1 for n in _parts(ch).values())
    again = run_derive(ch, wait_s=0, once=True, compacted=compacted)
    assert sum(p.traces for p in again) == 0 and len(merged) == 1  # nothing new: nothing merged
    insert(ch, file_rows(SAMPLES[0]))  # the next cron run: one trace of 35 spans, under a tenth
    run_derive(ch, wait_s=0, once=True, compacted=compacted)
    assert len(merged) == 1 and max(_parts(ch).values()) > 1

    refusing = connect("refusing", None)  # a user without the OPTIMIZE grant

    def refused() -> tuple[str, ...]:
        raise refusing.errors[0]("Code: 497. DB::Exception: default: Not enough privileges.\nmore")

    monkeypatch.setattr(refusing, "compact", refused)
    insert(refusing, day)
    passes = run_derive(refusing, wait_s=0, once=True, compacted=compacted)
    assert merged[1] == ((), "Code: 497. DB::Exception: default: Not enough privileges.")
    assert sum(p.spans for p in passes) == len(day) and underived(refusing) == 0
