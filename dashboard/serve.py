"""``python -m dashboard.serve ARGS``: Streamlit's ``streamlit ARGS``, with the pages' modules
imported before the server listens.

``treellm dashboard`` starts the server this way. Streamlit imports what a page imports when the
page first runs, so the first visitor after a start used to wait for pandas, Altair, the
analysis and (reading a chDB folder) chDB: about 0.7-1 s of the first page's time (3.0 s against
2.0 s once warm, on the sample store). Imported here first, the server takes that long to start
instead, and every visitor's page runs its queries only. A chDB folder is also opened once here
(``dashboard.data.warm``): chDB's start and the set-up of treellm's views.
"""

from __future__ import annotations

import importlib
import sys

from treellm.errors import TreeLLMError

PRELOADED = (
    "pandas", "pyarrow", "altair", "igraph", "treellm.analysis", "dashboard.charts", "dashboard.data",
)  # fmt: skip
"""What every page imports (``dashboard.data`` brings Streamlit and the analysis; pyarrow carries
each table to the browser, and chDB's query results)."""


def preload() -> tuple[str, ...]:
    """Import :data:`PRELOADED`; when the dashboard reads ClickHouse (its source, by the pages' own
    rule: :func:`dashboard.data.source`), also the columns its views are made from (read once a
    process from an in-memory DuckDB store, 0.14 s) and, for a chDB folder, chDB. The names
    imported (a module that is not installed is left out), then ``chdb-folder`` when a chDB folder
    was opened once (:func:`dashboard.data.warm`)."""
    imported = []
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except ImportError:  # a missing extra: the page that needs it says so, as without this
            continue
        imported.append(name)
    if "dashboard.data" not in imported:
        return tuple(imported)
    from dashboard.data import source

    try:
        src = source()
    except TreeLLMError:  # a bad setting: the page says so
        return tuple(imported)
    if src.kind != "clickhouse":
        return tuple(imported)
    from treellm.store.clickhouse import view_columns

    view_columns()
    imported.append("treellm.store.clickhouse")
    if src.paths[0].startswith("chdb:"):
        try:
            importlib.import_module("chdb")
        except ImportError:
            return tuple(imported)
        imported.append("chdb")
        from dashboard.data import warm

        if warm(src):  # an existing folder, opened once: chDB's start and the views, see dashboard.data.warm
            imported.append("chdb-folder")
    return tuple(imported)


def main() -> None:
    preload()
    from streamlit.web import cli

    sys.argv = ["streamlit", *sys.argv[1:]]
    cli.main(prog_name="streamlit")


if __name__ == "__main__":
    main()
