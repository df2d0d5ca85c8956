"""The tuning's per-turn and per-signature counts, read from the ``call_turns`` and
``call_signatures`` views (kept as tables by ``treellm derive`` on ClickHouse), equal what the
tuning computed from every call before: a window over each run's calls of a signature, and a
GROUP BY of the calls per turn. On real coding trajectories, whose edits make identical calls
count afresh, on the production-day sample, and with filters."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from treellm.analysis import tuning
from treellm.analysis.filters import Filters
from treellm.store import ingest, open_store
from treellm.store.views import CALLS_SQL

ROOT = Path(__file__).resolve().parents[1]
TRAJECTORIES = Path(__file__).parent / "data" / "mini-swe-agent" / "deepseek_chat_dev"
DAY = ROOT / "sample_traces" / "production_day.jsonl"


def _afresh_by_window(con: duckdb.DuckDBPyConnection, f: Filters) -> dict[str, int]:
    where, params = f.where("c")
    rows = con.execute(
        f"""SELECT tool, count(*) FILTER (WHERE ordinal = 1 AND seen > 1) FROM (
                SELECT c.tool AS tool, c.ordinal AS ordinal,
                       row_number() OVER (PARTITION BY c.run_id, c.signature ORDER BY c.start_ns, c.span_id) AS seen
                FROM ({CALLS_SQL}) c WHERE {where} AND c.signature IS NOT NULL) GROUP BY tool""",
        params,
    ).fetchall()
    return {str(tool): int(n) for tool, n in rows}


def _turns_by_group(con: duckdb.DuckDBPyConnection, f: Filters) -> list[tuple[str, int, int]]:
    where, params = f.where("c", tool_column=None)
    return sorted(
        con.execute(
            f"""SELECT t.first_tool, t.min_ordinal, count(*)
                FROM (SELECT c.run_id, max(c.tool) AS last_tool, min(c.tool) AS first_tool,
                             min(coalesce(c.ordinal, 1)) AS min_ordinal
                      FROM ({CALLS_SQL}) c WHERE {where} GROUP BY c.run_id, coalesce(c.parent_id, c.node_id)) t
                WHERE t.first_tool = t.last_tool GROUP BY t.first_tool, t.min_ordinal""",
            params,
        ).fetchall()
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("tuning-views") / "store.duckdb"
    ingest(db, [TRAJECTORIES, DAY])
    return db


@pytest.fixture
def con(store: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    opened = open_store(store, read_only=True)
    yield opened
    opened.close()


@pytest.mark.parametrize("tool", [None, "bash", "search"])
def test_the_views_count_what_the_calls_said(con: duckdb.DuckDBPyConnection, tool: str | None) -> None:
    f = Filters(tool=tool)
    afresh = tuning._afresh(con, f)
    assert afresh == _afresh_by_window(con, f)
    turns = tuning._single_tool_turns(con, f)
    assert sorted(zip(turns["tool"], turns["min_ordinal"], turns["turns"], strict=True)) == _turns_by_group(con, f)


def test_the_data_holds_calls_counted_afresh_and_turns_a_limit_ends(con: duckdb.DuckDBPyConnection) -> None:
    """Not vacuous: the trajectories' edits restart counts, and turns of one tool repeat it."""
    assert tuning._afresh(con, Filters())["bash"] > 0
    turns = tuning._single_tool_turns(con, Filters())
    assert (turns["min_ordinal"] > 1).any()


def test_a_run_filter_narrows_both(con: duckdb.DuckDBPyConnection) -> None:
    service = con.execute("SELECT service FROM runs WHERE service IS NOT NULL LIMIT 1").fetchone()
    assert service is not None
    f = Filters(service=service[0])
    assert tuning._afresh(con, f) == _afresh_by_window(con, f)
    turns = tuning._single_tool_turns(con, f)
    assert sorted(zip(turns["tool"], turns["min_ordinal"], turns["turns"], strict=True)) == _turns_by_group(con, f)
