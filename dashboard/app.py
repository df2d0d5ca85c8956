"""Navigation only: the five pages of the treellm dashboard.

The page icon is a local file (a Material or emoji favicon would be fetched from a font
CDN): nothing the dashboard shows is loaded from outside the machine. The toolbar is the
viewer's (no Deploy button, no developer options): ``client.toolbarMode = "viewer"`` in
``.streamlit/config.toml`` beside this script, which Streamlit reads whatever the working folder.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

HERE = Path(__file__).resolve().parent

st.set_page_config(page_title="treellm", page_icon=HERE / "icon.svg", layout="wide")
pages = [
    st.Page(HERE / "views" / "overview.py", title="Overview", icon=":material/insights:", default=True),
    st.Page(HERE / "views" / "run_explorer.py", title="Run explorer", icon=":material/account_tree:", url_path="run"),
    st.Page(HERE / "views" / "shapes.py", title="Tree shapes", icon=":material/bubble_chart:", url_path="shapes"),
    st.Page(HERE / "views" / "tools.py", title="Tools", icon=":material/build:", url_path="tools"),
    st.Page(HERE / "views" / "tuning.py", title="Tuning", icon=":material/tune:", url_path="tuning"),
]
st.navigation(pages).run()
