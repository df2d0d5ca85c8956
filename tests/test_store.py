"""The DuckDB store: round trips, idempotency, corrupt inputs, Parquet, gc, the exporter, the lock."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult
from opentelemetry.trace import SpanContext, TraceFlags

from treellm import IngestError, OTLPJsonlSpanExporter, RunResult, StoreBusyError, ThinkNode
from treellm.otlp import traces_data_line
from treellm.simulate.demo import demo_executor
from treellm.store.connection import open_parquet, open_store
from treellm.store.exporter import DuckDBSpanExporter
from treellm.store.ingest import ingest, ingest_file
from treellm.store.maintenance import export_parquet, gc


def traced_demo(exporter: Any, *, batch: bool = False, run_id: str = "run-1") -> RunResult:
    provider = TracerProvider()
    processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    result = demo_executor([], tracer_provider=provider, run_ids=lambda: run_id).run("fix it")
    provider.shutdown()
    return result


@pytest.fixture
def demo_jsonl(tmp_path: Path) -> tuple[Path, RunResult]:
    path = tmp_path / "demo.jsonl"
    result = traced_demo(OTLPJsonlSpanExporter(path))
    return path, result


def rows(con: duckdb.DuckDBPyConnection, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    return con.execute(sql, list(params)).fetchall()


def assert_views_match_the_run(con: duckdb.DuckDBPyConnection, result: RunResult) -> None:
    nodes = {r[0]: r[1:] for r in rows(con, "SELECT node_id, kind, depth, parent_id, status, tool, signature, ordinal "
                                            "FROM nodes WHERE run_id = ?", result.run_id)}  # fmt: skip
    assert set(nodes) == {n.id for n in result.nodes}
    for node in result.nodes:
        kind, depth, parent, status, tool, sig, ordinal = nodes[node.id]
        assert (kind, depth, parent, status) == (node.kind, node.depth, node.parent_id, node.status)
        if node.kind == "tool":
            assert (tool, sig, ordinal) == (node.tool_name, node.signature, node.ordinal)  # type: ignore[union-attr]
    pruned = rows(con, "SELECT node_id, tool, signature, count, \"limit\", action, shadow FROM loop_events "
                       "WHERE run_id = ? ORDER BY time_ns", result.run_id)  # fmt: skip
    expected = [
        (n.id, p.tool, p.signature, p.count, p.limit, p.action, p.shadow)
        for n in result.nodes
        if isinstance(n, ThinkNode)
        for p in n.pruned
    ]
    assert sorted(pruned) == sorted(expected)
    run = rows(con, "SELECT agent, nodes, think_nodes, tool_nodes, pruned_calls, outcome, max_depth FROM runs "
                    "WHERE run_id = ?", result.run_id)  # fmt: skip
    s = result.stats
    assert run == [("demo-coder", s.nodes, s.think_nodes, s.tool_nodes, s.pruned, result.outcome, s.max_depth)]


def test_round_trip_scripted_run_to_jsonl_to_store_views(tmp_path: Path, demo_jsonl: tuple[Path, RunResult]) -> None:
    path, result = demo_jsonl
    db = tmp_path / "t.duckdb"
    report = ingest(db, [path])
    assert (report.files, report.spans, report.runs, report.duplicates) == (1, result.stats.nodes + 3, 1, 0)
    con = open_store(db, read_only=True)
    assert_views_match_the_run(con, result)
    calls = rows(con, "SELECT tool, path_position FROM tool_calls WHERE run_id = ? ORDER BY path_position", "run-1")
    assert [c[1] for c in calls] == list(range(1, result.stats.tool_nodes + 1))
    con.close()


def test_reingesting_a_file_adds_nothing(tmp_path: Path, demo_jsonl: tuple[Path, RunResult]) -> None:
    path, result = demo_jsonl
    db = tmp_path / "t.duckdb"
    ingest(db, [path])
    again = ingest(db, [path])
    assert (again.spans, again.runs, again.duplicates) == (0, 0, result.stats.nodes + 3)
    con = open_store(db, read_only=True)
    assert rows(con, "SELECT count(*) FROM spans") == [(result.stats.nodes + 3,)]
    assert rows(con, "SELECT count(*) FROM span_events") == rows(con, "SELECT 10")
    con.close()


def test_the_duckdb_exporter_round_trip(tmp_path: Path) -> None:
    db = tmp_path / "live.duckdb"
    exporter = DuckDBSpanExporter(db)
    result = traced_demo(exporter, batch=True)
    assert exporter.failures == 0 and exporter.exported_spans == result.stats.nodes + 3
    assert exporter.journal.stats().unflushed_bytes == 0
    con = open_store(db, read_only=True)
    assert_views_match_the_run(con, result)
    con.close()


def test_a_busy_store_keeps_batches_in_the_journal_until_it_is_free(tmp_path: Path) -> None:
    db = tmp_path / "busy.duckdb"
    open_store(db).close()
    script = f"import duckdb, sys; c = duckdb.connect({str(db)!r}); print('held', flush=True); sys.stdin.readline()"
    with subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as holder:
        assert holder.stdout is not None and holder.stdin is not None
        try:
            assert holder.stdout.readline().strip() == "held"
            with pytest.raises(StoreBusyError, match="busy"):
                open_store(db, read_only=True, retries=1, backoff_s=0.01)
            exporter = DuckDBSpanExporter(db, busy_retries=0)
            result = traced_demo(exporter)
            assert exporter.deferred > 0 and exporter.journal.stats().unflushed_bytes > 0
        finally:
            holder.communicate("\n", timeout=30)
    restarted = DuckDBSpanExporter(db)  # replays the journal on start
    assert restarted.journal.stats().unflushed_bytes == 0 and restarted.journal.folder == exporter.journal.folder
    con = open_store(db, read_only=True)
    assert_views_match_the_run(con, result)
    con.close()


def sdk_span(span_id: int, *, start: int = 1_700_000_000_000_000_000) -> ReadableSpan:
    context = SpanContext(trace_id=0xABC, span_id=span_id, is_remote=False, trace_flags=TraceFlags(1))
    return ReadableSpan(name=f"span-{span_id}", context=context, resource=Resource.create({"service.name": "t"}),
                        start_time=start, end_time=max(start, 1_700_000_000_000_000_001))  # fmt: skip


def test_the_exporter_quarantines_a_span_the_store_refuses_and_stores_the_rest_once(tmp_path: Path) -> None:
    db = tmp_path / "refused.duckdb"
    exporter = DuckDBSpanExporter(db)
    batch = [sdk_span(1), sdk_span(2), sdk_span(3, start=2**64 - 1), sdk_span(4)]  # 3: above int64
    assert exporter.export(batch) == SpanExportResult.SUCCESS
    assert exporter.export(batch) == SpanExportResult.SUCCESS  # a retried batch stores nothing twice
    exporter.shutdown()
    assert exporter.exported_spans == 3 and exporter.failures == 0 and exporter.journal.stats().unflushed_bytes == 0
    (quarantined,) = (exporter.journal.folder / "rejected").glob("*.json")  # the same span, set aside once
    record = json.loads(quarantined.read_bytes())
    assert "startTimeUnixNano: expected 0..9223372036854775807" in record["reason"]
    spans = [s for line in record["lines"] for rs in line["resourceSpans"] for ss in rs["scopeSpans"]
             for s in ss["spans"]]  # fmt: skip
    assert [s["spanId"] for s in spans] == [f"{3:016x}"]
    con = open_store(db, read_only=True)
    assert con.execute("SELECT span_id FROM spans ORDER BY span_id").fetchall() == [(f"{n:016x}",) for n in (1, 2, 4)]
    con.close()


def test_exporters_of_two_processes_share_a_store_and_an_old_journal_file_is_replayed(tmp_path: Path) -> None:
    db = tmp_path / "shared.duckdb"
    old_journal = tmp_path / "shared.duckdb.journal.jsonl"  # what an earlier version left after a crash
    old_journal.write_bytes(traces_data_line([sdk_span(7)]) + b'{"torn')
    first, second = DuckDBSpanExporter(db), DuckDBSpanExporter(db)  # one journal slot each
    assert first.journal.folder != second.journal.folder and not old_journal.exists()
    assert first.exported_spans == 1  # the old journal's span, replayed on start
    assert second.export([sdk_span(8)]) == SpanExportResult.SUCCESS
    first.shutdown()
    second.shutdown()
    con = open_store(db, read_only=True)
    assert con.execute("SELECT count(*) FROM spans").fetchall() == [(2,)]
    con.close()


def test_a_torn_final_line_is_skipped_and_counted(tmp_path: Path, demo_jsonl: tuple[Path, RunResult]) -> None:
    path, _ = demo_jsonl
    torn = tmp_path / "torn.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    torn.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    report = ingest(tmp_path / "t.duckdb", [torn])
    assert report.skipped == 1
    assert report.spans == sum(len(json.loads(x)["resourceSpans"][0]["scopeSpans"][0]["spans"]) for x in lines[:-1])


def test_an_empty_file_is_reported_not_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    report = ingest(tmp_path / "t.duckdb", [empty])
    assert report.empty_files == (str(empty),) and report.spans == 0


def corrupt_variants(good: bytes) -> dict[str, tuple[bytes, int, str]]:
    lines = good.splitlines(keepends=True)
    third = lines[2]
    doc = json.loads(third)
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]

    def with_span(**changes: Any) -> bytes:
        changed = json.loads(third)
        changed["resourceSpans"][0]["scopeSpans"][0]["spans"][0].update(changes)
        return json.dumps(changed).encode() + b"\n"

    def body(line: bytes) -> bytes:
        return b"".join([*lines[:2], line, *lines[3:]])

    assert span["traceId"]
    return {
        "truncated line in the middle": (body(third[: len(third) // 2] + b"\n"), 3, "not valid JSON"),
        "wrong types": (body(with_span(startTimeUnixNano={"n": 1})), 3, "startTimeUnixNano: expected an integer"),
        "bad ids": (body(with_span(traceId="not-a-trace-id")), 3, "traceId: expected 32 hex digits"),
        "binary garbage": (body(os.urandom(300).replace(b"\n", b" ") + b"\n"), 3, "not valid JSON"),
    }


@pytest.mark.parametrize("case", ["truncated line in the middle", "wrong types", "bad ids", "binary garbage"])
def test_corrupt_inputs_give_a_clear_error_and_leave_the_store_unchanged(
    tmp_path: Path, demo_jsonl: tuple[Path, RunResult], case: str
) -> None:
    path, _ = demo_jsonl
    db = tmp_path / "t.duckdb"
    other = tmp_path / "other.jsonl"
    traced_demo(OTLPJsonlSpanExporter(other), run_id="run-0")
    ingest(db, [other])
    data, line, reason = corrupt_variants(path.read_bytes())[case]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(data)
    with pytest.raises(IngestError) as caught:
        ingest_file(db, bad, "otlp-jsonl")
    assert caught.value.line == line and reason in str(caught.value) and str(bad) in str(caught.value)
    con = open_store(db, read_only=True)
    assert rows(con, "SELECT DISTINCT run_id FROM spans") == [("run-0",)]
    con.close()


def test_an_ingest_checkpoints_what_it_wrote_and_gives_back_duckdbs_vacuum_setting(
    tmp_path: Path, demo_jsonl: tuple[Path, RunResult]
) -> None:
    """An ingest checkpoints with DuckDB's vacuum off (merging the partial row groups of a parallel
    insert rewrote the table just written), then gives ``max_vacuum_tasks`` back its value: a setting
    of the database, shared by every connection of the process (one is held open here), after a good
    file and after a bad one alike."""
    path, _ = demo_jsonl
    db = tmp_path / "t.duckdb"
    held = open_store(db)
    try:
        held.execute("SET max_vacuum_tasks = 37")
        ingest(db, [path])
        assert rows(held, "SELECT current_setting('max_vacuum_tasks')") == [(37,)]
        wal = db.with_name(db.name + ".wal")
        assert not wal.exists() or wal.stat().st_size == 0  # checkpointed, though the database stays open
        assert rows(held, "SELECT count(*) > 0 FROM spans") == [(True,)]
        bad = tmp_path / "bad.jsonl"
        bad.write_bytes(corrupt_variants(path.read_bytes())["bad ids"][0])
        with pytest.raises(IngestError):
            ingest_file(db, bad, "otlp-jsonl")
        assert rows(held, "SELECT current_setting('max_vacuum_tasks')") == [(37,)]
    finally:
        held.close()


def test_a_100_mb_line_is_refused_with_its_line_number(tmp_path: Path, demo_jsonl: tuple[Path, RunResult]) -> None:
    path, _ = demo_jsonl
    huge = tmp_path / "huge.jsonl"
    with huge.open("wb") as out:
        out.write(path.read_bytes().splitlines(keepends=True)[0])
        out.write(b'{"resourceSpans": [], "padding": "' + b"x" * (100 * 1024 * 1024) + b'"}\n')
    db = tmp_path / "t.duckdb"
    open_store(db).close()
    with pytest.raises(IngestError, match=r"huge.jsonl:2: the line is 105 MB, above the 64 MiB limit"):
        ingest_file(db, huge, "otlp-jsonl")
    con = open_store(db, read_only=True)
    assert rows(con, "SELECT count(*) FROM spans") == [(0,)]
    con.close()


def test_skip_bad_keeps_the_good_records_and_reports_each_bad_one(
    tmp_path: Path, demo_jsonl: tuple[Path, RunResult]
) -> None:
    path, _ = demo_jsonl
    data, _, _ = corrupt_variants(path.read_bytes())["bad ids"]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(data + b"{oops\n")
    report = ingest(tmp_path / "t.duckdb", [bad], skip_bad=True)
    assert [(b.line, b.reason[:20]) for b in report.bad_records] == [
        (3, "resourceSpans[0].sco"),
        (len(data.splitlines()) + 1, "not valid JSON (unex"),
    ]
    assert report.spans == len(path.read_bytes().splitlines()) - 1


def test_parquet_export_reads_back_with_the_same_views(tmp_path: Path, demo_jsonl: tuple[Path, RunResult]) -> None:
    path, result = demo_jsonl
    db = tmp_path / "t.duckdb"
    ingest(db, [path])
    counts = export_parquet(db, tmp_path / "pq")
    assert counts == {"spans": result.stats.nodes + 3, "span_events": 10, "span_links": 0}
    assert any((tmp_path / "pq" / "spans").rglob("day=*/*.parquet"))
    con = open_parquet([tmp_path / "pq"])
    assert_views_match_the_run(con, result)
    con.close()


def test_gc_deletes_old_runs_and_keeps_new_ones(tmp_path: Path, demo_jsonl: tuple[Path, RunResult]) -> None:
    path, _ = demo_jsonl
    db = tmp_path / "t.duckdb"
    ingest(db, [path])
    keep = gc(db, dt.timedelta(days=30))
    assert (keep.runs, keep.spans) == (0, 0)
    future = dt.datetime.now(dt.UTC) + dt.timedelta(days=60)
    gone = gc(db, dt.timedelta(days=30), now=future)
    assert gone.runs == 1 and gone.spans > 30
    con = open_store(db, read_only=True)
    assert rows(con, "SELECT count(*) FROM spans") == [(0,)]
    assert rows(con, "SELECT count(*) FROM span_events") == [(0,)]
    con.close()


def test_migrations_are_named_ordered_and_recorded_once(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    open_store(db).close()
    open_store(db).close()
    con = open_store(db, read_only=True)
    from treellm.store.schema import MIGRATIONS

    names = [r[0] for r in rows(con, "SELECT name FROM schema_migrations WHERE name NOT LIKE 'views %' ORDER BY name")]
    assert names == [name for name, _ in MIGRATIONS] == sorted(names)
    assert names[:4] == ["0001_raw_tables", "0002_views", "0003_earlier_calls", "0004_foreign_trees"]
    from treellm.store.schema import VIEWS_RECORD

    assert rows(con, "SELECT name FROM schema_migrations WHERE name LIKE 'views %'") == [(VIEWS_RECORD,)]
    con.close()


def _with_views(monkeypatch: pytest.MonkeyPatch, views: str) -> str:
    """This process's treellm with ``views`` as its views' DDL; returns their record."""
    from treellm.store import connection
    from treellm.store.schema import views_record

    record = views_record(views)
    monkeypatch.setattr(connection, "VIEWS", views)
    monkeypatch.setattr(connection, "VIEWS_RECORD", record)
    monkeypatch.setattr(
        connection, "TEMPORARY_VIEWS", views.replace("CREATE OR REPLACE VIEW", "CREATE OR REPLACE TEMP VIEW")
    )
    return record


def _columns(con: Any, view: str) -> list[str]:
    return [c[0] for c in con.execute(f"SELECT * FROM {view} LIMIT 0").description]


def test_views_of_another_version_are_recreated_by_a_writer_and_read_as_this_ones_by_a_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, demo_jsonl: tuple[Path, RunResult]
) -> None:
    from treellm.store.schema import VIEWS, VIEWS_RECORD

    db = tmp_path / "t.duckdb"
    assert ingest(db, [demo_jsonl[0]]).runs == 1
    con = open_store(db, read_only=True)
    calls = rows(con, "SELECT count(*) FROM tool_calls")
    con.close()
    changed = VIEWS.replace(
        "s.earlier_node_ids AS earlier_node_ids,",
        "s.earlier_node_ids AS earlier_node_ids, s.tool_name || '!' AS shouted,",
        1,
    )
    assert changed != VIEWS
    record = _with_views(monkeypatch, changed)
    con = open_store(db, read_only=True)  # a reader never writes: it reads this version's views as its own
    try:
        assert rows(con, "SELECT count(*) FROM tool_calls") == calls
        assert rows(con, "SELECT DISTINCT shouted FROM tool_calls ORDER BY 1")[0][0].endswith("!")
        assert rows(con, "SELECT name FROM schema_migrations WHERE name LIKE 'views %'") == [(VIEWS_RECORD,)]
    finally:
        con.close()
    open_store(db).close()  # a writer recreates them in the store, with no migration of its own
    monkeypatch.undo()
    con = duckdb.connect(str(db), read_only=True)  # the file itself, no treellm in between
    try:
        assert "shouted" in _columns(con, "tool_calls")
        assert rows(con, "SELECT name FROM schema_migrations WHERE name LIKE 'views %'") == [(record,)]
    finally:
        con.close()
    open_store(db).close()  # this version's writer puts its views back
    con = open_store(db, read_only=True)
    try:
        assert "shouted" not in _columns(con, "tool_calls")
    finally:
        con.close()


def test_a_store_written_before_the_views_were_recorded_reads_as_it_is(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    open_store(db).close()
    con = duckdb.connect(str(db))
    con.execute("DELETE FROM schema_migrations WHERE name LIKE 'views %'")  # as the migrations up to 0008 left it
    con.close()
    con = open_store(db, read_only=True)  # the views the migrations wrote are older: this version's are read
    assert rows(con, "SELECT count(*) FROM runs") == [(0,)]
    con.close()
    from treellm.store.connection import unmigrated_reason
    from treellm.store.schema import MIGRATIONS, VIEWS_RECORD

    assert unmigrated_reason([name for name, _ in MIGRATIONS]) is None
    open_store(db).close()  # a writer records them
    con = open_store(db, read_only=True)
    assert rows(con, "SELECT name FROM schema_migrations WHERE name LIKE 'views %'") == [(VIEWS_RECORD,)]
    con.close()


@pytest.mark.parametrize(("chunks_of_input", "expected"), [(0.7, 1), (1.4, 1), (2.3, 2), (2.6, 3)])
def test_the_last_chunk_takes_a_rest_smaller_than_half_a_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunks_of_input: float, expected: int
) -> None:
    """Each chunk costs its own statements and insert: a rest under ``CHUNK_TAIL_SLACK`` chunks
    goes with the chunk before it rather than alone; every other chunk is at least ``CHUNK_BYTES``."""
    import importlib

    ingest_module = importlib.import_module("treellm.store.ingest")
    chunk = 40 * 1024
    monkeypatch.setattr(ingest_module, "CHUNK_BYTES", chunk)
    line = b'{"resourceSpans": []}' + b" " * 1002 + b"\n"  # 1 KiB
    source = tmp_path / "lines.jsonl"
    source.write_bytes(line * int(chunks_of_input * chunk / len(line)))
    folder = tmp_path / "pieces"
    folder.mkdir()
    sizes = [size for _, size in ingest_module._chunks([source], folder, 4 * 1024)]
    assert len(sizes) == expected and sum(sizes) == source.stat().st_size, sizes
    assert all(size >= chunk for size in sizes[:-1])
    assert len(sizes) == 1 or sizes[-1] >= ingest_module.CHUNK_TAIL_SLACK * chunk
    assert not list(folder.iterdir())  # the copies went with their chunks


def test_a_file_that_grows_while_it_is_read_is_still_staged_in_bounded_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rest is counted from the files' sizes when the ingest starts; a file appended to since
    (a live log) holds more, and no chunk may then grow past ``1 + CHUNK_TAIL_SLACK`` chunks."""
    import importlib

    ingest_module = importlib.import_module("treellm.store.ingest")
    chunk = 40 * 1024
    monkeypatch.setattr(ingest_module, "CHUNK_BYTES", chunk)
    source = tmp_path / "growing.jsonl"
    source.write_bytes(b"{}\n")  # its size when the chunks are planned
    monkeypatch.setattr(
        ingest_module, "_pieces", lambda sources, folder, piece_bytes: ((source, chunk // 2, False) for _ in range(10))
    )
    sizes = [size for _, size in ingest_module._chunks([source], tmp_path, 4 * 1024)]
    assert sum(sizes) == 5 * chunk and len(sizes) > 1, sizes
    assert max(sizes) <= (1 + ingest_module.CHUNK_TAIL_SLACK) * chunk, sizes


def test_a_large_file_is_staged_in_chunks_within_one_transaction(
    tmp_path: Path, demo_jsonl: tuple[Path, RunResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    ingest_module = importlib.import_module("treellm.store.ingest")  # the module, not the re-exported function

    path, result = demo_jsonl
    monkeypatch.setattr(ingest_module, "CHUNK_BYTES", 12 * 1024)  # the demo file is ~50 KB: several chunks,
    monkeypatch.setattr(ingest_module, "MIN_PIECE_BYTES", 1024)  # each staged by one read_json of its pieces
    monkeypatch.setattr(ingest_module, "PIECES_IN_FLIGHT_BYTES", 4 * 1024)
    staged: list[int] = []
    stage_chunk = ingest_module._stage_chunk

    def counting(con: duckdb.DuckDBPyConnection, pieces: list[Path], *, display: str, object_bytes: int) -> None:
        staged.append(len(pieces))
        stage_chunk(con, pieces, display=display, object_bytes=object_bytes)

    monkeypatch.setattr(ingest_module, "_stage_chunk", counting)
    db = tmp_path / "chunked.duckdb"
    report = ingest(db, [path])
    assert len(staged) >= 3 and max(staged) >= 3, staged
    assert report.spans == result.stats.nodes + 3 and report.runs == 1
    con = open_store(db, read_only=True)
    assert_views_match_the_run(con, result)
    con.close()
    data, _, reason = corrupt_variants(path.read_bytes())["bad ids"]
    lines = data.splitlines(keepends=True)
    late = tmp_path / "late.jsonl"
    late.write_bytes(b"".join([*lines[:2], *lines[3:], lines[2]]))  # the bad line last: in the last chunk
    fresh_db = tmp_path / "fresh.duckdb"
    open_store(fresh_db).close()
    with pytest.raises(IngestError) as caught:
        ingest_file(fresh_db, late, "otlp-jsonl")
    assert caught.value.line == len(lines) and reason in str(caught.value)
    con = open_store(fresh_db, read_only=True)
    assert rows(con, "SELECT count(*) FROM spans") == [(0,)]  # the earlier chunks were rolled back too
    con.close()


@pytest.mark.parametrize("kernel_copy", [True, False], ids=["copy_file_range", "read and write"])
def test_pieces_are_runs_of_whole_lines_that_rebuild_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_copy: bool
) -> None:
    import importlib
    import random

    ingest_module = importlib.import_module("treellm.store.ingest")
    if not kernel_copy:  # a file system without copy_file_range: the copy falls back to reading
        monkeypatch.setattr(os, "copy_file_range", lambda *args: (_ for _ in ()).throw(OSError(18, "EXDEV")))
    rng = random.Random(5)
    lines = [b"x" * rng.choice([0, 1, 5, 99, 100, 101, 350]) + b"\n" for _ in range(400)]
    for tail in (b"", b"torn tail without a newline"):
        data = b"".join(lines) + tail
        source = tmp_path / f"source{len(tail)}.jsonl"
        source.write_bytes(data)
        folder = tmp_path / f"pieces{len(tail)}"
        folder.mkdir()
        pieces = [
            (path.read_bytes(), size, copied) for path, size, copied in ingest_module._pieces([source], folder, 100)
        ]
        assert b"".join(piece for piece, _, _ in pieces) == data
        assert all(copied and size == len(piece) for piece, size, copied in pieces)
        for piece, _, _ in pieces[:-1]:  # each ends at the first newline from its size on
            assert piece.endswith(b"\n") and b"\n" not in piece[99:-1]
        assert pieces[-1][0].endswith(b"\n") == (not tail)
    small = tmp_path / "small.jsonl"
    small.write_bytes(b"{}\n" * 40)  # up to 1.5 pieces: read where it is
    assert list(ingest_module._pieces([small], tmp_path, 100)) == [(small, 120, False)]


def test_the_ingest_memory_limit_bounds_the_process_and_duckdb_gets_what_is_left() -> None:
    import importlib

    ingest_module = importlib.import_module("treellm.store.ingest")
    from treellm.settings import size_bytes as size

    share, mib = ingest_module.duckdb_share, 2**20
    assert [size(t) for t in ("1GB", "1GiB", "512MB", "1.5GB", "64 MiB", "100", "2kb")] == [
        10**9, 2**30, 512 * 10**6, 15 * 10**8, 64 * mib, 100, 2000,
    ]  # fmt: skip
    reserve = ingest_module.PYTHON_RESERVE_BYTES
    assert share(10**9, 165 * mib) == 10**9 - 165 * mib - reserve
    assert share(300 * mib, 165 * mib) == ingest_module.MIN_DUCKDB_BYTES  # a budget too small: exceeded, not failed


def test_a_bounded_ingest_gives_duckdb_its_share_and_others_give_it_the_limit(
    tmp_path: Path, demo_jsonl: tuple[Path, RunResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    ingest_module = importlib.import_module("treellm.store.ingest")
    limits: list[str] = []
    opened = ingest_module.open_store

    class Recording:
        def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
            self.con = con

        def execute(self, sql: str, *args: Any) -> duckdb.DuckDBPyConnection:
            if sql.startswith("SET memory_limit"):
                limits.append(sql.split("'")[1])
            return self.con.execute(sql, *args)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.con, name)

    monkeypatch.setattr(ingest_module, "open_store", lambda *a, **k: Recording(opened(*a, **k)))
    monkeypatch.setattr(ingest_module, "_resident_bytes", lambda: 200 * 2**20)
    monkeypatch.setattr(ingest_module, "MEMORY_LIMIT", "1GB")
    path, _ = demo_jsonl
    ingest(tmp_path / "bounded.duckdb", [path], bound_process=True)  # what `treellm ingest` does
    ingest_file(tmp_path / "api.duckdb", path)  # an exporter's or a notebook's process holds much else
    ingest_module.ingest_segments(tmp_path / "segments.duckdb", [path])  # the collector's flusher
    share = (10**9 - 200 * 2**20 - ingest_module.PYTHON_RESERVE_BYTES) // 2**20
    assert limits == [f"{share}MiB", "1GB", "1GB"]


def test_pieces_give_every_thread_work_and_bound_what_is_parsed_at_once() -> None:
    import importlib

    ingest_module = importlib.import_module("treellm.store.ingest")
    piece_bytes, mib = ingest_module._piece_bytes, 1024 * 1024
    assert piece_bytes(40 * mib, 2) == 20 * mib  # a journal segment: one piece per core
    assert piece_bytes(434 * mib, 2) == 32 * mib  # a large file: 64 MiB in flight over both threads
    assert piece_bytes(434 * mib, 8) == 8 * mib
    assert piece_bytes(100 * 1024, 2) == mib  # a small file is read as it is
    assert piece_bytes(mib, 0) == mib
    # under a small memory limit less is parsed at once: a 1 GB command leaves DuckDB about 620 MiB
    assert piece_bytes(434 * mib, 2, 620 * mib) == 620 * mib // ingest_module.LIMIT_PER_PIECE_IN_FLIGHT // 2
    assert piece_bytes(434 * mib, 2, 4096 * mib) == 32 * mib  # a large limit: no more than 64 MiB still


def _own_span_lines(path: Path, spans: int, per_line: int = 60, first_trace: int = 1) -> None:
    """treellm's own spans as an exporter batches them: a trace of ``per_line`` spans a line, each
    with its arguments, a 600-character result or thought (lines of about 75 KB)."""

    def attr(key: str, value: str) -> dict[str, object]:
        return {"key": key, "value": {"stringValue": value}}

    with path.open("w", encoding="utf-8") as out:
        for line in range(spans // per_line):
            trace = f"{line + first_trace:032x}"
            body = []
            for index in range(per_line):
                tool = index % 3 != 0
                attrs = [attr("treellm.run.id", trace[:16]), attr("treellm.node.id", f"n{index}"),
                         attr("treellm.node.kind", "tool" if tool else "think")]  # fmt: skip
                if tool:
                    attrs += [
                        attr("gen_ai.tool.name", "read_file"), attr("treellm.tool.signature", f"read_file:{index}"),
                        attr("gen_ai.tool.call.arguments", json.dumps({"path": f"src/m_{index}.py"})),
                        attr("gen_ai.tool.call.result", "x" * 600),
                    ]  # fmt: skip
                else:
                    attrs += [attr("gen_ai.request.model", "gpt-test"), attr("treellm.think.text", "y" * 600)]
                start = 1_796_000_000_000_000_000 + line * 10**10 + index * 10**6
                span = {
                    "traceId": trace, "spanId": f"{index + 1:016x}", "name": "span", "kind": 1,
                    "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 10**5), "attributes": attrs,
                }  # fmt: skip
                if index:
                    span["parentSpanId"] = f"{index:016x}"
                body.append(span)
            scope = {"scope": {"name": "treellm"}, "spans": body}
            doc = {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [scope]}]}
            out.write(json.dumps(doc, separators=(",", ":")) + "\n")


def test_a_file_of_large_lines_ingests_within_a_small_memory_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parsing a piece takes many times its bytes: with 64 MiB parsed at once over both threads,
    a 1 GB command (which leaves DuckDB about 620 MiB) ran out of memory on 434 MB of treellm's
    own spans, and a limit of 512 MiB on 125 MB of them. The pieces now shrink with the limit, and
    DuckDB's JSON reader is told the longest line to expect (its buffers are twice that a thread)."""
    import importlib

    ingest_module = importlib.import_module("treellm.store.ingest")
    path = tmp_path / "own.jsonl"
    _own_span_lines(path, 100_020)
    assert path.stat().st_size > 120 * 10**6  # 125 MB: with 64 MiB at once this ran out of memory
    monkeypatch.setattr(ingest_module, "MEMORY_LIMIT", "384MiB")  # the least a bounded command gives DuckDB
    report = ingest_module.ingest(tmp_path / "own.duckdb", [path])
    assert report.spans == 100_020 and not report.bad_records
    with open_store(tmp_path / "own.duckdb", read_only=True) as con:
        assert con.execute("SELECT count(*) FROM spans").fetchone() == (100_020,)


def test_a_line_longer_than_the_small_object_size_still_ingests(tmp_path: Path) -> None:
    """DuckDB is told to expect lines of 8 MiB at most when no line is longer (its buffers are
    twice that a thread), else 64 MiB: a file with one long line ingests whole."""
    import importlib

    ingest_module = importlib.import_module("treellm.store.ingest")
    short, long = tmp_path / "short.jsonl", tmp_path / "long.jsonl"
    _own_span_lines(short, 600)
    _own_span_lines(long, 8_400, per_line=8_400, first_trace=100)  # one trace a line: a line of about 10 MB
    assert long.stat().st_size > ingest_module.SMALL_OBJECT_BYTES
    both = tmp_path / "both.jsonl"
    both.write_bytes(short.read_bytes() + long.read_bytes())
    assert ingest_module._object_bytes([short]) == ingest_module.SMALL_OBJECT_BYTES
    assert ingest_module._object_bytes([short, both]) == ingest_module.MAX_LINE_BYTES
    report = ingest_module.ingest(tmp_path / "both.duckdb", [both])
    assert report.spans == 9_000 and not report.bad_records


def test_the_overlong_line_check_finds_what_a_line_by_line_read_finds(tmp_path: Path) -> None:
    """The windowed check (a few lookups for a file of short lines) agrees with reading every line,
    on lines around the limit, at the start, in the middle, as a torn tail, and without any newline."""
    import importlib
    import random

    ingest_module = importlib.import_module("treellm.store.ingest")
    limit = 50
    rng = random.Random(7)
    path = tmp_path / "lines.jsonl"
    cases = [b"", b"x" * 51, b"x" * 50, b"x" * 50 + b"\n", b"\n" * 200, b"a\n" + b"y" * 51 + b"\n" + b"b\n" * 60]
    for _ in range(300):
        lengths = [rng.choice([0, 1, 10, 49, 50, 50, 51, 120]) for _ in range(rng.randint(1, 12))]
        text = b"\n".join(b"z" * n for n in lengths)
        cases.append(text + (b"\n" if rng.random() < 0.5 else b""))
    found = []
    for text in cases:
        path.write_bytes(text)
        expected = ingest_module._first_overlong_line(path, limit)
        assert ingest_module._overlong_line(path, limit) == expected, text
        found.append(expected)
    assert None in found and (2, 51) in found and (1, 51) in found


# treellm owns only what it creates: a DuckDB file that is not a treellm store is refused, unchanged.


def _users_file(path: Path, *statements: str) -> bytes:
    """A DuckDB file made by someone else (a table with rows, unless told otherwise); its bytes."""
    con = duckdb.connect(str(path))
    for statement in statements or (
        "CREATE TABLE runs (id INTEGER, who VARCHAR)",
        "INSERT INTO runs VALUES (1, 'a'), (2, 'b')",
    ):
        con.execute(statement)
    con.close()
    return path.read_bytes()


@pytest.mark.parametrize(
    "statements",
    [
        (),  # a user's table named like a view of treellm's, no migrations table
        ("CREATE TABLE schema_migrations (version BIGINT, dirty BOOLEAN)",
         "INSERT INTO schema_migrations VALUES (3, false)"),
        ("CREATE TABLE schema_migrations (name VARCHAR PRIMARY KEY, applied_at TIMESTAMP)",
         "INSERT INTO schema_migrations VALUES ('001_users', now())", "CREATE TABLE users (id INTEGER)"),
    ],
    ids=["tables-without-migrations", "another-tool's-migrations-table", "migrations-of-another-app"],
)  # fmt: skip
def test_a_duckdb_file_that_is_no_treellm_store_is_refused_and_left_byte_identical(
    tmp_path: Path, demo_jsonl: tuple[Path, RunResult], statements: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    from treellm.cli import main
    from treellm.store.connection import NotOwnedError

    db = tmp_path / "theirs.duckdb"
    before = _users_file(db, *statements)
    for read_only in (False, True):
        with pytest.raises(NotOwnedError, match="is not a treellm store") as caught:
            open_store(db, read_only=read_only)
        assert caught.value.name == caught.value.path == str(db) and str(db) in str(caught.value)
    with pytest.raises(NotOwnedError):
        ingest(db, [demo_jsonl[0]])
    for argv in (["report", "--db", str(db)], ["ingest", str(demo_jsonl[0]), "--db", str(db), "--json"]):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("treellm: error: ") and str(db) in err[0], err
    assert db.read_bytes() == before
    assert not db.with_name(db.name + ".wal").exists()


def test_a_fresh_or_empty_file_becomes_a_store_and_a_reader_refuses_an_empty_one(
    tmp_path: Path, demo_jsonl: tuple[Path, RunResult]
) -> None:
    from treellm.store.connection import NotOwnedError

    fresh = tmp_path / "new" / "fresh.duckdb"
    assert ingest(fresh, [demo_jsonl[0]]).runs == 1
    con = open_store(fresh, read_only=True)
    assert rows(con, "SELECT count(*) FROM runs") == [(1,)]
    con.close()
    open_store(fresh).close()  # a treellm store opens again, migrations recorded once
    empty = tmp_path / "empty.duckdb"
    duckdb.connect(str(empty)).close()
    with pytest.raises(NotOwnedError, match="it is empty"):
        open_store(empty, read_only=True)
    open_store(empty).close()
    con = open_store(empty, read_only=True)
    assert rows(con, "SELECT count(*) FROM spans") == [(0,)]
    con.close()


def test_the_ownership_rule_reads_the_migrations_table() -> None:
    from treellm.store.connection import foreign_store_reason
    from treellm.store.schema import MIGRATIONS, MIGRATIONS_TABLE_COLUMNS

    columns, first = MIGRATIONS_TABLE_COLUMNS, MIGRATIONS[0][0]
    treellm_objects = {("main", "schema_migrations"), ("main", "spans"), ("main", "runs")}
    assert foreign_store_reason(set(), (), ()) is None  # empty: a writer migrates it
    assert foreign_store_reason(treellm_objects, columns, {first, "0002_views"}) is None
    assert foreign_store_reason({("main", "schema_migrations")}, columns, ()) is None  # a first migration interrupted
    assert "no treellm migrations table" in str(foreign_store_reason({("main", "runs"), ("other", "t")}, (), ()))
    assert "not treellm's" in str(foreign_store_reason(treellm_objects, [("version", "BIGINT")], ()))
    assert "records no treellm migration" in str(foreign_store_reason(treellm_objects, columns, {"001_users"}))


def test_a_reader_of_a_store_whose_migrations_were_interrupted_is_told_to_migrate_it(
    tmp_path: Path, demo_jsonl: tuple[Path, RunResult]
) -> None:
    from treellm.errors import StoreError
    from treellm.store.connection import NotOwnedError, unmigrated_reason
    from treellm.store.schema import MIGRATIONS, MIGRATIONS_TABLE_SQL

    db = tmp_path / "interrupted.duckdb"
    con = duckdb.connect(str(db))
    con.execute(MIGRATIONS_TABLE_SQL)  # the first migration's transaction never committed
    con.close()
    with pytest.raises(StoreError, match=r"is not migrated: it records 0 of \d+ migrations") as caught:
        open_store(db, read_only=True)
    assert not isinstance(caught.value, NotOwnedError) and "treellm ingest" in str(caught.value)
    assert caught.value.path == str(db)
    done = subprocess.run([sys.executable, "-m", "treellm", "report", "--db", str(db)], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if line.strip()][-1].startswith("treellm: ")
    assert "is not migrated" in done.stderr
    assert ingest(db, [demo_jsonl[0]]).runs == 1  # a writer migrates it, then it reads
    con = open_store(db, read_only=True)
    assert rows(con, "SELECT count(*) FROM runs") == [(1,)]
    con.close()
    names = [name for name, _ in MIGRATIONS]
    assert unmigrated_reason(names) is None
    assert unmigrated_reason(names[:2]) == f"it records 2 of {len(names)} migrations (the next is {names[2]})"


def _store_snapshot(db: Path) -> dict[str, Any]:
    """Every row of every table and view, and the catalog (views' SQL, constraints), in a stable order."""
    con = open_store(db, read_only=True)
    try:
        out: dict[str, Any] = {}
        for table in ("spans", "span_events", "span_links", "schema_migrations", "runs", "tool_calls", "nodes"):
            out[table] = sorted(map(repr, rows(con, f"SELECT * FROM {table}")))
        out["views"] = sorted(rows(con, "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal"))
        out["constraints"] = sorted(map(repr, rows(
            con, "SELECT table_name, constraint_type, constraint_text FROM duckdb_constraints() "
                 "WHERE database_name = current_database()")))  # fmt: skip
        return out
    finally:
        con.close()


def _sample_store_and_cutoff(db: Path) -> tuple[int, dt.datetime]:
    """The sample traces in a store, and the cutoff (and gc's ``now`` for 1 day) that deletes the
    oldest three quarters of its runs: blocks freed all over the file, which a checkpoint cannot
    truncate (deleting every run can)."""
    from treellm.simulate import sample_traces_dir

    ingest(db, [sample_traces_dir()])
    con = open_store(db, read_only=True)
    starts = sorted(r[0] for r in rows(con, "SELECT start_ns FROM runs"))
    con.close()
    cutoff_ns = starts[len(starts) * 3 // 4]
    return cutoff_ns, dt.datetime.fromtimestamp(cutoff_ns / 1e9, dt.UTC) + dt.timedelta(days=1)


def test_gc_swaps_in_a_compacted_copy_so_the_file_shrinks_and_keeps_every_kept_row(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    cutoff_ns, now = _sample_store_and_cutoff(db)
    kept = tmp_path / "kept.duckdb"  # the same store with the same runs deleted, never compacted
    kept.write_bytes(db.read_bytes())
    con = open_store(kept)
    con.execute("CREATE TEMP TABLE old AS SELECT run_id FROM runs WHERE start_ns < ?", [cutoff_ns])
    con.execute("CREATE TEMP TABLE doomed AS SELECT trace_id, span_id FROM spans WHERE run_id IN (SELECT * FROM old) "
                "OR (run_id IS NULL AND start_ns < ?)", [cutoff_ns])  # fmt: skip
    for table in ("span_events", "span_links", "spans"):
        con.execute(f"DELETE FROM {table} t USING doomed d WHERE t.trace_id = d.trace_id AND t.span_id = d.span_id")
    con.close()

    before = db.stat().st_size
    report = gc(db, dt.timedelta(days=1), now=now)
    assert report.runs > 0 and report.compacted
    assert report.bytes_before == before and report.bytes_after == db.stat().st_size  # real sizes, no WAL left
    assert report.bytes_after < before and report.bytes_freed == before - report.bytes_after
    assert not db.with_name(db.name + ".wal").exists()
    assert [p.name for p in tmp_path.iterdir() if ".gc-" in p.name] == []  # no copy left behind
    assert _store_snapshot(db) == _store_snapshot(kept)
    open_store(db).close()  # still a treellm store: a writer opens it, nothing to migrate

    again = gc(db, dt.timedelta(days=1), now=now)  # nothing more to delete: no smaller copy, nothing swapped
    assert (again.runs, again.spans) == (0, 0) and again.bytes_after <= again.bytes_before


def test_gc_that_fails_to_swap_leaves_the_store_whole_and_no_copy(
    tmp_path: Path, demo_jsonl: tuple[Path, RunResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    from treellm.errors import StoreError

    db = tmp_path / "t.duckdb"
    cutoff_ns, now = _sample_store_and_cutoff(db)
    con = open_store(db, read_only=True)
    young = rows(con, "SELECT count(*) FROM runs WHERE start_ns >= ?", cutoff_ns)[0][0]
    con.close()

    def refuse(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(StoreError, match=r"runs are deleted, but compacting .* failed .*the store is unchanged"):
        gc(db, dt.timedelta(days=1), now=now)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir() if ".gc-" in p.name] == []
    con = open_store(db, read_only=True)  # the file gc deleted from, whole: the deletions were committed first
    assert rows(con, "SELECT count(*) FROM runs") == [(young,)] and young > 0
    con.close()
    assert ingest(db, [demo_jsonl[0]]).runs == 1  # and it takes writes again


def test_a_folder_ingest_lists_the_files_of_other_types_it_skipped(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    (folder / "deep" / ".cache").mkdir(parents=True)
    (folder / "README.md").write_text("# notes\n", encoding="utf-8")
    (folder / "deep" / "notes.txt").write_text("x\n", encoding="utf-8")
    (folder / ".hidden.md").write_text("x\n", encoding="utf-8")
    (folder / "deep" / ".cache" / "blob").write_text("x\n", encoding="utf-8")
    sample = Path(__file__).resolve().parent.parent / "sample_traces" / "retries.jsonl"
    (folder / "deep" / "run.jsonl").write_bytes(sample.read_bytes())
    report = ingest(tmp_path / "t.duckdb", [folder])
    assert report.files == 1 and report.spans == 5
    assert report.skipped_files == (str(folder / "README.md"), str(folder / "deep" / "notes.txt"))
    assert report.to_json()["skipped_files"] == list(report.skipped_files)
    assert report.accounting.spans == 5
