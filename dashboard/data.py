"""The only module of the dashboard that touches the store.

Hard rules (``docs/architecture.md``, storage model):

- a short-lived read-only connection per query (``open_store(read_only=True)`` or
  ``open_parquet``), closed right away: never cached, so a writer (the collector, an
  ingest) is blocked for no longer than one query;
- results are cached (``st.cache_data``) instead, keyed by the store's version (its files'
  sizes and modification times), so pages stay fast on an unchanged store and a live store
  (the collector flushes every second or so) shows new data at the next render;
- a lock conflict is retried with backoff; if the writer still holds the store the page
  shows "store busy, retrying" (:func:`show_problems`) instead of crashing, and reruns by
  itself once the writer lets go.

The store comes from ``TREELLM_DASHBOARD_PARQUET`` (folders separated by the path
separator), else ``TREELLM_DASHBOARD_DB``, else the default store. What the store holds is
shown as text, never Markdown (``dashboard.text``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import streamlit as st

from dashboard.text import literal
from treellm import analysis, settings
from treellm.analysis import Filters
from treellm.errors import StoreBusyError, StoreError
from treellm.store.connection import default_db_path, open_parquet, open_store

RUN_CHOICES = 500
"""The run explorer lists the latest runs; a deep link opens any run."""
TTL_S = 600
"""Results are kept while the store is unchanged: the cache key holds the store's version
(the files' sizes and modification times), so new data shows at the next render and an
unchanged store is never queried twice."""


Source = tuple[str, tuple[str, ...], tuple[int, ...]]


def source() -> Source:
    """``(kind, paths, version)``: what the dashboard reads (``"parquet"`` folders or a
    ``"db"`` file) and a version stamp that changes whenever the data does."""
    parquet = settings.get(settings.TREELLM_DASHBOARD_PARQUET)
    if parquet:
        folders = tuple(str(p) for p in parquet)
        files = [f for folder in folders for f in Path(folder).rglob("*.parquet")]
        return "parquet", folders, _stamp(files)
    db = str(settings.get(settings.TREELLM_DASHBOARD_DB) or default_db_path())
    return "db", (db,), _stamp([Path(db), Path(db + ".wal")])


def _stamp(files: list[Path]) -> tuple[int, ...]:
    stamp = [len(files)]
    for file in files:
        try:
            info = file.stat()
        except OSError:
            continue
        stamp += [info.st_size, info.st_mtime_ns]
    return tuple(stamp)


def describe_source() -> str:
    kind, paths, _ = source()
    return f"Parquet: {', '.join(paths)}" if kind == "parquet" else f"store: {paths[0]}"


@contextlib.contextmanager
def _connect(src: Source) -> Iterator[duckdb.DuckDBPyConnection]:
    kind, paths, _ = src
    con = open_parquet(list(paths)) if kind == "parquet" else open_store(paths[0], read_only=True, retries=6)
    try:
        yield con
    finally:
        con.close()


@contextlib.contextmanager
def show_problems() -> Iterator[None]:
    """Render a busy or missing store as a message, never a traceback. A busy page
    recovers by itself: it checks the store every :data:`BUSY_RETRY_S` seconds and
    reruns as soon as the writer lets go (the button only saves the wait)."""
    try:
        yield
    except StoreBusyError:
        st.warning("Store busy, retrying: a writer holds the store's lock. The page refreshes by itself when it "
                   "is free.")  # fmt: skip
        if st.button("Retry now"):
            st.rerun()
        _rerun_when_free()
    except StoreError as exc:
        st.info(f"No data to show: {literal(exc)}")


BUSY_RETRY_S = 2.0
"""How often a page showing "store busy" checks whether the writer has let go."""


@st.fragment(run_every=BUSY_RETRY_S)
def _rerun_when_free() -> None:
    """Rerun the whole page once the store opens (a fragment, so it ticks while the page waits)."""
    if _store_free(source()):
        st.rerun(scope="app")


def _store_free(src: Source) -> bool:
    """Whether a read-only open succeeds right now (one try, closed at once). Any other
    problem counts as free: the rerun then shows it."""
    kind, paths, _ = src
    if kind != "db":
        return True
    try:
        open_store(paths[0], read_only=True, retries=0).close()
    except StoreBusyError:
        return False
    except StoreError:
        return True
    return True


# -- cached queries (keyed by the source and the filters) -----------------------------------------


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _filter_options(src: Source) -> dict[str, Any]:
    with _connect(src) as con:
        runs = con.execute("SELECT service, agent, model, start_ns FROM runs").df()
        tools = [r[0] for r in con.execute("SELECT DISTINCT tool FROM tool_calls ORDER BY tool").fetchall()]
    return {
        "services": sorted(x for x in runs["service"].dropna().unique()),
        "agents": sorted(x for x in runs["agent"].dropna().unique()),
        "models": sorted(x for x in runs["model"].dropna().unique()),
        "tools": tools,
        "first": runs["start_ns"].min() if len(runs) else None,
        "last": runs["start_ns"].max() if len(runs) else None,
    }


def filter_options() -> dict[str, Any]:
    return _filter_options(source())


def sidebar_filters() -> Filters:
    """The filters every page shows in its sidebar (time, service, agent, model, tool)."""
    options = filter_options()
    sidebar = st.sidebar
    sidebar.caption(literal(describe_source()))
    any_ = "(all)"
    service = sidebar.selectbox("Service", [any_, *options["services"]], key="f_service")
    agent = sidebar.selectbox("Agent", [any_, *options["agents"]], key="f_agent")
    model = sidebar.selectbox("Model", [any_, *options["models"]], key="f_model")
    tool = sidebar.selectbox("Tool", [any_, *options["tools"]], key="f_tool")
    since = until = None
    if options["first"] is not None:
        first = dt.datetime.fromtimestamp(options["first"] / 1e9, dt.UTC).date()
        last = dt.datetime.fromtimestamp(options["last"] / 1e9, dt.UTC).date()
        window = sidebar.date_input("Runs started", value=(first, last), key="f_window")
        if isinstance(window, tuple) and len(window) == 2:
            since = dt.datetime.combine(window[0], dt.time(), dt.UTC)
            until = dt.datetime.combine(window[1] + dt.timedelta(days=1), dt.time(), dt.UTC)
    return Filters(since, until, *(None if v == any_ else v for v in (service, agent, model, tool)))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _query(src: Source, name: str, filters: Filters, extra: tuple[Any, ...]) -> Any:
    with _connect(src) as con:
        if name == "totals":
            return analysis.totals(con, filters)
        if name == "tuning":
            return analysis.tuning_by_tool(con, filters, tolerance=extra[0])
        if name == "limits_toml":
            return analysis.limits_toml(analysis.tuning_by_tool(con, filters, tolerance=extra[0]))
        if name == "what_if":
            return analysis.what_if_by_tool_limit(con, Filters(filters.since, filters.until, filters.service,
                                                                filters.agent, filters.model, extra[0]))  # fmt: skip
        if name == "runs":
            where, params = filters.run_condition("r")
            return con.execute(
                f"SELECT * FROM runs r WHERE {where} ORDER BY r.start_ns DESC LIMIT {RUN_CHOICES}", params
            ).df()
        if name == "shape_groups":
            shapes = analysis.shape_by_run(con, filters)
            return shapes_grouped(shapes, extra[0])
        if name == "actions":
            where, params = filters.where("l")
            return con.execute(
                f"SELECT l.tool, l.action, l.shadow, count(*) AS calls FROM loop_events l WHERE {where} "
                "GROUP BY ALL ORDER BY calls DESC",
                params,
            ).df()
        function = getattr(analysis, name)
        return function(con, filters)


def query(name: str, filters: Filters, *extra: Any) -> Any:
    """Run an analysis function (by name) or a dashboard query, cached for a few seconds."""
    return _query(source(), name, filters, extra)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _run(src: Source, run_id: str) -> dict[str, pd.DataFrame]:
    with _connect(src) as con:
        nodes = con.execute(
            """SELECT n.node_id, n.kind, n.parent_id, n.depth, n.status, n.tool, n.signature, n.ordinal,
                      n."limit", n.limit_source, n.result_hash, n.attempts, n.skill_stack, n.start_ns, n.end_ns,
                      s.name AS span_name, s.arguments, s.result, s.input_tokens, s.output_tokens,
                      s.attributes['treellm.think.text'] AS text, s.span_id
               FROM nodes n JOIN spans s USING (trace_id, span_id)
               WHERE n.run_id = ? ORDER BY n.start_ns, n.node_id""",
            [run_id],
        ).df()
        loops = con.execute(
            """SELECT node_id, tool, signature, count, "limit", limit_source, action, shadow, arguments,
                      earlier_node_ids_raw AS earlier_node_ids, time_ns
               FROM loop_events WHERE run_id = ? ORDER BY time_ns""",
            [run_id],
        ).df()
        run = con.execute("SELECT * FROM runs WHERE run_id = ?", [run_id]).df()
    return {"nodes": nodes, "loops": loops, "run": run}


def run_detail(run_id: str) -> dict[str, pd.DataFrame]:
    """One run: its nodes (with captured content), its caught calls, and its runs row."""
    return _run(source(), run_id)


CONTENT_COLUMNS = ("arguments", "result", "text")


def node_facts(row: pd.Series) -> dict[str, str | None]:
    """A node's fields as text (missing values as None), without its captured content."""
    facts: dict[str, str | None] = {}
    for key, value in row.items():
        if key in CONTENT_COLUMNS:
            continue
        facts[str(key)] = (
            None if value is None or (not isinstance(value, str | list) and pd.isna(value)) else str(value)
        )
    return facts


def shapes_grouped(shapes: pd.DataFrame, by: str) -> pd.DataFrame:
    """Runs counted per (max depth, max breadth, ``by``), with mean nodes: what the scatter draws."""
    if shapes.empty:
        return shapes
    frame = shapes.assign(day=shapes["day"].astype(str))
    frame[by] = frame[by].fillna("(none)").astype(str)
    return (
        frame.groupby(["max_depth", "max_breadth", by])
        .agg(runs=("run_id", "size"), nodes=("nodes", "mean"), example=("run_id", "first"))
        .reset_index()
    )


def prepend(first: pd.DataFrame, rest: pd.DataFrame) -> pd.DataFrame:
    """``first``'s rows, then ``rest``'s (for a deep-linked run outside the listed ones)."""
    return pd.concat([first, rest], ignore_index=True)


LINK_COLUMNS = {"link": st.column_config.LinkColumn("open", display_text="open in the run explorer")}
"""Column settings for tables whose rows link to a call in the run explorer."""


def with_links(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with a ``link`` column first: the run explorer at the row's run and node
    (a relative URL, so it works under any host); ids are quoted, never markup."""
    from urllib.parse import urlencode

    links = [f"run?{urlencode({'run': r, 'node': n})}" for r, n in zip(frame["run_id"], frame["node_id"], strict=True)]
    return frame.assign(link=links)[["link", *frame.columns]]
