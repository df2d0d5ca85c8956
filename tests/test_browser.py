"""A real browser on the real dashboard: `treellm dashboard` on loopback, every page in headless Chromium.

Chromium is Debian's (``/usr/bin/chromium``, or ``CHROMIUM_PATH``), driven by playwright;
``make test`` installs it when apt-get is usable. Without a browser the test is skipped,
unless ``TREELLM_REQUIRE_BROWSER=1`` (as ``.ci/run`` sets), where it fails.
Screenshots land in the test's output folder (and in ``test-output/`` for a human to look).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture(scope="module")
def dashboard_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if chromium() is None:
        pytest.skip("no Chromium on this machine (set TREELLM_REQUIRE_BROWSER=1 to make this a failure)")
    folder = tmp_path_factory.mktemp("browser")
    db = folder / "samples.duckdb"
    ingest(db, [ROOT / "sample_traces", ROOT / "tests" / "data" / "frameworks" / "langgraph.pb"])
    port = free_port()
    with subprocess.Popen(
        [sys.executable, "-m", "treellm", "dashboard", "--db", str(db), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=folder,
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


@pytest.mark.parametrize("path", list(PAGES))
def test_every_page_renders_in_a_real_browser(dashboard_url: str, path: str, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    name = path or "overview"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{dashboard_url}/{path}")
            page.wait_for_selector("[data-testid='stAppViewContainer']", timeout=60_000)
            for text in PAGES[path]:
                page.get_by_text(text, exact=False).first.wait_for(timeout=60_000)
            page.wait_for_function("() => document.querySelectorAll('[data-testid=stSkeleton]').length == 0",
                                   timeout=60_000)  # fmt: skip
            page.wait_for_timeout(1000)
            assert page.locator("[data-testid='stException']").count() == 0
            assert page.get_by_text("Page not found").count() == 0
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


def test_a_foreign_run_is_drawn_as_a_tree_in_a_real_browser(dashboard_url: str, tmp_path: Path) -> None:
    """A LangGraph run (OpenInference spans): think nodes chained, tool nodes under them, not a flat row."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{dashboard_url}/run?run={first_langgraph_run()}")
            page.get_by_text("Run tree:", exact=False).first.wait_for(timeout=60_000)
            page.wait_for_function("() => document.querySelector('.js-plotly-plot') !== null", timeout=60_000)
            shape = page.evaluate(
                """() => { const plot = document.querySelector('.js-plotly-plot');
                           const ys = plot.data[0].y.filter(v => v !== null);
                           return {edges: ys.length / 2, levels: new Set(ys).size}; }"""
            )
            assert shape["edges"] >= 4 and shape["levels"] >= 3, shape
            page.screenshot(path=str(tmp_path / "foreign-run.png"), full_page=True)
            keep = ROOT / "test-output"
            keep.mkdir(exist_ok=True)
            shutil.copy(tmp_path / "foreign-run.png", keep / "foreign-run.png")
        finally:
            browser.close()
