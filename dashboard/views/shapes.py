"""Tree shapes across runs, and two agents, models or time windows side by side."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data, text

st.title("Tree shapes")
with data.show_problems():
    filters = data.sidebar_filters()
    shapes = data.query("shape_by_run", filters)
    if shapes.empty:
        st.info("No runs in this selection.")
        st.stop()
    st.plotly_chart(charts.shape_scatter(data.shapes_grouped(shapes, "agent"), "agent"), width="stretch")
    st.dataframe(data.query("shape_distribution", filters), hide_index=True, width="stretch")
    st.subheader("Side by side")
    by = st.radio("Compare", ["agent", "model", "day"], horizontal=True, key="compare_by")
    shapes["day"] = shapes["day"].astype(str)
    values = sorted(shapes[by].dropna().astype(str).unique())
    if len(values) < 2:
        st.info(f"Only one {by} in this selection: nothing to compare.")
        st.stop()
    pick_left, pick_right = st.columns(2)
    first = pick_left.selectbox("Left", values, index=0, key="left")
    second = pick_right.selectbox("Right", values, index=1, key="right")
    measures = ["nodes", "max_depth", "max_breadth", "branching_factor", "leaves", "pruned_calls"]
    for side, column, value in (("left", pick_left, first), ("right", pick_right, second)):
        group = shapes[shapes[by].astype(str) == value]
        with column:
            st.metric(f"{by}: {text.literal(value)}", f"{len(group)} runs")
            st.dataframe(group[measures].describe().loc[["mean", "50%", "max"]].T, width="stretch")
            grouped = data.shapes_grouped(group, "outcome")
            st.plotly_chart(charts.shape_scatter(grouped, "outcome"), width="stretch", key=f"scatter-{side}")
