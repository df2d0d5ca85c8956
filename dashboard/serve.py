"""``python -m dashboard.serve ARGS``: Streamlit's ``streamlit ARGS``, with the pages' modules
imported before the server listens.

``treellm dashboard`` starts the server this way. Streamlit imports what a page imports when the
page first runs, so the first visitor after a start used to wait for pandas, Plotly, the
analysis and (reading a chDB folder) chDB: about 0.7-1 s of the first page's time (3.0 s against
2.0 s once warm, on the sample store). Imported here first, the server takes that long to start
instead, and every visitor's page runs its queries only.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping

from treellm import settings

PRELOADED = (
    "pandas", "pyarrow", "plotly.graph_objects", "igraph", "treellm.analysis", "dashboard.charts", "dashboard.data",
)  # fmt: skip
"""What every page imports (``dashboard.data`` brings Streamlit and the analysis; pyarrow carries
each table to the browser, and chDB's query results)."""


def preload(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Import :data:`PRELOADED`; when the dashboard reads ClickHouse (``TREELLM_CLICKHOUSE``, as
    ``treellm dashboard`` sets it, and no DuckDB store or Parquet folders), also the columns its
    views are made from (read once a process from an in-memory DuckDB store, 0.14 s) and, for a
    chDB folder, chDB. The names imported (a module that is not installed is left out)."""
    names = list(PRELOADED)
    elsewhere = settings.get(settings.TREELLM_DASHBOARD_DB, environ) or settings.get(
        settings.TREELLM_DASHBOARD_PARQUET, environ
    )  # the dashboard reads these first (``dashboard.data.source``): an inherited ClickHouse URL is unused
    url = "" if elsewhere else settings.get(settings.TREELLM_CLICKHOUSE, environ) or ""
    if url:
        names.append("treellm.store.clickhouse")
    if url.startswith("chdb:"):
        names.append("chdb")
    imported = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:  # a missing extra: the page that needs it says so, as without this
            continue
        imported.append(name)
    if "treellm.store.clickhouse" in imported:
        from treellm.store.clickhouse import view_columns

        view_columns()
    return tuple(imported)


def main() -> None:
    preload()
    from streamlit.web import cli

    sys.argv = ["streamlit", *sys.argv[1:]]
    cli.main(prog_name="streamlit")


if __name__ == "__main__":
    main()
