"""Dashboard page time to interactive in a real browser, on a 1M-span store beside the sample store.

Run: .venv/bin/python benchmarks/bench_dashboard.py --keep /tmp/ba [--loads 5]
     [--clickhouse chdb:PATH --clickhouse-database NAME]

For each page: the median, over ``--loads`` fresh loads (a new browser page each, so
Streamlit reruns the script; the data cache is cleared between stores by restarting the
server), of the time from navigation until the page is interactive: its key text is shown,
no skeleton (a still-loading element) is left and Streamlit's "running" indicator is gone.
The same page on the sample store is measured beside it. Target: <= 3 s each on 1M spans.
The first load after a server start (cold cache) is reported apart from the median and held to
the same 3 s. The time from the server's start until its health check answers is printed too:
the server imports the pages' modules before it serves (``dashboard.serve``), so that cost
moved there from the first load.

With ``--clickhouse``, the big store is that ClickHouse source instead (for example the chDB
folder and the 10x database that ``bench_clickhouse.py --copies 10 --keep DIR`` leaves).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_analysis import build

from treellm.store import ingest

ROOT = Path(__file__).resolve().parent.parent
PAGES = {
    "": "Tuning verdicts at a glance",
    "run": "Node details",
    "shapes": "Side by side",
    "tools": "Cost of wasted repeats",
    "tuning": "Download limits.toml",
}
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(source: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "treellm", "dashboard", *source, "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=1):
                return server, url
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("the dashboard did not start")


def _load(browser: object, url: str, path: str) -> float:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    page.goto(f"{url}/{path}")
    page.get_by_text(PAGES[path], exact=False).first.wait_for(timeout=120_000)
    page.wait_for_function(
        "() => document.querySelectorAll('[data-testid=stSkeleton]').length == 0 && "
        "!document.querySelector('[data-testid=stStatusWidget]')",
        timeout=120_000,
    )
    elapsed = time.perf_counter() - t0
    page.close()
    return elapsed


def measure(source: list[str], loads: int, pages: list[str]) -> dict[str, tuple[float, float]]:
    """Per page: (first load, median of the next ``loads``), the dashboard reading ``source``
    (its command-line options: ``--db PATH`` or ``--clickhouse URL ...``); ``inf`` for a page
    that did not come up within two minutes."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    t0 = time.perf_counter()
    server, url = _serve(source)
    print(f"  server up (health answers) {time.perf_counter() - t0:.2f}s after its start", flush=True)
    out = {}
    try:
        with sync_playwright() as p:
            chromium = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"
            browser = p.chromium.launch(executable_path=chromium, args=ARGS)
            for path in pages:
                try:
                    first = _load(browser, url, path)
                    times = [_load(browser, url, path) for _ in range(loads)]
                except PlaywrightTimeout:  # the page did not come up within the wait: say so, go on
                    first, times = math.inf, [math.inf]
                page = path or "overview"
                out[page] = (first, statistics.median(times))
                print(f"  {page}: first {first:.2f}s, median {out[page][1]:.2f}s", flush=True)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keep", help="folder of the 1M-span store (built by bench_analysis's builder if missing)")
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--clickhouse", help="read this ClickHouse source as the big store (e.g. chdb:PATH)")
    parser.add_argument("--clickhouse-database", default="treellm")
    parser.add_argument("--pages", default=",".join(p or "overview" for p in PAGES), help="comma-separated pages")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.clickhouse:
            source = ["--clickhouse", args.clickhouse, "--clickhouse-database", args.clickhouse_database]
            label = args.clickhouse_database
        else:
            source, label = ["--db", str(build(Path(args.keep or tmp), args.spans, 4000))], "1M spans"
        small = Path(tmp) / "samples.duckdb"
        ingest(small, [ROOT / "sample_traces"])
        pages = ["" if p == "overview" else p for p in args.pages.split(",")]
        on_small = measure(["--db", str(small)], args.loads, pages)
        on_big = measure(source, args.loads, pages)
    print(f"\ntime to interactive in headless Chromium, median of {args.loads} loads (first load apart)")
    print(f"{'page':10} {'sample store':>13} {label:>10} {'ratio':>7} {'first load':>14}  target <= 3 s")
    for page in on_small:
        _, s = on_small[page]
        b_first, b = on_big[page]
        verdict = "met" if b <= 3 and b_first <= 3 else "MISSED" if b > 3 else "first load MISSED"
        print(f"{page:10} {s:12.2f}s {b:9.2f}s {b / s:7.2f} {b_first:13.2f}s  {verdict}")


if __name__ == "__main__":
    main()
