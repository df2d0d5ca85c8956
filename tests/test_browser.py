"""A real browser on the real dashboard: `treellm dashboard` on loopback, every page in headless Chromium.

Chromium is Debian's (``/usr/bin/chromium``, or ``CHROMIUM_PATH``), driven by playwright;
``make test`` installs it when apt-get is usable. Without a browser the test is skipped,
unless ``TREELLM_REQUIRE_BROWSER=1`` (as ``.ci/run`` sets), where it fails.
Screenshots land in the test's output folder (and in ``test-output/`` for a human to look).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest

from treellm.store import ingest

ROOT = Path(__file__).resolve().parent.parent
PAGES = {
    "": ["treellm: overview", "Runs", "Tuning verdicts at a glance"],
    "run": ["Run explorer", "Run tree", "Node details"],
    "shapes": ["Tree shapes", "Depth against breadth", "Side by side"],
    "tools": ["Tools", "Calls per tool", "Near repeats"],
    "tuning": ["Tuning", "What if", "Download limits.toml"],
}
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]  # fmt: skip


def chromium() -> str | None:
    path = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None and os.environ.get("TREELLM_REQUIRE_BROWSER") == "1":
        pytest.fail("no Chromium found (TREELLM_REQUIRE_BROWSER=1): install Debian's chromium or set CHROMIUM_PATH")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(db: Path) -> Iterator[str]:
    """``treellm dashboard`` on ``db`` at a free loopback port: yields its URL once healthy."""
    port = free_port()
    with subprocess.Popen(
        [sys.executable, "-m", "treellm", "dashboard", "--db", str(db), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=db.parent,
    ) as server:  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                        if response.status == 200:
                            break
                except OSError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        pytest.fail(f"the dashboard did not start: {server.stdout.read() if server.stdout else ''}")
                    time.sleep(0.3)
            yield url
        finally:
            server.terminate()
            server.communicate(timeout=30)


@pytest.fixture(scope="module")
def samples_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if chromium() is None:
        pytest.skip("no Chromium on this machine (set TREELLM_REQUIRE_BROWSER=1 to make this a failure)")
    db = tmp_path_factory.mktemp("browser") / "samples.duckdb"
    ingest(db, [ROOT / "sample_traces", ROOT / "tests" / "data" / "frameworks" / "langgraph.pb"])
    return db


@pytest.fixture(scope="module")
def dashboard_url(samples_db: Path) -> Iterator[str]:
    with serving(samples_db) as url:
        yield url


class Requests:
    """Every URL a page asks for (requests, web sockets, the favicon): all must stay on loopback."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.urls: list[str] = []
        page.on("request", lambda request: self.urls.append(request.url))
        page.on("websocket", lambda socket: self.urls.append(socket.url))

    def assert_loopback(self) -> None:
        icons = self.page.evaluate("() => [...document.querySelectorAll('link[rel*=icon]')].map(l => l.href)")
        outside = [u for u in [*self.urls, *icons] if not _loopback(u)]
        assert not outside, outside
        assert self.urls


