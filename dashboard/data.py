"""The only module of the dashboard that touches the store.

Hard rules (``docs/architecture.md``, storage model):

- the views are the contract: every query is a typed analysis function
  (``treellm.analysis`` and ``treellm.analysis.explorer``) over a store connection, so
  the pages work alike over DuckDB, Parquet folders and ClickHouse; no SQL here, no file
  of the store read behind its engine's back;
- a short-lived read-only connection per query (``open_store(read_only=True)``,
  ``open_parquet`` or ``open_clickhouse``), closed right away: never cached, so a writer
  (the collector, an ingest) is blocked for no longer than one query; ClickHouse's is kept
  :data:`KEEP_S` seconds after a query, so one page's queries share it;
- results are cached (``st.cache_data``) instead, keyed by the data's version
  (:func:`treellm.analysis.explorer.data_version`: span count, first start, last end, read
  at most every :data:`VERSION_TTL_S` seconds), so pages stay fast on unchanged data and a
  live store (the collector flushes every second or so) shows new data at the next render;
- a lock conflict is retried with backoff; if the writer still holds the store the page
  shows "store busy, retrying" (:func:`show_problems`) instead of crashing, and reruns by
  itself once the writer lets go.

The data comes from the readers' one rule (``treellm.store.sources``), given
``TREELLM_DASHBOARD_PARQUET`` (folders separated by the path separator) as the Parquet folders,
``TREELLM_DASHBOARD_DB`` as the DuckDB file and the script's ``--clickhouse-table NAME`` (as
``treellm dashboard --clickhouse-table`` passes it) as the spans table. chDB holds one data
folder per process, so ClickHouse connections are
taken one at a time. What the store holds is shown as text, never Markdown
(``dashboard.text``).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime as dt
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from dashboard.text import literal
from treellm import analysis, settings
from treellm.analysis import Filters
from treellm.analysis import explorer as ex
from treellm.analysis.tuning import limit_text
from treellm.errors import ConfigError, MissingExtraError, StoreBusyError, StoreError, TreeLLMError
from treellm.store import sources
from treellm.store.backend import StoreConnection
from treellm.store.sources import Source, choose_source, open_source
from treellm.urls import mask_urls

RUN_CHOICES = 500
TABLE_ROWS = 1000
"""The most rows a table of calls shows (the first, in its order; the page says of how many)."""
"""The run explorer lists the latest runs; a deep link opens any run."""
TTL_S = 600
"""Results are kept while the data is unchanged: the cache key holds the data's version,
so new data shows at the next render and unchanged data is never queried twice."""
VERSION_TTL_S = 1.0
"""How long a data version is trusted before the views are asked again (about the
collector's flush interval): at most one version query per second, whatever the reruns."""


def script_option(name: str, argv: Sequence[str] | None = None) -> str | None:
    """``--name VALUE`` or ``--name=VALUE`` among the script's arguments (``streamlit run
    app.py -- --name VALUE``), else None (pure)."""
    args = list(sys.argv[1:] if argv is None else argv)
    for index, arg in enumerate(args):
        if arg == name and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith(name + "="):
            return arg.partition("=")[2]
    return None


def source() -> Source:
    """What the dashboard reads (see the module's docstring for the order: the readers' one rule,
    ``treellm.store.sources``)."""
    db = settings.get(settings.TREELLM_DASHBOARD_DB)
    parquet = settings.get(settings.TREELLM_DASHBOARD_PARQUET) or ()
    return choose_source(db=None if db is None else str(db), parquet=[str(p) for p in parquet],
                         table=script_option("--clickhouse-table"))  # fmt: skip


def describe_source(src: Source | None = None) -> str:
    """The source as one line of text (a URL's password masked)."""
    return sources.describe_source(src or source())


_CLICKHOUSE_LOCK = threading.Lock()
"""chDB allows one data folder per process: one ClickHouse connection at a time."""


_ATTACHED: set[Source] = set()
"""The ClickHouse sources whose views this process set up: later queries only connect."""

KEEP_S = 2.0
"""A ClickHouse connection is kept this long after its query, so that one page's queries share
it, then closed. Opening a chDB folder of 10M spans took 0.12-0.45 s a query (a page asks up to
ten); closed, the folder is free again for another process (a derive pass), which chDB allows
only one of at a time."""


@dataclasses.dataclass
class _Kept:
    """The process's kept ClickHouse connection (under :data:`_CLICKHOUSE_LOCK`): a closer
    scheduled at each query's end closes it unless a later query reused it (``generation``)."""

    source: Source | None = None
    con: StoreConnection | None = None
    generation: int = 0


_KEPT = _Kept()


def _take(src: Source) -> StoreConnection | None:
    """The kept connection when it reads ``src``; any other is closed (one chDB folder a process)."""
    con, _KEPT.con = _KEPT.con, None
    _KEPT.generation += 1  # a closer already scheduled leaves the connection alone
    if con is not None and _KEPT.source != src:
        con.close()
        con = None
    return con


def _keep(src: Source, con: StoreConnection) -> None:
    _KEPT.source, _KEPT.con = src, con
    generation = _KEPT.generation
    closer = threading.Timer(KEEP_S, _close_kept, args=(generation,))
    closer.daemon = True
    closer.start()


def _close_kept(generation: int | None = None, *, wait_s: float = -1) -> None:
    if not _CLICKHOUSE_LOCK.acquire(timeout=wait_s):
        return
    try:
        if generation is None or generation == _KEPT.generation:
            con = _take(_KEPT.source) if _KEPT.source is not None else None
            if con is not None:
                con.close()
    finally:
        _CLICKHOUSE_LOCK.release()


def release(wait_s: float = -1) -> None:
    """Close the kept ClickHouse connection now (chDB's folder free for others at once); give
    up after ``wait_s`` seconds when a query holds it (-1: wait for it)."""
    _close_kept(wait_s=wait_s)


atexit.register(release, 30.0)  # chDB crashed the server's exit (SIGSEGV) when a session was still open


@contextlib.contextmanager
def _connect(src: Source) -> Iterator[StoreConnection]:
    """A connection to ``src`` for one query: a DuckDB file or Parquet folders are opened and
    closed (a writer waits for one query at most); ClickHouse reuses the connection kept since
    the last query (:data:`KEEP_S`)."""
    if src.kind != "clickhouse":
        opened = open_source(src, retries=6)
        try:
            yield opened
        finally:
            opened.close()
        return
    with _CLICKHOUSE_LOCK:
        kept = _take(src)
        con = kept if kept is not None else open_source(src, retries=6, attach=src not in _ATTACHED)
        _ATTACHED.add(src)
        try:
            yield con
        except BaseException:
            _ATTACHED.discard(src)  # a failed query sets the views up again next time (dropped, upgraded)
            con.close()
            raise
        _keep(src, con)


def _chdb_folder(src: Source) -> str | None:
    """The folder of a chDB source (``chdb:PATH``, the working folder for ``chdb:``), else None."""
    if src.kind != "clickhouse" or not src.paths[0].startswith("chdb:"):
        return None
    return src.paths[0].removeprefix("chdb:") or "."


def warm(src: Source) -> bool:
    """Open the chDB folder of ``src`` once before any page asks (``dashboard.serve``), as a query
    would: chDB's first open in the process with the set-up of treellm's views (0.42-0.66 s at 10M
    spans against 0.14-0.21 s for a later open, BENCHMARKS.md "Dashboard") happens while the server
    starts. The connection
    is then kept :data:`KEEP_S` seconds, as after a query. Only a folder that exists (opening
    another would create it) and that no other process holds (a derive pass: waiting for it would
    hold up the start), never a server (one that does not answer would); False when not opened:
    the first page then opens it and says what is wrong."""
    from treellm.store.clickhouse import chdb_holder

    folder = _chdb_folder(src)
    if folder is None or not Path(folder).is_dir() or chdb_holder(folder) is not None:
        return False
    try:
        with _connect(src):
            return True
    except TreeLLMError:
        return False


@st.cache_data(ttl=VERSION_TTL_S, show_spinner=False)
def _version(src: Source) -> ex.DataVersion:
    with _connect(src) as con:
        return ex.data_version(con)


def version(src: Source) -> ex.DataVersion:
    """The data version of ``src``, read from its views (cached :data:`VERSION_TTL_S` seconds)."""
    return _version(src)


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
        st.info(f"No data to show: {literal(mask_urls(str(exc)))}")
    except (ConfigError, MissingExtraError) as exc:
        st.error(f"Cannot read the data: {literal(mask_urls(str(exc)))}")


BUSY_RETRY_S = 2.0
"""How often a page showing "store busy" checks whether the writer has let go."""


@st.fragment(run_every=BUSY_RETRY_S)
def _rerun_when_free() -> None:
    """Rerun the whole page once the store opens (a fragment, so it ticks while the page waits)."""
    if _store_free(source()):
        st.rerun(scope="app")


def _store_free(src: Source) -> bool:
    """Whether a read-only open succeeds right now (one try, closed at once). Any other
    problem counts as free: the rerun then shows it. A chDB folder is free when no other
    process has it open."""
    folder = _chdb_folder(src)
    if folder is not None:
        from treellm.store.clickhouse import chdb_holder

        return chdb_holder(folder) is None
    if src.kind != "db":
        return True
    try:
        open_source(src, retries=0).close()
    except StoreBusyError:
        return False
    except StoreError:
        return True
    return True


# -- cached queries (keyed by the source, its data version and the filters) ---------------------------


def _key() -> tuple[Source, ex.DataVersion]:
    src = source()
    return src, version(src)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _filter_options(src: Source, stamp: ex.DataVersion) -> ex.FilterOptions:
    with _connect(src) as con:
        return ex.filter_options(con)


def filter_options() -> ex.FilterOptions:
    return _filter_options(*_key())


def sidebar_filters() -> Filters:
    """The filters every page shows in its sidebar (time, service, agent, model, tool)."""
    options = filter_options()
    sidebar = st.sidebar
    sidebar.caption(literal(describe_source()))
    any_ = "(all)"
    service = sidebar.selectbox("Service", [any_, *options.services], key="f_service")
    agent = sidebar.selectbox("Agent", [any_, *options.agents], key="f_agent")
    model = sidebar.selectbox("Model", [any_, *options.models], key="f_model")
    tool = sidebar.selectbox("Tool", [any_, *options.tools], key="f_tool")
    since = until = None
    if options.first_ns is not None and options.last_ns is not None:
        first = dt.datetime.fromtimestamp(options.first_ns / 1e9, dt.UTC).date()
        last = dt.datetime.fromtimestamp(options.last_ns / 1e9, dt.UTC).date()
        window = sidebar.date_input("Runs started", value=(first, last), key="f_window")
        # the whole range (the default) filters nothing: no condition on every query's runs
        if isinstance(window, tuple) and len(window) == 2 and tuple(window) != (first, last):
            since = dt.datetime.combine(window[0], dt.time(), dt.UTC)
            until = dt.datetime.combine(window[1] + dt.timedelta(days=1), dt.time(), dt.UTC)
    return Filters(since, until, *(None if v == any_ else v for v in (service, agent, model, tool)))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _query(src: Source, stamp: ex.DataVersion, name: str, filters: Filters, extra: tuple[Any, ...]) -> Any:
    with _connect(src) as con:
        if name in ("tuning", "tuning_glance"):  # the glance: verdicts without what explains them (the overview)
            return analysis.tuning_by_tool(con, filters, tolerance=extra[0], glance=name == "tuning_glance")
        if name == "what_if":
            return analysis.what_if_by_tool_limit(con, Filters(filters.since, filters.until, filters.service,
                                                                filters.agent, filters.model, extra[0]))  # fmt: skip
        if name == "runs":
            return ex.run_list(con, filters, limit=RUN_CHOICES)
        if name == "run_table":
            return ex.run_table(con, filters, extra[0])
        if name == "shape_groups":  # the scatter's bubbles: (by, among)
            return analysis.shape_groups(con, filters, by=extra[0], among=extra[1])
        if name == "shape_values":
            return analysis.shape_values(con, filters, by=extra[0])
        if name == "shape_distribution" and extra:  # (among)
            return analysis.shape_distribution(con, filters, among=extra[0])
        if name == "actions":
            return ex.actions_by_tool(con, filters)
        if name in ("repeats", "near_repeats", "identical_repeats_and_rows", "near_repeats_and_pairs") and extra:
            return getattr(analysis, name)(con, filters, limit=extra[0])  # the first extra[0] rows (and per tool)
        function = getattr(analysis, name)
        return function(con, filters)


def query(name: str, filters: Filters, *extra: Any) -> Any:
    """Run an analysis function (by name) or a dashboard query, cached while the data is unchanged."""
    if name == "limits_toml":  # from the tuning and the rules the page has already asked for
        return analysis.limits_toml(query("tuning", filters, *extra), rules=query("rules_by_tool", filters))
    return _query(*_key(), name, filters, extra)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _run(src: Source, stamp: ex.DataVersion, run_id: str) -> dict[str, pd.DataFrame]:
    with _connect(src) as con:
        return ex.run_detail(con, run_id)


def run_detail(run_id: str) -> dict[str, pd.DataFrame]:
    """One run: its nodes (with captured content), its caught calls, its runs row and its spans."""
    return _run(*_key(), run_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _outcomes(src: Source, stamp: ex.DataVersion) -> tuple[str, ...]:
    with _connect(src) as con:
        return ex.outcomes(con)


def outcome_choices() -> tuple[str, ...]:
    """The outcomes the runs have, for the run list's filter."""
    return _outcomes(*_key())


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _attributes(
    src: Source, stamp: ex.DataVersion, run_id: str, node_id: str, traces: tuple[str, ...]
) -> dict[str, str]:
    with _connect(src) as con:
        frame = ex.node_attributes(con, run_id, node_id, trace_ids=traces or None)
    return {str(k): str(v) for k, v in zip(frame["key"], frame["value"], strict=True)}


def think_chat(run_id: str, node_id: str) -> tuple[ex.ChatMessage, ...]:
    """Think node ``node_id``'s chat: its stored messages, then the calls it made and those caught
    (its run's traces known from the run's detail: found once)."""
    detail = run_detail(run_id)
    attributes = _attributes(*_key(), run_id, node_id, ex.run_traces(detail["run"]))
    return ex.think_chat(attributes, detail["nodes"], detail["loops"], node_id)


def run_table(filters: Filters, *, text: str | None, outcome: str | None, sort: str) -> pd.DataFrame:
    """The run list of the selection (``explorer.run_table``) as shown: newest or most first,
    at most :data:`RUN_CHOICES` rows. ``sort`` is one of :data:`SORTS`' keys."""
    query = ex.RunQuery(text=text or None, outcome=outcome, sort=SORTS[sort], limit=RUN_CHOICES)
    table: pd.DataFrame = _query(*_key(), "run_table", filters, (query,))
    return table


SORTS: dict[str, ex.RunSort] = {
    "newest": "start", "wasted repeats": "wasted", "prunes": "pruned", "calls": "calls", "duration": "duration",
    "nodes": "nodes",
}  # fmt: skip
"""The run list's orders, as the page names them (each the largest first)."""
ChatMessage = ex.ChatMessage
"""One line of a think node's chat (``explorer.ChatMessage``)."""
VIEWS = ("tree", "icicle", "timeline", "chat")
"""What the run explorer shows of a run (the URL's ``view``)."""


def run_link(run_id: str, view: str, node: str | None = None) -> str:
    """The run explorer's relative URL of a run's ``view`` (and node): a deep link (pure)."""
    from urllib.parse import urlencode

    query = {"run": run_id, "view": view, **({"node": node} if node else {})}
    return f"run?{urlencode(query)}"


def run_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The run list as the page shows it (pure): start as a UTC time, duration in seconds,
    and a deep link to each run's timeline and chat."""
    return pd.DataFrame({
        "started": pd.to_datetime(table["start_ns"], unit="ns", utc=True),
        "outcome": table["outcome"], "agent": table["agent"], "service": table["service"],
        "duration_s": table["duration_ns"] / 1e9, "calls": table["calls"], "wasted": table["wasted"],
        "pruned": table["pruned"], "nodes": table["nodes"], "run_id": table["run_id"],
        "timeline": [run_link(r, "timeline") for r in table["run_id"]],
        "chat": [run_link(r, "chat") for r in table["run_id"]],
    })  # fmt: skip


RUN_ROW_COLUMNS = {
    "started": st.column_config.DatetimeColumn("started (UTC)", format="YYYY-MM-DD HH:mm:ss"),
    "duration_s": st.column_config.NumberColumn("duration (s)", format="%.2f"),
    "wasted": st.column_config.NumberColumn("wasted repeats"),
    "timeline": st.column_config.LinkColumn("timeline", display_text="timeline"),
    "chat": st.column_config.LinkColumn("chat", display_text="chat"),
}
"""Column settings of the run list."""


def chat_node(nodes: pd.DataFrame, node_id: str | None) -> str | None:
    """The think node whose chat shows for ``node_id`` (pure): the node itself when it is a
    think node, else its nearest think ancestor; the run's first think node when ``node_id``
    is None or not in the run; None when the run has no think node."""
    kinds = dict(zip(nodes["node_id"], nodes["kind"], strict=True))
    parents = dict(zip(nodes["node_id"], nodes["parent_id"], strict=True))
    seen: set[str] = set()
    current = node_id
    while isinstance(current, str) and current in kinds and current not in seen:
        if kinds[current] == "think":
            return current
        seen.add(current)
        current = parents.get(current)
    thinks = [n for n, k in kinds.items() if k == "think"]
    return thinks[0] if thinks else None


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


@dataclasses.dataclass(frozen=True)
class ShapeSide:
    """One side of the shapes page's comparison: its runs, the measures' mean, median and max,
    and its scatter's bubbles by outcome."""

    runs: int
    summary: pd.DataFrame
    grouped: pd.DataFrame


def shape_groups(filters: Filters, by: str) -> pd.DataFrame:
    """The runs' shapes as the scatter draws them, per ``by`` (counted by the store)."""
    grouped: pd.DataFrame = query("shape_groups", filters, by, None)
    return grouped


def shape_values(filters: Filters, by: str) -> list[str]:
    """The values of ``by`` (agent, model, day) among the runs, as text, sorted."""
    return list(query("shape_values", filters, by))


def shape_side(filters: Filters, by: str, value: str) -> ShapeSide:
    """The runs whose ``by`` is ``value``, summarised for one side of the comparison."""
    among = (by, value)
    dist = query("shape_distribution", filters, among)
    summary = dist.set_index("measure")[["mean", "p50", "max"]].rename(columns={"p50": "median"})
    runs = int(dist["runs"].iloc[0]) if not dist.empty else 0
    return ShapeSide(runs, summary, query("shape_groups", filters, "outcome", among))


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


def limits_shown(tuning: pd.DataFrame) -> pd.DataFrame:
    """A tuning's table as shown: the limit the agent ran under as text, ``none`` where it never ran
    with one (as ``treellm tune`` prints it; an empty number cell read as a missing value)."""
    return tuning.assign(current_max_repeats=[limit_text(v) for v in tuning["current_max_repeats"]])