def _loopback(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("data", "blob", "about") or parts.hostname in ("127.0.0.1", "localhost", "::1")


@pytest.mark.parametrize("path", list(PAGES))
def test_every_page_renders_in_a_real_browser(dashboard_url: str, path: str, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    name = path or "overview"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            requests = Requests(page)
            page.goto(f"{dashboard_url}/{path}")
            page.wait_for_selector("[data-testid='stAppViewContainer']", timeout=60_000)
            for text in PAGES[path]:
                page.get_by_text(text, exact=False).first.wait_for(timeout=60_000)
            page.wait_for_function("() => document.querySelectorAll('[data-testid=stSkeleton]').length == 0",
                                   timeout=60_000)  # fmt: skip
            page.wait_for_timeout(1000)
            assert page.locator("[data-testid='stException']").count() == 0
            assert page.get_by_text("Page not found").count() == 0
            requests.assert_loopback()
            shot = tmp_path / f"{name}.png"
            page.screenshot(path=str(shot), full_page=True)
            keep = ROOT / "test-output"
            keep.mkdir(exist_ok=True)
            shutil.copy(shot, keep / f"{name}.png")
        finally:
            browser.close()


def first_langgraph_run() -> str:
    """The run id of the first run of the recorded LangGraph trace (its root span: no agent span there)."""
    from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

    data = (ROOT / "tests" / "data" / "frameworks" / "langgraph.pb").read_bytes()
    pos = 0
    roots = []
    while pos < len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        record = TracesData.FromString(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
        for rs in record.resource_spans:
            for ss in rs.scope_spans:
                roots += [(s.start_time_unix_nano, s.trace_id.hex(), s.span_id.hex()) for s in ss.spans
                          if not s.parent_span_id]  # fmt: skip
    _, trace_id, span_id = min(roots)
    return f"{trace_id}:{span_id}"


def _measure_chart(url: str, text: str, holding: str, measure: str, shot: Path | None = None) -> Any:
    """Open ``url`` in Chromium, wait for ``text``, find the Vega-Lite chart holding ``holding`` (a CSS
    selector) and return what ``measure`` (JavaScript statements over ``chart``, ending in a return)
    gives; ``shot``: a screenshot of the page, also kept in ``test-output/``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            page.get_by_text(text, exact=False).first.wait_for(timeout=60_000)
            charts = "[...document.querySelectorAll('[data-testid=stVegaLiteChart]')]"
            chart = f"{charts}.find(c => c.querySelector('{holding}'))"
            page.wait_for_function(f"() => {chart} !== undefined", timeout=60_000)
            found = page.evaluate(f"() => {{ const chart = {chart}; {measure} }}")
            if shot is not None:
                page.screenshot(path=str(shot), full_page=True)
                keep = ROOT / "test-output"
                keep.mkdir(exist_ok=True)
                shutil.copy(shot, keep / shot.name)
            return found
        finally:
            browser.close()


def test_a_foreign_run_is_drawn_as_a_tree_in_a_real_browser(dashboard_url: str, tmp_path: Path) -> None:
    """A LangGraph run (OpenInference spans): think nodes chained, tool nodes under them, not a flat row."""
    shape = _measure_chart(  # the edges' lines (the first layer), the nodes' rows (their drawn y)
        f"{dashboard_url}/run?run={first_langgraph_run()}", "Run tree:", "g.mark-symbol",
        """const ys = [...chart.querySelectorAll('g.mark-symbol path')]
               .map(p => p.getAttribute('transform').match(/,([-0-9.e]+)\\)/)[1]);
           return {edges: chart.querySelector('g.mark-rule').children.length, levels: new Set(ys).size};""",
        shot=tmp_path / "foreign-run.png",
    )  # fmt: skip
    assert shape["edges"] >= 4 and shape["levels"] >= 3, shape


# -- untrusted text: a store whose every name and id is Markdown, HTML and terminal escapes ----------


def _hostile_pages() -> dict[str, tuple[str, str]]:
    """The pages to visit on the hostile store: their path, and a string their charts' SVG shows as text."""
    from test_untrusted_text import MISSING_RUN, RUN_IDS, node_id

    return {
        "overview": ("", "<b>b</b>"),  # the tools' tick labels
        "shapes": ("shapes", "<b>b</b>"),  # the agents' legend names
        "tools": ("tools", "<b>b</b>"),
        "tuning": ("tuning", "<b>b</b>"),  # the what-if chart's title
        "run": (f"run?{urlencode({'run': RUN_IDS[0], 'node': node_id('n2')})}", "![x](http://127.0.0.1:9/x.png)"),
        "missing-run": (f"run?{urlencode({'run': MISSING_RUN})}", "![x](http://127.0.0.1:9/x.png)"),
    }


@pytest.fixture(scope="module")
def hostile_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if chromium() is None:
        pytest.skip("no Chromium on this machine (set TREELLM_REQUIRE_BROWSER=1 to make this a failure)")
    from test_untrusted_text import hostile_store

    with serving(hostile_store(tmp_path_factory.mktemp("hostile-browser"))) as url:
        yield url


CHART_TEXT = "[data-testid=stVegaLiteChart] svg text"
"""The text the charts draw (Vega-Lite's SVG)."""
DOM_FACTS = (
    """() => {
    const plots = [...document.querySelectorAll('"""
    + CHART_TEXT
    + """')].map(t => t.textContent);
    return {
        images: [...document.images].map(i => i.src),
        links: [...document.querySelectorAll('a')].map(a => {  // HTML and SVG links
            const href = a.getAttribute('href') ?? a.getAttribute('xlink:href') ?? '';
            try { return new URL(href, document.baseURI).href; } catch (e) { return href; }
        }),
        bold: [...document.querySelectorAll('b, strong, em')].map(e => e.textContent),
        plots: plots,
        metrics: [...document.querySelectorAll('[data-testid=stMetricLabel]')].map(e => e.innerText),
        codes: [...document.querySelectorAll('[data-testid=stCode] code')].map(e => e.textContent),
    };
}"""
)


@pytest.mark.parametrize("name", list(_hostile_pages()))
def test_trace_text_is_shown_as_text_in_a_real_browser(hostile_url: str, name: str) -> None:
    """Every page on the hostile store: no image or link comes from a trace, nothing is fetched
    from outside 127.0.0.1, and the charts draw the tags as text."""
    from playwright.sync_api import sync_playwright
    from test_untrusted_text import MARKDOWN, MISSING_RUN

    path, shown = _hostile_pages()[name]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            requests = Requests(page)
            page.goto(f"{hostile_url}/{path}")
            page.wait_for_selector("[data-testid='stAppViewContainer']", timeout=60_000)
            page.wait_for_function(f"() => document.querySelectorAll('{CHART_TEXT}').length > 0", timeout=60_000)
            page.wait_for_function("() => document.querySelectorAll('[data-testid=stSkeleton]').length == 0",
                                   timeout=60_000)  # fmt: skip
            page.wait_for_timeout(1500)
            assert page.locator("[data-testid='stException']").count() == 0
            page.locator("[data-testid=stSidebar] [data-testid=stSelectbox]").nth(1).click()  # the agents, open
            options = page.get_by_role("option")
            options.first.wait_for(timeout=30_000)
            assert any(MARKDOWN in text for text in options.all_inner_texts())  # as typed
            facts = page.evaluate(DOM_FACTS)
            requests.assert_loopback()
            assert all(_loopback(src) for src in facts["images"]), facts["images"]
            assert not [src for src in facts["images"] if "x.png" in src or src.endswith("/x")], facts["images"]
            assert all(_loopback(href) and urlsplit(href).port != 9 for href in facts["links"]), facts["links"]
            assert not {"b", "bold", "a", "link"} & set(facts["bold"]), facts["bold"]
            assert any(shown in text for text in facts["plots"]), facts["plots"][:20]
            if name == "shapes":
                assert len(facts["metrics"]) == 2
                assert all(MARKDOWN in m.replace("\u2060", "") for m in facts["metrics"]), facts["metrics"]
            if name == "missing-run":
                assert MISSING_RUN in facts["codes"]
                assert page.get_by_text("The linked run is not in the store", exact=False).count() == 1
        finally:
            browser.close()


def test_the_busy_page_recovers_by_itself_in_a_real_browser(tmp_path: Path) -> None:
    """A writer holds the store while the page loads: "store busy", then, once it lets go, the
    real page, with no click."""
    from playwright.sync_api import sync_playwright

    if chromium() is None:
        pytest.skip("no Chromium on this machine (set TREELLM_REQUIRE_BROWSER=1 to make this a failure)")
    from test_untrusted_text import hostile_store

    db = hostile_store(tmp_path)
    script = f"import duckdb, sys; c = duckdb.connect({str(db)!r}); print('held', flush=True); sys.stdin.readline()"
    with serving(db) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            with subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True) as holder:  # fmt: skip
                assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
                try:
                    page = browser.new_page(viewport={"width": 1400, "height": 1000})
                    page.goto(url)
                    page.get_by_text("Store busy, retrying", exact=False).first.wait_for(timeout=60_000)
                finally:
                    holder.communicate("\n", timeout=30)
            page.get_by_text("Tuning verdicts at a glance").first.wait_for(timeout=60_000)
            assert page.get_by_text("Store busy, retrying", exact=False).count() == 0
        finally:
            browser.close()


# -- the run explorer: search, sort, open a run's timeline and chat ----------------------------------


def _cell(page: Any, column: int, row: int) -> str:
    """The text of one cell of the page's first table (glide's accessible copy of its canvas)."""
    return str(page.evaluate(f"() => document.getElementById('glide-cell-{column}-{row}')?.textContent ?? ''"))


def _settled(page: Any) -> None:
    """Wait until the script's run is over: no stale elements, no running indicator."""
    page.wait_for_function(
        """() => document.querySelectorAll('[data-stale=true]').length == 0
                 && document.querySelectorAll('[data-testid=stStatusWidget]').length == 0
                 && document.querySelectorAll('[data-testid=stSkeleton]').length == 0""",
        timeout=60_000,
    )


def test_the_run_explorer_finds_sorts_and_opens_a_run_in_a_real_browser(
    samples_db: Path, dashboard_url: str, tmp_path: Path
) -> None:
    """Type text found in calls' arguments, sort by wasted repeats, pick the first row, then
    its timeline and a think node's chat; each view's URL opens it again directly."""
    from playwright.sync_api import sync_playwright

    from treellm.analysis.explorer import RunQuery, run_spans, run_table
    from treellm.store import open_store

    con = open_store(samples_db, read_only=True)
    try:  # what the page should list: the runs whose calls hold "refund", most wasted repeats first
        expected = list(run_table(con, query=RunQuery(text="refund", sort="wasted"))["run_id"])
        spans = len(run_spans(con, expected[0]))
    finally:
        con.close()
    assert len(expected) >= 2
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            page.goto(f"{dashboard_url}/run")
            page.get_by_text("Node details").first.wait_for(timeout=60_000)
            _settled(page)
            assert page.locator("[data-testid=stAppDeployButton]").count() == 0  # the viewer's toolbar
            search = page.get_by_role("textbox", name="Search runs")
            search.fill("refund")
            search.press("Enter")
            page.get_by_text(f"{len(expected)} runs match", exact=False).first.wait_for(timeout=60_000)
            _settled(page)
            newest = _cell(page, 10, 0)
            page.get_by_label("Sort by").click()
            page.get_by_role("option", name="wasted repeats").click()
            page.wait_for_function(
                "(id) => document.getElementById('glide-cell-10-0')?.textContent === id", arg=expected[0],
                timeout=60_000,
            )  # fmt: skip
            _settled(page)
            assert [_cell(page, 10, i) for i in range(len(expected))] == expected
            assert newest != expected[0]  # the order changed: the most wasted repeats first
            wasted = [int(_cell(page, 7, i)) for i in range(len(expected))]
            assert wasted == sorted(wasted, reverse=True) and wasted[0] > wasted[-1]
            grid = page.locator("[data-testid=stDataFrame]").first.bounding_box()
            assert grid is not None
            page.mouse.click(grid["x"] + 17, grid["y"] + 35 + 17)  # the first row's selection box
            run_id = expected[0]
            page.wait_for_function("(id) => new URL(location.href).searchParams.get('run') === id", arg=run_id,
                                   timeout=60_000)  # fmt: skip
            page.locator("[data-testid=stCode] code", has_text=run_id).first.wait_for(timeout=60_000)
            _settled(page)
            page.locator("[data-testid=stButtonGroup] button", has_text="timeline").first.click()
            page.get_by_text("Span timeline", exact=False).first.wait_for(timeout=60_000)
            page.wait_for_function("() => new URL(location.href).searchParams.get('view') === 'timeline'",
                                   timeout=60_000)  # fmt: skip
            _settled(page)
            bars = page.evaluate(
                """() => { const chart = [...document.querySelectorAll('[data-testid=stVegaLiteChart]')]
                             .find(c => c.querySelector('g.role-title')?.textContent.includes('Span timeline'));
                           return chart ? chart.querySelector('g.mark-rect').children.length : -1; }"""
            )
            assert bars == spans, (bars, spans)  # one bar per span of the run
            timeline_url = page.url
            page.screenshot(path=str(tmp_path / "timeline.png"), full_page=True)
            page.locator("[data-testid=stButtonGroup] button", has_text="chat").first.click()
            page.wait_for_function("() => new URL(location.href).searchParams.get('view') === 'chat'",
                                   timeout=60_000)  # fmt: skip
            page.locator("[data-testid=stChatMessage]", has_text="refund policy").first.wait_for(timeout=60_000)
            _settled(page)
            chat = page.locator("[data-testid=stChatMessage]").all_inner_texts()
            assert any("calls search" in m for m in chat) and any("ran search" in m for m in chat), chat
            chat_url = page.url
            page.screenshot(path=str(tmp_path / "chat.png"), full_page=True)
            assert page.locator("[data-testid='stException']").count() == 0
            for url, shown in ((timeline_url, "Span timeline"), (chat_url, "refund policy")):  # deep links
                fresh = browser.new_page(viewport={"width": 1400, "height": 2400})
                fresh.goto(url)
                fresh.locator("[data-testid=stCode] code", has_text=run_id).first.wait_for(timeout=60_000)
                fresh.get_by_text(shown, exact=False).first.wait_for(timeout=60_000)
                _settled(fresh)
                assert fresh.locator("[data-testid='stException']").count() == 0
                fresh.close()
            keep = ROOT / "test-output"
            keep.mkdir(exist_ok=True)
            for name in ("timeline.png", "chat.png"):
                shutil.copy(tmp_path / name, keep / f"run-{name}")
        finally:
            browser.close()


def test_a_long_legend_leaves_the_shapes_scatter_its_height_in_a_real_browser(tmp_path: Path) -> None:
    """51 coding trajectories of 44 agents (files): each agent is a legend entry. Streamlit's default
    sizing fit the legend into the chart's height and left the scatter 74 px; the plot keeps its own."""
    if chromium() is None:
        pytest.skip("no Chromium on this machine (set TREELLM_REQUIRE_BROWSER=1 to make this a failure)")
    db = tmp_path / "agents.duckdb"
    data = ROOT / "tests" / "data"
    ingest(db, [*sorted((data / "swe-agent").glob("*.traj")), *sorted((data / "mini-swe-agent").glob("*/*.traj.json"))])
    with serving(db) as url:
        sizes = _measure_chart(
            f"{url}/shapes", "Depth against breadth", "g.role-legend",
            """const axis = chart.querySelector('g.role-axis[aria-label^="Y-axis"]');
               const symbols = 'g.role-legend-entry g.role-legend-symbol path';
               return {plot: axis.getBBox().height, entries: chart.querySelectorAll(symbols).length};""",
        )  # fmt: skip
    assert sizes["entries"] >= 20, sizes  # Vega draws at most 30 entries and counts the rest
    assert sizes["plot"] >= 300, sizes  # the plot's 360 px, not what the legend left
